"""The one buffer loop: read into a buffer, select packs, carry, emit (optionally balanced).

Both the pure :func:`~energon_packing.packing.algorithms.pack_stream` and the Energon carry
stage (:mod:`energon_packing.loader.energon`) run :meth:`PackingLoop.run`; they differ only
in where the samples sit (a list here, Energon's savable buffers there) and in what ``select``
reads from a sample::

    source --fill--> reading buffer [s1 s2 ... sN] --select--> pending groups --emit--> pack
                          ^                              |
                          +------ carried (count + 1) ---+

Without balancing the pending groups count against ``buffer_size`` and the next select
waits until every group of the previous one has left (Energon's rule). With
``balance_window=W`` the pending groups form a pool of W beside the buffer and each step emits
the one nearest to a cost target every rank shares (:mod:`~energon_packing.packing.balance`).

Pure: no Energon, no torch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from energon_packing.packing.balance import RecentCosts, pick, target_quantile
from energon_packing.packing.carry import Selection

__all__ = ["Buffer", "ListBuffer", "LoopState", "PackingLoop"]

T = TypeVar("T")

#: ``(buffered samples, their carry counts, end of data) -> Selection``
Selector = Callable[[list, list, bool], Selection]


class Buffer(Protocol[T]):
    """Where samples wait: a list here, an Energon savable buffer in the loader. ``keys`` are
    whatever the store keeps beside a sample (Energon's restore keys), passed back unchanged."""

    def __len__(self) -> int: ...

    def append(self, sample: T) -> None: ...

    def take_all(self) -> tuple[list[T], list[Any]]: ...

    def put(self, samples: list[T], keys: list[Any]) -> None: ...

    def take(self, start: int, count: int) -> list[T]: ...


class ListBuffer(Generic[T]):
    """A :class:`Buffer` over a plain list (keys are not kept)."""

    def __init__(self) -> None:
        self.samples: list[T] = []

    def __len__(self) -> int:
        return len(self.samples)

    def append(self, sample: T) -> None:
        self.samples.append(sample)

    def take_all(self) -> tuple[list[T], list[Any]]:
        samples, self.samples = self.samples, []
        return samples, [None] * len(samples)

    def put(self, samples: list[T], keys: list[Any]) -> None:
        self.samples.extend(samples)

    def take(self, start: int, count: int) -> list[T]:
        taken = self.samples[start : start + count]
        del self.samples[start : start + count]
        return taken


@dataclass(kw_only=True, slots=True)
class LoopState:
    """Everything the loop remembers besides the buffered samples; plain lists and ints, so a
    checkpoint can hold it as they are."""

    #: how often each sample of the reading buffer was carried already (aligned with it)
    carry_counts: list[int] = field(default_factory=list)
    #: samples read since the last select
    fresh: int = 0
    #: size of each pending group, in emission order (the groups sit flat in the pending buffer)
    pending: list[int] = field(default_factory=list)
    #: attention cost of each pending group (balancing only)
    pool_costs: list[int] = field(default_factory=list)
    #: recent pack costs of this rank (balancing only)
    history: list[int] = field(default_factory=list)
    #: packs emitted (balancing only)
    step: int = 0


class PackingLoop:
    """The buffer loop, over any :class:`Buffer` pair and any ``select``.

    Args:
        buffer_size: The reading buffer (plus, without balancing, the pending groups) never
            holds more than this many samples.
        select: Groups a full buffer and names the samples to carry.
        pack_cost: Attention cost of a group, for balanced emission.
        balance_window: Pool of pending groups to choose from (0: emit in selection order).
        balance_seed: Seed of the shared target sequence (the same on every rank).
    """

    def __init__(
        self,
        *,
        buffer_size: int,
        select: Selector,
        pack_cost: Callable[[list], int],
        balance_window: int = 0,
        balance_seed: int = 0,
    ):
        self.buffer_size = buffer_size
        self.select = select
        self.pack_cost = pack_cost
        self.balance_window = balance_window
        self.balance_seed = balance_seed

    def run(
        self, source: Iterator[T], reading: Buffer[T], pending: Buffer[T], state: LoopState
    ) -> Iterator[list[T]]:
        """Yields groups of samples, each removed from ``pending`` as it is yielded."""
        window = self.balance_window
        recent = RecentCosts(state.history)
        exhausted = False
        while True:
            exhausted = exhausted or not self._fill(source, reading, pending, state)
            groups = len(state.pending)
            wants = groups < window if window else groups == 0
            full = len(reading) + (0 if window else len(pending)) >= self.buffer_size
            if wants and len(reading) and (exhausted or (full and state.fresh)):
                self._select(reading, pending, state, recent, final=exhausted)
                groups = len(state.pending)
            if groups and (groups >= window or exhausted):
                yield self._take(pending, state, self._choose(state, recent) if window else 0)
            elif exhausted and not len(reading):
                return
            # else: the balance pool is still filling; the next _fill reads more samples

    def _fill(
        self, source: Iterator[T], reading: Buffer, pending: Buffer, state: LoopState
    ) -> bool:
        """Tops the reading buffer up; False at the end of the data."""
        held = 0 if self.balance_window else len(pending)
        while len(reading) + held < self.buffer_size:
            try:
                sample = next(source)
            except StopIteration:
                return False
            reading.append(sample)
            state.carry_counts.append(0)
            state.fresh += 1
        return True

    def _select(
        self, reading: Buffer, pending: Buffer, state: LoopState, recent: RecentCosts, *, final
    ) -> None:
        samples, keys = reading.take_all()
        counts = state.carry_counts
        state.carry_counts, state.fresh = [], 0
        selection = self.select(samples, counts, final)
        for group in selection.packs:
            pending.put([samples[i] for i in group], [keys[i] for i in group])
            state.pending.append(len(group))
            if self.balance_window:
                cost = self.pack_cost([samples[i] for i in group])
                state.pool_costs.append(cost)
                recent.add(cost)
                state.history = recent.costs
        for i in selection.carried:
            reading.put([samples[i]], [keys[i]])
            state.carry_counts.append(counts[i] + 1)

    def _choose(self, state: LoopState, recent: RecentCosts) -> int:
        """The pooled group nearest to this step's shared target cost."""
        target = recent.quantile(target_quantile(state.step, self.balance_seed))
        state.step += 1
        return pick(state.pool_costs, target)

    def _take(self, pending: Buffer[T], state: LoopState, index: int) -> list[T]:
        start = sum(state.pending[:index])
        count = state.pending.pop(index)
        if state.pool_costs:
            del state.pool_costs[index]
        return pending.take(start, count)
