"""The trainer-side shim: prepacked batches in, microbatches with varlen attention params out.

The one branch where loader packs and trainer packs meet (NeMo-RL's microbatch iterator)::

    batch ─ cu_seqlens present? ─ yes ─> prepacked_microbatches: validate; one pack each
                               └─ no ──> trainer_side.pack_microbatches: bin rows, squeeze
                                         (or trainer_side.padded_microbatch: no packing)
    each microbatch: model_inputs (input_ids, position_ids, packed_seq_params(qkv_format="thd"),
                     pixel_values, image_grid_thw, a processor's other fields,
                     vision_token_index), labels, loss_mask

Boundary modes for the attention parameters:

* ``"padded"`` (default; NeMo-RL #4105 at f31f793): the padded boundaries as
  ``cu_seqlens_q/kv`` and as ``*_padded`` (the same array twice), ``pad_between_seqs=False``;
* ``"real"`` (NeMo-RL after #4105): real boundaries as ``cu_seqlens_q/kv``, padded ones as
  ``*_padded``, ``pad_between_seqs = any(real != padded)`` (needs a kernel that supports it).

Context parallelism: every padded source is cut into ``2*cp_size`` chunks; rank r keeps chunks
r and ``2*cp_size-1-r``. Bookkeeping keys (``source_ids``, boundaries, masks, restore keys)
never reach ``model_inputs``. No Energon import; Megatron-Core's ``PackedSeqParams`` is used when
importable, else a local dataclass with the same fields. Nothing here mutates the batch.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch

from energon_packing.schema import (
    BOOKKEEPING_KEYS,
    BOUNDARY_KEYS,
    CU_SEQLENS,
    CU_SEQLENS_PADDED,
    INPUT_IDS,
    INPUT_LENGTHS,
    POSITION_IDS,
    SOURCE_IDS,
    TOKEN_MASK,
    PackContractError,
    is_empty,
    model_fields,
    not_prepacked,
    pack_from_batch,
)

__all__ = [
    "BOUNDARY_MODES",
    "MICRO_BATCH_INDICES",
    "MICRO_BATCH_LENGTHS",
    "LocalPackedSeqParams",
    "Microbatch",
    "check_model_inputs",
    "cp_indices",
    "is_prepacked",
    "make_packed_seq_params",
    "micro_batch_shapes",
    "packed_seq_params_class",
    "prepacked_microbatches",
    "text_positions",
    "validate_prepacked",
]

BOUNDARY_MODES = ("padded", "real")
MICRO_BATCH_INDICES = "MICRO_BATCH_INDICES"
MICRO_BATCH_LENGTHS = "MICRO_BATCH_LENGTHS"


@dataclass
class LocalPackedSeqParams:
    """Megatron-Core's ``PackedSeqParams`` fields, for trainers without megatron-core."""

    qkv_format: str | None = None
    cu_seqlens_q: torch.Tensor | None = None
    cu_seqlens_kv: torch.Tensor | None = None
    cu_seqlens_q_padded: torch.Tensor | None = None
    cu_seqlens_kv_padded: torch.Tensor | None = None
    max_seqlen_q: int | None = None
    max_seqlen_kv: int | None = None
    local_cp_size: int | None = None
    cp_group: Any = None
    pad_between_seqs: bool | None = None
    total_tokens: int | None = None


@lru_cache(maxsize=1)
def packed_seq_params_class() -> type:
    """Megatron-Core's ``PackedSeqParams`` when importable, else :class:`LocalPackedSeqParams`."""
    try:
        with warnings.catch_warnings():  # "Transformer Engine and Apex are not installed"
            warnings.simplefilter("ignore")
            from megatron.core.packed_seq_params import PackedSeqParams
    except ImportError:
        return LocalPackedSeqParams
    return PackedSeqParams


