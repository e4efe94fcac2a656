"""The one pack schema: its batch keys, its dataclass, its layout function and its checks.

Everything that makes, batches, validates or consumes a pack uses this module: the loader's
assembly and ``batch()``, the trainer-side path, the filler batch, the shim's validation.

Two conversations, A = 5 tokens and B = 10, pad_multiple 4, width 36 (:func:`layout`)::

    input_ids          A A A A A p p p B B B B B B B B B B p p | 16 x tail pad
    token_mask         0 . . . . 0 0 0 0 . . . . . . . . . 0 0 | 0 ...        (0 on each first token)
    position_ids       0 1 2 3 4 5 6 7 0 1 2 3 4 5 6 7 8 9 ...  continues through B's tail
    padding_mask       F F F F F T T T F F F F F F F F F F T T | T ...
    cu_seqlens         [0, 5, 15]     real lengths, cumulated
    cu_seqlens_padded  [0, 8, 36]     padded extents; the last one absorbs the tail (= width)
    source_ids         ["A", "B"]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from energon_packing import handoff
from energon_packing.packing.algorithms import round_up

__all__ = [
    "BOOKKEEPING_KEYS",
    "BOUNDARY_KEYS",
    "CU_SEQLENS",
    "CU_SEQLENS_PADDED",
    "IMAGE_GRID_THW",
    "IMAGE_SOURCE_INDEX",
    "INPUT_IDS",
    "INPUT_LENGTHS",
    "PACKING_BUFFER_FIX",
    "PACKING_METRICS",
    "PACKING_SKIPPED",
    "PADDING_MASK",
    "PIXEL_VALUES",
    "PIXEL_VALUES_VIDEOS",
    "POSITION_IDS",
    "RESTORE_KEY",
    "ROW_KEYS",
    "SAMPLE_MASK",
    "SOURCE_IDS",
    "TOKEN_MASK",
    "VIDEO_GRID_THW",
    "VIDEO_SOURCE_INDEX",
    "Pack",
    "PackContractError",
    "Source",
    "check_pack",
    "collate",
    "empty_batch",
    "is_empty",
    "layout",
    "model_fields",
    "not_prepacked",
    "pack_from_batch",
]

# ---- batch keys --------------------------------------------------------------------------------
INPUT_IDS = "input_ids"  # int64 [B, C]
INPUT_LENGTHS = "input_lengths"  # int32 [B]: C for packs, the real length for padded rows
TOKEN_MASK = "token_mask"  # float32 [B, C]: loss weight of each token
SAMPLE_MASK = "sample_mask"  # float32 [B]: 1 if the row trains anything
POSITION_IDS = "position_ids"  # int64 [B, C], or [3, B, C] for mRoPE
PADDING_MASK = "padding_mask"  # bool [B, C]: True on pad and tail
CU_SEQLENS = "cu_seqlens"  # per pack int32 [n+1]: real lengths, cumulated
CU_SEQLENS_PADDED = "cu_seqlens_padded"  # per pack int32 [n+1]: padded extents, last = C
SOURCE_IDS = "source_ids"  # per pack list[str]
PIXEL_VALUES = "pixel_values"  # per pack float32 [patches, patch_dim]
IMAGE_GRID_THW = "image_grid_thw"  # per pack int64 [n_images, 3]
IMAGE_SOURCE_INDEX = "image_source_index"  # per pack int64 [n_images]
PIXEL_VALUES_VIDEOS = "pixel_values_videos"  # per pack float32 [patches, patch_dim]
VIDEO_GRID_THW = "video_grid_thw"  # per pack int64 [n_videos, 3]
VIDEO_SOURCE_INDEX = "video_source_index"  # per pack int64 [n_videos]
PACKING_METRICS = "packing_metrics"  # the producing worker's counters
PACKING_SKIPPED = "packing_skipped"  # (key, reason) of the skips since its previous batch
RESTORE_KEY = "__restore_key__"  # Energon's restore key (loader.restore_sample)

#: Stacked along the batch dimension (``position_ids`` along dim -2).
ROW_KEYS = (INPUT_IDS, TOKEN_MASK, POSITION_IDS, PADDING_MASK)
BOUNDARY_KEYS = (CU_SEQLENS, CU_SEQLENS_PADDED)
#: Keys that describe the batch, not the model's input: never forwarded to the model.
BOOKKEEPING_KEYS = frozenset(
    {
        CU_SEQLENS,
        CU_SEQLENS_PADDED,
        SOURCE_IDS,
        INPUT_LENGTHS,
        TOKEN_MASK,
        SAMPLE_MASK,
        PADDING_MASK,
        IMAGE_SOURCE_INDEX,
        VIDEO_SOURCE_INDEX,
        RESTORE_KEY,
        "__key__",
        PACKING_METRICS,
        PACKING_SKIPPED,
    }
)


class PackContractError(ValueError):
    """A pack (or prepacked batch) breaks the contract; the message names key and sources."""


#: How to turn packing on, as every "nothing was packed" message says it.
PACKING_BUFFER_FIX = (
    "Pass packing_buffer_size=256 (any int >= 1; 32-64 with carry=True) to get_train_dataset / "
    "get_val_dataset (NeMo-RL #4108: data.energon.task_encoder.packing.buffer_size)"
)


def not_prepacked(consumer: str) -> PackContractError:
    """The one error every consumer of packs raises for a batch without pack boundaries: the
    loader was built without a packing buffer, so nothing was packed."""
    return PackContractError(
        f"{CU_SEQLENS}: {consumer} takes loader packs, but this batch has no pack boundaries "
        f"(an unpacked batch: the Energon loader was built without packing_buffer_size). "
        f"{PACKING_BUFFER_FIX}; for ordinary padded rows use "
        f"energon_packing.trainer.pack_microbatches"
    )


@dataclass(kw_only=True, slots=True)
class Source:
    """One conversation, ready to be laid out.

    ``positions`` default to ``0..len-1``; mRoPE callers pass ``[3, len]``. ``media`` holds the
    conversation's image- and video-aligned model inputs (``pixel_values``, ``image_grid_thw``,
    ``pixel_values_videos``, ``video_grid_thw``, ...), each concatenated over its ``images``
    images or ``videos`` videos.
    """

    key: str
    input_ids: Sequence[int] | np.ndarray
    token_mask: Sequence[float] | np.ndarray
    positions: np.ndarray | None = None
    media: Mapping[str, np.ndarray] = field(default_factory=dict)
    #: model inputs aligned with the tokens (``mm_token_type_ids``, ...), one value per token
    token_fields: Mapping[str, np.ndarray] = field(default_factory=dict)
    #: what a token field holds on the padding behind this source, where not 0 (PaliGemma's
    #: ``token_type_ids``: 1, its answer's type; as 0 a pad would join its prompt block)
    token_fill: Mapping[str, int] = field(default_factory=dict)
    images: int = 0
    videos: int = 0


@dataclass(kw_only=True, slots=True)
class Pack:
    """One pack (one row of a batch), as numpy arrays."""

    input_ids: np.ndarray  # int64 [W]
    token_mask: np.ndarray  # float32 [W]
    position_ids: np.ndarray  # int64 [W], or [3, W] with mRoPE
    padding_mask: np.ndarray  # bool [W]
    cu_seqlens: np.ndarray  # int32 [n+1]
    cu_seqlens_padded: np.ndarray  # int32 [n+1]
    source_ids: list[str]
    image_source_index: np.ndarray  # int64 [n_images]
    video_source_index: np.ndarray = field(  # int64 [n_videos]
        default_factory=lambda: np.zeros(0, dtype=np.int64)
    )
    #: image-aligned model inputs of every source, in source order (``pixel_values``, ...)
    media: dict[str, np.ndarray] = field(default_factory=dict)
    #: token-aligned model inputs [W] (0 on padding, or its source's ``token_fill``), laid
    #: out like ``input_ids``
    token_fields: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def width(self) -> int:
        return int(self.input_ids.shape[-1])

    @property
    def real_tokens(self) -> int:
        return int(self.cu_seqlens[-1])

    def check(
        self,
        *,
        pad_multiple: int = 1,
        image_pad_id: int | None = None,
        merge_size: int = 2,
        cp_size: int = 1,
        video_pad_id: int | None = None,
    ) -> None:
        """Raises :class:`PackContractError` unless this pack meets every invariant."""
        check_pack(
            self,
            pad_multiple=pad_multiple,
            image_pad_id=image_pad_id,
            merge_size=merge_size,
            cp_size=cp_size,
            video_pad_id=video_pad_id,
        )


def layout(sources: Sequence[Source], *, width: int, pad_multiple: int, pad_id: int) -> Pack:
    """Lays ``sources`` end to end, each padded to ``pad_multiple``, the tail folded into the
    last one, so the pack is exactly ``width`` wide (see the module picture).

    The loader calls it with ``width=C``; the trainer-side path with the width its bin needs.
    Positions of the padding behind a source continue from its largest position + 1; the first
    token of every source trains nothing (no source predicts across a boundary).
    """
    if not sources:
        raise ValueError("a pack needs at least one source")
    mrope = sources[0].positions is not None and np.ndim(sources[0].positions) == 2
    input_ids = np.full(width, pad_id, dtype=np.int64)
    token_mask = np.zeros(width, dtype=np.float32)
    padding_mask = np.ones(width, dtype=bool)
    positions = np.zeros((3, width) if mrope else width, dtype=np.int64)
    cu, cu_padded, owners, video_owners = [0], [0], [], []
    media: dict[str, list[np.ndarray]] = {}
    names = dict.fromkeys(name for source in sources for name in source.token_fields)
    tokens = {name: np.zeros(width, dtype=np.int64) for name in names}
    start = 0
    for k, source in enumerate(sources):
        length = len(source.input_ids)
        padded = round_up(length, pad_multiple)
        if length == 0 or start + padded > width:
            raise ValueError(
                f"source {source.key!r} ({length} tokens, {padded} padded) does not fit at "
                f"offset {start} of a {width}-token pack"
            )
        extent = padded if k < len(sources) - 1 else width - start
        stop = start + length
        input_ids[start:stop] = source.input_ids
        token_mask[start:stop] = source.token_mask
        token_mask[start] = 0.0
        padding_mask[start:stop] = False
        own = np.arange(length) if source.positions is None else np.asarray(source.positions)
        if (own.ndim == 2) != mrope:
            raise ValueError(f"source {source.key!r}: 1-row and 3-row positions in one pack")
        positions[..., start:stop] = own
        positions[..., stop : start + extent] = own.max() + 1 + np.arange(start + extent - stop)
        cu.append(cu[-1] + length)
        cu_padded.append(start + extent)
        owners.extend([k] * source.images)
        video_owners.extend([k] * source.videos)
        for name, value in source.media.items():
            media.setdefault(name, []).append(np.asarray(value))
        for name, value in source.token_fields.items():
            tokens[name][start:stop] = value
            tokens[name][stop : start + extent] = source.token_fill.get(name, 0)
        start += padded
    return Pack(
        input_ids=input_ids,
        token_mask=token_mask,
        position_ids=positions,
        padding_mask=padding_mask,
        cu_seqlens=np.asarray(cu, dtype=np.int32),
        cu_seqlens_padded=np.asarray(cu_padded, dtype=np.int32),
        source_ids=[s.key for s in sources],
        image_source_index=np.asarray(owners, dtype=np.int64),
        video_source_index=np.asarray(video_owners, dtype=np.int64),
        media={name: _concatenate(parts, MEDIA_FILL.get(name, 0)) for name, parts in media.items()},
        token_fields=tokens,
    )


#: Media fields a processor pads with other than zeros across a call's images (Phi-4-multimodal
#: pads the crop masks of an image with fewer crops with ones: its vision tower then reads the
#: zero pixels of a padding crop as a whole crop, which it drops after; a zero mask would leave
#: every patch of that crop masked, and its attention rows without a key).
MEDIA_FILL = {"image_attention_mask": 1}


def _concatenate(parts: list[np.ndarray], fill: int = 0) -> np.ndarray:
    """Concatenated on dim 0; where the trailing dims differ (tiles or patches per image), each
    part is padded to the largest first with ``fill``, as a processor pads a batch. Parts that are
    consecutive pieces of one array (one image-processor call for a whole pack) are joined
    without a copy: a view of that array."""
    if len(parts) == 1:
        return parts[0]
    joined = _adjacent(parts)
    if joined is not None:
        return joined
    trailing = {p.shape[1:] for p in parts}
    if len(trailing) > 1:
        widest = tuple(max(sizes) for sizes in zip(*trailing))
        parts = [
            np.pad(
                p,
                [(0, 0), *((0, w - s) for s, w in zip(p.shape[1:], widest))],
                constant_values=fill,
            )
            for p in parts
        ]
    # in a worker, large media are written where they cross to the main process
    shape = (sum(len(p) for p in parts), *parts[0].shape[1:])
    out = handoff.media_buffer(shape, np.result_type(*parts))
    return np.concatenate(parts, out=out)


def _adjacent(parts: list[np.ndarray]) -> np.ndarray | None:
    """The view of their common base that ``parts`` tile end to end (each C-contiguous, of one
    dtype and trailing shape, each starting where the previous ends), or None."""
    first = parts[0]
    base = first.base
    if not isinstance(base, np.ndarray) or not base.flags.c_contiguous:
        return None
    end = first.__array_interface__["data"][0]
    for p in parts:
        if (
            p.base is not base
            or p.dtype != first.dtype
            or p.shape[1:] != first.shape[1:]
            or not p.flags.c_contiguous
            or p.__array_interface__["data"][0] != end
        ):
            return None
        end += p.nbytes
    offset = first.__array_interface__["data"][0] - base.__array_interface__["data"][0]
    shape = (sum(len(p) for p in parts), *first.shape[1:])
    if offset < 0 or offset + (end - first.__array_interface__["data"][0]) > base.nbytes:
        return None
    return np.ndarray(shape, dtype=first.dtype, buffer=base, offset=offset)


def check_pack(
    pack: Pack,
    *,
    pad_multiple: int = 1,
    image_pad_id: int | None = None,
    merge_size: int = 2,
    cp_size: int = 1,
    video_pad_id: int | None = None,
) -> None:
    """Raises :class:`PackContractError` unless ``pack`` meets every invariant of the contract;
    with ``image_pad_id`` (``video_pad_id``) also that each source holds as many image-pad
    (video-pad) tokens as its images' (videos') grids need (``t*h*w / merge_size**2``)."""
    source_ids = pack.source_ids

    def fail(key: str, message: str) -> None:
        raise PackContractError(f"{key}: {message} (pack source_ids={list(source_ids)})")

    width = pack.width
    cu = np.asarray(pack.cu_seqlens, dtype=np.int64)
    cup = np.asarray(pack.cu_seqlens_padded, dtype=np.int64)
    if cu.ndim != 1 or cup.ndim != 1 or len(cu) != len(cup) or len(cu) < 2:
        fail(
            CU_SEQLENS,
            f"cu_seqlens {cu.tolist()} and cu_seqlens_padded {cup.tolist()} "
            "must be 1-D, of equal length >= 2",
        )
    if cu[0] != 0 or cup[0] != 0:
        fail(CU_SEQLENS, f"must start at 0, got {cu[0]} and {cup[0]}")
    real, pad = np.diff(cu), np.diff(cup)
    if (real <= 0).any() or (pad <= 0).any():
        fail(CU_SEQLENS, f"must be strictly increasing: {cu.tolist()} / {cup.tolist()}")
    if (real > pad).any():
        i = int(np.argmax(real > pad))
        fail(CU_SEQLENS, f"source {i} has {real[i]} real tokens but a padded extent of {pad[i]}")
    if cup[-1] != width:
        fail(CU_SEQLENS_PADDED, f"last entry {cup[-1]} != pack width {width}")
    if len(source_ids) != len(real):
        fail(SOURCE_IDS, f"{len(source_ids)} ids for {len(real)} sources")
    if (pad[:-1] % pad_multiple).any():
        i = int(np.argmax(pad[:-1] % pad_multiple != 0))
        fail(
            CU_SEQLENS_PADDED,
            f"source {i} padded to {pad[i]}, not a multiple of pad_multiple={pad_multiple}",
        )
    if width % pad_multiple:
        fail(INPUT_IDS, f"pack width {width} is not a multiple of pad_multiple={pad_multiple}")
    if cp_size > 1 and (pad % (2 * cp_size)).any():
        i = int(np.argmax(pad % (2 * cp_size) != 0))
        fail(
            CU_SEQLENS_PADDED,
            f"source {i} has padded length {pad[i]}, not divisible by "
            f"2*cp_size={2 * cp_size}; set pad_multiple to a multiple of {2 * cp_size}",
        )
    starts = cup[:-1]
    mask = np.asarray(pack.token_mask)
    if mask.shape[-1] != width:
        fail(TOKEN_MASK, f"width {mask.shape[-1]} != {width}")
    if (mask[starts] != 0).any():
        i = int(np.argmax(mask[starts] != 0))
        fail(TOKEN_MASK, f"the first token of source {i} (position {starts[i]}) is trained")
    real_positions = np.zeros(width, dtype=bool)
    for s, n in zip(starts, real):
        real_positions[s : s + n] = True
    if (mask[~real_positions] != 0).any():
        fail(
            TOKEN_MASK, f"{int((mask[~real_positions] != 0).sum())} pad/tail positions are trained"
        )
    if pack.padding_mask is not None and not np.array_equal(
        np.asarray(pack.padding_mask), ~real_positions
    ):
        fail(PADDING_MASK, "must be True exactly on pad and tail positions")
    for pad_id, grid_key, owner_key, owners in (
        (image_pad_id, IMAGE_GRID_THW, IMAGE_SOURCE_INDEX, pack.image_source_index),
        (video_pad_id, VIDEO_GRID_THW, VIDEO_SOURCE_INDEX, pack.video_source_index),
    ):
        grids = pack.media.get(grid_key)
        if pad_id is None or grids is None:
            continue
        grids = np.asarray(grids, dtype=np.int64).reshape(-1, 3)
        owners = np.asarray(owners, dtype=np.int64)
        if len(owners) != len(grids):
            fail(owner_key, f"{len(owners)} owners for {len(grids)} grids")
        ids = np.asarray(pack.input_ids)
        for i, (s, n) in enumerate(zip(starts, real)):
            expected = int(grids[owners == i].prod(axis=1).sum()) // (merge_size**2)
            found = int((ids[s : s + n] == pad_id).sum())
            if found != expected:
                fail(
                    INPUT_IDS,
                    f"source {i} ({source_ids[i]}) has {found} {grid_key[:5]}-pad tokens, "
                    f"its {grid_key[:5]}s need {expected}",
                )


def collate(packs: Sequence[Pack], *, prepacked: bool = True) -> dict[str, Any]:
    """The batch dict of ``packs`` (torch tensors; numpy memory is shared, not copied).

    ``prepacked=True``: the contract's prepacked batch (``input_lengths`` = width, boundary keys
    present). ``prepacked=False``: ordinary padded rows of one source each (``input_lengths`` =
    the real length, no boundary keys), what trainer-side packing consumes.

    Inside a ``DataLoader`` worker the batch is a :class:`~energon_packing.handoff.WorkerBatch`:
    its small tensors cross to the main process inline, only those of at least
    ``OWN_STORAGE_BYTES`` in shared memory (:mod:`energon_packing.handoff`).
    """
    batch = _collate(packs, prepacked=prepacked)
    return handoff.shared(batch) if handoff.in_worker() else batch


def _collate(packs: Sequence[Pack], *, prepacked: bool) -> dict[str, Any]:
    """:func:`collate` as the main process has it (no shared memory)."""
    import torch  # the schema itself is numpy; batches are torch

    width = packs[0].width
    positions = torch.stack([torch.from_numpy(p.position_ids) for p in packs])
    if positions.ndim == 3:  # mRoPE: [B, 3, W] -> [3, B, W]
        positions = positions.permute(1, 0, 2).contiguous()
    batch: dict[str, Any] = {
        INPUT_IDS: torch.stack([torch.from_numpy(p.input_ids) for p in packs]),
        INPUT_LENGTHS: torch.tensor(
            [width if prepacked else p.real_tokens for p in packs], dtype=torch.int32
        ),
        TOKEN_MASK: torch.stack([torch.from_numpy(p.token_mask) for p in packs]),
        SAMPLE_MASK: torch.tensor(
            [float(bool((p.token_mask > 0).any())) for p in packs], dtype=torch.float32
        ),
        POSITION_IDS: positions,
        PADDING_MASK: torch.stack([torch.from_numpy(p.padding_mask) for p in packs]),
        SOURCE_IDS: [list(p.source_ids) for p in packs],
        IMAGE_SOURCE_INDEX: [torch.from_numpy(p.image_source_index) for p in packs],
    }
    if any(len(p.video_source_index) for p in packs):
        batch[VIDEO_SOURCE_INDEX] = [torch.from_numpy(p.video_source_index) for p in packs]
    for name in dict.fromkeys(name for p in packs for name in p.token_fields):
        batch[name] = torch.stack(
            [
                torch.from_numpy(p.token_fields[name])
                if name in p.token_fields
                else torch.zeros(width, dtype=torch.int64)
                for p in packs
            ]
        )
    if prepacked:
        batch[CU_SEQLENS] = [torch.from_numpy(p.cu_seqlens) for p in packs]
        batch[CU_SEQLENS_PADDED] = [torch.from_numpy(p.cu_seqlens_padded) for p in packs]
    for name in dict.fromkeys(name for p in packs for name in p.media):
        like = next(p.media[name] for p in packs if name in p.media)
        empty = np.zeros((0, *like.shape[1:]), dtype=like.dtype)  # a pack without this media
        batch[name] = [handoff.to_tensor(p.media.get(name, empty)) for p in packs]
    return batch


def model_fields(batch: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """``(media keys, token-field keys)`` of a batch: the model inputs beyond ``input_ids`` and
    ``position_ids``. Media are per-pack lists (``pixel_values``, ``image_grid_thw``, a
    processor's other image fields); token fields are ``[B, W]`` tensors aligned with
    ``input_ids`` (``mm_token_type_ids``, ``token_type_ids``)."""
    rows = batch[INPUT_IDS].shape
    media, tokens = [], []
    for key, value in batch.items():
        if key in BOOKKEEPING_KEYS or key in ROW_KEYS:
            continue
        if isinstance(value, list):
            media.append(key)
        elif getattr(value, "shape", None) is not None and tuple(value.shape) == tuple(rows):
            tokens.append(key)
    return media, tokens


def empty_batch(width: int, *, mrope: bool = False) -> dict[str, Any]:
    """A batch of zero packs: every key of :func:`collate`, no row. A loader worker ends its
    stream with one when skips are left that no pack carried (the accounting keys ride on it);
    a consumer iterating over rows does nothing with it, and the shim passes it by."""
    import torch

    return {
        INPUT_IDS: torch.zeros((0, width), dtype=torch.int64),
        INPUT_LENGTHS: torch.zeros(0, dtype=torch.int32),
        TOKEN_MASK: torch.zeros((0, width), dtype=torch.float32),
        SAMPLE_MASK: torch.zeros(0, dtype=torch.float32),
        POSITION_IDS: torch.zeros((3, 0, width) if mrope else (0, width), dtype=torch.int64),
        PADDING_MASK: torch.zeros((0, width), dtype=torch.bool),
        SOURCE_IDS: [],
        IMAGE_SOURCE_INDEX: [],
        CU_SEQLENS: [],
        CU_SEQLENS_PADDED: [],
    }


def is_empty(batch: Mapping[str, Any]) -> bool:
    """True for a batch of zero rows (:func:`empty_batch`): accounting only."""
    ids = batch.get(INPUT_IDS)
    return ids is not None and ids.shape[0] == 0


def pack_from_batch(batch: Mapping[str, Any], row: int) -> Pack:
    """Row ``row`` of a prepacked batch as a :class:`Pack` (numpy views, nothing copied)."""
    import torch

    def array(value: Any) -> np.ndarray:
        return torch.as_tensor(value).numpy()

    positions = batch.get(POSITION_IDS)
    if positions is not None:
        positions = array(positions[:, row] if positions.ndim == 3 else positions[row])
    media = {
        name: array(batch[name][row])
        for name in (PIXEL_VALUES, IMAGE_GRID_THW, PIXEL_VALUES_VIDEOS, VIDEO_GRID_THW)
        if batch.get(name) is not None
    }
    owners = batch.get(IMAGE_SOURCE_INDEX)
    video_owners = batch.get(VIDEO_SOURCE_INDEX)
    return Pack(
        input_ids=array(batch[INPUT_IDS][row]),
        token_mask=array(batch[TOKEN_MASK][row]),
        position_ids=positions,
        padding_mask=array(batch[PADDING_MASK][row]) if PADDING_MASK in batch else None,
        cu_seqlens=array(batch[CU_SEQLENS][row]),
        cu_seqlens_padded=array(batch[CU_SEQLENS_PADDED][row]),
        source_ids=list(batch[SOURCE_IDS][row]),
        image_source_index=array(owners[row]) if owners is not None else np.zeros(0, np.int64),
        video_source_index=(
            array(video_owners[row]) if video_owners is not None else np.zeros(0, np.int64)
        ),
        media=media,
    )
