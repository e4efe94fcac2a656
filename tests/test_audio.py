"""Audio conversations: documents, clip lengths, skip reasons, and the Omni families exact.

Clips are synthesised here with PyAV's own encoders (:mod:`energon_packing.testing.audio`).
Per Omni family: token ids, ``input_features`` / ``feature_attention_mask``, positions (the
thinker's own ``get_rope_index``) equal to the real processor called on each conversation alone,
and per-source logits of a loader pack equal to each conversation run alone.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import (
    assert_to_hf_refuses_clips_heard_together,
    callable_without_videos,
    clips_heard_together,
    conversation_sample,
    decode_image,
    loader_batches,
    make_dataset,
    require_processor_media,
)

from energon_packing import PackingTaskEncoder
from energon_packing.loader.task_encoder import SkipSample
from energon_packing.media import audio
from energon_packing.testing import hf
from energon_packing.testing.audio import FORMATS, clip
from energon_packing.testing.families import AUDIO_FAMILIES, build
from energon_packing.trainer import prepacked_microbatches

pytestmark = pytest.mark.energon

VIDEO = Path(__file__).parent / "data" / "video" / "h264_48x36_10fps_2s.mp4"
CAPACITY = 1024


def _png(width: int, height: int, seed: int) -> bytes:
    import io

    from PIL import Image

    rng = np.random.default_rng(seed)
    out = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (height, width, 3), dtype=np.uint8)).save(out, "PNG")
    return out.getvalue()


#: (key, document, parts): audio alone, two clips, audio with an image, placeholders, text only
def _conversations() -> list[tuple[str, dict, dict]]:
    a = clip("wav", seconds=1.37, seed=1)
    b = clip("flac", seconds=0.9, rate=44100, channels=2, seed=2)
    c = clip("mp3", seconds=2.1, rate=22050, seed=3)
    d = clip("opus", seconds=0.61, seed=4)
    e = clip("m4a", seconds=1.05, rate=44100, channels=2, seed=5)
    f = clip("ogg", seconds=3.3, seed=6)
    image = _png(90, 60, seed=7)

    def parts(*pieces):
        return [
            {"type": "text", "text": p} if isinstance(p, str) else {"type": p[0], p[0]: p[1]}
            for p in pieces
        ]

    return [
        (
            "one_clip",
            {
                "messages": [
                    {"role": "user", "content": parts(("audio", "a.wav"), "What is it?")},
                    {"role": "assistant", "content": "A tone and some noise."},
                ],
                "audios": ["a.wav"],
            },
            {"a.wav": a},
        ),
        (
            "two_clips",
            {
                "messages": [
                    {
                        "role": "user",
                        "content": parts(
                            "Compare ", ("audio", "b.flac"), " with ", ("audio", "c.mp3")
                        ),
                    },
                    {"role": "assistant", "content": "The second is longer."},
                    {"role": "user", "content": "Sure?"},
                    {"role": "assistant", "content": "Yes."},
                ],
                "audios": ["b.flac", "c.mp3"],
            },
            {"b.flac": b, "c.mp3": c},
        ),
        (
            "placeholders",  # ms-swift's style: <audio> tags and an 'audios' list
            {
                "messages": [
                    {"role": "user", "content": "<audio>Then <audio>: which is louder?"},
                    {"role": "assistant", "content": "The first."},
                ],
                "audios": ["d.opus", "e.m4a"],
            },
            {"d.opus": d, "e.m4a": e},
        ),
        (
            "image_and_clip",
            {
                "messages": [
                    {
                        "role": "user",
                        "content": parts(
                            ("image", "p.png"), "Does it sound like ", ("audio", "f.ogg")
                        ),
                    },
                    {"role": "assistant", "content": "Not at all."},
                ],
                "images": ["p.png"],
                "audios": ["f.ogg"],
            },
            {"p.png": image, "f.ogg": f},
        ),
        (
            "same_clip_twice",  # one part referenced twice: the processor given it twice
            {
                "messages": [
                    {
                        "role": "user",
                        "content": parts(("audio", "a.wav"), " and again: ", ("audio", "a.wav")),
                    },
                    {"role": "assistant", "content": "The same tone."},
                ],
                "audios": ["a.wav"],
            },
            {"a.wav": a},
        ),
        (
            "text_only",
            {
                "messages": [
                    {"role": "user", "content": "Is <audio> an HTML tag?"},
                    {"role": "assistant", "content": "Yes, since HTML5."},
                ],
            },
            {},
        ),
    ]


CONVERSATIONS = _conversations()
BY_KEY = {key: (document, parts) for key, document, parts in CONVERSATIONS}


def _hf_messages(document: dict) -> list[dict]:
    """The document in the processor's message format, written apart from the package."""
    messages = []
    for message in document["messages"]:
        content = message["content"]
        if isinstance(content, str):
            # "<audio>" is a clip where the document lists audio, else text
            pieces = content.split("<audio>") if document.get("audios") else [content]
            out = []
            for k, text in enumerate(pieces):
                if k:
                    out.append({"type": "audio"})
                if text:
                    out.append({"type": "text", "text": text})
        else:
            out = [
                {"type": "text", "text": p["text"]} if p["type"] == "text" else {"type": p["type"]}
                for p in content
            ]
        messages.append({"role": message["role"], "content": out})
    return messages


