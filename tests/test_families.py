"""Real model families through their own processors, through the real Energon loader.

For every family: a processor built offline (the family's processor class, the bundled BPE plus
its special tokens, its PIL image processor, its published chat template) and a tiny random-init
model of the family. Per family: token ids equal the processor's own, predicted costs are the
real lengths, every pixel field is bit-equal to the processor on the conversation alone, mRoPE
ids equal the model's ``get_rope_index``, and per-source logits in a loader pack equal the
conversation run alone.
"""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import torch
from helpers import conversation_sample, decode_image, loader_batches, make_dataset

from energon_packing import PackingTaskEncoder
from energon_packing.loader.samples import ConversationSample, load_conversation
from energon_packing.testing.synth import conversations
from energon_packing.trainer import prepacked_microbatches

transformers = pytest.importorskip("transformers")

from energon_packing.testing import hf  # noqa: E402
from energon_packing.testing.families import (  # noqa: E402
    FAMILIES,
    IDEFICS3_ROW_COL,
    MODELS,
    build,
)

pytestmark = pytest.mark.energon

CAPACITY = 1024
CONVERSATIONS = list(conversations(16, seed=5))
BY_KEY = {c.key: c for c in CONVERSATIONS}


@pytest.fixture(scope="module")
def family_dataset(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("families"), CONVERSATIONS, per_shard=16)


def hf_messages(document: dict) -> list[dict]:
    """The document in the processor's message format, written independently of the package:
    ``<image>`` strings become [image, text] parts, parts stay as they are."""
    messages = []
    for message in document["messages"]:
        content = message["content"]
        if isinstance(content, str):
            parts = []
            for k, text in enumerate(content.split("<image>")):
                if k:
                    parts.append({"type": "image"})
                if text:
                    parts.append({"type": "text", "text": text})
        else:
            parts = [
                {"type": "image"} if p["type"] == "image" else {"type": "text", "text": p["text"]}
                for p in content
            ]
        messages.append({"role": message["role"], "content": parts})
    return messages


def images_in_order(conversation) -> list[bytes]:
    names, order, cursor = list(conversation.document.get("images", [])), [], 0
    for message in conversation.document["messages"]:
        content = message["content"]
        if isinstance(content, str):
            for _ in range(content.count("<image>")):
                while names[cursor] in order:
                    cursor += 1
                order.append(names[cursor])
        else:
            order += [p["image"] for p in content if p["type"] == "image"]
    return [conversation.images[name] for name in order]


def _processor_call(processor, conversation, images) -> dict:
    text = processor.apply_chat_template(hf_messages(conversation.document), tokenize=False)
    bos = processor.tokenizer.bos_token
    return processor(
        text=[text],
        images=[images] if images else None,
        add_special_tokens=not (bos and text.startswith(bos)),  # as tokenize=True: one BOS
        return_tensors="pt",
    )


def concat_padded(parts: list[torch.Tensor], fill: float = 0) -> torch.Tensor:
    """``parts`` on dim 0, each padded to the widest first with ``fill``, as a processor pads a
    call."""
    widest = [max(p.shape[d] for p in parts) for d in range(1, parts[0].ndim)]
    padded = []
    for p in parts:
        pad = []
        for d in reversed(range(1, p.ndim)):
            pad += [0, widest[d - 1] - p.shape[d]]
        padded.append(torch.nn.functional.pad(p, pad, value=fill))
    return torch.cat(padded)


#: families whose full per-source proof runs under -m slow (.ci/run), keeping the README's test
#: command inside its budget; their ids, costs and masks stay in the default set
SLOW_PROOFS = (
    "llava",
    "llava_next",
    "internvl",
    "aya_vision",
    "gemma4",
    "ovis2",
    "ernie4_5_vl_moe",
    *MODELS,
)


#: families whose processor builds only with torchvision: their proof runs on the torchvision
#: stack (-m torchvision, .ci/stacks.txt)
TORCHVISION_PROOFS = ("kimi_k25",)


