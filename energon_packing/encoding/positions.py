"""Position ids of one conversation: 1-D, or the Qwen families' 3-row mRoPE (t, h, w), for
images and videos.

Computed per source, as the model computes them for that source alone; the pack layout
(:func:`energon_packing.schema.layout`) places them and continues them through the padding.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from energon_packing.encoding import hf_compat

__all__ = [
    "IMAGE",
    "TEXT",
    "VIDEO",
    "MRope",
    "mrope_positions",
    "token_types",
    "vision_positions",
]


@dataclass(kw_only=True, slots=True, frozen=True)
class MRope:
    """Token ids and merge size that the Qwen families' 3-row (t, h, w) positions need."""

    vision_start_id: int
    image_pad_id: int
    merge_size: int = 2
    #: the video-pad token (None: a layout without videos)
    video_pad_id: int | None = None
    #: Qwen2.5-VL's ``vision_config.tokens_per_second`` (None: the family has no time scale)
    tokens_per_second: float | None = None
    #: the Omni thinkers' ``position_id_per_seconds`` (None: not time-aligned): a video's
    #: temporal positions are its patches' times, and text resumes after its largest position
    position_id_per_seconds: float | None = None
    #: the audio-start token (Omni: a video's interleaved track opens with it right after the
    #: vision start) and the thinker's interleave rule (``AudioRule.interleave``; None: none)
    audio_start_id: int | None = None
    interleave: str | None = None
    #: the thinker config's ``seconds_per_chunk`` (the ``"chunks"`` rule)
    seconds_per_chunk: float = 2.0


def token_types(input_ids: Sequence[int], spec: MRope) -> np.ndarray:
    """``mm_token_type_ids`` of one source: 1 on image pads, 2 on video pads, 0 elsewhere."""
    ids = np.asarray(input_ids)
    types = np.zeros(len(ids), dtype=np.int64)
    types[ids == spec.image_pad_id] = IMAGE
    if spec.video_pad_id is not None:
        types[ids == spec.video_pad_id] = VIDEO
    return types


def mrope_positions(
    input_ids: Sequence[int],
    grids: Sequence[tuple[int, int, int]],
    spec: MRope,
    *,
    videos: Sequence[Any] = (),
) -> np.ndarray:
    """``[3, len(input_ids)]`` positions of one source with images and videos, as the
    family's ``get_rope_index`` computes them for that source alone (:func:`vision_positions`
    over the runs of image-pad and video-pad tokens, in source order).

    Args:
        grids: The images' ``image_grid_thw`` rows, in order.
        videos: The videos' plans (``rope_grids()`` and ``time_intervals(tokens_per_second)``,
            :class:`energon_packing.media.video_plan.VideoPlan`), in order.
    """
    if any(getattr(plan, "audio_tokens", None) is not None for plan in videos):
        return _with_tracks(np.asarray(input_ids), grids, spec, videos)
    types = token_types(input_ids, spec)
    runs = np.flatnonzero(np.diff(types, prepend=TEXT) != 0)
    kinds = types[runs]
    video_grids = [g for plan in videos for g in plan.rope_grids()]
    aligned = spec.position_id_per_seconds is not None
    if aligned:  # the Omni thinkers: each video's offsets stand in for its interval
        intervals = [plan.time_aligned(spec.position_id_per_seconds) for plan in videos]
    else:
        fractional = hf_compat.fractional_time_interval()  # the installed model's rule
        intervals = [
            i
            for plan in videos
            for i in plan.time_intervals(spec.tokens_per_second, fractional=fractional)
        ]
    image_of, video_of = iter(grids), iter(zip(video_grids, intervals))
    ordered, ordered_intervals = [], []
    for kind in kinds[kinds != TEXT]:
        found = next(image_of if kind == IMAGE else video_of, None)
        if found is None:
            what = "image" if kind == IMAGE else "video"
            raise ValueError(
                f"more {what}-pad runs than {what} grids ({len(grids)} images, "
                f"{len(videos)} videos)"
            )
        if kind == IMAGE:
            ordered.append(tuple(found))
        else:
            ordered.append(tuple(found[0]))
            ordered_intervals.append(found[1])
    if next(image_of, None) is not None or next(video_of, None) is not None:
        raise ValueError(f"{len(grids)} image and {len(videos)} video grids for fewer runs")
    if aligned:
        return vision_positions(
            types, ordered, merge_size=spec.merge_size, time_offsets=ordered_intervals
        )
    return vision_positions(
        types,
        ordered,
        merge_size=spec.merge_size,
        time_intervals=ordered_intervals,
        video_frames_apart=hf_compat.video_frames_apart(),
    )


