"""Videos in Qwen2.5-Omni and Qwen3-Omni conversations: exact against the real processors and
the thinkers' own positions (issue 33 item 3, issue 32 item 2).

The Omni processors' video processor is ``Qwen2VLVideoProcessor``, which imports torchvision
(absent beside the CPU torch wheel). The reference here is the family's real processor class
(chat template, kwargs merging, ``_process_videos``: ``video_second_per_grid``,
``replace_video_token``, tokenization) with :class:`StandInVideoProcessor` in its video
processor's place: it takes what the processor passes (the video paths and the merged
``videos_kwargs``: the Omni processor's own ``size`` included) over the settings a checkpoint
gives its video processor, and makes the pixels by Qwen2-VL's video rule, which
``tests/test_video.py`` proves bit-equal to the real ``Qwen2VLVideoProcessor``
(``tests/data/video/reference.json``). Qwen2.5-Omni's pixels are checked once more against
the real Qwen2-VL processor's recorded hashes (``processor_reference.json``: the same video
processor at the same size).

Per family and settings: each packed conversation's ids, ``pixel_values_videos``,
``video_grid_thw``, ``video_second_per_grid``, audio features and positions equal the
processor's on that conversation alone and the thinker's own ``get_rope_index``; per-source
logits of the pack equal the thinker's forward on each conversation alone (<= 1e-5).
"""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import (
    assert_to_hf_refuses_clips_heard_together,
    clips_heard_together,
    conversation_sample,
    decode_image,
    loader_batches,
    make_dataset,
)

from energon_packing import PackingTaskEncoder
from energon_packing.media import audio
from energon_packing.testing.audio import clip
from energon_packing.trainer import prepacked_microbatches

transformers = pytest.importorskip("transformers")
pytest.importorskip("av")

from energon_packing.media import video, video_rules, video_styles  # noqa: E402
from energon_packing.testing import hf  # noqa: E402
from energon_packing.testing.families import AUDIO_FAMILIES, build  # noqa: E402

pytestmark = pytest.mark.energon

DATA = Path(__file__).parent / "data" / "video"
REFERENCE = json.loads((DATA / "processor_reference.json").read_text())
SMALL = {"shortest_edge": 56 * 56, "longest_edge": 112 * 112}
#: (family, video_config): the processors' defaults (every frame, the processor's own size),
#: and sampling by fps at small sizes (Qwen2.5-Omni at 3 fps: a fractional time step, cut)
SETTINGS = [
    ("qwen2_5_omni", None),
    ("qwen2_5_omni", {"do_sample_frames": True, "fps": 3.0, "size": SMALL}),
    # 8 s, the processor's own (larger) frames: under -m slow; Qwen2.5-Omni's own-settings
    # run and Qwen3-Omni's small-frame run stay by default
    pytest.param("qwen3_omni", None, marks=pytest.mark.slow),
    ("qwen3_omni", {"do_sample_frames": True, "fps": 2.0, "size": SMALL}),
]


class StandInVideoProcessor:
    """``Qwen2VLVideoProcessor`` as the Omni processor calls it: its own settings (a
    checkpoint's ``settings``, else the class defaults) under the call's ``videos_kwargs``;
    each video path decoded and processed by Qwen2-VL's video rule."""

    temporal_patch_size = 2
    merge_size = 2
    model_input_names = ("pixel_values_videos", "video_grid_thw")

    def __init__(self, settings: dict | None = None):
        self.settings = dict(settings or {})
        self.calls: list[dict] = []

    def __call__(self, videos, **kwargs):
        from transformers.feature_extraction_utils import BatchFeature

        self.calls.append(dict(kwargs))
        kwargs.pop("return_tensors", None)
        kwargs.pop("max_video_tokens", None)  # its pixel cap reads its own, never the call's
        rule = video_rules.VideoRule.of(video_styles.QWEN2_VL, self.settings, overrides=kwargs)
        pixels, grids = [], []
        for path in videos:
            data = Path(path).read_bytes()
            plan = rule.plan(video.probe(data))
            found, grid = video.process(video.decode(data, plan.indices), rule)
            pixels.append(found)
            grids.append(grid)
        return BatchFeature(
            {"pixel_values_videos": torch.cat(pixels), "video_grid_thw": torch.tensor(grids)}
        )