@pytest.mark.parametrize(
    "family",
    [
        pytest.param(f, marks=pytest.mark.slow) if f in SLOW_PROOFS else f
        for f in (*FAMILIES, *MODELS)
    ]
    + [pytest.param(f, marks=pytest.mark.torchvision) for f in TORCHVISION_PROOFS],
)
@pytest.mark.processor_media
def test_a_family_through_its_processor_and_the_loader(family_dataset, family):
    processor, model, info = build(family)
    te = PackingTaskEncoder(max_input_seq_length=CAPACITY, processor=processor, pad_multiple=8)
    assert te.chat.family_name == info["family"]
    sources = worst = 0
    for batch in loader_batches(family_dataset, te, buffer=8):
        (mb,) = prepacked_microbatches(batch, pad_multiple=8)
        logits = hf.run(model, hf.packed_kwargs(mb.model_inputs, mb.cu_seqlens_padded, info))
        expected_media: dict[str, list] = {}
        for k, key in enumerate(mb.source_ids):
            reference = _processor_call(
                processor,
                BY_KEY[key],
                [decode_image(d) for d in images_in_order(BY_KEY[key])],
            )
            start, n = int(mb.cu_seqlens_padded[k]), int(mb.cu_seqlens[k + 1] - mb.cu_seqlens[k])
            ids = mb.model_inputs["input_ids"][0, start : start + n]
            assert torch.equal(ids, reference["input_ids"][0]), f"{family} {key}: token ids"
            for name, value in reference.items():
                if name in ("input_ids", "attention_mask"):
                    continue
                if value.ndim == 2 and value.shape == reference["input_ids"].shape:  # per token
                    got = mb.model_inputs[name][0, start : start + n]
                    assert torch.equal(got, value[0]), f"{family} {key}: {name}"
                else:
                    expected_media.setdefault(name, []).append(value)
            if te.mrope:  # the family's own rule: the model's get_rope_index on the source
                rope, _ = model.model.get_rope_index(
                    reference["input_ids"],
                    reference["mm_token_type_ids"],
                    image_grid_thw=reference.get("image_grid_thw"),
                    video_grid_thw=None,
                    attention_mask=None,
                )
                got = mb.model_inputs["position_ids"][:, 0, start : start + n]
                assert torch.equal(got, rope[:, 0]), f"{family} {key}: mRoPE ids"
            alone_logits = hf.run(model, dict(reference))
            worst = max(worst, float((logits[start : start + n] - alone_logits[:n]).abs().max()))
            sources += 1
        for name, parts in expected_media.items():  # bit-equal, in source order
            assert torch.equal(mb.model_inputs[name], concat_padded(parts)), f"{family} {name}"
        assert set(expected_media) <= set(mb.model_inputs)
    assert sources >= len(CONVERSATIONS) - 2 and not te.stats.skipped.keys() - {"overlong"}
    assert worst <= 1e-5, f"{family}: per-source logits differ by {worst:.2e}"


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.processor_media
def test_predicted_costs_are_the_real_lengths(family):
    """encode_sample costs a conversation from its image headers; the processor, run on the
    decoded pixels, gives exactly that many tokens (fuzzed image sizes, 1-3 images); the token
    it counts an image's slots by is the one the model fills (its config's image token), so
    the pack-time check of the image side against the ids is never trivially true."""
    processor, model, _ = build(family)
    te = PackingTaskEncoder(max_input_seq_length=1 << 16, processor=processor)
    config = model.config
    filled = next(
        getattr(config, name)
        for name in ("image_token_id", "image_token_index")
        if getattr(config, name, None) is not None
    )
    assert te.image_token_id == filled, (family, te.image_token_id, filled)
    rng = np.random.default_rng(7)
    for case in range(12):
        sizes = [
            (int(rng.integers(8, 700)), int(rng.integers(8, 700)))
            for _ in range(int(rng.integers(1, 4)))
        ]
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
        images = {n: _png(w, h) for n, (w, h) in zip(names, sizes)}
        sample = conversation_sample(f"case{case}", document, images)
        encoded = te.encode_sample(sample)
        assert np.count_nonzero(encoded.input_ids == filled) > 0, family
        pil = [decode_image(images[n]) for n in names]
        text = processor.apply_chat_template(hf_messages(document), tokenize=False)
        bos = processor.tokenizer.bos_token
        out = processor(
            text=[text],
            images=[pil],
            add_special_tokens=not (bos and text.startswith(bos)),
            return_tensors="np",
        )
        real = out["input_ids"][0]
        assert encoded.length == len(real) and encoded.input_ids.tolist() == real.tolist(), (
            f"{family}: image (width, height) {sizes}"
        )
        # the token-aligned fields (token types, ERNIE's MoE types), as the release's own call
        (mine,) = te.chat.images.token_fields_of_pack([encoded.input_ids])
        aligned = {k for k in out if k.endswith("token_type_ids")}
        assert set(mine) == aligned, family
        for name in aligned:
            assert mine[name].tolist() == np.asarray(out[name][0]).tolist(), (family, name)


