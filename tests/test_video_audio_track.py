"""A video's own audio track, interleaved with its frames (issue 32 item 2:
``audio_config['load_audio_from_video']``), in Qwen2.5-Omni and Qwen3-Omni conversations.

The reference is the family's real processor class on each conversation alone, with the
videos' tracks given decoded as the processor's audio slots (``audio_from_video_indices`` since
transformers 5.25, ``use_audio_in_video=True`` before: qwen-omni-utils' way), the stand-in
video processor of ``tests/test_video_omni.py`` in its video processor's place; the positions
are the thinker's own ``get_rope_index(use_audio_in_video=True)``; per-source logits of a pack
equal the thinker's forward on each conversation alone.
"""

from __future__ import annotations

import functools
import json

import numpy as np
import pytest
import torch
from helpers import (
    assert_to_hf_refuses_clips_heard_together,
    clips_heard_together,
    decode_image,
    loader_batches,
    make_dataset,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from energon_packing import PackingTaskEncoder
from energon_packing.encoding import av_interleave, hf_compat
from energon_packing.media import audio
from energon_packing.testing.audio import clip
from energon_packing.testing.clips import with_sound
from energon_packing.trainer import prepacked_microbatches

transformers = pytest.importorskip("transformers")
pytest.importorskip("av")

from test_video_omni import (  # noqa: E402
    DATA,
    SMALL,
    StandInVideoProcessor,
    _parts,
    template_messages,
)

from energon_packing.testing import hf  # noqa: E402
from energon_packing.testing.families import build  # noqa: E402

pytestmark = pytest.mark.energon

TRACK = {"load_audio_from_video": True}
#: (family, video_config): a temporal patch of 1 s, of 2 s (a chunk each, Qwen2.5-Omni), and
#: of 2/3 s (fractional times: the processor's float order, the thinker's truncated positions)
SETTINGS = [
    ("qwen2_5_omni", {"do_sample_frames": True, "fps": 2.0, "size": SMALL}),
    pytest.param(
        "qwen2_5_omni",
        {"do_sample_frames": True, "fps": 1.0, "size": SMALL},
        marks=pytest.mark.slow,
    ),
    pytest.param(
        "qwen2_5_omni",
        {"do_sample_frames": True, "fps": 3.0, "size": SMALL},
        marks=pytest.mark.slow,
    ),
    ("qwen3_omni", {"do_sample_frames": True, "fps": 2.0, "size": SMALL}),
    pytest.param(
        "qwen3_omni", {"do_sample_frames": True, "fps": 1.0, "size": SMALL}, marks=pytest.mark.slow
    ),
]


#: a video without an audio stream: skipped ``audio_no_stream`` with the switch on
SILENT = "silent_video"


def _conversations() -> list[tuple[str, dict, dict]]:
    """(key, document, parts): a video with a longer track, a clip then a video with a shorter
    track and an image, two videos with tracks in two turns, text only, a silent video."""
    from test_video_omni import _png

    small = (DATA / "h264_48x36_10fps_2s.mp4").read_bytes()
    long = (DATA / "h264_160x120_24fps_3s.mp4").read_bytes()
    loud = with_sound(small, clip("m4a", seconds=3.1, seed=4))
    brief = with_sound(long, clip("m4a", seconds=1.2, seed=5))
    return [
        (
            "track_longer_than_frames",
            {
                "messages": [
                    {"role": "user", "content": _parts(("video", "a.mp4"), "What is heard?")},
                    {"role": "assistant", "content": "Two tones."},
                ],
                "videos": ["a.mp4"],
            },
            {"a.mp4": loud},
        ),
        (
            "clip_image_then_track",
            {
                "messages": [
                    {
                        "role": "user",
                        "content": _parts(
                            ("audio", "s.wav"),
                            " then ",
                            ("image", "p.png"),
                            " and ",
                            ("video", "b.mp4"),
                            ": alike?",
                        ),
                    },
                    {"role": "assistant", "content": "No."},
                ],
                "images": ["p.png"],
                "videos": ["b.mp4"],
                "audios": ["s.wav"],
            },
            {"s.wav": clip("wav", seconds=0.9, seed=6), "p.png": _png(90, 60, 1), "b.mp4": brief},
        ),
        (
            "two_tracks",
            {
                "messages": [
                    {"role": "user", "content": _parts(("video", "c.mp4"), "First?")},
                    {"role": "assistant", "content": "Short."},
                    {"role": "user", "content": _parts("And ", ("video", "d.mp4"))},
                    {"role": "assistant", "content": "Long."},
                ],
                "videos": ["c.mp4", "d.mp4"],
            },
            {"c.mp4": brief, "d.mp4": loud},
        ),
        (
            "text_only",
            {
                "messages": [
                    {"role": "user", "content": "Any sound?"},
                    {"role": "assistant", "content": "None."},
                ]
            },
            {},
        ),
        (
            SILENT,
            {
                "messages": [
                    {"role": "user", "content": _parts(("video", "e.mp4"), "Heard?")},
                    {"role": "assistant", "content": "Nothing."},
                ],
                "videos": ["e.mp4"],
            },
            {"e.mp4": small},
        ),
    ]


CONVERSATIONS = _conversations()
BY_KEY = {key: (document, parts) for key, document, parts in CONVERSATIONS}


def _in_order(document: dict, kinds: tuple[str, ...]) -> list[tuple[str, str]]:
    return [
        (p["type"], p[p["type"]])
        for m in document["messages"]
        if isinstance(m["content"], list)
        for p in m["content"]
        if p["type"] in kinds
    ]


def _reference(processor, key: str, tmp, video_config: dict) -> dict:
    """The real Omni processor on the conversation alone, its videos' tracks given decoded as
    its audio slots (the clips and the tracks in the order the text shows them)."""
    document, parts = BY_KEY[key]
    text = processor.apply_chat_template(template_messages(document), tokenize=False)
    paths, slots, of_video = [], [], []
    for kind, name in _in_order(document, ("video", "audio")):
        slots.append(audio.decode(parts[name]))
        if kind == "video":
            (tmp / name).write_bytes(parts[name])
            of_video.append(len(paths))
            paths.append(str(tmp / name))
        else:
            of_video.append(None)
    images = [decode_image(parts[name]) for _, name in _in_order(document, ("image",))]
    extra: dict = {}
    if paths:
        if hasattr(processor, "_resolve_audio_from_video"):  # transformers 5.25+
            extra = {"audio_from_video_indices": of_video, "load_audio_from_video": True}
        else:
            extra = {"use_audio_in_video": True}
    return processor(
        text=[text],
        videos=paths or None,
        images=[images] if images else None,
        audio=slots or None,
        return_tensors="pt",
        **extra,
        **video_config,
    )


@pytest.fixture(scope="module")
def track_dataset(tmp_path_factory):
    raw = [
        {"__key__": key, "json": json.dumps(document).encode(), **parts}
        for key, document, parts in CONVERSATIONS
    ]
    return make_dataset(tmp_path_factory.mktemp("video_tracks"), [], raw=raw)


@pytest.mark.parametrize(("family", "video_config"), SETTINGS)
@pytest.mark.processor_media
def test_a_videos_own_track_is_the_processors_and_packed_logits_each_conversations_own(
    track_dataset, tmp_path, family, video_config
):
    processor, model, info = build(family)
    te = PackingTaskEncoder(
        max_input_seq_length=8192,
        processor=processor,
        pad_multiple=8,
        video_config=video_config,
        audio_config=TRACK,
    )
    reference_processor = build(family, model=False)[0]
    reference_processor.video_processor = StandInVideoProcessor(
        getattr(reference_processor, "video_settings", None)
    )
    seen, worst, tracks = [], 0.0, 0
    for batch in loader_batches(track_dataset, te, buffer=8):
        (mb,) = prepacked_microbatches(batch, pad_multiple=8)
        inputs = mb.model_inputs
        logits = hf.run(model, hf.packed_kwargs(inputs, mb.cu_seqlens_padded, info))
        documents = [BY_KEY[key][0] for key in mb.source_ids]
        mixed = clips_heard_together(family, documents, tracks=True)
        if mixed:  # an older release: its clips hear each other (to_hf's own test: apart)
            assert_to_hf_refuses_clips_heard_together(batch, model)
        rows = 0
        for k, key in enumerate(mb.source_ids):
            ref = _reference(reference_processor, key, tmp_path, video_config)
            start, n = int(mb.cu_seqlens_padded[k]), int(mb.cu_seqlens[k + 1] - mb.cu_seqlens[k])
            ids = inputs["input_ids"][0, start : start + n]
            assert torch.equal(ids, ref["input_ids"][0]), key
            if "input_features" in ref:
                mask = ref["feature_attention_mask"]
                got = inputs["feature_attention_mask"][rows : rows + len(mask)]
                assert torch.equal(got.sum(-1), mask.sum(-1)), key
                for r in range(len(mask)):
                    used = int(mask[r].sum())
                    assert torch.equal(
                        inputs["input_features"][rows + r][:, :used],
                        ref["input_features"][r][:, :used],
                    ), key
                rows += len(mask)
            rope, _ = model.get_rope_index(
                ref["input_ids"],
                image_grid_thw=ref.get("image_grid_thw"),
                video_grid_thw=ref.get("video_grid_thw"),
                attention_mask=ref["attention_mask"],
                use_audio_in_video=True,
                audio_seqlens=(
                    ref["feature_attention_mask"].sum(-1)
                    if "feature_attention_mask" in ref
                    else None
                ),
                second_per_grids=ref.get("video_second_per_grid"),
            )
            got = inputs["position_ids"][:, 0, start : start + n]
            assert torch.equal(got, rope[:, 0].long()), f"{key}: positions"
            tracks += len(ref.get("video_grid_thw", []))
            seen.append(key)
            if mixed and "input_features" in ref:
                continue
            alone = hf.run(model, {**ref, "use_audio_in_video": True})
            worst = max(worst, float((logits[start : start + n] - alone[:n]).abs().max()))
    # every conversation in exactly one pack, or in the skip report under its reason
    assert sorted(seen) == sorted(k for k in BY_KEY if k != SILENT)
    assert te.stats.skipped == {"audio_no_stream": 1}
    assert te.stats.skipped_keys == {"audio_no_stream": [SILENT]}
    assert tracks == 4
    print(f"{family} {video_config}: max |packed - alone| logit difference {worst:.2e}")
    assert worst <= 1e-5, f"{family}: per-source logits differ by {worst:.2e}"


@pytest.mark.parametrize("family", ["qwen2_5_omni", "qwen3_omni"])
@pytest.mark.parametrize("key", ["use_audio_in_video", "load_audio_from_video"])
def test_the_switch_is_audio_configs_changes_the_ids_and_joins_the_fingerprint(family, key):
    """Either of the processors' names turns it on in ``audio_config`` (off is the default and
    keeps the fingerprint); in ``video_config`` it is refused, naming ``audio_config``; on,
    a video's ids carry its track and the restore fingerprint differs."""
    from helpers import conversation_sample

    processor = build(family, model=False)[0]
    with pytest.raises(ValueError, match=rf"^video_config\['{key}'\]: .* set audio_config="):
        PackingTaskEncoder(max_input_seq_length=1024, processor=processor, video_config={key: 1})
    with pytest.raises(ValueError, match=rf"audio_config\['{key}'\] must be True or False"):
        PackingTaskEncoder(max_input_seq_length=1024, processor=processor, audio_config={key: 1})
    config = {"do_sample_frames": True, "fps": 2.0, "size": SMALL}
    common = {"max_input_seq_length": 4096, "processor": processor, "video_config": config}
    plain = PackingTaskEncoder(**common)
    off = PackingTaskEncoder(**common, audio_config={key: False})
    on = PackingTaskEncoder(**common, audio_config={key: True})
    assert off.chat.fingerprint == plain.chat.fingerprint != on.chat.fingerprint
    key_, document, parts = CONVERSATIONS[0]
    sample = conversation_sample(key_, document, parts)
    ids_off = off.encode_sample(sample).input_ids
    ids_on = on.encode_sample(sample).input_ids
    audio_id = processor.tokenizer.convert_tokens_to_ids(processor.audio_token)
    assert np.count_nonzero(ids_off == audio_id) == 0 < np.count_nonzero(ids_on == audio_id)
    assert len(ids_on) > len(ids_off)


@pytest.mark.parametrize("family", ["qwen2_5_omni", "qwen3_omni"])
def test_a_silent_video_is_skipped_naming_the_switch_and_other_families_refuse_it(family):
    """With the switch on, a video without an audio stream is skipped ``audio_no_stream`` (the
    thinker's positions with ``use_audio_in_video`` take no silent video); a family whose
    processor interleaves no track refuses the switch when built, naming those that do."""
    from energon_packing.encoding.chat import Skip

    processor = build(family, model=False)[0]
    te = PackingTaskEncoder(
        max_input_seq_length=4096,
        processor=processor,
        video_config={"do_sample_frames": True, "fps": 2.0, "size": SMALL},
        audio_config=TRACK,
    )
    silent = (DATA / "h264_48x36_10fps_2s.mp4").read_bytes()
    document = {
        "messages": [
            {"role": "user", "content": _parts(("video", "a.mp4"), "Heard?")},
            {"role": "assistant", "content": "Nothing."},
        ],
        "videos": ["a.mp4"],
    }

    def skip(te: PackingTaskEncoder, key: str, video: bytes) -> pytest.ExceptionInfo:
        with pytest.raises(Skip) as found:
            te.chat.encode(
                key=key,
                messages=document["messages"],
                image_names=[],
                images={},
                video_names=["a.mp4"],
                videos={"a.mp4": video},
                loss_weight=1.0,
                config=te.config,
            )
        return found

    found = skip(te, "silent", silent)
    assert found.value.reason == "audio_no_stream"
    assert "video 'a.mp4''s own audio track" in found.value.detail
    assert "load_audio_from_video" in found.value.detail
    # a track over max_audio_seconds: its own reason and knob, no word of silent videos
    loud = with_sound(silent, clip("m4a", seconds=3.0, seed=7))
    te = PackingTaskEncoder(
        max_input_seq_length=4096,
        processor=processor,
        video_config={"do_sample_frames": True, "fps": 2.0, "size": SMALL},
        audio_config=TRACK,
        max_audio_seconds=1.0,
    )
    found = skip(te, "long", loud)
    assert found.value.reason == "audio_too_long"
    assert found.value.detail.startswith("video 'a.mp4''s own audio track: a clip of ")
    assert "max_audio_seconds" in found.value.detail and "silent" not in found.value.detail


def test_a_family_without_an_interleave_rule_refuses_the_switch():
    from helpers import family_unavailable_reason

    if family_unavailable_reason("gemma3n"):
        pytest.skip(family_unavailable_reason("gemma3n"))
    processor = build("gemma3n", model=False)[0]
    with pytest.raises(
        ValueError,
        match=r"^audio_config\['load_audio_from_video'\]: gemma3n .* does not interleave .*: "
        r"qwen2_5_omni, qwen3_omni$",
    ):
        PackingTaskEncoder(max_input_seq_length=1024, processor=processor, audio_config=TRACK)


@pytest.mark.parametrize(
    ("values", "per_chunk", "expected"),
    [
        ([0, 0, 25, 25, 50, 50], 50, [(0, 4), (4, 6)]),
        ([0, 100, 100, 100], 50, [(0, 1), (1, 2), (2, 4)]),  # a jump of two chunks
        (list(range(7)), 3, [(0, 3), (3, 6), (6, 7)]),
        ([0], 50, [(0, 1)]),
    ],
)
def test_chunks_cut_as_get_chunked_index(values, per_chunk, expected):
    assert av_interleave.chunks(values, per_chunk) == expected


def test_merged_order_puts_a_video_token_first_on_a_tie():
    # video tokens at times 0, 0, 2.5, 2.5; 4 audio tokens: V V A A A V V A
    runs = av_interleave.order("tokens", np.array([0, 0, 2.5, 2.5]), 4)
    assert runs == [(True, 0, 2), (False, 0, 3), (True, 2, 4), (False, 3, 4)]
    # a track shorter than the frames: the rest of the video after it
    assert av_interleave.order("tokens", np.array([0, 5, 9]), 2) == [
        (True, 0, 1),
        (False, 0, 2),
        (True, 1, 3),
    ]


@functools.cache
def _built(family: str):
    processor, model, _ = build(family)
    te = PackingTaskEncoder(max_input_seq_length=1 << 16, processor=processor, audio_config=TRACK)
    reference = build(family, model=False)[0]
    reference.video_processor = StandInVideoProcessor(getattr(reference, "video_settings", None))
    return reference, model, te


def _processors_block(processor, grid, second_per_grid: float, audio_tokens: int) -> str:
    """The real processor's text for a video with its track (5.25+: its
    ``replace_video_with_audio_token``; before: ``replace_multimodal_special_tokens`` of the
    template's ``vision_bos video vision_eos``, with its pair stripped)."""
    per_second, per_chunk = hf_compat.omni_track_timing(processor)
    if hasattr(processor, "replace_video_with_audio_token"):
        return processor.replace_video_with_audio_token(
            {"video_grid_thw": torch.tensor([grid]), "video_second_per_grid": [second_per_grid]},
            0,
            {"num_audio_tokens": [audio_tokens]},
            0,
            position_id_per_seconds=per_second,
            seconds_per_chunk=per_chunk,
        )
    bos, eos = processor.vision_bos_token, processor.vision_eos_token
    (text,) = processor.replace_multimodal_special_tokens(
        [bos + processor.video_token + eos],
        iter([audio_tokens]),
        iter([]),
        iter([torch.tensor(grid)]),
        video_second_per_grid=iter([second_per_grid]),
        use_audio_in_video=True,
        position_id_per_seconds=per_second,
        seconds_per_chunk=per_chunk,
    )
    return text[len(bos) : -len(eos)]


@pytest.mark.parametrize("family", ["qwen2_5_omni", "qwen3_omni"])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    t=st.integers(1, 5),
    h=st.sampled_from([2, 4, 6]),
    w=st.sampled_from([2, 4, 8]),
    fps=st.sampled_from([0.5, 1.0, 2.0, 3.0]),
    frames=st.integers(3, 2500),
)
def test_a_block_is_the_processors_text_and_the_thinkers_positions(family, t, h, w, fps, frames):
    """Any grid, temporal patch and track length: the block's text equals the real
    processor's, its positions (and the text's after it) the thinker's ``get_rope_index``."""
    from energon_packing.encoding.positions import mrope_positions
    from energon_packing.media import video_styles
    from energon_packing.media.video import VideoHeader
    from energon_packing.media.video_plan import VideoPlan

    processor, model, te = _built(family)
    second_per_grid = 2 / fps
    if family == "qwen3_omni" and fps == 3.0:
        return  # fractional thinker positions: refused when built (test_video_omni.py)
    tokens = te.chat.audio.rule.tokens(frames, processor)
    plan = VideoPlan(
        style=getattr(video_styles, family.upper()),
        header=VideoHeader(frames=2 * t, fps=fps, width=14 * w, height=14 * h),
        indices=tuple(range(2 * t)),
        grid=(t, h, w),
        merge_size=2,
        second_per_grid=second_per_grid,
        audio_tokens=tokens,
    )
    block = te.chat._video_expansion(plan)
    assert block == _processors_block(processor, (t, h, w), second_per_grid, tokens)
    text = f"Hi {processor.vision_bos_token}{block}{processor.vision_eos_token} ok"
    ids = processor.tokenizer(text, return_tensors="pt")["input_ids"]
    ours = mrope_positions(ids[0].tolist(), [], te.chat.mrope, videos=[plan])
    rope, _ = model.get_rope_index(
        ids,
        video_grid_thw=torch.tensor([[t, h, w]]),
        attention_mask=torch.ones_like(ids),
        use_audio_in_video=True,
        audio_seqlens=torch.tensor([frames]),
        second_per_grids=torch.tensor([second_per_grid]),
    )
    assert np.array_equal(ours, rope[:, 0].long().numpy())


