"""Numbers a person reads: packing tables per algorithm and buffer, loader vs trainer path.

``measure_costs`` reads a prepared dataset through Energon and the encoder (token ids and
image and video sizes from headers: no pixel is decoded); everything else is pure arithmetic
on the measured costs, so the same numbers come out of the CLI, the tests and the library.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from energon_packing.packing.algorithms import (
    ALGORITHMS,
    DEFAULT_ALGORITHM,
    lower_bound,
    pack,
    pack_stream,
    round_up,
)
from energon_packing.packing.trainer_bins import trainer_bins

__all__ = [
    "TRAINER_DEFAULT",
    "Measured",
    "PathCost",
    "Row",
    "audio_token_id",
    "capacity_hint",
    "format_nothing_packed",
    "format_pack_costs",
    "format_paths",
    "format_scan",
    "format_skipped",
    "format_table",
    "format_tokens",
    "loader_vs_trainer",
    "measure_costs",
    "packing_table",
    "recommend",
    "shortest_cost",
    "unbounded_costs",
    "video_token_id",
]

TRAINER_DEFAULT = "modified_first_fit_decreasing"  # NeMo-RL's trainer-side default


@dataclass(kw_only=True, slots=True)
class Measured:
    """The costs of a split, in the order the loader reads it (one worker, no shuffle)."""

    keys: list[str]
    costs: list[int]  # padded lengths: what the packer packs
    lengths: list[int]  # real tokens
    skipped: dict[str, int]
    capacity: int
    #: image-pad tokens of every conversation (None: the layout takes no images)
    image_tokens: int | None = None
    #: video-pad tokens of every conversation (None: the layout takes no videos)
    video_tokens: int | None = None
    videos: int = 0  # video clips
    with_videos: int = 0  # conversations with at least one video
    #: audio tokens of every conversation (None: the layout takes no audio)
    audio_tokens: int | None = None
    audios: int = 0  # audio clips
    #: each conversation's image and video grids (empty where no vision encoder is priced)
    grids: list = field(default_factory=list)
    #: each conversation's audio clips' mel frames (empty where no audio encoder is priced)
    audio_frames: list = field(default_factory=list)
    #: each conversation's ``packing.Company``, where one keeps other company than ``ANY``
    #: (Phi-4-multimodal's clips); None where every one packs with anything
    company: list | None = None


@dataclass(kw_only=True, slots=True)
class Row:
    algorithm: str
    mode: str  # "chunk" (Energon 7.4.1), "carry", or "offline"
    buffer: int | None
    packs: int
    bound: int
    real_tokens: int
    capacity: int

    @property
    def overhead(self) -> float:
        """Packs over the lower bound, as a fraction."""
        return self.packs / self.bound - 1 if self.bound else 0.0

    @property
    def efficiency(self) -> float:
        return self.real_tokens / (self.packs * self.capacity) if self.packs else 0.0


def video_token_id(task_encoder: Any) -> int | None:
    """The id of the token a video expands to in ``task_encoder``'s layout (the built-in
    layout's ``<|video_pad|>``, a Qwen processor's video token), or None when it takes no
    videos."""
    chat = task_encoder.chat
    token = getattr(chat, "video_token_id", None)  # a processor's layout
    if token is None and getattr(chat, "videos", None) is not None:
        special = getattr(getattr(chat, "tokenizer", None), "special", None)
        token = getattr(special, "video_pad", None)  # the built-in layout
    return token


def audio_token_id(task_encoder: Any) -> int | None:
    """The id of the token an audio clip expands to in ``task_encoder``'s layout (an Omni
    processor's audio token), or None when it takes no audio."""
    side = getattr(task_encoder.chat, "audio", None)
    return getattr(side, "token_id", None)