def _png(width: int, height: int) -> bytes:
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (width % 256, height % 256, 90)).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.mark.processor_media
def test_the_loss_mask_covers_each_reply_and_its_end_of_turn():
    processor, _, _ = build("qwen2_vl")
    te = PackingTaskEncoder(max_input_seq_length=4096, processor=processor)
    messages = [
        {"role": "user", "content": "What is red?"},
        {"role": "assistant", "content": "The circle."},
        {"role": "user", "content": "And blue?"},
        {"role": "assistant", "content": "The square."},
    ]
    sample = conversation_sample("m", {"messages": messages})
    decode_ids = processor.tokenizer.decode

    def trained(**knobs):
        encoder = PackingTaskEncoder(max_input_seq_length=4096, processor=processor, **knobs)
        encoded = encoder.encode_sample(sample)
        runs, current = [], []
        for token, weight in zip(encoded.input_ids.tolist(), encoded.token_mask.tolist()):
            if weight > 0:
                current.append(token)
            elif current:
                runs.append(decode_ids(current))
                current = []
        return runs + ([decode_ids(current)] if current else [])

    assert trained() == ["The circle.<|im_end|>", "The square.<|im_end|>"]
    assert trained(train_on="last_assistant") == ["The square.<|im_end|>"]
    assert trained(train_on="assistant_messages") == [
        "<|im_start|>assistant\nThe circle.<|im_end|>\n",
        "<|im_start|>assistant\nThe square.<|im_end|>\n",
    ]
    assert te.encode_sample(sample).token_mask[0] == 0


@pytest.mark.processor_media
def test_the_builtin_layout_and_a_chatml_processor_agree():
    """The processor path on a ChatML template (Qwen2-VL's, without its default system turn)
    with the bundled tokenizer gives the built-in layout's ids and mask, images included."""
    from transformers import Qwen2VLProcessor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    from energon_packing.encoding.processor_loading import image_only
    from energon_packing.testing.families import make_tokenizer
    from energon_packing.testing.templates import QWEN2_VL_TEMPLATE

    template = QWEN2_VL_TEMPLATE.replace(
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n", ""
    )
    tokenizer = make_tokenizer(pad="<|endoftext|>")
    from energon_packing.config import DEFAULT_MAX_PIXELS, DEFAULT_MIN_PIXELS

    # the built-in layout's bounds, given: on transformers 5.12 Qwen2VLImageProcessorPil(
    # max_pixels=...) elsewhere in the process writes into the class's default size dict
    size = {"shortest_edge": DEFAULT_MIN_PIXELS, "longest_edge": DEFAULT_MAX_PIXELS}
    processor = image_only(Qwen2VLProcessor)(
        image_processor=Qwen2VLImageProcessorPil(size=size),
        tokenizer=tokenizer,
        chat_template=template,
    )
    ours = PackingTaskEncoder(max_input_seq_length=8192, tokenizer="bundled")
    theirs = PackingTaskEncoder(max_input_seq_length=8192, processor=processor)
    checked = 0
    for conversation in CONVERSATIONS:
        fields = load_conversation(
            {"json": json.dumps(conversation.document).encode(), **conversation.images}
        )
        sample = ConversationSample(__key__=conversation.key, __restore_key__=(), **fields)
        a, b = ours.encode_sample(sample), theirs.encode_sample(sample)
        assert a.input_ids.tolist() == b.input_ids.tolist(), conversation.key
        assert a.token_mask.tolist() == b.token_mask.tolist(), conversation.key
        checked += bool(a.images)
    assert checked >= 5