def test_pack_time_without_the_encode_time_plans_is_refused_naming_the_sample():
    """A video's track lives in its encode-time plan: without the plans (``source`` called
    with bare videos) the conversation fails naming the sample, never packs without its
    features or with text positions on its audio tokens."""
    from helpers import conversation_sample

    from energon_packing.encoding.processor import ProcessorMismatchError

    processor = build("qwen2_5_omni", model=False)[0]
    te = PackingTaskEncoder(
        max_input_seq_length=8192,
        processor=processor,
        audio_config=TRACK,
        video_config={"do_sample_frames": True, "fps": 2.0, "size": SMALL},
    )
    key, document, parts = CONVERSATIONS[0]
    encoded = te.encode_sample(conversation_sample(key, document, parts))
    item = {
        "key": key,
        "input_ids": encoded.input_ids,
        "token_mask": encoded.token_mask,
        "images": [],
        "videos": encoded.videos,
        "audios": [],
    }
    (found,) = te.chat.sources(items=[item], config=te.config)
    assert isinstance(found, ProcessorMismatchError)
    assert f"sample {key!r}" in str(found) and "video_plans" in str(found)
    (kept,) = te.chat.sources(
        items=[{**item, "video_plans": encoded.video_plans}], config=te.config
    )
    assert "input_features" in kept.media and "pixel_values_videos" in kept.media
