"""A processor directory loads as its family's processor or fails loudly; fingerprints; mRoPE.

Directories are written as a published model's are (tokenizer files, ``preprocessor_config.json``
naming the published image processor class, ``processor_config.json``, ``chat_template.jinja``)
from the offline family processors; here torchvision does not import, so the families that own a
video processor load image-only. Every check compares with the processor the directory was
written from.
"""

from __future__ import annotations

import copy
import dataclasses
import io
import json
import pickle

import numpy as np
import pytest
from helpers import callable_without_videos, conversation_sample

transformers = pytest.importorskip("transformers")

from energon_packing import PackingTaskEncoder  # noqa: E402
from energon_packing.encoding import make_chat, processor_loading  # noqa: E402
from energon_packing.encoding.processor import ProcessorChat  # noqa: E402
from energon_packing.encoding.processor_loading import image_only, load_processor  # noqa: E402
from energon_packing.testing.families import (  # noqa: E402
    AUDIO_FAMILIES,
    FAMILIES,
    build,
    make_tokenizer,
    save_published,
)
from energon_packing.testing.templates import QWEN2_VL_TEMPLATE  # noqa: E402


def _png(width: int, height: int) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (width % 256, 40, 90)).save(buffer, format="PNG")
    return buffer.getvalue()


PICTURED = {
    "messages": [
        {"role": "user", "content": "<image>What is it?"},
        {"role": "assistant", "content": "A square."},
    ],
    "images": ["a.png"],
}


def _auto_loads_without_torchvision(name: str) -> bool:
    """Whether ``AutoImageProcessor`` resolves a published image processor type to a real class
    here (transformers 5.12 gives a placeholder for the Lanczos ones, Idefics3's, without
    torchvision)."""
    from transformers.models.auto import image_processing_auto

    found = image_processing_auto.get_image_processor_class_from_name(name)
    return found is not None and "Placeholder" not in found.__qualname__


@pytest.mark.parametrize("family", [*FAMILIES, *AUDIO_FAMILIES, "gemma3n"])
@pytest.mark.processor_media
def test_a_published_directory_loads_as_its_family(tmp_path, family):
    """The directory gives the family's processor (PIL image processor, no video processor
    where torchvision is missing), the same ids and pixels as the processor it was written
    from, and the same fingerprint; an image conversation is packed, not skipped."""
    processor, _, _ = build(family, model=False)
    published = f"{type(processor.image_processor).__name__.removesuffix('Pil')}"
    if not _auto_loads_without_torchvision(published):
        pytest.skip(
            f"transformers {transformers.__version__}: AutoImageProcessor gives no class for "
            f"{published} without torchvision (no fallback to its PIL twin)"
        )
    save_published(processor, tmp_path)
    loaded = load_processor(tmp_path)
    assert type(loaded).__name__ == type(processor).__name__
    assert type(loaded.image_processor) is type(processor.image_processor)
    assert ProcessorChat(loaded).fingerprint == ProcessorChat(processor).fingerprint

    te = PackingTaskEncoder(max_input_seq_length=4096, processor=str(tmp_path))
    assert te.chat.family_name == family
    image = _png(150, 100)
    encoded = te.encode_sample(conversation_sample("p", PICTURED, {"a.png": image}))
    source = te.chat.source(
        key="p",
        input_ids=encoded.input_ids,
        token_mask=encoded.token_mask,
        images=encoded.images,
        config=te.config,
    )
    from helpers import decode_image

    messages = [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is it?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "A square."}]},
    ]
    text = processor.apply_chat_template(messages, tokenize=False)
    bos = processor.tokenizer.bos_token
    caller = callable_without_videos(processor) if family in AUDIO_FAMILIES else processor
    reference = caller(
        text=[text],
        images=[[decode_image(image)]],
        add_special_tokens=not (bos and text.startswith(bos)),
        return_tensors="np",
    )
    assert encoded.input_ids.tolist() == reference["input_ids"][0].tolist()
    for name, value in source.media.items():
        assert np.array_equal(value, reference[name]), name
    assert set(source.media) | set(source.token_fields) | {"input_ids", "attention_mask"} == set(
        reference
    )


def test_a_directory_whose_processor_cannot_load_raises_with_the_cause(tmp_path):
    """Never a silent text tokenizer: the loader's own error, and the fix."""
    processor, _, _ = build("gemma3", model=False)
    save_published(processor, tmp_path)
    config = json.loads((tmp_path / "preprocessor_config.json").read_text())
    config["image_processor_type"] = "NoSuchImageProcessor"
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(config))
    (tmp_path / "processor_config.json").unlink()
    with pytest.raises(
        ValueError, match="does not load: ValueError: Unrecognized image processor.*tokenizer=DIR"
    ):
        load_processor(tmp_path)
    with pytest.raises(ValueError, match="does not load"):
        PackingTaskEncoder(max_input_seq_length=64, processor=str(tmp_path))
    (tmp_path / "preprocessor_config.json").write_text("{not json")
    with pytest.raises(ValueError, match="does not load"):
        load_processor(tmp_path)
    with pytest.raises(ValueError, match="not a directory"):
        load_processor(tmp_path / "missing")


