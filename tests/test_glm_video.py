"""GLM-4.xV's videos: exact against its processors, through the real loader (issue 33 item 3).

GLM lays a video out as its temporal patches, each an image in the text:
``<|begin_of_image|>``, the patch's image tokens, ``<|end_of_image|>``, then its first frame's
time (GLM-4.1V / 4.5V: whole seconds; GLM-4.6V: ``{s:.1f} seconds``), all between the
template's ``<|begin_of_video|>`` / ``<|end_of_video|>``. Each processor samples its own way
(``Glm4vVideoProcessor``: fps frames a second; ``Glm46VVideoProcessor``: a rate set by the
clip's length), each repeats its last frame to an even count.

The model fills images and videos through one ``<|image|>`` mask, so a call with both fails
(``get_placeholder_mask``). A pack therefore gives a video's patches as images: their pixels
in ``pixel_values``, a ``(1, h, w)`` grid each in ``image_grid_thw`` (``get_video_features``
splits a video's grid so), typed 1 in ``mm_token_type_ids``. Video and image conversations
then share packs; a conversation holding both is skipped, naming why.

The reference is the real processor on each conversation alone (its chat template, its
``__call__``, positions from its own ``mm_token_type_ids``). Its video processor needs
torchvision: on every stack :class:`StandInVideoProcessor` takes its place (the package's rule
over the call's settings); where torchvision imports (the ``torchvision`` stack) the real one
does, decoding with transformers' pyav loader a frame per sampled index (as torchcodec, its
default decoder, returns them), which proves sampling, resize and normalisation bit-equal.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import conversation_sample, loader_batches, make_dataset
from test_video_omni import _parts, _png, processor_alone

from energon_packing import PackingTaskEncoder
from energon_packing.trainer import prepacked_microbatches

transformers = pytest.importorskip("transformers")
pytest.importorskip("av")

from energon_packing.media import video, video_rules, video_styles  # noqa: E402
from energon_packing.testing import hf  # noqa: E402
from energon_packing.testing.families import build  # noqa: E402

pytestmark = pytest.mark.energon

DATA = Path(__file__).parent / "data" / "video"
STYLES = {"glm4v": video_styles.GLM4V, "glm46v": video_styles.GLM46V}
STYLES["glm4v_moe"] = STYLES["glm4v"]  # GLM-4.5V: GLM-4.1V's processor, a MoE text model
#: (family or model, video_config): the class defaults; another rate; every frame
SETTINGS = [
    ("glm4v", None),
    ("glm4v", {"fps": 4.0}),
    ("glm4v", {"do_sample_frames": False}),
    ("glm4v_moe", None),
    ("glm46v", None),
    ("glm46v", {"do_sample_frames": False}),
]


class StandInVideoProcessor:
    """GLM's video processor as its processor calls it: its settings under the call's
    ``videos_kwargs``; each video path decoded and processed by the package's rule; the
    ``video_metadata`` its ``__call__`` stamps the patches from."""

    model_input_names = ("pixel_values_videos", "video_grid_thw")

    def __init__(self, family: str, settings: dict | None = None):
        self.style, self.settings = STYLES[family], dict(settings or {})
        self.merge_size = 2

    def __call__(self, videos, **kwargs):
        from transformers.feature_extraction_utils import BatchFeature
        from transformers.video_utils import VideoMetadata

        from energon_packing.media.video_side import VideoSide

        known = ("do_sample_frames", "fps")
        rule = video_rules.VideoRule.of(
            self.style, self.settings, overrides={k: v for k, v in kwargs.items() if k in known}
        )
        side = VideoSide(rule, max_frames=10_000)
        pixels, grids, metadata = [], [], []
        for path in videos:
            data = Path(path).read_bytes()
            header = video.probe(data)
            plan = rule.plan(header)
            media = side.media(data, plan)
            pixels.append(torch.from_numpy(media["pixel_values_videos"]))
            grids.append(torch.from_numpy(media["video_grid_thw"]))
            metadata.append(
                VideoMetadata(
                    total_num_frames=header.frames,
                    fps=header.fps,
                    duration=header.frames / header.fps,
                    frames_indices=list(plan.indices),
                )
            )
        return BatchFeature(
            {
                "pixel_values_videos": torch.cat(pixels),
                "video_grid_thw": torch.cat(grids),
                "video_metadata": metadata,
            }
        )


def _conversations() -> list[tuple[str, dict, dict]]:
    """(key, document, parts): a video alone; two videos of different sizes; a video in a
    later turn; an image alone; text only."""
    small = (DATA / "h264_48x36_10fps_2s.mp4").read_bytes()
    short = (DATA / "h264_100x60_25fps_23f.mp4").read_bytes()
    mov = (DATA / "h264_120x80_30fps_1s.mov").read_bytes()
    user, assistant = "user", "assistant"

    def turn(role, *pieces):
        return {"role": role, "content": _parts(*pieces)}

    return [
        (
            "video_alone",
            {
                "messages": [
                    turn(user, ("video", "a.mp4"), "What happens?"),
                    turn(assistant, "A gradient moves."),
                ]
            },
            {"a.mp4": small},
        ),
        (
            "two_videos",
            {
                "messages": [
                    turn(user, ("video", "c.mov"), "and", ("video", "d.mp4"), "Same?"),
                    turn(assistant, "No, the second is shorter."),
                ]
            },
            {"c.mov": mov, "d.mp4": short},
        ),
        (
            "video_later",
            {
                "messages": [
                    turn(user, "Hello."),
                    turn(assistant, "Hi."),
                    turn(user, ("video", "e.mp4"), "Now?"),
                    turn(assistant, "Now it moves."),
                ]
            },
            {"e.mp4": small},
        ),
        (
            "image_alone",
            {"messages": [turn(user, ("image", "s.png"), "Colours?"), turn(assistant, "Noise.")]},
            {"s.png": _png(64, 24, 1)},
        ),
        (
            "text_only",
            {"messages": [turn(user, "Two and two?"), turn(assistant, "Four.")]},
            {},
        ),
    ]


CONVERSATIONS = _conversations()
BY_KEY = {key: (document, parts) for key, document, parts in CONVERSATIONS}


def _reference(processor, key: str, tmp: Path) -> dict:
    """The processor's own output on conversation ``key`` alone."""
    document, parts = BY_KEY[key]
    out = processor_alone(processor, document, parts, tmp)
    return {k: v for k, v in out.items() if k != "video_metadata"}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    raw = [
        {"__key__": key, "json": json.dumps(document).encode(), **parts}
        for key, document, parts in CONVERSATIONS
    ]
    return make_dataset(tmp_path_factory.mktemp("glm_video"), [], raw=raw)


