"""Rank-balanced emission: every data-parallel rank emits packs of similar training cost at
the same step, with no communication.

Every pack computes C tokens in the decoder's linear layers, so a step's cost differs between
ranks by what does not scale with C: causal attention, which grows with the sum of the sources'
squared lengths, and the vision encoder, which runs over every image and video patch of the
pack. A step waits for the rank that drew the costliest pack. :class:`StepCostModel` prices a
pack in training FLOPs (decoder linear layers + attention + :class:`VisionTower` over the
pack's grids) for a model's sizes, and that price is what emission balances. Each rank sees
only its own loader; what ranks can share is a rule. Each rank keeps a pool of W pending packs
and, at step t, emits the pool's pack whose cost is nearest to a *target*::

    u_t     = frac(0.5 + t * 0.618...)              shared: the same on every rank
    target  = u_t-quantile of this rank's recent pack costs
    emitted = the pooled pack nearest to target (log scale)

Ranks draw from the same data distribution, so their recent-cost quantiles agree and step t
costs about the same everywhere; the golden-ratio sequence visits quantiles evenly, so pools
stay representative. Matching by value over a pool is far tighter than matching ranks inside
small sorted windows (measured in ``benchmarks/carry_loader.py``). The pack count is unchanged:
only the order changes. Pure.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from energon_packing.packing.audio_tower import AudioTower

__all__ = [
    "HISTORY",
    "Grid",
    "PackCost",
    "RecentCosts",
    "StepCostModel",
    "VisionTower",
    "attention_cost",
    "imbalance",
    "pick",
    "target_quantile",
]

GOLDEN = (math.sqrt(5) - 1) / 2
#: Recent pack costs a rank remembers for its quantiles.
HISTORY = 2048


def attention_cost(lengths: Sequence[int]) -> int:
    """Sum of squared source lengths: what causal varlen attention spends on a pack."""
    return sum(n * n for n in lengths)


#: A medium's grid ``(t, h, w)`` in patches: ``image_grid_thw`` / ``video_grid_thw``'s row.
Grid = tuple[int, int, int]


@dataclass(kw_only=True, slots=True, frozen=True)
class VisionTower:
    """Forward FLOPs of a ViT-style vision encoder (Qwen-VL's, Kimi-K2.5's, Llama 4's tiles)
    over one image or video grid.

    One ViT patch is one encoder token; an LLM vision token is ``spatial_merge_size**2``
    patches. For a grid ``(t, h, w)`` (``P = t*h*w`` patches, ``c`` class tokens a slice) with
    width ``d``, MLP width ``f`` and merge size ``m``::

        patch embedding   2*P*(in_channels * temporal_patch_size * patch_size**2)*d
        per layer         2*(P + t*c)*(4*d*d + k*d*f)   QKV + output, MLP (k=3 gated, 2 plain)
                        + 4*d*sum(S**2)             bidirectional attention over sequences S
        each merger       2*(P/m**2)*((d*m*m)**2 + d*m*m*out_hidden_size)
        or a head         2*(P/m**2)*sum(in*out)   its (in, out) layers instead of the mergers

    A full-attention layer attends within each of the ``t`` temporal slices (sequences of
    ``h*w + c``); a windowed layer (``window_size`` > 0, Qwen2.5-VL) within windows of
    ``window_size x window_size`` merged tokens of a slice, cut at the slice's edges, so a
    window holds ``rows*cols*m*m`` patches. Norms, activations and rotary embeddings are left
    out (linear in P, under 1 %).

    Args:
        depth: Encoder layers.
        hidden_size: Encoder width ``d``.
        intermediate_size: MLP width ``f``.
        gated_mlp: Gate/up/down MLP (Qwen2.5-VL) rather than two matrices (Qwen2-VL, Qwen3-VL).
        out_hidden_size: Width of the merger's output (the decoder's hidden size).
        patch_size: Patch side in pixels.
        temporal_patch_size: Frames per patch.
        spatial_merge_size: ``m``.
        in_channels: Colour channels.
        window_size: Side of an attention window in merged tokens (0: every layer is full).
        full_attention_layers: With windows, the layers that attend over the whole slice.
        mergers: Patch mergers (Qwen3-VL: 1 + its deepstack mergers).
        class_tokens: Tokens each slice carries beside its patches through every layer
            (Llama 4: a class token a tile).
        head: The ``(in, out)`` linear layers each merged token passes through after the
            encoder, where they are not the merger above (Llama 4: its pixel-shuffle MLP and
            projector); they then replace the mergers.
        tile_size: Patches a side of the fixed tile every image is cut into and encoded
            alone (InternVL's 448 px tiles: 32; 0: an image is encoded whole). A run of
            image tokens is then as many tiles as it holds :attr:`tile_tokens`.
    """

    depth: int
    hidden_size: int
    intermediate_size: int
    gated_mlp: bool = False
    out_hidden_size: int
    patch_size: int = 14
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2
    in_channels: int = 3
    window_size: int = 0
    full_attention_layers: tuple[int, ...] = ()
    mergers: int = 1
    class_tokens: int = 0
    head: tuple[tuple[int, int], ...] = ()
    tile_size: int = 0

    def __post_init__(self) -> None:
        _positive(self, "depth", "hidden_size", "intermediate_size", "out_hidden_size")
        _positive(self, "patch_size", "temporal_patch_size", "spatial_merge_size", "in_channels")
        _positive(self, "mergers")
        _positive(self, "window_size", "class_tokens", "tile_size", least=0)
        if any(
            isinstance(n, bool) or not isinstance(n, int) or n < 1 for io in self.head for n in io
        ):
            raise ValueError(f"head layers (in, out) must be integers >= 1, got {self.head!r}")
        bad = [i for i in self.full_attention_layers if not 0 <= i < self.depth]
        if bad:
            raise ValueError(
                f"full_attention_layers {bad} are not layers of a {self.depth}-layer encoder "
                f"(0..{self.depth - 1})"
            )

    @property
    def tile_tokens(self) -> int:
        """LLM tokens of one fixed tile (0: no fixed tiles)."""
        return (self.tile_size // self.spatial_merge_size) ** 2

    @property
    def windowed_layers(self) -> int:
        """Layers that attend within windows (0 without windows)."""
        return self.depth - len(set(self.full_attention_layers)) if self.window_size else 0

    def window_squares(self, grid: Grid) -> int:
        """Sum of squared window lengths (in patches) of a windowed layer over ``grid``.

        Each slice's ``h/m x w/m`` merged tokens are cut into ``window_size``-sided windows
        from the top left; a window of ``r`` rows and ``c`` columns holds ``r*c*m*m`` patches,
        so the sum of squares factors into rows and columns."""
        t, h, w = grid
        m, side = self.spatial_merge_size, self.window_size
        if not side:
            return 0

        def squares(n: int) -> int:
            full, rest = divmod(n, side)
            return full * side * side + rest * rest

        return t * m**4 * squares(h // m) * squares(w // m)

    def grid_flops(self, grid: Grid) -> int:
        """Forward FLOPs of one image or video of ``grid`` (``(t, h, w)`` in patches)."""
        t, h, w = grid
        patches = t * h * w
        d, m = self.hidden_size, self.spatial_merge_size
        mlp = (3 if self.gated_mlp else 2) * d * self.intermediate_size
        embed = 2 * patches * self.in_channels * self.temporal_patch_size * self.patch_size**2 * d
        linear = 2 * (patches + t * self.class_tokens) * (4 * d * d + mlp)
        full = t * (h * w + self.class_tokens) ** 2
        windowed = self.windowed_layers
        attention = 4 * d * (full * (self.depth - windowed) + self.window_squares(grid) * windowed)
        merged, tokens = d * m * m, patches // (m * m)
        if self.head:
            out = 2 * tokens * sum(n_in * n_out for n_in, n_out in self.head)
        else:
            out = self.mergers * 2 * tokens * (merged * merged + merged * self.out_hidden_size)
        return embed + self.depth * linear + attention + out


@dataclass(kw_only=True, slots=True, frozen=True)
class PackCost:
    """A pack's modelled training FLOPs by component."""

    decoder_linear: int  #: the decoder's C tokens through its linear layers (same every pack)
    attention: int  #: causal attention over each source
    vision: int  #: the vision encoder over the pack's images and videos
    audio: int = 0  #: the audio encoder over the pack's clips

    @property
    def total(self) -> int:
        return self.decoder_linear + self.attention + self.vision + self.audio


@dataclass(kw_only=True, slots=True, frozen=True)
class StepCostModel:
    """Training FLOPs of one C-wide pack of a VLM (forward + backward = 3x forward)::

        decoder, per layer:  2*C*(h*(q + 2*kv) + q*h + 3*h*f)   QKV, output, SwiGLU MLP
                           + 2*q*sum(L_i**2)                    causal attention (halved)
        decoder, once:       2*C*h*vocab_size                   the output projection
        vision:              VisionTower.grid_flops of each image / video grid of the pack
        audio:               AudioTower.clip_flops of each audio clip of the pack (mel frames)

    ``q`` is the attention width (heads x head dim, default h), ``kv`` the key/value width
    (grouped-query attention; default q). The decoder's linear part is the same for every
    pack (every pack is C tokens); attention and vision differ, and they are what balanced
    emission evens out. Read a model's sizes with
    :func:`energon_packing.encoding.costs.step_cost_model` (its ``config.json`` or a
    ``transformers`` config); the defaults (a 7B decoder: h=4096, 32 layers, ``f`` by the
    Llama rule 8h/3 rounded up to 256; no vision tower) stand only for a model nobody named.

    Args:
        hidden_size: The decoder's hidden size h.
        num_layers: Its layers.
        intermediate_size: Its MLP width f (None: the Llama rule).
        attention_size: Query width q (None: h).
        kv_size: Key/value width kv (None: q).
        vocab_size: Output projection rows (0: left out, as for an unknown model).
        vision: The vision encoder (None: images and videos cost nothing extra).
        train_vision: Whether the encoder is trained (3x its forward) or frozen (1x).
        audio: The audio encoder (None: audio clips cost nothing extra).
        train_audio: Whether the audio encoder is trained (3x its forward) or frozen (1x).
        source: Where the sizes were read ("" for the defaults).
    """

    hidden_size: int = 4096
    num_layers: int = 32
    intermediate_size: int | None = None
    attention_size: int | None = None
    kv_size: int | None = None
    vocab_size: int = 0
    vision: VisionTower | None = None
    train_vision: bool = True
    audio: AudioTower | None = None
    train_audio: bool = True
    source: str = ""

    def __post_init__(self) -> None:
        _positive(self, "hidden_size", "num_layers")
        _positive(self, "intermediate_size", "attention_size", "kv_size", optional=True)
        if isinstance(self.vocab_size, bool) or not isinstance(self.vocab_size, int):
            raise ValueError(f"vocab_size must be an integer >= 0, got {self.vocab_size!r}")
        if self.vocab_size < 0:
            raise ValueError(f"vocab_size must be an integer >= 0, got {self.vocab_size!r}")

    @property
    def ffn_hidden_size(self) -> int:
        if self.intermediate_size is not None:
            return self.intermediate_size
        return 256 * math.ceil(8 * self.hidden_size / 3 / 256)

    @property
    def known(self) -> bool:
        """Whether the sizes were read from a model (False: the defaults)."""
        return bool(self.source)

    def linear_flops(self, capacity: int) -> int:
        """Training FLOPs of ``capacity`` tokens through the decoder's linear layers."""
        h = self.hidden_size
        q = self.attention_size or h
        kv = self.kv_size or q
        per_layer = h * (q + 2 * kv) + q * h + 3 * h * self.ffn_hidden_size
        return 3 * 2 * capacity * (self.num_layers * per_layer + h * self.vocab_size)

    def attention_flops(self, lengths: Sequence[int]) -> int:
        """Training FLOPs of causal attention over sources of ``lengths``."""
        q = self.attention_size or self.hidden_size
        return 3 * self.num_layers * 2 * q * attention_cost(lengths)

    def vision_flops(self, grids: Iterable[Grid]) -> int:
        """Training FLOPs of the vision encoder over images / videos of ``grids``."""
        if self.vision is None:
            return 0
        passes = 3 if self.train_vision else 1
        return passes * sum(self.vision.grid_flops(_grid(g)) for g in grids)

    def audio_flops(self, frames: Iterable[int]) -> int:
        """Training FLOPs of the audio encoder over clips of ``frames`` mel frames."""
        if self.audio is None:
            return 0
        passes = 3 if self.train_audio else 1
        return passes * sum(self.audio.clip_flops(n) for n in frames)

    def pack_cost(
        self,
        lengths: Sequence[int],
        *,
        capacity: int,
        grids: Iterable[Grid] = (),
        audio_frames: Iterable[int] = (),
    ) -> PackCost:
        """A pack ``capacity`` wide holding sources of ``lengths``, images and videos of
        ``grids`` and audio clips of ``audio_frames`` mel frames, by component."""
        return PackCost(
            decoder_linear=self.linear_flops(capacity),
            attention=self.attention_flops(lengths),
            vision=self.vision_flops(grids),
            audio=self.audio_flops(audio_frames),
        )

    def pack_flops(
        self,
        lengths: Sequence[int],
        *,
        capacity: int,
        grids: Iterable[Grid] = (),
        audio_frames: Iterable[int] = (),
    ) -> int:
        """Training FLOPs of such a pack (:meth:`pack_cost`'s total)."""
        return (
            self.linear_flops(capacity)
            + self.attention_flops(lengths)
            + self.vision_flops(grids)
            + self.audio_flops(audio_frames)
        )

    def describe(self) -> str:
        """One line: the sizes and where they come from."""
        tower = self.vision
        text = f"decoder h={self.hidden_size}, {self.num_layers} layers, f={self.ffn_hidden_size}"
        if tower is not None:
            text += (
                f"; vision {tower.depth} layers, d={tower.hidden_size}, f={tower.intermediate_size}"
                f", patch {tower.patch_size}, merge {tower.spatial_merge_size}"
            )
            if tower.window_size:
                text += (
                    f", windows of {tower.window_size} except layers {tower.full_attention_layers}"
                )
        if self.audio is not None:
            text += (
                f"; audio {self.audio.depth} layers, d={self.audio.hidden_size}, "
                f"f={self.audio.intermediate_size}"
            )
        return f"{text} ({self.source or 'defaults: no model named'})"


def _grid(grid: Iterable[int]) -> Grid:
    """A grid as Python ints (a numpy row's int64 would overflow in the squares)."""
    t, h, w = (int(n) for n in grid)
    return t, h, w


def _positive(obj: object, *names: str, optional: bool = False, least: int = 1) -> None:
    for name in names:
        value = getattr(obj, name)
        if optional and value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")


def target_quantile(step: int, seed: int = 0) -> float:
    """The shared quantile of step ``step``: a low-discrepancy (golden-ratio) sequence."""
    return (0.5 + seed * GOLDEN * GOLDEN + step * GOLDEN) % 1.0


def pick(pool_costs: Sequence[int], target: int) -> int:
    """Position of the pooled pack nearest to ``target`` on a log scale (ties: earliest)."""
    goal = math.log(max(target, 1))
    return min(
        range(len(pool_costs)), key=lambda i: (abs(math.log(max(pool_costs[i], 1)) - goal), i)
    )


class RecentCosts:
    """The last :data:`HISTORY` pack costs of a rank, with quantiles.

    ``costs`` (arrival order) is the whole state; a sorted mirror makes quantiles O(log n).
    """

    def __init__(self, costs: Sequence[int] = ()):
        self.costs = list(costs)[-HISTORY:]
        self._sorted = sorted(self.costs)

    def add(self, cost: int) -> None:
        self.costs.append(cost)
        bisect.insort(self._sorted, cost)
        if len(self.costs) > HISTORY:
            oldest = self.costs.pop(0)
            del self._sorted[bisect.bisect_left(self._sorted, oldest)]

    def quantile(self, q: float) -> int:
        return self._sorted[min(len(self._sorted) - 1, int(q * len(self._sorted)))]


def imbalance(step_costs: Sequence[Sequence[float]]) -> float:
    """Mean over steps of ``max / mean`` of the per-rank costs (1.0 = perfectly balanced).

    Args:
        step_costs: ``step_costs[t][r]``: the cost rank r spends at step t.
    """
    ratios = [max(costs) / (sum(costs) / len(costs)) for costs in step_costs if sum(costs)]
    return sum(ratios) / len(ratios) if ratios else 1.0
