"""Images the Qwen2-VL way: smart resize, 14-px patches, temporal patch 2, 2x2 token merge.

Two halves, on purpose:

* :func:`grid_for` costs an image from its size alone
  (:func:`~energon_packing.media.images.probe` reads it from the header), so a conversation
  waiting in the packing buffer holds its compressed bytes;
* :func:`patchify` decodes, and runs only for the pack being emitted.

``patchify`` is bit-equal to ``transformers``' ``Qwen2VLImageProcessorPil`` (a test checks it):
RGB with alpha composited on white, PIL bicubic resize, ``float64 * 1/255 -> float32``,
``(x - mean) / std`` in float32, then the merge-ordered patch layout.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

from energon_packing.config import DEFAULT_MAX_PIXELS, DEFAULT_MIN_PIXELS, VisionConfig
from energon_packing.encoding import hf_compat
from energon_packing.encoding.chat import Skip
from energon_packing.media.images import decode
from energon_packing.resize import MAX_ASPECT_RATIO
from energon_packing.resize import smart_resize as resize

OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)

__all__ = [
    "DEFAULT_MAX_PIXELS",
    "DEFAULT_MIN_PIXELS",
    "MAX_ASPECT_RATIO",
    "VisionConfig",
    "grid_for",
    "patchify",
    "smart_resize",
    "tokens_for",
]


def smart_resize(height: int, width: int, config: VisionConfig) -> tuple[int, int]:
    """Qwen2-VL's target size (:func:`energon_packing.resize.smart_resize`) under the built-in
    layout's bounds.

    Raises:
        Skip: ``image_aspect_ratio``, an aspect ratio above 200 (Qwen2-VL's own limit).
    """
    try:
        return resize(
            height,
            width,
            factor=config.factor,
            min_pixels=config.min_pixels,
            max_pixels=config.max_pixels,
        )
    except ValueError:
        raise Skip(
            "image_aspect_ratio",
            f"image of {width}x{height} px (upright) has an aspect ratio of "
            f"{max(height, width) / min(height, width):,.1f}, above {MAX_ASPECT_RATIO}, which "
            f"Qwen2-VL refuses; crop or pad such images (e.g. text lines) before packing",
        ) from None


def grid_for(width: int, height: int, config: VisionConfig) -> tuple[int, int, int]:
    """``(t, h, w)`` in patches for an image of this size: ``image_grid_thw``'s row.

    Raises:
        Skip: the image breaks a size rule (``image_aspect_ratio``): costing is data checking.
    """
    resized_h, resized_w = smart_resize(height, width, config)
    return 1, resized_h // config.patch_size, resized_w // config.patch_size


def tokens_for(grid: tuple[int, int, int], config: VisionConfig) -> int:
    """Image-pad tokens an image takes in the text: ``t * h * w / merge_size**2``."""
    t, h, w = grid
    return t * h * w // (config.merge_size**2)


def patchify(
    data: bytes,
    config: VisionConfig,
    *,
    max_pixels: int | None = None,
    high_bit_depth: str = "scale",
) -> tuple[np.ndarray, tuple[int, int, int]]:
    """Decodes one image into ``pixel_values [h*w, patch_dim]`` (float32) and its grid.

    Row order follows the 2x2 merge: the four patches of one LLM token are consecutive.
    ``max_pixels`` is the decode budget (:func:`~energon_packing.media.images.decode`), not
    Qwen2-VL's resize target.
    """
    image = decode(
        data,
        max_pixels=max_pixels,
        high_bit_depth=high_bit_depth,
        alpha_on_white=hf_compat.alpha_on_white(),
    )
    width, height = image.size
    resized_h, resized_w = smart_resize(height, width, config)
    image = image.resize((resized_w, resized_h), resample=Image.Resampling.BICUBIC)
    pixels = np.asarray(image).astype(np.float64) * (1 / 255)
    pixels = pixels.astype(np.float32)
    mean = np.array(OPENAI_CLIP_MEAN, dtype=np.float32)
    std = np.array(OPENAI_CLIP_STD, dtype=np.float32)
    pixels = ((pixels - mean) / std).transpose(2, 0, 1)  # (C, H, W)

    patch, merge, temporal = config.patch_size, config.merge_size, config.temporal_patch_size
    grid_h, grid_w = resized_h // patch, resized_w // patch
    patches = pixels.reshape(3, grid_h // merge, merge, patch, grid_w // merge, merge, patch)
    patches = patches.transpose(1, 4, 2, 5, 0, 3, 6)  # (gh, gw, mh, mw, C, ph, pw)
    patches = np.broadcast_to(
        patches[:, :, :, :, :, None], (*patches.shape[:5], temporal, patch, patch)
    )
    flat = np.ascontiguousarray(patches.reshape(grid_h * grid_w, config.patch_dim))
    return flat, (1, grid_h, grid_w)
