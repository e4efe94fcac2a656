"""Gemma 3n through transformers' own Gemma3nProcessor and a tiny Gemma3nForConditionalGeneration
(issue 32 item 2, issue 33 item 3): :mod:`energon_packing.testing.families_gemma3n`.

The processor (its PIL SigLIP image processor, its audio feature extractor) needs neither
torchvision nor timm: token ids, ``pixel_values`` and ``token_type_ids`` through the real Energon
loader equal the processor's on each conversation alone, in the default suite. The model's
vision tower is timm's MobileNetV5 (timm imports torchvision): the per-source logit proofs are
marked ``torchvision`` and run on the ``torchvision`` CI stack, which pins timm; elsewhere they
skip, naming timm.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from helpers import (
    conversation_sample,
    decode_image,
    loader_batches,
    make_dataset,
    require_processor_media,
)

from energon_packing import PackingTaskEncoder
from energon_packing.testing.synth import conversations
from energon_packing.trainer import prepacked_microbatches

transformers = pytest.importorskip("transformers")

from energon_packing.testing.families import build  # noqa: E402
from energon_packing.testing.families_gemma3n import IMAGE_TOKENS, timm_missing  # noqa: E402

pytestmark = pytest.mark.energon

CAPACITY = 1024
CONVERSATIONS = list(conversations(16, seed=5))
BY_KEY = {c.key: c for c in CONVERSATIONS}


@pytest.fixture(scope="module")
def gemma3n_dataset(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("gemma3n"), CONVERSATIONS, per_shard=16)


@pytest.fixture(scope="module")
def audio_dataset(tmp_path_factory):
    """tests/test_audio.py's Omni conversations (clips in six formats, an image beside one)."""
    from test_audio import CONVERSATIONS as AUDIO_CONVERSATIONS

    raw = [
        {"__key__": key, "json": json.dumps(document).encode(), **parts}
        for key, document, parts in AUDIO_CONVERSATIONS
    ]
    return make_dataset(tmp_path_factory.mktemp("gemma3n_audio"), [], raw=raw)


def _packs(dataset, processor):
    """Each loader pack with each of its conversations' processor call alone:
    ``(microbatch, [(start, length, reference)])``."""
    from test_families import _processor_call, images_in_order

    te = PackingTaskEncoder(max_input_seq_length=CAPACITY, processor=processor, pad_multiple=8)
    assert te.chat.family_name == "gemma3n"
    for batch in loader_batches(dataset, te, buffer=8):
        (mb,) = prepacked_microbatches(batch, pad_multiple=8)
        members = []
        for k, key in enumerate(mb.source_ids):
            pictures = [decode_image(d) for d in images_in_order(BY_KEY[key])]
            reference = _processor_call(processor, BY_KEY[key], pictures)
            start, n = int(mb.cu_seqlens_padded[k]), int(mb.cu_seqlens[k + 1] - mb.cu_seqlens[k])
            members.append((start, n, reference))
        yield batch, mb, members
    assert not te.stats.skipped.keys() - {"overlong"}, dict(te.stats.skipped)


def test_gemma3n_ids_pixels_and_token_types_equal_the_processor(gemma3n_dataset):
    """Through the real loader: each conversation's ids and token types (images 1) equal the
    processor's own on it alone, and the pack's ``pixel_values`` are its conversations', bit
    for bit, in order; every image is ``IMAGE_TOKENS`` soft tokens between ``<start_of_image>``
    and ``<end_of_image>``. No model, no timm."""
    require_processor_media("gemma3n")  # refused on a release without its public expansion
    processor, _, _ = build("gemma3n", model=False)
    image_id = processor.image_token_id
    sources = images = 0
    for _, mb, members in _packs(gemma3n_dataset, processor):
        pixels = []
        for start, n, reference in members:
            ids = mb.model_inputs["input_ids"][0, start : start + n]
            assert torch.equal(ids, reference["input_ids"][0])
            types = mb.model_inputs["token_type_ids"][0, start : start + n]
            assert torch.equal(types, reference["token_type_ids"][0])
            assert torch.equal(types.bool(), ids == image_id)
            assert set(reference) - {"input_ids", "attention_mask", "token_type_ids"} <= {
                "pixel_values"
            }
            if "pixel_values" in reference:
                pixels.append(reference["pixel_values"])
                count = reference["pixel_values"].shape[0]
                assert int((ids == image_id).sum()) == count * IMAGE_TOKENS
                images += count
            sources += 1
        if pixels:
            assert torch.equal(mb.model_inputs["pixel_values"], torch.cat(pixels))
        else:
            assert "pixel_values" not in mb.model_inputs
    assert sources >= len(CONVERSATIONS) - 2 and images >= 10, (sources, images)


