"""Data-parallel ranks in step: filler packs for a rank that is out of data, and a check that
every rank brings the same microbatch shapes to a step (an error, not a hung collective)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from energon_packing.schema import (
    PACKING_METRICS,
    PACKING_SKIPPED,
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


def filler_batch(capacity: int, *, pad_id: int = 0, mrope: bool = False) -> dict:
    """A prepacked batch of one all-padding pack (nothing trained): what a data-parallel rank
    that ran out of data runs while the others finish, so collectives stay in step."""
    filler = Source(
        key=FILLER_KEY,
        input_ids=[pad_id],
        token_mask=[0.0],
        positions=np.zeros((3, 1), dtype=np.int64) if mrope else None,
    )
    return collate([layout([filler], width=capacity, pad_multiple=1, pad_id=pad_id)])


def align_ranks(
    batches: Any, *, capacity: int, pad_id: int = 0, mrope: bool = False, group: Any = None
) -> Iterator[dict]:
    """Yields a rank's batches until *every* data-parallel rank is out of data; a rank that is
    out early yields :func:`filler_batch` meanwhile. Ranks pack their own data, so their pack
    counts differ by a few per epoch; without this the longer rank waits forever in its next
    collective. One ``all_reduce`` of two ints per step.

    Accounting-only batches (zero rows) are not steps: their ``packing_skipped`` and
    ``packing_metrics`` ride on the next batch this rank yields (one last step of fillers on
    every rank if accounting is left when all ranks are out of data), so nothing is lost.
    """
    import torch.distributed as dist

    source = iter(batches)
    skipped: list = []
    metrics: list = []
    while True:
        batch = next(source, None)
        while batch is not None and is_empty(batch):
            skipped.extend(batch.get(PACKING_SKIPPED, ()))
            metrics.extend(metrics_list(batch.get(PACKING_METRICS)))
            batch = next(source, None)
        state = torch.tensor([0 if batch is None else 1, 1 if skipped or metrics else 0])
        dist.all_reduce(state, op=dist.ReduceOp.MAX, group=group)
        if not state.any():
            return
        out = batch if batch is not None else filler_batch(capacity, pad_id=pad_id, mrope=mrope)
        if skipped or metrics:
            out = {
                **out,
                PACKING_SKIPPED: [*skipped, *out.get(PACKING_SKIPPED, ())],
                PACKING_METRICS: [*metrics, *metrics_list(out.get(PACKING_METRICS))],
            }
            skipped, metrics = [], []
        yield out


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