@pytest.mark.processor_media
def test_bad_input_on_a_processor_path(caplog):
    import logging

    from megatron.energon.errors import SkipSample

    caplog.set_level(logging.WARNING, logger="energon_packing")
    from helpers import require_processor_media

    from energon_packing.testing.families import make_tokenizer

    require_processor_media("gemma3")
    gemma, _, _ = build("gemma3")
    te = PackingTaskEncoder(max_input_seq_length=4096, processor=gemma)

    def encode(key, document, images=None):
        sample = conversation_sample(key, document, images)
        te.encode_sample(sample)

    with pytest.raises(SkipSample):  # roles must alternate: the template raises
        encode(
            "twice",
            {
                "messages": [
                    {"role": "user", "content": "a"},
                    {"role": "user", "content": "b"},
                    {"role": "assistant", "content": "c"},
                ]
            },
        )
    assert te.stats.skipped["template_error"] == 1
    assert "roles must alternate" in caplog.text  # the template's own message
    qwen, _, _ = build("qwen2_vl")
    te = PackingTaskEncoder(max_input_seq_length=4096, processor=qwen)
    with pytest.raises(SkipSample):  # Qwen refuses an aspect ratio over 200
        encode(
            "thin",
            {
                "messages": [
                    {"role": "user", "content": "<image>?"},
                    {"role": "assistant", "content": "x"},
                ],
                "images": ["a.png"],
            },
            {"a.png": _png(2000, 8)},
        )
    # the built-in path's reason (issue 17.1), never unsupported_image
    assert dict(te.stats.skipped) == {"image_aspect_ratio": 1}
    assert "aspect ratio of 250.0" in caplog.text
    bare = make_tokenizer()
    with pytest.raises(ValueError, match="has no chat template"):
        PackingTaskEncoder(max_input_seq_length=64, processor=bare)
    with pytest.raises(ValueError, match="not both"):
        PackingTaskEncoder(max_input_seq_length=64, processor=qwen, tokenizer="bundled")


@pytest.mark.processor_media
def test_the_overlong_policy_on_a_processor_path(caplog):
    """truncate cuts to the pack width and never an image; an image past the width is
    overlong_media naming where it ends; drop and error as on the built-in path."""
    import logging

    from megatron.energon.errors import SkipSample

    from energon_packing.loader.task_encoder import PackingError

    caplog.set_level(logging.WARNING, logger="energon_packing")
    qwen, _, _ = build("qwen2_vl")
    image_id = qwen.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    long_text = " ".join(f"word{i}" for i in range(400))

    def sample(key, user):
        document = {
            "messages": [
                {"role": "user", "content": user},
                {"role": "assistant", "content": long_text},
            ],
            "images": ["a.png"],
        }
        return conversation_sample(key, document, {"a.png": _png(112, 112)})

    full = PackingTaskEncoder(max_input_seq_length=1 << 14, processor=qwen)
    first = full.encode_sample(sample("first", "<image>Describe."))
    ids = first.input_ids.tolist()
    images = ids.count(image_id)
    image_end = len(ids) - ids[::-1].index(image_id)
    capacity = 256
    assert image_end < capacity < len(ids) and images > 0

    te = PackingTaskEncoder(max_input_seq_length=capacity, processor=qwen, overlong="truncate")
    cut = te.encode_sample(sample("first", "<image>Describe."))
    assert cut.input_ids.tolist() == ids[:capacity]
    assert cut.token_mask.tolist() == first.token_mask.tolist()[:capacity]
    last = full.encode_sample(sample("last", long_text + "<image>"))
    last_ids = last.input_ids.tolist()
    vision_end = qwen.tokenizer.convert_tokens_to_ids("<|vision_end|>")
    last_end = len(last_ids) - last_ids[::-1].index(vision_end)  # an image ends at its marker
    assert last_ids[last_end - 2] == image_id
    with pytest.raises(SkipSample):
        te.encode_sample(sample("last", long_text + "<image>"))
    assert te.stats.skipped["overlong_media"] == 1
    assert f"videos / audio clips end at token {last_end} and are never cut" in caplog.text

    dropping = PackingTaskEncoder(max_input_seq_length=capacity, processor=qwen, overlong="drop")
    with pytest.raises(SkipSample):
        dropping.encode_sample(sample("first", "<image>Describe."))
    assert dropping.stats.skipped["overlong"] == 1
    strict = PackingTaskEncoder(max_input_seq_length=capacity, processor=qwen, overlong="error")
    with pytest.raises(PackingError, match=f"sample 'first': {len(ids)} tokens .*overlong="):
        strict.encode_sample(sample("first", "<image>Describe."))