def measure_costs(path: Path | str, task_encoder: Any, *, progress: bool = True) -> Measured:
    """Encodes every conversation of the train split once (no pixels decoded) and records its
    packing cost, with the loader's read order, and its image and video tokens."""
    import numpy as np

    from energon_packing.loader.loading import epoch

    keys, costs, lengths, grids, audio_frames, company = [], [], [], [], [], []
    image_id, video_id = task_encoder.image_token_id, video_token_id(task_encoder)
    audio_id = audio_token_id(task_encoder)
    image_tokens = video_tokens = videos = with_videos = audio_tokens = audios = 0
    samples: Iterable = epoch(path, task_encoder, packing_buffer_size=None, batch_size=None)
    if progress:
        from tqdm import tqdm

        samples = tqdm(
            samples,
            total=_split_size(samples),
            desc="measuring",
            unit=" conv",
            disable=None if os.environ.get("TQDM_DISABLE") is None else True,
        )
    for sample in samples:
        keys.append(sample.__key__)
        costs.append(sample.cost)
        company.append(sample.company)
        lengths.append(sample.length)
        grids.append(list(sample.grids))
        audio_frames.append(list(getattr(sample, "audio_frames", None) or ()))
        ids = np.asarray(sample.input_ids)
        if image_id is not None:
            image_tokens += int(np.count_nonzero(ids == image_id))
        if video_id is not None:
            video_tokens += int(np.count_nonzero(ids == video_id))
        clips = len(sample.videos or ())
        videos += clips
        with_videos += clips > 0
        if audio_id is not None:
            audio_tokens += int(np.count_nonzero(ids == audio_id))
        audios += len(getattr(sample, "audios", None) or ())
    return Measured(
        keys=keys,
        costs=costs,
        lengths=lengths,
        skipped=_with_losses(path, dict(task_encoder.stats.skipped)),
        capacity=task_encoder.config.max_input_seq_length,
        image_tokens=image_tokens if image_id is not None else None,
        video_tokens=video_tokens if video_id is not None else None,
        videos=videos,
        with_videos=with_videos,
        audio_tokens=audio_tokens if audio_id is not None else None,
        audios=audios,
        grids=grids,
        audio_frames=audio_frames,
        company=company if any(company) else None,
    )


def format_pack_costs(measured: Measured, cost_model: Any, *, buffer: int) -> str:
    """Each pack's modelled training cost by component (``cost_model``, a ``StepCostModel``)
    for the default algorithm with carry at ``buffer``: mean and max over the packs, in TFLOPs,
    and each component's share of the mean."""
    capacity = measured.capacity
    grids = measured.grids or [[] for _ in measured.costs]
    frames = measured.audio_frames or [[] for _ in measured.costs]
    parts: dict[str, list[int]] = {"decoder linear": [], "attention": [], "vision": []}
    if cost_model.audio is not None:
        parts["audio"] = []
    for group in pack_stream(
        measured.costs, capacity, buffer_size=buffer, carry=True, company=measured.company
    ):
        cost = cost_model.pack_cost(
            [measured.lengths[i] for i in group],
            capacity=capacity,
            grids=[g for i in group for g in grids[i]],
            audio_frames=[n for i in group for n in frames[i]],
        )
        parts["decoder linear"].append(cost.decoder_linear)
        parts["attention"].append(cost.attention)
        parts["vision"].append(cost.vision)
        if "audio" in parts:
            parts["audio"].append(cost.audio)
    count = len(parts["vision"])
    if not count:
        return "modelled cost per pack: no packs"
    total = sum(sum(values) for values in parts.values()) / count
    cells = ", ".join(
        f"{name} {sum(v) / count / 1e12:,.1f} (max {max(v) / 1e12:,.1f}, "
        f"{100 * sum(v) / count / total:.0f}%)"
        for name, v in parts.items()
    )
    return (
        f"modelled training cost per pack, TFLOPs, mean (max, share), packing_buffer_size="
        f"{buffer}: {cells}; for {cost_model.describe()}"
    )


def format_tokens(measured: Measured) -> str:
    """The media tokens among the real ones, as the layout counts them: ``1,711 image tokens,
    4,921 video tokens from 16 clips, 310 audio tokens from 4 clips``; empty for a text-only
    layout."""
    parts = []
    if measured.image_tokens is not None:
        parts.append(f"{measured.image_tokens:,} image tokens")
    if measured.video_tokens is not None:
        clips = f"{measured.videos:,} clip{'s' if measured.videos != 1 else ''}"
        parts.append(
            f"{measured.video_tokens:,} video tokens"
            + (f" from {clips}" if measured.videos else "")
        )
    if measured.audio_tokens is not None:
        clips = f"{measured.audios:,} clip{'s' if measured.audios != 1 else ''}"
        parts.append(
            f"{measured.audio_tokens:,} audio tokens"
            + (f" from {clips}" if measured.audios else "")
        )
    return ", ".join(parts)


