"""Phi-4-multimodal through transformers' own ``Phi4MultimodalProcessor``, whose image processor
exists only with torchvision (issue 33 item 5; issue 32 item 2): the tests marked
``torchvision`` build the real processor and a tiny random-init ``Phi4MultimodalForCausalLM``
(:mod:`energon_packing.testing.families_phi4`) and run where torchvision imports (the
``torchvision`` stack of .ci/stacks.txt); elsewhere they skip, naming it.

Through the real Energon loader: token ids equal the processor's own on each conversation
alone; ``image_pixel_values``, ``image_sizes`` and ``image_attention_mask`` equal the
processor's, padded across the pack as the processor pads a call (pixels with zeros, crop masks
with ones); per-source logits of a pack equal each conversation alone, through ``to_hf``.
The image-token rule (:func:`energon_packing.encoding.image_rules.phi4_tokens`, plain Python,
for the releases whose image processor has no ``get_number_of_image_tokens``) equals the image
processor's on fuzzed sizes and crop caps.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import decode_image, loader_batches, make_dataset

from energon_packing import PackingTaskEncoder
from energon_packing.packing import Company
from energon_packing.schema import PACKING_SKIPPED
from energon_packing.testing.synth import conversations

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

CAPACITY = 4096
CONVERSATIONS = list(conversations(16, seed=7))
BY_KEY = {c.key: c for c in CONVERSATIONS}


@pytest.fixture(scope="module")
def phi4_dataset(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("phi4"), CONVERSATIONS, per_shard=16)


@pytest.mark.torchvision
@pytest.mark.energon
def test_phi4_through_its_processor_and_the_loader(phi4_dataset):
    from test_families import _processor_call, concat_padded, images_in_order

    from energon_packing.hf import to_hf
    from energon_packing.testing import hf
    from energon_packing.testing.families import build

    processor, model, _ = build("phi4_multimodal")
    te = PackingTaskEncoder(max_input_seq_length=CAPACITY, processor=processor, pad_multiple=8)
    assert te.chat.family_name == "phi4_multimodal"
    fields = ("image_pixel_values", "image_sizes", "image_attention_mask")
    sources = images = mixed = 0
    worst = crossed = 0.0
    for batch in loader_batches(phi4_dataset, te, buffer=8):
        inputs = to_hf(batch, model=model)
        kw = {k: v for k, v in inputs.items() if k not in ("use_cache", "labels")}
        assert "attention_mask" not in kw
        logits = hf.run(model, kw)
        across = hf.run(model, {**kw, "position_ids": torch.arange(CAPACITY)[None]})
        cu, cu_padded = inputs.cu_seqlens.tolist(), inputs.cu_seqlens_padded.tolist()
        expected: dict[str, list] = {}
        crops = set()
        for k, key in enumerate(inputs.source_ids):
            pictures = [decode_image(d) for d in images_in_order(BY_KEY[key])]
            reference = _processor_call(processor, BY_KEY[key], pictures)
            start, n = cu_padded[k], cu[k + 1] - cu[k]
            assert torch.equal(kw["input_ids"][0, start : start + n], reference["input_ids"][0])
            assert set(reference) - {"input_ids", "attention_mask"} == (
                set(fields) if pictures else set()
            )
            for name in fields:
                if name in reference:
                    expected.setdefault(name, []).append(reference[name])
            if pictures:
                crops.add(reference["image_pixel_values"].shape[1])
                images += len(pictures)
            alone = hf.run(model, dict(reference))
            worst = max(worst, float((logits[start : start + n] - alone).abs().max()))
            crossed = max(crossed, float((across[start : start + n] - alone).abs().max()))
            sources += 1
        for name, parts in expected.items():  # bit-equal, padded as one call pads
            fill = 1 if name == "image_attention_mask" else 0
            assert torch.equal(kw[name].to(parts[0].dtype), concat_padded(parts, fill)), name
        mixed += len(crops) > 1  # a pack whose conversations' images have other crop counts
    assert sources >= len(CONVERSATIONS) - 2 and not te.stats.skipped.keys() - {"overlong"}
    assert images >= 10 and mixed >= 1, (images, mixed)
    assert worst <= 1e-5, f"per-source logits differ by {worst:.2e}"
    assert crossed > 1e-2, f"positions running on change nothing ({crossed:.2e})"


@pytest.mark.torchvision
def test_the_image_token_rule_is_the_image_processors():
    from transformers import Phi4MultimodalImageProcessor

    from energon_packing.encoding.image_rules import phi4_tokens
    from energon_packing.errors import Skip

    image_processor = Phi4MultimodalImageProcessor()
    if not hasattr(image_processor, "get_number_of_image_tokens"):
        pytest.skip("this release's image processor has no get_number_of_image_tokens")
    rng = np.random.default_rng(0)
    sizes = [tuple(int(x) for x in rng.integers(10, 4000, 2)) for _ in range(400)]
    sizes += [(448, 448), (449, 448), (20, 3000), (3000, 20), (5000, 6000), (5, 900), (1, 1)]
    refused = 0
    for max_crops in (36, 1, 4, 12):
        for h, w in sizes:
            try:
                want = image_processor.get_number_of_image_tokens(h, w, {"dynamic_hd": max_crops})
            except ValueError:  # "the aspect ratio is very extreme"
                with pytest.raises(Skip, match="image_aspect_ratio"):
                    phi4_tokens(h, w, size=448, patch=14, max_crops=max_crops)
                refused += 1
                continue
            assert phi4_tokens(h, w, size=448, patch=14, max_crops=max_crops) == want, (h, w)
    assert refused >= 4


def _audio_reference(processor, key: str) -> dict:
    """The real processor on one of test_audio's conversations alone."""
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
        sampling_rate=16_000,
        return_tensors="pt",
    )


