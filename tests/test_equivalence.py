"""The attention kernel cannot tell loader packs from trainer packs.

For packs of the sample data (conversations with and without images: a 6-pack subset in the
default run, 50 packs in the ``slow`` set that ``.ci/run`` adds), the per-token logits of every
conversation are identical (float64, atol 1e-9) when computed (a) alone, unpacked; (b) in a trainer-side pack; (c) in a loader pack, boundary mode "padded";
(d) in a loader pack, boundary mode "real"; (e) with context parallelism 2 as two real
torch.distributed processes (gloo, loopback). The token loss normalised by the global count of
valid tokens is identical across (a)-(d). The model attends conversation by conversation, as a
varlen kernel does (``tests/test_bench.py`` proves that equal to the masked row).
"""

from __future__ import annotations

import itertools

import pytest
import torch
from helpers import SAMPLE_DATA, loader_batches, spawn_ranks

from energon_packing import PackingTaskEncoder
from energon_packing.testing.model import TinyConfig, TinyVLM
from energon_packing.trainer import (
    pack_microbatches,
    padded_microbatch,
    prepacked_microbatches,
    token_loss,
)

CAPACITY = 1024
ATOL = 1e-9


def per_source(logits, mb):
    """Real-token logits of each conversation of a packed microbatch, by key."""
    out = {}
    for k, key in enumerate(mb.source_ids):
        start = int(mb.cu_seqlens_padded[k])
        n = int(mb.cu_seqlens[k + 1] - mb.cu_seqlens[k])
        out[key] = logits[start : start + n]
    return out


def single_row(batch, r):
    one = {key: batch[key][r : r + 1] for key in ("input_ids", "input_lengths", "token_mask")}
    one["position_ids"] = batch["position_ids"][..., r : r + 1, :]
    for key in ("pixel_values", "image_grid_thw", "source_ids"):
        one[key] = [batch[key][r]]
    return one


@pytest.fixture(
    scope="module",
    params=[
        pytest.param((False, 12), id="rope-subset", marks=pytest.mark.slow),  # mrope covers more
        pytest.param((True, 6), id="mrope-subset"),
        pytest.param((False, 50), id="rope-full", marks=pytest.mark.slow),
        pytest.param((True, 50), id="mrope-full", marks=pytest.mark.slow),
    ],
)
def setup(request):
    mrope, count = request.param
    te = PackingTaskEncoder(
        tokenizer="bundled", max_input_seq_length=CAPACITY, pad_multiple=4, mrope=mrope
    )
    config = dict(vocab_size=te.tokenizer.vocab_size, mrope_section=(2, 3, 3) if mrope else None)
    model = TinyVLM(TinyConfig(**config), seed=0, dtype=torch.float64).eval()
    packs = list(itertools.islice(loader_batches(SAMPLE_DATA, te, buffer=16), count))
    return te, model, config, packs


def test_loader_packs_trainer_packs_and_unpacked_agree(setup):
    te, model, _, packs = setup
    image = te.tokenizer.special.image_pad
    wanted = {key for batch in packs for key in batch["source_ids"][0]}
    assert sum(len(b["image_grid_thw"][0]) > 0 for b in packs) >= len(packs) // 2
    assert len(wanted) > 2 * len(packs)

    reference, trainer_side = {}, {}
    losses = dict.fromkeys("abcd", 0.0)
    rows_seen = 0
    with torch.no_grad():
        plain = PackingTaskEncoder(
            tokenizer="bundled",
            max_input_seq_length=CAPACITY,
            pad_multiple=4,
            mrope=te.config.mrope,
            unpacked=True,
        )
        for batch in loader_batches(SAMPLE_DATA, plain, buffer=None, batch_size=8):
            keep = [r for r, keys in enumerate(batch["source_ids"]) if keys[0] in wanted]
            if not keep:
                continue
            rows_seen += len(keep)
            sub = {
                k: (v[keep] if k in ("input_ids", "input_lengths", "token_mask") else v)
                for k, v in batch.items()
            }
            sub["position_ids"] = batch["position_ids"][..., keep, :]
            for key in ("pixel_values", "image_grid_thw", "source_ids"):
                sub[key] = [batch[key][r] for r in keep]
            for r in range(len(keep)):  # (a) alone, unpacked
                mb = padded_microbatch(single_row(sub, r), image_token_id=image)
                logits = model(**mb.model_inputs)
                reference[sub["source_ids"][r][0]] = logits[0, : int(sub["input_lengths"][r])]
                losses["a"] += float(token_loss(logits, mb)[0])
            for mb in pack_microbatches(
                sub, image_token_id=image, token_budget=CAPACITY, pad_multiple=4
            ):
                logits = model(**mb.model_inputs)  # (b) trainer-side pack, as wide as needed
                trainer_side.update(per_source(logits[0], mb))
                losses["b"] += float(token_loss(logits, mb)[0])
            if rows_seen == len(wanted):  # read order: the rest of the data holds none of them
                break
    assert rows_seen == len(wanted) == len(reference) == len(trainer_side)

    valid = 0
    with torch.no_grad():
        for batch in packs:
            for mode, slot in (("padded", "c"), ("real", "d")):
                (mb,) = prepacked_microbatches(
                    batch, boundary=mode, image_token_id=image, pad_multiple=4
                )
                logits = model(**mb.model_inputs)
                for key, got in per_source(logits[0], mb).items():
                    torch.testing.assert_close(got, reference[key], atol=ATOL, rtol=0)
                    torch.testing.assert_close(trainer_side[key], reference[key], atol=ATOL, rtol=0)
                losses[slot] += float(token_loss(logits, mb)[0])
            valid += int((prepacked_microbatches(batch, pad_multiple=4)[0].loss_mask > 0).sum())
    normalised = {slot: total / valid for slot, total in losses.items()}
    assert normalised["a"] == pytest.approx(normalised["b"], abs=1e-9)
    assert normalised["a"] == pytest.approx(normalised["c"], abs=1e-9)
    assert normalised["c"] == normalised["d"]


