"""Qwen2-VL image handling: sizes from headers, patches bit-equal to transformers."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from energon_packing.encoding.chat import Skip
from energon_packing.encoding.vision import (
    VisionConfig,
    grid_for,
    patchify,
    smart_resize,
    tokens_for,
)
from energon_packing.media.images import probe


def image_bytes(width, height, mode="RGB", fmt="PNG", seed=0):
    rng = np.random.default_rng(seed)
    channels = {"RGB": 3, "RGBA": 4, "L": 1}[mode]
    pixels = rng.integers(0, 255, (height, width, channels), dtype=np.uint8)
    image = Image.fromarray(pixels[..., 0] if channels == 1 else pixels, mode=mode)
    buffer = io.BytesIO()
    image.save(buffer, format=fmt)
    return buffer.getvalue()


SMALL = VisionConfig(min_pixels=56 * 56, max_pixels=224 * 224)


def test_documented_example():
    # transformers-notes: 150x100, min 56*56, max 224*224 -> [80, 1176], grid [1, 8, 10], 20 tokens
    data = image_bytes(150, 100)
    pixels, grid = patchify(data, SMALL)
    assert pixels.shape == (80, 1176) and pixels.dtype == np.float32
    assert grid == (1, 8, 10) == grid_for(*probe(data), SMALL)
    assert tokens_for(grid, SMALL) == 20


@pytest.mark.parametrize(
    "height, width, expected",
    [
        (100, 150, (112, 140)),  # rounded to multiples of 28
        (20, 20, (56, 56)),  # upscaled to min_pixels
        (1000, 1000, (224, 224)),  # downscaled to max_pixels
        (1000, 800, (224, 196)),  # downscaled, aspect kept as closely as 28-px steps allow
        (700, 33, (700, 28)),  # thin: the short side is at least one 28-px step
    ],
)
def test_smart_resize(height, width, expected):
    assert smart_resize(height, width, SMALL) == expected


@pytest.mark.parametrize("width, height", [(10000, 20), (1600, 7), (1, 20000), (20000, 1)])
def test_aspect_ratio_over_200_is_a_skip_when_costed(width, height):
    """Costing from the header is data checking (a Skip, never an unexpected error); decoding
    the same image is an Skip: both carry the documented reason."""
    with pytest.raises(Skip, match="above 200, which Qwen2-VL refuses") as info:
        grid_for(width, height, SMALL)
    assert info.value.reason == "image_aspect_ratio"
    with pytest.raises(Skip) as info:
        smart_resize(height, width, SMALL)
    assert info.value.reason == "image_aspect_ratio"
    assert grid_for(4000, 20, SMALL)[0] == 1  # exactly 200 is allowed


def test_probe_reads_the_header_only():
    data = image_bytes(320, 240, fmt="JPEG")
    truncated = data[: len(data) // 3]  # header intact, most of the pixels missing
    assert probe(truncated) == (320, 240)
    with pytest.raises(Skip) as info:
        patchify(truncated, SMALL)
    assert info.value.reason == "corrupt_image"


@pytest.mark.parametrize(
    "data, reason", [(b"", "corrupt_image"), (b"not an image", "corrupt_image")]
)
def test_bad_bytes(data, reason):
    with pytest.raises(Skip) as info:
        probe(data)
    assert info.value.reason == reason


def test_huge_image_is_resized_within_max_pixels():
    data = image_bytes(3000, 2000, fmt="PNG")
    pixels, (_, h, w) = patchify(data, SMALL)
    assert h * w * 14 * 14 <= SMALL.max_pixels
    assert pixels.shape == (h * w, 1176)


@pytest.mark.parametrize(
    "width, height, mode, fmt",
    [
        (150, 100, "RGB", "JPEG"),
        (640, 480, "RGB", "PNG"),
        (33, 700, "RGBA", "PNG"),
        (50, 50, "L", "PNG"),
    ],
)
def test_bit_equal_to_transformers(width, height, mode, fmt):
    pil = pytest.importorskip("transformers.models.qwen2_vl.image_processing_pil_qwen2_vl")
    processor = pil.Qwen2VLImageProcessorPil(min_pixels=56 * 56, max_pixels=224 * 224)
    data = image_bytes(width, height, mode, fmt)
    reference = processor(images=[Image.open(io.BytesIO(data))], return_tensors="np")
    pixels, grid = patchify(data, SMALL)
    assert np.array_equal(pixels, reference["pixel_values"])
    assert [list(grid)] == reference["image_grid_thw"].tolist()
    assert pixels.shape[0] == processor.get_number_of_image_patches(height, width, {})


def test_vision_config_validates():
    with pytest.raises(ValueError, match="min_pixels .* must not exceed max_pixels"):
        VisionConfig(min_pixels=10_000, max_pixels=100)