def _in_order(document: dict, parts: dict, kind: str) -> list[bytes]:
    names, order = list(document.get(f"{kind}s", [])), []
    for message in document["messages"]:
        content = message["content"]
        if isinstance(content, str):
            order += names[len(order) : len(order) + content.count(f"<{kind}>")] if names else []
        else:
            order += [p[kind] for p in content if p["type"] == kind]
    return [parts[name] for name in order]


def _reference(processor, key: str) -> dict:
    """The real processor on the conversation alone."""
    document, parts = BY_KEY[key]
    text = processor.apply_chat_template(_hf_messages(document), tokenize=False)
    clips = [audio.decode(data) for data in _in_order(document, parts, "audio")]
    images = [decode_image(data) for data in _in_order(document, parts, "image")]
    return callable_without_videos(processor)(
        text=[text], audio=clips or None, images=[images] if images else None, return_tensors="pt"
    )


@pytest.fixture(scope="module")
def audio_dataset(tmp_path_factory):
    raw = [
        {"__key__": key, "json": __import__("json").dumps(document).encode(), **parts}
        for key, document, parts in CONVERSATIONS
    ]
    return make_dataset(tmp_path_factory.mktemp("audio"), [], raw=raw)


# ---- clips ---------------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", sorted(FORMATS))
@pytest.mark.parametrize("rate, channels", [(16000, 1), (44100, 2), (22050, 1)])
def test_a_clip_length_is_its_decoded_sample_count(suffix, rate, channels):
    """The cost comes from the header only where that is exact (16 kHz PCM WAV and FLAC);
    any other clip is decoded, since lossy headers are off by their codec's padding."""
    data = clip(suffix, seconds=1.37, rate=rate, channels=channels)
    found = audio.length(data)
    samples = audio.decode(data)
    assert found.samples == len(samples) and samples.dtype == np.float32
    exact = suffix in ("wav", "flac") and rate == 16000
    assert found.source == ("header" if exact else "decode")


def test_decoding_equals_ffmpeg_resampling_to_mono_16k():
    """Stereo is downmixed and resampled by FFmpeg's own resampler (the torchcodec loader's
    path): a 44.1 kHz stereo clip of two equal channels is the mono clip, resampled."""
    import av

    data = clip("wav", seconds=0.5, rate=44100, channels=2, seed=3)
    container = av.open(__import__("io").BytesIO(data))
    resampler = av.AudioResampler(format="flt", layout="mono", rate=16000)
    expected = []
    for frame in container.decode(audio=0):
        expected += [f.to_ndarray().reshape(-1) for f in resampler.resample(frame)]
    expected += [f.to_ndarray().reshape(-1) for f in resampler.resample(None)]
    assert np.array_equal(audio.decode(data), np.concatenate(expected))


