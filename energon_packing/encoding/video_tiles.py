"""InternVL's videos as image tiles: a frame is one tile of the image path (``Frame{i}:`` and
one ``<img>`` block of ``image_seq_length`` context tokens in the text), and the model reads
the images' tiles and the videos' frames from one ``pixel_values``, in the text's order, as
the processor's ``__call__`` joins them::

    text:          <img>ctx*2n</img> ... Frame1: <img>ctx*n</img>\nFrame2: <img>ctx*n</img>
    pixel_values:  [image tile, image tile,                frame 1,          frame 2]

The encoding knows the order (:func:`placed`: each video's ``images_before``); a pack's
conversation gets its tiles in that order back (:func:`tiles_in_order`). No torch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["placed", "tiles_in_order"]


def placed(plans: Sequence[Any], kinds: Sequence[str]) -> list:
    """``plans`` (a conversation's videos, in order) with each one's ``images_before``: the
    images among ``kinds`` (each medium's kind, in the text's order) that precede it."""
    images, out, queue = 0, [], iter(plans)
    for kind in kinds:
        if kind == "image":
            images += 1
        elif kind == "video":
            out.append(dataclasses.replace(next(queue), images_before=images))
    return out


def tiles_in_order(
    media: Mapping[str, np.ndarray],
    plans: Sequence[Any],
    *,
    images: int,
    input_ids: Any,
    processor: Any,
) -> dict[str, np.ndarray]:
    """``media`` with the images' ``pixel_values`` (their tiles, image after image) and the
    videos' ``pixel_values_videos`` (a tile a frame, video after video) joined into one
    ``pixel_values`` in the text's order: each ``<img>`` block of ``input_ids`` is one
    image's tiles or one frame, and ``plans`` say how many of the ``images`` precede each
    video.

    Raises:
        ValueError: the order is not known (a plan without ``images_before`` beside images),
            or the ids' blocks do not hold these tiles and frames.
    """
    media = dict(media)
    frames = media.pop("pixel_values_videos")
    tiles = media.get("pixel_values", frames[:0])
    if images and any(plan.images_before is None for plan in plans):
        raise ValueError(
            f"it comes with {images} image(s) and {len(plans)} video(s) but without the "
            f"video_plans encode() gave it (where each video sits among its images: the order "
            f"of their tiles in pixel_values); pass the encoding's video_plans"
        )
    ids = np.asarray(input_ids)
    opens = np.flatnonzero(ids == processor.start_image_token_id)
    closes = np.flatnonzero(ids == processor.end_image_token_id)
    counted = [len(plan.indices) for plan in plans]
    blocks = None
    if len(opens) == len(closes) and len(opens) == images + sum(counted):
        blocks = ((closes - opens - 1) // processor.image_seq_length).tolist()
    if blocks is None or sum(blocks) != len(tiles) + len(frames):
        raise ValueError(
            f"the encoded ids hold {len(opens)} image blocks, its {images} image(s) "
            f"({len(tiles)} tiles) and {len(plans)} video(s) ({len(frames)} frames) give "
            f"{images + sum(counted)}"
        )
    pieces, block, image, tile, frame = [], 0, 0, 0, 0
    for plan, count in [*zip(plans, counted), (None, 0)]:
        until = images if plan is None else plan.images_before or 0
        for _ in range(until - image):  # an image: one block of its tiles
            pieces.append(tiles[tile : tile + blocks[block]])
            tile, block, image = tile + blocks[block], block + 1, image + 1
        if plan is None:
            break
        if blocks[block : block + count] != [1] * count:  # a video: one tile a frame
            raise ValueError(
                f"a video of {count} frames has image blocks of "
                f"{blocks[block : block + count]} tiles, not one a frame"
            )
        pieces.append(frames[frame : frame + count])
        frame, block = frame + count, block + count
    return {**media, "pixel_values": np.concatenate(pieces)}
