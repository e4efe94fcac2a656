"""Llama 4 through transformers' own ``Llama4Processor``, whose image processor exists only with
torchvision (issue 33 items 3 and 5): the tests marked ``torchvision`` build the real processor
and a tiny random-init ``Llama4ForConditionalGeneration``
(:mod:`energon_packing.testing.families_llama4`) and run where torchvision imports (the
``torchvision`` stack of .ci/stacks.txt); elsewhere they skip, naming it.

Through the real Energon loader: token ids equal the processor's own on each conversation
alone; ``pixel_values`` (each image's tiles and global view) equal the processor's; per-source
logits of a pack equal each conversation alone, through ``to_hf``. The tile rule
(:func:`energon_packing.encoding.llama4_tiles.llama4_tiles`, plain Python) equals the image
processor's ``get_best_fit`` on fuzzed sizes.

Llama 4's chunked attention and its attention temperature follow the row's absolute index, not
``position_ids`` (every stack, the model alone, float64): a pack is exact up to one chunk and
below ``floor_scale``, and off past them; the task encoder and ``to_hf`` refuse a wider one.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import decode_image, loader_batches, make_dataset

from energon_packing import PackingTaskEncoder
from energon_packing.schema import Source, collate, layout
from energon_packing.testing.synth import conversations

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

CAPACITY = 4096
CONVERSATIONS = list(conversations(16, seed=11))
BY_KEY = {c.key: c for c in CONVERSATIONS}


@pytest.fixture(scope="module")
def llama4_dataset(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("llama4"), CONVERSATIONS, per_shard=16)


@pytest.mark.torchvision
@pytest.mark.energon
def test_llama4_through_its_processor_and_the_loader(llama4_dataset):
    from test_families import _processor_call, images_in_order

    from energon_packing.encoding.costs import grids_from_tokens
    from energon_packing.hf import to_hf
    from energon_packing.testing import hf
    from energon_packing.testing.families import build

    processor, model, _ = build("llama4")
    te = PackingTaskEncoder(max_input_seq_length=CAPACITY, processor=processor, pad_multiple=8)
    assert te.chat.family_name == "llama4"
    assert te.image_token_id == model.config.image_token_index  # <|patch|>: stats counts them
    sources = images = tiled = tile_runs = 0
    worst = 0.0
    for batch in loader_batches(llama4_dataset, te, buffer=8):
        inputs = to_hf(batch, model=model)
        kw = {k: v for k, v in inputs.items() if k not in ("use_cache", "labels")}
        assert "attention_mask" not in kw
        logits = hf.run(model, kw)
        cu, cu_padded = inputs.cu_seqlens.tolist(), inputs.cu_seqlens_padded.tolist()
        tiles = []
        for k, key in enumerate(inputs.source_ids):
            pictures = [decode_image(d) for d in images_in_order(BY_KEY[key])]
            reference = _processor_call(processor, BY_KEY[key], pictures)
            start, n = cu_padded[k], cu[k + 1] - cu[k]
            assert torch.equal(kw["input_ids"][0, start : start + n], reference["input_ids"][0])
            alone = {"input_ids": reference["input_ids"]}
            if pictures:
                tiles.append(reference["pixel_values"])
                alone["pixel_values"] = reference["pixel_values"].float()
                images += len(pictures)
                tiled += int(reference["pixel_values"].shape[0] > len(pictures))
            worst = max(
                worst, float((logits[start : start + n] - hf.run(model, alone)).abs().max())
            )
            sources += 1
        tile_runs += len(
            grids_from_tokens(kw["input_ids"][0], token_id=te.image_token_id, merge_size=2)
        )
        if tiles:  # each image's tiles and global view, bit-equal, conversation after conversation
            want = torch.cat(tiles)
            assert torch.equal(kw["pixel_values"].to(want.dtype), want)
        else:
            assert "pixel_values" not in kw
    assert sources >= len(CONVERSATIONS) - 2 and not te.stats.skipped.keys() - {"overlong"}
    assert images >= 10 and tiled >= 1, (images, tiled)
    assert worst <= 1e-5, f"per-source logits differ by {worst:.2e}"
    # its tower is priced (its tiles as their <|patch|> runs imply them): the emitted packs'
    # vision cost is every tile's FLOPs, trained (test_step_cost counts a tile's by torch)
    tower = te.cost_model.vision
    assert tower is not None and tower.class_tokens == 1
    assert te.stats.cost_vision == 3 * tower.grid_flops((1, 24, 24)) * tile_runs


@pytest.mark.torchvision
def test_the_tile_rule_is_the_image_processors():
    """``llama4_tiles`` equals the image processor's own ``get_best_fit`` (float32 scales,
    least area on a tie) over fuzzed sizes, tile caps and both canvas policies."""
    from transformers.image_processing_utils_fast import SizeDict
    from transformers.models.llama4 import image_processing_llama4 as upstream

    from energon_packing.encoding.llama4_tiles import llama4_tiles

    rng = np.random.default_rng(0)
    sizes = [tuple(int(x) for x in rng.integers(1, 5000, 2)) for _ in range(300)]
    sizes += [(336, 336), (337, 336), (672, 336), (1, 1), (10, 4000), (336, 1008), (224, 448)]
    for max_patches in (16, 1, 5, 12):
        canvases = torch.tensor(
            upstream.find_supported_resolutions(
                max_num_chunks=max_patches, patch_size=SizeDict(height=336, width=336)
            )
        )
        for to_max in (False, True):
            for h, w in sizes:
                best = upstream.get_best_fit((h, w), canvases, resize_to_max_canvas=to_max)
                got = llama4_tiles(
                    h, w, side=336, max_patches=max_patches, resize_to_max_canvas=to_max
                )
                assert got == (int(best[0]) // 336, int(best[1]) // 336), (h, w, max_patches)


# ---- the row's absolute index: every stack, no torchvision ---------------------------------

BOUND = 32


def _model(**text):
    from energon_packing.encoding import hf_compat
    from energon_packing.testing.families_llama4 import tiny_config

    broken = hf_compat.broken_forward("llama4")
    if broken:  # 5.24: the family is refused there (test_a_release_whose_forward_is_broken...)
        pytest.skip(broken)
    torch.manual_seed(0)
    config = tiny_config(image_token_index=63, vocab_size=64, pad_token_id=0, **text)
    return transformers.Llama4ForConditionalGeneration(config).double().eval(), config


def _pack(width: int):
    """Three conversations filling ``width`` (one chunk: 9, 11, 7; two: 20, 30, 9, the second
    across the chunk boundary, the third past the temperature floor)."""
    rng = np.random.default_rng(0)
    lengths = (9, 11, 7) if width <= BOUND else (20, 30, 9)
    sources = [
        Source(key=k, input_ids=rng.integers(3, 60, n), token_mask=np.ones(n, dtype=np.float32))
        for k, n in zip("ABC", lengths)
    ]
    return collate([layout(sources, width=width, pad_multiple=4, pad_id=0)]), sources


def _worst(model, batch, sources, width) -> float:
    """Largest per-source logit difference of the pack against each conversation alone, on
    the positions to_hf gives (each conversation's own, counted from 0)."""
    bounds = batch["cu_seqlens_padded"][0]
    starts = torch.repeat_interleave(bounds[:-1], bounds.diff())
    inputs = {
        "input_ids": batch["input_ids"][0][None],
        "position_ids": (torch.arange(width) - starts)[None],
    }
    with torch.no_grad():
        logits = model(**inputs, use_cache=False).logits[0]
        worst = 0.0
        for a, s in zip(bounds.tolist(), sources):
            alone = model(input_ids=torch.tensor(s.input_ids)[None], use_cache=False).logits[0]
            worst = max(worst, float((logits[a : a + len(s.input_ids)] - alone).abs().max()))
    return worst


@pytest.mark.parametrize(
    "rule, text",
    [
        ("attention_chunk_size", dict(attention_chunk_size=BOUND, floor_scale=8192)),
        ("floor_scale", dict(attention_chunk_size=8192, floor_scale=BOUND + 1)),
    ],
)
def test_a_pack_is_exact_within_a_chunk_and_the_temperature_floor(rule, text):
    """A pack ``BOUND`` wide gives each conversation its logits alone. Wider, the temperature
    rises on the tokens of conversations past the floor where alone it does not, on every
    release; the chunks cut through a conversation before 5.23 (since, a padding-free row's
    chunks follow each conversation's positions: exact). Where off, ``to_hf`` refuses the
    pack naming the knob and the rule."""
    from energon_packing.encoding import hf_compat
    from energon_packing.hf import to_hf

    model, config = _model(**text)
    batch, sources = _pack(BOUND)
    assert _worst(model, batch, sources, BOUND) <= 1e-10
    inputs = to_hf(batch, config=config)
    assert set(inputs) >= {"input_ids", "position_ids"}
    wide, sources = _pack(2 * BOUND)
    worst = _worst(model, wide, sources, 2 * BOUND)
    if rule == "attention_chunk_size" and hf_compat.masks_follow_packed_positions():
        assert worst <= 1e-10, worst
        to_hf(wide, config=config)  # accepted: the release keeps chunks per conversation
        return
    assert worst > 1e-5, worst
    with pytest.raises(ValueError, match=rf"{rule}=.*max_input_seq_length <= {BOUND}") as raised:
        to_hf(wide, config=config)
    assert "\n" not in str(raised.value)


def test_the_bounds_are_read_from_the_config():
    from energon_packing.encoding import hf_compat
    from energon_packing.encoding.models import model_info

    chunks = [] if hf_compat.masks_follow_packed_positions() else [8192]
    _, config = _model()
    assert [bound for _, bound in model_info(config).row_bounds] == [*chunks, 8191]
    published = {  # Llama-4-Scout's config.json, the fields read
        "model_type": "llama4",
        "text_config": {
            "model_type": "llama4_text",
            "attention_chunk_size": 8192,
            "attn_temperature_tuning": True,
            "floor_scale": 8192,
        },
    }
    assert [bound for _, bound in model_info(published).row_bounds] == [*chunks, 8191]
    assert model_info({"model_type": "llama", "floor_scale": 8}).row_bounds == ()


def test_a_release_whose_forward_is_broken_is_refused(monkeypatch):
    """On transformers 5.24 Llama 4's forward raises on every call: ``to_hf`` refuses its
    packs naming the release and the ones that run it; other releases pass."""
    from energon_packing.encoding import hf_compat
    from energon_packing.hf import to_hf
    from energon_packing.testing.families_llama4 import tiny_config

    config = tiny_config(image_token_index=63, vocab_size=64, pad_token_id=0)
    batch, _ = _pack(BOUND)
    monkeypatch.setattr(hf_compat, "transformers_version", lambda: (5, 24, 0))
    with pytest.raises(
        ValueError, match=r"'llama4': on transformers 5.24.0, .*image_outputs.*from 5.25.0 on"
    ):
        to_hf(batch, config=config)
    for release in ((5, 23, 0), (5, 25, 0)):
        monkeypatch.setattr(hf_compat, "transformers_version", lambda r=release: r)
        assert "input_ids" in to_hf(batch, config=config)


def test_to_hf_gives_the_tower_its_pixels_in_the_models_dtype():
    """Llama 4's vision tower casts nothing: a bfloat16 model fails on float32 pixels, which is
    what a pack holds (numpy has no bfloat16). ``to_hf`` casts them to the model's dtype: the
    bfloat16 model runs the pack, on the same values the processor's bfloat16 pixels hold."""
    from energon_packing.hf import to_hf

    model, config = _model()
    model = model.to(torch.bfloat16)
    rng = np.random.default_rng(0)
    ids = rng.integers(3, 60, 160)
    ids[5 : 5 + 144] = config.image_token_index  # one tile: (336 / 14)**2 / 4 patches
    pixels = torch.randn(1, 3, 336, 336).to(torch.bfloat16)
    source = Source(
        key="A",
        input_ids=ids,
        token_mask=np.ones(160, dtype=np.float32),
        media={"pixel_values": pixels.float().numpy()},
        images=1,
    )
    batch = collate([layout([source], width=160, pad_multiple=8, pad_id=0)])
    with pytest.raises(RuntimeError, match="dtype"):  # the pack's float32, as it is
        model(input_ids=torch.as_tensor(ids)[None], pixel_values=pixels.float())
    inputs = to_hf(batch, model=model)
    assert inputs["pixel_values"].dtype == torch.bfloat16
    assert torch.equal(inputs["pixel_values"], pixels)
    kw = {k: v for k, v in inputs.items() if k not in ("labels", "use_cache")}
    with torch.no_grad():
        assert model(**kw, use_cache=False).logits.dtype == torch.bfloat16
