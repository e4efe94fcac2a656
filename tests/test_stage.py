"""Carry and balanced emission inside the real Energon loader."""

from __future__ import annotations

import dataclasses
import itertools
import random

import pytest
import torch
from helpers import loader_batches, make_dataset
from megatron.energon import stateless

from energon_packing import EncodedConversation, PackingTaskEncoder
from energon_packing.packing.algorithms import lower_bound, pack_stream
from energon_packing.packing.balance import (
    HISTORY,
    RecentCosts,
    attention_cost,
    imbalance,
    pick,
    target_quantile,
)
from energon_packing.testing.synth import sized_conversations

#: full-size variants run under -m slow (.ci/run runs them); the default set keeps one
S = pytest.mark.slow

#: the loader tests .ci/run also runs on the oldest supported Energon release
pytestmark = pytest.mark.energon

CAPACITY = 1024


def _lengths(n, seed):
    rng = random.Random(seed)
    return [min(CAPACITY, max(17, int(rng.lognormvariate(5.3, 1.0)))) for _ in range(n)]


LENGTHS = _lengths(360, seed=3)
KEYS = [f"sized{i:07d}" for i in range(len(LENGTHS))]


@pytest.fixture(scope="module")
def sized_dataset(tmp_path_factory):
    return make_dataset(
        tmp_path_factory.mktemp("sized"), sized_conversations(LENGTHS), per_shard=120
    )


def packs_of(batches):
    return [batch["source_ids"][0] for batch in batches]


def stream_order(path):
    """The order in which the loader reads the split (workers=0, no shuffle)."""
    te = PackingTaskEncoder(tokenizer="bundled", max_input_seq_length=CAPACITY, unpacked=True)
    return [
        keys[0]
        for b in loader_batches(path, te, buffer=None, batch_size=1)
        for keys in b["source_ids"]
    ]


@pytest.mark.parametrize(
    "carry, window",
    [(False, 0), (True, 5), pytest.param(True, 0, marks=S), pytest.param(False, 5, marks=S)],
)
def test_loader_runs_exactly_the_pack_stream_logic(sized_dataset, carry, window):
    """Energon's own stage (carry and balancing off) and our stage (on) emit exactly the packs
    of the pure ``pack_stream`` over the same read order: one buffer loop."""
    order = stream_order(sized_dataset)
    cost = dict(zip(KEYS, LENGTHS))
    te = PackingTaskEncoder(
        tokenizer="bundled", max_input_seq_length=CAPACITY, carry=carry, balance_window=window
    )
    loader_packs = packs_of(loader_batches(sized_dataset, te, buffer=24))
    stream = pack_stream(
        [cost[k] for k in order],
        CAPACITY,
        buffer_size=24,
        carry=te.config.carry_policy or False,
        balance_window=window,
    )
    assert loader_packs == [[order[i] for i in group] for group in stream]


def test_carry_beats_energons_chunking_through_the_loader(sized_dataset):
    chunk = packs_of(
        loader_batches(
            sized_dataset,
            PackingTaskEncoder(tokenizer="bundled", max_input_seq_length=CAPACITY),
            buffer=16,
        )
    )
    te = PackingTaskEncoder(tokenizer="bundled", max_input_seq_length=CAPACITY, carry=True)
    carried = packs_of(loader_batches(sized_dataset, te, buffer=16))
    bound = lower_bound(LENGTHS, CAPACITY)
    assert bound <= len(carried) < len(chunk)
    assert sorted(k for p in carried for k in p) == sorted(KEYS)
    metrics = te.stats.metrics()
    assert metrics["packing/carry/events"] > 0
    assert 1 <= metrics["packing/carry/held_rounds_max"] <= te.config.max_carries


# workers 2 with carry: also test_reliability's accounting test, in the default set
@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_carry_exactly_once_over_ranks_and_workers(sized_dataset, workers):
    seen = []
    for rank in range(2):
        te = PackingTaskEncoder(
            tokenizer="bundled", max_input_seq_length=CAPACITY, carry=True, max_carries=2
        )
        for batch in loader_batches(
            sized_dataset, te, buffer=12, workers=workers, rank=rank, world_size=2
        ):
            seen.extend(batch["source_ids"][0])
    assert len(seen) == len(set(seen)) == len(KEYS)
    assert set(seen) == set(KEYS)


