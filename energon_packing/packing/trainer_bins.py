"""Trainer-side bins, bin for bin as NeMo-RL's ``get_packer`` forms them.

The trainer-side path (:mod:`energon_packing.trainer.trainer_side`) packs the rows of one
batch. For ``concatenative``, ``first_fit_decreasing`` and ``modified_first_fit_decreasing``
it reproduces NeMo-RL's packers exactly, rows inside a bin in packer order (read from
``nemo_rl/data/packing/algorithms.py``):

* first fit decreasing visits rows by ``(length, index)`` descending: among equal lengths the
  *higher* index comes first;
* modified first fit decreasing: one bin per large row (> C/2, largest first); each takes the
  largest medium row (C/3, C/2] that fits; backwards over bins without a medium row, the
  smallest small row (C/6, C/3] plus the largest small row that fits beside it; then every bin
  takes the largest remaining row that fits until none does; what is left goes, largest first,
  into the least-filled leftover bin if it fits there, else into a new one;
* the bin count is raised to a multiple of the data-parallel size by moving the *last* row of
  the bin with the most rows (ties: the higher bin index) into each new bin, taking from one
  bin until it holds a single row.

Any other algorithm of :data:`~energon_packing.packing.algorithms.ALGORITHMS` packs with this
package's kernels, with the same bin-count rule. Pure: no torch, no Energon.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from energon_packing.packing.algorithms import check_lengths, pack
from energon_packing.packing.kernels import first_fit

__all__ = ["NEMO_RL_PACKERS", "adjust_bin_count", "trainer_bins"]

#: The algorithms whose bins equal NeMo-RL's ``get_packer``'s.
NEMO_RL_PACKERS = ("concatenative", "first_fit_decreasing", "modified_first_fit_decreasing")


def trainer_bins(
    lengths: Sequence[int],
    capacity: int,
    *,
    algorithm: str,
    dp_size: int = 1,
    max_per_bin: int | None = None,
) -> list[list[int]]:
    """Bins of row indices for one batch; the count a multiple of ``dp_size`` (at least it)."""
    lengths = check_lengths(lengths, capacity)
    if algorithm == "first_fit_decreasing" or (
        algorithm == "modified_first_fit_decreasing" and max_per_bin is not None
    ):  # NeMo-RL's MFFD hands a capped batch to FFD
        order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i), reverse=True)
        bins = first_fit(order, lengths, capacity, max_per_bin)
    elif algorithm == "modified_first_fit_decreasing":
        bins = _modified_first_fit_decreasing(lengths, capacity)
    else:  # concatenative equals the kernel; the rest are this package's own
        bins = pack(lengths, capacity, algorithm=algorithm, max_per_pack=max_per_bin)
    return adjust_bin_count(bins, dp_size)


def _modified_first_fit_decreasing(lengths: list[int], capacity: int) -> list[list[int]]:
    large, medium, small, tiny = [], [], [], []
    for i, size in enumerate(lengths):
        if size > capacity / 2:
            large.append(i)
        elif size > capacity / 3:
            medium.append(i)
        elif size > capacity / 6:
            small.append(i)
        else:
            tiny.append(i)
    large.sort(key=lambda i: lengths[i], reverse=True)  # stable: equal sizes keep index order
    medium.sort(key=lambda i: lengths[i], reverse=True)
    small.sort(key=lambda i: lengths[i])
    tiny.sort(key=lambda i: lengths[i])

    bins = [[i] for i in large]

    def free(b: list[int]) -> int:
        return capacity - sum(lengths[i] for i in b)

    for b in bins:  # the largest medium row that fits
        room = free(b)
        fit = next((k for k, i in enumerate(medium) if lengths[i] <= room), None)
        if fit is not None:
            b.append(medium.pop(fit))
    for b in reversed(bins):  # two small rows into bins without a medium one
        has_medium = any(capacity / 3 < lengths[i] <= capacity / 2 for i in b)
        room = free(b)
        if has_medium or len(small) < 2 or lengths[small[0]] + lengths[small[1]] > room:
            continue
        first = small.pop(0)
        second = next(
            (
                k
                for k in range(len(small) - 1, -1, -1)
                if lengths[small[k]] <= room - lengths[first]
            ),
            None,
        )
        if second is not None:
            b.extend([first, small.pop(second)])
        # else the smallest row stays out of the pools, as in NeMo-RL (it cannot happen: the
        # two smallest fit, so the next smallest fits beside the smallest)
    rest = sorted(medium + small + tiny, key=lambda i: lengths[i], reverse=True)
    for b in bins:  # the largest remaining row that fits, until none does
        while rest:
            room = free(b)
            if room < lengths[rest[-1]]:
                break
            fit = next((k for k, i in enumerate(rest) if lengths[i] <= room), None)
            if fit is None:
                break
            b.append(rest.pop(fit))
    leftover: list[list[int]] = [[]]
    loads = [0]  # ascending: the least-filled leftover bin first
    for i in sorted(rest, key=lambda i: lengths[i], reverse=True):
        if lengths[i] <= capacity - loads[0]:
            b, load = leftover.pop(0), loads.pop(0)
        else:
            b, load = [], 0
        b.append(i)
        load += lengths[i]
        at = bisect.bisect(loads, load)
        leftover.insert(at, b)
        loads.insert(at, load)
    return [b for b in bins + leftover if b]


def adjust_bin_count(bins: list[list[int]], multiple: int) -> list[list[int]]:
    """``bins`` with empty bins added up to a multiple of ``multiple`` (at least ``multiple``),
    each filled by moving one row out of a bin that keeps at least one.

    Raises:
        ValueError: fewer rows than bins needed.
    """
    target = max(len(bins), multiple)
    target += -target % multiple
    if target == len(bins):
        return bins
    rows = sum(len(b) for b in bins)
    if rows < target:
        raise ValueError(
            f"{rows} rows cannot fill a multiple of dp_size={multiple} bins ({target}); lower "
            f"dp_size or pass more rows per batch"
        )
    adjusted = [list(b) for b in bins] + [[] for _ in range(target - len(bins))]
    donors = sorted(((len(b), i) for i, b in enumerate(bins)), reverse=True)
    donor = 0
    for new in range(len(bins), target):
        while len(adjusted[donors[donor][1]]) <= 1:
            donor += 1
        adjusted[new].append(adjusted[donors[donor][1]].pop())
    return adjusted