def _png(width: int, height: int, seed: int) -> bytes:
    from PIL import Image

    rng = np.random.default_rng(seed)
    out = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (height, width, 3), dtype=np.uint8)).save(out, "PNG")
    return out.getvalue()


def _parts(*pieces) -> list[dict]:
    return [
        {"type": "text", "text": p} if isinstance(p, str) else {"type": p[0], p[0]: p[1]}
        for p in pieces
    ]


def _conversations() -> list[tuple[str, dict, dict]]:
    """(key, document, parts): a video alone, two videos, video with image and audio (mixed),
    a video with an audio clip, a video in a later turn, text only."""
    small = (DATA / "h264_48x36_10fps_2s.mp4").read_bytes()
    short = (DATA / "h264_100x60_25fps_23f.mp4").read_bytes()
    mov = (DATA / "h264_120x80_30fps_1s.mov").read_bytes()
    return [
        (
            "video_then_text",
            {
                "messages": [
                    {"role": "user", "content": _parts(("video", "a.mp4"), "What happens?")},
                    {"role": "assistant", "content": "A gradient moves."},
                ],
                "videos": ["a.mp4"],
            },
            {"a.mp4": small},
        ),
        (
            "two_videos",
            {
                "messages": [
                    {"role": "user", "content": _parts(("video", "b.mp4"), "The first?")},
                    {"role": "assistant", "content": "A ramp."},
                    {"role": "user", "content": _parts("And ", ("video", "c.mov"))},
                    {"role": "assistant", "content": "A square."},
                ],
                "videos": ["b.mp4", "c.mov"],
            },
            {"b.mp4": short, "c.mov": mov},
        ),
        (
            "image_video_audio",
            {
                "messages": [
                    {
                        "role": "user",
                        "content": _parts(
                            ("image", "p.png"),
                            "A picture, a clip ",
                            ("video", "a.mp4"),
                            " and a sound ",
                            ("audio", "s.wav"),
                            ": alike?",
                        ),
                    },
                    {"role": "assistant", "content": "Not at all."},
                ],
                "images": ["p.png"],
                "videos": ["a.mp4"],
                "audios": ["s.wav"],
            },
            {"p.png": _png(90, 60, seed=1), "a.mp4": small, "s.wav": clip("wav", seconds=1.3)},
        ),
        (
            "audio_then_video",
            {
                "messages": [
                    {
                        "role": "user",
                        "content": _parts(("audio", "t.flac"), "Then ", ("video", "b.mp4")),
                    },
                    {"role": "assistant", "content": "Both short."},
                ],
                "videos": ["b.mp4"],
                "audios": ["t.flac"],
            },
            {"b.mp4": short, "t.flac": clip("flac", seconds=0.8, seed=2)},
        ),
        (
            "text_only",
            {
                "messages": [
                    {"role": "user", "content": "Any video?"},
                    {"role": "assistant", "content": "None."},
                ]
            },
            {},
        ),
    ]


CONVERSATIONS = _conversations()
BY_KEY = {key: (document, parts) for key, document, parts in CONVERSATIONS}


def _in_order(document: dict, kind: str) -> list[str]:
    return [
        p[kind]
        for m in document["messages"]
        if isinstance(m["content"], list)
        for p in m["content"]
        if p["type"] == kind
    ]


def template_messages(document: dict) -> list[dict]:
    """A document's messages as a chat template takes them: each medium a bare part."""
    return [
        {
            "role": m["role"],
            "content": [
                {"type": "text", "text": p["text"]} if p["type"] == "text" else {"type": p["type"]}
                for p in m["content"]
            ]
            if isinstance(m["content"], list)
            else m["content"],
        }
        for m in document["messages"]
    ]


def processor_alone(processor, document: dict, parts: dict, tmp: Path, **extra) -> dict:
    """The processor's own output on one conversation alone: its chat template over the
    document's messages, its videos as paths (written under ``tmp``), its images decoded."""
    text = processor.apply_chat_template(template_messages(document), tokenize=False)
    paths = []
    for name in _in_order(document, "video"):
        (tmp / name).write_bytes(parts[name])
        paths.append(str(tmp / name))
    images = [decode_image(parts[name]) for name in _in_order(document, "image")]
    return processor(
        text=[text],
        videos=paths or None,
        images=[images] if images else None,
        return_tensors="pt",
        **extra,
    )