def test_a_part_with_several_audio_streams_is_read_at_ffmpegs_best_stream():
    """transformers' loader (torchcodec) reads FFmpeg's best audio stream, the one marked
    default, not simply the first: so do the length and the decode."""
    import io

    import av

    quiet, loud = clip("m4a", seconds=0.6, seed=1), clip("m4a", seconds=1.4, seed=2, channels=2)
    out = io.BytesIO()
    with (
        av.open(io.BytesIO(quiet)) as first,
        av.open(io.BytesIO(loud)) as second,
        av.open(out, mode="w", format="mp4") as muxed,
    ):
        sources = [(first, first.streams.audio[0]), (second, second.streams.audio[0])]
        targets = [muxed.add_stream_from_template(stream) for _, stream in sources]
        targets[0].disposition, targets[1].disposition = 0, av.stream.Disposition.default
        for (container, stream), target in zip(sources, targets):
            for packet in container.demux(stream):
                if packet.dts is not None:
                    packet.stream = target
                    muxed.mux(packet)
    data = out.getvalue()
    with av.open(io.BytesIO(data)) as container:
        assert container.streams.best("audio").index == 1  # FFmpeg's choice: the default one
    assert np.array_equal(audio.decode(data), audio.decode(loud))
    assert audio.length(data).samples == len(audio.decode(loud)) != len(audio.decode(quiet))


# ---- documents and reasons -----------------------------------------------------------------


def _skips(te, key, document, parts) -> dict:
    with contextlib.suppress(SkipSample):
        te.encode_sample(conversation_sample(key, document, parts))
    return dict(te.stats.skipped)


def _omni_processor():
    """Qwen2.5-Omni's tiny processor; the test skips (naming what the release lacks) where
    the processor path cannot take its media."""
    require_processor_media("qwen2_5_omni")
    return build("qwen2_5_omni", model=False)[0]


def _omni(**knobs):
    return PackingTaskEncoder(max_input_seq_length=CAPACITY, processor=_omni_processor(), **knobs)


def test_audio_skip_reasons():
    wav = clip("wav", seconds=1.0)

    def doc(name):
        return {
            "messages": [
                {"role": "user", "content": [{"type": "audio", "audio": name}]},
                {"role": "assistant", "content": "ok"},
            ],
            "audios": [name],
        }

    assert _skips(_omni(), "m", doc("a.wav"), {}) == {"missing_audio": 1}
    assert _skips(_omni(), "u", doc("a.wav"), {"a.wav": b"RIFF not a wave"}) == {
        "audio_unreadable": 1
    }
    assert _skips(_omni(), "n", doc("a.m4a"), {"a.m4a": VIDEO.read_bytes()}) == {
        "audio_no_stream": 1
    }
    assert _skips(_omni(max_audio_seconds=0.5), "l", doc("a.wav"), {"a.wav": wav}) == {
        "audio_too_long": 1
    }
    # the family's own maximum: Qwen2.5-Omni's processor would cut a longer clip silently
    short = _omni(audio_config={"chunk_length": 1})
    assert _skips(short, "f", doc("a.wav"), {"a.wav": clip("wav", seconds=1.2)}) == {
        "audio_too_long": 1
    }
    # another family, and the built-in layout: skipped, naming the families that take audio
    for te in (
        PackingTaskEncoder(
            max_input_seq_length=CAPACITY, processor=build("qwen2_vl", model=False)[0]
        ),
        PackingTaskEncoder(max_input_seq_length=CAPACITY, tokenizer="bundled"),
    ):
        assert _skips(te, "x", doc("a.wav"), {"a.wav": wav}) == {"unsupported_audio": 1}


