"""The same image or video twice in one conversation (issue 31, item 5): packed as the model's
processor lays it out, its tokens and pixels where each reference stands, decoded once.

A document names a medium twice either by listing it twice (``images: [a, a]`` with two
``<image>`` placeholders) or by two content parts naming the one listed entry. The reference is
the real transformers processor called with the image passed twice, and, for videos (whose real
processor needs torchvision, absent on the CPU wheel), the same conversation with the clip
stored under two names: a form the video tests prove against the real processors.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from helpers import conversation_sample, require_processor_media
from PIL import Image

from energon_packing import PackingTaskEncoder
from energon_packing.encoding import builtin, processor_images

VIDEO = (Path(__file__).parent / "data" / "video" / "h264_48x36_10fps_2s.mp4").read_bytes()


def _png(width: int, height: int, seed: int = 0) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


A, B = _png(40, 30, seed=1), _png(28, 56, seed=2)


def _parts(kind: str, names: list[str]) -> list[dict]:
    """A user turn and a reply where the user shows ``names`` (parts) around text."""
    content = [{"type": "text", "text": "Look:"}]
    for name in names:
        content += [{"type": kind, kind: name}, {"type": "text", "text": "and"}]
    return [
        {"role": "user", "content": [*content, {"type": "text", "text": "same?"}]},
        {"role": "assistant", "content": "Yes, the same."},
    ]


#: the same image named twice (a, b, a), two ways: two parts naming one listed entry, and
#: listed twice with a placeholder each; each beside its reference form, the third image
#: stored under a name of its own (c) with a's bytes
_SAID = [
    {"role": "user", "content": "<image>Look<image>and<image>same?"},
    {"role": "assistant", "content": "Yes, the same."},
]
TWICE = {
    "parts": (
        ({"messages": _parts("image", ["a.png", "b.png", "a.png"]), "images": ["a.png", "b.png"]}, {"a.png": A, "b.png": B}),
        ({"messages": _parts("image", ["a.png", "b.png", "c.png"]), "images": ["a.png", "b.png", "c.png"]}, {"a.png": A, "b.png": B, "c.png": A}),
    ),
    "listed": (
        ({"messages": _SAID, "images": ["a.png", "b.png", "a.png"]}, {"a.png": A, "b.png": B}),
        ({"messages": _SAID, "images": ["a.png", "b.png", "c.png"]}, {"a.png": A, "b.png": B, "c.png": A}),
    ),
}  # fmt: skip


def _source(te: PackingTaskEncoder, document: dict, parts: dict[str, bytes]):
    encoded = te.encode_sample(conversation_sample("k", document, parts))
    return encoded, te.chat.source(
        key="k",
        input_ids=encoded.input_ids,
        token_mask=encoded.token_mask,
        images=encoded.images,
        videos=encoded.videos,
        video_plans=encoded.video_plans,
        config=te.config,
    )


def _count_calls(monkeypatch, module, name: str) -> list:
    calls: list = []
    real = getattr(module, name)

    def counted(data, *args, **kwargs):
        calls.append(data)
        return real(data, *args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls


@pytest.mark.parametrize("form", sorted(TWICE))
@pytest.mark.processor_media
def test_an_image_twice_through_a_processor_is_the_processor_given_it_twice(form, monkeypatch):
    """Qwen2-VL's processor: ids, grids and pixels equal transformers' own processor called
    with the image passed twice; the image is decoded once."""
    from energon_packing.testing.families import build

    require_processor_media("qwen2_vl")
    processor, _, _ = build("qwen2_vl", model=False)
    te = PackingTaskEncoder(max_input_seq_length=4096, processor=processor)
    decodes = _count_calls(monkeypatch, processor_images, "decode")
    (document, parts), _ = TWICE[form]
    encoded, source = _source(te, document, parts)
    assert len(decodes) == 2  # a and b, once each
    text = processor.apply_chat_template(_hf(document), tokenize=False)
    pictures = [Image.open(io.BytesIO(data)).convert("RGB") for data in (A, B, A)]
    reference = processor(text=[text], images=[pictures], return_tensors="np")
    assert encoded.input_ids.tolist() == reference["input_ids"][0].tolist()
    assert source.images == 3  # three references, three images in the pack
    assert source.media["image_grid_thw"].tolist() == reference["image_grid_thw"].tolist()
    assert np.array_equal(source.media["pixel_values"], reference["pixel_values"])


def _hf(document: dict) -> list[dict]:
    """The document as the processor's chat template takes it (written independently)."""
    out = []
    for message in document["messages"]:
        content = message["content"]
        if isinstance(content, str):
            parts = []
            for k, text in enumerate(content.split("<image>")):
                parts += [{"type": "image"}] if k else []
                parts += [{"type": "text", "text": text}] if text else []
        else:
            parts = [
                {"type": "image"} if p["type"] == "image" else {"type": "text", "text": p["text"]}
                for p in content
            ]
        out.append({"role": message["role"], "content": parts})
    return out


