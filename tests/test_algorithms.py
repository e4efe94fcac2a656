"""energon_packing.algorithms: exact outputs on tiny inputs, invariants under hypothesis."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from energon_packing.packing.algorithms import (
    ALGORITHMS,
    DEFAULT_ALGORITHM,
    CarryPolicy,
    lower_bound,
    pack,
    pack_stream,
    select_packs,
)

# Worked by hand from each algorithm's definition (see binpack.py / fill.py docstrings).
EXACT = {
    # lengths [6, 5, 4, 3, 2], capacity 10
    "subset_fill": [[0, 2], [1, 3, 4]],
    "concatenative": [[0], [1, 2], [3, 4]],
    "first_fit_decreasing": [[0, 2], [1, 3, 4]],
    "modified_first_fit_decreasing": [[0, 2], [1, 3, 4]],
    "best_fit_decreasing": [[0, 2], [1, 3, 4]],
    "greedy_knapsack": [[0, 2], [1, 3, 4]],
    # ceil(20/10) = 2 packs: 6->p0, 5->p1, 4->p1 (least loaded), 3->p0, 2 fits in neither
    "balanced_greedy_knapsack": [[0, 3], [1, 2], [4]],
}


@pytest.mark.parametrize("algorithm", sorted(EXACT))
def test_exact_small_case(algorithm):
    assert pack([6, 5, 4, 3, 2], 10, algorithm=algorithm) == EXACT[algorithm]


def test_algorithm_registry():
    assert DEFAULT_ALGORITHM == "subset_fill" == ALGORITHMS[0]
    assert set(EXACT) | {"first_fit_shuffle"} == set(ALGORITHMS)


def test_concatenative_keeps_stream_order():
    # NeMo-RL's docstring example: seq_length 5 and 8
    assert pack([4, 1, 3, 2, 1, 3, 4, 5], 5, algorithm="concatenative") == [
        [0, 1],
        [2, 3],
        [4, 5],
        [6],
        [7],
    ]
    assert pack([4, 1, 3, 2, 1, 3, 4, 5], 8, algorithm="concatenative") == [
        [0, 1, 2],
        [3, 4, 5],
        [6],
        [7],
    ]


def test_mffd_phases():
    # large 5,4,4,3,3 each open a pack; the medium 2 only fits beside a 3 (phase 2); the two
    # smalls (1, 1) go together, backwards, into the last pack without a medium (phase 3).
    assert pack([4, 1, 3, 2, 1, 3, 4, 5], 5, algorithm="modified_first_fit_decreasing") == [
        [7],
        [0],
        [6],
        [2, 3],
        [5, 1, 4],
    ]


def test_best_fit_takes_the_tightest_pack():
    # 8 and 6 open two packs (free 2 and 4); 3 goes beside 6 (free 1 left). The last 1 fits
    # both packs: first fit takes the first (beside 8), best fit the tightest (beside 6+3).
    assert pack([8, 6, 3, 1], 10, algorithm="first_fit_decreasing") == [[0, 3], [1, 2]]
    assert pack([8, 6, 3, 1], 10, algorithm="best_fit_decreasing") == [[0], [1, 2, 3]]


def test_first_fit_shuffle_is_seeded():
    lengths = [5, 4, 3, 3, 2, 2, 1, 1, 1, 1] * 4
    a = pack(lengths, 10, algorithm="first_fit_shuffle", seed=1)
    assert a == pack(lengths, 10, algorithm="first_fit_shuffle", seed=1)
    assert a != pack(lengths, 10, algorithm="first_fit_shuffle", seed=2)


def test_balanced_delta_preallocates_packs():
    assert pack([6, 5, 4, 3, 2], 10, algorithm="balanced_greedy_knapsack", delta=1) == [
        [0],
        [1, 4],
        [2, 3],
    ]
    # never returns empty packs, even when delta pre-allocates more packs than items
    assert pack([1, 1], 10, algorithm="balanced_greedy_knapsack", delta=5) == [[0], [1]]


def test_subset_fill_beats_first_fit_on_chunky_lengths():
    # FFD: 6+4 | 5+4 (9) | 3+3+3 (9) | 2. The subset-sum closes every pack exactly.
    lengths = [6, 5, 4, 4, 3, 3, 3, 2]  # total 30 = 3 full packs of 10
    assert pack(lengths, 10, algorithm="first_fit_decreasing") == [
        [0, 2],
        [1, 3],
        [4, 5, 6],
        [7],
    ]
    assert pack(lengths, 10) == [[0, 2], [1, 4, 7], [3, 6, 5]]
    assert lower_bound(lengths, 10) == 3


def test_max_per_pack_exact():
    assert pack([6, 5, 4, 3, 2], 10, max_per_pack=2) == [[0, 2], [1, 3], [4]]
    assert pack([1] * 5, 10, algorithm="concatenative", max_per_pack=2) == [[0, 1], [2, 3], [4]]


def test_lower_bound():
    assert lower_bound([], 10) == 0
    assert lower_bound([6, 5, 4, 3, 2], 10) == 2
    assert lower_bound([6, 6, 6], 10) == 3  # L1 says 2; no two items share a pack
    # L2 with alpha = 40: the three 60s need their own packs; the 40s fit beside them
    assert lower_bound([60, 60, 60, 40, 40], 100) == 3
    assert lower_bound([51, 51, 30, 30, 30, 30, 30], 100) == 3  # L1 = 3
    assert lower_bound([34] * 6, 100) == 3  # pairs at most: L2 with alpha = 34


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: pack([3, 11, 2], 10), r"lengths\[1\] = 11 exceeds the capacity 10"),
        (lambda: pack([3, 0], 10), r"lengths\[1\] = 0 must be positive"),
        (lambda: pack([3, -2], 10), r"lengths\[1\] = -2 must be positive"),
        (lambda: pack([2.5], 10), r"lengths\[0\] = 2.5 is not an integer"),
        (lambda: pack([True], 10), r"lengths\[0\] = True is not an integer"),
        (lambda: pack([1], 0), r"capacity must be a positive integer, got 0"),
        (lambda: pack([1], 10, max_per_pack=0), r"max_per_pack must be None or an integer >= 1"),
        (lambda: pack([1], 10, delta=2), r"delta=2 only applies to balanced_greedy_knapsack"),
        (
            lambda: pack([1], 10, algorithm="ffd"),
            r"unknown packing algorithm 'ffd'; valid choices: subset_fill, concatenative, "
            r"first_fit_decreasing, first_fit_shuffle, modified_first_fit_decreasing, "
            r"best_fit_decreasing, greedy_knapsack, balanced_greedy_knapsack",
        ),
        (lambda: list(pack_stream([1, 2, 99], 10, buffer_size=2)), r"lengths\[2\] = 99 exceeds"),
        (lambda: list(pack_stream([1], 10, buffer_size=0)), r"buffer_size must be an integer"),
        (  # checked before the first sample, so also on an empty stream
            lambda: list(pack_stream([], 10, buffer_size=4, delta=3)),
            r"delta=3 only applies to balanced_greedy_knapsack",
        ),
        (lambda: CarryPolicy(budget=1.0), r"budget must be within \[0, 1\), got 1.0"),
        (lambda: CarryPolicy(max_carries=-1), r"max_carries must be an integer >= 0"),
        (lambda: CarryPolicy(min_fill=2), r"min_fill must be within \[0, 1\]"),
    ],
)
def test_errors_name_index_value_and_choices(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_numpy_integers_are_lengths():
    np = pytest.importorskip("numpy")
    assert pack(np.array([6, 5, 4, 3, 2]), 10) == EXACT["subset_fill"]


# ---- properties --------------------------------------------------------------------------

capacities = st.integers(min_value=1, max_value=64)


@st.composite
def instances(draw, max_items=40):
    capacity = draw(capacities)
    lengths = draw(st.lists(st.integers(1, capacity), max_size=max_items))
    max_per_pack = draw(st.none() | st.integers(1, 6))
    return lengths, capacity, max_per_pack


def check_packing(groups, lengths, capacity, max_per_pack):
    flat = sorted(i for g in groups for i in g)
    assert flat == list(range(len(lengths))), "every index exactly once"
    for g in groups:
        assert g, "no empty pack"
        assert sum(lengths[i] for i in g) <= capacity
        assert max_per_pack is None or len(g) <= max_per_pack
    if max_per_pack is None:
        assert len(groups) >= lower_bound(lengths, capacity)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@settings(max_examples=150, deadline=None)
@given(instance=instances(), seed=st.integers(0, 2**31))
def test_pack_invariants(algorithm, instance, seed):
    lengths, capacity, max_per_pack = instance
    groups = pack(lengths, capacity, algorithm=algorithm, max_per_pack=max_per_pack, seed=seed)
    check_packing(groups, lengths, capacity, max_per_pack)
    again = pack(lengths, capacity, algorithm=algorithm, max_per_pack=max_per_pack, seed=seed)
    assert groups == again, "deterministic for the same input and seed"


@settings(max_examples=300, deadline=None)
@given(instance=instances())
def test_greedy_knapsack_gives_ffd_packs(instance):
    lengths, capacity, max_per_pack = instance
    assert pack(lengths, capacity, algorithm="greedy_knapsack", max_per_pack=max_per_pack) == (
        pack(lengths, capacity, algorithm="first_fit_decreasing", max_per_pack=max_per_pack)
    )


@settings(max_examples=300, deadline=None)
@given(instance=instances())
def test_default_never_worse_than_ffd(instance):
    lengths, capacity, max_per_pack = instance
    ffd = pack(lengths, capacity, algorithm="first_fit_decreasing", max_per_pack=max_per_pack)
    assert len(pack(lengths, capacity, max_per_pack=max_per_pack)) <= len(ffd)


@settings(max_examples=100, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 100), min_size=1, max_size=300),
    capacity=st.integers(100, 400),
)
def test_lower_bound_is_a_bound(lengths, capacity):
    bound = lower_bound(lengths, capacity)
    assert -(-sum(lengths) // capacity) <= bound <= len(pack(lengths, capacity))


def test_offline_path_for_large_inputs():
    """Above OFFLINE_BUFFER items the default packs through carry rounds; still a packing."""
    import random

    rng = random.Random(7)
    lengths = [rng.choice([600, 640, 700, 1200, 96, 2000]) for _ in range(3000)]
    groups = pack(lengths, 4096, seed=3)
    check_packing(groups, lengths, 4096, None)
    assert groups == pack(lengths, 4096, seed=3)
    ffd = pack(lengths, 4096, algorithm="first_fit_decreasing")
    assert len(groups) <= len(ffd)


# ---- stream ------------------------------------------------------------------------------


class Counting:
    """An iterator that records how many items the packer has pulled."""

    def __init__(self, values):
        self.values, self.pulled = list(values), 0

    def __iter__(self):
        for value in self.values:
            self.pulled += 1
            yield value


def test_stream_without_carry_is_energon_chunking():
    lengths = [6, 5, 4, 3, 2, 9, 1, 8]
    assert list(pack_stream(lengths, 10, buffer_size=5)) == [
        [0, 2],
        [1, 3, 4],  # first buffer: items 0..4
        [5, 6],
        [7],  # last, partial buffer: flushed
    ]


def test_stream_with_carry_exact():
    # Buffer 4, C=10. Round 1 packs 6+4 (full) and keeps 5+3 (80 %) back. Round 2 sees the
    # carried 5, 3 and the fresh 2, 9: emits 5+3+2, keeps the 9 (90 %). The stream ends with
    # 9 and the fresh 1: the final round flushes 9+1.
    policy = CarryPolicy(max_carries=2, min_fill=0.95, budget=0.5)
    lengths = [6, 5, 4, 3, 2, 9, 1]
    assert list(pack_stream(lengths, 10, buffer_size=4, carry=policy)) == [
        [0, 2],
        [1, 3, 4],
        [5, 6],
    ]


@pytest.mark.parametrize("carry", [False, True])
@pytest.mark.parametrize("algorithm", ALGORITHMS)
@settings(max_examples=60, deadline=None)
@given(
    instance=instances(max_items=120),
    buffer_size=st.integers(1, 20),
    max_carries=st.integers(0, 3),
)
def test_stream_invariants(carry, algorithm, instance, buffer_size, max_carries):
    lengths, capacity, max_per_pack = instance
    policy = CarryPolicy(max_carries=max_carries) if carry else False
    source = Counting(lengths)
    emitted = 0
    groups = []
    for group in pack_stream(
        source,
        capacity,
        buffer_size=buffer_size,
        algorithm=algorithm,
        carry=policy,
        max_per_pack=max_per_pack,
    ):
        assert source.pulled - emitted <= buffer_size, "buffer never above buffer_size"
        # as in Energon's loop, a sample waits < buffer_size pulls for its first select, at most
        # max_carries extra rounds of <= buffer_size pulls each, and < buffer_size pulls while
        # the packs selected before it in its last round leave (each emptied slot is refilled)
        bound = (max_carries + 2 if carry else 2) * buffer_size
        assert all(source.pulled - i - 1 < bound for i in group)
        emitted += len(group)
        groups.append(group)
    check_packing(groups, lengths, capacity, max_per_pack)
    again = list(
        pack_stream(
            lengths,
            capacity,
            buffer_size=buffer_size,
            algorithm=algorithm,
            carry=policy,
            max_per_pack=max_per_pack,
        )
    )
    assert groups == again


def test_select_is_deterministic_for_a_restored_buffer():
    lengths = [5, 4, 3, 3, 2, 2, 1, 1, 7, 6] * 3
    a = select_packs(lengths, 10, algorithm="first_fit_shuffle", seed=5)
    b = select_packs(list(lengths), 10, algorithm="first_fit_shuffle", seed=5)
    assert a == b
    assert a != select_packs(lengths, 10, algorithm="first_fit_shuffle", seed=6)


def test_select_never_carries_a_sample_past_max_carries():
    lengths = [6, 3]  # 90 % full: carried while allowed
    policy = CarryPolicy(max_carries=2, min_fill=1.0, budget=0.9)
    kept = select_packs(lengths, 10, carry=policy, carry_counts=[1, 1], buffer_size=4)
    assert (kept.packs, kept.carried) == ([], [0, 1])
    forced = select_packs(lengths, 10, carry=policy, carry_counts=[2, 0], buffer_size=4)
    assert (forced.packs, forced.carried) == ([[0, 1]], [])
    # the budget (floor(0.9 * 2) = 1 sample) is too small for the pair: emitted
    assert select_packs(lengths, 10, carry=policy, carry_counts=[0, 0]).carried == []
    final = select_packs(lengths, 10, carry=policy, carry_counts=[0, 0], buffer_size=4, final=True)
    assert final.carried == []


@pytest.mark.parametrize(
    "knob, values",
    [
        ("min_fill", (0.5, 1.0)),
        ("budget", (0.0, 0.9)),
        ("max_carries", (0, 3)),
    ],
)
def test_every_carry_knob_changes_the_selection(knob, values):
    lengths = [6, 3, 5, 2, 7, 1]  # 6+3+1 = 10 is full; 7+2 and 5 are not
    results = []
    for value in values:
        policy = CarryPolicy(**{**dict(min_fill=1.0, budget=0.9, max_carries=3), knob: value})
        sel = select_packs(lengths, 10, carry=policy, carry_counts=[0] * 6)
        assert sorted([i for g in sel.packs for i in g] + sel.carried) == list(range(6))
        results.append((sel.packs, sel.carried))
    assert results[0] != results[1]


def test_carry_lowers_pack_count_on_a_stream():
    import random

    rng = random.Random(0)
    lengths = [int(rng.lognormvariate(5.5, 1.2)) % 2000 + 8 for _ in range(4000)]
    chunk = len(list(pack_stream(lengths, 2048, buffer_size=64)))
    carried = len(list(pack_stream(lengths, 2048, buffer_size=64, carry=True)))
    bound = lower_bound(lengths, 2048)
    assert bound <= carried < chunk
    assert carried / bound - 1 < 0.02 < chunk / bound - 1


def test_module_docstring_example():
    import energon_packing.packing.algorithms as algorithms

    example = re.search(r"pack\(\.\.\.\) (\[\[.*?\]\])", algorithms.__doc__).group(1)
    assert str(pack([6, 5, 4, 3, 2], 10)) == example


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@settings(max_examples=60, deadline=None)
@given(instance=instances(max_items=40), dp=st.integers(1, 4))
def test_trainer_bins_invariants(algorithm, instance, dp):
    """Every row once, capacity kept, bin count a multiple of dp (when there are enough rows)."""
    from energon_packing.packing.trainer_bins import trainer_bins

    lengths, capacity, max_per_pack = instance
    if not lengths:
        return
    target = max(dp, 1)
    try:
        bins = trainer_bins(
            lengths, capacity, algorithm=algorithm, dp_size=dp, max_per_bin=max_per_pack
        )
    except ValueError as e:
        assert "cannot fill a multiple of dp_size" in str(e)
        return
    assert sorted(i for b in bins for i in b) == list(range(len(lengths)))
    assert all(b for b in bins) and len(bins) % dp == 0 and len(bins) >= target
    assert all(sum(lengths[i] for i in b) <= capacity for b in bins)