@pytest.mark.parametrize("layout", ["builtin", "qwen2_vl"])
def test_unsupported_audio_names_the_families_that_take_it(layout):
    from energon_packing.errors import Skip

    source = (
        {"tokenizer": "bundled"}
        if layout == "builtin"
        else {"processor": build(layout, model=False)[0]}
    )
    te = PackingTaskEncoder(max_input_seq_length=CAPACITY, **source)
    with pytest.raises(Skip) as found:
        te.chat.encode(
            key="k",
            messages=[
                {"role": "user", "content": "<audio>What?"},
                {"role": "assistant", "content": "ok"},
            ],
            image_names=[],
            images={},
            audio_names=["a.wav"],
            audios={"a.wav": clip("wav", seconds=0.3)},
            loss_weight=1.0,
            config=te.config,
        )
    assert found.value.reason == "unsupported_audio"
    assert all(name in found.value.detail for name in AUDIO_FAMILIES), found.value.detail


def test_audio_placeholder_without_audios_is_text():
    """``<audio>`` in a document that lists no audio is text: the processor's own ids for it."""
    processor = _omni_processor()
    te = PackingTaskEncoder(max_input_seq_length=CAPACITY, processor=processor)
    encoded = te.encode_sample(conversation_sample("t", BY_KEY["text_only"][0], {}))
    assert "<audio>" in processor.tokenizer.decode(encoded.input_ids.tolist())
    assert np.array_equal(encoded.input_ids, _reference(processor, "text_only")["input_ids"][0])
    builtin = PackingTaskEncoder(max_input_seq_length=CAPACITY, tokenizer="bundled")
    assert builtin.encode_sample(conversation_sample("t", BY_KEY["text_only"][0], {})).length


def test_audio_tokens_never_train_and_truncation_never_cuts_a_clip():
    processor = _omni_processor()
    document = {
        "messages": [
            {"role": "user", "content": "Say something."},
            {
                "role": "assistant",
                "content": [{"type": "audio", "audio": "a.wav"}, {"type": "text", "text": "That."}],
            },
        ],
        "audios": ["a.wav"],
    }
    parts = {"a.wav": clip("wav", seconds=2.0)}
    te = PackingTaskEncoder(max_input_seq_length=CAPACITY, processor=processor)
    encoded = te.encode_sample(conversation_sample("k", document, parts))
    ids, mask = encoded.input_ids, encoded.token_mask
    heard = np.isin(
        ids,
        processor.tokenizer.convert_tokens_to_ids(["<|AUDIO|>", "<|audio_bos|>", "<|audio_eos|>"]),
    )
    assert heard.sum() == 50 + 2 and not mask[heard].any() and mask[~heard].any()
    end = int(np.flatnonzero(heard)[-1]) + 1  # the clip's last token (its end marker) + 1
    te = PackingTaskEncoder(max_input_seq_length=end - 8, processor=processor, overlong="truncate")
    assert _skips(te, "k", document, parts) == {"overlong_media": 1}


def test_the_audio_rule_joins_the_restore_fingerprint():
    processor = _omni_processor()
    plain = _omni().chat.fingerprint
    assert _omni().chat.fingerprint == plain
    assert _omni(audio_config={"chunk_length": 30}).chat.fingerprint != plain
    with pytest.raises(ValueError, match="audio_config applies to families"):
        PackingTaskEncoder(
            max_input_seq_length=CAPACITY,
            processor=build("qwen2_vl", model=False)[0],
            audio_config={"chunk_length": 30},
        )
    with pytest.raises(ValueError, match="audio_config must be a dict with keys among"):
        PackingTaskEncoder(
            max_input_seq_length=CAPACITY, processor=processor, audio_config={"x": 1}
        )


# ---- the Omni families, exact --------------------------------------------------------------


