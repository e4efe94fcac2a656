"""The company rule of the packing core (``energon_packing.packing.company``): an ``APART``
sample shares its pack only with ``PLAIN`` ones, which fill it; everything else packs as
before. Exact outputs on tiny inputs, hypothesis on the invariants, through ``pack``,
``select_packs`` (with carry) and ``pack_stream``."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from energon_packing.packing import (
    ALGORITHMS,
    CarryPolicy,
    Company,
    lower_bound,
    pack,
    pack_stream,
    select_packs,
)
from energon_packing.packing.company import group

A, P, N = Company.APART, Company.PLAIN, Company.ANY


def test_plain_samples_fill_an_apart_samples_pack_best_fit_longest_first():
    """capacity 10, longest plain first into the tightest room that holds it: r=4 into a=6's
    4 (not b=7's 3), p=3 into b's 3; q=2 finds no room and stays alone, as does the image
    conversation m."""
    lengths = [6, 3, 2, 4, 5, 7]
    company = [A, P, P, P, N, A]
    units = group(lengths, 10, company)
    assert units.members == [[0, 3], [2], [4], [5, 1]]
    assert units.lengths == [10, 2, 5, 10]  # an APART unit is costed as the capacity


def test_no_apart_sample_means_no_grouping():
    assert group([3, 4], 10, [P, N]) is None
    assert pack([6, 4], 10, company=[P, N]) == pack([6, 4], 10)


def test_max_per_pack_bounds_a_unit():
    units = group([2, 1, 1, 1], 10, [A, P, P, P], max_per_pack=2)
    assert units.members == [[0, 1], [2], [3]]


def test_an_apart_sample_never_packs_beside_media_or_another_apart_one():
    """Without the rule, the two halves and the image conversation would share packs."""
    lengths, company = [5, 5, 5, 5], [A, A, N, N]
    assert len(pack(lengths, 10)) == 2
    packs = pack(lengths, 10, company=company)
    assert sorted(map(sorted, packs)) == [[0], [1], [2, 3]]
    assert lower_bound(lengths, 10, company=company) == 3
    assert lower_bound(lengths, 10) == 2


def test_company_entries_are_checked():
    with pytest.raises(ValueError, match="company has 1 entries for 2 lengths"):
        pack([1, 2], 10, company=[A])
    with pytest.raises(ValueError, match="company entry 7 is none of ANY=0, PLAIN=1, APART=2"):
        pack([1, 2], 10, company=[A, 7])
    with pytest.raises(ValueError, match="company ends at position 1; lengths go on"):
        list(pack_stream([1, 2], 10, buffer_size=4, company=[A]))


@st.composite
def instances(draw):
    capacity = draw(st.integers(4, 64))
    n = draw(st.integers(0, 40))
    lengths = draw(st.lists(st.integers(1, capacity), min_size=n, max_size=n))
    company = draw(st.lists(st.sampled_from(list(Company)), min_size=n, max_size=n))
    per_pack = draw(st.none() | st.integers(1, 6))
    return lengths, company, capacity, per_pack


def check_packs(packs, lengths, company, capacity, per_pack):
    """Every index once; capacity and max_per_pack hold; an APART pack holds one APART
    sample and otherwise only PLAIN ones."""
    assert sorted(i for g in packs for i in g) == list(range(len(lengths)))
    for g in packs:
        assert g and sum(lengths[i] for i in g) <= capacity
        assert per_pack is None or len(g) <= per_pack
        kinds = [company[i] for i in g]
        if A in kinds:
            assert kinds.count(A) == 1 and set(kinds) <= {A, P}, kinds


@settings(max_examples=80, deadline=None)
@given(instance=instances(), algorithm=st.sampled_from(ALGORITHMS))
def test_every_algorithm_keeps_the_rule(instance, algorithm):
    lengths, company, capacity, per_pack = instance
    packs = pack(lengths, capacity, algorithm=algorithm, max_per_pack=per_pack, company=company)
    check_packs(packs, lengths, company, capacity, per_pack)
    assert len(packs) >= lower_bound(lengths, capacity, company=company)


@settings(max_examples=60, deadline=None)
@given(instance=instances(), counts=st.lists(st.integers(0, 3), min_size=40, max_size=40))
def test_a_select_round_with_carry_keeps_the_rule(instance, counts):
    lengths, company, capacity, per_pack = instance
    selection = select_packs(
        lengths,
        capacity,
        max_per_pack=per_pack,
        carry=CarryPolicy(),
        carry_counts=counts[: len(lengths)],
        company=company,
    )
    check_packs(
        selection.packs + [[i] for i in selection.carried], lengths, company, capacity, per_pack
    )


@settings(max_examples=60, deadline=None)
@given(instance=instances(), buffer=st.integers(1, 16), carry=st.booleans())
def test_the_stream_keeps_the_rule(instance, buffer, carry):
    lengths, company, capacity, per_pack = instance
    packs = list(
        pack_stream(
            lengths,
            capacity,
            buffer_size=buffer,
            carry=carry,
            max_per_pack=per_pack,
            company=company,
        )
    )
    check_packs(packs, lengths, company, capacity, per_pack)


def test_plain_text_in_apart_packs_saves_packs():
    """8 conversations with clips of 40 % of C, 24 text ones of 10 %: alone, the clips take 8
    packs and the text 3; with the rule the text rides in the clips' packs."""
    lengths = [40] * 8 + [10] * 24
    company = [A] * 8 + [P] * 24
    before = pack([100] * 8 + [10] * 24, 100)  # the rule this replaces: a clip costs C
    after = pack(lengths, 100, company=company)
    assert (len(before), len(after)) == (11, 8)
    assert lower_bound(lengths, 100, company=company) == 8


def test_the_tools_count_packs_under_the_rule():
    """``stats``' table (``tools.report.packing_table``) packs a measured split as the loader
    does: the text rides in the clips' packs, online and offline, and the bound is the rule's."""
    from energon_packing.tools.report import Measured, packing_table

    lengths = [40] * 8 + [10] * 24
    measured = Measured(
        keys=[str(i) for i in range(32)],
        costs=lengths,
        lengths=lengths,
        skipped={},
        capacity=100,
        company=[A] * 8 + [P] * 24,
    )
    rows = packing_table(measured, algorithms=["subset_fill"], buffers=[64], modes=["carry"])
    assert [(row.mode, row.packs, row.bound) for row in rows] == [
        ("carry", 8, 8),
        ("offline", 8, 8),
    ]
    measured.company = None  # every conversation ANY: 4 packs of 80 + 24 of 10 fill 6
    assert [row.packs for row in packing_table(measured, algorithms=["subset_fill"])][-1] == 6


def test_a_clips_pack_waits_for_text_where_text_is_plentiful():
    """capacity 100, a buffer of 8: a=50 takes t=30 and u=10 and holds 90. With 40 tokens of
    text (at least half its room of 50) it is carried to wait for more, as an under-full pack
    is; with text scarcer (a second clip of 90 adds to the room) both clips leave at once."""
    carry = CarryPolicy()
    plentiful = select_packs([50, 30, 10], 100, carry=carry, company=[A, P, P], buffer_size=8)
    assert plentiful.carried == [0, 1, 2] and plentiful.packs == []
    scarce = select_packs([50, 30, 10, 50], 100, carry=carry, company=[A, P, P, A], buffer_size=8)
    assert sorted(map(sorted, scarce.packs)) == [[0, 1, 2], [3]] and scarce.carried == []


def test_the_carry_budget_counts_samples_not_units():
    """budget 0.5 of a 4-sample buffer: 2 samples. The under-full unit [a, t] (2 samples) is
    carried; with budget 0.25 (1 sample) it is not, though it is one unit."""
    for budget, carried in ((0.5, [0, 1]), (0.25, [])):
        selection = select_packs(
            [50, 30, 100, 100],
            100,
            carry=CarryPolicy(budget=budget),
            company=[A, P, N, N],
            buffer_size=4,
        )
        assert selection.carried == carried, budget


def test_the_bound_counts_text_no_clips_pack_can_take():
    """capacity 100, a clip of 60 leaves 40: text of 50 shares no pack with it, nor with the
    image conversation of 60 (3 packs); text of 40 can (2 packs). Counted as text that fits
    anywhere, the bound would say 2 for both."""
    assert lower_bound([60, 50, 60], 100, company=[A, P, N]) == 3
    assert lower_bound([60, 40, 60], 100, company=[A, P, N]) == 2
