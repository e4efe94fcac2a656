"""Videos against the REAL video processors (torchvision present): Qwen2-VL, Qwen2.5-VL,
Qwen3-VL, Qwen2.5-Omni and Qwen3-Omni through the real Energon loader.

``tests/test_video.py`` proves the package's video rule bit-equal to the recorded outputs of
the real video processors, and ``tests/test_video_omni.py`` the Omni processors with a stand-in
video processor. Here, where torchvision imports (the ``torchvision`` stack of .ci/stacks.txt;
elsewhere these tests skip, naming it), each family's processor class is built as
``from_pretrained`` builds it, with its real video processor
(:func:`energon_packing.testing.families_video.with_video_processor`: ``Qwen2VLVideoProcessor``,
Qwen3-VL's ``Qwen3VLVideoProcessor``; decoding with transformers' own pyav loader). The task
encoder is given that processor: it reads the video processor's settings off the object.

Per family and settings, through the real loader: each packed conversation's ids, token types,
``pixel_values_videos`` (bit-equal), ``video_grid_thw``, ``second_per_grid_ts`` (Qwen2.5-VL) /
``video_second_per_grid`` (Omni), image and audio fields equal the real processor's on that
conversation alone; positions equal the model's own ``get_rope_index``; per-source logits of
the pack equal the model's forward on each conversation alone (<= 1e-5).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from helpers import loader_batches, make_dataset
from test_video_omni import CONVERSATIONS, SMALL, _reference

from energon_packing import PackingTaskEncoder
from energon_packing.encoding import hf_compat
from energon_packing.trainer import prepacked_microbatches

transformers = pytest.importorskip("transformers")
pytest.importorskip("av")

from energon_packing.testing import hf  # noqa: E402
from energon_packing.testing.families import build  # noqa: E402

pytestmark = [pytest.mark.torchvision, pytest.mark.energon]

DATA = Path(__file__).parent / "data" / "video"
OMNI = ("qwen2_5_omni", "qwen3_omni")
#: a published Qwen2-VL / Qwen2.5-VL ``video_preprocessor_config.json``'s pixel bounds
PUBLISHED = {"min_pixels": 3136, "max_pixels": 12845056}
#: the pixel cap at a token budget that binds on these clips (Qwen2: 90% of it over the video;
#: Qwen3: a frame's)
CAPPED = {"cap_pixels_per_frame": True, "max_video_tokens": 16, "size": SMALL}
#: (family, the checkpoint's video processor settings (None: its class defaults), video_config)
#: Qwen-VL: ``video_config`` is the video processor's own settings (docs/video.md), so the
#: reference's video processor is built from both; the Omni processors pass it in the call
#: (over their own ``size``). Cases: class defaults (Qwen2: every frame); sampling by fps at
#: small sizes; a fractional second per grid (3 fps); the published bounds; Qwen3-VL's
#: ``fps=None`` (every frame, linspace) and a fixed count; the pixel caps with a small token
#: budget; an Omni checkpoint whose video processor samples by itself
SETTINGS = [
    ("qwen2_vl", None, None),
    ("qwen2_vl", None, {"do_sample_frames": True, "fps": 2.0, "size": SMALL}),
    ("qwen2_5_vl", None, {"do_sample_frames": True, "fps": 3.0}),
    ("qwen2_5_vl", PUBLISHED, {"do_sample_frames": True, "fps": 2.0}),
    ("qwen2_5_vl", None, {**CAPPED, "do_sample_frames": True, "fps": 2.0}),
    ("qwen3_vl", None, None),
    ("qwen3_vl", None, {"fps": 4.0, "size": SMALL}),
    ("qwen3_vl", None, {"fps": None, "min_frames": 2, "max_frames": 12}),
    ("qwen3_vl", None, {"fps": None, "num_frames": 6, "cap_pixels_per_frame": True}),
    ("qwen3_vl", None, {**CAPPED, "max_video_tokens": 2}),
    ("qwen2_5_omni", None, None),
    ("qwen2_5_omni", None, {"do_sample_frames": True, "fps": 3.0, "size": SMALL}),
    ("qwen2_5_omni", {"do_sample_frames": True, "fps": 4.0}, None),
    ("qwen3_omni", {"cap_pixels_per_frame": True, "max_video_tokens": 16}, {"size": SMALL}),
    ("qwen3_omni", None, None),
    ("qwen3_omni", None, {"do_sample_frames": True, "fps": 2.0, "size": SMALL}),
]


def _without_audio(document: dict, parts: dict) -> tuple[dict, dict]:
    """The conversation as a Qwen-VL model takes it: audio parts dropped."""
    document = json.loads(json.dumps(document))
    for message in document["messages"]:
        if isinstance(message["content"], list):
            message["content"] = [p for p in message["content"] if p["type"] != "audio"]
    clips = document.pop("audios", [])
    return document, {k: v for k, v in parts.items() if k not in clips}


def _conversations(family: str) -> list[tuple[str, dict, dict]]:
    if family in OMNI:
        return CONVERSATIONS
    return [(key, *_without_audio(document, parts)) for key, document, parts in CONVERSATIONS]


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    out = {}
    for kind in ("omni", "vl"):
        conversations = _conversations("qwen3_omni" if kind == "omni" else "qwen2_vl")
        raw = [
            {"__key__": key, "json": json.dumps(document).encode(), **parts}
            for key, document, parts in conversations
        ]
        out[kind] = (make_dataset(tmp_path_factory.mktemp(kind), [], raw=raw), conversations)
    return out


def _real(family: str, settings: dict | None):
    from energon_packing.testing.families_video import with_video_processor

    processor = build(family, model=False)[0]
    return with_video_processor(family, processor, settings)


def _positions(family: str, model, ref) -> torch.Tensor:
    """The model's own ``get_rope_index`` on the processor's output."""
    if family in OMNI:
        rope, _ = model.get_rope_index(
            ref["input_ids"],
            image_grid_thw=ref.get("image_grid_thw"),
            video_grid_thw=ref.get("video_grid_thw"),
            attention_mask=ref["attention_mask"],
            use_audio_in_video=False,
            audio_seqlens=(
                ref["feature_attention_mask"].sum(-1) if "feature_attention_mask" in ref else None
            ),
            second_per_grids=ref.get("video_second_per_grid"),
        )
        return rope
    kwargs = dict(
        image_grid_thw=ref.get("image_grid_thw"),
        video_grid_thw=ref.get("video_grid_thw"),
        attention_mask=ref["attention_mask"],
    )
    if family == "qwen2_5_vl":
        kwargs["second_per_grid_ts"] = ref.get("second_per_grid_ts")
    rope, _ = model.model.get_rope_index(ref["input_ids"], ref["mm_token_type_ids"], **kwargs)
    return rope


@pytest.mark.parametrize(
    ("family", "settings", "video_config"),
    SETTINGS,
    ids=[f"{family}-{n}" for n, (family, _, _) in enumerate(SETTINGS)],
)
@pytest.mark.processor_media
def test_videos_through_the_loader_are_the_real_video_processors(
    datasets, tmp_path, family, settings, video_config
):
    processor, model, info = build(family)
    processor = _real(family, settings)
    knobs = {}
    if family == "qwen2_5_vl":  # the model's own rate, so the pack's temporal positions match
        knobs["tokens_per_second"] = model.config.vision_config.tokens_per_second
    te = PackingTaskEncoder(
        max_input_seq_length=8192,
        processor=processor,
        pad_multiple=8,
        video_config=video_config,
        **knobs,
    )
    assert te.chat.video_style.name == info["family"]
    assert te.chat.video_settings is processor.video_processor  # read off the real one
    if family in OMNI:  # video_config: the Omni processor's call kwargs
        reference, call = _real(family, settings), video_config
    else:  # video_config: the video processor's own settings
        reference, call = _real(family, {**(settings or {}), **(video_config or {})}), None
    dataset, conversations = datasets["omni" if family in OMNI else "vl"]
    by_key = {key: (document, parts) for key, document, parts in conversations}
    per_video = {  # the fields a video brings, per family
        "qwen2_5_vl": ("second_per_grid_ts",),
        "qwen2_5_omni": ("video_second_per_grid",),
        "qwen3_omni": ("video_second_per_grid",),
    }.get(family, ())
    per_video = ("pixel_values_videos", "video_grid_thw", *per_video)
    seen, worst, videos, widest, pixels, shapes = [], 0.0, 0, 0, hashlib.sha256(), set()
    for batch in loader_batches(dataset, te, buffer=8):
        (mb,) = prepacked_microbatches(batch, pad_multiple=8)
        widest = max(widest, len(mb.source_ids))
        inputs = mb.model_inputs
        logits = hf.run(model, hf.packed_kwargs(inputs, mb.cu_seqlens_padded, info))
        owners = batch["video_source_index"][0]
        grids = inputs.get("video_grid_thw", torch.zeros(0, 3, dtype=torch.long))
        rows = torch.cumsum(grids.prod(dim=1), 0) if len(grids) else torch.zeros(0)
        for k, key in enumerate(mb.source_ids):
            ref = _reference(reference, key, tmp_path, call, by_key=by_key)
            start, n = int(mb.cu_seqlens_padded[k]), int(mb.cu_seqlens[k + 1] - mb.cu_seqlens[k])
            span = slice(start, start + n)
            assert torch.equal(inputs["input_ids"][0, span], ref["input_ids"][0]), key
            if "mm_token_type_ids" in ref:
                assert torch.equal(
                    inputs["mm_token_type_ids"][0, span], ref["mm_token_type_ids"][0]
                ), key
            mine = (owners == k).nonzero().flatten().tolist()
            assert len(mine) == len(ref.get("video_grid_thw", [])), key
            if mine:
                first = int(rows[mine[0] - 1]) if mine[0] else 0
                got = {
                    "pixel_values_videos": inputs["pixel_values_videos"][
                        first : int(rows[mine[-1]])
                    ],
                    "video_grid_thw": grids[mine],
                    **{name: inputs[name][mine] for name in per_video[2:]},
                }
                for name in per_video:
                    assert got[name].dtype == ref[name].dtype, (key, name)
                    assert torch.equal(got[name], ref[name]), (key, name, got[name], ref[name])
                pixels.update(ref["pixel_values_videos"].numpy().tobytes())
                shapes |= {tuple(g) for g in ref["video_grid_thw"].tolist()}
                videos += len(mine)
            rope = _positions(family, model, ref)
            assert torch.equal(rope, rope.round()), f"{key}: the model's positions are whole"
            got = inputs["position_ids"][:, 0, span]
            assert torch.equal(got, rope[:, 0].long()), f"{key}: positions"
            alone = hf.run(model, dict(ref))
            worst = max(worst, float((logits[span] - alone[:n]).abs().max()))
            seen.append(key)
    assert sorted(seen) == sorted(by_key) and not te.stats.skipped
    assert videos == 5 and widest >= 3  # the conversations' videos; packs of several
    print(
        f"{family} settings={settings} video_config={video_config}: {videos} videos, grids "
        f"{sorted(shapes)}, pixels sha256 {pixels.hexdigest()[:12]}, max |packed - alone| "
        f"logit difference {worst:.2e}"
    )
    assert worst <= 1e-5, f"{family}: per-source logits differ by {worst:.2e}"


@pytest.mark.parametrize("family", OMNI)
def test_an_omni_calls_pixel_cap_budget_is_taken_where_the_real_processor_reads_it(family):
    """The Omni processors pass ``video_config`` in their call. Before transformers 5.25
    ``Qwen2VLVideoProcessor``'s pixel cap reads its own ``max_video_tokens``, never the
    call's: at a budget of 16 tokens the real processor still makes 6x8 patches of the
    160x120 clip (its own 128000), so the task encoder refuses it, naming the knob. From 5.25
    it reads the call's (2x4 patches), and the task encoder takes it: the same grid and
    pixels as the real processor's."""
    clip = DATA / "h264_160x120_24fps_3s.mp4"
    config = {"do_sample_frames": True, "fps": 2.0, "cap_pixels_per_frame": True, "size": SMALL}
    processor = _real(family, None)
    reads = hf_compat.video_cap_from_call()
    for budget, grid in ((16, [3, 2, 4] if reads else [3, 6, 8]), (None, [3, 6, 8])):
        call = {**config, **({"max_video_tokens": budget} if budget else {})}
        text = [processor.video_token]
        out = processor(text=text, videos=[str(clip)], return_tensors="pt", **call)
        assert out["video_grid_thw"].tolist() == [grid], budget
        if budget and reads:
            te = PackingTaskEncoder(
                max_input_seq_length=4096, processor=processor, video_config=call
            )
            ours = te.chat.videos.media(clip.read_bytes())
            assert ours["video_grid_thw"].tolist() == [grid]
            assert torch.equal(
                torch.from_numpy(ours["pixel_values_videos"]), out["pixel_values_videos"]
            )
    if not reads:
        with pytest.raises(ValueError, match=r"^video_config\['max_video_tokens'\]=16: "):
            PackingTaskEncoder(
                max_input_seq_length=4096,
                processor=processor,
                video_config={**config, "max_video_tokens": 16},
            )
    te = PackingTaskEncoder(max_input_seq_length=4096, processor=processor, video_config=config)
    assert list(te.chat.videos.media(clip.read_bytes())["video_grid_thw"][0]) == [3, 6, 8]