@pytest.mark.parametrize("family", AUDIO_FAMILIES)
@pytest.mark.processor_media
def test_predicted_audio_tokens_are_the_processors(family):
    """encode_sample costs a clip from its sample count; the processor, run on the decoded
    clip, expands it to exactly that many tokens (sample counts around frame edges)."""
    processor = build(family, model=False)[0]
    te = PackingTaskEncoder(max_input_seq_length=8192, processor=processor)
    rng = np.random.default_rng(0)
    for n in (400, 1599, 1600, 1601, 16000, 16159, 16160, 31999, 48321):
        data = clip("wav", seconds=n / 16000, seed=int(rng.integers(1000)))
        document = {
            "messages": [
                {"role": "user", "content": [{"type": "audio", "audio": "a.wav"}]},
                {"role": "assistant", "content": "ok"},
            ],
            "audios": ["a.wav"],
        }
        encoded = te.encode_sample(conversation_sample("k", document, {"a.wav": data}))
        text = processor.apply_chat_template(_hf_messages(document), tokenize=False)
        call = callable_without_videos(processor)
        reference = call(text=[text], audio=[audio.decode(data)], return_tensors="pt")
        assert np.array_equal(encoded.input_ids, reference["input_ids"][0].numpy()), n


@pytest.mark.parametrize("family", AUDIO_FAMILIES)
@pytest.mark.processor_media
def test_an_omni_family_through_its_processor_and_the_loader(audio_dataset, family):
    processor, model, info = build(family)
    te = PackingTaskEncoder(max_input_seq_length=CAPACITY, processor=processor, pad_multiple=8)
    assert te.chat.family_name == info["family"]
    seen, worst = [], 0.0
    for batch in loader_batches(audio_dataset, te, buffer=8):
        (mb,) = prepacked_microbatches(batch, pad_multiple=8)
        inputs = mb.model_inputs
        logits = hf.run(model, hf.packed_kwargs(inputs, mb.cu_seqlens_padded, info))
        mixed = clips_heard_together(family, [BY_KEY[key][0] for key in mb.source_ids])
        if mixed:  # an older release: its clips hear each other (proven one clip-holding
            # conversation per pack in test_video_omni's to_hf test)
            assert_to_hf_refuses_clips_heard_together(batch, model)
        clip_row = 0
        for k, key in enumerate(mb.source_ids):
            reference = _reference(processor, key)
            start, n = int(mb.cu_seqlens_padded[k]), int(mb.cu_seqlens[k + 1] - mb.cu_seqlens[k])
            ids = inputs["input_ids"][0, start : start + n]
            assert torch.equal(ids, reference["input_ids"][0]), f"{key}: token ids"
            if "input_features" in reference:
                clips = len(reference["input_features"])
                got = inputs["input_features"][clip_row : clip_row + clips]
                mask = inputs["feature_attention_mask"][clip_row : clip_row + clips]
                # the pack pads to its widest clip; the processor to the conversation's
                # longest (Qwen3-Omni) or to its 5-minute maximum (Qwen2.5-Omni)
                want, want_mask = reference["input_features"], reference["feature_attention_mask"]
                width = min(got.shape[-1], want.shape[-1])
                assert torch.equal(mask[..., :width], want_mask[..., :width].to(mask.dtype)), key
                assert not mask[..., width:].any() and not want_mask[..., width:].any(), key
                for row, frames in enumerate(want_mask.sum(-1).tolist()):  # what the model reads
                    assert torch.equal(got[row, :, :frames], want[row, :, :frames]), key
                clip_row += clips
            rope, _ = model.get_rope_index(
                reference["input_ids"],
                image_grid_thw=reference.get("image_grid_thw"),
                video_grid_thw=None,
                attention_mask=reference["attention_mask"],
                audio_seqlens=(
                    reference["feature_attention_mask"].sum(-1)
                    if "feature_attention_mask" in reference
                    else None
                ),
            )
            got = inputs["position_ids"][:, 0, start : start + n]
            assert torch.equal(got, rope[:, 0].long()), f"{key}: positions"
            seen.append(key)
            if mixed and "input_features" in reference:
                continue
            alone = hf.run(model, dict(reference))
            worst = max(worst, float((logits[start : start + n] - alone[:n]).abs().max()))
        assert clip_row == (len(inputs["input_features"]) if "input_features" in inputs else 0)
    assert sorted(seen) == sorted(BY_KEY) and not te.stats.skipped
    assert worst <= 1e-5, f"{family}: per-source logits differ by {worst:.2e}"