AUDIO_FIELDS = ("audio_input_features", "audio_embed_sizes", "audio_attention_mask")


def _faulty() -> list[tuple[str, dict, dict, str]]:
    """test_audio's faulty clips (missing, unreadable, no audio stream, over max_audio_seconds
    of 5, not referenced) and one under Phi-4's 25 ms feature window: (key, document, parts,
    reason)."""
    from test_audio import _faulty as faulty

    from energon_packing.testing.audio import clip

    short = {
        "messages": [
            {"role": "user", "content": [{"type": "audio", "audio": "s.wav"}]},
            {"role": "assistant", "content": "A click."},
        ],
        "audios": ["s.wav"],
    }
    return [
        *faulty(),
        ("too_short", short, {"s.wav": clip("wav", seconds=0.02)}, "audio_too_short"),
    ]


@pytest.fixture(scope="module")
def audio_dataset(tmp_path_factory):
    """test_audio's conversations (one clip, two clips, a clip and an image, placeholders,
    text only) and faulty clips (:func:`_faulty`) beside this module's text and image ones."""
    import json

    from test_audio import CONVERSATIONS as AUDIO_CONVERSATIONS

    raw = [
        {"__key__": key, "json": json.dumps(document).encode(), **parts}
        for key, document, parts, *_ in [*AUDIO_CONVERSATIONS, *_faulty()]
    ]
    return make_dataset(tmp_path_factory.mktemp("phi4_audio"), CONVERSATIONS, raw=raw)