# ---- audio ---------------------------------------------------------------------------------


def _audio_reference(processor, key: str) -> dict:
    """The real processor on one of tests/test_audio.py's conversations alone (the template
    writes BOS: none added)."""
    from test_audio import BY_KEY as AUDIO_BY_KEY
    from test_audio import _hf_messages, _in_order

    from energon_packing.media import audio

    document, parts = AUDIO_BY_KEY[key]
    text = processor.apply_chat_template(_hf_messages(document), tokenize=False)
    clips = [audio.decode(data) for data in _in_order(document, parts, "audio")]
    images = [decode_image(data) for data in _in_order(document, parts, "image")]
    return processor(
        text=[text],
        audio=clips or None,
        images=[images] if images else None,
        add_special_tokens=False,
        return_tensors="pt",
    )


def test_gemma3n_audio_ids_features_and_masks_equal_the_processor(audio_dataset):
    """Through the real loader, the Omni conversations of tests/test_audio.py (one to two clips
    of 0.6-3.3 s in six formats, an image beside a clip, a clip referenced twice, text only):
    ids and token types (images 1, audio 3) equal the processor's on each conversation alone,
    each clip is ``\\n\\n<start_of_audio>``, 188 audio tokens, ``<end_of_audio>\\n\\n``, and
    ``input_features`` / ``input_features_mask`` are the processor's call on the conversation's
    clips, zero-padded (mask False) to the pack's longest clip. No model, no timm."""
    from test_audio import BY_KEY as AUDIO_BY_KEY

    require_processor_media("gemma3n")  # refused on a release without its public expansion
    processor, _, _ = build("gemma3n", model=False)
    te = PackingTaskEncoder(max_input_seq_length=CAPACITY, processor=processor, pad_multiple=8)
    assert te.chat.family_name == "gemma3n" and te.chat.audio is not None
    audio_id, seen, clips_seen = processor.audio_token_id, [], 0
    for batch in loader_batches(audio_dataset, te, buffer=8):
        (mb,) = prepacked_microbatches(batch, pad_multiple=8)
        inputs, row = mb.model_inputs, 0
        for k, key in enumerate(mb.source_ids):
            reference = _audio_reference(processor, key)
            start, n = int(mb.cu_seqlens_padded[k]), int(mb.cu_seqlens[k + 1] - mb.cu_seqlens[k])
            ids = inputs["input_ids"][0, start : start + n]
            assert torch.equal(ids, reference["input_ids"][0]), key
            types = inputs["token_type_ids"][0, start : start + n]
            assert torch.equal(types, reference["token_type_ids"][0]), key
            if "input_features" in reference:
                want, want_mask = reference["input_features"], reference["input_features_mask"]
                clips, frames = want.shape[:2]
                assert int((ids == audio_id).sum()) == 188 * clips, key
                got = inputs["input_features"][row : row + clips]
                mask = inputs["input_features_mask"][row : row + clips]
                assert mask.dtype == torch.bool and torch.equal(mask[:, :frames], want_mask), key
                assert torch.equal(got[:, :frames], want), key  # bit-equal, padding included
                assert not mask[:, frames:].any() and not got[:, frames:].any(), key
                row, clips_seen = row + clips, clips_seen + clips
            else:
                assert not (ids == audio_id).any(), key
            seen.append(key)
        assert row == (len(inputs["input_features"]) if "input_features" in inputs else 0)
    assert sorted(seen) == sorted(AUDIO_BY_KEY) and not te.stats.skipped
    assert clips_seen == 8, clips_seen  # a clip referenced twice is given twice