# ---- a mixed epoch -------------------------------------------------------------------------


def _faulty() -> list[tuple[str, dict, dict, str]]:
    """(key, document, parts, reason) of conversations whose audio cannot be packed."""

    def doc(name, content=None):
        return {
            "messages": [
                {"role": "user", "content": content or [{"type": "audio", "audio": name}]},
                {"role": "assistant", "content": "ok"},
            ],
            "audios": [name],
        }

    return [
        ("no_part", doc("gone.wav"), {}, "missing_audio"),
        ("garbage", doc("bad.wav"), {"bad.wav": b"RIFF....WAVEfmt nonsense"}, "audio_unreadable"),
        ("silent_video", doc("v.m4a"), {"v.m4a": VIDEO.read_bytes()}, "audio_no_stream"),
        ("too_long", doc("long.flac"), {"long.flac": clip("flac", seconds=7.0)}, "audio_too_long"),
        (
            "unreferenced",
            doc("x.wav", content="No clip here."),
            {"x.wav": clip("wav", seconds=0.2)},
            "placeholder_mismatch",
        ),
    ]


def _videos() -> tuple[list[tuple[str, dict, dict]], list[tuple[str, dict, dict, str]]]:
    """(key, document, parts) of conversations with videos (one beside a clip and an image),
    and (key, document, parts, reason) of those whose video cannot be packed."""
    mp4 = VIDEO.read_bytes()

    def doc(*content, videos=("v.mp4",), **lists):
        return {
            "messages": [
                {"role": "user", "content": list(content)},
                {"role": "assistant", "content": "A moving square."},
            ],
            "videos": list(videos),
            **lists,
        }

    video = {"type": "video", "video": "v.mp4"}
    good = [
        ("video_alone", doc(video, {"type": "text", "text": "What moves?"}), {"v.mp4": mp4}),
        (
            "video_clip_image",
            doc(
                {"type": "image", "image": "p.png"},
                video,
                {"type": "audio", "audio": "a.wav"},
                images=["p.png"],
                audios=["a.wav"],
            ),
            {"v.mp4": mp4, "p.png": _png(40, 30, seed=9), "a.wav": clip("wav", seconds=0.5)},
        ),
    ]
    faulty = [
        ("video_missing", doc(video), {}, "missing_video"),
        (
            "video_garbage",
            doc(video),
            {"v.mp4": b"\x00\x00\x00\x18ftypmp42 garbage"},
            "video_unreadable",
        ),
        ("video_of_sound", doc(video), {"v.mp4": clip("m4a", seconds=0.4)}, "video_no_stream"),
    ]
    return good, faulty


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_a_mixed_epoch_puts_every_conversation_in_one_pack_or_the_skip_report(tmp_path, workers):
    """Text, images, videos and audio with faulty clips and videos, through the real loader:
    each conversation lands in exactly one pack, or in the skip report under its exact
    reason."""
    import json

    from energon_packing.schema import PACKING_SKIPPED

    videos, bad_videos = _videos()
    faulty = _faulty() + bad_videos
    raw = [
        {"__key__": key, "json": json.dumps(document).encode(), **parts}
        for key, document, parts, *_ in [*CONVERSATIONS, *videos, *faulty]
    ]
    path = make_dataset(tmp_path, [], raw=raw)
    te = PackingTaskEncoder(
        max_input_seq_length=CAPACITY,
        processor=_omni_processor(),
        max_audio_seconds=5.0,
        # 4 frames at the smallest size: a video fits the tiny capacity beside its clip
        video_config={"do_sample_frames": True, "fps": 2.0, "size": {"shortest_edge": 56 * 56}},
    )
    packed, skipped = [], {}
    grids = 0
    for batch in loader_batches(path, te, buffer=4, workers=workers):
        packed += [key for row in batch["source_ids"] for key in row]
        grids += sum(len(g) for g in batch.get("video_grid_thw", []))  # one list a pack
        for key, reason in batch[PACKING_SKIPPED]:
            assert key not in skipped, key
            skipped[key] = reason
    assert sorted(packed) == sorted([*BY_KEY, *(key for key, *_ in videos)])
    assert grids == len(videos)  # each packed video's pixels are in its pack
    assert skipped == {key: reason for key, _, _, reason in faulty}


