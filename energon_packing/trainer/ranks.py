"""Data-parallel ranks in step: filler packs for a rank that is out of data, and a check that
every rank brings the same microbatch shapes to a step (an error, not a hung collective)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from energon_packing.schema import (
    INPUT_IDS,
    PACKING_METRICS,
    PACKING_SKIPPED,
    POSITION_IDS,
    PackContractError,
    Source,
    collate,
    is_empty,
    layout,
)
from energon_packing.stats import metrics_list
from energon_packing.trainer.shim import MICRO_BATCH_LENGTHS, Microbatch

__all__ = ["FILLER_KEY", "align_ranks", "check_microbatches", "filler_batch"]

FILLER_KEY = "__filler__"


def collective_device(group: Any) -> torch.device:
    """Where a collective over ``group`` takes its tensors: NCCL only handles CUDA ones."""
    import torch.distributed as dist

    backend = str(dist.get_backend(group)).lower()
    if "nccl" in backend and "cpu:" not in backend and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def filler_batch(capacity: int, *, pad_id: int = 0, mrope: bool = False, rows: int = 1) -> dict:
    """A prepacked batch of ``rows`` all-padding packs (nothing trained): what a data-parallel
    rank that ran out of data runs while the others finish, so collectives stay in step."""
    filler = Source(
        key=FILLER_KEY,
        input_ids=[pad_id],
        token_mask=[0.0],
        positions=np.zeros((3, 1), dtype=np.int64) if mrope else None,
    )
    return collate([layout([filler], width=capacity, pad_multiple=1, pad_id=pad_id)] * rows)


def align_ranks(
    batches: Any,
    *,
    capacity: int | None = None,
    pad_id: int = 0,
    mrope: bool | None = None,
    group: Any = None,
) -> Iterator[dict]:
    """Yields a rank's batches until *every* data-parallel rank is out of data; a rank that is
    out early yields :func:`filler_batch` meanwhile, so every rank runs the same number of
    steps. Ranks pack their own data: over a finite pass (validation, ``repeat=False``) their
    pack counts differ (63-87 packs of 500 long-tail conversations per rank at 128 ranks);
    without this the longer ranks wait forever in their next collective. A repeating train
    loader never runs out, so it never needs a filler. One ``all_reduce`` of six ints per
    step (on the GPU under NCCL). Ranks whose batches hold different numbers of packs at a
    step (the short last batch of a loader with ``batch_size`` > 1) raise
    :class:`PackContractError` together.

    The filler's width and position layout are the packs' own, learnt from any rank's batches
    (``capacity`` and ``mrope`` only for a pass in which no rank has a single batch).

    Accounting-only batches (zero rows) are not steps: their ``packing_skipped`` and
    ``packing_metrics`` ride on the next batch this rank yields (one last step of fillers on
    every rank if accounting is left when all ranks are out of data), so nothing is lost.
    """
    import torch.distributed as dist

    device = collective_device(group)
    source = iter(batches)
    skipped: list = []
    metrics: list = []
    width, positions3 = capacity or 0, int(bool(mrope))
    while True:
        batch = next(source, None)
        while batch is not None and is_empty(batch):
            skipped.extend(batch.get(PACKING_SKIPPED, ()))
            metrics.extend(metrics_list(batch.get(PACKING_METRICS)))
            batch = next(source, None)
        rows = 0
        if batch is not None:
            rows = int(batch[INPUT_IDS].shape[0])
            width = int(batch[INPUT_IDS].shape[-1])
            positions3 = int(np.ndim(batch[POSITION_IDS]) == 3)
        has_accounting = 1 if skipped or metrics else 0
        # MAX of -rows over the ranks that have a batch is minus their fewest rows
        state = torch.tensor(
            [
                int(batch is not None),
                has_accounting,
                width,
                positions3,
                rows,
                -rows if rows else -(2**40),
            ],
            device=device,
        )
        dist.all_reduce(state, op=dist.ReduceOp.MAX, group=group)
        if not state[:2].any():
            return
        width, positions3, most = int(state[2]), int(state[3]), int(state[4])
        if state[0] and most != -int(state[5]):
            raise PackContractError(
                f"align_ranks: data-parallel ranks bring batches of {-int(state[5])} to {most} "
                f"packs at this step (rank {dist.get_rank(group)}: {rows}); a pass's last "
                f"batch is short. Build the loader with batch_size=1 (one pack per microbatch)"
            )
        if batch is None:
            if not width:
                raise PackContractError(
                    "align_ranks: no rank had a batch to learn the filler's width from; pass "
                    "capacity=max_input_seq_length (and mrope=True for mRoPE models)"
                )
            batch = filler_batch(width, pad_id=pad_id, mrope=bool(positions3), rows=max(most, 1))
        if skipped or metrics:
            batch = {
                **batch,
                PACKING_SKIPPED: [*skipped, *batch.get(PACKING_SKIPPED, ())],
                PACKING_METRICS: [*metrics, *metrics_list(batch.get(PACKING_METRICS))],
            }
            skipped, metrics = [], []
        yield batch


def check_microbatches(batch_microbatches: Sequence[Microbatch], *, group: Any = None) -> None:
    """Raises :class:`PackContractError` on every rank if data-parallel ranks disagree on the
    number or the widths of this step's microbatches: a clear error, not a hung collective."""
    import torch.distributed as dist

    widths = [int(mb.model_inputs["input_ids"].shape[-1]) for mb in batch_microbatches]
    mine = torch.tensor(
        [len(widths), sum(widths), max(widths, default=0)],
        dtype=torch.int64,
        device=collective_device(group),
    )
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