def _reference(
    processor, key: str, tmp: Path, video_config: dict | None, *, by_key: dict | None = None
) -> dict:
    """The real Omni processor on the conversation alone (the stand-in video processor in
    its video processor's place; ``tests/test_video_real.py``: a real processor and video
    processor, over ``by_key``'s conversations)."""
    document, parts = (by_key or BY_KEY)[key]
    clips = [audio.decode(parts[name]) for name in _in_order(document, "audio")]
    extra = {"audio": clips or None}
    if "Omni" not in type(processor).__name__:  # Qwen-VL: no audio; the token types it takes
        extra = {"return_mm_token_type_ids": True}
    return processor_alone(processor, document, parts, tmp, **extra, **(video_config or {}))


def _with_video_processor(processor):
    """``processor`` with the stand-in in its video processor's place (its settings: the
    checkpoint's, as the packer reads them)."""
    processor.video_processor = StandInVideoProcessor(getattr(processor, "video_settings", None))
    return processor


@pytest.fixture(scope="module")
def omni_dataset(tmp_path_factory):
    raw = [
        {"__key__": key, "json": json.dumps(document).encode(), **parts}
        for key, document, parts in CONVERSATIONS
    ]
    return make_dataset(tmp_path_factory.mktemp("omni_video"), [], raw=raw)


@pytest.mark.parametrize(("family", "video_config"), SETTINGS)
@pytest.mark.processor_media
def test_omni_videos_are_the_processors_and_packed_logits_each_conversations_own(
    omni_dataset, tmp_path, family, video_config
):
    processor, model, info = build(family)
    te = PackingTaskEncoder(
        max_input_seq_length=8192, processor=processor, pad_multiple=8, video_config=video_config
    )
    assert te.chat.video_style.name == family
    reference_processor = _with_video_processor(build(family, model=False)[0])
    fields = ("pixel_values_videos", "video_grid_thw", "video_second_per_grid")
    seen, worst, checked, widest = [], 0.0, 0, 0
    for batch in loader_batches(omni_dataset, te, buffer=8):
        (mb,) = prepacked_microbatches(batch, pad_multiple=8)
        widest = max(widest, len(mb.source_ids))
        inputs = mb.model_inputs
        logits = hf.run(model, hf.packed_kwargs(inputs, mb.cu_seqlens_padded, info))
        mixed = clips_heard_together(family, [BY_KEY[key][0] for key in mb.source_ids])
        if mixed:  # an older release: its clips hear each other (to_hf's own test: apart)
            assert_to_hf_refuses_clips_heard_together(batch, model)
        owners = batch["video_source_index"][0]
        grids = inputs.get("video_grid_thw", torch.zeros(0, 3, dtype=torch.long))
        rows = torch.cumsum(grids.prod(dim=1), 0) if len(grids) else torch.zeros(0)
        for k, key in enumerate(mb.source_ids):
            ref = _reference(reference_processor, key, tmp_path, video_config)
            start, n = int(mb.cu_seqlens_padded[k]), int(mb.cu_seqlens[k + 1] - mb.cu_seqlens[k])
            assert torch.equal(inputs["input_ids"][0, start : start + n], ref["input_ids"][0]), key
            mine = (owners == k).nonzero().flatten().tolist()
            assert len(mine) == len(ref.get("video_grid_thw", [])), key
            if mine:
                first = int(rows[mine[0] - 1]) if mine[0] else 0
                got = {
                    "pixel_values_videos": inputs["pixel_values_videos"][
                        first : int(rows[mine[-1]])
                    ],
                    "video_grid_thw": grids[mine],
                    "video_second_per_grid": inputs["video_second_per_grid"][mine],
                }
                for name in fields:
                    assert got[name].dtype == ref[name].dtype, (key, name)
                    assert torch.equal(got[name], ref[name]), (key, name)
                checked += len(mine)
            rope, _ = model.get_rope_index(
                ref["input_ids"],
                image_grid_thw=ref.get("image_grid_thw"),
                video_grid_thw=ref.get("video_grid_thw"),
                attention_mask=ref["attention_mask"],
                use_audio_in_video=False,
                audio_seqlens=(
                    ref["feature_attention_mask"].sum(-1)
                    if "feature_attention_mask" in ref
                    else None
                ),
                second_per_grids=ref.get("video_second_per_grid"),
            )
            assert torch.equal(rope, rope.round()), f"{key}: the thinker's positions are whole"
            got = inputs["position_ids"][:, 0, start : start + n]
            assert torch.equal(got, rope[:, 0].long()), f"{key}: positions"
            seen.append(key)
            if mixed and "input_features" in ref:
                continue
            alone = hf.run(model, dict(ref))
            worst = max(worst, float((logits[start : start + n] - alone[:n]).abs().max()))
    assert sorted(seen) == sorted(BY_KEY) and not te.stats.skipped
    assert checked == 5 and widest >= 3  # the conversations' videos; packs of several
    # the processor handed its video processor its own size, over the checkpoint's
    size = reference_processor.video_processor.calls[0]["size"]
    assert (size == SMALL) if video_config else (size != SMALL)
    print(f"{family} {video_config}: max |packed - alone| logit difference {worst:.2e}")
    assert worst <= 1e-5, f"{family}: per-source logits differ by {worst:.2e}"