def test_gemma3n_audio_tokens_whatever_the_clip_and_a_clip_over_30_s_is_skipped():
    """Every clip is 188 tokens whatever its length (the model pads its encoder's output to
    them), as the processor writes them; a clip over the extractor's 30 s, which the processor
    would cut silently, is skipped ``audio_too_long``, naming the numbers."""
    from megatron.energon.errors import SkipSample
    from test_audio import _hf_messages

    from energon_packing.media import audio
    from energon_packing.testing.audio import clip

    require_processor_media("gemma3n")  # refused on a release without its public expansion
    processor, _, _ = build("gemma3n", model=False)
    te = PackingTaskEncoder(max_input_seq_length=8192, processor=processor)
    document = {
        "messages": [
            {"role": "user", "content": [{"type": "audio", "audio": "a.flac"}]},
            {"role": "assistant", "content": "ok"},
        ],
        "audios": ["a.flac"],
    }
    for seconds in (0.01, 0.1, 1.0, 4.3, 29.99):
        data = clip("flac", seconds=seconds, seed=3)
        encoded = te.encode_sample(conversation_sample("k", document, {"a.flac": data}))
        text = processor.apply_chat_template(_hf_messages(document), tokenize=False)
        reference = processor(
            text=[text], audio=[audio.decode(data)], add_special_tokens=False, return_tensors="np"
        )
        assert np.array_equal(encoded.input_ids, reference["input_ids"][0]), seconds
    with pytest.raises(SkipSample):
        te.encode_sample(
            conversation_sample("long", document, {"a.flac": clip("flac", seconds=30.5, seed=4)})
        )
    assert dict(te.stats.skipped) == {"audio_too_long": 1}


# ---- the model (timm: the torchvision stack) -----------------------------------------------


@pytest.fixture(scope="module")
def gemma3n_model():
    if reason := timm_missing():
        pytest.skip(reason)
    require_processor_media("gemma3n")
    return build("gemma3n")


@pytest.mark.torchvision
@pytest.mark.parametrize("data", ["images", "audio"])
def test_gemma3n_per_source_logits_equal_each_conversation_alone(request, gemma3n_model, data):
    """Per-source logits of each loader pack equal each conversation run alone through the
    processor (<= 1e-5): with a block-causal mask per layer type (the sliding window inside
    each conversation) and through the model's own padding-free path (``to_hf``: restarting
    positions, no mask). Gemma 3n's text model is causal over an image's tokens: Gemma 3's
    bidirectional image blocks move the logits (0.35 on these packs), so no blocks; its audio
    encoder's output for a clip does not depend on the zero frames the pack pads it with.
    Positions running on across the pack change the logits, and so do the pixels and the
    clips (they reach the logits)."""
    from energon_packing.hf import to_hf
    from energon_packing.testing import hf

    processor, model, info = gemma3n_model
    dataset = request.getfixturevalue("gemma3n_dataset" if data == "images" else "audio_dataset")
    te = PackingTaskEncoder(max_input_seq_length=CAPACITY, processor=processor, pad_multiple=8)
    worst = free_worst = crossed = media_effect = blocks = 0.0
    sources = 0
    for batch in loader_batches(dataset, te, buffer=8):
        (mb,) = prepacked_microbatches(batch, pad_multiple=8)
        logits = hf.run(model, hf.packed_kwargs(mb.model_inputs, mb.cu_seqlens_padded, info))
        if data == "images":  # Gemma 3's mask (an image's tokens see each other) is not its
            gemma3 = {**info, "family": "gemma3"}
            bidirectional = hf.run(
                model, hf.packed_kwargs(mb.model_inputs, mb.cu_seqlens_padded, gemma3)
            )
            blocks = max(blocks, float((bidirectional - logits).abs().max()))
        kw = {k: v for k, v in to_hf(batch, model=model).items() if k != "use_cache"}
        assert "attention_mask" not in kw
        free = hf.run(model, kw)
        across = hf.run(model, {**kw, "position_ids": torch.arange(kw["input_ids"].shape[1])[None]})
        for k, key in enumerate(mb.source_ids):
            reference = _reference_of(processor, data, key)
            start, n = int(mb.cu_seqlens_padded[k]), int(mb.cu_seqlens[k + 1] - mb.cu_seqlens[k])
            assert torch.equal(
                mb.model_inputs["input_ids"][0, start : start + n], reference["input_ids"][0]
            )
            alone = hf.run(model, dict(reference))
            worst = max(worst, float((logits[start : start + n] - alone).abs().max()))
            free_worst = max(free_worst, float((free[start : start + n] - alone).abs().max()))
            crossed = max(crossed, float((across[start : start + n] - alone).abs().max()))
            for name in ("pixel_values", "input_features"):
                if name in reference:  # zeroed, the conversation's logits move
                    blank = hf.run(model, {**reference, name: torch.zeros_like(reference[name])})
                    media_effect = max(media_effect, float((blank - alone).abs().max()))
            sources += 1
    assert sources >= 6 and not te.stats.skipped.keys() - {"overlong"}, dict(te.stats.skipped)
    assert worst <= 1e-5, f"{data}: per-source logits differ by {worst:.2e}"
    assert free_worst <= 1e-5, f"{data}: to_hf's per-source logits differ by {free_worst:.2e}"
    assert crossed > 1e-2, f"{data}: positions running on change nothing ({crossed:.2e})"
    assert media_effect > 1e-2, f"{data}: the media never reach the logits ({media_effect:.2e})"
    assert data == "audio" or blocks > 1e-2, f"image blocks change nothing ({blocks:.2e})"
    print(f"gemma3n {data}: block mask {worst:.2e}, to_hf {free_worst:.2e}, Gemma 3's {blocks:.2e}")


