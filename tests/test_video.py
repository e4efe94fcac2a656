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

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from energon_packing.media.video import VideoError, VideoRule, decode, probe, process

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


def reference(clip: str, variant: str) -> dict:
    entry = REFERENCE["clips"][clip][variant]
    # Matroska / WebM: transformers' pyav loader reads no frame count from the header and
    # fails on the file; the reference then holds the call on the decoded array
    return entry["file_call"] if "error" not in entry["file_call"] else entry["array_call"]


def rule(variant: str) -> VideoRule:
    family = REFERENCE["families"][variant]
    config = {**family["config"], **family["call_kwargs"]}
    return VideoRule.of(VARIANTS[variant], config)


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
