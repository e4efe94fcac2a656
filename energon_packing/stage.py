"""The packing stage ``PackingTaskEncoder`` installs when carry or balanced emission is on.

Energon 7.4.1's ``PackingDataset`` clears its reading buffer before every select, so samples
of under-full packs cannot wait for better partners (and whatever select does not return is
silently lost). This stage is a ``PackingDataset`` whose loop keeps the *carried* samples in
the reading buffer, next to a savable ``_carry_counts`` list, so Energon's own checkpointing
saves and restores them like any buffered sample::

    reading buffer [s1 s2 s3 ... sN]  --select--> groups -> pending packs -> pack_selected_samples
          ^                                  |
          +------ carried (count + 1) -------+      (count <= max_carries, then emitted)

With ``balance_window=W`` selected packs wait in a pool of W beside the buffer and leave
nearest-cost-first to a target quantile every rank shares (:mod:`energon_packing.balance`).
Restore keys have ``PackingDataset``'s layout, so ``loader.restore_sample`` works unchanged.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

from megatron.energon.flavors.base_dataset import SavableDataset, set_sample_restore_key
from megatron.energon.worker import WorkerConfig
from megatron.energon.wrappers import PackingDataset
from megatron.energon.wrappers.base import get_sample_restore_key

from energon_packing.balance import RecentCosts, pick, target_quantile
from energon_packing.carry import Selection

logger = logging.getLogger("energon_packing")

#: ``(buffered samples, their carry counts, end of data) -> Selection``
Selector = Callable[[list, list, bool], Selection]


def native_pushback() -> type | None:
    """Energon's ``PackedSamplesOutput`` (select returns packs *and* pushback samples), where an
    Energon release has it; ``None`` on 7.4.1. With it, carry needs no stage of ours."""
    import megatron.energon

    return getattr(megatron.energon, "PackedSamplesOutput", None)


class CarryPackingDataset(PackingDataset):
    """``PackingDataset`` with carry and (optionally) rank-balanced emission.

    Args:
        dataset: The encoded samples.
        buffer_size: The reading buffer (plus, without balancing, the pending packs) never
            exceeds this many samples.
        selector: Groups the buffer and names the samples to carry (the task encoder's
            ``select_with_carry``, i.e. ``algorithms.select_packs``).
        final_packer: ``pack_selected_samples``.
        pack_cost: Attention cost of a group, for balanced emission.
        balance_window: Pool of selected packs to choose from (0: emit in selection order).
        balance_seed: Seed of the shared target sequence (the same on every rank).
    """

    _savable_fields = PackingDataset._savable_fields + (
        "_carry_counts",
        "_fresh",
        "_pool_costs",
        "_history",
        "_step",
    )

    def __init__(
        self,
        dataset: SavableDataset,
        buffer_size: int,
        *,
        selector: Selector,
        final_packer: Callable,
        pack_cost: Callable[[list], int],
        balance_window: int = 0,
        balance_seed: int = 0,
        worker_config: WorkerConfig,
        final_packer_failure_tolerance: int = 100,
    ):
        self.selector = selector
        self.pack_cost = pack_cost
        self.balance_window = balance_window
        self.balance_seed = balance_seed
        super().__init__(
            dataset,
            buffer_size,
            pre_packer=selector,
            final_packer=final_packer,
            final_packer_stateless=True,
            final_packer_failure_tolerance=final_packer_failure_tolerance,
            worker_config=worker_config,
        )

    def reset_state_own(self) -> None:
        super().reset_state_own()
        self._carry_counts: list[int] = []  # aligned with the reading buffer
        self._fresh = 0  # samples read since the last select
        self._pool_costs: list[int] = []  # aligned with the pending groups (balancing only)
        self._history: list[int] = []  # recent pack costs (balancing only)
        self._step = 0  # packs emitted (balancing only)

    # ---- the loop ---------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        source = iter(self.dataset)
        self._reading_buffer.worker_start()
        self._pre_packing_buffer.worker_start()
        self._recent = RecentCosts(self._history)
        window = self.balance_window
        exhausted = False
        while True:
            exhausted = exhausted or not self._fill(source)
            pending = len(self._pre_packing_lengths)
            reading = self._reading_buffer.len_worker()
            wants = pending < window if window else pending == 0
            full = (
                reading + (0 if window else self._pre_packing_buffer.len_worker())
                >= self.buffer_size
            )
            if wants and reading and (exhausted or (full and self._fresh)):
                self._select(final=exhausted)
                pending = len(self._pre_packing_lengths)
            if pending and (pending >= window or exhausted):
                yield from self._emit(self._choose() if window else 0)
            elif exhausted and not reading:
                return
            # else: the balance pool is still filling; the next _fill reads more samples

    def _fill(self, source: Iterator[Any]) -> bool:
        """Tops the buffer up to ``buffer_size`` samples; False at the end of the data.

        Without balancing the pending packs count against the buffer, as in Energon; with it
        they form a pool of their own (``balance_window`` packs).
        """
        pending = 0 if self.balance_window else self._pre_packing_buffer.len_worker()
        while self._reading_buffer.len_worker() + pending < self.buffer_size:
            try:
                sample = next(source)
            except StopIteration:
                return False
            self._reading_buffer.append(sample)
            self._carry_counts.append(0)
            self._fresh += 1
        return True

    def _select(self, *, final: bool) -> None:
        samples, keys = self._reading_buffer.flush()
        counts = self._carry_counts
        self._carry_counts, self._fresh = [], 0
        with self._pre_packing_sample_index.ctx():
            try:
                selection = self.selector(samples, counts, final)
            except Exception:  # never lose a buffer: one pack per sample instead
                logger.exception("carry select failed; emitting %d single packs", len(samples))
                selection = Selection(packs=[[i] for i in range(len(samples))])
        for group in selection.packs:
            members = [samples[i] for i in group]
            self._pre_packing_buffer.extend(members, [keys[i] for i in group])
            self._pre_packing_lengths.append(len(group))
            if self.balance_window:
                cost = self.pack_cost(members)
                self._pool_costs.append(cost)
                self._recent.add(cost)
                self._history = self._recent.costs
        for i in selection.carried:
            self._reading_buffer.extend([samples[i]], [keys[i]])
            self._carry_counts.append(counts[i] + 1)

    def _choose(self) -> int:
        """The pooled pack nearest to this step's shared target cost."""
        target = self._recent.quantile(target_quantile(self._step, self.balance_seed))
        self._step += 1
        return pick(self._pool_costs, target)

    def _emit(self, index: int) -> Iterator[Any]:
        """Yields the pack of pending group ``index`` (nothing if the final packer skips it)."""
        lengths = self._pre_packing_lengths
        start = sum(lengths[:index])
        n = lengths.pop(index)
        if self._pool_costs:
            del self._pool_costs[index]
        members = self._pre_packing_buffer.buffer[start : start + n]
        member_keys = tuple(get_sample_restore_key(s) for s in members)
        del self._pre_packing_buffer[start : start + n]
        with self._final_pack_failure_handler.handle_errors(members):
            with self._final_packing_sample_index.ctx() as pack_index:
                packed = self.final_packer(members)
            yield set_sample_restore_key(packed, pack_index, *member_keys, src=self)

    def config(self) -> dict[str, Any]:
        return {
            **super().config(),
            "carry_select": self._function_config(self.selector),
            "balance_window": self.balance_window,
            "balance_seed": self.balance_seed,
        }
