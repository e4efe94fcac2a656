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
from test_video import models_positions

from energon_packing import PackingTaskEncoder
from energon_packing.encoding import hf_compat
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


#: whether the installed transformers positions videos as the one the references were recorded
#: with (5.24); before 5.18 / 5.6 the installed model's own rule differs (docs/compatibility.md)
RECORDED_RULES = hf_compat.fractional_time_interval() and hf_compat.video_frames_apart()
#: before 5.10 and since 5.25 Qwen3-VL's ``__call__`` replaces the template's
#: ``<|vision_start|><|video_pad|><|vision_end|>`` whole by the per-frame expansion (5.10 to
#: 5.24, the recording's, the pair stays around the frames)
KEEPS_MARKUP = hf_compat.qwen3_video_keeps_markup()


def recorded(family: str, name: str) -> dict:
    """The recorded (5.24) result, as the installed release's processor writes its ids: before
    5.10 and since 5.25 without Qwen3-VL's outer vision pair around each video (a start whose span holds
    another start, and its end; ``test_qwen3_video_expansion_is_the_releases_own`` checks that
    rule against the release's own ``__call__``)."""
    expected = dict(PROCESSED["results"][family][name])
    if KEEPS_MARKUP or family != "qwen3_vl":
        return expected
    starts, outer = [], set()  # (index, holds another start)
    for i, token in enumerate(expected["input_ids"]):
        if token == 3:  # <|vision_start|>
            if starts:
                starts[-1][1] = True
            starts.append([i, False])
        elif token == 4:  # <|vision_end|>
            start, nested = starts.pop()
            if nested:
                outer |= {start, i}
    for field in ("input_ids", "mm_token_type_ids"):
        expected[field] = [v for i, v in enumerate(expected[field]) if i not in outer]
    return expected


def encoder(family: str, **knobs) -> PackingTaskEncoder:
    from energon_packing.testing.families import build

    setup = PROCESSED["families"][family]
    return PackingTaskEncoder(
        processor=build(family)[0],
        max_input_seq_length=4096,
        video_config=setup["processor_kwargs"],
        **(
            {"tokens_per_second": setup["model_config"]["tokens_per_second"]}
            if family == "qwen2_5_vl"
            else {}
        ),
        **knobs,
    )


@pytest.mark.parametrize("family", sorted(PROCESSED["results"]))
@pytest.mark.processor_media
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
        expected = recorded(family, name)
        span = slice(starts[k], starts[k + 1])
        assert pack.input_ids[span].tolist() == expected["input_ids"], name
        assert (
            pack.token_fields["mm_token_type_ids"][span].tolist() == (expected["mm_token_type_ids"])
        )
        if (
            RECORDED_RULES and KEEPS_MARKUP
        ):  # the recording's transformers (5.24) positions videos so
            np.testing.assert_array_equal(pack.position_ids[:, span], expected["position_ids"])
        # and the installed model's own get_rope_index, on every release
        setup = PROCESSED["families"][family]
        model_positions = models_positions(
            family,
            pack.token_fields["mm_token_type_ids"][span].tolist(),
            expected["image_grid_thw"],
            expected["video_grid_thw"],
            expected.get("second_per_grid_ts"),
            setup["model_config"].get("tokens_per_second", 2),
        )
        np.testing.assert_array_equal(pack.position_ids[:, span], model_positions)
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
@pytest.mark.processor_media
def test_video_tokens_never_train(family):
    """Video pads, Qwen3's timestamps and every vision marker carry no loss; the reply does."""
    te = encoder(family, train_on="assistant_messages")
    encoded = te.encode_sample(sample("two_videos_mp4_mov"))
    types = np.asarray(recorded(family, "two_videos_mp4_mov")["mm_token_type_ids"])
    ids = encoded.input_ids
    vision = np.isin(ids, [3, 4]) | (types != 0)  # <|vision_start|>, <|vision_end|>, pads
    assert (encoded.token_mask[vision] == 0).all() and (encoded.token_mask > 0).any()
    trained = te.chat.tokenizer.decode(ids[encoded.token_mask > 0].tolist())
    assert "seconds>" not in trained and "A short colour ramp." in trained
    if family == "qwen3_vl":  # the stamps are there, untrained
        assert "seconds>" in te.chat.tokenizer.decode(ids.tolist())


