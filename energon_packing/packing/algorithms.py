"""Packing algorithms by name, the lower bound, one select round, and the stream packer.

Pure Python: imports neither Energon nor torch, so the loader worker, the trainer shim and the
benchmarks all run exactly this code.

    lengths   [6, 5, 4, 3, 2]       capacity 10
    pack(...) [[0, 2], [1, 3, 4]]   # indices into lengths, every index exactly once
               6+4=10   5+3+2=10

The loader's select is :func:`select_packs`, and :func:`pack_stream` drives it through the same
buffer loop (:class:`~energon_packing.packing.stream.PackingLoop`) as the Energon carry stage.
"""

from __future__ import annotations

import bisect
import itertools
import numbers
import random
import zlib
from array import array
from collections.abc import Iterable, Iterator, Sequence

from energon_packing.packing import kernels
from energon_packing.packing.balance import Grid, StepCostModel
from energon_packing.packing.carry import CarryPolicy, Selection, emit_all, split
from energon_packing.packing.company import Company, check_company, group
from energon_packing.packing.stream import ListBuffer, LoopState, PackingLoop
from energon_packing.packing.subset_fill import subset_fill

__all__ = [
    "ALGORITHMS",
    "DEFAULT_ALGORITHM",
    "CarryPolicy",
    "Company",
    "Selection",
    "check_algorithm",
    "check_lengths",
    "lower_bound",
    "pack",
    "pack_stream",
    "round_up",
    "select_packs",
]

#: Our default first; then the peers' algorithms under their upstream names.
ALGORITHMS: tuple[str, ...] = (
    "subset_fill",
    "concatenative",
    "first_fit_decreasing",
    "first_fit_shuffle",
    "modified_first_fit_decreasing",
    "best_fit_decreasing",
    "greedy_knapsack",
    "balanced_greedy_knapsack",
)
DEFAULT_ALGORITHM = "subset_fill"

#: Above this many items, ``subset_fill`` packs offline through carry rounds of this many
#: (a seeded shuffle first): one pass over everything leaves its awkward items for the last
#: packs, carry rounds keep mixing them with fresh ones.
OFFLINE_BUFFER = 1024


