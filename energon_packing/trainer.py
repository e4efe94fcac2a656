"""The trainer-side shim: prepacked batches in, microbatches with varlen attention params out.

The one branch where loader packs and trainer packs meet (NeMo-RL's microbatch iterator)::

    batch ─ cu_seqlens present? ─ yes ─> validate; one pack per microbatch (shapes decided)
                               └─ no ──> token_budget? ─ yes ─> bin rows, squeeze end to end
                                                      └─ no ──> padded rows, no packing
    each microbatch: model_inputs (input_ids, position_ids, packed_seq_params(qkv_format="thd"),
                     pixel_values, image_grid_thw, vision_token_index), labels, loss_mask

Boundary modes for the attention parameters:

* ``"padded"`` (default, the design note's): the padded boundaries as ``cu_seqlens_q/kv`` and
  as ``*_padded`` (the same array twice), ``pad_between_seqs=False``;
* ``"real"``: real boundaries as ``cu_seqlens_q/kv``, padded ones as ``*_padded``,
  ``pad_between_seqs = any(real != padded)`` (needs a kernel that supports it).

Context parallelism: every padded source is cut into ``2*cp_size`` chunks; rank r keeps chunks
r and ``2*cp_size-1-r``. Bookkeeping keys (``source_ids``, boundaries, masks, restore keys)
never reach ``model_inputs``. No Energon import; Megatron-Core's ``PackedSeqParams`` is used when
importable, else a local dataclass with the same fields.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch

from energon_packing.algorithms import DEFAULT_ALGORITHM, pack
from energon_packing.contract import PackContractError, check_pack, round_up

BOUNDARY_MODES = ("padded", "real")
BOUNDARY_KEYS = ("cu_seqlens", "cu_seqlens_padded")
MICRO_BATCH_INDICES = "MICRO_BATCH_INDICES"
MICRO_BATCH_LENGTHS = "MICRO_BATCH_LENGTHS"
#: Keys that describe the batch, not the model's input: never forwarded to the model.
BOOKKEEPING_KEYS = frozenset(
    {
        "cu_seqlens",
        "cu_seqlens_padded",
        "source_ids",
        "input_lengths",
        "token_mask",
        "sample_mask",
        "padding_mask",
        "image_source_index",
        "__restore_key__",
        "__key__",
        "packing_metrics",
        "packing_skipped",
        MICRO_BATCH_INDICES,
        MICRO_BATCH_LENGTHS,
    }
)


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
) -> Any:
    """``PackedSeqParams(qkv_format="thd")`` for one packed row, in either boundary mode.

    ``pad_between_seqs`` is set where the class has the field (newer Megatron-Core, the local
    fallback); :attr:`Microbatch.pad_between_seqs` carries it either way.
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
        local_cp_size=cp_size,
        cp_group=cp_group,
        pad_between_seqs=bool(boundary == "real" and not torch.equal(cu, padded)),
    )
    return cls(**{k: v for k, v in values.items() if k in fields})