@pytest.mark.slow  # two gloo processes
def test_context_parallel_2_ranks_equals_cp_1(setup, tmp_path):
    import cp_worker

    te, model, config, packs = setup
    image = te.tokenizer.special.image_pad
    few = 3 if len(packs) <= 12 else 6  # packs with images, then the last pack(s) (text-heavy)
    chosen = [b for b in packs if len(b["image_grid_thw"][0])][:few] + packs[-few // 3 :]
    torch.save(
        dict(config=config, seed=0, batches=chosen, pad_multiple=4, image_token_id=image),
        tmp_path / "inputs.pt",
    )
    spawn_ranks(
        cp_worker.run, 2, tmp_path, str(tmp_path / "inputs.pt"), str(tmp_path / "out"), timeout=180
    )
    ranks = [torch.load(tmp_path / f"out.{r}", weights_only=False) for r in range(2)]
    with torch.no_grad():
        for i, batch in enumerate(chosen):
            (mb,) = prepacked_microbatches(batch, pad_multiple=4, image_token_id=image)
            full = model(**mb.model_inputs)[0]
            rebuilt = torch.empty_like(full)
            for keep, logits in (ranks[0][i], ranks[1][i]):
                rebuilt[keep] = logits
            torch.testing.assert_close(rebuilt, full, atol=ATOL, rtol=0)


def test_mrope_positions_match_transformers():
    qwen = pytest.importorskip("transformers")
    te = PackingTaskEncoder(
        tokenizer="bundled", max_input_seq_length=CAPACITY, mrope=True, unpacked=True
    )
    special = te.tokenizer.special
    config = qwen.Qwen2VLConfig(
        text_config=dict(
            vocab_size=te.tokenizer.vocab_size,
            hidden_size=64,
            num_hidden_layers=1,
            num_attention_heads=4,
            num_key_value_heads=4,
            intermediate_size=128,
            rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]},
        ),
        vision_config=dict(
            depth=1,
            embed_dim=32,
            hidden_size=64,
            num_heads=2,
            patch_size=14,
            spatial_merge_size=2,
            temporal_patch_size=2,
            in_chans=3,
        ),
        image_token_id=special.image_pad,
        vision_start_token_id=special.vision_start,
    )
    reference = qwen.Qwen2VLForConditionalGeneration(config).model
    checked = 0
    for batch in itertools.islice(loader_batches(SAMPLE_DATA, te, buffer=None, batch_size=1), 40):
        n = int(batch["input_lengths"][0])
        ids = batch["input_ids"][:, :n]
        grids = batch["image_grid_thw"][0]
        if not len(grids):
            continue
        expected, _ = reference.get_rope_index(
            ids, (ids == special.image_pad).int(), grids, None, attention_mask=torch.ones_like(ids)
        )
        assert torch.equal(batch["position_ids"][:, :, :n], expected)
        checked += 1
    assert checked >= 20