def find(state, name, *, parent=False):
    """Values of a field anywhere in a (nested) loader state (``parent``: the dicts holding
    it)."""
    if isinstance(state, dict):
        for key, value in state.items():
            if key == name:
                yield state if parent else value
            yield from find(value, name, parent=parent)
    elif isinstance(state, (list, tuple)):
        for value in state:
            yield from find(value, name, parent=parent)
    elif dataclasses.is_dataclass(state):
        for f in dataclasses.fields(state):
            yield from find(getattr(state, f.name), name, parent=parent)


@pytest.mark.parametrize("balance_window", [pytest.param(0, marks=S), 4])
def test_restore_while_samples_are_carried(sized_dataset, balance_window):
    knobs = dict(
        max_input_seq_length=CAPACITY,
        tokenizer="bundled",
        carry=True,
        balance_window=balance_window,
    )
    loader = loader_batches(sized_dataset, PackingTaskEncoder(**knobs), buffer=16, savable=True)
    it = iter(loader)
    checkpoints = []
    for step in range(12):
        next(it)
        if step in (2, 6, 9):
            checkpoints.append(loader.save_state_rank())
    carried_at = [
        sum(len(loop["carry_counts"]) for loop in find(state, "_loop_state"))
        for state in checkpoints
    ]
    assert any(carried_at), "no checkpoint was taken while samples were carried"
    reference = [
        packs_of([b])
        for b in itertools.islice(
            iter(loader_batches(sized_dataset, PackingTaskEncoder(**knobs), buffer=16)), 40
        )
    ]
    for state, step in zip(checkpoints, (2, 6, 9)):
        restored = loader_batches(
            sized_dataset, PackingTaskEncoder(**knobs), buffer=16, savable=True
        )
        restored.restore_state_rank(state)
        got = [packs_of([b]) for b in itertools.islice(iter(restored), 6)]
        assert got == reference[step + 1 : step + 7]


def test_balance_rule_pieces():
    assert attention_cost([3, 4]) == 25
    # the shared targets: a golden-ratio sequence, evenly spread over [0, 1)
    targets = [target_quantile(t) for t in range(100)]
    assert targets == [target_quantile(t) for t in range(100)]
    assert all(0 <= q < 1 for q in targets)
    assert max(sum(1 for q in targets if k / 10 <= q < (k + 1) / 10) for k in range(10)) <= 11
    assert target_quantile(0, seed=1) != target_quantile(0, seed=0)
    assert pick([100, 400, 1600], 500) == 1  # nearest on a log scale (ties: earliest)
    assert pick([100, 400, 1600], 1000) == 2
    recent = RecentCosts()
    for cost in range(HISTORY + 10):
        recent.add(cost)
    assert len(recent.costs) == HISTORY and recent.costs[0] == 10
    assert recent.quantile(0.0) == 10 and recent.quantile(0.999999) == HISTORY + 9
    assert RecentCosts(recent.costs).quantile(0.5) == recent.quantile(0.5)
    assert imbalance([[1, 1], [3, 1]]) == pytest.approx((1 + 1.5) / 2)


def test_balance_reorders_without_changing_the_packs(sized_dataset):
    plain = packs_of(
        loader_batches(
            sized_dataset,
            PackingTaskEncoder(tokenizer="bundled", max_input_seq_length=CAPACITY),
            buffer=32,
        )
    )
    te = PackingTaskEncoder(tokenizer="bundled", max_input_seq_length=CAPACITY, balance_window=6)
    balanced = packs_of(loader_batches(sized_dataset, te, buffer=32))
    assert balanced != plain
    assert sorted(map(tuple, balanced)) == sorted(map(tuple, plain))