@pytest.mark.parametrize("family", AUDIO_FAMILIES)
@pytest.mark.processor_media
def test_to_hf_of_an_omni_pack_gives_each_conversations_own_logits(tmp_path, family):
    """``to_hf``'s inputs (padding-free: 4-row positions, no mask) of one pack of all the
    conversations: each source's logits are the thinker's on it alone (sdpa, <= 1e-5). On a
    release whose audio encoder mixes a call's clips, that pack is refused, and each pack of
    the silent conversations with one that has clips is exact."""
    from energon_packing.hf import to_hf
    from energon_packing.schema import collate

    config = {"do_sample_frames": True, "fps": 2.0, "size": SMALL}
    processor, model, _ = build(family)
    te = PackingTaskEncoder(max_input_seq_length=4096, processor=processor, video_config=config)
    encoded = {k: te.encode_sample(conversation_sample(k, d, p)) for k, d, p in CONVERSATIONS}
    groups = [list(encoded)]
    if clips_heard_together(family, [d for _, d, _ in CONVERSATIONS]):
        batch = collate([te.pack_selected_samples(list(encoded.values())).pack])
        assert_to_hf_refuses_clips_heard_together(batch, model)
        silent = [k for k, d, _ in CONVERSATIONS if not d.get("audios")]
        groups = [[k, *silent] for k, d, _ in CONVERSATIONS if d.get("audios")]
    reference_processor = _with_video_processor(build(family, model=False)[0])
    worst, videos = 0.0, 0
    for group in groups:
        pack = te.pack_selected_samples([encoded[k] for k in group]).pack
        batch = collate([pack])
        inputs = dict(to_hf(batch, model=model))
        videos += len(inputs["video_second_per_grid"])
        assert inputs["video_second_per_grid"].tolist() == [1.0] * len(
            inputs["video_second_per_grid"]
        )
        inputs.pop("labels"), inputs.pop("use_cache")  # hf.run passes use_cache=False
        logits = hf.run(model, inputs)
        cu, padded = batch["cu_seqlens"][0], batch["cu_seqlens_padded"][0]
        for k, key in enumerate(pack.source_ids):
            alone = hf.run(model, dict(_reference(reference_processor, key, tmp_path, config)))
            start, n = int(padded[k]), int(cu[k + 1] - cu[k])
            worst = max(worst, float((logits[start : start + n] - alone).abs().max()))
        assert sorted(pack.source_ids) == sorted(group)
    # every video once in the whole pack; the silent conversations' again in each group
    assert (videos == 5 if len(groups) == 1 else videos >= 5) and worst <= 1e-5, worst


@pytest.mark.parametrize("family", ["qwen2_5_omni"])
@pytest.mark.processor_media
def test_qwen2_5_omni_pixels_are_the_real_qwen2_vl_video_processors(family):
    """Qwen2.5-Omni's video processor is Qwen2-VL's, at the size Qwen2-VL's class defaults to:
    its pixels are the hashes the real processor recorded (fps 2, sampled)."""
    processor = build(family, model=False)[0]
    kwargs = REFERENCE["families"]["qwen2_vl"]["processor_kwargs"]
    te = PackingTaskEncoder(max_input_seq_length=8192, processor=processor, video_config=kwargs)
    checked = 0
    for result in REFERENCE["results"]["qwen2_vl"].values():
        for recorded in result["pixel_values_videos_per_video"]:
            found = te.chat.videos.media((DATA / recorded["clip"]).read_bytes())
            pixels = found["pixel_values_videos"]
            assert list(found["video_grid_thw"][0]) == recorded["grid_thw"], recorded["clip"]
            assert hashlib.sha256(pixels.tobytes()).hexdigest() == recorded["sha256"]
            assert found["video_second_per_grid"].tolist() == [1.0]  # 2 frames / 2 fps
            checked += 1
    assert checked == 5


