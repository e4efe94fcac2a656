"""The trainer-side shim: detection, validation, attention params, CP slicing, trainer packing."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from helpers import source

from energon_packing.schema import BOOKKEEPING_KEYS, PackContractError, collate, layout
from energon_packing.trainer import (
    MICRO_BATCH_INDICES,
    MICRO_BATCH_LENGTHS,
    check_model_inputs,
    cp_indices,
    is_prepacked,
    make_packed_seq_params,
    micro_batch_shapes,
    pack_microbatches,
    packed_seq_params_class,
    padded_microbatch,
    prepacked_microbatches,
    validate_prepacked,
)
from energon_packing.trainer.shim import LocalPackedSeqParams


def design_note_pack():
    """Two conversations, A = 5 tokens, B = 10, pad multiple 4, capacity 36 (the design
    note's worked example)."""
    pack = layout(
        [source("convA", [11] * 5, [1.0] * 5), source("convB", [12] * 10, [1.0] * 10)],
        width=36,
        pad_multiple=4,
        pad_id=0,
    )
    return {**collate([pack]), "__restore_key__": ("PackingDataset", 0)}


def ordinary_batch():
    """The same two conversations as a padded [2, 10] batch: what the trainer path packs."""
    ids = torch.zeros(2, 10, dtype=torch.long)
    ids[0, :5], ids[1, :10] = 11, 12
    mask = torch.zeros(2, 10)
    mask[0, 1:5], mask[1, 1:10] = 1.0, 1.0
    return {
        "input_ids": ids,
        "input_lengths": torch.tensor([5, 10]),
        "token_mask": mask,
        "position_ids": torch.arange(10).repeat(2, 1),
        "source_ids": [["convA"], ["convB"]],
    }


def test_detection_needs_both_boundary_keys():
    batch = design_note_pack()
    assert is_prepacked(batch)
    assert not is_prepacked(ordinary_batch())
    del batch["cu_seqlens_padded"]
    with pytest.raises(
        PackContractError,
        match=r"cu_seqlens_padded: .* has 'cu_seqlens' but no 'cu_seqlens_padded'.*convA",
    ):
        is_prepacked(batch)


def test_one_pack_per_microbatch_with_shapes_published():
    batch = design_note_pack()
    keys = set(batch)
    (mb,) = prepacked_microbatches(batch)
    assert set(batch) == keys  # the caller's batch is never mutated
    assert micro_batch_shapes([mb]) == {
        MICRO_BATCH_INDICES: [[[0, 1]]],
        MICRO_BATCH_LENGTHS: [[36]],
        "micro_batch_indices": [[[0, 1]]],  # NeMo-RL's sft_worker extra-info names
        "micro_batch_lengths": [[36]],
    }
    assert mb.model_inputs["input_ids"].shape == (1, 36) and mb.length == 36
    assert mb.source_ids == ["convA", "convB"] and mb.rows == (0,)
    # next-token targets: position t is trained on token t+1 with token t+1's weight
    assert mb.labels[0, :4].tolist() == [11] * 4
    assert mb.loss_mask[0].tolist() == [1.0] * 4 + [0.0] * 4 + [1.0] * 9 + [0.0] * 19


def test_bookkeeping_never_reaches_the_model():
    batch = design_note_pack()
    mbs = prepacked_microbatches(batch) + pack_microbatches(ordinary_batch(), token_budget=36)
    for mb in mbs + [padded_microbatch(ordinary_batch())]:
        assert not BOOKKEEPING_KEYS & set(mb.model_inputs)
        check_model_inputs(mb.model_inputs)
    with pytest.raises(PackContractError, match="source_ids: bookkeeping keys"):
        check_model_inputs({"input_ids": 1, "source_ids": []})


def test_boundary_modes():
    (padded,) = prepacked_microbatches(design_note_pack(), boundary="padded")
    p = padded.model_inputs["packed_seq_params"]
    assert p.qkv_format == "thd"
    assert p.cu_seqlens_q.tolist() == p.cu_seqlens_kv.tolist() == [0, 8, 36]
    assert p.cu_seqlens_q_padded.tolist() == p.cu_seqlens_kv_padded.tolist() == [0, 8, 36]
    assert p.max_seqlen_q == p.max_seqlen_kv == 28 and not padded.pad_between_seqs
    (real,) = prepacked_microbatches(design_note_pack(), boundary="real")
    r = real.model_inputs["packed_seq_params"]
    assert r.cu_seqlens_q.tolist() == r.cu_seqlens_kv.tolist() == [0, 5, 15]
    assert r.cu_seqlens_q_padded.tolist() == [0, 8, 36] and real.pad_between_seqs
    assert r.cu_seqlens_q.dtype == torch.int32
    with pytest.raises(ValueError, match="boundary='both' is not valid"):
        prepacked_microbatches(design_note_pack(), boundary="both")


def test_local_packed_seq_params_carry_nemo_rls_fields(monkeypatch):
    import energon_packing.trainer.shim as shim

    monkeypatch.setattr(shim, "packed_seq_params_class", lambda: LocalPackedSeqParams)
    padded = torch.tensor([0, 8, 36])
    real = make_packed_seq_params(torch.tensor([0, 5, 15]), padded, boundary="real", cp_size=2)
    # post-#4105 _prepare_prepacked (NeMo-RL data.py, code index 70877067287): q = real,
    # padded = padded, pad_between_seqs = real != padded, total_tokens = CP-local width
    assert real.cu_seqlens_q.tolist() == [0, 5, 15] and real.cu_seqlens_q_padded.tolist() == [
        0,
        8,
        36,
    ]
    assert real.pad_between_seqs is True and real.total_tokens == 18
    assert real.local_cp_size is None and real.max_seqlen_q == 28
    same = make_packed_seq_params(torch.tensor([0, 8, 36]), padded, boundary="real")
    assert same.pad_between_seqs is False and same.total_tokens == 36


def test_packed_seq_params_class_is_megatron_cores_when_installed():
    cls = packed_seq_params_class()
    try:
        from megatron.core.packed_seq_params import PackedSeqParams
    except ImportError:
        assert cls is LocalPackedSeqParams
    else:
        assert cls is PackedSeqParams
    local = {f.name for f in dataclasses.fields(LocalPackedSeqParams)}
    assert {f.name for f in dataclasses.fields(cls)} <= local
    params = make_packed_seq_params(torch.tensor([0, 5]), torch.tensor([0, 8]), boundary="real")
    assert getattr(params, "pad_between_seqs", True) is True


def test_context_parallel_chunks():
    padded = torch.tensor([0, 8, 16])
    # each source: 4 chunks of 2; rank 0 keeps chunks 0 and 3, rank 1 chunks 1 and 2
    assert cp_indices(padded, 2, 0).tolist() == [0, 1, 6, 7, 8, 9, 14, 15]
    assert cp_indices(padded, 2, 1).tolist() == [2, 3, 4, 5, 10, 11, 12, 13]
    assert cp_indices(padded, 1, 0).tolist() == list(range(16))
    with pytest.raises(
        PackContractError, match=r"padded length 6 does not split into 2\*cp_size=4"
    ):
        cp_indices(torch.tensor([0, 6, 16]), 2, 0)


def test_context_parallel_slices_a_prepacked_pack():
    batch = design_note_pack()
    (mb0,) = prepacked_microbatches(batch, cp_size=2, cp_rank=0, pad_multiple=4)
    (mb1,) = prepacked_microbatches(design_note_pack(), cp_size=2, cp_rank=1, pad_multiple=4)
    assert mb0.model_inputs["input_ids"].shape == mb1.model_inputs["input_ids"].shape == (1, 18)
    both = torch.cat([cp_indices(torch.tensor([0, 8, 36]), 2, r) for r in (0, 1)])
    assert sorted(both.tolist()) == list(range(36))
    params = mb0.model_inputs["packed_seq_params"]
    # as NeMo-RL's consumer: local_cp_size only with a cp_group; total_tokens = CP-local width
    assert params.local_cp_size is None and params.cp_group is None
    assert getattr(params, "total_tokens", 18) == 18
    (grouped,) = prepacked_microbatches(
        design_note_pack(), cp_size=2, cp_rank=0, pad_multiple=4, cp_group="group"
    )
    assert grouped.model_inputs["packed_seq_params"].local_cp_size == 2
    with pytest.raises(ValueError, match="pad_multiple=1 must be a multiple of 2\\*cp_size=4"):
        prepacked_microbatches(design_note_pack(), cp_size=2, cp_rank=0)


@pytest.mark.parametrize(
    "mutate, message",
    [
        (
            lambda b: b["cu_seqlens_padded"].__setitem__(0, torch.tensor([0, 8, 35])),
            "last entry 35 != pack width 36",
        ),
        (lambda b: b["source_ids"].append(["x"]), r"source_ids: 2 entries for 1 packs"),
        (
            lambda b: b.__setitem__("input_lengths", torch.tensor([15])),
            r"input_lengths: \[15\], a prepacked row always counts as 36",
        ),
        (
            lambda b: b["token_mask"].__setitem__((0, 8), 1.0),
            r"first token of source 1 \(position 8\) is trained",
        ),
    ],
)
def test_validation_names_key_numbers_and_sources(mutate, message):
    validate_prepacked(design_note_pack(), pad_multiple=4)
    batch = design_note_pack()
    mutate(batch)
    with pytest.raises(PackContractError, match=message) as info:
        prepacked_microbatches(batch)
    assert "convA" in str(info.value)


def test_trainer_side_pack_matches_the_design_note():
    (mb,) = pack_microbatches(
        ordinary_batch(), token_budget=36, pad_multiple=4, algorithm="concatenative"
    )
    assert mb.model_inputs["input_ids"].shape == (1, 20)  # as wide as the batch needs
    assert mb.cu_seqlens.tolist() == [0, 5, 15]
    assert mb.cu_seqlens_padded.tolist() == [0, 8, 20]
    assert mb.source_ids == ["convA", "convB"] and mb.rows == (0, 1)
    ids = mb.model_inputs["input_ids"][0]
    assert ids[:5].tolist() == [11] * 5 and ids[8:18].tolist() == [12] * 10
    (rounded,) = pack_microbatches(
        ordinary_batch(),
        token_budget=36,
        pad_multiple=4,
        pack_multiple=16,
        algorithm="concatenative",
    )
    assert rounded.cu_seqlens_padded.tolist() == [0, 8, 32]
    (largest_first,) = pack_microbatches(ordinary_batch(), token_budget=36, pad_multiple=4)
    assert largest_first.rows == (1, 0)  # rows in packer order, as NeMo-RL keeps them


def test_trainer_side_bins_by_budget_and_dp_multiple():
    assert [
        mb.rows for mb in pack_microbatches(ordinary_batch(), token_budget=12, pad_multiple=4)
    ] == [
        (1,),
        (0,),
    ]
    (both,) = pack_microbatches(ordinary_batch(), token_budget=36)
    assert both.rows == (1, 0)
    split = pack_microbatches(ordinary_batch(), token_budget=36, dp_size=2)
    assert sorted(mb.rows for mb in split) == [(0,), (1,)]
    with pytest.raises(ValueError, match="2 rows cannot fill a multiple of dp_size=3 bins"):
        pack_microbatches(ordinary_batch(), token_budget=36, dp_size=3)
    with pytest.raises(
        ValueError, match=r"row 1 \(\['convB'\]\) needs 12 tokens padded, more than token_budget=8"
    ):
        pack_microbatches(ordinary_batch(), token_budget=8, pad_multiple=4)


def test_no_packing_keeps_padded_rows():
    mb = padded_microbatch(ordinary_batch())
    assert mb.model_inputs["input_ids"].shape == (2, 10)
    assert mb.model_inputs["packed_seq_params"] is None
    assert mb.valid_tokens == 4 + 9


def test_validation_counts_image_tokens_when_asked():
    pack = layout(
        [
            source("img", [1, 3, 5, 5, 5, 5, 4, 9], [0] * 7 + [1], grids=[(1, 4, 4)]),
            source("txt", [1, 9, 9], [0, 1, 1]),
        ],
        width=16,
        pad_multiple=1,
        pad_id=0,
    )
    batch = {
        "input_ids": torch.from_numpy(pack.input_ids)[None],
        "token_mask": torch.from_numpy(pack.token_mask)[None],
        "cu_seqlens": [torch.from_numpy(pack.cu_seqlens)],
        "cu_seqlens_padded": [torch.from_numpy(pack.cu_seqlens_padded)],
        "source_ids": [pack.source_ids],
        "image_grid_thw": [torch.tensor([[1, 4, 8]])],  # claims 8 image tokens, the row has 4
        "image_source_index": [torch.from_numpy(pack.image_source_index)],
    }
    validate_prepacked(batch)  # without image_pad_id the counts are not checked
    with pytest.raises(
        PackContractError, match=r"source 0 \(img\) has 4 image-pad tokens, its images need 8"
    ):
        validate_prepacked(batch, image_pad_id=5)


# Facts from NeMo-RL's packers (nemo_rl/data/packing/algorithms.py at 7ea279a; the outputs
# below were produced by that code and are what our bins must reproduce).
NEMO_RL_BINS = [
    # FFD visits (length, index) descending: equal lengths, higher index first
    ("first_fit_decreasing", [5, 5, 3, 3, 2, 2], 8, 1, [[1, 3], [0, 2], [5, 4]]),
    # _adjust_bin_count: the bin with the most rows gives its last row to each new bin
    ("concatenative", [4, 4, 4, 4], 16, 2, [[0, 1, 2], [3]]),
    ("first_fit_decreasing", [4, 4, 4, 4], 16, 2, [[3, 2, 1], [0]]),
    # MFFD: large bins take the largest medium that fits, then greedy fill, leftovers
    ("modified_first_fit_decreasing", [60, 40, 30, 20, 10, 10], 100, 1, [[0, 1], [2, 3, 4, 5]]),
    ("modified_first_fit_decreasing", [55, 52, 20, 18, 17, 5], 100, 1, [[0, 3, 5], [1, 4, 2]]),
    (
        "modified_first_fit_decreasing",
        [70, 35, 34, 25, 24, 12, 11, 9],
        100,
        2,
        [[0, 3], [5, 6, 7], [1, 2], [4]],
    ),
]


@pytest.mark.parametrize("algorithm, lengths, capacity, dp, expected", NEMO_RL_BINS)
def test_trainer_bins_are_nemo_rls(algorithm, lengths, capacity, dp, expected):
    from energon_packing.packing.trainer_bins import trainer_bins

    assert trainer_bins(lengths, capacity, algorithm=algorithm, dp_size=dp) == expected


def test_pipeline_parallel_pads_every_bin_to_the_largest():
    mbs = pack_microbatches(ordinary_batch(), token_budget=12, pad_multiple=4)
    assert [mb.length for mb in mbs] == [12, 8]
    padded = pack_microbatches(
        ordinary_batch(), token_budget=12, pad_multiple=4, pad_to_largest=True
    )
    assert [mb.length for mb in padded] == [12, 12]
    assert padded[1].cu_seqlens_padded.tolist() == [0, 12]  # the tail folds into the row