def _reference_of(processor, data: str, key: str) -> dict:
    if data == "audio":
        return _audio_reference(processor, key)
    from test_families import _processor_call, images_in_order

    return _processor_call(
        processor, BY_KEY[key], [decode_image(d) for d in images_in_order(BY_KEY[key])]
    )


def test_a_gemma3n_directory_loads_and_packs_without_timm(tmp_path):
    """A Gemma 3n model directory (tokenizer, preprocessor and processor configs, chat
    template, config.json) loads as transformers' Gemma3nProcessor and packs as gemma3n: the
    processor needs neither timm nor torchvision (its model's vision tower does; packing never
    builds the model), so nothing is refused; ids equal the loaded processor's own."""
    from test_audio import _hf_messages

    from energon_packing.encoding.processor_loading import load_processor
    from energon_packing.media import audio
    from energon_packing.testing.audio import clip
    from energon_packing.testing.families import save_published

    require_processor_media("gemma3n")
    save_published(build("gemma3n", model=False)[0], tmp_path)
    loaded = load_processor(tmp_path)
    assert type(loaded).__name__ == "Gemma3nProcessor"
    assert type(loaded.feature_extractor).__name__ == "Gemma3nAudioFeatureExtractor"
    te = PackingTaskEncoder(max_input_seq_length=4096, processor=str(tmp_path))
    assert te.chat.family_name == "gemma3n"
    from test_pixtral import _png

    document = {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image", "image": "a.png"},
                    {"type": "text", "text": "Does it sound like"},
                    {"type": "audio", "audio": "b.wav"},
                ],
            },
            {"role": "assistant", "content": "No."},
        ],
        "images": ["a.png"],
        "audios": ["b.wav"],
    }
    parts = {"a.png": _png(90, 60), "b.wav": clip("wav", seconds=1.3, seed=2)}
    encoded = te.encode_sample(conversation_sample("d", document, parts))
    text = loaded.apply_chat_template(_hf_messages(document), tokenize=False)
    real = loaded(
        text=[text],
        images=[[decode_image(parts["a.png"])]],
        audio=[audio.decode(parts["b.wav"])],
        add_special_tokens=False,
        return_tensors="np",
    )
    assert encoded.input_ids.tolist() == real["input_ids"][0].tolist()
    assert (real["input_ids"][0] == loaded.image_token_id).sum() == IMAGE_TOKENS
    assert (real["input_ids"][0] == loaded.audio_token_id).sum() == 188


@pytest.mark.torchvision
def test_to_hf_leaves_out_the_media_a_pack_of_a_batch_lacks(audio_dataset, gemma3n_model):
    """Two packs a batch: where one holds an image and the other none, ``to_hf`` of the other
    passes no ``pixel_values`` (the batch holds it an empty tensor, on which Gemma 3n's timm
    tower fails), and each row's per-source logits equal each conversation alone."""
    from energon_packing.hf import to_hf
    from energon_packing.testing import hf

    processor, model, _ = gemma3n_model
    te = PackingTaskEncoder(max_input_seq_length=600, processor=processor, pad_multiple=8)
    rows = without = worst = 0.0
    for batch in loader_batches(audio_dataset, te, buffer=8, batch_size=2):
        for row in range(len(batch["input_ids"])):
            kw = {k: v for k, v in to_hf(batch, model=model, row=row).items() if k != "use_cache"}
            held = batch["pixel_values"][row] if "pixel_values" in batch else None
            if held is not None and not len(held):
                assert "pixel_values" not in kw
                without += 1
            logits = hf.run(model, kw)
            bounds = batch["cu_seqlens"][row].tolist()
            padded = batch["cu_seqlens_padded"][row].tolist()
            for k, key in enumerate(batch["source_ids"][row]):
                alone = hf.run(model, dict(_audio_reference(processor, key)))
                start, n = padded[k], bounds[k + 1] - bounds[k]
                worst = max(worst, float((logits[start : start + n] - alone).abs().max()))
            rows += 1
    assert rows >= 3 and without >= 1, (rows, without)
    assert worst <= 1e-5, f"per-source logits differ by {worst:.2e}"