def test_stats_counts_the_audio_tokens_of_every_conversation(audio_dataset):
    """``stats``' media line: the audio-token ids of every encoded conversation and its clips,
    as many as the processor's own expansion of each clip (``replace_audio_token``)."""
    from energon_packing.loader.loading import epoch
    from energon_packing.tools.report import format_tokens, measure_costs

    te = _omni()
    token = te.chat.audio.token_id
    expected = clips = 0
    for sample in epoch(audio_dataset, _omni(), packing_buffer_size=None, batch_size=None):
        expected += int(np.count_nonzero(np.asarray(sample.input_ids) == token))
        clips += len(sample.audios)
    measured = measure_costs(audio_dataset, te, progress=False)
    assert measured.audio_tokens == expected > 0 and measured.audios == clips > 1
    assert f"{expected:,} audio tokens from {clips} clips" in format_tokens(measured)
    builtin = PackingTaskEncoder(max_input_seq_length=CAPACITY, tokenizer="bundled")
    builtin = measure_costs(audio_dataset, builtin, progress=False)
    assert builtin.audio_tokens is None and "audio" not in format_tokens(builtin)


def test_preview_marks_each_clips_audio_tokens(audio_dataset, tmp_path):
    """``preview``'s segments: one run of audio tokens per clip, as long as the processor
    expands it, in the conversation the clip belongs to; the text and the picture show them."""
    from energon_packing.tools.picture import describe, draw, pack_segments

    te = _omni()
    token = te.chat.audio.token_id
    clips = {
        key: len(_in_order(document, parts, "audio")) for key, document, parts in CONVERSATIONS
    }
    layouts = []
    for batch in loader_batches(audio_dataset, te, buffer=8):
        for row in range(len(batch["source_ids"])):
            layout = pack_segments(batch, row, image_pad_id=te.image_token_id, audio_pad_id=token)
            ids = np.asarray(batch["input_ids"][row])
            for s in layout.segments:
                assert len(s.audios) == clips[s.key], s.key
                assert sum(b - a for a, b in s.audios) == int(
                    np.count_nonzero(ids[s.start : s.real_end] == token)
                )
                assert all(set(ids[a:b].tolist()) == {token} for a, b in s.audios)
            layouts.append(layout)
    assert sum(clips.values()) > 1 and sum(x.audio_tokens for x in layouts) > 0
    text = describe(layouts)
    assert text.count(" audio  (") == sum(1 for n in clips.values() if n)
    assert draw(layouts, tmp_path / "p.png").stat().st_size > 0