@pytest.mark.processor_media
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


# ---- a loader epoch over mixed data ------------------------------------------------------------

CLIPS = sorted(p.name for p in DATA.glob("*") if p.suffix in (".mp4", ".mkv", ".webm", ".mov"))


def _video_document(name: str, *, text: str = "What moves?") -> dict:
    return {
        "messages": [
            {
                "role": "user",
                "content": [{"type": "video", "video": name}, {"type": "text", "text": text}],
            },
            {"role": "assistant", "content": "Something moves."},
        ],
        "videos": [name],
    }


def _mixed_dataset(path: Path) -> tuple[Path, dict[str, str | None]]:
    """Synthetic image/text conversations plus video samples, good and broken; key -> the
    skip reason it must get (None: it must be packed)."""
    from helpers import make_dataset, raw_sample

    from energon_packing.testing.synth import conversations

    items = list(conversations(24, seed=5, prefix="img"))
    expected: dict[str, str | None] = {c.key: None for c in items}
    raw = []
    for k, clip in enumerate(CLIPS):  # every container: mp4, mov, mkv, webm, edit list
        key = f"vid{k:02d}"
        raw.append(raw_sample(key, _video_document(clip), {clip: (DATA / clip).read_bytes()}))
        expected[key] = None
    clip = (DATA / "h264_48x36_10fps_2s.mp4").read_bytes()
    broken = {
        "noise": ({"n.mp4": bytes(range(256)) * 8}, _video_document("n.mp4"), "video_unreadable"),
        "gone": ({}, _video_document("g.mp4"), "missing_video"),
        "listed_twice_shown_once": (
            {"c.mp4": clip},
            {**_video_document("c.mp4"), "videos": ["c.mp4", "c.mp4"]},
            "placeholder_mismatch",
        ),
        "unplaced": (
            {"c.mp4": clip},
            {
                "messages": [
                    {"role": "user", "content": "<video><video> Two?"},
                    {"role": "assistant", "content": "One."},
                ],
                "videos": ["c.mp4"],
            },
            "placeholder_mismatch",
        ),
        "cut": ({"c.mp4": clip[: len(clip) // 2]}, _video_document("c.mp4"), "video_unreadable"),
    }
    for key, (parts, document, reason) in broken.items():
        raw.append(raw_sample(key, document, parts))
        expected[key] = reason
    return make_dataset(path, items, per_shard=12, raw=raw), expected


@pytest.mark.parametrize("workers", [0, 2])
def test_a_mixed_epoch_is_exactly_once_with_every_video_skip_counted(tmp_path, workers):
    """Images, text and videos (every container, and broken ones) through the real loader:
    each conversation in exactly one pack, or in the skip report under its reason."""
    from helpers import loader_batches

    from energon_packing.schema import PACKING_SKIPPED

    path, expected = _mixed_dataset(tmp_path / "mixed")
    te = PackingTaskEncoder(tokenizer="bundled", max_input_seq_length=4096, mrope=True)
    packed, skipped, videos = [], {}, 0
    for batch in loader_batches(path, te, buffer=8, workers=workers):
        for ids in batch["source_ids"]:
            packed.extend(ids)
        for key, reason in batch[PACKING_SKIPPED]:
            assert key not in skipped
            skipped[key] = reason
        if "video_grid_thw" in batch:
            videos += sum(len(g) for g in batch["video_grid_thw"])
    assert len(packed) == len(set(packed)) and not set(packed) & set(skipped)
    assert sorted(packed) == sorted(k for k, r in expected.items() if r is None)
    assert skipped == {k: r for k, r in expected.items() if r is not None}
    assert videos == len(CLIPS)


def test_truncation_never_cuts_inside_a_video():
    """``overlong="truncate"`` cuts text after a video, never the video itself."""
    from helpers import conversation_sample

    clip = (DATA / "h264_48x36_10fps_2s.mp4").read_bytes()
    long = " ".join(f"word{i}" for i in range(600))
    document = {
        "messages": [
            {"role": "user", "content": "<video>" + "Describe."},
            {"role": "assistant", "content": long},
        ],
        "videos": ["c.mp4"],
    }
    full = PackingTaskEncoder(tokenizer="bundled", max_input_seq_length=8192)
    whole = full.encode_sample(conversation_sample("k", document, {"c.mp4": clip}))
    pads = np.flatnonzero(whole.input_ids == full.chat.tokenizer.special.video_pad)
    assert len(pads) == 280 and whole.length > 1024
    cut = PackingTaskEncoder(tokenizer="bundled", max_input_seq_length=1024, overlong="truncate")
    kept = cut.encode_sample(conversation_sample("k", document, {"c.mp4": clip}))
    assert kept.length == 1024 and (kept.input_ids == whole.input_ids[:1024]).all()
    assert cut.stats.truncated == 1 and (kept.token_mask > 0).any()
    late = {**document, "messages": [document["messages"][0] | {"content": long + "<video>"}]}
    late["messages"].append({"role": "assistant", "content": "Yes."})
    with pytest.raises(SkipSample):
        cut.encode_sample(conversation_sample("late", late, {"c.mp4": clip}))
    assert cut.stats.skipped == {"overlong_media": 1}


@pytest.mark.processor_media
def test_a_frame_over_max_image_pixels_is_refused_from_the_header():
    """A frame size the worker must not decode (``max_image_pixels`` covers video frames)."""
    te = encoder("qwen2_vl", max_image_pixels=48 * 36 - 1)
    with pytest.raises(SkipSample):
        te.encode_sample(sample("video_then_text"))
    assert te.stats.skipped == {"video_too_large": 1}


def test_video_placeholder_text_in_a_document_without_videos_is_text():
    """``<video>`` is a placeholder only where the document lists videos: an HTML question in
    a text-only conversation is tokenized as the text it is, exactly as before videos."""
    from helpers import conversation_sample

    question = "How do I embed a clip with the <video> tag?"
    document = {
        "messages": [
            {"role": "user", "content": question},
            {"role": "assistant", "content": "Use <video src='a.mp4' controls>."},
        ]
    }
    te = PackingTaskEncoder(tokenizer="bundled", max_input_seq_length=1024)
    encoded = te.encode_sample(conversation_sample("html", document))
    text = te.chat.tokenizer.decode(encoded.input_ids.tolist())
    assert question in text and not te.stats.skipped
    plain = te.chat.tokenizer.encode(question)
    ids = encoded.input_ids.tolist()
    assert any(ids[i : i + len(plain)] == plain for i in range(len(ids)))  # one piece of text


@pytest.mark.processor_media
def test_qwen3_video_expansion_is_the_releases_own():
    """On every release: a video conversation's ids are what the installed Qwen3-VL
    processor's own ``__call__`` writes for that conversation's rendered text, given the
    conversation's grid and sampled frames (a stand-in for the video processor, which needs
    torchvision: the video side is checked against the recording above). Before 5.10 and since
    5.25 the release replaces the template's vision pair with the video; between, it keeps it."""
    from types import SimpleNamespace

    te = encoder("qwen3_vl")
    encoded = te.encode_sample(sample("video_then_text"))
    (plan,) = encoded.video_plans
    processor = te.chat.processor
    merge = processor.image_processor.merge_size
    t, h, w = plan.grid

    class Frames:  # the video processor's outputs for this video, as planned
        merge_size = merge
        temporal_patch_size = 2

        def __call__(self, videos=None, **kwargs):
            return {
                "pixel_values_videos": np.zeros((t * h * w, 8), dtype=np.float32),
                "video_grid_thw": np.asarray([plan.grid]),
                "video_metadata": [
                    SimpleNamespace(fps=plan.header.fps, frames_indices=list(plan.indices))
                ],
            }

    text = PROCESSED["results"]["qwen3_vl"]["video_then_text"]["rendered_text"]
    processor.video_processor = Frames()
    try:
        ids = processor(
            text=[text], videos=[np.zeros((len(plan.indices), 4, 4, 3), dtype=np.uint8)]
        )["input_ids"][0]
    finally:
        del processor.video_processor
    assert encoded.input_ids.tolist() == list(ids)
    outer = encoded.input_ids.tolist().count(3) - t  # vision starts beyond one per frame
    assert outer == (1 if KEEPS_MARKUP else 0)
