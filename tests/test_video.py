"""Videos through the Qwen families' own rules, without torchvision (issue 23, part 1).

``tests/data/video/reference.json`` holds what the real transformers 5.24 video processors
(torch 2.14.1 + torchvision 0.29.1, a separate venv; ``make_reference.py`` beside it says how)
returned for 8 generated clips (h264 mp4/mov/mkv, vp9 webm; odd frame counts; portrait): the
sampled frame indices, the decoded frames, ``video_grid_thw``, ``second_per_grid_ts`` and
``pixel_values_videos``. Here the same clips go through ``energon_packing.media.video`` on the
CPU torch 2.13 wheel: everything must be bit-equal, and the grid must be known from the
container header before a frame is decoded.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from energon_packing.encoding import hf_compat
from energon_packing.encoding.families import FAMILIES
from energon_packing.media import video_styles
from energon_packing.media.video import VideoError, decode, probe, process
from energon_packing.media.video_rules import VideoRule

DATA = Path(__file__).parent / "data" / "video"
REFERENCE = json.loads((DATA / "reference.json").read_text())
#: reference variant -> the family whose rule it is
VARIANTS = {
    "qwen2_vl": "qwen2_vl",
    "qwen2_5_vl": "qwen2_5_vl",
    "qwen3_vl": "qwen3_vl",
    "qwen2_5_vl_all_frames": "qwen2_5_vl",
    "qwen3_vl_cap": "qwen3_vl",
}
#: the registry's video style of each family that takes videos
STYLES = {f.name: f.videos for f in FAMILIES if f.videos is not None}


def reference(clip: str, variant: str) -> dict:
    entry = REFERENCE["clips"][clip][variant]
    # Matroska / WebM: transformers' pyav loader reads no frame count from the header and
    # fails on the file; the reference then holds the call on the decoded array
    return entry["file_call"] if "error" not in entry["file_call"] else entry["array_call"]


def rule(variant: str) -> VideoRule:
    family = REFERENCE["families"][variant]
    config = {**family["config"], **family["call_kwargs"]}
    return VideoRule.of(STYLES[VARIANTS[variant]], config)


def sha(array) -> str:
    return hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()


CASES = [(clip, variant) for clip in REFERENCE["clips"] for variant in VARIANTS]


@pytest.mark.parametrize("clip, variant", CASES)
def test_the_header_predicts_what_the_processor_samples_and_its_grid(clip, variant):
    expected = reference(clip, variant)
    header = probe((DATA / clip).read_bytes())
    assert header.frames == expected["metadata"]["total_num_frames"]
    assert header.fps == expected["metadata"]["fps"]
    assert (header.width, header.height) == (
        expected["metadata"]["width"],
        expected["metadata"]["height"],
    )
    assert header.counted == clip.endswith((".mkv", ".webm"))
    video = rule(variant)
    indices = expected["frames_indices"]
    assert video.indices(header).tolist() == (
        indices if indices is not None else list(range(header.frames))
    )
    assert list(video.grid(header)) == expected["video_grid_thw"]
    if "second_per_grid_ts" in expected:
        assert [video.second_per_grid(header)] == expected["second_per_grid_ts"]


@pytest.mark.parametrize("clip, variant", CASES)
def test_decoded_and_processed_pixels_are_the_processors_bit_for_bit(clip, variant):
    expected = reference(clip, variant)
    data = (DATA / clip).read_bytes()
    video = rule(variant)
    frames = decode(data, video.indices(probe(data)))
    assert sha(frames) == expected["decoded_frames"]["sha256"]
    pixels, grid = process(frames, video)
    assert list(grid) == expected["video_grid_thw"]
    assert list(pixels.shape) == expected["pixel_values_videos"]["shape"]
    assert pixels.dtype == getattr(torch, expected["pixel_values_videos"]["dtype"])
    assert sha(pixels.numpy()) == expected["pixel_values_videos"]["sha256"]


def test_what_is_no_video_is_a_counted_reason():
    with pytest.raises(VideoError) as info:
        probe(b"\x00" * 64)
    assert info.value.reason == "video_unreadable"
    data = (DATA / "h264_48x36_10fps_2s.mp4").read_bytes()
    with pytest.raises(VideoError) as info:
        decode(data[: len(data) // 3], list(range(20)))  # cut: the header is there, frames not
    assert info.value.reason == "video_corrupt"
    assert "decoded" in info.value.detail or "decoding failed" in info.value.detail


# ---- positions: the installed models' own get_rope_index ---------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from energon_packing.encoding.positions import IMAGE, TEXT, VIDEO, vision_positions  # noqa: E402


@st.composite
def runs(draw):
    """A source as runs: text, images (t=1) and videos (t up to 5), grids of even sides."""
    out = []
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from([TEXT, IMAGE, VIDEO]))
        if kind == TEXT:
            out.append((TEXT, draw(st.integers(1, 5)), None, None))
            continue
        t = 1 if kind == IMAGE else draw(st.integers(1, 5))
        h, w = (2 * draw(st.integers(1, 6)) for _ in range(2))
        seconds = draw(st.floats(0.0625, 3.0, width=32)) if kind == VIDEO else None
        out.append((kind, t * h * w // 4, (t, h, w), seconds))
        out.append((TEXT, 1, None, None))  # the vision-end token: runs of one kind stay apart
    return out


def models_positions(family: str, types, images, videos, seconds, tokens_per_second):
    """The model class's own ``get_rope_index`` on one row (its config faked: merge size 2)."""
    import functools
    from types import SimpleNamespace

    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLModel
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLModel
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLModel

    model = {"qwen2_vl": Qwen2VLModel, "qwen2_5_vl": Qwen2_5_VLModel, "qwen3_vl": Qwen3VLModel}
    cls = model[family]
    vision = SimpleNamespace(spatial_merge_size=2, tokens_per_second=tokens_per_second)
    fake = SimpleNamespace(config=SimpleNamespace(vision_config=vision))
    fake.get_vision_position_ids = functools.partial(cls.get_vision_position_ids, fake)
    kwargs = dict(
        input_ids=torch.zeros(1, len(types), dtype=torch.long),
        mm_token_type_ids=torch.tensor([types]),
        image_grid_thw=torch.tensor(images) if images else None,
        video_grid_thw=torch.tensor(videos) if videos else None,
    )
    if family == "qwen2_5_vl":
        kwargs["second_per_grid_ts"] = torch.tensor(seconds, dtype=torch.float32)
    positions, _ = cls.get_rope_index(fake, **kwargs)
    return positions[:, 0].numpy()


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
@settings(max_examples=60, deadline=None)
@given(source=runs(), tokens_per_second=st.sampled_from([2, 4, 25]))
def test_video_positions_are_the_installed_models_get_rope_index(family, source, tokens_per_second):
    images = [g for kind, _, g, _ in source if kind == IMAGE]
    videos = [g for kind, _, g, _ in source if kind == VIDEO]
    seconds = [s for kind, _, _, s in source if kind == VIDEO]
    if family == "qwen3_vl":  # a timestamp's text before each temporal patch of a video
        split = []
        for kind, n, grid, s in source:
            if kind != VIDEO:
                split.append((kind, n, grid, s))
                continue
            for _ in range(grid[0]):
                split += [(TEXT, 1, None, None), (VIDEO, n // grid[0], (1, *grid[1:]), s)]
        source = split
    types = [kind for kind, n, _, _ in source for _ in range(n)]
    grids = [grid for _, _, grid, _ in source if grid is not None]
    # the installed release's rule: before transformers 5.18 the seconds are truncated first
    fractional = hf_compat.fractional_time_interval()
    intervals = [tokens_per_second * (s if fractional else int(s)) for s in seconds]
    intervals = intervals if family == "qwen2_5_vl" else []
    ours = vision_positions(
        types,
        grids,
        merge_size=2,
        time_intervals=intervals,
        video_frames_apart=hf_compat.video_frames_apart(),
    )
    expected = models_positions(family, types, images, videos, seconds, tokens_per_second)
    np.testing.assert_array_equal(ours, expected)


PROCESSED = json.loads((DATA / "processor_reference.json").read_text())


def _runs(types):
    bounds = [0, *(np.flatnonzero(np.diff(types)) + 1).tolist(), len(types)]
    return [(types[a], a, b) for a, b in zip(bounds, bounds[1:])]


@pytest.mark.parametrize(
    "family, conversation",
    [(f, c) for f, convs in PROCESSED["results"].items() for c in convs],
)
def test_positions_of_real_processor_outputs_are_the_models(family, conversation):
    """What the real processors made of video conversations (``processor_reference.json``:
    ids, token types, grids, made once with torchvision present), positioned by
    :func:`vision_positions`: equal to the model's own ``get_rope_index`` on them (Qwen2.5-VL
    at its default 4 and at 25 tokens per second, where text after a video resumes inside the
    video's temporal positions)."""
    result = PROCESSED["results"][family][conversation]
    types = result["mm_token_type_ids"]
    images = iter(result["image_grid_thw"] or [])
    videos = iter(result["video_grid_thw"] or [])
    grids, patches_left = [], 0
    for kind, _, _ in _runs(types):
        if kind == IMAGE:
            grids.append(tuple(next(images)))
        elif kind == VIDEO and family == "qwen3_vl":  # one run per temporal patch
            if not patches_left:
                t, h, w = next(videos)
                patches_left = t
            grids.append((1, h, w))
            patches_left -= 1
        elif kind == VIDEO:
            grids.append(tuple(next(videos)))
    per_second = PROCESSED["families"][family]["model_config"].get("tokens_per_second")
    cases = {"position_ids": per_second, "position_ids_tokens_per_second_25": 25}
    for name, tokens_per_second in cases.items():
        if name not in result:
            continue
        seconds = result.get("second_per_grid_ts") or []
        intervals = [np.float32(tokens_per_second) * np.float32(s) for s in seconds]
        ours = vision_positions(types, grids, merge_size=2, time_intervals=intervals)
        np.testing.assert_array_equal(ours, np.asarray(result[name]), err_msg=name)


def test_frames_an_edit_list_discards_are_not_counted():
    """A clip cut with ``-c copy`` keeps its pre-roll packets, marked discarded: its header
    says 40 frames, 35 decode (transformers' loader then processes 35: grid [18, 20, 28] from
    the real processor, run with torchvision). The count comes from the packets that decode,
    so the grid is known before decoding and decoding finds every frame."""
    data = (DATA / "h264_preroll_edit_list.mp4").read_bytes()
    header = probe(data)
    assert (header.frames, header.counted) == (35, True)
    video = VideoRule.of(video_styles.QWEN2_5_VL)  # every frame
    frames = decode(data, video.indices(header))
    assert len(frames) == 35 and process(frames, video)[1] == video.grid(header) == (18, 20, 28)


def test_a_frame_sampled_twice_decodes_once():
    """Qwen3 asked for more frames than the clip has repeats indices; the pyav loader keeps
    each decoded frame once, so the grid counts distinct frames."""
    data = (DATA / "h264_48x36_10fps_2s.mp4").read_bytes()
    video = VideoRule.of(video_styles.QWEN3_VL, {"fps": None, "num_frames": 30})
    header = probe(data)
    assert len(video.indices(header)) == 30 and len(set(video.indices(header))) == 20
    frames = decode(data, video.indices(header))
    assert len(frames) == 20 and process(frames, video)[1] == video.grid(header)


def test_settings_the_processor_refuses_are_refused():
    with pytest.raises(ValueError, match="fps=2.0 and num_frames=8 are mutually exclusive"):
        VideoRule.of(video_styles.QWEN3_VL, {"num_frames": 8})  # its class default fps=2 stays
    with pytest.raises(ValueError, match="needs fps or num_frames"):
        VideoRule.of(video_styles.QWEN2_VL, {"do_sample_frames": True})
    with pytest.raises(ValueError, match="resized bicubic only"):
        VideoRule.of(video_styles.QWEN2_VL, {"resample": 2})
    assert VideoRule.of(video_styles.QWEN3_VL, {"num_frames": 8, "fps": None}).num_frames == 8


@pytest.mark.parametrize(
    "family, conversation",
    [(f, c) for f, convs in PROCESSED["results"].items() for c in convs],
)
def test_a_videos_tokens_in_the_text_are_the_real_processors(family, conversation):
    """The rendered chat template with each video's one ``<|video_pad|>`` replaced by
    :meth:`VideoRule.expansion` (from the clip's header alone) is the text the real processor
    expanded (Qwen3: timestamps and per-patch vision markers included)."""
    result = PROCESSED["results"][family][conversation]
    kwargs = PROCESSED["families"][family]["processor_kwargs"]  # do_sample_frames, fps
    video = VideoRule.of(STYLES[family], {**REFERENCE["families"][family]["config"], **kwargs})
    clips = [
        part["video"]
        for message in PROCESSED["conversations"][conversation]
        if isinstance(message["content"], list)
        for part in message["content"]
        if part["type"] == "video"
    ]
    pieces = result["rendered_text"].split("<|video_pad|>")
    assert len(pieces) == len(clips) + 1
    text = pieces[0]
    for clip, after in zip(clips, pieces[1:]):
        header = probe((DATA / clip).read_bytes())
        text += video.expansion(
            header,
            video_token="<|video_pad|>",
            vision_start="<|vision_start|>",
            vision_end="<|vision_end|>",
        )
        text += after
    if images := result["n_image_tokens"]:
        text = text.replace("<|image_pad|>", "<|image_pad|>" * images)
    assert text == result["expanded_text"]


def test_a_text_that_names_files_is_not_opened_as_a_video(tmp_path, monkeypatch):
    """FFmpeg would read an ffconcat text as a container and open the clip it names (here one
    that exists in the working directory): only video demuxers read a part."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "clip.mov").write_bytes((DATA / "h264_120x80_30fps_1s.mov").read_bytes())
    with pytest.raises(VideoError) as info:
        probe(b"ffconcat version 1.0\nfile clip.mov\n")
    assert info.value.reason == "video_unreadable"


def test_a_frame_over_the_pixel_budget_is_refused_before_it_is_converted():
    """Whatever the header said: each frame is checked before it becomes an array."""
    data = (DATA / "h264_48x36_10fps_2s.mp4").read_bytes()
    assert decode(data, [0, 5], max_pixels=48 * 36).shape == (2, 36, 48, 3)
    with pytest.raises(VideoError, match="frame 0 is 48x36 = 1,728 pixels, more than") as info:
        decode(data, [0, 5], max_pixels=48 * 36 - 1)
    assert info.value.reason == "video_too_large"


def test_without_pyav_a_video_is_an_unsupported_video_skip(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "av", None)  # import av raises ImportError
    # a hint one can follow: the package itself, or the extra of the checkout / wheel (the
    # name 'energon-packing' is on no index)
    with pytest.raises(
        VideoError,
        match=r"pip install 'av>=14' \(the \[video\] extra: pip install '\.\[video\]' in the checkout",
    ) as info:
        probe((DATA / "h264_48x36_10fps_2s.mp4").read_bytes())
    assert info.value.reason == "unsupported_video"


@pytest.mark.parametrize("tokens_per_second", [2, 3, 25])
def test_qwen2_5_time_intervals_are_the_models_float32_product(tokens_per_second):
    """The model multiplies ``tokens_per_second`` by the float32 ``second_per_grid_ts``: a
    float64 product truncates otherwise (2/3 s at 25 tokens per second: 16 vs 16.666...)."""
    from energon_packing.media.video import VideoHeader
    from energon_packing.media.video_plan import VideoPlan

    header = VideoHeader(frames=1200, fps=30.0, width=64, height=64)
    plan = VideoPlan(
        style=video_styles.QWEN2_5_VL,
        header=header,
        indices=(0,),
        grid=(60, 4, 4),
        merge_size=2,
        second_per_grid=2 / 3,
    )
    (interval,) = plan.time_intervals(tokens_per_second)
    product = np.float32(tokens_per_second) * np.float32(2 / 3)
    assert interval == float(product)
    temporal = (np.arange(60, dtype=np.float32) * np.float32(interval)).astype(np.int64)
    # Qwen2_5_VLModel.get_rope_index: tokens_per_second * second_per_grid_ts[i] (float32),
    # then get_vision_position_ids: (arange(t) * time_interval).long()
    time_interval = tokens_per_second * torch.tensor([2 / 3], dtype=torch.float32)[0]
    torch_way = (torch.arange(60) * time_interval).long()
    assert temporal.tolist() == torch_way.tolist()
    # before transformers 5.18: tokens_per_second * int(second_per_grid_ts), 0 for 2/3 s
    assert plan.time_intervals(tokens_per_second, fractional=False) == [0.0]
    plan = dataclasses.replace(plan, second_per_grid=1.5)
    assert plan.time_intervals(tokens_per_second, fractional=False) == [float(tokens_per_second)]