def test_a_tokenizer_only_model_through_its_chat_template(caplog):
    """A tokenizer with a chat template is a text-only processor: each conversation in a pack
    is exactly the tokenizer's own ids of its rendered template; an image is a named skip."""
    import logging

    from megatron.energon.errors import SkipSample

    from energon_packing.testing.families import make_tokenizer
    from energon_packing.testing.templates import QWEN2_VL_TEMPLATE

    caplog.set_level(logging.WARNING, logger="energon_packing")
    tokenizer = make_tokenizer(pad="<|endoftext|>")
    tokenizer.chat_template = QWEN2_VL_TEMPLATE
    te = PackingTaskEncoder(max_input_seq_length=512, processor=tokenizer)
    documents = [
        {
            "messages": [
                {"role": "user", "content": f"Question {i}?"},
                {"role": "assistant", "content": f"Answer {i}."},
            ]
        }
        for i in range(3)
    ]

    encoded = [te.encode_sample(conversation_sample(f"t{i}", d)) for i, d in enumerate(documents)]
    batch = te.batch([te.pack_selected_samples(encoded)])
    cu = batch["cu_seqlens"][0].tolist()
    for k, document in enumerate(documents):
        text = tokenizer.apply_chat_template(document["messages"], tokenize=False)
        expected = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert batch["input_ids"][0][cu[k] : cu[k + 1]].tolist() == expected
    assert not any(key in batch for key in ("pixel_values", "image_grid_thw"))

    pictured = {
        "messages": [
            {"role": "user", "content": "<image>What is it?"},
            {"role": "assistant", "content": "A square."},
        ],
        "images": ["a.png"],
    }
    with pytest.raises(SkipSample):
        te.encode_sample(conversation_sample("pictured", pictured, {"a.png": _png(32, 32)}))
    assert te.stats.skipped["unsupported_image"] == 1
    assert "is a tokenizer: a conversation with images needs a processor" in caplog.text


#: Each family's media tokens, spelled out here as the oracle (the package derives them from the
#: processor: its image expansion and the template's markup around a placeholder).
MEDIA_TOKENS = {
    "qwen2_vl": ["<|vision_start|>", "<|image_pad|>", "<|vision_end|>"],
    "qwen2_5_vl": ["<|vision_start|>", "<|image_pad|>", "<|vision_end|>"],
    "qwen3_vl": ["<|vision_start|>", "<|image_pad|>", "<|vision_end|>"],
    "gemma3": ["<start_of_image>", "<image_soft_token>", "<end_of_image>"],
    "idefics3": ["<fake_token_around_image>", "<image>", "<global-img>", *IDEFICS3_ROW_COL],
    "smolvlm": ["<fake_token_around_image>", "<image>", "<global-img>", *IDEFICS3_ROW_COL],
    "llava_onevision": ["<image>"],
    "llava": ["<image>"],
    "llava_next": ["<image>"],
    "internvl": ["<img>", "<IMG_CONTEXT>", "</img>"],
    "aya_vision": ["<|START_OF_IMG|>", "<|IMG_PATCH|>", "<|END_OF_IMG|>"],
    "glm4v": ["<|begin_of_image|>", "<|image|>", "<|end_of_image|>"],
    "gemma4": ["<|image>", "<|image|>", "<image|>"],
    "ernie4_5_vl_moe": ["<|IMAGE_START|>", "<|IMAGE_PLACEHOLDER|>", "<|IMAGE_END|>"],
    "ovis2": ["<IMG_START>", "<IMG_ATOM>", "<IMG_GRID>", "<IMG_COL>", "<IMG_ROW>", "<IMG_END>"],
}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.processor_media
def test_an_image_in_an_assistant_turn_is_never_trained(family):
    """Wherever an image sits, none of its tokens carries loss weight (the reply's text does);
    the ids are the processor's own. Qwen3-VL's template drops assistant images: a named skip."""
    from megatron.energon.errors import SkipSample

    processor, _, _ = build(family, model=False)
    te = PackingTaskEncoder(max_input_seq_length=1 << 14, processor=processor)
    document = {
        "messages": [
            {"role": "user", "content": "<image>Draw another."},
            {"role": "assistant", "content": "Here: <image> a red square."},
        ],
        "images": ["a.png", "b.png"],
    }
    images = {"a.png": _png(150, 100), "b.png": _png(64, 200)}
    sample = conversation_sample("drawn", document, images)
    if family == "qwen3_vl":
        with pytest.raises(SkipSample):
            te.encode_sample(sample)
        assert te.stats.skipped["placeholder_mismatch"] == 1
        return
    encoded = te.encode_sample(sample)
    ids, mask = encoded.input_ids.tolist(), encoded.token_mask.tolist()
    text = processor.apply_chat_template(hf_messages(document), tokenize=False)
    bos = processor.tokenizer.bos_token
    real = processor(
        text=[text],
        images=[[decode_image(images["a.png"]), decode_image(images["b.png"])]],
        add_special_tokens=not (bos and text.startswith(bos)),
        return_tensors="np",
    )["input_ids"][0]
    assert ids == real.tolist()
    media = set(processor.tokenizer.convert_tokens_to_ids(MEDIA_TOKENS[family]))
    assert all(weight == 0 for token, weight in zip(ids, mask) if token in media)
    trained = processor.tokenizer.decode([t for t, w in zip(ids, mask) if w > 0])
    assert "a red square." in trained and "Here:" in trained
    assert not media & {t for t, w in zip(ids, mask) if w > 0}


