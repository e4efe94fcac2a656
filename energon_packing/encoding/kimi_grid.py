"""Kimi-K2.5's image rule: the patch grid its image processor gives an image size. No torch.

Its image processor (transformers 5.13+, a torchvision backend) scales an image down, never
up, until it has at most ``max_patches`` patches and at most ``size["max_height"]`` patches a
side, then pads it to a multiple of ``patch_size * merge_size`` (its ``navit_resize``). The
processor writes ``<|media_pad|>`` ``grid_h * grid_w / merge_size**2`` times for the image;
its pixels are the grid's patches, one row each (``(patches, 3, patch, patch)``)::

    100 x 61 px, patch 14, merge 2  ->  padded 112 x 84  ->  grid 8 x 6  ->  12 tokens

The arithmetic is the image processor's own, in Python floats (the test on the ``torchvision``
stack compares the two over fuzzed sizes).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from energon_packing.encoding.image_rules import image_settings

__all__ = ["kimi_grid", "kimi_inputs"]


def kimi_grid(
    height: int, width: int, *, patch: int, merge: int, max_patches: int, max_side: int
) -> tuple[int, int]:
    """``(grid_h, grid_w)`` in patches of an image of ``height x width`` px, as Kimi-K2.5's
    image processor resizes and pads it (``max_side``: its ``size["max_height"]``, in
    patches)."""
    count = max(1.0, height // patch) * max(1.0, width // patch)
    scale = min(
        1.0,
        math.sqrt(max_patches / count),
        max_side * patch / height,
        max_side * patch / width,
    )
    new_h = min(max(1, int(height * scale)), max_side * patch)
    new_w = min(max(1, int(width * scale)), max_side * patch)
    step = merge * patch
    return -(-new_h // step) * step // patch, -(-new_w // step) * step // patch


def kimi_inputs(processor: Any, sizes: list[list[tuple[int, int]]]) -> dict:
    """``image_grid_thw`` rows ``(1, h, w)`` per image, from its size and the settings the
    processor's own ``__call__`` passes its image processor (``size``, ``patch_size``,
    ``merge_size``, ``max_patches``: what ``replace_image_token`` reads)."""
    setting, side = image_settings(processor, side="max_height")
    rule = functools.partial(
        kimi_grid,
        patch=int(setting("patch_size")),
        merge=int(setting("merge_size")),
        max_patches=int(setting("max_patches")),
        max_side=side,
    )
    grid = [(1, *rule(h, w)) for per_text in sizes for h, w in per_text]
    return {"image_grid_thw": np.asarray(grid, dtype=np.int64).reshape(-1, 3)}
