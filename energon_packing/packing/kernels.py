"""Bin-packing kernels over validated integer lengths.

Every function here takes ``lengths`` (positive ints, each ``<= capacity``), ``capacity`` and
``max_per_pack`` (``None`` or ``>= 1``) already checked by :mod:`.algorithms`, and returns
groups of indices into ``lengths``, in the order the algorithm closes them, each group in
insertion order. No function scans the open packs per item: first fit descends a max segment tree
over packs, and every "largest/smallest size that fits" question is answered by :class:`SizeBag`,
a bitset over size values, in O(capacity / 64) machine words per query.

Ties are broken towards the lowest index everywhere, so results are reproducible and documented
by exact-output tests.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Sequence

__all__ = [
    "Groups",
    "SizeBag",
    "balanced_greedy_knapsack",
    "best_fit_decreasing",
    "concatenative",
    "first_fit",
    "first_fit_decreasing",
    "first_fit_shuffle",
    "greedy_knapsack",
    "modified_first_fit_decreasing",
]

Groups = list[list[int]]


class SizeBag:
    """A multiset of ``(size, ident)`` entries keyed by size.

    Presence of a size is one bit of a Python int, so "largest size ``<= x``" is a mask plus
    ``bit_length`` evaluated in C. Entries of equal size leave lowest ident first.
    """

    __slots__ = ("_count", "_ids", "_mask")

    def __init__(self) -> None:
        self._mask = 0
        self._ids: dict[int, list[int]] = {}
        self._count = 0

    @classmethod
    def of(cls, sizes: Sequence[int], idents: Sequence[int]) -> SizeBag:
        bag = cls()
        for size, ident in zip(sizes, idents):
            bag.add(size, ident)
        return bag

    def __len__(self) -> int:
        return self._count

    def add(self, size: int, ident: int) -> None:
        ids = self._ids.get(size)
        if ids is None:
            self._ids[size] = [ident]
            self._mask |= 1 << size
        else:
            heapq.heappush(ids, ident)
        self._count += 1

    def pop(self, size: int) -> int:
        """Removes and returns the lowest ident of ``size`` (which must be present)."""
        ids = self._ids[size]
        ident = heapq.heappop(ids)
        if not ids:
            del self._ids[size]
            self._mask ^= 1 << size
        self._count -= 1
        return ident

    def largest(self) -> int:
        return self._mask.bit_length() - 1

    def smallest(self) -> int:
        mask = self._mask
        return (mask & -mask).bit_length() - 1

    def largest_at_most(self, limit: int) -> int:
        """The largest present size ``<= limit``, or -1."""
        if limit < 0:
            return -1
        return (self._mask & ((2 << limit) - 1)).bit_length() - 1

    def smallest_at_least(self, limit: int) -> int:
        """The smallest present size ``>= limit``, or -1."""
        high = self._mask >> limit
        if not high:
            return -1
        return limit + (high & -high).bit_length() - 1


def _decreasing(lengths: Sequence[int]) -> list[int]:
    """Indices by decreasing length, ties to the lowest index (stable)."""
    return sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))


def concatenative(lengths: Sequence[int], capacity: int, max_per_pack: int | None) -> Groups:
    """In stream order; a new pack whenever the next item does not fit (NeMo-RL's semantics)."""
    groups: Groups = []
    current: list[int] = []
    load = 0
    for i, size in enumerate(lengths):
        if current and (load + size > capacity or len(current) == max_per_pack):
            groups.append(current)
            current, load = [], 0
        current.append(i)
        load += size
    if current:
        groups.append(current)
    return groups


def first_fit(
    order: Sequence[int], lengths: Sequence[int], capacity: int, max_per_pack: int | None
) -> Groups:
    """First fit in the given item order.

    A max segment tree holds the free space of every pack that could ever exist (one per item);
    unopened packs hold ``capacity``, so the leftmost leaf with room is either the first open
    pack that fits or the next new pack. A pack that reaches ``max_per_pack`` gets -1.
    """
    n = len(order)
    size = 1
    while size < n:
        size *= 2
    tree = [-1] * (2 * size)
    for leaf in range(size, size + n):
        tree[leaf] = capacity
    for node in range(size - 1, 0, -1):
        tree[node] = max(tree[2 * node], tree[2 * node + 1])
    groups: Groups = []
    for item in order:
        need = lengths[item]
        node = 1
        while node < size:
            node = 2 * node if tree[2 * node] >= need else 2 * node + 1
        pack = node - size
        if pack == len(groups):
            groups.append([])
        groups[pack].append(item)
        free = tree[node] - need
        tree[node] = -1 if len(groups[pack]) == max_per_pack else free
        node //= 2
        while node:
            best = max(tree[2 * node], tree[2 * node + 1])
            if tree[node] == best:
                break
            tree[node] = best
            node //= 2
    return groups


def first_fit_decreasing(lengths: Sequence[int], capacity: int, max_per_pack: int | None) -> Groups:
    return first_fit(_decreasing(lengths), lengths, capacity, max_per_pack)


def first_fit_shuffle(
    lengths: Sequence[int], capacity: int, max_per_pack: int | None, seed: int
) -> Groups:
    order = list(range(len(lengths)))
    random.Random(seed).shuffle(order)
    return first_fit(order, lengths, capacity, max_per_pack)


def _greedy_from_bag(bag: SizeBag, capacity: int, max_per_pack: int | None) -> Groups:
    groups: Groups = []
    while len(bag):
        largest = bag.largest()
        group = [bag.pop(largest)]
        free = capacity - largest
        while len(group) != max_per_pack:
            fit = bag.largest_at_most(free)
            if fit < 0:
                break
            group.append(bag.pop(fit))
            free -= fit
        groups.append(group)
    return groups


def greedy_knapsack(lengths: Sequence[int], capacity: int, max_per_pack: int | None) -> Groups:
    """One pack at a time: the largest remaining item, then the largest remaining that fits.

    Gives exactly first-fit-decreasing's packs (a test checks it), in O(n * C/64).
    """
    return _greedy_from_bag(SizeBag.of(lengths, range(len(lengths))), capacity, max_per_pack)


def best_fit_decreasing(lengths: Sequence[int], capacity: int, max_per_pack: int | None) -> Groups:
    """Each item, largest first, into the open pack with the least free space that fits."""
    groups: Groups = []
    free_bag = SizeBag()  # free space -> pack index
    for item in _decreasing(lengths):
        need = lengths[item]
        free = free_bag.smallest_at_least(need)
        if free < 0:
            pack, free = len(groups), capacity
            groups.append([])
        else:
            pack = free_bag.pop(free)
        groups[pack].append(item)
        free -= need
        if free > 0 and len(groups[pack]) != max_per_pack:
            free_bag.add(free, pack)
    return groups


def modified_first_fit_decreasing(
    lengths: Sequence[int], capacity: int, max_per_pack: int | None
) -> Groups:
    """Johnson & Garey (1985) MFFD, fast (size bags) for the loader's buffers. The algorithm
    NeMo-RL's trainer defaults to; its exact bins (ties, leftovers) are
    :func:`energon_packing.packing.trainer_bins.trainer_bins`'s.

    Classes: large (C/2, C], medium (C/3, C/2], small (C/6, C/3], tiny (0, C/6].
    1. one pack per large item, largest first;
    2. forward over those packs: the largest medium item that fits;
    3. backward over packs without a medium item: if the two smallest small items fit, the
       smallest small item plus the largest small item that fits beside it;
    4. forward over all packs: repeatedly the largest remaining item that fits;
    5. first-fit-decreasing on what is left.
    """
    large, medium, small, rest = [], SizeBag(), SizeBag(), []
    for i in _decreasing(lengths):
        size = lengths[i]
        if 2 * size > capacity:
            large.append(i)
        elif 3 * size > capacity:
            medium.add(size, i)
        elif 6 * size > capacity:
            small.add(size, i)
        else:
            rest.append(i)
    groups: Groups = [[i] for i in large]
    free = [capacity - lengths[i] for i in large]

    def room(pack: int, items: int = 1) -> bool:
        return max_per_pack is None or len(groups[pack]) + items <= max_per_pack

    has_medium = [False] * len(groups)
    for pack in range(len(groups)):
        fit = medium.largest_at_most(free[pack]) if room(pack) else -1
        if fit >= 0:
            groups[pack].append(medium.pop(fit))
            free[pack] -= fit
            has_medium[pack] = True

    for pack in reversed(range(len(groups))):
        if has_medium[pack] or len(small) < 2 or not room(pack, 2):
            continue
        first = small.smallest()
        first_item = small.pop(first)
        second = small.largest_at_most(free[pack] - first)
        if second < 0:  # the two smallest do not fit: leave the pack alone
            small.add(first, first_item)
            continue
        groups[pack] += [first_item, small.pop(second)]
        free[pack] -= first + second

    leftover = SizeBag()
    for bag in (medium, small):
        while len(bag):
            size = bag.largest()
            leftover.add(size, bag.pop(size))
    for i in rest:
        leftover.add(lengths[i], i)
    for pack in range(len(groups)):
        while len(leftover) and room(pack):
            fit = leftover.largest_at_most(free[pack])
            if fit < 0:
                break
            groups[pack].append(leftover.pop(fit))
            free[pack] -= fit
    return groups + _greedy_from_bag(leftover, capacity, max_per_pack)


def balanced_greedy_knapsack(
    lengths: Sequence[int], capacity: int, max_per_pack: int | None, delta: int
) -> Groups:
    """Pre-allocates ``ceil(total / C) + delta`` packs; each item, largest first, goes into the
    least-loaded pack if it fits there (then it fits nowhere else either), else into a new pack.
    Packs still empty at the end are dropped, never returned."""
    target = max(1, -(-sum(lengths) // capacity) + delta)
    groups: Groups = [[] for _ in range(target)]
    heap = [(0, pack) for pack in range(target)]  # (load, pack): least loaded, lowest index
    for item in _decreasing(lengths):
        need = lengths[item]
        while heap and len(groups[heap[0][1]]) == max_per_pack:
            heapq.heappop(heap)
        if heap and heap[0][0] + need <= capacity:
            load, pack = heap[0]
            heapq.heapreplace(heap, (load + need, pack))
        else:
            pack = len(groups)
            groups.append([])
            heapq.heappush(heap, (need, pack))
        groups[pack].append(item)
    return [group for group in groups if group]