def test_an_image_in_an_assistant_turn_is_never_trained_on_the_builtin_path():
    te = PackingTaskEncoder(max_input_seq_length=4096, tokenizer="bundled")
    document = {
        "messages": [
            {"role": "user", "content": "Draw it."},
            {"role": "assistant", "content": "Here: <image> a red square."},
        ],
        "images": ["b.png"],
    }
    sample = conversation_sample("drawn", document, {"b.png": _png(64, 200)})
    encoded = te.encode_sample(sample)
    special = te.tokenizer.special
    media = {special.vision_start, special.image_pad, special.vision_end}
    ids, mask = encoded.input_ids.tolist(), encoded.token_mask.tolist()
    assert media <= set(ids)
    assert all(weight == 0 for token, weight in zip(ids, mask) if token in media)
    assert "a red square." in te.tokenizer.decode([t for t, w in zip(ids, mask) if w > 0])


@pytest.mark.parametrize("orientation", [6, 8])
@pytest.mark.processor_media
def test_an_exif_rotated_jpeg_is_packed_as_load_image_sees_it(orientation):
    """A JPEG whose EXIF tag says "rotate": the grid, the pixels and the ids through the
    processor path equal transformers' ``load_image`` (which applies ``exif_transpose``) and
    the processor, for the size predicted from the header as for the pixels."""
    from PIL import Image
    from transformers.image_utils import load_image

    processor, _, _ = build("qwen2_vl", model=False)
    pixels = np.random.default_rng(orientation).integers(0, 255, (16, 80, 3), dtype=np.uint8)
    exif = Image.Exif()
    exif[0x0112] = orientation
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG", exif=exif.tobytes(), quality=95)
    data = buffer.getvalue()
    document = {
        "messages": [
            {"role": "user", "content": "<image>Which way is up?"},
            {"role": "assistant", "content": "This way."},
        ],
        "images": ["a.jpg"],
    }
    te = PackingTaskEncoder(max_input_seq_length=4096, processor=processor)
    sample = conversation_sample("x", document, {"a.jpg": data})
    encoded = te.encode_sample(sample)
    source = te.chat.source(
        key="x",
        input_ids=encoded.input_ids,
        token_mask=encoded.token_mask,
        images=encoded.images,
        config=te.config,
    )
    upright = load_image(Image.open(io.BytesIO(data)))
    assert upright.size == (16, 80)  # (width, height) after the rotation
    text = processor.apply_chat_template(hf_messages(document), tokenize=False)
    reference = processor(text=[text], images=[[upright]], return_tensors="np")
    assert source.media["image_grid_thw"].tolist() == reference["image_grid_thw"].tolist()
    assert np.array_equal(source.media["pixel_values"], reference["pixel_values"])
    assert encoded.input_ids.tolist() == reference["input_ids"][0].tolist()


@pytest.mark.processor_media
def test_pack_time_checks_the_image_side_against_the_encoded_ids():
    """Ids are not tokenized again at pack time, so the image processor's real outputs are
    checked against them: a size rule that disagrees, or ids with another image-token count,
    is a ProcessorMismatchError naming the family."""
    import dataclasses

    from energon_packing.encoding.processor import ProcessorMismatchError

    processor, _, _ = build("qwen2_vl", model=False)
    te = PackingTaskEncoder(max_input_seq_length=4096, processor=processor)
    document = {
        "messages": [
            {"role": "user", "content": "<image>What is it?"},
            {"role": "assistant", "content": "A square."},
        ],
        "images": ["a.png"],
    }
    sample = conversation_sample("m", document, {"a.png": _png(150, 100)})
    encoded = te.encode_sample(sample)
    fields = dict(key="m", token_mask=encoded.token_mask, images=encoded.images, config=te.config)
    te.chat.source(input_ids=encoded.input_ids, **fields)  # consistent: no error
    image_id = te.chat.image_token_id
    ids = encoded.input_ids.tolist()
    fewer = np.asarray(ids[: ids.index(image_id)] + ids[ids.index(image_id) + 1 :])
    with pytest.raises(ProcessorMismatchError, match="qwen2_vl .* the encoded ids hold"):
        te.chat.source(input_ids=fewer, **fields)
    side = te.chat.images
    rule = side.family.replacement_inputs
    side.family = dataclasses.replace(
        side.family,
        replacement_inputs=lambda p, sizes: rule(p, [[(2 * h, w) for h, w in s] for s in sizes]),
    )
    with pytest.raises(ProcessorMismatchError, match="size rule"):
        te.chat.source(input_ids=encoded.input_ids, **fields)


