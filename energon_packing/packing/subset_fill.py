"""Our default packer: each pack is its largest item plus the best-fitting subset of the rest.

First-fit-style packers leave a gap in almost every pack when lengths are chunky (VLM data: a
fixed block of image tokens plus short text): they commit to the largest item that fits and
cannot undo it. Here a pack is its largest remaining item, closed by an exact subset-sum over a
window of candidates computed on a Python-int bitset, so the pack is as full as any choice from
that window allows; it is then topped up from a fresh window until nothing fits.

The window is spread evenly by rank over the remaining items that fit, not the largest ones:
the largest fitting items are often all alike, and it takes a big and a small item together to
close a pack exactly. Among equally full choices the smaller items win (``prefer_small``), so
awkward small items are spent beside large ones instead of piling up in the last packs
(measured in ``benchmarks/packing_quality.py``).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from energon_packing.packing.kernels import Groups

__all__ = ["DEFAULT_WINDOW", "best_subset", "subset_fill"]

#: Candidates per subset-sum. 16..48 measure alike on the four mixes; cost grows linearly.
DEFAULT_WINDOW = 32


def best_subset(sizes: Sequence[int], free: int, limit: int | None = None) -> list[int]:
    """Positions of the subset of ``sizes`` with the largest sum ``<= free``.

    At most ``limit`` items (``None``: any number). Among subsets with that sum, the one using
    earlier positions wins. Returns positions in increasing order.

    >>> best_subset([7, 5, 4, 3], 12)
    [0, 1]
    >>> best_subset([3, 4, 5, 7], 12)
    [0, 1, 2]
    >>> best_subset([3, 4, 5, 7], 12, limit=2)
    [2, 3]
    """
    if limit is not None and limit <= 0:
        return []
    if sum(sizes) <= free and (limit is None or len(sizes) <= limit):
        return list(range(len(sizes)))
    chosen = _unbounded(sizes, free)
    if limit is not None and len(chosen) > limit:
        chosen = _bounded(sizes, free, limit)
    return chosen


def _unbounded(sizes: Sequence[int], free: int) -> list[int]:
    full = (2 << free) - 1
    reach = 1  # bit s set: some subset of the items seen so far sums to s
    history = [reach]
    for size in sizes:
        reach = (reach | (reach << size)) & full
        history.append(reach)
        if reach >> free:  # a perfect fill is reachable: later items cannot improve it
            break
    target = reach.bit_length() - 1
    chosen = []
    # Walk back: an item is used only if the target is unreachable without it, so the
    # earliest positions that reach the target are the ones kept.
    for k in range(len(history) - 1, 0, -1):
        if not (history[k - 1] >> target) & 1:
            chosen.append(k - 1)
            target -= sizes[k - 1]
    chosen.reverse()
    return chosen


def _bounded(sizes: Sequence[int], free: int, limit: int) -> list[int]:
    """Subset-sum with a cardinality bound: one bitset layer per item count."""
    full = (2 << free) - 1
    layers = [1] + [0] * limit  # layers[c]: sums reachable with exactly c items
    history = [layers]
    for size in sizes:
        nxt = layers[:]
        for count in range(limit, 0, -1):
            nxt[count] |= (layers[count - 1] << size) & full
        layers = nxt
        history.append(layers)
    count = max(range(limit + 1), key=lambda c: (layers[c].bit_length(), -c))
    target = layers[count].bit_length() - 1
    chosen = []
    for k in range(len(history) - 1, 0, -1):
        if not (history[k - 1][count] >> target) & 1:
            chosen.append(k - 1)
            target -= sizes[k - 1]
            count -= 1
    chosen.reverse()
    return chosen


def subset_fill(
    lengths: Sequence[int],
    capacity: int,
    max_per_pack: int | None,
    *,
    window: int = DEFAULT_WINDOW,
    prefer_small: bool = True,
) -> Groups:
    """Packs in order of decreasing largest item, each closed by :func:`best_subset`.

    Items live in one sorted list of ``size * n + index`` keys (ties: lowest index first), so
    "the items that fit" is one ``bisect`` and the window is read off by position.
    """
    n = len(lengths)
    keys = sorted(size * n + index for index, size in enumerate(lengths))
    groups: Groups = []
    while keys:
        top = keys[-1] // n
        anchor = keys.pop(bisect.bisect_left(keys, top * n))  # largest, lowest index
        group = [anchor % n]
        free = capacity - top
        while free > 0 and len(group) != max_per_pack:
            fit = bisect.bisect_left(keys, (free + 1) * n)  # keys[:fit] fit into the gap
            if not fit:
                break
            if fit <= window:
                positions = list(range(fit))
            else:
                positions = [(fit - 1) * k // (window - 1) for k in range(window)]
            if not prefer_small:
                positions.reverse()
            limit = None if max_per_pack is None else max_per_pack - len(group)
            chosen = best_subset([keys[p] // n for p in positions], free, limit)
            if not chosen:
                break
            for position in sorted((positions[c] for c in chosen), reverse=True):
                key = keys.pop(position)
                group.append(key % n)
                free -= key // n
        groups.append(group)
    return groups