@pytest.mark.parametrize("form", sorted(TWICE))
def test_an_image_twice_on_the_builtin_path_is_packed_where_each_reference_stands(
    form, monkeypatch
):
    """The built-in layout: the ids, grids, pixels and positions of the image named twice equal
    those of the same bytes stored under two names; it is decoded once."""
    te = PackingTaskEncoder(max_input_seq_length=4096, tokenizer="bundled")
    twice, two_names = TWICE[form]
    expected_encoded, expected = _source(te, *two_names)
    decodes = _count_calls(monkeypatch, builtin, "patchify")
    encoded, source = _source(te, *twice)
    assert len(decodes) == 2
    assert encoded.input_ids.tolist() == expected_encoded.input_ids.tolist()
    assert encoded.token_mask.tolist() == expected_encoded.token_mask.tolist()
    assert source.images == expected.images == 3
    for name, array in expected.media.items():
        assert np.array_equal(source.media[name], array), name
    assert np.array_equal(source.positions, expected.positions)


def _video_document(names: list[str], listed: list[str]) -> dict:
    return {"messages": _parts("video", names), "videos": listed}


@pytest.mark.parametrize("layout", ["builtin", "qwen2_vl"])
@pytest.mark.processor_media
def test_a_video_twice_is_packed_where_each_reference_stands_decoded_once(layout, monkeypatch):
    """The same clip shown twice (two parts naming one listed video, or listed twice): the ids,
    pixels, grids and positions of the same bytes under two names; one decode."""
    pytest.importorskip("av")
    if layout == "builtin":
        te = PackingTaskEncoder(max_input_seq_length=4096, tokenizer="bundled")
    else:
        from energon_packing.testing.families import build

        te = PackingTaskEncoder(max_input_seq_length=4096, processor=build(layout)[0])
    said = [
        {"role": "user", "content": "Look:<video>and<video>same?"},
        {"role": "assistant", "content": "Yes, the same."},
    ]
    both = {"a.mp4": VIDEO, "b.mp4": VIDEO}
    decodes = _count_calls(monkeypatch, type(te.chat.videos), "media")
    for document, reference in (
        (
            _video_document(["a.mp4", "a.mp4"], ["a.mp4"]),
            _video_document(["a.mp4", "b.mp4"], ["a.mp4", "b.mp4"]),
        ),
        ({"messages": said, "videos": ["a.mp4", "a.mp4"]}, {"messages": said, "videos": ["a.mp4", "b.mp4"]}),
    ):  # fmt: skip
        expected_encoded, expected = _source(te, reference, both)
        decodes.clear()
        encoded, source = _source(te, document, {"a.mp4": VIDEO})
        assert len(decodes) == 1
        assert encoded.input_ids.tolist() == expected_encoded.input_ids.tolist()
        assert source.videos == expected.videos == 2
        for name, array in expected.media.items():
            assert np.array_equal(source.media[name], array), name
        assert np.array_equal(source.positions, expected.positions)


def test_a_name_listed_once_and_never_shown_is_still_a_mismatch():
    """Reuse is for media shown twice: a listed image no reference shows, or a part naming
    an image that is not listed, is still skipped with its reason."""
    from energon_packing.errors import Skip

    te = PackingTaskEncoder(max_input_seq_length=4096, tokenizer="bundled")
    for document, reason in (
        ({"messages": _parts("image", ["a.png", "a.png"]), "images": ["a.png", "b.png"]}, "placeholder_mismatch"),
        ({"messages": _parts("image", ["a.png", "c.png"]), "images": ["a.png"]}, "missing_image"),
    ):  # fmt: skip
        sample = conversation_sample("k", document, {"a.png": A, "b.png": B})
        with pytest.raises(Skip) as info:
            te.chat.encode(
                key="k",
                loss_weight=1.0,
                config=te.config,
                messages=sample.messages,
                image_names=sample.image_names,
                images=sample.images,
            )
        assert info.value.reason == reason