def _with_losses(path: Path | str, skipped: dict[str, int]) -> dict[str, int]:
    """The conversations ``prepare --allow-losses`` found lost in the shards, counted too: a
    pass without packing does not carry them (only the packing loader's report does)."""
    from energon_packing.incoming.shards import SHARD_REASONS, load_losses

    losses = load_losses(path)
    carried = {r for r in SHARD_REASONS if r != "missing_json"} & set(skipped)
    if losses and not carried:
        for _, reason, _ in losses:
            skipped[reason] = skipped.get(reason, 0) + 1
    return skipped


def _split_size(dataset: Any) -> int | None:
    try:
        return len(dataset)
    except Exception:  # some Energon wrappers do not know their length
        return None


def packing_table(
    measured: Measured,
    *,
    algorithms: Sequence[str] = ALGORITHMS,
    buffers: Sequence[int] = (64, 256, 1024),
    modes: Sequence[str] = ("chunk", "carry"),
    offline: bool = True,
    **knobs: Any,
) -> list[Row]:
    """Packs of ``pack_stream`` per algorithm x mode x buffer (and one offline call each)."""
    capacity, costs, company = measured.capacity, measured.costs, measured.company
    bound = lower_bound(costs, capacity, company=company)
    real = sum(measured.lengths)
    rows = []
    for algorithm in algorithms:
        for mode in modes:
            for buffer in buffers:
                packs = sum(
                    1
                    for _ in pack_stream(
                        costs,
                        capacity,
                        buffer_size=buffer,
                        algorithm=algorithm,
                        carry=mode == "carry",
                        company=company,
                        **knobs,
                    )
                )
                rows.append(
                    Row(
                        algorithm=algorithm,
                        mode=mode,
                        buffer=buffer,
                        packs=packs,
                        bound=bound,
                        real_tokens=real,
                        capacity=capacity,
                    )
                )
        if offline:
            rows.append(
                Row(
                    algorithm=algorithm,
                    mode="offline",
                    buffer=None,
                    packs=len(pack(costs, capacity, algorithm=algorithm, company=company, **knobs)),
                    bound=bound,
                    real_tokens=real,
                    capacity=capacity,
                )
            )
    return rows


def format_table(rows: Sequence[Row]) -> str:
    """Rows = algorithms, columns = mode x buffer: packs over the bound and efficiency."""
    columns = sorted(
        {(r.mode, r.buffer) for r in rows},
        key=lambda c: (["chunk", "carry", "offline"].index(c[0]), c[1] or 0),
    )
    width = 17
    head = f"{'algorithm':<31}" + "".join(
        f"{(f'{mode} N={buffer}' if buffer else mode):>{width}}" for mode, buffer in columns
    )
    lines = [head, "-" * len(head)]
    for algorithm in dict.fromkeys(r.algorithm for r in rows):
        cells = []
        for mode, buffer in columns:
            row = next(
                (r for r in rows if (r.algorithm, r.mode, r.buffer) == (algorithm, mode, buffer)),
                None,
            )
            cells.append(
                f"{f'{100 * row.overhead:+.1f}% {100 * row.efficiency:.1f}%':>{width}}"
                if row
                else " " * width
            )
        marker = " *" if algorithm == DEFAULT_ALGORITHM else ""
        lines.append(f"{algorithm + marker:<31}" + "".join(cells))
    lines.append(
        "cells: packs over the lower bound / efficiency (real tokens / packs x C); "
        "chunk = Energon's own packing stage, * = default"
    )
    return "\n".join(lines)


def recommend(rows: Sequence[Row]) -> str:
    """The smallest buffer at which the default with carry is within 0.5 % of the bound."""
    ours = sorted(
        (r for r in rows if r.algorithm == DEFAULT_ALGORITHM and r.mode == "carry"),
        key=lambda r: r.buffer,
    )
    peer = [r for r in rows if r.mode == "chunk" and r.algorithm != DEFAULT_ALGORITHM]
    if not ours:
        return "no carry rows measured"
    pick_row = next((r for r in ours if r.overhead <= 0.005), ours[-1])
    text = (
        f"recommended: algorithm={DEFAULT_ALGORITHM!r}, carry=True, packing_buffer_size="
        f"{pick_row.buffer}: {pick_row.packs:,} packs (lower bound {pick_row.bound:,}), "
        f"{100 * pick_row.overhead:+.2f}% over it, {100 * pick_row.efficiency:.1f}% efficient"
    )
    same = [r for r in peer if r.buffer == pick_row.buffer]
    if same:
        best_peer = min(same, key=lambda r: r.packs)
        text += (
            f" (best peer at the same buffer, Energon chunking: {best_peer.algorithm} "
            f"{100 * best_peer.overhead:+.2f}%, {best_peer.packs - pick_row.packs:+d} packs)"
        )
    return text


@dataclass(kw_only=True, slots=True)
class PathCost:
    name: str
    microbatches: int
    computed_tokens: int  # tokens the model runs over, padding included
    real_tokens: int

    @property
    def efficiency(self) -> float:
        return self.real_tokens / self.computed_tokens if self.computed_tokens else 0.0


def loader_vs_trainer(
    measured: Measured,
    *,
    loader_packs: int,
    batch_size: int,
    algorithm: str = TRAINER_DEFAULT,
    pad_multiple: int = 1,
) -> list[PathCost]:
    """The same conversations three ways: loader packs (each C wide), trainer-side packs of
    every batch of ``batch_size`` conversations (as wide as each bin needs, NeMo-RL's path),
    and padded batches (every row as wide as the batch's longest)."""
    capacity, lengths = measured.capacity, measured.lengths
    padded = [round_up(n, pad_multiple) for n in lengths]
    real = sum(lengths)
    trainer_steps = padded_tokens = padded_steps = 0
    for start in range(0, len(padded), batch_size):
        chunk = padded[start : start + batch_size]
        trainer_steps += len(trainer_bins(chunk, capacity, algorithm=algorithm))
        padded_steps += 1
        padded_tokens += len(chunk) * max(chunk)
    return [
        PathCost(
            name="loader packs",
            microbatches=loader_packs,
            computed_tokens=loader_packs * capacity,
            real_tokens=real,
        ),
        PathCost(
            name=f"trainer packs (batch {batch_size}, {algorithm})",
            microbatches=trainer_steps,
            computed_tokens=sum(padded),  # the bins hold every padded row, nothing more
            real_tokens=real,
        ),
        PathCost(
            name=f"padded batches (batch {batch_size})",
            microbatches=padded_steps,
            computed_tokens=padded_tokens,
            real_tokens=real,
        ),
    ]


def format_paths(paths: Sequence[PathCost]) -> str:
    width = max(len(p.name) for p in paths) + 2
    lines = [f"{'path':<{width}}{'microbatches':>13}{'tokens computed':>17}{'efficiency':>12}"]
    for p in paths:
        lines.append(
            f"{p.name:<{width}}{p.microbatches:>13}{p.computed_tokens:>17,}{100 * p.efficiency:>11.1f}%"
        )
    return "\n".join(lines)


def format_skipped(skipped: dict[str, int], keys: dict[str, list[str]] | None = None) -> str:
    if not skipped:
        return "skipped: none"
    parts = []
    for reason, count in sorted(skipped.items()):
        example = f" (e.g. {keys[reason][0]})" if keys and keys.get(reason) else ""
        parts.append(f"{reason}: {count}{example}")
    return "skipped: " + ", ".join(parts)


def format_nothing_packed(
    path: Path | str,
    skipped: dict[str, int],
    keys: dict[str, list[str]] | None = None,
    *,
    capacity: int,
    shortest: int | None = None,
) -> str:
    """The report of a dataset where every conversation was skipped (nothing to pack)."""
    total = sum(skipped.values())
    if not total:
        return f"nothing to pack: {path} yielded no conversation (is the train split empty?)"
    lines = [f"nothing to pack: all {total:,} conversations read from {path} were skipped"]
    for reason, count in sorted(skipped.items(), key=lambda item: (-item[1], item[0])):
        example = f" (e.g. {keys[reason][0]})" if keys and keys.get(reason) else ""
        lines.append(f"  {reason}: {count:,}{example}")
    if shortest is not None:
        lines.append(
            f"the shortest conversation costs {shortest:,} tokens (padded), more than "
            f"--capacity {capacity:,}: pass --capacity {shortest:,} or more"
        )
    return "\n".join(lines)


def capacity_hint(
    costs: Sequence[int], *, capacity: int, pad_multiple: int, total: int
) -> str | None:
    """When over 1 % of ``total`` conversations cost more than ``capacity``: how many, and the
    C that keeps all of them (and the one that keeps 99 %)."""
    over = sum(c > capacity for c in costs)
    if not over or over <= 0.01 * total:
        return None
    everything = sorted(costs)
    keep_all = round_up(everything[-1], pad_multiple)
    keep_99 = round_up(everything[max(0, -(-99 * len(everything) // 100) - 1)], pad_multiple)
    text = (
        f"{over:,} of {total:,} conversations ({100 * over / total:.1f}%) are longer "
        f"than C={capacity:,} and are skipped as overlong: --capacity {keep_all} keeps all of them"
    )
    if capacity < keep_99 < keep_all:
        text += f" ({keep_99} keeps 99%)"
    return text + " (or --overlong truncate)"


def unbounded_costs(path: Path | str, encoder_for: Any, *, pad_multiple: int) -> list[int]:
    """The packing cost of every conversation of ``path``, measured with a width no
    conversation exceeds (``encoder_for(width)`` builds the task encoder)."""
    width = round_up(1 << 24, pad_multiple)
    return measure_costs(path, encoder_for(width), progress=False).costs


def shortest_cost(path: Path | str, encoder_for: Any, *, pad_multiple: int) -> int | None:
    """The smallest packing cost of any conversation of ``path`` (:func:`unbounded_costs`)."""
    costs = unbounded_costs(path, encoder_for, pad_multiple=pad_multiple)
    return min(costs) if costs else None


def format_scan(scan: Any, *, seconds: float, limit: int = 50) -> str:
    """``energon-packing check``: a per-reason table, then the findings with shard and offset."""
    members = sum(s.members for s in scan.shards)
    samples = sum(s.samples for s in scan.shards)
    rate = scan.bytes / seconds / 1e6 if seconds > 0 else float("inf")
    lines = [
        f"{scan.path}: {len(scan.shards)} shards, {scan.bytes / 1e6:,.1f} MB, {members:,} "
        f"members, {samples:,} samples; headers read in {seconds:.2f} s ({rate:,.0f} MB/s)"
    ]
    if not scan.findings:
        if not scan.empty:
            lines.append("nothing lost: every member of every shard reaches a sample with a .json")
        return "\n".join(lines)
    counts = scan.counts()
    lost = {}
    for finding in scan.losses:
        lost[finding.reason] = lost.get(finding.reason, 0) + 1
    width = max(len(r) for r in counts) + 2
    lines.append(f"\n{'reason':<{width}}{'findings':>9}{'conversations lost uncounted':>30}")
    for reason, count in sorted(counts.items(), key=lambda item: (-item[1], item[0])):
        lines.append(f"{reason:<{width}}{count:>9,}{lost.get(reason, 0):>30,}")
    lines.append(f"{'total':<{width}}{len(scan.findings):>9,}{len(scan.losses):>30,}\n")
    shard_width = min(max(len(f.shard) for f in scan.findings), 40) + 2
    key_width = min(max(len(f.key) for f in scan.findings), 32) + 2
    lines.append(f"{'shard':<{shard_width}}{'offset':>12}  {'key':<{key_width}}reason: detail")
    for finding in scan.findings[:limit]:
        lines.append(
            f"{finding.shard:<{shard_width}}{finding.offset:>12,}  {finding.key:<{key_width}}"
            f"{finding.reason}: {finding.detail}"
        )
    if len(scan.findings) > limit:
        lines.append(f"... and {len(scan.findings) - limit:,} more (--limit)")
    return "\n".join(lines)
