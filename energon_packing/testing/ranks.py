"""Data-parallel ranks simulated in one process: each rank's loader is the pure packing loop
(:func:`~energon_packing.packing.pack_stream`, the loop the Energon stage runs) over its own
part of the data, as Energon splits it (a contiguous slice per rank).

A training loader repeats (``get_train_dataset``'s default): each rank reads its slice again
and again, reshuffled per pass, so every rank emits a pack at every step and pack counts are
equal by construction; ``steps`` cuts the streams there. ``steps=None`` is one finite pass
(validation, ``repeat=False``): ranks end at different counts and ``align_ranks`` runs filler
packs on the ranks that are out.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from energon_packing.packing import pack_stream
from energon_packing.packing.balance import StepCostModel

__all__ = ["RankRun", "simulate_ranks", "split_ranks"]


def split_ranks(lengths: Sequence[int], world_size: int) -> list[list[int]]:
    """Contiguous slices, one per rank, as Energon assigns samples (sizes differ by <= 1)."""
    bounds = [len(lengths) * r // world_size for r in range(world_size + 1)]
    return [list(lengths[bounds[r] : bounds[r + 1]]) for r in range(world_size)]


@dataclass(kw_only=True, slots=True)
class RankRun:
    """What W simulated ranks emitted."""

    capacity: int
    #: ``packs[r][t]``: source lengths of the pack rank r emitted at step t
    packs: list[list[list[int]]]
    #: conversations each rank read (packed, or still buffered where a stream was cut)
    read: list[int]

    @property
    def counts(self) -> list[int]:
        return [len(p) for p in self.packs]

    @property
    def steps(self) -> int:
        """Steps of the run: the longest rank's (the others run fillers meanwhile)."""
        return max(self.counts)

    def step_costs(self, model: StepCostModel | None) -> np.ndarray:
        """``[step, rank]`` modelled FLOPs (``model=None``: attention only, sum of L^2); a
        rank out of packs runs a filler, which computes C tokens and no attention to speak of."""
        cost = (lambda p: sum(n * n for n in p)) if model is None else None
        out = np.zeros((self.steps, len(self.packs)))
        for r, packs in enumerate(self.packs):
            for t in range(self.steps):
                pack = packs[t] if t < len(packs) else [1]
                out[t, r] = cost(pack) if cost else model.pack_flops(pack, capacity=self.capacity)
        return out

    def packed(self) -> int:
        return sum(len(p) for packs in self.packs for p in packs)

    def bound(self) -> int:
        """The lower bound of the packed conversations: ceil(their tokens / C)."""
        return math.ceil(sum(n for packs in self.packs for p in packs for n in p) / self.capacity)


def _stream(lengths: list[int], seed: int, read: list[int], repeat: bool) -> Iterator[int]:
    passes = itertools.count() if repeat else range(1)
    for epoch in passes:
        order = list(range(len(lengths)))
        random.Random(f"{seed}/{epoch}").shuffle(order)
        for i in order:
            read[0] += 1
            yield lengths[i]


def simulate_ranks(
    per_rank: Sequence[Sequence[int]],
    *,
    capacity: int,
    buffer_size: int,
    balance_window: int,
    steps: int | None = None,
    cost_model: StepCostModel | None = None,
    seed: int = 0,
) -> RankRun:
    """Runs every rank's loop (carry on, as the loader with ``carry=True``).

    Args:
        per_rank: Each rank's conversation lengths (:func:`split_ranks`).
        steps: Cut repeating streams after this many packs per rank; None: one finite pass.
        cost_model: What balanced emission targets (default: a 7B).
        seed: Shared by every rank (the loader's ``seed``); each rank shuffles by its rank too.
    """
    packs, reads = [], []
    for rank, lengths in enumerate(per_rank):
        read = [0]
        seen: list[int] = []
        # pack_stream yields indices into the stream; the stream's lengths are kept here
        lengths_of = _Recorder(seen)
        stream = pack_stream(
            lengths_of(_stream(list(lengths), seed * 1_000_003 + rank, read, steps is not None)),
            capacity,
            buffer_size=buffer_size,
            carry=True,
            balance_window=balance_window,
            cost_model=cost_model,
            seed=seed,
        )
        rank_packs = [[seen[i] for i in p] for p in itertools.islice(stream, steps)]
        packs.append(rank_packs)
        reads.append(read[0])
    return RankRun(capacity=capacity, packs=packs, read=reads)


class _Recorder:
    def __init__(self, seen: list[int]):
        self.seen = seen

    def __call__(self, source: Iterator[int]) -> Iterator[int]:
        for n in source:
            self.seen.append(n)
            yield n