def test_a_directory_without_processor_config_is_a_text_model(tmp_path):
    tokenizer = make_tokenizer(pad="<|endoftext|>")
    tokenizer.chat_template = QWEN2_VL_TEMPLATE
    tokenizer.save_pretrained(str(tmp_path))
    te = PackingTaskEncoder(max_input_seq_length=512, processor=str(tmp_path))
    assert te.chat.family_name == "text" and not te.chat.has_images


@pytest.mark.processor_media
def test_an_image_only_processor_and_its_encoder_pickle():
    """Spawned loader workers unpickle the processor: the class is found by name again."""
    processor, _, _ = build("qwen2_vl", model=False)
    blob = pickle.dumps(processor)
    cls = type(processor)
    base = cls.__mro__[1]
    del processor_loading._IMAGE_ONLY[base]  # as in a fresh process
    again = pickle.loads(blob)
    assert type(again).__name__ == "Qwen2VLProcessor" and type(again) is image_only(base)
    assert again.video_processor is None and again.image_processor.to_dict() == (
        processor.image_processor.to_dict()
    )
    te = PackingTaskEncoder(max_input_seq_length=4096, processor=again)
    copied = pickle.loads(pickle.dumps(te))  # what a spawned worker receives
    sample = conversation_sample("p", PICTURED, {"a.png": _png(150, 100)})
    assert copied.chat.fingerprint == te.chat.fingerprint
    assert (
        copied.encode_sample(sample).input_ids.tolist()
        == te.encode_sample(sample).input_ids.tolist()
    )


@pytest.mark.processor_media
def test_fingerprints_follow_what_decides_the_packs():
    qwen, _, _ = build("qwen2_vl", model=False)
    again, _, _ = build("qwen2_vl", model=False)
    base = ProcessorChat(qwen).fingerprint
    assert isinstance(base, str) and len(base) == 16
    assert ProcessorChat(again).fingerprint == base  # built twice: equal
    assert ProcessorChat(qwen, chat_template_kwargs={"add_vision_id": True}).fingerprint != base
    templated = copy.deepcopy(qwen)
    templated.chat_template = qwen.chat_template.replace("You are", "You were")
    assert ProcessorChat(templated).fingerprint != base
    smaller = copy.deepcopy(qwen)
    settings = {**qwen.image_processor.to_dict(), "max_pixels": 112 * 112}
    settings.pop("size"), settings.pop("image_processor_type")
    smaller.image_processor = type(qwen.image_processor)(**settings)
    assert smaller.image_processor.size["longest_edge"] == 112 * 112
    assert ProcessorChat(smaller).fingerprint != base
    assert ProcessorChat(build("qwen2_5_vl", model=False)[0]).fingerprint != base

    builtin = PackingTaskEncoder(max_input_seq_length=64, tokenizer="bundled").chat.fingerprint
    assert (
        builtin == PackingTaskEncoder(max_input_seq_length=64, tokenizer="bundled").chat.fingerprint
    )
    assert (
        PackingTaskEncoder(
            max_input_seq_length=64, tokenizer="bundled", max_pixels=112 * 112
        ).chat.fingerprint
        != builtin
    )


@pytest.mark.slow
def test_fingerprints_are_equal_across_processes():
    import subprocess
    import sys

    code = (
        "import warnings; warnings.filterwarnings('ignore')\n"
        "from energon_packing import PackingTaskEncoder\n"
        "from energon_packing.testing.families import build\n"
        "for family in ('qwen2_vl', 'gemma3', 'llava_onevision'):\n"
        "    te = PackingTaskEncoder(max_input_seq_length=64, processor=build(family, "
        "model=False)[0])\n"
        "    print(te.chat.fingerprint)\n"
        "print(PackingTaskEncoder(max_input_seq_length=64, tokenizer='bundled').chat.fingerprint)\n"
    )
    runs = [
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        for _ in range(2)
    ]
    assert runs[0].stdout == runs[1].stdout and len(runs[0].stdout.split()) == 4


@dataclasses.dataclass(kw_only=True, frozen=True)
class _AutoConfig:
    """The attributes make_chat reads, with ``mrope`` defaulting to None (auto)."""

    mrope: bool | None = None
    chat_template_kwargs: dict | None = None


