"""One video as its family's processor will see it, worked out from the header alone
(:class:`VideoPlan`, made by :meth:`.video_rules.VideoRule.plan`): what a conversation costs
while it waits in the buffer, its expansion in the text, its positions' grids and intervals,
and the model inputs' names per family."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from energon_packing.media.video import VideoHeader
from energon_packing.media.video_styles import VideoStyle

__all__ = ["VideoPlan", "time_offsets", "timestamps"]


def timestamps(indices: Sequence[int], fps: float, tps: int) -> tuple[float, ...]:
    """Qwen3-VL's time of each temporal patch (its processor's ``_calculate_timestamps``):
    the sampled indices, the last repeated to a whole patch, in seconds; each patch's first
    and last frame averaged."""
    indices = [*indices, *[indices[-1]] * (-len(indices) % tps)]
    seconds = [i / (fps or 24) for i in indices]
    return tuple((seconds[i] + seconds[i + tps - 1]) / 2 for i in range(0, len(seconds), tps))


@dataclass(kw_only=True, slots=True, frozen=True)
class VideoPlan:
    """One video as its family's processor will see it, worked out from the header alone
    (:meth:`VideoRule.plan`): what a conversation costs while it waits in the buffer."""

    style: VideoStyle
    header: VideoHeader
    #: the sampled frame indices (ascending; Qwen3 may repeat one)
    indices: tuple[int, ...]
    #: ``video_grid_thw``
    grid: tuple[int, int, int]
    merge_size: int
    #: Qwen3-VL, GLM: the time of each temporal patch, in seconds (else empty)
    timestamps: tuple[float, ...] = ()
    #: seconds a temporal patch spans: Qwen2.5-VL's ``second_per_grid_ts``, the Omni thinkers'
    #: ``video_second_per_grid``
    second_per_grid: float = 1.0
    #: the video's own audio track, interleaved with its frames (``audio_config
    #: ['load_audio_from_video']``): its samples at 16 kHz and its audio tokens (None: no track)
    audio_samples: int | None = None
    audio_tokens: int | None = None
    #: InternVL (frames as tiles): context tokens per frame; ``grid`` is then (frames,
    #: height, width), the frames and their size after the resize
    tile_tokens: int = 0
    #: InternVL: the images the conversation's text shows before this video (its frames
    #: join theirs in the model's ``pixel_values`` in the text's order); set when the
    #: conversation is encoded (None: not known)
    images_before: int | None = None

    @property
    def frames(self) -> int:
        """Frames decoded: the distinct sampled indices."""
        return len(set(self.indices))

    @property
    def tokens(self) -> int:
        """Video-pad tokens in the text (Qwen3's timestamps and markers come on top;
        InternVL: the frames' context tokens, its ``Frame{i}:`` and ``<img>`` markers on top)."""
        if self.style.frames_as_tiles:
            return len(self.indices) * self.tile_tokens
        t, h, w = self.grid
        return t * h * w // (self.merge_size * self.merge_size)

    def expansion(self, *, video_token: str, vision_start: str, vision_end: str) -> str:
        """What the processor puts in place of the video's one ``video_token`` in the rendered
        chat template (which wraps it in ``vision_start`` / ``vision_end`` itself): Qwen2/2.5
        repeat it ``t*h*w/merge**2`` times; Qwen3 writes ``<{seconds:.1f} seconds>`` and one
        ``vision_start video_token*(h*w/merge**2) vision_end`` per temporal patch
        (transformers 5.10-5.24 keep the template's outer pair around them; before and since,
        the release replaces the pair with them: ``hf_compat.qwen3_video_keeps_markup``).
        InternVL (frames as tiles; ``video_token`` its context token, ``vision_start`` /
        ``vision_end`` its ``<img>`` / ``</img>``): ``Frame{i}: <img>...</img>`` per frame,
        one a line. GLM (``video_token`` its image token, ``vision_start`` / ``vision_end``
        its image's markers): per temporal patch, an image and its ``VideoStyle.stamp``."""
        if self.style.frames_as_tiles:
            tile = f"{vision_start}{video_token * self.tile_tokens}{vision_end}"
            return "\n".join(f"Frame{i + 1}: {tile}" for i in range(len(self.indices)))
        t, h, w = self.grid
        per_patch = h * w // (self.merge_size * self.merge_size)
        if self.style.stamp is not None:  # GLM: the time after each patch's image
            return "".join(
                f"{vision_start}{video_token * per_patch}{vision_end}"
                f"{self.style.stamp(self.timestamps[i])}"
                for i in range(t)
            )
        if not self.style.timed_patches:
            return video_token * (t * per_patch)
        return "".join(
            f"<{self.timestamps[i]:.1f} seconds>{vision_start}{video_token * per_patch}{vision_end}"
            for i in range(t)
        )

    def rope_grids(self) -> list[tuple[int, int, int]]:
        """The grids ``get_rope_index`` reads for this video, one per run of video tokens:
        Qwen3-VL splits it into ``t`` grids ``(1, h, w)`` (its timestamps separate them)."""
        t, h, w = self.grid
        return [(1, h, w)] * t if self.style.timed_patches else [self.grid]

    def time_intervals(
        self, tokens_per_second: float | None, *, fractional: bool = True
    ) -> list[float]:
        """The temporal position step of each of :meth:`rope_grids`: Qwen2.5-VL's
        ``tokens_per_second * second_per_grid_ts`` (``fractional=False``: the seconds truncated
        first, ``tokens_per_second * int(second_per_grid_ts)``, transformers before 5.18); 1 for
        the other families."""
        if self.style.scaled_seconds:  # in float32, as the model multiplies them
            seconds = np.float32(self.second_per_grid)
            if not fractional:
                seconds = np.float32(int(seconds))
            return [float(np.float32(tokens_per_second) * seconds)]
        return [1.0] * len(self.rope_grids())

    def time_aligned(self, position_id_per_seconds: float) -> np.ndarray:
        """The Omni thinkers' temporal offset of each temporal patch (:func:`time_offsets`)."""
        return time_offsets(self.style, self.grid[0], self.second_per_grid, position_id_per_seconds)


def time_offsets(
    style: VideoStyle, patches: int, second_per_grid: float, position_id_per_seconds: float
) -> np.ndarray:
    """The Omni thinkers' temporal offsets of ``patches`` temporal patches (their
    ``get_rope_index``: ``arange(t) * video_second_per_grid * position_id_per_seconds`` in
    float32, truncated by Qwen2.5-Omni, kept whole by Qwen3-Omni, whose positions are float).

    Raises:
        ValueError: Qwen3-Omni's offsets are not whole numbers (its float positions then fall
            between the integer ``position_ids`` a pack holds); the message names the knob.
    """
    seconds = np.arange(patches).astype(np.float32) * np.float32(second_per_grid)
    offsets = seconds * np.float32(position_id_per_seconds)
    if style.whole_offsets and not np.array_equal(offsets, np.floor(offsets)):
        fractional = offsets[offsets != np.floor(offsets)]
        raise ValueError(
            f"{style.name}: video_second_per_grid {second_per_grid:g} s x "
            f"position_id_per_seconds {position_id_per_seconds:g} gives fractional temporal "
            f"positions ({float(fractional[0]):g}, ...), which Qwen3-Omni keeps as floats and a "
            f"pack's integer position_ids cannot hold; set video_config['fps'] so that "
            f"temporal_patch_size / fps x position_id_per_seconds is a whole number (the "
            f"processor's default fps 1.0 is)"
        )
    return offsets.astype(np.int64)
