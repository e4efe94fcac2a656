"""Mistral 3 and Pixtral-12B through transformers' own PixtralProcessor, which exists only with
torchvision (issue 33 items 3 and 5): the tests marked ``torchvision`` build the real processor
and its torchvision image processor (:mod:`energon_packing.testing.families_pixtral`) and run
where torchvision imports (the ``torchvision`` stack of .ci/stacks.txt); elsewhere they skip,
naming it. Without torchvision a Mistral 3 directory is refused in one line naming torchvision.

Per model (Mistral 3 over a Mistral text model, over a Ministral 3 text model whose attention
temperature grows with the position, and Pixtral-12B, a LLaVA model): through the real Energon
loader, token ids equal the processor's own, ``pixel_values`` and ``image_sizes`` equal the
processor's on each conversation alone, zero-padded across the pack as the processor pads a
call, and per-source logits of a pack equal each conversation alone, with a block-causal mask
and through the model's own padding-free path (``to_hf``: restarting positions, no mask).
"""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from helpers import conversation_sample, decode_image, loader_batches, make_dataset

from energon_packing import PackingTaskEncoder
from energon_packing.testing.synth import conversations

transformers = pytest.importorskip("transformers")

from energon_packing.encoding.processor_loading import load_processor  # noqa: E402
from energon_packing.testing.families import make_tokenizer  # noqa: E402
from energon_packing.testing.families_pixtral import (  # noqa: E402
    MISTRAL3_TEMPLATE,
    PIXTRAL_FAMILIES,
)

CAPACITY = 1024
CONVERSATIONS = list(conversations(16, seed=5))
BY_KEY = {c.key: c for c in CONVERSATIONS}