@pytest.mark.processor_media
def test_on_a_processor_path_the_family_decides_mrope():
    from helpers import require_processor_media

    require_processor_media("gemma3")
    qwen, _, _ = build("qwen2_vl", model=False)
    gemma, _, _ = build("gemma3", model=False)
    assert make_chat(processor=qwen, config=_AutoConfig()).mrope is not None
    assert make_chat(processor=gemma, config=_AutoConfig()).mrope is None
    assert make_chat(processor=qwen, config=_AutoConfig(mrope=True)).mrope is not None
    with pytest.raises(ValueError, match="mrope=False, but qwen2_vl .* is an mRoPE family"):
        make_chat(processor=qwen, config=_AutoConfig(mrope=False))
    with pytest.raises(ValueError, match="mrope=True, but gemma3 .* does not use mRoPE"):
        make_chat(processor=gemma, config=_AutoConfig(mrope=True))
    with pytest.raises(ValueError, match="mrope=False, but qwen2_vl"):  # the real config
        PackingTaskEncoder(max_input_seq_length=64, processor=qwen, mrope=False)
    assert PackingTaskEncoder(max_input_seq_length=64, processor=qwen).mrope


@pytest.mark.processor_media
def test_a_directory_s_video_settings_and_model_time_scale_are_kept(tmp_path):
    """Built image-only (no torchvision), a Qwen2.5-VL directory's
    ``video_preprocessor_config.json`` still decides how videos are sampled, and its
    ``config.json``'s ``vision_config.tokens_per_second`` is checked against the knob: a
    mismatch would give other video positions than the model's."""
    processor, _, _ = build("qwen2_5_vl", model=False)
    save_published(processor, tmp_path)
    video = {"do_sample_frames": True, "fps": 1.0, "max_frames": 64}
    (tmp_path / "video_preprocessor_config.json").write_text(json.dumps(video))
    (tmp_path / "config.json").write_text(json.dumps({"vision_config": {"tokens_per_second": 4}}))
    with pytest.raises(ValueError, match=r"vision_config.tokens_per_second=4: .*set tokens_per"):
        PackingTaskEncoder(max_input_seq_length=4096, processor=str(tmp_path))
    te = PackingTaskEncoder(max_input_seq_length=4096, processor=str(tmp_path), tokens_per_second=4)
    rule = te.chat.videos.rule
    assert (rule.sample, rule.fps, rule.max_frames) == (True, 1.0, 64)
    assert te.chat.mrope.tokens_per_second == 4


@pytest.mark.parametrize("layout", ["nested", "video_file", "published"])
@pytest.mark.processor_media
def test_video_settings_are_found_where_transformers_looks(tmp_path, layout):
    """transformers 5 reads a video processor's settings from ``processor_config.json``'s
    ``video_processor`` entry (what its save_pretrained writes), else
    ``video_preprocessor_config.json``, else ``preprocessor_config.json`` (published Qwen2-VL
    and Qwen2.5-VL folders have only that one: the image bounds size the frames too)."""
    processor, _, _ = build("qwen2_5_vl", model=False)
    save_published(processor, tmp_path)
    video = {
        "do_sample_frames": True,
        "fps": 1.0,
        "size": {"shortest_edge": 4096, "longest_edge": 65536},
    }
    if layout == "nested":
        own = json.loads((tmp_path / "processor_config.json").read_text())
        (tmp_path / "processor_config.json").write_text(
            json.dumps({**own, "video_processor": video})
        )
    elif layout == "video_file":
        (tmp_path / "video_preprocessor_config.json").write_text(json.dumps(video))
    te = PackingTaskEncoder(max_input_seq_length=4096, processor=str(tmp_path))
    rule = te.chat.videos.rule
    if layout == "published":
        image = processor.image_processor.size
        assert (rule.min_pixels, rule.max_pixels) == (image["shortest_edge"], image["longest_edge"])
        assert (rule.sample, rule.fps) == (False, None)  # Qwen2-VL's class defaults
    else:
        assert (rule.sample, rule.fps, rule.min_pixels, rule.max_pixels) == (True, 1.0, 4096, 65536)


def test_an_image_only_smolvlm_renders_and_keeps_a_video_processor_given_to_it():
    """SmolVLM's own ``apply_chat_template`` reads its video processor's frame count and rate
    on every call: built image-only it renders (they read None) and its video processor is
    falsy and refuses videos, naming why; one given to it later is used and kept. Four
    threads rendering at once through one processor give the same text."""
    import concurrent.futures
    import types

    from energon_packing.testing.families import build

    pytest.importorskip("num2words")
    processor = build("smolvlm", model=False)[0]
    messages = [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]
    text = processor.apply_chat_template(messages, tokenize=False)
    assert text == "<|im_start|>User: Hi<end_of_utterance>\n"
    assert not processor.video_processor
    with pytest.raises(RuntimeError, match="without its video processor"):
        processor.video_processor(videos=["a.mp4"])
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        rendered = pool.map(
            lambda _: processor.apply_chat_template(messages, tokenize=False), range(64)
        )
        assert set(rendered) == {text}
    given = types.SimpleNamespace(num_frames=7, fps=2.0)
    processor.video_processor = given
    assert processor.apply_chat_template(messages, tokenize=False) == text
    assert processor.video_processor is given