def make_packed_seq_params(
    cu_seqlens: torch.Tensor,
    cu_seqlens_padded: torch.Tensor,
    *,
    boundary: str = "padded",
    cp_size: int = 1,
    cp_group: Any = None,
    total_tokens: int | None = None,
) -> Any:
    """``PackedSeqParams(qkv_format="thd")`` for one packed row, in either boundary mode, with
    the fields NeMo-RL's prepacked consumer sets.

    ``pad_between_seqs`` and ``total_tokens`` (the CP-local width; Mamba and hybrid layers
    build ``seq_idx`` from it) are set where the class has the fields (newer Megatron-Core, the
    local fallback); :attr:`Microbatch.pad_between_seqs` carries the former either way.
    ``local_cp_size`` is set only together with a ``cp_group``: without one, Megatron-LM's
    ``resolve_cp_group`` asserts and MLA attention requires it to be None (NeMo-RL leaves both
    unset).
    """
    if boundary not in BOUNDARY_MODES:
        raise ValueError(
            f"boundary={boundary!r} is not valid; choose one of {', '.join(BOUNDARY_MODES)}"
        )
    cu = cu_seqlens.to(torch.int32)
    padded = cu_seqlens_padded.to(torch.int32)
    q = padded if boundary == "padded" else cu
    max_seqlen = int((padded[1:] - padded[:-1]).max())
    cls = packed_seq_params_class()
    fields = {f.name for f in dataclasses.fields(cls)}
    values = dict(
        qkv_format="thd",
        cu_seqlens_q=q,
        cu_seqlens_kv=q,
        cu_seqlens_q_padded=padded,
        cu_seqlens_kv_padded=padded,
        max_seqlen_q=max_seqlen,
        max_seqlen_kv=max_seqlen,
        local_cp_size=cp_size if cp_group is not None else None,
        cp_group=cp_group,
        pad_between_seqs=bool(boundary == "real" and not torch.equal(cu, padded)),
        total_tokens=int(padded[-1]) // cp_size if total_tokens is None else total_tokens,
    )
    return cls(**{k: v for k, v in values.items() if k in fields})


def cp_indices(cu_seqlens_padded: torch.Tensor, cp_size: int, cp_rank: int) -> torch.Tensor:
    """Row positions that context-parallel rank ``cp_rank`` keeps: of every padded source, the
    chunks ``cp_rank`` and ``2*cp_size-1-cp_rank`` of ``2*cp_size`` (causal load balance)."""
    bounds = cu_seqlens_padded.tolist()
    if cp_size == 1:
        return torch.arange(bounds[-1])
    parts = []
    for start, stop in zip(bounds[:-1], bounds[1:]):
        if (stop - start) % (2 * cp_size):
            raise PackContractError(
                f"cu_seqlens_padded: a source of padded length {stop - start} does not split into "
                f"2*cp_size={2 * cp_size} equal chunks; set pad_multiple to a multiple of {2 * cp_size}"
            )
        chunk = (stop - start) // (2 * cp_size)
        for c in (cp_rank, 2 * cp_size - 1 - cp_rank):
            parts.append(torch.arange(start + c * chunk, start + (c + 1) * chunk))
    return torch.cat(parts)


@dataclass(kw_only=True, slots=True)
class Microbatch:
    """What one forward/backward step consumes.

    ``model_inputs`` is exactly what goes to ``model(**model_inputs)``. ``labels`` and
    ``loss_mask`` are next-token targets and weights, aligned with the (CP-local) tokens.
    """

    model_inputs: dict
    labels: torch.Tensor
    loss_mask: torch.Tensor
    source_ids: list
    rows: tuple  # the batch rows this microbatch holds
    length: int  # tokens per row before CP (MICRO_BATCH_LENGTHS)
    real_tokens: int  # tokens that belong to a conversation (no padding, no tail)
    cu_seqlens: torch.Tensor | None = None
    cu_seqlens_padded: torch.Tensor | None = None
    pad_between_seqs: bool = False

    @property
    def valid_tokens(self) -> int:
        return int((self.loss_mask > 0).sum())


def is_prepacked(batch: Mapping[str, Any]) -> bool:
    """True if the batch carries packs with boundaries (then both boundary keys are required).
    False for an accounting-only batch of zero rows (:func:`energon_packing.schema.empty_batch`)."""
    if is_empty(batch):
        return False
    present = [key for key in BOUNDARY_KEYS if key in batch]
    if len(present) == 1:
        missing = next(key for key in BOUNDARY_KEYS if key not in batch)
        raise PackContractError(
            f"{missing}: a prepacked batch has {present[0]!r} but no {missing!r}; loader packs "
            f"carry both (source_ids={batch.get(SOURCE_IDS)})"
        )
    return bool(present)