def _png(width: int, height: int, seed: int = 0) -> bytes:
    from PIL import Image

    rng = np.random.default_rng(seed)
    buffer = io.BytesIO()
    pixels = rng.integers(0, 255, (height, width, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture(scope="module")
def pixtral_dataset(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("pixtral"), CONVERSATIONS, per_shard=16)


@pytest.mark.torchvision
@pytest.mark.energon
@pytest.mark.parametrize("built", PIXTRAL_FAMILIES)
def test_a_pixtral_model_through_its_processor_and_the_loader(pixtral_dataset, built):
    import torch
    from test_families import _processor_call, concat_padded, images_in_order

    from energon_packing.hf import to_hf
    from energon_packing.testing import hf
    from energon_packing.testing.families import build
    from energon_packing.trainer import prepacked_microbatches

    processor, model, info = build(built)
    te = PackingTaskEncoder(max_input_seq_length=CAPACITY, processor=processor, pad_multiple=8)
    assert te.chat.family_name == "mistral3"
    sources = worst = free_worst = crossed = images = mixed = 0
    for batch in loader_batches(pixtral_dataset, te, buffer=8):
        (mb,) = prepacked_microbatches(batch, pad_multiple=8)
        logits = hf.run(model, hf.packed_kwargs(mb.model_inputs, mb.cu_seqlens_padded, info))
        # the model's own padding-free path: restarting positions, no mask (to_hf)
        kw = {k: v for k, v in to_hf(batch, model=model).items() if k != "use_cache"}
        assert "attention_mask" not in kw
        free = hf.run(model, kw)
        one_row = {**kw, "position_ids": torch.arange(kw["input_ids"].shape[1])[None]}
        across = hf.run(model, one_row)  # positions running on: the conversations see each other
        expected_media: dict[str, list] = {}
        sides = set()
        for k, key in enumerate(mb.source_ids):
            pictures = [decode_image(d) for d in images_in_order(BY_KEY[key])]
            reference = _processor_call(processor, BY_KEY[key], pictures)
            start, n = int(mb.cu_seqlens_padded[k]), int(mb.cu_seqlens[k + 1] - mb.cu_seqlens[k])
            ids = mb.model_inputs["input_ids"][0, start : start + n]
            assert torch.equal(ids, reference["input_ids"][0]), f"{built} {key}: token ids"
            assert torch.equal(  # positions restart per conversation
                mb.model_inputs["position_ids"][0, start : start + n], torch.arange(n)
            )
            assert set(reference) - {"input_ids", "attention_mask"} <= (
                {"pixel_values", "image_sizes"} if pictures else set()
            )
            for name in ("pixel_values", "image_sizes"):
                if name in reference:
                    expected_media.setdefault(name, []).append(reference[name])
            if pictures:
                sides.add(tuple(reference["pixel_values"].shape[-2:]))
                images += len(pictures)
            alone = hf.run(model, dict(reference))
            worst = max(worst, float((logits[start : start + n] - alone[:n]).abs().max()))
            free_worst = max(free_worst, float((free[start : start + n] - alone).abs().max()))
            crossed = max(crossed, float((across[start : start + n] - alone).abs().max()))
            sources += 1
        for name, parts in expected_media.items():  # bit-equal, padded as one call pads
            assert torch.equal(mb.model_inputs[name], concat_padded(parts)), f"{built} {name}"
        mixed += len(sides) > 1  # a pack whose conversations' pixels differ in size
    assert sources >= len(CONVERSATIONS) - 2 and not te.stats.skipped.keys() - {"overlong"}
    assert images >= 10 and mixed >= 1, (images, mixed)
    assert worst <= 1e-5, f"{built}: per-source logits differ by {worst:.2e}"
    assert free_worst <= 1e-5, f"{built}: to_hf's per-source logits differ by {free_worst:.2e}"
    assert crossed > 1e-2, f"{built}: positions running on change nothing ({crossed:.2e})"


@pytest.mark.torchvision
@pytest.mark.parametrize("built", ["mistral3", "pixtral"])
def test_predicted_costs_are_the_real_lengths(built):
    """A conversation costed from its image headers has exactly the processor's ids on the
    decoded pixels: fuzzed sizes (tiny, thin, over the longest edge), 1-3 images."""
    from test_families import hf_messages

    from energon_packing.testing.families import build

    processor, _, _ = build(built, model=False)
    te = PackingTaskEncoder(max_input_seq_length=1 << 16, processor=processor)
    rng = np.random.default_rng(11)
    cases = [[(1, 1)], [(16, 900)], [(900, 16)], [(64, 64), (65, 63)]]
    for _ in range(12):
        count = int(rng.integers(1, 4))
        cases.append([(int(rng.integers(1, 700)), int(rng.integers(1, 700))) for _ in range(count)])
    for case, sizes in enumerate(cases):
        names = [f"img{i}.png" for i in range(len(sizes))]
        content = [{"type": "image", "image": n} for n in names] + [
            {"type": "text", "text": f"Case {case}: what differs?"}
        ]
        document = {
            "messages": [
                {"role": "user", "content": content},
                {"role": "assistant", "content": "The sizes."},
            ],
            "images": names,
        }
        images = {n: _png(w, h, case) for n, (w, h) in zip(names, sizes)}
        encoded = te.encode_sample(conversation_sample(f"case{case}", document, images))
        text = processor.apply_chat_template(hf_messages(document), tokenize=False)
        real = processor(
            text=[text],
            images=[[decode_image(images[n]) for n in names]],
            add_special_tokens=False,  # the template writes BOS
            return_tensors="np",
        )
        assert encoded.input_ids.tolist() == real["input_ids"][0].tolist(), (built, sizes)
        source = te.chat.source(
            key=f"case{case}",
            input_ids=encoded.input_ids,
            token_mask=encoded.token_mask,
            images=encoded.images,
            config=te.config,
        )
        for name in ("pixel_values", "image_sizes"):
            assert np.array_equal(source.media[name], real[name]), (built, sizes, name)


@pytest.mark.torchvision
def test_an_image_the_processor_resizes_to_nothing_is_a_named_skip(caplog):
    """An aspect ratio over the longest edge (here 64 px) floors a side to 0 px, which the
    image processor refuses: the conversation is skipped ``image_aspect_ratio`` at encode time,
    naming the numbers."""
    import logging

    from megatron.energon.errors import SkipSample

    from energon_packing.testing.families import build

    caplog.set_level(logging.WARNING, logger="energon_packing")
    processor, _, _ = build("mistral3", model=False)
    te = PackingTaskEncoder(max_input_seq_length=4096, processor=processor)
    for width, height in ((3, 900), (900, 3)):
        image = _png(width, height)
        with pytest.raises(ValueError, match="0"):  # the processor's own refusal
            processor(text=["[IMG]"], images=[[decode_image(image)]])
        document = {
            "messages": [
                {"role": "user", "content": "<image>What is it?"},
                {"role": "assistant", "content": "A line."},
            ],
            "images": ["a.png"],
        }
        with pytest.raises(SkipSample):
            te.encode_sample(conversation_sample("thin", document, {"a.png": image}))
    assert dict(te.stats.skipped) == {"image_aspect_ratio": 2}
    assert "aspect ratio of 300.0: PixtralImageProcessor fits it into 64x64 px" in caplog.text


def _write_mistral3_directory(directory) -> None:
    """A Mistral 3 model directory as published (no torchvision needed to write it): the
    tokenizer, ``preprocessor_config.json`` naming ``PixtralImageProcessor``,
    ``processor_config.json`` naming ``PixtralProcessor``, the chat template, ``config.json``."""
    tokenizer = make_tokenizer(
        extra=["[INST]", "[/INST]", "[IMG]", "[IMG_BREAK]", "[IMG_END]"],
        bos="<s>",
        eos="</s>",
        pad="<pad>",
        add_bos=True,
    )
    tokenizer.save_pretrained(str(directory))
    (directory / "preprocessor_config.json").write_text(
        json.dumps(
            {
                "image_processor_type": "PixtralImageProcessor",
                "processor_class": "PixtralProcessor",
                "patch_size": {"height": 4, "width": 4},
                "size": {"longest_edge": 64},
            }
        )
    )
    (directory / "processor_config.json").write_text(
        json.dumps(
            {"processor_class": "PixtralProcessor", "patch_size": 4, "spatial_merge_size": 2}
        )
    )
    (directory / "chat_template.jinja").write_text(MISTRAL3_TEMPLATE)
    (directory / "config.json").write_text(json.dumps({"model_type": "mistral3"}))


def test_a_mistral3_directory_without_torchvision_is_refused_in_one_line(tmp_path, monkeypatch):
    """Where torchvision does not import (here, or made so), loading a Mistral 3 directory
    names torchvision and the install in one line, never transformers' several-line
    ImportError; the task encoder given the directory says the same."""
    from energon_packing.encoding import processor_loading

    _write_mistral3_directory(tmp_path)
    monkeypatch.setattr(processor_loading, "_torchvision_available", lambda: False)
    with pytest.raises(ValueError) as raised:
        load_processor(tmp_path)
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(
        f"{tmp_path}: PixtralProcessor (the mistral3 family) needs torchvision"
    )
    assert "pip install torchvision" in message
    with pytest.raises(ValueError, match="needs torchvision, which does not import here"):
        PackingTaskEncoder(max_input_seq_length=256, processor=str(tmp_path))


@pytest.mark.torchvision
def test_a_mistral3_directory_loads_with_torchvision(tmp_path):
    """With torchvision the same directory loads as transformers' PixtralProcessor over its
    torchvision image processor, packed as mistral3 with the processor's own ids."""
    from test_families import hf_messages

    _write_mistral3_directory(tmp_path)
    loaded = load_processor(tmp_path)
    assert type(loaded).__name__ == "PixtralProcessor"
    assert type(loaded.image_processor).__name__ == "PixtralImageProcessor"
    te = PackingTaskEncoder(max_input_seq_length=4096, processor=str(tmp_path))
    assert te.chat.family_name == "mistral3"
    document = {
        "messages": [
            {"role": "user", "content": "<image>What is it?"},
            {"role": "assistant", "content": "A square."},
        ],
        "images": ["a.png"],
    }
    image = _png(150, 100)
    encoded = te.encode_sample(conversation_sample("p", document, {"a.png": image}))
    text = loaded.apply_chat_template(hf_messages(document), tokenize=False)
    real = loaded(text=[text], images=[[decode_image(image)]], add_special_tokens=False)
    assert encoded.input_ids.tolist() == real["input_ids"][0].tolist()
    # 150x100 px within 64 px: 64x42, up to steps of 4 * 2 px: 64x48, 6 rows of 8 [IMG] tokens,
    # each ended by [IMG_BREAK] but the last, ended by [IMG_END]
    ids = encoded.input_ids.tolist()
    counts = [ids.count(t) for t in loaded.image_token_ids]
    assert counts == [48, 5, 1]


@pytest.mark.torchvision
def test_the_loss_mask_is_each_reply_and_its_eos_and_never_an_image():
    """Mistral's template has no generation prompt and ends a reply with EOS: each reply and
    its EOS train, the ``[INST]`` turns and every image token (an assistant's too) never."""
    from energon_packing.testing.families import build

    processor, _, _ = build("mistral3", model=False)
    te = PackingTaskEncoder(max_input_seq_length=4096, processor=processor)
    document = {
        "messages": [
            {"role": "user", "content": "<image>What is red?"},
            {"role": "assistant", "content": "The circle."},
            {"role": "user", "content": "Draw blue."},
            {"role": "assistant", "content": "Here: <image> the square."},
        ],
        "images": ["a.png", "b.png"],
    }
    images = {"a.png": _png(40, 30, 1), "b.png": _png(20, 50, 2)}
    encoded = te.encode_sample(conversation_sample("m", document, images))
    runs, current = [], []
    for token, weight in zip(encoded.input_ids.tolist(), encoded.token_mask.tolist()):
        if weight > 0:
            current.append(token)
        elif current:
            runs.append(current)
            current = []
    runs += [current] if current else []
    decoded = [processor.tokenizer.decode(r) for r in runs]
    assert decoded == ["The circle.</s>", "Here: ", " the square.</s>"]
    media = set(processor.image_token_ids)
    assert media & set(encoded.input_ids.tolist()) == media
    from test_families import hf_messages

    text = processor.apply_chat_template(hf_messages(document), tokenize=False)
    pictures = [[decode_image(images["a.png"]), decode_image(images["b.png"])]]
    real = processor(text=[text], images=pictures, add_special_tokens=False)
    assert encoded.input_ids.tolist() == real["input_ids"][0].tolist()
