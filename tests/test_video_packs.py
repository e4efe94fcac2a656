"""Video conversations through the task encoder, checked against the real processors (issue
23, part 2).

``tests/data/video/processor_reference.json`` holds what transformers 5.24's real Qwen2-VL,
Qwen2.5-VL and Qwen3-VL processors (torchvision present, a separate venv: the committed
``make_processor_reference.py`` made it once) returned for 4 conversations with videos (and one
image), and the positions their models' ``get_rope_index`` gave. Here the same conversations
go through :class:`PackingTaskEncoder` with the project's offline processors, which have no
video processor (no torchvision on the CPU torch wheel): costed from the clips' headers, then
packed together; each source's ids, token types, grids, pixels and positions must be the real
processor's for that conversation alone.
"""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import numpy as np
import pytest
from megatron.energon.errors import SkipSample
from PIL import Image

from energon_packing import PackingTaskEncoder
from energon_packing.errors import Skip
from energon_packing.loader.samples import ConversationSample

DATA = Path(__file__).parent / "data" / "video"
PROCESSED = json.loads((DATA / "processor_reference.json").read_text())
IMAGE_NAME = "picture.png"


def sha(array) -> str:
    return hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()


def the_image() -> bytes:
    """The reference's image: its recipe, checked against its recorded pixel hash."""
    pixels = np.random.default_rng(0).integers(0, 256, (30, 40, 3), dtype=np.uint8)
    assert hashlib.sha256(pixels.tobytes()).hexdigest() == PROCESSED["image"]["pixels_sha256"]
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def sample(name: str) -> ConversationSample:
    """The reference conversation ``name`` as a shard sample: named video and image parts."""
    messages = json.loads(json.dumps(PROCESSED["conversations"][name]))
    videos, images = {}, {}
    for message in messages:
        for part in message["content"] if isinstance(message["content"], list) else ():
            if part["type"] == "video":
                videos[part["video"]] = (DATA / part["video"]).read_bytes()
            elif part["type"] == "image":
                part["image"] = IMAGE_NAME
                images[IMAGE_NAME] = the_image()
    return ConversationSample(
        __key__=name,
        __restore_key__=(),
        __subflavors__={},
        __sources__=(),
        messages=messages,
        image_names=list(images),
        images=images,
        video_names=list(videos),
        videos=videos,
    )


def encoder(family: str, **knobs) -> PackingTaskEncoder:
    from energon_packing.testing.families import build

    setup = PROCESSED["families"][family]
    return PackingTaskEncoder(
        processor=build(family)[0],
        max_input_seq_length=4096,
        videos_kwargs=setup["processor_kwargs"],
        **(
            {"tokens_per_second": setup["model_config"]["tokens_per_second"]}
            if family == "qwen2_5_vl"
            else {}
        ),
        **knobs,
    )


@pytest.mark.parametrize("family", sorted(PROCESSED["results"]))
def test_a_pack_of_video_conversations_is_each_real_processor_output(family):
    """All four conversations in one pack: per source, the ids, ``mm_token_type_ids``, the
    media (``pixel_values_videos`` by hash, grids, ``second_per_grid_ts``) and the mRoPE
    positions are the real processor's and the model's for that conversation alone."""
    te = encoder(family)
    names = list(PROCESSED["conversations"])
    encoded = [te.encode_sample(sample(name)) for name in names]
    pack = te.pack_selected_samples(encoded).pack
    assert pack.source_ids == names and not te.stats.skipped
    starts = pack.cu_seqlens.tolist()
    videos_seen = images_seen = 0
    for k, name in enumerate(names):
        expected = PROCESSED["results"][family][name]
        span = slice(starts[k], starts[k + 1])
        assert pack.input_ids[span].tolist() == expected["input_ids"], name
        assert (
            pack.token_fields["mm_token_type_ids"][span].tolist() == (expected["mm_token_type_ids"])
        )
        np.testing.assert_array_equal(pack.position_ids[:, span], expected["position_ids"])
        grids = pack.media["video_grid_thw"][pack.video_source_index == k]
        assert grids.tolist() == expected["video_grid_thw"]
        rows = int(grids.prod(axis=1).sum())
        pixels = pack.media["pixel_values_videos"][videos_seen : videos_seen + rows]
        assert sha(pixels) == expected["pixel_values_videos"]["sha256"], name
        videos_seen += rows
        if family == "qwen2_5_vl":
            seconds = pack.media["second_per_grid_ts"][pack.video_source_index == k]
            np.testing.assert_array_equal(
                seconds, np.asarray(expected["second_per_grid_ts"], dtype=np.float32)
            )
        if expected["image_grid_thw"]:
            grids = pack.media["image_grid_thw"][pack.image_source_index == k]
            assert grids.tolist() == expected["image_grid_thw"]
            rows = int(grids.prod(axis=1).sum())
            pixels = pack.media["pixel_values"][images_seen : images_seen + rows]
            assert sha(pixels) == expected["pixel_values"]["sha256"]
            images_seen += rows
    assert videos_seen == len(pack.media["pixel_values_videos"])


@pytest.mark.parametrize("family", sorted(PROCESSED["results"]))
def test_video_tokens_never_train(family):
    """Video pads, Qwen3's timestamps and every vision marker carry no loss; the reply does."""
    te = encoder(family, train_on="assistant_messages")
    encoded = te.encode_sample(sample("two_videos_mp4_mov"))
    types = np.asarray(PROCESSED["results"][family]["two_videos_mp4_mov"]["mm_token_type_ids"])
    ids = encoded.input_ids
    vision = np.isin(ids, [3, 4]) | (types != 0)  # <|vision_start|>, <|vision_end|>, pads
    assert (encoded.token_mask[vision] == 0).all() and (encoded.token_mask > 0).any()
    trained = te.chat.tokenizer.decode(ids[encoded.token_mask > 0].tolist())
    assert "seconds>" not in trained and "A short colour ramp." in trained
    if family == "qwen3_vl":  # the stamps are there, untrained
        assert "seconds>" in te.chat.tokenizer.decode(ids.tolist())


def test_video_limits_are_counted_skips_before_any_decode():
    """``max_video_frames`` and ``max_video_tokens`` refuse a video from its header alone."""
    for knobs, match in (
        ({"max_video_frames": 3}, "takes 4 frames, more than max_video_frames=3"),
        ({"max_video_tokens": 100}, "is 280 tokens, more than max_video_tokens=100"),
    ):
        te = encoder("qwen2_vl", **knobs)
        with pytest.raises(SkipSample):
            te.encode_sample(sample("video_then_text"))
        assert te.stats.skipped == {"video_too_large": 1}
        fields = {
            k: getattr(sample("video_then_text"), k)
            for k in ("messages", "image_names", "images", "video_names", "videos")
        }
        with pytest.raises(Skip, match=match):
            te.chat.encode(key="k", loss_weight=1.0, config=te.config, **fields)