def _noisy_png(width: int, height: int, seed: int) -> bytes:
    import io

    from PIL import Image

    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 255, (height, width, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.mark.processor_media
def test_a_pack_takes_one_image_processor_call_and_a_bad_member_costs_only_itself(monkeypatch):
    """Qwen's image processor takes each image alone: one call for a whole pack, split per
    conversation, gives exactly the per-conversation outputs, and the pack joins them back
    without a copy; a member whose image fails at pack time, or whose ids disagree with its
    images, is skipped alone and its pack-mates keep their exact pixels."""
    import dataclasses

    from energon_packing.schema import Source, layout

    processor, _, _ = build("qwen2_vl", model=False)
    te = PackingTaskEncoder(max_input_seq_length=4096, processor=processor)
    sizes = {"a": [(40, 60)], "b": [(90, 30), (50, 50)], "c": [], "d": [(56, 28)], "e": [(20, 70)]}
    encoded = []
    for n, (key, dims) in enumerate(sizes.items()):
        names = [f"i{k}.png" for k in range(len(dims))]
        document = {
            "messages": [
                {"role": "user", "content": "<image>" * len(dims) + "What is it?"},
                {"role": "assistant", "content": "A picture."},
            ],
            "images": names,
        }
        images = {
            name: _noisy_png(w, h, 10 * n + k) for k, (name, (w, h)) in enumerate(zip(names, dims))
        }
        encoded.append(te.encode_sample(conversation_sample(key, document, images)))
    side = te.chat.images
    alone = [
        side.media(key=e.__key__, images=e.images, input_ids=e.input_ids, config=te.config)
        for e in encoded
    ]
    calls = []
    image_processor = type(processor.image_processor)
    real = image_processor.preprocess
    monkeypatch.setattr(
        image_processor, "preprocess", lambda self, *a, **k: calls.append(1) or real(self, *a, **k)
    )
    type_calls = []
    real_types = type(processor).create_mm_token_type_ids
    monkeypatch.setattr(
        type(processor),
        "create_mm_token_type_ids",
        lambda self, ids: type_calls.append(len(ids)) or real_types(self, ids),
    )
    sources = te._sources(encoded)
    assert len(calls) == 1 and [s.key for s in sources] == list(sizes)
    assert type_calls == [1]  # the pack's ids joined: one row, one call
    for source, media, e in zip(sources, alone, encoded):
        assert source.media.keys() == media.keys()
        for name, value in media.items():
            assert np.array_equal(source.media[name], value), (source.key, name)
        (own,) = real_types(processor, [e.input_ids.tolist()])  # the processor, per conversation
        assert source.token_fields.keys() == {"mm_token_type_ids"}
        assert source.token_fields["mm_token_type_ids"].tolist() == own, source.key
    pack = layout(sources, width=4096, pad_multiple=1, pad_id=te.pad_id)
    whole = np.concatenate([m["pixel_values"] for m in alone if m])
    assert np.array_equal(pack.media["pixel_values"], whole)
    assert np.shares_memory(pack.media["pixel_values"], sources[0].media["pixel_values"])
    pack.check(image_pad_id=te.image_token_id)

    ids = encoded[1].input_ids.copy()
    ids[np.flatnonzero(ids == te.image_token_id)[0]] = 0  # one image token fewer than its image
    bad = list(encoded)
    bad[1] = dataclasses.replace(encoded[1], input_ids=ids)
    bad[3] = dataclasses.replace(encoded[3], images=[encoded[3].images[0][:40]])  # cut bytes
    sources = te._sources(bad)
    assert [s.key for s in sources] == ["a", "c", "e"]
    assert te.stats.skipped == {"source_error": 1, "corrupt_image": 1}
    assert te.stats.skipped_keys == {"source_error": ["b"], "corrupt_image": ["d"]}
    for source, media, e in zip(sources, [alone[0], alone[2], alone[4]], encoded[::2]):
        for name, value in media.items():
            assert np.array_equal(source.media[name], value), (source.key, name)
        (own,) = real_types(processor, [e.input_ids.tolist()])
        assert source.token_fields["mm_token_type_ids"].tolist() == own, source.key
    assert all(isinstance(s, Source) for s in sources)


@pytest.mark.parametrize("family", FAMILIES)
def test_an_older_releases_expansion_rule_is_the_public_one_where_both_exist(family):
    """``Family.expansion`` (what the processor path uses where the installed processor has no
    public ``replace_image_token``; the ``processor_media`` tests prove it against that
    release's own ``__call__`` on the older CI stacks) gives, on a release that has both, what
    the processor's own ``replace_image_token`` gives, per image of fuzzed sizes."""
    from energon_packing.encoding import hf_compat
    from energon_packing.encoding.families import family_of

    processor = build(family, model=False)[0]
    rules = family_of(processor)
    if rules.expansion is None:  # refused there, in one line (processor_media_refusal)
        pytest.skip(f"{family}: no rule for releases before the public expansion API")
    if not hf_compat.processor_media_api(processor):
        pytest.skip(f"transformers {transformers.__version__}: {family} has no public expansion")
    try:
        rules.expansion(processor, rules.replacement_inputs(processor, [[(64, 64)]]), 0)
    except hf_compat.TransformersCompatError as e:  # the older release's helper is gone
        pytest.skip(str(e))
    rng = np.random.default_rng(3)
    for _ in range(8):
        sizes = [(int(rng.integers(20, 900)), int(rng.integers(20, 900))) for _ in range(3)]
        for per_text in ([sizes[0]], sizes):
            inputs = rules.replacement_inputs(processor, [per_text])
            for i in range(len(per_text)):
                expected = processor.replace_image_token(inputs, i)
                assert rules.expansion(processor, inputs, i) == expected, (family, per_text, i)
    assert getattr(processor, rules.placeholder) == processor.image_token


@pytest.mark.parametrize("family", FAMILIES)
def test_the_tokenizer_backend_called_directly_gives_the_tokenizers_ids(family):
    """The encode path calls the ``tokenizers`` backend as the fast tokenizer's ``__call__``
    does, without its conversions: the same ids and offsets on any text (special tokens,
    spelled-out pieces of them, whitespace runs, accents), and the tokenizer's own call
    whenever the backend holds state ``__call__`` would reset first."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from energon_packing.encoding.rendering import backend_encoder

    tokenizer = build(family, model=False)[0].tokenizer
    encode = backend_encoder(tokenizer)
    assert encode is not None

    def own(text, flag):
        out = tokenizer(text, add_special_tokens=flag, return_offsets_mapping=True)
        return list(out["input_ids"]), list(out["offset_mapping"])

    pieces = [*map(str, tokenizer.all_special_tokens), "<|", "im_", " ", "\n\n", "é", "\u200b"]
    texts = st.lists(st.sampled_from(pieces) | st.text(max_size=12), max_size=12).map("".join)

    @settings(max_examples=60, deadline=None)
    @given(text=texts, flag=st.booleans())
    def same(text, flag):
        assert encode(text, flag) == own(text, flag)

    same()
    long_text = "one two three four five six seven " * 4
    expected = own(long_text, False)
    tokenizer._tokenizer.enable_truncation(max_length=3)  # left behind by someone's code
    assert encode(long_text, False) == expected  # not cut at 3: __call__ resets it
    tokenizer.split_special_tokens = True
    try:
        special = str(tokenizer.all_special_tokens[0]) + "x"
        assert encode(special, False) == own(special, False)
        assert len(encode(special, False)[0]) > 2  # really split: the attribute is honoured
    finally:
        tokenizer.split_special_tokens = False


def test_a_tokenizer_that_overrides_its_encoding_keeps_its_own_call():
    from transformers.tokenization_utils_tokenizers import TokenizersBackend

    from energon_packing.encoding.rendering import backend_encoder

    tokenizer = build("qwen2_vl", model=False)[0].tokenizer

    class Mine(type(tokenizer)):
        def _encode_plus(self, *args, **kwargs):
            return TokenizersBackend._encode_plus(self, *args, **kwargs)

    assert backend_encoder(tokenizer) is not None
    tokenizer.__class__ = Mine
    assert backend_encoder(tokenizer) is None