@pytest.mark.torchvision
@pytest.mark.energon
@pytest.mark.parametrize("workers", [0, 2])
def test_phi4_audio_packs_beside_text_only_through_the_loader(audio_dataset, workers):
    """A conversation with clips shares its pack only with conversations without media (its
    audio encoder reads the padding of a call's longest clip, its projection the call's images:
    tests/test_phi4_couplings.py), which fill the rest of it: its ids, features, sizes and (two
    clips) frame mask are the processor's on it alone, and every conversation's logits are its
    own alone; image conversations pack together as before; each conversation exactly once,
    or, with a faulty clip, in the skip report under its exact reason (issue 32's mixed epoch)."""
    from test_audio import BY_KEY as AUDIO_BY_KEY
    from test_families import _processor_call, images_in_order

    from energon_packing.hf import to_hf
    from energon_packing.testing import hf
    from energon_packing.testing.families import build

    def alone_inputs(key):
        if key in AUDIO_BY_KEY:
            return _audio_reference(processor, key)
        pictures = [decode_image(d) for d in images_in_order(BY_KEY[key])]
        return _processor_call(processor, BY_KEY[key], pictures)

    processor, model, _ = build("phi4_multimodal")
    te = PackingTaskEncoder(
        max_input_seq_length=CAPACITY, processor=processor, pad_multiple=8, max_audio_seconds=5.0
    )
    seen, worst, alone, shared, masks = [], 0.0, 0, 0, 0
    skipped = []
    for batch in loader_batches(audio_dataset, te, buffer=8, workers=workers):
        skipped += list(batch[PACKING_SKIPPED])  # a worker's skips ride on its batches
        if not len(batch["input_ids"]):  # a worker's accounting-only tail
            continue
        inputs = to_hf(batch, model=model)
        kw = {k: v for k, v in inputs.items() if k not in ("use_cache", "labels")}
        logits = hf.run(model, kw)
        cu, cu_padded = inputs.cu_seqlens.tolist(), inputs.cu_seqlens_padded.tolist()
        references = {key: alone_inputs(key) for key in inputs.source_ids}
        heard = [key for key, ref in references.items() if "audio_input_features" in ref]
        if heard:
            assert len(heard) == 1, f"clips of {heard} share a pack"
            for key, ref in references.items():  # the rest: text only
                assert key in heard or not {"image_pixel_values", *AUDIO_FIELDS} & set(ref), key
            alone += len(references) == 1
            shared += len(references) > 1
            for name in AUDIO_FIELDS:
                assert (name in kw) == (name in references[heard[0]]), name
                if name in kw:
                    got, want = kw[name], references[heard[0]][name]
                    assert torch.equal(got.to(want.dtype), want), name
            masks += "audio_attention_mask" in kw
        else:
            assert not set(AUDIO_FIELDS) & set(kw)
        for k, key in enumerate(inputs.source_ids):
            reference = references[key]
            start, n = cu_padded[k], cu[k + 1] - cu[k]
            assert torch.equal(kw["input_ids"][0, start : start + n], reference["input_ids"][0])
            if heard or len(inputs.source_ids) == 1:  # its images are the pack's
                for name in ("image_pixel_values", "image_sizes", "image_attention_mask"):
                    if name in reference:
                        assert torch.equal(kw[name].to(reference[name].dtype), reference[name])
            alone_logits = hf.run(model, dict(reference))
            worst = max(worst, float((logits[start : start + n] - alone_logits).abs().max()))
            seen.append(key)
    faulty = {key: reason for key, _, _, reason in _faulty()}
    everything = sorted([*AUDIO_BY_KEY, *BY_KEY, *faulty])
    assert sorted([*seen, *(key for key, _ in skipped)]) == everything  # each exactly once
    reasons = dict(skipped)
    assert {key: reasons[key] for key in faulty} == faulty  # each under its exact reason
    assert {reasons[key] for key in reasons if key not in faulty} <= {"overlong"}, skipped
    assert shared >= 1 and masks >= 1, (alone, shared, masks)
    if not workers:  # stats packs the split under the same rule: each key's company
        from energon_packing.tools.report import measure_costs

        measured = measure_costs(audio_dataset, te, progress=False)
        for key, company in zip(measured.keys, measured.company):
            document = AUDIO_BY_KEY[key][0] if key in AUDIO_BY_KEY else BY_KEY[key].document
            want = (
                Company.APART
                if document.get("audios")
                else Company.ANY
                if document.get("images")
                else Company.PLAIN
            )
            assert company == want, key
    assert worst <= 1e-5, f"per-source logits differ by {worst:.2e}"


@pytest.mark.torchvision
def test_to_hf_refuses_a_phi4_pack_whose_clips_would_be_heard_otherwise():
    """A pack made by hand (trainer-side packing): clips of two conversations, or a clip
    without images beside another conversation's images, refused naming why."""
    from helpers import conversation_sample
    from test_audio import BY_KEY as AUDIO_BY_KEY

    from energon_packing.hf import to_hf
    from energon_packing.schema import collate, layout
    from energon_packing.testing.families import build

    processor, model, _ = build("phi4_multimodal")
    te = PackingTaskEncoder(max_input_seq_length=CAPACITY, processor=processor, pad_multiple=8)

    def pack(*conversations: tuple[str, dict, dict]):
        sources = []
        for key, document, parts in conversations:
            encoded = te.encode_sample(conversation_sample(key, document, parts))
            if document.get("audios"):  # it shares its pack only with text
                assert encoded.company == Company.APART
            items = [
                {
                    "key": key,
                    "input_ids": encoded.input_ids,
                    "token_mask": encoded.token_mask,
                    "images": encoded.images,
                    "videos": [],
                    "video_plans": [],
                    "audios": encoded.audios,
                }
            ]
            (source,) = te.chat.sources(items=items, config=te.config)
            sources.append(source)
        return collate([layout(sources, width=CAPACITY, pad_multiple=8, pad_id=te.pad_id)])

    speech, other_speech, plain = (
        (key, *AUDIO_BY_KEY[key]) for key in ("one_clip", "two_clips", "text_only")
    )
    picture = next(c for c in CONVERSATIONS if c.document.get("images"))
    pictures = (picture.key, picture.document, picture.images)
    with pytest.raises(ValueError, match=r"holds clips of 2 conversations") as raised:
        to_hf(pack(speech, other_speech), model=model)
    assert "one_clip" in str(raised.value) and "two_clips" in str(raised.value)
    with pytest.raises(ValueError, match=r"vision-speech.*one_clip \(no image\)"):
        to_hf(pack(speech, pictures), model=model)
    # text beside a clip changes nothing the model reads of the clip: accepted
    assert "audio_input_features" in to_hf(pack(speech, plain), model=model)