def validate_prepacked(
    batch: Mapping[str, Any],
    *,
    pad_multiple: int = 1,
    cp_size: int = 1,
    image_pad_id: int | None = None,
) -> None:
    """Raises :class:`PackContractError` (key, numbers, ``source_ids``) unless every pack of the
    batch meets the contract; with ``image_pad_id``, each conversation's image-pad tokens must
    also match what its images produce."""
    if not is_prepacked(batch):
        raise not_prepacked("validate_prepacked")
    for key in (INPUT_IDS, TOKEN_MASK, SOURCE_IDS):
        if key not in batch:
            raise PackContractError(f"{key}: missing from a prepacked batch")
    ids = batch[INPUT_IDS]
    rows, width = ids.shape
    for key in (CU_SEQLENS, CU_SEQLENS_PADDED, SOURCE_IDS):
        if len(batch[key]) != rows:
            raise PackContractError(
                f"{key}: {len(batch[key])} entries for {rows} packs "
                f"(source_ids={batch[SOURCE_IDS]})"
            )
    if tuple(batch[TOKEN_MASK].shape) != (rows, width):
        raise PackContractError(
            f"token_mask: shape {tuple(batch[TOKEN_MASK].shape)} != "
            f"input_ids {(rows, width)} (source_ids={batch[SOURCE_IDS]})"
        )
    if INPUT_LENGTHS in batch and (torch.as_tensor(batch[INPUT_LENGTHS]) != width).any():
        raise PackContractError(
            f"input_lengths: {torch.as_tensor(batch[INPUT_LENGTHS]).tolist()}, "
            f"a prepacked row always counts as {width} "
            f"(source_ids={batch[SOURCE_IDS]})"
        )
    for row in range(rows):
        pack_from_batch(batch, row).check(
            pad_multiple=pad_multiple, image_pad_id=image_pad_id, cp_size=cp_size
        )


def text_positions(cu_seqlens_padded: torch.Tensor) -> torch.Tensor:
    """``[C]``: 0, 1, ... restarting at every padded boundary and running on through each
    conversation's padding (the 1-D positions trainers' packed paths read)."""
    bounds = torch.as_tensor(cu_seqlens_padded, dtype=torch.int64)
    starts = torch.repeat_interleave(bounds[:-1], bounds.diff())
    return torch.arange(int(bounds[-1])) - starts


def row_positions(positions: torch.Tensor, row: int) -> torch.Tensor:
    """Row ``row`` of ``[B, S]`` or ``[3, B, S]`` position ids, as ``[S]`` or ``[3, S]``."""
    return positions[:, row] if positions.ndim == 3 else positions[row]


def _vision_index(ids: torch.Tensor, image_token_id: int | None) -> torch.Tensor | None:
    """For each token: which row of the vision features fills it (-1: not an image token)."""
    if image_token_id is None:
        return None
    is_image = ids == image_token_id
    return torch.where(is_image, torch.cumsum(is_image, dim=-1) - 1, -1)


def build_microbatch(
    *,
    ids: torch.Tensor,
    positions: torch.Tensor,
    token_mask: torch.Tensor,
    cu: torch.Tensor,
    cu_padded: torch.Tensor,
    media: dict,
    token_fields: dict,
    source_ids: list,
    rows: tuple,
    image_token_id: int | None,
    boundary: str,
    cp_size: int,
    cp_rank: int,
    cp_group: Any,
) -> Microbatch:
    """Labels, CP slice and attention params for one flat packed row (``ids [T]``); the
    prepacked path and the trainer-side path both end here. ``media`` (image-aligned) pass to
    the model as they are; ``token_fields`` (aligned with ``ids``) are CP-sliced like it."""
    labels = torch.roll(ids, -1)
    loss_mask = torch.roll(token_mask, -1)  # weight of predicting token t+1 from position t
    vision = _vision_index(ids, image_token_id)
    keep = cp_indices(cu_padded, cp_size, cp_rank)
    params = make_packed_seq_params(
        cu,
        cu_padded,
        boundary=boundary,
        cp_size=cp_size,
        cp_group=cp_group,
        total_tokens=len(keep),
    )
    ids, labels, loss_mask = ids[keep], labels[keep], loss_mask[keep]
    positions = positions[..., keep]
    vision = vision[keep] if vision is not None else None
    inputs = {"input_ids": ids.unsqueeze(0), "packed_seq_params": params}
    inputs["position_ids"] = positions.unsqueeze(-2)  # [1, T] or [3, 1, T]
    if any(len(value) for value in media.values()):
        inputs.update(media)
        if vision is not None:
            inputs["vision_token_index"] = vision.unsqueeze(0)
    for name, value in token_fields.items():
        inputs[name] = value[keep].unsqueeze(0)
    return Microbatch(
        model_inputs=inputs,
        labels=labels.unsqueeze(0),
        loss_mask=loss_mask.unsqueeze(0),
        source_ids=source_ids,
        rows=rows,
        length=int(cu_padded[-1]),
        real_tokens=int(cu[-1]),
        cu_seqlens=cu,
        cu_seqlens_padded=cu_padded,
        pad_between_seqs=not torch.equal(params.cu_seqlens_q, params.cu_seqlens_q_padded),
    )


