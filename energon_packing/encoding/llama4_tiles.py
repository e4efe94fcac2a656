"""Llama 4's image rule: the tile grid its image processor picks for an image size, and the
expansion its processor writes for it. No torch.

The image processor (transformers 5.5-5.25, a torchvision backend) fits each image onto the
canvas of at most ``max_patches`` square tiles that needs the least scaling (the smallest
upscale, else the least downscale; ties: the least area), and, for more than one tile, adds
a global view; the processor writes per image::

    <|image_start|>  (rows x cols > 1:)  [<|patch|> x n  <|tile_x_separator|>] ... <|patch|> x n
                     <|tile_y_separator|>   (one line per tile row)
                     <|image|> <|patch|> x n <|image_end|>        n = (side / patch)^2 / ratio

The scales are compared in float32, as the image processor compares them (its tensors).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from energon_packing.encoding.image_rules import _Shape, image_settings

__all__ = ["llama4_expansion", "llama4_inputs", "llama4_kwargs", "llama4_tiles"]


@functools.lru_cache(maxsize=8)
def _canvases(max_patches: int, side: int) -> tuple[tuple[int, int], ...]:
    """``find_supported_resolutions``: every ``rows x cols`` of at most ``max_patches`` tiles,
    grouped by aspect ratio in the order the image processor first meets each ratio (counts
    from ``max_patches`` down, factors ascending), in pixels."""
    by_ratio: dict[float, list[tuple[int, int]]] = {}
    for count in range(max_patches, 0, -1):
        factors = sorted(
            {f for i in range(1, int(count**0.5) + 1) if count % i == 0 for f in (i, count // i)}
        )
        for rows in factors:
            by_ratio.setdefault(rows / (count // rows), []).append((rows, count // rows))
    return tuple((r * side, c * side) for grid in by_ratio.values() for r, c in grid)


def llama4_tiles(
    height: int, width: int, *, side: int, max_patches: int, resize_to_max_canvas: bool = False
) -> tuple[int, int]:
    """``(rows, cols)`` of ``side``-pixel tiles Llama 4's image processor cuts an image of
    ``height x width`` into (its ``get_best_fit``; one global tile more where there are two or
    more)."""
    canvases = np.asarray(_canvases(max_patches, side), dtype=np.int64)
    f32 = np.float32
    scale_w = canvases[:, 1].astype(f32) / f32(width)
    scale_h = canvases[:, 0].astype(f32) / f32(height)
    scales = np.where(scale_h > scale_w, scale_w, scale_h)
    up = scales[scales >= 1]
    if len(up):
        chosen = up.max() if resize_to_max_canvas else up.min()
    else:
        chosen = scales[scales < 1].max()
    fits = canvases[scales == chosen]
    best = fits[int(np.argmin(fits[:, 0] * fits[:, 1]))] if len(fits) > 1 else fits[0]
    return int(best[0]) // side, int(best[1]) // side


def llama4_inputs(processor: Any, sizes: list[list[tuple[int, int]]]) -> dict:
    """What Llama 4's ``replace_image_token`` reads: each image's ``aspect_ratios`` (tile rows
    and columns) and the tile's shape (a zero-copy stand-in), from the image processor's
    ``size``, ``max_patches`` and ``resize_to_max_canvas``."""
    setting, side = image_settings(processor)
    tiles = functools.partial(
        llama4_tiles,
        side=side,
        max_patches=int(setting("max_patches")),
        resize_to_max_canvas=bool(setting("resize_to_max_canvas")),
    )
    return {
        "aspect_ratios": [list(tiles(h, w)) for per_text in sizes for h, w in per_text],
        "pixel_values": [_Shape((3, side, side))],
    }


def llama4_kwargs(processor: Any) -> dict:
    """The image processor's pixels are bfloat16 (it rescales and normalizes in bfloat16, as
    the original code does), which numpy has no type for: taken as torch tensors (the pack
    widens them to float32, exactly)."""
    return {"return_tensors": "pt"}


def llama4_expansion(processor: Any, inputs: dict, index: int) -> str:
    """Llama 4's expansion of one image (its ``__call__`` writes it so before its public
    ``replace_image_token``): the tile grid of ``aspect_ratios``, ``n`` patches a tile."""
    height, width = inputs["pixel_values"][0].shape[-2:]
    patch = processor.patch_size
    n = int((height // patch) * (width // patch) // processor.downsample_ratio)
    rows, cols = (int(x) for x in inputs["aspect_ratios"][index])
    tile = "<|patch|>" * n
    grid = ""
    if rows * cols > 1:
        line = "<|tile_x_separator|>".join([tile] * cols) + "<|tile_y_separator|>"
        grid = line * rows
    return f"<|image_start|>{grid}<|image|>{tile}<|image_end|>"
