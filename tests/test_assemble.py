"""Pack assembly: the contract's worked example, mRoPE positions, invariants under hypothesis."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from energon_packing.assemble import MRope, SourceTokens, assemble, mrope_positions
from energon_packing.contract import PackContractError, check_pack


def test_worked_example_from_the_contract():
    a = SourceTokens(key="convA", input_ids=[11] * 5, token_mask=[1.0] * 5)
    b = SourceTokens(key="convB", input_ids=[12] * 10, token_mask=[1.0] * 10)
    pack = assemble([a, b], capacity=36, pad_multiple=4, pad_id=0)
    assert pack.input_ids.tolist() == [11] * 5 + [0] * 3 + [12] * 10 + [0] * 18
    assert pack.cu_seqlens.tolist() == [0, 5, 15]
    assert pack.cu_seqlens_padded.tolist() == [0, 8, 36]
    assert pack.source_ids == ["convA", "convB"]
    assert pack.token_mask.tolist() == [0] + [1] * 4 + [0] * 3 + [0] + [1] * 9 + [0] * 18
    assert pack.position_ids.tolist() == list(range(8)) + list(range(28))
    assert pack.padding_mask.tolist() == [False] * 5 + [True] * 3 + [False] * 10 + [True] * 18
    assert pack.cu_seqlens.dtype == np.int32 and pack.input_ids.dtype == np.int64
    assert pack.image_grid_thw.shape == (0, 3)


def test_images_keep_their_owner():
    spec = MRope(vision_start_id=3, image_pad_id=5)
    a = SourceTokens(
        key="a", input_ids=[1, 3, 5, 5, 5, 5, 4, 9], token_mask=[0] * 7 + [1], grids=[(1, 4, 4)]
    )
    b = SourceTokens(key="b", input_ids=[1, 9, 9], token_mask=[0, 1, 1])
    c = SourceTokens(
        key="c", input_ids=[1, 3, 5, 4, 9], token_mask=[0, 0, 0, 0, 1], grids=[(1, 2, 2)]
    )
    pack = assemble([a, b, c], capacity=32, pad_multiple=2, pad_id=0, mrope=spec)
    assert pack.image_source_index.tolist() == [0, 2]
    assert pack.image_grid_thw.tolist() == [[1, 4, 4], [1, 2, 2]]
    assert pack.position_ids.shape == (3, 32)


def test_mrope_positions_by_hand():
    spec = MRope(vision_start_id=3, image_pad_id=5)
    # t0 t1 <vs> 4 pads (grid 1x4x4 -> merged 2x2) <ve> t2
    ids = [7, 7, 3, 5, 5, 5, 5, 4, 7]
    positions = mrope_positions(ids, [(1, 4, 4)], spec)
    assert positions.tolist() == [
        [0, 1, 2, 3, 3, 3, 3, 5, 6],  # t: the image is one time step
        [0, 1, 2, 3, 3, 4, 4, 5, 6],  # h: rows of the merged grid
        [0, 1, 2, 3, 4, 3, 4, 5, 6],  # w: columns
    ]


def test_source_that_does_not_fit_is_refused():
    a = SourceTokens(key="a", input_ids=[1] * 20, token_mask=[1] * 20)
    with pytest.raises(ValueError, match="'a' .* does not fit at offset 0 of a 16-token pack"):
        assemble([a], capacity=16, pad_multiple=1, pad_id=0)


@st.composite
def groups(draw):
    pad_multiple = draw(st.sampled_from([1, 2, 4, 8]))
    capacity = pad_multiple * draw(st.integers(1, 40))
    sources, used = [], 0
    for k in range(draw(st.integers(1, 6))):
        room = capacity - used
        if room < 1:
            break
        length = draw(st.integers(1, room))
        if used + -(-length // pad_multiple) * pad_multiple > capacity:
            break
        mask = draw(st.lists(st.floats(0, 2, allow_nan=False), min_size=length, max_size=length))
        sources.append(SourceTokens(key=f"s{k}", input_ids=[100 + k] * length, token_mask=mask))
        used += -(-length // pad_multiple) * pad_multiple
    return sources, capacity, pad_multiple


@settings(max_examples=300, deadline=None)
@given(group=groups())
def test_any_group_that_fits_meets_every_invariant(group):
    sources, capacity, pad_multiple = group
    if not sources:
        return
    pack = assemble(sources, capacity=capacity, pad_multiple=pad_multiple, pad_id=0, check=False)
    pack.check(pad_multiple=pad_multiple)
    assert pack.input_ids.shape == (capacity,)
    real = np.diff(pack.cu_seqlens)
    for k, (source, start) in enumerate(zip(sources, pack.cu_seqlens_padded[:-1])):
        assert real[k] == len(source.input_ids)
        assert pack.input_ids[start : start + real[k]].tolist() == list(source.input_ids)
        assert pack.position_ids[start] == 0  # positions restart per source
        assert pack.token_mask[start] == 0


def _pack(**overrides):
    pack = assemble(
        [
            SourceTokens(key="a", input_ids=[1] * 5, token_mask=[1.0] * 5),
            SourceTokens(key="b", input_ids=[2] * 6, token_mask=[1.0] * 6),
        ],
        capacity=16,
        pad_multiple=2,
        pad_id=0,
    )
    fields = dict(
        input_ids=pack.input_ids,
        token_mask=pack.token_mask,
        cu_seqlens=pack.cu_seqlens,
        cu_seqlens_padded=pack.cu_seqlens_padded,
        source_ids=pack.source_ids,
        padding_mask=pack.padding_mask,
        pad_multiple=2,
    )
    fields.update(overrides)
    return fields


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(cu_seqlens_padded=np.array([0, 6, 15])), r"last entry 15 != pack width 16"),
        (dict(cu_seqlens=np.array([0, 5, 5])), r"strictly increasing"),
        (
            dict(cu_seqlens=np.array([0, 7, 13])),
            r"source 0 has 7 real tokens but a padded extent of 6",
        ),
        (
            dict(cu_seqlens_padded=np.array([0, 5, 16])),
            r"source 0 padded to 5, not a multiple of pad_multiple=2",
        ),
        (dict(source_ids=["a"]), r"1 ids for 2 sources"),
        (dict(token_mask=np.ones(16, dtype=np.float32)), r"first token of source 0 .* is trained"),
        (
            dict(cp_size=2),
            r"source 0 has padded length 6, not divisible by 2\*cp_size=4; set pad_multiple",
        ),
    ],
)
def test_contract_errors_name_key_numbers_and_sources(overrides, message):
    with pytest.raises(PackContractError, match=message) as info:
        check_pack(**_pack(**overrides))
    assert "source_ids=['a', 'b']" in str(info.value) or "source_ids=['a']" in str(info.value)