def _with_tracks(
    ids: np.ndarray, grids: Sequence[tuple[int, int, int]], spec: MRope, videos: Sequence[Any]
) -> np.ndarray:
    """:func:`mrope_positions` of an Omni source whose videos carry their own audio tracks:
    each ``vision_start audio_start ... audio_end vision_end`` block by
    :func:`~.av_interleave.block_positions`, the stretches between them as any other source's
    (the time-aligned rule: each stretch starts where the thinker resumes after the block)."""
    from energon_packing.encoding import av_interleave

    if spec.interleave is None or spec.audio_start_id is None:
        raise ValueError("a video with its own audio track, for a family with no interleave rule")
    starts = np.flatnonzero((ids[1:] == spec.audio_start_id) & (ids[:-1] == spec.vision_start_id))
    positions = np.empty((3, len(ids)), dtype=np.int64)
    image_of, plan_of = iter(grids), iter(videos)
    per_chunk = int(spec.position_id_per_seconds * spec.seconds_per_chunk)
    done, current = 0, 0

    def stretch(end: int) -> None:  # the tokens [done, end) outside any block
        nonlocal current
        if end <= done:
            return
        types = token_types(ids[done:end], spec)
        kinds = types[np.flatnonzero(np.diff(types, prepend=TEXT) != 0)]
        ordered, offsets = [], []
        for kind in kinds[kinds != TEXT]:
            if kind == IMAGE:
                ordered.append(tuple(next(image_of)))
                continue
            plan = next(plan_of)
            if plan.audio_tokens is not None:
                raise ValueError("a video with an audio track outside its track's block")
            ordered.append(tuple(plan.grid))
            offsets.append(plan.time_aligned(spec.position_id_per_seconds))
        found = vision_positions(types, ordered, merge_size=spec.merge_size, time_offsets=offsets)
        positions[:, done:end] = current + found
        current += int(found.max()) + 1

    for start in starts.tolist():
        stretch(start)
        plan = next(plan_of, None)
        if plan is None or plan.audio_tokens is None:
            raise ValueError(f"the track block at token {start} has no video with a track left")
        width = 4 + plan.tokens + plan.audio_tokens
        held = int(np.count_nonzero(ids[start : start + width] == spec.video_pad_id))
        if held != plan.tokens or start + width > len(ids):
            raise ValueError(
                f"the track block at token {start} holds {held} video tokens of "
                f"{plan.tokens} in {width} tokens"
            )
        block, current = av_interleave.block_positions(
            kind=spec.interleave,
            grid=plan.grid,
            merge_size=spec.merge_size,
            temporal=plan.time_aligned(spec.position_id_per_seconds),
            audio_tokens=plan.audio_tokens,
            start=current,
            per_chunk=per_chunk,
        )
        positions[:, start : start + width] = block
        done = start + width
    stretch(len(ids))
    if next(image_of, None) is not None or next(plan_of, None) is not None:
        raise ValueError(f"{len(grids)} image and {len(videos)} video grids for fewer runs")
    return positions


#: ``mm_token_type_ids`` values: what each token is
TEXT, IMAGE, VIDEO = 0, 1, 2


