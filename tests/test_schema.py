"""The pack schema: the layout function on the contract's worked example, mRoPE positions,
invariants under hypothesis, contract errors, collation."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from helpers import source
from hypothesis import given, settings
from hypothesis import strategies as st

from energon_packing.encoding.positions import MRope, mrope_positions
from energon_packing.schema import (
    IMAGE_GRID_THW,
    PackContractError,
    Source,
    check_pack,
    collate,
    layout,
    pack_from_batch,
)


def test_worked_example_from_the_contract():
    a = source("convA", [11] * 5, [1.0] * 5)
    b = source("convB", [12] * 10, [1.0] * 10)
    pack = layout([a, b], width=36, pad_multiple=4, pad_id=0)
    assert pack.input_ids.tolist() == [11] * 5 + [0] * 3 + [12] * 10 + [0] * 18
    assert pack.cu_seqlens.tolist() == [0, 5, 15]
    assert pack.cu_seqlens_padded.tolist() == [0, 8, 36]
    assert pack.source_ids == ["convA", "convB"]
    assert pack.token_mask.tolist() == [0] + [1] * 4 + [0] * 3 + [0] + [1] * 9 + [0] * 18
    assert pack.position_ids.tolist() == list(range(8)) + list(range(28))
    assert pack.padding_mask.tolist() == [False] * 5 + [True] * 3 + [False] * 10 + [True] * 18
    assert pack.cu_seqlens.dtype == np.int32 and pack.input_ids.dtype == np.int64
    assert pack.media[IMAGE_GRID_THW].shape == (0, 3) and pack.image_source_index.shape == (0,)


def test_token_fields_pad_with_their_sources_fill():
    """A token field is 0 on the padding behind a source, or what that source names
    (``token_fill``: PaliGemma's ``token_type_ids`` 1, its answer's type), the tail included;
    a source without the field gives zeros."""
    prefix = Source(
        key="a",
        input_ids=[5] * 5,
        token_mask=[1.0] * 5,
        token_fields={"token_type_ids": np.array([0, 0, 0, 1, 1])},
        token_fill={"token_type_ids": 1},
    )
    plain = Source(key="b", input_ids=[6] * 3, token_mask=[1.0] * 3)
    last = dataclasses.replace(prefix, key="c", token_fields={"token_type_ids": np.zeros(5)})
    pack = layout([prefix, plain, last], width=24, pad_multiple=4, pad_id=0)
    assert pack.token_fields["token_type_ids"].tolist() == (
        [0, 0, 0, 1, 1, 1, 1, 1] + [0] * 4 + [0] * 5 + [1] * 7
    )


def test_images_keep_their_owner():
    spec = MRope(vision_start_id=3, image_pad_id=5)
    a = source("a", [1, 3, 5, 5, 5, 5, 4, 9], [0] * 7 + [1], grids=[(1, 4, 4)], mrope=spec)
    b = source("b", [1, 9, 9], [0, 1, 1], mrope=spec)
    c = source("c", [1, 3, 5, 4, 9], [0, 0, 0, 0, 1], grids=[(1, 2, 2)], mrope=spec)
    pack = layout([a, b, c], width=32, pad_multiple=2, pad_id=0)
    assert pack.image_source_index.tolist() == [0, 2]
    assert pack.media[IMAGE_GRID_THW].tolist() == [[1, 4, 4], [1, 2, 2]]
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
    a = source("a", [1] * 20, [1] * 20)
    with pytest.raises(ValueError, match="'a' .* does not fit at offset 0 of a 16-token pack"):
        layout([a], width=16, pad_multiple=1, pad_id=0)


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
        sources.append(source(f"s{k}", [100 + k] * length, mask))
        used += -(-length // pad_multiple) * pad_multiple
    return sources, capacity, pad_multiple


@settings(max_examples=300, deadline=None)
@given(group=groups())
def test_any_group_that_fits_meets_every_invariant(group):
    sources, capacity, pad_multiple = group
    if not sources:
        return
    pack = layout(sources, width=capacity, pad_multiple=pad_multiple, pad_id=0)
    pack.check(pad_multiple=pad_multiple)
    assert pack.input_ids.shape == (capacity,)
    real = np.diff(pack.cu_seqlens)
    for k, (item, start) in enumerate(zip(sources, pack.cu_seqlens_padded[:-1])):
        assert real[k] == len(item.input_ids)
        assert pack.input_ids[start : start + real[k]].tolist() == list(item.input_ids)
        assert pack.position_ids[start] == 0  # positions restart per source
        assert pack.token_mask[start] == 0


def _pack():
    return layout(
        [source("a", [1] * 5, [1.0] * 5), source("b", [2] * 6, [1.0] * 6)],
        width=16,
        pad_multiple=2,
        pad_id=0,
    )


@pytest.mark.parametrize(
    "overrides, knobs, message",
    [
        (dict(cu_seqlens_padded=np.array([0, 6, 15])), {}, r"last entry 15 != pack width 16"),
        (dict(cu_seqlens=np.array([0, 5, 5])), {}, r"strictly increasing"),
        (
            dict(cu_seqlens=np.array([0, 7, 13])),
            {},
            r"source 0 has 7 real tokens but a padded extent of 6",
        ),
        (
            dict(cu_seqlens_padded=np.array([0, 5, 16])),
            {},
            r"source 0 padded to 5, not a multiple of pad_multiple=2",
        ),
        (dict(source_ids=["a"]), {}, r"1 ids for 2 sources"),
        (
            dict(token_mask=np.ones(16, dtype=np.float32)),
            {},
            r"first token of source 0 .* is trained",
        ),
        (
            {},
            dict(cp_size=2),
            r"source 0 has padded length 6, not divisible by 2\*cp_size=4; set pad_multiple",
        ),
    ],
)
def test_contract_errors_name_key_numbers_and_sources(overrides, knobs, message):
    check_pack(_pack(), pad_multiple=2)
    with pytest.raises(PackContractError, match=message) as info:
        check_pack(dataclasses.replace(_pack(), **overrides), pad_multiple=2, **knobs)
    assert "source_ids=['a', 'b']" in str(info.value) or "source_ids=['a']" in str(info.value)


def test_collate_and_back_is_the_same_pack():
    spec = MRope(vision_start_id=3, image_pad_id=5)
    packs = [
        layout(
            [source("a", [1, 3, 5, 4, 9], [0, 0, 0, 0, 1], grids=[(1, 2, 2)], mrope=spec)],
            width=8,
            pad_multiple=1,
            pad_id=0,
        ),
        layout([source("b", [7, 8], [0, 1], mrope=spec)], width=8, pad_multiple=1, pad_id=0),
    ]
    batch = collate(packs)
    assert batch["input_ids"].shape == (2, 8) and batch["position_ids"].shape == (3, 2, 8)
    assert batch["input_lengths"].tolist() == [8, 8] and batch["sample_mask"].tolist() == [1, 1]
    for row, pack in enumerate(packs):
        back = pack_from_batch(batch, row)
        for name in ("input_ids", "token_mask", "position_ids", "cu_seqlens", "image_source_index"):
            assert np.array_equal(getattr(back, name), getattr(pack, name)), name
        assert np.array_equal(back.media[IMAGE_GRID_THW], pack.media[IMAGE_GRID_THW])
    rows = collate(packs, prepacked=False)
    assert "cu_seqlens" not in rows and rows["input_lengths"].tolist() == [5, 2]


def test_media_that_are_pieces_of_one_array_are_joined_without_a_copy():
    """One image-processor call for a whole pack: its sources' pixels are consecutive views of
    one array, and the pack's are that array again (no copy); any other parts are copied, with
    the same values."""
    pixels = np.arange(60, dtype=np.float32).reshape(10, 6)

    def piece(key, rows):
        return Source(
            key=key,
            input_ids=[1, 2, 3],
            token_mask=[0, 1, 1],
            images=1,
            media={"pixel_values": rows},
        )

    pack = layout(
        [piece("a", pixels[0:4]), piece("b", pixels[4:10])], width=8, pad_multiple=1, pad_id=0
    )
    assert np.shares_memory(pack.media["pixel_values"], pixels)
    assert np.array_equal(pack.media["pixel_values"], pixels)
    gap = layout(
        [piece("a", pixels[0:4]), piece("b", pixels[6:10])], width=8, pad_multiple=1, pad_id=0
    )
    assert not np.shares_memory(gap.media["pixel_values"], pixels)
    assert np.array_equal(gap.media["pixel_values"], np.concatenate([pixels[:4], pixels[6:]]))
    swapped = layout(
        [piece("b", pixels[4:10]), piece("a", pixels[0:4])], width=8, pad_multiple=1, pad_id=0
    )
    assert np.array_equal(swapped.media["pixel_values"], np.concatenate([pixels[4:], pixels[:4]]))
    other = np.arange(60, dtype=np.float32).reshape(10, 6)
    mixed = layout(
        [piece("a", pixels[0:4]), piece("b", other[4:10])], width=8, pad_multiple=1, pad_id=0
    )
    assert not np.shares_memory(mixed.media["pixel_values"], other)
    assert np.array_equal(mixed.media["pixel_values"], pixels)