def pad_between_seqs(params: Any) -> bool:
    """Whether real and padded boundaries differ (on any ``PackedSeqParams`` flavour)."""
    return not torch.equal(params.cu_seqlens_q, params.cu_seqlens_q_padded)


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
    """True if the batch carries pack boundaries (then both boundary keys are required)."""
    present = [key for key in BOUNDARY_KEYS if key in batch]
    if len(present) == 1:
        missing = next(key for key in BOUNDARY_KEYS if key not in batch)
        raise PackContractError(
            f"{missing}: a prepacked batch has {present[0]!r} but no {missing!r}; loader packs "
            f"carry both (source_ids={batch.get('source_ids')})"
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
        raise PackContractError("cu_seqlens: not a prepacked batch (no boundary keys)")
    for key in ("input_ids", "token_mask", "source_ids"):
        if key not in batch:
            raise PackContractError(f"{key}: missing from a prepacked batch")
    ids = batch["input_ids"]
    rows, width = ids.shape
    for key in ("cu_seqlens", "cu_seqlens_padded", "source_ids"):
        if len(batch[key]) != rows:
            raise PackContractError(
                f"{key}: {len(batch[key])} entries for {rows} packs "
                f"(source_ids={batch['source_ids']})"
            )
    if tuple(batch["token_mask"].shape) != (rows, width):
        raise PackContractError(
            f"token_mask: shape {tuple(batch['token_mask'].shape)} != "
            f"input_ids {(rows, width)} (source_ids={batch['source_ids']})"
        )
    if "input_lengths" in batch and (torch.as_tensor(batch["input_lengths"]) != width).any():
        raise PackContractError(
            f"input_lengths: {torch.as_tensor(batch['input_lengths']).tolist()}, "
            f"a prepacked row always counts as {width} "
            f"(source_ids={batch['source_ids']})"
        )
    for row in range(rows):
        check_pack(
            input_ids=ids[row].numpy(),
            token_mask=batch["token_mask"][row].numpy(),
            cu_seqlens=torch.as_tensor(batch["cu_seqlens"][row]).numpy(),
            cu_seqlens_padded=torch.as_tensor(batch["cu_seqlens_padded"][row]).numpy(),
            source_ids=batch["source_ids"][row],
            padding_mask=batch["padding_mask"][row].numpy() if "padding_mask" in batch else None,
            image_grid_thw=_row_array(batch, "image_grid_thw", row),
            image_source_index=_row_array(batch, "image_source_index", row),
            pad_multiple=pad_multiple,
            image_pad_id=image_pad_id,
            cp_size=cp_size,
        )


def _row_array(batch: Mapping[str, Any], key: str, row: int) -> Any:
    value = batch.get(key)
    return None if value is None else torch.as_tensor(value[row]).numpy()


def _row_positions(positions: torch.Tensor, row: int) -> torch.Tensor:
    """Row ``row`` of ``[B, S]`` or ``[3, B, S]`` position ids, as ``[S]`` or ``[3, S]``."""
    return positions[:, row] if positions.ndim == 3 else positions[row]


def _vision_index(ids: torch.Tensor, image_token_id: int | None) -> torch.Tensor | None:
    """For each token: which row of the vision features fills it (-1: not an image token)."""
    if image_token_id is None:
        return None
    is_image = ids == image_token_id
    return torch.where(is_image, torch.cumsum(is_image, dim=-1) - 1, -1)


def _finish(
    *,
    ids: torch.Tensor,
    positions: torch.Tensor,
    token_mask: torch.Tensor,
    cu: torch.Tensor | None,
    cu_padded: torch.Tensor | None,
    pixel_values: Any,
    grids: Any,
    source_ids: list,
    rows: tuple,
    image_token_id: int | None,
    boundary: str,
    cp_size: int,
    cp_rank: int,
    cp_group: Any,
) -> Microbatch:
    """Labels, CP slice and attention params for one flat row (``ids [T]``)."""
    labels = torch.roll(ids, -1)
    loss_mask = torch.roll(token_mask, -1)  # weight of predicting token t+1 from position t
    vision = _vision_index(ids, image_token_id)
    params = None
    if cu is not None:
        params = make_packed_seq_params(
            cu, cu_padded, boundary=boundary, cp_size=cp_size, cp_group=cp_group
        )
        keep = cp_indices(cu_padded, cp_size, cp_rank)
        ids, labels, loss_mask = ids[keep], labels[keep], loss_mask[keep]
        positions = positions[..., keep]
        vision = vision[keep] if vision is not None else None
    inputs = {"input_ids": ids.unsqueeze(0), "packed_seq_params": params}
    inputs["position_ids"] = positions.unsqueeze(-2)  # [1, T] or [3, 1, T]
    if pixel_values is not None and len(pixel_values):
        inputs["pixel_values"] = pixel_values
        inputs["image_grid_thw"] = grids
        if vision is not None:
            inputs["vision_token_index"] = vision.unsqueeze(0)
    return Microbatch(
        model_inputs=inputs,
        labels=labels.unsqueeze(0),
        loss_mask=loss_mask.unsqueeze(0),
        source_ids=source_ids,
        rows=rows,
        length=int(cu_padded[-1]) if cu_padded is not None else len(labels),
        real_tokens=int(cu[-1]) if cu is not None else len(labels),
        cu_seqlens=cu,
        cu_seqlens_padded=cu_padded,
        pad_between_seqs=params is not None and pad_between_seqs(params),
    )


def microbatches(
    batch: dict,
    *,
    boundary: str = "padded",
    cp_size: int = 1,
    cp_rank: int = 0,
    cp_group: Any = None,
    image_token_id: int | None = None,
    token_budget: int | None = None,
    algorithm: str = DEFAULT_ALGORITHM,
    dp_size: int = 1,
    pad_multiple: int = 1,
    pack_multiple: int = 1,
    pad_id: int = 0,
    validate: bool = True,
) -> list[Microbatch]:
    """Splits a batch into microbatches, whichever path it came from.

    Args:
        batch: A loader batch: prepacked (``cu_seqlens`` present) or ordinary padded rows
            (``input_ids [B, S]`` + ``input_lengths``).
        boundary: ``"padded"`` or ``"real"`` (see the module docstring).
        cp_size, cp_rank, cp_group: Context parallelism; ``pad_multiple`` must then be a
            multiple of ``2*cp_size`` (checked).
        image_token_id: Adds ``vision_token_index`` to ``model_inputs`` (which vision feature
            row fills each image-pad token; survives the CP slice).
        token_budget: Ordinary batches only: pack rows into bins of this many tokens (the
            trainer-side path). ``None``: no packing, one microbatch of padded rows.
        algorithm: Bin packing for the trainer-side path.
        dp_size: Trainer-side path: the bin count is made a multiple of this.
        pad_multiple: Each row padded to a multiple of this before squeezing (and validated
            for prepacked batches).
        pack_multiple: Trainer-side path: the packed width is rounded up to this.
        pad_id: Trainer-side path: the token between and after the squeezed rows (never
            attended by a real token, never trained).
        validate: Check prepacked batches against the contract first.

    For prepacked batches ``MICRO_BATCH_INDICES`` / ``MICRO_BATCH_LENGTHS`` are published into
    ``batch``: one pack per microbatch, nothing re-packed.
    """
    if cp_size > 1 and pad_multiple % (2 * cp_size):
        raise ValueError(
            f"pad_multiple={pad_multiple} must be a multiple of 2*cp_size={2 * cp_size} so every "
            f"padded source splits evenly across context-parallel ranks"
        )
    common = dict(
        image_token_id=image_token_id,
        boundary=boundary,
        cp_size=cp_size,
        cp_rank=cp_rank,
        cp_group=cp_group,
    )
    if is_prepacked(batch):
        if validate:
            validate_prepacked(batch, pad_multiple=pad_multiple, cp_size=cp_size)
        rows, width = batch["input_ids"].shape
        batch[MICRO_BATCH_INDICES] = [[[i, i + 1] for i in range(rows)]]
        batch[MICRO_BATCH_LENGTHS] = [[width] * rows]
        return [
            _finish(
                ids=batch["input_ids"][i],
                positions=_row_positions(batch["position_ids"], i),
                token_mask=batch["token_mask"][i],
                cu=torch.as_tensor(batch["cu_seqlens"][i]),
                cu_padded=torch.as_tensor(batch["cu_seqlens_padded"][i]),
                pixel_values=_per_row(batch, "pixel_values", i),
                grids=_per_row(batch, "image_grid_thw", i),
                source_ids=list(batch["source_ids"][i]),
                rows=(i,),
                **common,
            )
            for i in range(rows)
        ]
    if token_budget is None:
        if cp_size > 1:
            raise ValueError("context parallelism needs packed rows: pass token_budget")
        return [_padded_rows(batch, image_token_id)]
    bins = _bin_rows(batch, token_budget, algorithm, dp_size, pad_multiple)
    return [_squeeze(batch, rows, pad_multiple, pack_multiple, pad_id, common) for rows in bins]


def _per_row(batch: Mapping[str, Any], key: str, row: int) -> Any:
    value = batch.get(key)
    return None if value is None else value[row]


def _padded_lengths(batch: Mapping[str, Any], pad_multiple: int) -> list[int]:
    lengths = torch.as_tensor(batch["input_lengths"]).tolist()
    return [round_up(n, pad_multiple) for n in lengths]


def _bin_rows(
    batch, token_budget: int, algorithm: str, dp_size: int, pad_multiple: int
) -> list[list[int]]:
    """NeMo-RL's get_packer: rows binned by a token budget; bin count a multiple of dp_size."""
    padded = _padded_lengths(batch, pad_multiple)
    too_long = [(i, n) for i, n in enumerate(padded) if n > token_budget]
    if too_long:
        i, n = too_long[0]
        raise ValueError(
            f"row {i} ({batch['source_ids'][i] if 'source_ids' in batch else i}) needs {n} tokens "
            f"padded, more than token_budget={token_budget}; raise token_budget"
        )
    bins = [sorted(b) for b in pack(padded, token_budget, algorithm=algorithm)]
    while len(bins) % dp_size:  # split the fullest-by-count bin, as NeMo-RL's _adjust_bin_count
        donor = max(range(len(bins)), key=lambda b: (len(bins[b]), -b))
        if len(bins[donor]) < 2:
            raise ValueError(
                f"{len(padded)} rows cannot fill a multiple of dp_size={dp_size} bins; "
                f"lower dp_size or pass more rows per batch"
            )
        bins.append([bins[donor].pop()])
    return bins


def _squeeze(
    batch, rows: list[int], pad_multiple: int, pack_multiple: int, pad_id: int, common: dict
) -> Microbatch:
    """Rows of a padded batch end to end, each padded to ``pad_multiple``; the last padded
    boundary rounded up to ``pack_multiple`` (NeMo-RL's ``_pack_sequences_for_megatron``)."""
    lengths = torch.as_tensor(batch["input_lengths"]).tolist()
    padded = _padded_lengths(batch, pad_multiple)
    cu, cu_padded = [0], [0]
    for r in rows:
        cu.append(cu[-1] + lengths[r])
        cu_padded.append(cu_padded[-1] + padded[r])
    cu_padded[-1] = round_up(cu_padded[-1], pack_multiple)
    width = cu_padded[-1]
    ids = torch.full((width,), pad_id, dtype=batch["input_ids"].dtype)
    mask = torch.zeros(width, dtype=batch["token_mask"].dtype)
    row_pos = _row_positions(batch["position_ids"], rows[0])
    positions = torch.zeros((*row_pos.shape[:-1], width), dtype=row_pos.dtype)
    for k, r in enumerate(rows):
        start, n = cu_padded[k], lengths[r]
        extent = cu_padded[k + 1] - start
        ids[start : start + n] = batch["input_ids"][r, :n]
        mask[start : start + n] = batch["token_mask"][r, :n]
        real = _row_positions(batch["position_ids"], r)[..., :n]
        positions[..., start : start + n] = real
        positions[..., start + n : start + extent] = real.max() + 1 + torch.arange(extent - n)
    pixels = [batch["pixel_values"][r] for r in rows] if batch.get("pixel_values") else None
    grids = [batch["image_grid_thw"][r] for r in rows] if batch.get("image_grid_thw") else None
    return _finish(
        ids=ids,
        positions=positions,
        token_mask=mask,
        cu=torch.tensor(cu, dtype=torch.int32),
        cu_padded=torch.tensor(cu_padded, dtype=torch.int32),
        pixel_values=torch.cat(pixels) if pixels else None,
        grids=torch.cat(grids) if grids else None,
        source_ids=[k for r in rows for k in batch["source_ids"][r]]
        if "source_ids" in batch
        else [],
        rows=tuple(rows),
        **common,
    )


def _padded_rows(batch, image_token_id: int | None) -> Microbatch:
    """No packing: the padded ``[B, S]`` rows as they are, plain causal attention per row."""
    ids = batch["input_ids"]
    vision = _vision_index(ids.flatten(), image_token_id)
    inputs = {"input_ids": ids, "position_ids": batch["position_ids"], "packed_seq_params": None}
    if batch.get("pixel_values"):
        inputs["pixel_values"] = torch.cat(list(batch["pixel_values"]))
        inputs["image_grid_thw"] = torch.cat(list(batch["image_grid_thw"]))
        if vision is not None:
            inputs["vision_token_index"] = vision.view_as(ids)
    return Microbatch(
        model_inputs=inputs,
        labels=torch.roll(ids, -1, dims=-1),
        loss_mask=torch.roll(batch["token_mask"], -1, dims=-1),
        source_ids=[k for keys in batch.get("source_ids", []) for k in keys],
        rows=tuple(range(ids.shape[0])),
        length=ids.shape[1],
        real_tokens=int(torch.as_tensor(batch["input_lengths"]).sum()),
    )


FILLER_KEY = "__filler__"


def filler_batch(capacity: int, *, pad_id: int = 0, mrope: bool = False) -> dict:
    """A prepacked batch of one all-padding pack (nothing trained): what a data-parallel rank
    that ran out of data runs while the others finish, so collectives stay in step."""
    padding = torch.ones(1, capacity, dtype=torch.bool)
    padding[0, 0] = False
    positions = torch.arange(capacity).unsqueeze(0)
    return {
        "input_ids": torch.full((1, capacity), pad_id, dtype=torch.int64),
        "input_lengths": torch.tensor([capacity], dtype=torch.int32),
        "token_mask": torch.zeros(1, capacity, dtype=torch.float32),
        "sample_mask": torch.zeros(1, dtype=torch.float32),
        "cu_seqlens": [torch.tensor([0, 1], dtype=torch.int32)],
        "cu_seqlens_padded": [torch.tensor([0, capacity], dtype=torch.int32)],
        "position_ids": positions.expand(3, 1, capacity).clone() if mrope else positions,
        "padding_mask": padding,
        "source_ids": [[FILLER_KEY]],
    }


def align_ranks(
    batches: Any, *, capacity: int, pad_id: int = 0, mrope: bool = False, group: Any = None
):
    """Yields a rank's batches until *every* data-parallel rank is out of data; a rank that is
    out early yields :func:`filler_batch` meanwhile. Ranks pack their own data, so their pack
    counts differ by a few per epoch; without this the longer rank waits forever in its next
    collective. One ``all_reduce`` of one int per step."""
    import torch.distributed as dist

    source = iter(batches)
    while True:
        batch = next(source, None)
        more = torch.tensor([0 if batch is None else 1])
        dist.all_reduce(more, op=dist.ReduceOp.MAX, group=group)
        if not more.item():
            return
        yield batch if batch is not None else filler_batch(capacity, pad_id=pad_id, mrope=mrope)


def check_microbatches(batch_microbatches: Sequence[Microbatch], *, group: Any = None) -> None:
    """Raises :class:`PackContractError` on every rank if data-parallel ranks disagree on the
    number or the widths of this step's microbatches: a clear error, not a hung collective."""
    import torch.distributed as dist

    widths = [int(mb.model_inputs["input_ids"].shape[-1]) for mb in batch_microbatches]
    mine = torch.tensor([len(widths), sum(widths), max(widths, default=0)], dtype=torch.int64)
    low, high = mine.clone(), mine.clone()
    dist.all_reduce(low, op=dist.ReduceOp.MIN, group=group)
    dist.all_reduce(high, op=dist.ReduceOp.MAX, group=group)
    if not torch.equal(low, high):
        keys = [key for mb in batch_microbatches for key in mb.source_ids][:4]
        raise PackContractError(
            f"{MICRO_BATCH_LENGTHS}: data-parallel ranks disagree at this step: rank "
            f"{dist.get_rank(group)} has {len(widths)} microbatches, {sum(widths)} tokens (max width "
            f"{max(widths, default=0)}); across ranks (count, tokens, max width) ranges from "
            f"{low.tolist()} to {high.tolist()}. Loader packs are one per microbatch and C wide: "
            f"check that every rank uses the same batch_size and max_input_seq_length "
            f"(source_ids={keys})"
        )


def token_loss(logits: torch.Tensor, microbatch: Microbatch) -> tuple[torch.Tensor, int]:
    """``(sum of weighted token cross-entropies, valid tokens)`` of one microbatch; divide the
    sum by the *global* valid-token count so every path weighs tokens alike."""
    dtype = torch.promote_types(logits.dtype, torch.float32)  # bf16 logits: loss in fp32
    losses = torch.nn.functional.cross_entropy(
        logits.flatten(0, -2).to(dtype), microbatch.labels.flatten(), reduction="none"
    )
    weights = microbatch.loss_mask.flatten().to(losses.dtype)
    return (losses * weights).sum(), microbatch.valid_tokens


def check_model_inputs(inputs: Mapping[str, Any]) -> None:
    """Guards ``model(**inputs)``: no bookkeeping key may leak into the forward kwargs."""
    leaked = sorted(BOOKKEEPING_KEYS & set(inputs))
    if leaked:
        raise PackContractError(f"{leaked[0]}: bookkeeping keys {leaked} reached the model inputs")
