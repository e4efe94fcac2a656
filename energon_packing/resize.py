"""Qwen2-VL's ``smart_resize``: the one copy of its arithmetic, for images
(:mod:`energon_packing.encoding.vision`) and video frames (:mod:`energon_packing.media.video`).
Pure: no imports of the package."""

from __future__ import annotations

import math

__all__ = ["MAX_ASPECT_RATIO", "smart_resize"]

#: The largest long side / short side ratio Qwen2-VL's ``smart_resize`` takes.
MAX_ASPECT_RATIO = 200


def smart_resize(
    height: int, width: int, *, factor: int, min_pixels: int, max_pixels: int
) -> tuple[int, int]:
    """``(height, width)`` both multiples of ``factor``, ``min_pixels <= h * w <= max_pixels``,
    the aspect ratio kept as closely as possible (transformers' ``smart_resize`` of Qwen2-VL).

    Raises:
        ValueError: an aspect ratio above :data:`MAX_ASPECT_RATIO` (the caller names the skip).
    """
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise ValueError(f"aspect ratio {max(height, width) / min(height, width):,.1f}")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar
