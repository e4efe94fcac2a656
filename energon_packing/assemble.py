"""A group of encoded conversations -> one full-width pack (pure numpy; no Energon, no torch).

Two conversations, A = 5 tokens and B = 10, pad_multiple 4, capacity 36::

    input_ids          A A A A A p p p B B B B B B B B B B p p | 16 x tail pad
    token_mask         0 . . . . 0 0 0 0 . . . . . . . . . 0 0 | 0 ...        (0 on each first token)
    position_ids       0 1 2 3 4 5 6 7 0 1 2 3 4 5 6 7 8 9 ...  continues through B's tail
    padding_mask       F F F F F T T T F F F F F F F F F F T T | T ...
    cu_seqlens         [0, 5, 15]     real lengths, cumulated
    cu_seqlens_padded  [0, 8, 36]     padded extents; the last one absorbs the tail (= capacity)
    source_ids         ["A", "B"]

The trainer consumes it through :mod:`energon_packing.trainer`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from energon_packing.contract import check_pack, round_up


@dataclass(kw_only=True, slots=True)
class SourceTokens:
    """What assembly needs from one encoded conversation."""

    key: str
    input_ids: Sequence[int]
    token_mask: Sequence[float]
    grids: Sequence[tuple[int, int, int]] = ()


@dataclass(kw_only=True, slots=True)
class Pack:
    """One pack, unbatched (the contract's per-row fields)."""

    input_ids: np.ndarray  # int64 [C]
    token_mask: np.ndarray  # float32 [C]
    position_ids: np.ndarray  # int64 [C], or [3, C] with mRoPE
    padding_mask: np.ndarray  # bool [C]
    cu_seqlens: np.ndarray  # int32 [n+1]
    cu_seqlens_padded: np.ndarray  # int32 [n+1]
    source_ids: list[str]
    image_grid_thw: np.ndarray  # int64 [n_images, 3]
    image_source_index: np.ndarray  # int64 [n_images]
    pixel_values: np.ndarray | None = None  # float32 [patches, patch_dim]
    extra: dict = field(default_factory=dict)

    @property
    def capacity(self) -> int:
        return int(self.input_ids.shape[-1])

    @property
    def real_tokens(self) -> int:
        return int(self.cu_seqlens[-1])

    def check(self, *, pad_multiple: int, image_pad_id: int | None = None) -> None:
        """Raises :class:`~energon_packing.contract.PackContractError` unless this pack meets
        every invariant (image-pad counts too, given ``image_pad_id``)."""
        check_pack(
            input_ids=self.input_ids,
            token_mask=self.token_mask,
            cu_seqlens=self.cu_seqlens,
            cu_seqlens_padded=self.cu_seqlens_padded,
            source_ids=self.source_ids,
            padding_mask=self.padding_mask,
            image_grid_thw=self.image_grid_thw,
            image_source_index=self.image_source_index,
            pad_multiple=pad_multiple,
            image_pad_id=image_pad_id,
        )


@dataclass(kw_only=True, slots=True, frozen=True)
class MRope:
    """Token ids and merge size that Qwen2-VL's 3-row (t, h, w) positions need."""

    vision_start_id: int
    image_pad_id: int
    merge_size: int = 2


def mrope_positions(
    input_ids: Sequence[int], grids: Sequence[tuple[int, int, int]], spec: MRope
) -> np.ndarray:
    """``[3, len(input_ids)]`` positions of one source, as Qwen2-VL's ``get_rope_index``
    computes them for that source alone: text advances all three rows together; an image's
    pad tokens get (t, row, column) of its merged grid, offset by the text before it; text
    after an image restarts at the largest position so far + 1."""
    ids = np.asarray(input_ids)
    positions = np.empty((3, len(ids)), dtype=np.int64)
    starts = np.flatnonzero(ids == spec.vision_start_id)
    if len(starts) != len(grids):
        raise ValueError(f"{len(starts)} vision-start tokens for {len(grids)} image grids")
    cursor, next_pos = 0, 0
    for vision_start, (t, h, w) in zip(starts, grids):
        text = vision_start + 1 - cursor  # text before the image, the vision-start token included
        positions[:, cursor : cursor + text] = next_pos + np.arange(text)
        gh, gw = h // spec.merge_size, w // spec.merge_size
        n = t * gh * gw
        first = cursor + text
        if not (ids[first : first + n] == spec.image_pad_id).all():
            raise ValueError(f"image at token {first} does not have {n} image-pad tokens")
        base = next_pos + text
        positions[0, first : first + n] = base + np.repeat(np.arange(t), gh * gw)
        positions[1, first : first + n] = base + np.tile(np.repeat(np.arange(gh), gw), t)
        positions[2, first : first + n] = base + np.tile(np.arange(gw), t * gh)
        next_pos = int(positions[:, first : first + n].max()) + 1
        cursor = first + n
    positions[:, cursor:] = next_pos + np.arange(len(ids) - cursor)
    return positions


def assemble(
    sources: Sequence[SourceTokens],
    *,
    capacity: int,
    pad_multiple: int,
    pad_id: int,
    mrope: MRope | None = None,
    check: bool = True,
) -> Pack:
    """Lays ``sources`` out end to end, each padded to ``pad_multiple``, tail folded into the
    last one, so the pack is exactly ``capacity`` wide (see the module picture)."""
    if not sources:
        raise ValueError("a pack needs at least one source")
    input_ids = np.full(capacity, pad_id, dtype=np.int64)
    token_mask = np.zeros(capacity, dtype=np.float32)
    padding_mask = np.ones(capacity, dtype=bool)
    positions = np.zeros((3, capacity) if mrope else capacity, dtype=np.int64)
    cu, cu_padded = [0], [0]
    grids: list[tuple[int, int, int]] = []
    owners: list[int] = []
    start = 0
    for k, source in enumerate(sources):
        length = len(source.input_ids)
        padded = round_up(length, pad_multiple)
        extent = padded if k < len(sources) - 1 else capacity - start
        if length == 0 or start + padded > capacity:
            raise ValueError(
                f"source {source.key!r} ({length} tokens, {padded} padded) does not fit at "
                f"offset {start} of a {capacity}-token pack"
            )
        stop = start + length
        input_ids[start:stop] = source.input_ids
        token_mask[start:stop] = source.token_mask
        token_mask[start] = 0.0
        padding_mask[start:stop] = False
        if mrope:
            real = mrope_positions(source.input_ids, source.grids, mrope)
            positions[:, start:stop] = real
            tail = start + extent - stop
            positions[:, stop : start + extent] = real.max() + 1 + np.arange(tail)
        else:
            positions[start : start + extent] = np.arange(extent)
        cu.append(cu[-1] + length)
        cu_padded.append(start + extent)
        grids.extend(source.grids)
        owners.extend([k] * len(source.grids))
        start += padded
    pack = Pack(
        input_ids=input_ids,
        token_mask=token_mask,
        position_ids=positions,
        padding_mask=padding_mask,
        cu_seqlens=np.asarray(cu, dtype=np.int32),
        cu_seqlens_padded=np.asarray(cu_padded, dtype=np.int32),
        source_ids=[s.key for s in sources],
        image_grid_thw=np.asarray(grids, dtype=np.int64).reshape(-1, 3),
        image_source_index=np.asarray(owners, dtype=np.int64),
    )
    if check:
        pack.check(pad_multiple=pad_multiple)
    return pack