def _reference_processor(family: str, real: bool, settings: dict | None):
    processor, _, info = build(family, model=False)
    if real:
        from energon_packing.testing.families_video import with_video_processor

        return with_video_processor(info["family"], processor, settings)
    processor.video_processor = StandInVideoProcessor(family, settings)
    return processor


@pytest.mark.parametrize(
    "real", [False, pytest.param(True, marks=pytest.mark.torchvision)], ids=["stand-in", "real"]
)
@pytest.mark.parametrize(
    "family,settings", SETTINGS, ids=[f"{f}-{n}" for n, (f, _) in enumerate(SETTINGS)]
)
@pytest.mark.processor_media
def test_glm_videos_through_the_loader_are_the_processors(
    dataset, tmp_path, family, settings, real
):
    processor, model, info = build(family)
    te = PackingTaskEncoder(
        max_input_seq_length=4096, processor=processor, pad_multiple=8, video_config=settings
    )
    assert te.chat.video_style is STYLES[family]
    reference = _reference_processor(family, real, settings)
    image_id = processor.image_token_id
    seen, worst, patches, widest = [], 0.0, 0, 0
    for batch in loader_batches(dataset, te, buffer=8):
        (mb,) = prepacked_microbatches(batch, pad_multiple=8)
        widest = max(widest, len(mb.source_ids))
        inputs = mb.model_inputs
        assert "pixel_values_videos" not in inputs and "video_grid_thw" not in inputs
        logits = hf.run(model, hf.packed_kwargs(inputs, mb.cu_seqlens_padded, info))
        ids, grids = inputs["input_ids"][0], inputs.get("image_grid_thw")
        rows = torch.cumsum(grids.prod(-1), 0) if grids is not None else None
        runs = torch.cumsum(grids.prod(-1) // 4, 0) if grids is not None else None
        for k, key in enumerate(mb.source_ids):
            ref = _reference(reference, key, tmp_path)
            start, n = int(mb.cu_seqlens_padded[k]), int(mb.cu_seqlens[k + 1] - mb.cu_seqlens[k])
            assert torch.equal(ids[start : start + n], ref["input_ids"][0]), key
            types = inputs["mm_token_type_ids"][0, start : start + n]
            assert torch.equal(types, ref["mm_token_type_ids"][0].clamp(max=1)), key
            # this conversation's grids: those whose tokens lie before its start, then its own
            before = int(torch.count_nonzero(ids[:start] == image_id))
            first = int(torch.searchsorted(runs, before, right=True)) if runs is not None else 0
            own = int(torch.count_nonzero(ids[start : start + n] == image_id))
            last = int(torch.searchsorted(runs, before + own, right=True)) if own else first
            lo = int(rows[first - 1]) if first else 0
            hi = int(rows[last - 1]) if last else 0
            if "pixel_values_videos" in ref:
                split = [(1, h, w) for t, h, w in ref["video_grid_thw"].tolist() for _ in range(t)]
                assert grids[first:last].tolist() == [list(g) for g in split], key
                assert torch.equal(inputs["pixel_values"][lo:hi], ref["pixel_values_videos"]), key
                patches += len(split)
            elif "pixel_values" in ref:
                assert torch.equal(grids[first:last], ref["image_grid_thw"]), key
                assert torch.equal(inputs["pixel_values"][lo:hi], ref["pixel_values"]), key
            else:
                assert own == 0, key
            alone = hf.run(model, dict(ref))
            worst = max(worst, float((logits[start : start + n] - alone[:n]).abs().max()))
            seen.append(key)
    assert sorted(seen) == sorted(BY_KEY) and not te.stats.skipped
    assert patches > 0 and widest >= 3
    print(
        f"{family} {settings} ({'real' if real else 'stand-in'}): {patches} patches, "
        f"max |packed - alone| logit difference {worst:.2e}"
    )
    assert worst <= 1e-5, f"per-source logits differ by {worst:.2e}"


def _headers() -> list[tuple[video.VideoHeader, object]]:
    """Clips from a frame to 40 minutes, at common, NTSC and odd frame rates: each header as
    ``probe`` reads it and the ``VideoMetadata`` transformers' PyAV loader makes (its duration
    the frames over the exact rational rate)."""
    from fractions import Fraction

    from transformers.video_utils import VideoMetadata

    rates = [Fraction(n, d) for n, d in ((1, 2), (7, 1), (10, 1), (24000, 1001), (25, 1))]
    rates += [Fraction(30000, 1001), Fraction(30), Fraction(60)]
    counts = (1, 2, 3, 5, 11, 23, 48, 61, 150, 301, 899, 1800, 9001, 12579, 36000, 144001)
    out = []
    for rate in rates:
        for n in counts:
            seconds = float(n / rate)
            header = video.VideoHeader(
                frames=n, fps=float(rate), width=64, height=48, duration=seconds
            )
            metadata = VideoMetadata(total_num_frames=n, fps=float(rate), duration=seconds)
            out.append((header, metadata))
    return out


def _installed_sample_frames(family: str, **defaults):
    """The installed release's own ``sample_frames`` of GLM's video processor, compiled from
    its module's source (which imports torchvision before 5.13, so the class may not import
    here), called with a stand-in ``self`` holding the class defaults it reads (``defaults``
    over fps 2, max_duration 300, temporal_patch_size 2)."""
    import ast
    import importlib.util
    import math
    from types import SimpleNamespace

    module = "glm46v" if family == "glm46v" else "glm4v"
    spec = importlib.util.find_spec(f"transformers.models.{module}.video_processing_{module}")
    tree = ast.parse(Path(spec.origin).read_text())
    found = next(
        node
        for cls in tree.body
        if isinstance(cls, ast.ClassDef) and cls.name.endswith("VideoProcessor")
        for node in cls.body
        if isinstance(node, ast.FunctionDef) and node.name == "sample_frames"
    )
    for arg in [*found.args.args, *found.args.kwonlyargs]:
        arg.annotation = None  # names the module's imports (VideoMetadata, ...)
    found.returns = None
    space = {"math": math, "np": np}
    exec(compile(ast.Module(body=[found], type_ignores=[]), spec.origin, "exec"), space)
    own = SimpleNamespace(**{"fps": 2, "max_duration": 300, "temporal_patch_size": 2, **defaults})
    return lambda metadata, **kwargs: space["sample_frames"](own, metadata, **kwargs)


@pytest.mark.parametrize(
    "family,settings",
    [
        ("glm4v", {}),
        ("glm4v", {"fps": 1.0}),
        ("glm4v", {"fps": 3.0, "max_duration": 20}),
        ("glm46v", {}),
    ],
)
def test_glm_sampling_is_the_installed_releases_own(family, settings):
    """The package's frame rule equals the installed release's own ``sample_frames`` (its
    source, compiled here: no torchvision needed) on 128 clip headers (a frame to 40 minutes;
    0.5 to 60 fps, NTSC rates as PyAV gives them), per setting; where it samples nothing (a
    clip under one step: GLM-4.6V under a sixth of a second, GLM-4.1V before transformers
    5.13 under one step of its fps) the clip is ``video_too_short``."""
    from energon_packing.encoding import hf_compat

    own = {"max_duration": settings["max_duration"]} if "max_duration" in settings else {}
    sample = _installed_sample_frames(family, **own)
    rule = video_rules.VideoRule.of(
        STYLES[family],
        None,
        overrides=settings,
        one_frame_at_least=hf_compat.glm_samples_one_frame_at_least(),
    )
    empty = 0
    for header, metadata in _headers():
        expected = sample(metadata, fps=settings.get("fps"))
        if not len(expected):  # nothing sampled: the processor fails on it further on
            with pytest.raises(video.VideoError, match="sampling takes none") as info:
                rule.indices(header)
            assert info.value.reason == "video_too_short"
            empty += 1
            continue
        assert rule.indices(header).tolist() == np.asarray(expected).tolist(), header
    if family == "glm46v" or not hf_compat.glm_samples_one_frame_at_least():
        assert empty > 0  # the short clips are among the headers


def test_glm_frame_rules_by_hand():
    """GLM-4.1V: ``floor(seconds x fps)`` frames (at least one), the i-th at
    ``ceil(i x rate / fps)``; past ``max_duration``, that many seconds' worth by ``linspace``;
    an odd count repeats its last. A patch's stamp is its first frame's whole second (GLM-4.6V:
    ``{s:.1f} seconds``) after its image."""

    def rule(style=video_styles.GLM4V, **settings):
        return video_rules.VideoRule.of(style, None, overrides=settings)

    header = video.VideoHeader
    assert rule().plan(header(frames=23, fps=25.0, width=8, height=8)).indices == (0, 0)
    three = rule(fps=3.0).plan(header(frames=20, fps=10.0, width=8, height=8))
    assert three.indices == (0, 4, 7, 10, 14, 17)
    long = header(frames=50, fps=10.0, width=56, height=28)
    assert rule(max_duration=2).plan(long).indices == (0, 17, 34, 49)  # linspace(0, 5 s, 4)
    assert rule(max_duration=2).plan(header(frames=3, fps=0.5, width=8, height=8)).indices == (
        0,
        1,
        2,
        2,
    )
    plan = rule().plan(long)
    assert plan.indices == tuple(range(0, 50, 5)) and plan.grid == (5, 2, 4)
    expansion = plan.expansion(video_token="I", vision_start="<", vision_end=">")
    assert expansion == "<II>0<II>1<II>2<II>3<II>4"
    tenths = rule(video_styles.GLM46V).plan(long)
    assert tenths.expansion(video_token="I", vision_start="<", vision_end=">").startswith(
        "<II>0.0 seconds<II>0.4 seconds<II>0.7 seconds"
    )
    assert rule(do_sample_frames=False).plan(long).indices == tuple(range(50))


def test_glm_video_settings_are_refused_where_they_mean_nothing():
    """What GLM's video processors do not read (Qwen's frame caps, a frame count; GLM-4.6V's
    fps) is refused naming it; ``max_duration`` is GLM-4.1V's alone; an fps of None cannot
    sample."""
    with pytest.raises(ValueError, match=r"\['max_frames', 'num_frames'\]: glm4v's video pro"):
        video_rules.VideoRule.of(
            video_styles.GLM4V, None, overrides={"num_frames": 8, "max_frames": 4}
        )
    with pytest.raises(ValueError, match=r"\['fps'\]: glm46v's video processor reads none"):
        video_rules.VideoRule.of(video_styles.GLM46V, None, overrides={"fps": 1.0})
    with pytest.raises(ValueError, match="max_duration'] is GLM-4.1V's sampling; glm46v"):
        video_rules.VideoRule.of(video_styles.GLM46V, None, overrides={"max_duration": 9})
    with pytest.raises(ValueError, match="max_duration'] is GLM-4.1V's sampling; qwen2_vl"):
        video_rules.VideoRule.of(video_styles.QWEN2_VL, None, overrides={"max_duration": 9})
    with pytest.raises(ValueError, match="fps=None: its video processor samples fps frames"):
        video_rules.VideoRule.of(video_styles.GLM4V, None, overrides={"fps": None})
    # a checkpoint's num_frames (which GLM's sampling ignores) loads beside its fps
    assert video_rules.VideoRule.of(video_styles.GLM4V, {"num_frames": 16}).fps == 2.0
    assert "max_duration=300" in repr(video_rules.VideoRule.of(video_styles.GLM4V, None))
    assert "max_duration" not in repr(video_rules.VideoRule.of(video_styles.QWEN2_VL, None))


def test_max_duration_is_a_video_config_setting_of_glm_4_1v_alone():
    """``video_config['max_duration']`` reaches GLM-4.1V's frame rule through the task
    encoder's own validation; a bad value, and the setting for GLM-4.6V, are refused naming
    it."""
    processor = build("glm4v", model=False)[0]
    te = PackingTaskEncoder(
        max_input_seq_length=256, processor=processor, video_config={"max_duration": 5}
    )
    assert te.chat.videos.rule.max_duration == 5
    with pytest.raises(ValueError, match=r"max_duration'\] must be a number of seconds > 0"):
        PackingTaskEncoder(
            max_input_seq_length=256, processor=processor, video_config={"max_duration": 0}
        )
    with pytest.raises(ValueError, match="max_duration'] is GLM-4.1V's sampling; glm46v"):
        PackingTaskEncoder(
            max_input_seq_length=256,
            processor=build("glm46v", model=False)[0],
            video_config={"max_duration": 5},
        )


def test_a_conversation_with_images_and_videos_is_skipped_naming_why():
    """GLM's forward fills images and videos through one ``<|image|>`` mask and refuses a call
    with both: such a conversation is skipped ``unsupported_video``, naming the mask and the
    fix; at pack time too, where its plans come without the encoder."""
    from energon_packing.loader.task_encoder import SkipSample

    processor = build("glm4v", model=False)[0]
    te = PackingTaskEncoder(max_input_seq_length=4096, processor=processor)
    te.stats.all_skips = []
    document = {
        "messages": [
            {"role": "user", "content": _parts(("image", "p.png"), ("video", "v.mp4"), "Both?")},
            {"role": "assistant", "content": _parts("Yes.")},
        ]
    }
    parts = {"p.png": _png(32, 32, 1), "v.mp4": (DATA / "h264_48x36_10fps_2s.mp4").read_bytes()}
    with pytest.raises(SkipSample):
        te.encode_sample(conversation_sample("both", document, parts))
    assert te.stats.skipped == {"unsupported_video": 1}
    (skip,) = te.stats.all_skips
    assert "(get_placeholder_mask)" in skip["detail"] and "split it into one" in skip["detail"]
    from energon_packing.config import PackingConfig

    with pytest.raises(Exception, match="holds images and videos"):
        te.chat.source(
            config=PackingConfig(max_input_seq_length=4096),
            key="both",
            input_ids=[1, 2],
            token_mask=[0.0, 1.0],
            images=[parts["p.png"]],
            videos=[parts["v.mp4"]],
        )


@pytest.mark.processor_media
def test_a_packs_video_patches_are_priced_as_at_selection():
    """Balanced emission prices a GLM video's temporal patches as the images the pack gives
    them as: the video's grid at selection, its ``(1, h, w)`` patches at emission, the same
    FLOPs, and by hand for the tiny GLM vision tower."""
    from energon_packing.encoding.costs import step_cost_model

    processor, model, _ = build("glm4v")
    te = PackingTaskEncoder(processor=processor, max_input_seq_length=2048)
    te.cost_model = step_cost_model(model.config)
    encoded = [
        te.encode_sample(conversation_sample(key, document, parts))
        for key, (document, parts) in BY_KEY.items()
        if key in ("video_alone", "two_videos", "text_only")
    ]
    pack = te.pack_selected_samples(encoded).pack
    grids = pack.media["image_grid_thw"].tolist()
    assert grids == [[1, 4, 6]] * 2 + [[1, 6, 8], [1, 4, 8]]  # 2 + 1 + 1 patches
    lengths = [s.length for s in encoded]
    selected = te.pack_cost(encoded) - te.cost_model.pack_flops(lengths, capacity=2048)
    assert te.emitted_cost(pack).vision == selected
    tower = te.cost_model.vision
    assert selected == 3 * sum(tower.grid_flops(tuple(g)) for g in grids)


@pytest.mark.parametrize("family", ["glm4v", "glm46v"])
@pytest.mark.processor_media
def test_to_hf_of_a_glm_pack_of_videos_and_images_gives_each_conversations_own_logits(
    tmp_path, family
):
    """``to_hf``'s inputs (padding-free: 3-row positions, no mask) of one pack of every
    conversation, videos and an image together: no video field (the patches are images), and
    each source's logits are the model's on it alone through its processor (<= 1e-5)."""
    from energon_packing.hf import to_hf
    from energon_packing.schema import collate

    processor, model, _ = build(family)
    te = PackingTaskEncoder(max_input_seq_length=4096, processor=processor)
    encoded = [te.encode_sample(conversation_sample(k, d, p)) for k, d, p in CONVERSATIONS]
    pack = te.pack_selected_samples(encoded).pack
    batch = collate([pack])
    inputs = dict(to_hf(batch, model=model))
    assert "pixel_values_videos" not in inputs and "video_grid_thw" not in inputs
    inputs.pop("labels"), inputs.pop("use_cache")  # hf.run passes use_cache=False
    logits = hf.run(model, inputs)
    reference = _reference_processor(family, False, None)
    cu, padded = batch["cu_seqlens"][0], batch["cu_seqlens_padded"][0]
    worst = 0.0
    for k, key in enumerate(pack.source_ids):
        alone = hf.run(model, _reference(reference, key, tmp_path))
        start, n = int(padded[k]), int(cu[k + 1] - cu[k])
        worst = max(worst, float((logits[start : start + n] - alone).abs().max()))
    assert sorted(pack.source_ids) == sorted(BY_KEY) and worst <= 1e-5, worst


def test_either_glm_processor_serves_any_glm_model():
    """GLM-4.6V-Flash's config names model type glm4v beside its Glm46VProcessor: either
    processor class packs GLM-4.1V, GLM-4.5V and GLM-4.6V (the image layout is one; the class
    decides the video rules)."""
    import dataclasses

    for family, model_type in (("glm46v", "glm4v"), ("glm4v", "glm46v"), ("glm46v", "glm4v_moe")):
        processor = build(family, model=False)[0]
        processor.model_info = dataclasses.replace(processor.model_info, model_type=model_type)
        te = PackingTaskEncoder(max_input_seq_length=256, processor=processor)
        assert te.chat.video_style is STYLES[family], (family, model_type)