def check_cp(cp_size: int, pad_multiple: int) -> None:
    if cp_size > 1 and pad_multiple % (2 * cp_size):
        raise ValueError(
            f"pad_multiple={pad_multiple} must be a multiple of 2*cp_size={2 * cp_size} so every "
            f"padded source splits evenly across context-parallel ranks"
        )


def prepacked_microbatches(
    batch: Mapping[str, Any],
    *,
    boundary: str = "padded",
    cp_size: int = 1,
    cp_rank: int = 0,
    cp_group: Any = None,
    image_token_id: int | None = None,
    pad_multiple: int = 1,
    validate: bool = True,
) -> list[Microbatch]:
    """One microbatch per pack of a prepacked batch (its shapes are already decided).

    Args:
        batch: A loader batch with ``cu_seqlens`` / ``cu_seqlens_padded``.
        boundary: ``"padded"`` or ``"real"`` (see the module docstring).
        cp_size, cp_rank, cp_group: Context parallelism; ``pad_multiple`` must then be a
            multiple of ``2*cp_size`` (checked).
        image_token_id: Adds ``vision_token_index`` to ``model_inputs`` (which vision feature
            row fills each image-pad token; survives the CP slice).
        pad_multiple: What every source was padded to (validated).
        validate: Check the batch against the contract first.

    An accounting-only batch (zero rows) gives no microbatch.
    """
    check_cp(cp_size, pad_multiple)
    if is_empty(batch):
        return []
    if not is_prepacked(batch):
        raise not_prepacked("prepacked_microbatches")
    if validate:
        validate_prepacked(batch, pad_multiple=pad_multiple, cp_size=cp_size)
    rows = batch[INPUT_IDS].shape[0]
    media, tokens = model_fields(batch)
    return [
        build_microbatch(
            ids=batch[INPUT_IDS][i],
            positions=row_positions(batch[POSITION_IDS], i),
            token_mask=batch[TOKEN_MASK][i],
            cu=torch.as_tensor(batch[CU_SEQLENS][i]),
            cu_padded=torch.as_tensor(batch[CU_SEQLENS_PADDED][i]),
            media={key: batch[key][i] for key in media},
            token_fields={key: batch[key][i] for key in tokens},
            source_ids=list(batch[SOURCE_IDS][i]),
            rows=(i,),
            image_token_id=image_token_id,
            boundary=boundary,
            cp_size=cp_size,
            cp_rank=cp_rank,
            cp_group=cp_group,
        )
        for i in range(rows)
    ]


def micro_batch_shapes(microbatches: list[Microbatch]) -> dict[str, list]:
    """The microbatch shapes of a step's prepacked microbatches, to publish beside the batch
    so nothing downstream re-packs it (one pack per microbatch, C wide): under the design
    note's ``MICRO_BATCH_INDICES`` / ``MICRO_BATCH_LENGTHS`` and under the lower-case names
    NeMo-RL's SFT worker puts in its extra info."""
    if any(len(mb.rows) != 1 for mb in microbatches):
        raise ValueError("micro_batch_shapes describes prepacked microbatches (one row each)")
    indices = [[[mb.rows[0], mb.rows[0] + 1] for mb in microbatches]]
    lengths = [[mb.length for mb in microbatches]]
    return {
        MICRO_BATCH_INDICES: indices,
        MICRO_BATCH_LENGTHS: lengths,
        MICRO_BATCH_INDICES.lower(): indices,
        MICRO_BATCH_LENGTHS.lower(): lengths,
    }


def _per_row(batch: Mapping[str, Any], key: str, row: int) -> Any:
    value = batch.get(key)
    return None if value is None else value[row]


def check_model_inputs(inputs: Mapping[str, Any]) -> None:
    """Guards ``model(**inputs)``: no bookkeeping key may leak into the forward kwargs."""
    leaked = sorted(BOOKKEEPING_KEYS & set(inputs))
    if leaked:
        raise PackContractError(f"{leaked[0]}: bookkeeping keys {leaked} reached the model inputs")