@pytest.mark.parametrize("family", AUDIO_FAMILIES)
def test_the_audio_encoder_keeps_a_calls_clips_apart_where_the_rule_says(family):
    """``hf_compat.omni_audio_clips_apart`` (what ``to_hf`` refuses packs by) is what the
    installed thinker's audio encoder does on sdpa: a clip's features alone equal its features
    in a call beside another clip exactly where the rule says its clips stay apart (Qwen3-Omni
    before 5.12.1: they differ, every clip attending to every other)."""
    from energon_packing.encoding import hf_compat

    processor, model, _ = build(family)
    first, second = (audio.decode(clip("wav", seconds=s, seed=n)) for n, s in ((1, 2.5), (2, 1.3)))
    padding = "max_length" if family == "qwen2_5_omni" else True  # as each processor pads

    def features(clips):
        found = processor.feature_extractor(
            clips, sampling_rate=16000, return_attention_mask=True, padding=padding
        )
        inputs = torch.as_tensor(np.asarray(found["input_features"]))
        mask = torch.as_tensor(np.asarray(found["attention_mask"]))
        with torch.no_grad():
            out = model.get_audio_features(inputs, feature_attention_mask=mask)
        out = getattr(out, "last_hidden_state", out)  # a tensor (or a tuple) before 5.8
        return torch.cat(list(out)) if isinstance(out, (tuple, list)) else out

    alone, beside = features([first]), features([first, second])
    assert len(beside) > len(alone)
    difference = float((beside[: len(alone)] - alone).abs().max())
    apart = hf_compat.omni_audio_clips_apart(family)
    assert (difference <= 1e-6) == apart, (family, difference, apart)


@pytest.mark.parametrize("family", AUDIO_FAMILIES)
@pytest.mark.processor_media
def test_an_encoder_says_so_where_its_releases_audio_encoder_mixes_clips(family, caplog):
    """Building a task encoder of an audio family logs one warning naming the release and the
    fix exactly where that release's audio encoder mixes a call's clips (the other trainers'
    paths never see the model; ``to_hf`` refuses such packs)."""
    import logging

    from energon_packing.encoding import hf_compat

    processor = build(family, model=False)[0]
    with caplog.at_level(logging.WARNING, logger="energon_packing"):
        PackingTaskEncoder(max_input_seq_length=512, processor=processor)
    said = [r.getMessage() for r in caplog.records if "would hear each other" in r.getMessage()]
    apart = hf_compat.omni_audio_clips_apart(family)
    assert len(said) == (0 if apart else 1), said
    if said:
        assert f"the {family} audio encoder" in said[0] and "transformers >= 5.12.1" in said[0]


def test_to_hf_finds_the_clips_of_a_pack_by_a_full_omni_config(monkeypatch):
    """The refusal reads the audio token of the config ``to_hf`` is given, the thinker's or a
    whole Qwen3-Omni's (``thinker_config``), and counts the conversations that hold clips: two
    here (a third is silent), refused where the encoder mixes them, accepted where not."""
    import transformers

    from energon_packing.encoding import hf_compat
    from energon_packing.hf import to_hf
    from energon_packing.schema import collate

    processor, model, _ = build("qwen3_omni")
    te = PackingTaskEncoder(max_input_seq_length=CAPACITY, processor=processor)
    hearing = [k for k, (d, _) in BY_KEY.items() if d.get("audios")][:2]
    silent = [k for k, (d, _) in BY_KEY.items() if not d.get("audios")][:1]
    encoded = [te.encode_sample(conversation_sample(k, *BY_KEY[k])) for k in hearing + silent]
    batch = collate([te.pack_selected_samples(encoded).pack])
    whole = transformers.Qwen3OmniMoeConfig(thinker_config=model.config.to_dict())
    assert getattr(whole, "audio_token_id", None) is None  # only its thinker's names it
    monkeypatch.setattr(hf_compat, "omni_audio_clips_apart", lambda family: False)
    for config in (model.config, whole):
        with pytest.raises(ValueError, match=r"holds clips of 2 conversations \((.+), (.+)\)"):
            to_hf(batch, config=config)
    monkeypatch.setattr(hf_compat, "omni_audio_clips_apart", lambda family: True)
    assert to_hf(batch, config=whole).source_ids == hearing + silent