@pytest.mark.slow
def test_balanced_emission_evens_out_ranks(tmp_path):
    lengths = _lengths(2400, seed=9)
    path = make_dataset(tmp_path, sized_conversations(lengths), per_shard=600)
    ranks = 4

    def step_costs(**knobs):
        per_rank = []
        for rank in range(ranks):
            te = PackingTaskEncoder(
                tokenizer="bundled", max_input_seq_length=CAPACITY, carry=True, **knobs
            )
            batches = loader_batches(path, te, buffer=64, rank=rank, world_size=ranks)
            per_rank.append(
                [attention_cost(torch.diff(b["cu_seqlens"][0]).tolist()) for b in batches]
            )
        return per_rank

    plain, balanced = step_costs(), step_costs(balance_window=32, seed=3)
    assert [len(c) for c in plain] == [len(c) for c in balanced]  # same pack count per rank

    def score(per_rank):
        steps = min(len(c) for c in per_rank)
        return imbalance([[c[t] for c in per_rank] for t in range(steps)])

    # measured: 1.57 in selection order, 1.10 balanced (4 ranks, 64-sample buffer, pool 32)
    assert score(balanced) < 1.2 < score(plain) - 0.2


def test_carry_and_balance_knobs_validate():
    with pytest.raises(ValueError, match="balance_window must be an integer >= 0"):
        PackingTaskEncoder(tokenizer="bundled", max_input_seq_length=64, balance_window=-1)
    with pytest.raises(ValueError, match="budget must be within"):
        PackingTaskEncoder(
            tokenizer="bundled", max_input_seq_length=64, carry=True, carry_budget=1.5
        )


class HalvingTaskEncoder(PackingTaskEncoder):
    """A subclass with Energon's ``postencode_sample`` hook: halves each member's loss weight."""

    @stateless
    def postencode_sample(self, sample):
        assert isinstance(sample, EncodedConversation), type(sample).__name__  # before the pack
        sample.token_mask = sample.token_mask * 0.5
        return sample


@pytest.mark.parametrize("carry", [pytest.param(False, marks=pytest.mark.slow), True])
def test_postencode_sample_runs_on_each_member_before_its_pack(sized_dataset, carry):
    """As Energon's PackingDataset does (carry=False), so does the carry stage: a subclass's
    postencode_sample sees each member before pack_selected_samples, once; and a restore
    (its sample index is saved) goes on with the same packs."""
    knobs = dict(max_input_seq_length=CAPACITY, tokenizer="bundled", carry=carry)
    base = list(itertools.islice(loader_batches(sized_dataset, PackingTaskEncoder(**knobs)), 5))
    loader = loader_batches(sized_dataset, HalvingTaskEncoder(**knobs), savable=True)
    halved = list(itertools.islice(iter(loader), 3))
    state = loader.save_state_rank()
    halved += list(itertools.islice(loader, 2))
    assert packs_of(halved) == packs_of(base)
    for a, b in zip(base, halved):
        assert torch.equal(b["token_mask"], a["token_mask"] * 0.5)
    restored = loader_batches(sized_dataset, HalvingTaskEncoder(**knobs), savable=True)
    restored.restore_state_rank(state)
    again = list(itertools.islice(restored, 2))
    assert packs_of(again) == packs_of(halved[3:])
    assert all(torch.equal(a["token_mask"], b["token_mask"]) for a, b in zip(again, halved[3:]))


def test_the_carry_stage_saves_what_energons_packing_dataset_saves(sized_dataset):
    from megatron.energon.wrappers import PackingDataset

    from energon_packing.loader.energon import CarryPackingDataset

    assert set(PackingDataset._savable_fields) < set(CarryPackingDataset._savable_fields)
    knobs = dict(max_input_seq_length=CAPACITY, tokenizer="bundled", carry=True, balance_window=4)
    loader = loader_batches(sized_dataset, PackingTaskEncoder(**knobs), savable=True)
    it = iter(loader)
    next(it), next(it)
    (stage,) = find(loader.save_state_rank(), "_loop_state", parent=True)
    assert stage["__class__"] == "CarryPackingDataset"
    assert set(PackingDataset._savable_fields) <= set(stage)
    assert stage["_pre_packing_lengths"] == stage["_loop_state"]["pending"] != []