def vision_positions(
    token_types: Sequence[int],
    grids: Sequence[tuple[int, int, int]],
    *,
    merge_size: int,
    time_intervals: Sequence[float] = (),
    video_frames_apart: bool = True,
    time_offsets: Sequence[np.ndarray] | None = None,
) -> np.ndarray:
    """``[3, n]`` positions as ``get_rope_index`` of Qwen2-VL, Qwen2.5-VL and Qwen3-VL computes
    them for one source (transformers 5.5 to 5.24 alike, given the time intervals).

    ``token_types`` are the ``mm_token_type_ids`` (0 text, 1 image, 2 video); each maximal run
    of one vision type is the next grid of ``grids`` (images and videos in source order).
    Text advances all three rows together. A grid's tokens get (temporal, row, column) of its
    merged grid offset by the position so far, the temporal index scaled by the video's
    ``time_intervals`` entry (Qwen2.5-VL: ``tokens_per_second * second_per_grid_ts``, in
    float32 and truncated as the model does, its seconds truncated first before transformers
    5.18: :func:`~energon_packing.encoding.hf_compat.fractional_time_interval`; 1 for images and
    the other families). For
    Qwen3-VL pass each video as t grids ``(1, h, w)``, one per temporal patch (its
    timestamps' text separates them, and its ``get_rope_index`` splits the grid so). Text
    after
    a grid resumes at the position before it + ``max(h, w) // merge_size``: the temporal
    extent is ignored (for an image, t = 1, that is the grid's largest position + 1, the rule
    of transformers <= 5.2 and the original Qwen code, which differ only for videos; every
    release from 5.5, the supported floor, resumes so).

    ``video_frames_apart=False`` is transformers 5.5.x's rule for a video's own tokens (its
    ``get_vision_position_ids``, rewritten in 5.6.0): every temporal position is the position
    before the video times its time interval, and the rows are counted over all frames at once
    (``arange(h).repeat_interleave(w * t)``); images (t = 1) and Qwen3-VL's one-frame grids get
    the same positions either way.

    ``time_offsets`` (the Omni thinkers' time-aligned rule, their ``get_rope_index``): each
    video run's temporal offset per temporal patch, given whole
    (:meth:`~energon_packing.media.video_plan.VideoPlan.time_aligned`), in place of the intervals;
    text after any grid resumes at its largest position + 1 (a video's temporal extent
    included; for an image the same as above).
    """
    types = np.asarray(token_types, dtype=np.int64)
    positions = np.empty((3, len(types)), dtype=np.int64)
    cut = np.flatnonzero(np.diff(types)) + 1
    bounds = [0, *cut.tolist(), len(types)]
    aligned = time_offsets is not None
    grid_of = iter(grids)
    interval_of = iter(time_offsets if aligned else time_intervals)
    current = 0
    for start, end in zip(bounds, bounds[1:]):
        if types[start] == TEXT:
            positions[:, start:end] = current + np.arange(end - start)
            current += end - start
            continue
        try:
            t, h, w = next(grid_of)
        except StopIteration:
            raise ValueError(f"a vision run at token {start} has no grid left") from None
        gh, gw = h // merge_size, w // merge_size
        if end - start != t * gh * gw:
            raise ValueError(
                f"the vision run at token {start} has {end - start} tokens, its grid "
                f"{(t, h, w)} needs {t * gh * gw}"
            )
        if aligned:
            temporal = np.zeros(t, dtype=np.int64)
            if types[start] == VIDEO:
                temporal = next(interval_of, None)
                if temporal is None or len(temporal) != t:
                    raise ValueError(f"no {t} time offsets for the video run at token {start}")
            positions[0, start:end] = current + np.repeat(temporal, gh * gw)
            positions[1, start:end] = current + np.tile(np.repeat(np.arange(gh), gw), t)
            positions[2, start:end] = current + np.tile(np.arange(gw), t * gh)
            current = int(positions[:, start:end].max()) + 1
            continue
        if types[start] == VIDEO and not video_frames_apart:
            interval = next(interval_of, None) if time_intervals else 1.0
            if interval is None:
                raise ValueError(f"{len(time_intervals)} time intervals for more video runs")
            positions[0, start:end] = int(np.float32(current) * np.float32(interval))
            positions[1, start:end] = current + np.repeat(np.arange(gh), gw * t)
            positions[2, start:end] = current + np.tile(np.arange(gw), gh * t)
            current += max(gh, gw)
            continue
        temporal = np.arange(t)
        if types[start] == VIDEO:
            interval = next(interval_of, None) if time_intervals else 1.0
            if interval is None:
                raise ValueError(f"{len(time_intervals)} time intervals for more video runs")
            temporal = (temporal.astype(np.float32) * np.float32(interval)).astype(np.int64)
        positions[0, start:end] = current + np.repeat(temporal, gh * gw)
        positions[1, start:end] = current + np.tile(np.repeat(np.arange(gh), gw), t)
        positions[2, start:end] = current + np.tile(np.arange(gw), t * gh)
        current += max(gh, gw)
    if next(grid_of, None) is not None:
        raise ValueError(f"{len(grids)} grids for fewer vision runs")
    return positions
