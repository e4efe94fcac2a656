"""Data-parallel ranks simulated in one process: each rank's loader is the pure packing loop
(:func:`~energon_packing.packing.pack_stream`, the loop the Energon stage runs) over its own
part of the data, as Energon splits it (a contiguous slice per rank).

A training loader repeats (``get_train_dataset``'s default): each rank reads its slice again
and again, reshuffled per pass, so every rank emits a pack at every step and pack counts are
equal by construction; ``steps`` cuts the streams there. ``steps=None`` is one finite pass
(validation, ``repeat=False``): ranks end at different counts and ``align_ranks`` runs filler
packs on the ranks that are out.

A conversation is its length, or ``(length, grids)`` with the grids ``(t, h, w)`` of its images
and videos, which the vision encoder of the cost model prices.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from energon_packing.packing import pack_stream
from energon_packing.packing.balance import StepCostModel

__all__ = ["PARTS", "RankRun", "grids_of", "length_of", "simulate_ranks", "split_ranks"]

#: What :meth:`RankRun.step_costs` can price: the whole model, or one component of it.
PARTS = ("total", "decoder", "attention", "vision")


def length_of(conversation: Any) -> int:
    """A conversation's length: itself, or the first of ``(length, grids)``."""
    return conversation if isinstance(conversation, int) else conversation[0]


def grids_of(conversation: Any) -> Sequence:
    """A conversation's image and video grids (none for a bare length)."""
    return () if isinstance(conversation, int) else conversation[1]


def split_ranks(lengths: Sequence[Any], world_size: int) -> list[list[Any]]:
    """Contiguous slices, one per rank, as Energon assigns samples (sizes differ by <= 1)."""
    bounds = [len(lengths) * r // world_size for r in range(world_size + 1)]
    return [list(lengths[bounds[r] : bounds[r + 1]]) for r in range(world_size)]


@dataclass(kw_only=True, slots=True)
class RankRun:
    """What W simulated ranks emitted."""

    capacity: int
    #: ``packs[r][t]``: the conversations (as given) of the pack rank r emitted at step t
    packs: list[list[list[Any]]]
    #: conversations each rank read (packed, or still buffered where a stream was cut)
    read: list[int]

    @property
    def counts(self) -> list[int]:
        return [len(p) for p in self.packs]

    @property
    def steps(self) -> int:
        """Steps of the run: the longest rank's (the others run fillers meanwhile)."""
        return max(self.counts)

    def step_costs(self, model: StepCostModel | None, *, part: str = "total") -> np.ndarray:
        """``[step, rank]`` modelled FLOPs of ``part`` (:data:`PARTS`: the whole model, the
        decoder without the vision encoder, its attention, the vision encoder); ``model=None``:
        attention only, sum of L^2. A rank out of packs runs a filler, which computes C tokens
        and no attention or vision to speak of."""
        if part not in PARTS:
            raise ValueError(f"part must be one of {PARTS}, got {part!r}")
        if model is None:
            out = np.zeros((self.steps, len(self.packs)))
            for r, packs in enumerate(self.packs):
                for t in range(self.steps):
                    pack = packs[t] if t < len(packs) else [1]
                    out[t, r] = sum(length_of(c) ** 2 for c in pack)
            return out
        return self.step_parts(model)[part]

    def step_parts(self, model: StepCostModel) -> dict[str, np.ndarray]:
        """:meth:`step_costs` of every part of :data:`PARTS`, each pack priced once."""
        out = {part: np.zeros((self.steps, len(self.packs))) for part in PARTS}
        for r, packs in enumerate(self.packs):
            for t in range(self.steps):
                pack = packs[t] if t < len(packs) else [1]
                lengths = [length_of(c) for c in pack]
                grids = [g for c in pack for g in grids_of(c)]
                cost = model.pack_cost(lengths, capacity=self.capacity, grids=grids)
                out["total"][t, r] = cost.total
                out["decoder"][t, r] = cost.decoder_linear + cost.attention
                out["attention"][t, r] = cost.attention
                out["vision"][t, r] = cost.vision
        return out

    def packed(self) -> int:
        return sum(len(p) for packs in self.packs for p in packs)

    def bound(self) -> int:
        """The lower bound of the packed conversations: ceil(their tokens / C)."""
        tokens = sum(length_of(c) for packs in self.packs for p in packs for c in p)
        return math.ceil(tokens / self.capacity)


def _stream(lengths: list[Any], seed: int, read: list[int], repeat: bool) -> Iterator[Any]:
    passes = itertools.count() if repeat else range(1)
    for epoch in passes:
        order = list(range(len(lengths)))
        random.Random(f"{seed}/{epoch}").shuffle(order)
        for i in order:
            read[0] += 1
            yield lengths[i]


def simulate_ranks(
    per_rank: Sequence[Sequence[Any]],
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
        per_rank: Each rank's conversations (:func:`split_ranks`): lengths, or
            ``(length, grids)``.
        steps: Cut repeating streams after this many packs per rank; None: one finite pass.
        cost_model: What balanced emission targets (default: a 7B decoder, no vision).
        seed: Shared by every rank (the loader's ``seed``); each rank shuffles by its rank too.
    """
    packs, reads = [], []
    for rank, lengths in enumerate(per_rank):
        read = [0]
        seen: list[Any] = []
        # pack_stream yields indices into the stream; the stream's conversations are kept here
        record = _Recorder(seen)
        items = record(_stream(list(lengths), seed * 1_000_003 + rank, read, steps is not None))
        lengths_in, grids_in = itertools.tee(items)
        stream = pack_stream(
            map(length_of, lengths_in),
            capacity,
            buffer_size=buffer_size,
            carry=True,
            balance_window=balance_window,
            cost_model=cost_model,
            seed=seed,
            grids=map(grids_of, grids_in),
        )
        rank_packs = [[seen[i] for i in p] for p in itertools.islice(stream, steps)]
        packs.append(rank_packs)
        reads.append(read[0])
    return RankRun(capacity=capacity, packs=packs, read=reads)


class _Recorder:
    def __init__(self, seen: list[Any]):
        self.seen = seen

    def __call__(self, source: Iterator[Any]) -> Iterator[Any]:
        for n in source:
            self.seen.append(n)
            yield n
