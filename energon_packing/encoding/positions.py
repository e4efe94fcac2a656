"""Position ids of one conversation: 1-D, or Qwen2-VL's 3-row mRoPE (t, h, w).

Computed per source, as the model computes them for that source alone; the pack layout
(:func:`energon_packing.schema.layout`) places them and continues them through the padding.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["MRope", "mrope_positions"]


@dataclass(kw_only=True, slots=True, frozen=True)
class MRope:
    """Token ids and merge size that Qwen2-VL's 3-row (t, h, w) positions need."""

    vision_start_id: int
    image_pad_id: int
    merge_size: int = 2


def mrope_positions(
    input_ids: Sequence[int], grids: Sequence[tuple[int, int, int]], spec: MRope
) -> np.ndarray:
    """``[3, len(input_ids)]`` positions of one source, as Qwen2-VL's ``get_rope_index``
    computes them for that source alone: text advances all three rows together; an image's
    pad tokens get (t, row, column) of its merged grid, offset by the text before it; text
    after an image restarts at the largest position so far + 1."""
    ids = np.asarray(input_ids)
    positions = np.empty((3, len(ids)), dtype=np.int64)
    starts = np.flatnonzero(ids == spec.vision_start_id)
    if len(starts) != len(grids):
        raise ValueError(f"{len(starts)} vision-start tokens for {len(grids)} image grids")
    cursor, next_pos = 0, 0
    for vision_start, (t, h, w) in zip(starts, grids):
        text = vision_start + 1 - cursor  # text before the image, the vision-start token included
        positions[:, cursor : cursor + text] = next_pos + np.arange(text)
        gh, gw = h // spec.merge_size, w // spec.merge_size
        n = t * gh * gw
        first = cursor + text
        if not (ids[first : first + n] == spec.image_pad_id).all():
            raise ValueError(f"image at token {first} does not have {n} image-pad tokens")
        base = next_pos + text
        positions[0, first : first + n] = base + np.repeat(np.arange(t), gh * gw)
        positions[1, first : first + n] = base + np.tile(np.repeat(np.arange(gh), gw), t)
        positions[2, first : first + n] = base + np.tile(np.arange(gw), t * gh)
        next_pos = int(positions[:, first : first + n].max()) + 1
        cursor = first + n
    positions[:, cursor:] = next_pos + np.arange(len(ids) - cursor)
    return positions
