"""A family's video work for a chat layout (:class:`VideoSide`): a video's plan from its
header with the limits checked, and its model inputs for the pack being emitted."""

from __future__ import annotations

import numpy as np

from energon_packing.media.video import VideoError, decode, probe, process, process_tiles
from energon_packing.media.video_plan import VideoPlan, time_offsets
from energon_packing.media.video_rules import VideoRule

__all__ = ["VideoSide"]


class VideoSide:
    """A family's video work for a chat layout: cost a video from its header
    (:meth:`plan`, with the limits checked before anything is decoded) and, for the pack being
    emitted, decode and process it (:meth:`media`), checked against that plan.

    Args:
        rule: The family's video processor settings.
        max_frames: Frames a video may be sampled to (``max_video_frames``).
        max_tokens: Video-pad tokens a video may expand to (``max_video_tokens``; None: any).
        max_pixels: Pixels a frame may have before it is decoded (``max_image_pixels``).
    """

    def __init__(
        self,
        rule: VideoRule,
        *,
        max_frames: int,
        max_tokens: int | None = None,
        max_pixels: int | None = None,
    ):
        self.rule = rule
        self.max_frames = max_frames
        self.max_tokens = max_tokens
        self.max_pixels = max_pixels
        self.fields = rule.style.fields

    def __repr__(self) -> str:
        return f"VideoSide({self.rule.family}, max_frames={self.max_frames})"

    def check_time_aligned(self, position_id_per_seconds: float) -> None:
        """Raises ValueError where an Omni thinker's video positions under these settings
        cannot be packed (:func:`time_offsets`, for as many temporal patches as
        ``max_video_frames`` allows); nothing for the other families."""
        if self.rule.grid_seconds is None:
            return
        patches = -(-self.max_frames // self.rule.temporal_patch_size)
        time_offsets(self.rule.style, patches, self.rule.grid_seconds, position_id_per_seconds)

    def plan(self, data: bytes) -> VideoPlan:
        """The video's plan from its header; a video over a limit, unreadable, or that the
        family's rules refuse is a :class:`VideoError` (nothing decoded)."""
        header = probe(data)
        pixels = header.width * header.height
        if self.max_pixels is not None and pixels > self.max_pixels:
            raise VideoError(
                "video_too_large",
                f"frames of {header.width}x{header.height} = {pixels:,} pixels, more than "
                f"max_image_pixels={self.max_pixels:,}; nothing was decoded",
            )
        plan = self.rule.plan(header)
        seconds = f"{header.frames / header.fps:.1f} s" if header.fps else "no frame rate"
        if plan.frames > self.max_frames:
            raise VideoError(
                "video_too_large",
                f"{header.width}x{header.height}, {header.frames} frames ({seconds}): "
                f"{self.rule.family}'s sampling takes {plan.frames} frames, more than "
                f"max_video_frames={self.max_frames}; nothing was decoded (raise "
                f"max_video_frames, or sample fewer: video_config fps / max_frames)",
            )
        if self.max_tokens is not None and plan.tokens > self.max_tokens:
            raise VideoError(
                "video_too_large",
                f"{header.width}x{header.height}, {plan.frames} sampled frames: grid "
                f"{plan.grid} is {plan.tokens} tokens, more than max_video_tokens="
                f"{self.max_tokens} (raise it, or lower video_config max_pixels / fps)",
            )
        return plan

    def media(self, data: bytes, plan: VideoPlan | None = None) -> dict[str, np.ndarray]:
        """The video's model inputs (``pixel_values_videos``, ``video_grid_thw``,
        Qwen2.5-VL's ``second_per_grid_ts``, the Omni thinkers' ``video_second_per_grid``), decoded now and checked against its plan
        (``plan``: the one made when the conversation was encoded; else made again).

        Raises:
            VideoError: the video does not decode, or decodes otherwise than its header says.
        """
        plan = plan if plan is not None else self.plan(data)
        frames = decode(data, plan.indices, max_pixels=self.max_pixels)
        if self.rule.style.frames_as_tiles:  # InternVL: a tile per frame, no grid field
            tiles = process_tiles(frames, self.rule)
            if len(tiles) != len(plan.indices):
                raise VideoError(
                    "video_corrupt",
                    f"its header ({plan.header.frames} frames) gives {len(plan.indices)} "
                    f"sampled frames, {len(tiles)} decoded",
                )
            return {"pixel_values_videos": tiles.numpy()}
        if self.rule.frame_per_index:  # GLM: its repeated last index as a frame of its own
            rank = {index: n for n, index in enumerate(sorted(set(plan.indices)))}
            frames = frames[[rank[i] for i in plan.indices]]
        pixels, grid = process(frames, self.rule)
        if grid != plan.grid:
            raise VideoError(
                "video_corrupt",
                f"its header ({plan.header.width}x{plan.header.height}, "
                f"{plan.header.frames} frames) gives grid {plan.grid}, the decoded frames "
                f"({frames.shape[2]}x{frames.shape[1]}) give {grid}",
            )
        out = {
            "pixel_values_videos": pixels.numpy(),
            "video_grid_thw": np.asarray([grid], dtype=np.int64),
        }
        for name in ("second_per_grid_ts", "video_second_per_grid"):
            if name in self.fields:
                out[name] = np.asarray([plan.second_per_grid], dtype=np.float32)
        return out