def round_up(value: int, multiple: int) -> int:
    """``value`` padded up to a multiple of ``multiple`` (a source's padded length)."""
    return -(-value // multiple) * multiple


def check_algorithm(algorithm: str) -> str:
    if algorithm not in ALGORITHMS:
        raise ValueError(
            f"unknown packing algorithm {algorithm!r}; valid choices: {', '.join(ALGORITHMS)}"
        )
    return algorithm


def check_lengths(lengths: Iterable[int], capacity: int) -> list[int]:
    """Returns ``lengths`` as a list of ints, or raises ``ValueError`` naming the bad entry."""
    if isinstance(capacity, bool) or not isinstance(capacity, numbers.Integral) or capacity <= 0:
        raise ValueError(f"capacity must be a positive integer, got {capacity!r}")
    return [check_length(index, length, capacity) for index, length in enumerate(lengths)]


def check_length(index: int, length: int, capacity: int) -> int:
    """One entry of :func:`check_lengths`; ``index`` is only used in the message."""
    if isinstance(length, bool) or not isinstance(length, numbers.Integral):
        raise ValueError(
            f"lengths[{index}] = {length!r} is not an integer; lengths are token counts"
        )
    if length <= 0:
        raise ValueError(f"lengths[{index}] = {length} must be positive")
    if length > capacity:
        raise ValueError(
            f"lengths[{index}] = {length} exceeds the capacity {capacity}; truncate or drop "
            f"the sample before packing, or raise the capacity"
        )
    return int(length)


def _check_max_per_pack(max_per_pack: int | None) -> None:
    if max_per_pack is not None and (
        isinstance(max_per_pack, bool)
        or not isinstance(max_per_pack, numbers.Integral)
        or max_per_pack < 1
    ):
        raise ValueError(f"max_per_pack must be None or an integer >= 1, got {max_per_pack!r}")


def pack(
    lengths: Sequence[int],
    capacity: int,
    *,
    algorithm: str = DEFAULT_ALGORITHM,
    max_per_pack: int | None = None,
    seed: int = 0,
    delta: int = 0,
    company: Sequence[int] | None = None,
) -> list[list[int]]:
    """Groups the indices of ``lengths`` into packs of total length ``<= capacity``.

    Args:
        lengths: Token count of each item (positive ints, each ``<= capacity``).
        capacity: Pack width in tokens.
        algorithm: One of :data:`ALGORITHMS`.
        max_per_pack: At most this many items per pack (``None``: no limit).
        seed: Seed of ``first_fit_shuffle`` (the others are deterministic without it).
        delta: Extra packs pre-allocated by ``balanced_greedy_knapsack``; must be 0 for the
            other algorithms, which have no such knob.
        company: Each item's :class:`Company` (``None``: all ``ANY``): an ``APART`` item
            shares its pack only with ``PLAIN`` ones (:mod:`energon_packing.packing.company`).

    Returns:
        Every index exactly once, no empty group; deterministic for the same input and seed.

    Raises:
        ValueError: naming the bad index and value, or the valid algorithm names.
    """
    lengths = _check_call(lengths, capacity, algorithm, max_per_pack, delta)
    units = (
        group(lengths, capacity, company, max_per_pack=max_per_pack)
        if company is not None
        else None
    )
    if units is not None:
        return units.expand_groups(
            pack(
                units.lengths,
                capacity,
                algorithm=algorithm,
                max_per_pack=max_per_pack,
                seed=seed,
                delta=delta,
            )
        )
    return min(
        candidates(lengths, capacity, algorithm, max_per_pack, seed, delta), key=_score(lengths)
    )


def _check_call(
    lengths: Iterable[int], capacity: int, algorithm: str, max_per_pack: int | None, delta: int
) -> list[int]:
    check_algorithm(algorithm)
    lengths = check_lengths(lengths, capacity)
    _check_max_per_pack(max_per_pack)
    if isinstance(delta, bool) or not isinstance(delta, numbers.Integral):
        raise ValueError(f"delta must be an integer, got {delta!r}")
    if delta and algorithm != "balanced_greedy_knapsack":
        raise ValueError(
            f"delta={delta} only applies to balanced_greedy_knapsack, not to {algorithm}"
        )
    return lengths


def candidates(
    lengths: list[int],
    capacity: int,
    algorithm: str,
    max_per_pack: int | None,
    seed: int,
    delta: int,
) -> list[list[list[int]]]:
    """The packings an algorithm proposes for checked input; the caller keeps the best.

    Every peer algorithm proposes one. ``subset_fill`` proposes its subset-sum packing and
    first-fit-decreasing's (as ``greedy_knapsack``, which gives the same packs faster), so it
    is never worse than FFD by the caller's measure.
    """
    if not lengths:
        return [[]]
    if algorithm == "subset_fill":
        ffd = kernels.greedy_knapsack(lengths, capacity, max_per_pack)
        if len(lengths) <= OFFLINE_BUFFER:
            return [subset_fill(lengths, capacity, max_per_pack), ffd]
        return [_offline_rounds(lengths, capacity, max_per_pack, seed), ffd]
    if algorithm == "first_fit_shuffle":
        return [kernels.first_fit_shuffle(lengths, capacity, max_per_pack, seed)]
    if algorithm == "balanced_greedy_knapsack":
        return [kernels.balanced_greedy_knapsack(lengths, capacity, max_per_pack, delta)]
    return [getattr(kernels, algorithm)(lengths, capacity, max_per_pack)]


def _offline_rounds(
    lengths: list[int], capacity: int, max_per_pack: int | None, seed: int
) -> list[list[int]]:
    order = list(range(len(lengths)))
    random.Random(seed).shuffle(order)
    rounds = pack_stream(
        [lengths[i] for i in order],
        capacity,
        buffer_size=OFFLINE_BUFFER,
        carry=True,
        max_per_pack=max_per_pack,
        seed=seed,
    )
    return [[order[i] for i in group] for group in rounds]


def _score(lengths: Sequence[int]):
    """Fewer packs wins; on a tie the more uneven fill (waste gathered in few packs)."""

    def score(groups: list[list[int]]) -> tuple[int, int]:
        return len(groups), -sum(sum(lengths[i] for i in g) ** 2 for g in groups)

    return score


def lower_bound(
    lengths: Sequence[int], capacity: int, *, company: Sequence[int] | None = None
) -> int:
    """max(L1, L2): no packing of ``lengths`` uses fewer packs (Martello & Toth 1990).

    L1 = ceil(sum / C). L2 counts items that pairwise cannot share a pack plus the volume of
    mid-sized items that cannot go beside them, over every threshold alpha <= C/2.
    With ``company``: nor fewer than one pack per ``APART`` item plus the bound of the items
    that share no pack with them (``ANY`` ones, ``PLAIN`` ones longer than any room they
    leave).
    """
    if company is not None:
        kinds = check_company(company, len(lengths))
        apart = [n for n, kind in zip(lengths, kinds) if kind is Company.APART]
        room = capacity - min(apart, default=capacity)  # the most text one clip's pack takes
        rest = [
            n
            for n, kind in zip(lengths, kinds)
            if kind is Company.ANY or (kind is Company.PLAIN and n > room)
        ]
        return max(lower_bound(lengths, capacity), len(apart) + lower_bound(rest, capacity))
    sizes = sorted(check_lengths(lengths, capacity))
    if not sizes:
        return 0
    prefix = [0]
    for size in sizes:
        prefix.append(prefix[-1] + size)
    best = -(-prefix[-1] // capacity)
    half = bisect.bisect_right(sizes, capacity // 2)  # sizes[:half] are <= C/2
    for alpha in sorted(set(sizes[:half])) or [0]:
        big = bisect.bisect_right(sizes, capacity - alpha)  # sizes[big:] > C - alpha
        j1 = len(sizes) - big
        j2 = big - half
        j2_free = j2 * capacity - (prefix[big] - prefix[half])
        lo = bisect.bisect_left(sizes, alpha)
        j3_sum = prefix[half] - prefix[lo]
        best = max(best, j1 + j2 + max(0, -(-(j3_sum - j2_free) // capacity)))
    return best


def round_seed(seed: int, lengths: Sequence[int]) -> int:
    """A per-buffer seed that depends only on the seed and the buffer's content, so a restored
    loader (same buffer) repeats the same shuffle without saving any counter."""
    return zlib.crc32(array("q", lengths).tobytes(), seed & 0xFFFFFFFF)


def select_packs(
    lengths: Sequence[int],
    capacity: int,
    *,
    algorithm: str = DEFAULT_ALGORITHM,
    max_per_pack: int | None = None,
    seed: int = 0,
    delta: int = 0,
    carry: CarryPolicy | None = None,
    carry_counts: Sequence[int] | None = None,
    buffer_size: int | None = None,
    final: bool = False,
    company: Sequence[int] | None = None,
) -> Selection:
    """One select round over a buffer: pack it, then (with ``carry``) keep the emptiest packs'
    samples back for the next round. ``final=True`` (end of data) emits everything.

    Args:
        lengths: Cost of each buffered sample.
        carry: The carry policy, or ``None`` for Energon's behaviour (emit every pack).
        carry_counts: How often each buffered sample was carried already (default all 0).
        buffer_size: The buffer's capacity in samples, for the carry budget (default
            ``len(lengths)``).
        company: Each sample's :class:`Company` (``None``: all ``ANY``): an ``APART`` sample
            and the ``PLAIN`` ones that fill its pack are selected as one unit.

    Returns:
        A :class:`Selection` whose packs and carried positions cover every position once.
    """
    lengths = _check_call(lengths, capacity, algorithm, max_per_pack, delta)
    counts = carry_counts if carry_counts is not None else [0] * len(lengths)
    if len(counts) != len(lengths):
        raise ValueError(f"carry_counts has {len(counts)} entries for {len(lengths)} lengths")
    units = (
        group(lengths, capacity, company, max_per_pack=max_per_pack)
        if company is not None
        else None
    )
    # The algorithm packs a unit as the capacity (it packs alone); the carry rule may weigh it
    # by what it holds (Units.carry_loads)
    costs = units.lengths if units is not None else lengths
    volumes = units.carry_loads(lengths) if units is not None else lengths
    proposals = candidates(costs, capacity, algorithm, max_per_pack, round_seed(seed, costs), delta)
    if carry is None or final:
        chosen = emit_all(min(proposals, key=_score(costs)), volumes, capacity)
        return units.expand(chosen) if units is not None else chosen
    selections = [
        split(
            groups,
            volumes,
            capacity,
            policy=carry,
            carry_counts=units.counts(counts) if units is not None else counts,
            buffer_size=buffer_size or len(lengths),
            members=units.sizes if units is not None else None,
        )
        for groups in proposals
    ]
    # Least waste in what leaves the buffer, then the most packs out: under carry, what is
    # kept back is not lost, only what is emitted half empty is.
    chosen = min(selections, key=lambda s: (s.waste, -len(s.packs)))
    return units.expand(chosen) if units is not None else chosen


def pack_stream(
    lengths: Iterable[int],
    capacity: int,
    *,
    buffer_size: int,
    algorithm: str = DEFAULT_ALGORITHM,
    carry: bool | CarryPolicy = False,
    max_per_pack: int | None = None,
    seed: int = 0,
    delta: int = 0,
    balance_window: int = 0,
    cost_model: StepCostModel | None = None,
    grids: Iterable[Sequence[Grid]] | None = None,
    company: Iterable[int] | None = None,
) -> Iterator[list[int]]:
    """Packs a stream through a buffer of ``buffer_size`` samples, as the loader does.

    ``carry=False`` is Energon's behaviour: fill the buffer, pack it, emit every pack, repeat;
    the last partial buffer is packed too. ``carry=True`` (or a :class:`CarryPolicy`) keeps the
    samples of under-full packs in the buffer for the next round; the buffer never exceeds
    ``buffer_size`` and everything left is flushed at the end of the stream.
    ``balance_window=W`` reorders the packs as the loader's balanced emission does, targeting
    ``cost_model``'s pack FLOPs (default: a 7B decoder's); ``grids`` (aligned with ``lengths``:
    each conversation's image and video grids) adds what its vision encoder costs.
    ``company`` (aligned with ``lengths``) is each sample's :class:`Company`, as the loader
    reads it from the encoder.

    Yields:
        Packs as lists of indices into the stream.
    """
    if isinstance(buffer_size, bool) or not isinstance(buffer_size, int) or buffer_size < 1:
        raise ValueError(f"buffer_size must be an integer >= 1, got {buffer_size!r}")
    if (
        isinstance(balance_window, bool)
        or not isinstance(balance_window, int)
        or balance_window < 0
    ):
        raise ValueError(f"balance_window must be an integer >= 0, got {balance_window!r}")
    _check_call([], capacity, algorithm, max_per_pack, delta)  # lengths are checked as read
    policy = CarryPolicy() if carry is True else (carry or None)
    model = cost_model or StepCostModel()
    sizes: list[int] = []  # by stream position
    vision: list[int] = []  # each conversation's vision FLOPs, by stream position
    media = grids if grids is not None else itertools.repeat(())
    kinds: list[int] | None = [] if company is not None else None  # by stream position
    companions = iter(company) if company is not None else None

    def positions() -> Iterator[int]:
        for position, (length, conversation) in enumerate(zip(lengths, media)):
            sizes.append(check_length(position, length, capacity))
            if kinds is not None:
                kind = next(companions, None)
                if kind is None:
                    raise ValueError(f"company ends at position {position}; lengths go on")
                kinds.append(kind)
            if balance_window:
                vision.append(model.vision_flops(conversation))
            yield position

    def select(buffered: list[int], counts: list[int], final: bool) -> Selection:
        return select_packs(
            [sizes[i] for i in buffered],
            capacity,
            algorithm=algorithm,
            max_per_pack=max_per_pack,
            seed=seed,
            delta=delta,
            carry=policy,
            carry_counts=counts,
            buffer_size=buffer_size,
            final=final,
            company=[kinds[i] for i in buffered] if kinds is not None else None,
        )

    loop = PackingLoop(
        buffer_size=buffer_size,
        select=select,
        pack_cost=lambda group: (
            model.pack_flops([sizes[i] for i in group], capacity=capacity)
            + sum(vision[i] for i in group)
        ),
        balance_window=balance_window,
        balance_seed=seed,
    )
    yield from loop.run(positions(), ListBuffer(), ListBuffer(), LoopState())