def test_an_omni_processors_own_size_passes_over_its_video_processors():
    """A checkpoint's video pixel bounds give way to the Omni processor's own ``size``;
    ``video_config`` passes over both; ``video_second_per_grid`` follows the call's fps only."""
    published = {"min_pixels": 3136, "max_pixels": 12845056, "fps": 5.0, "patch_size": 14}
    rule = video_rules.VideoRule.of(video_styles.QWEN2_5_OMNI, published)
    assert (rule.min_pixels, rule.max_pixels, rule.grid_seconds) == (128 * 784, 768 * 784, 1.0)
    rule = video_rules.VideoRule.of(video_styles.QWEN3_OMNI, {**published, "patch_size": 16})
    assert (rule.min_pixels, rule.max_pixels, rule.grid_seconds) == (128 * 1024, 768 * 1024, 2.0)
    rule = video_rules.VideoRule.of(
        video_styles.QWEN3_OMNI, published, overrides={"size": SMALL, "fps": 4.0}
    )
    assert (rule.min_pixels, rule.max_pixels, rule.grid_seconds) == (3136, 12544, 0.5)
    # Qwen2-VL itself keeps the checkpoint's bounds and the sampled rate
    rule = video_rules.VideoRule.of(video_styles.QWEN2_VL, published)
    assert (rule.min_pixels, rule.max_pixels, rule.grid_seconds) == (3136, 12845056, None)


@pytest.mark.parametrize("family", AUDIO_FAMILIES)
def test_an_omni_calls_max_video_tokens_is_refused_naming_the_knob(family):
    """The Omni processors pass ``video_config`` in their call, and before transformers 5.25
    ``Qwen2VLVideoProcessor``'s pixel cap reads its own ``max_video_tokens``, never the call's (``tests/test_video_real.py``
    shows it on the real processor: a call's 16 makes the grid of its own 128000): a
    ``video_config`` one that differs is refused, naming the knob; the video processor's own
    setting is taken. Qwen-VL's ``video_config`` is the video processor's settings: taken; and
    where the release's video processor reads the call's cap (5.25+), the Omni's is taken."""
    style = getattr(video_styles, family.upper())
    with pytest.raises(
        ValueError,
        match=rf"^video_config\['max_video_tokens'\]=16: {family}'s processor passes video_config "
        r"in its call, .* by its own max_video_tokens \(128000\)",
    ):
        video_rules.VideoRule.of(style, None, overrides={"max_video_tokens": 16})
    own = {"max_video_tokens": 16, "cap_pixels_per_frame": True}
    assert video_rules.VideoRule.of(style, own).max_video_tokens == 16
    same = video_rules.VideoRule.of(style, own, overrides={"max_video_tokens": 16})
    assert same.max_video_tokens == 16
    qwen = video_rules.VideoRule.of(
        video_styles.QWEN2_5_VL, None, overrides={"max_video_tokens": 16}
    )
    assert qwen.max_video_tokens == 16
    # transformers 5.25+: the call's cap is read, so it is taken
    read = video_rules.VideoRule.of(
        style, None, overrides={"max_video_tokens": 16}, reads_call_cap=True
    )
    assert read.max_video_tokens == 16


@pytest.mark.parametrize("family", ["qwen3_omni"])
@pytest.mark.processor_media
def test_qwen3_omni_fractional_video_positions_are_refused(family):
    """Qwen3-Omni keeps a video's time positions as floats: at 4 fps a temporal patch is 0.5 s,
    12.5 positions at 25 per second, which integer position ids cannot hold: refused when the
    task encoder is made, naming the knob; Qwen2.5-Omni truncates them (taken)."""
    processor = build(family, model=False)[0]
    assert build(family)[1].config.position_id_per_seconds == 25
    config = {"do_sample_frames": True, "fps": 4.0}
    with pytest.raises(ValueError, match=r"qwen3_omni: video_second_per_grid 0\.5 s x .*12\.5"):
        PackingTaskEncoder(max_input_seq_length=1024, processor=processor, video_config=config)
    PackingTaskEncoder(
        max_input_seq_length=1024,
        processor=build("qwen2_5_omni", model=False)[0],
        video_config=config,
    )
