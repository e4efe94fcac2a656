"""How each family's processor treats a video (:class:`VideoStyle`): its video processor's
defaults and where its rules part from Qwen2-VL's. A family takes videos when its registry
entry names one (``Family.videos`` in :mod:`energon_packing.encoding.families`); the rules over
a style are :class:`~.video_rules.VideoRule` and :class:`~.video_plan.VideoPlan`, so a family
whose video processor is laid out as one of these is one declaration, not a new code path.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "GLM4V",
    "GLM46V",
    "INTERNVL",
    "QWEN2_5_OMNI",
    "QWEN2_5_VL",
    "QWEN2_VL",
    "QWEN3_OMNI",
    "QWEN3_VL",
    "VideoStyle",
]

_OPENAI_CLIP = ((0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711))
_HALF = ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
_GRID = ("pixel_values_videos", "video_grid_thw")


@dataclass(kw_only=True, slots=True, frozen=True, eq=False)
class VideoStyle:
    """One family's video processor, as data.

    Attributes:
        name: The family key (error messages; the restore fingerprint's ``video_rule``).
        defaults: The video processor's class attributes (transformers 5.24), in
            :class:`~.video_rules.VideoRule`'s names; a checkpoint's
            ``video_preprocessor_config.json`` and ``video_config`` pass over them (read,
            never written: :meth:`~.video_rules.VideoRule.of` copies them).
        fields: The model inputs its processor returns for a video.
        timed_patches: Qwen3-VL: frames sampled by ``linspace`` (``fps`` alone suffices), the
            pixel budget counts the frames, and each temporal patch is its own run of tokens
            behind a ``<t seconds>`` timestamp (one ``(1, h, w)`` position grid each).
        scaled_seconds: Qwen2.5-VL: a temporal patch's position step is the model's
            ``tokens_per_second`` times ``second_per_grid_ts``, in float32.
        processor_size: The Omni processors' own ``videos_kwargs``: a ``size``
            (``min_pixels`` / ``max_pixels``) that passes over the video processor's own
            (only ``video_config`` passes over it) and the ``fps`` their
            ``video_second_per_grid`` assumes where the call passes none; such a family's
            temporal positions are its patches' times (``position_id_per_seconds``).
        whole_offsets: Qwen3-Omni keeps those times as float positions: they must be whole
            numbers to sit in a pack's integer ``position_ids``.
        frames_as_tiles: InternVL: each sampled frame is resized to the video processor's
            ``size`` (height x width) and is one tile of the image path: ``Frame{i}:`` and one
            ``<img>`` block of ``image_seq_length`` context tokens each in the text, its pixels
            in the model's ``pixel_values`` beside the images' tiles, in the text's order (no
            temporal patches, no grid field).
        sampling: GLM's own ``sample_frames``, by seconds: ``"per_second"`` (GLM-4.1V / 4.5V:
            ``fps`` frames a second up to ``max_duration``) or ``"by_length"`` (GLM-4.6V: a rate
            set by the clip's length, at most 640 frames); either keeps each frame once and
            repeats the last to an even count (None: the rules the flags above pick).
        frames_as_images: GLM: each temporal patch is an image in the text
            (``<|begin_of_image|>``, its image tokens, ``<|end_of_image|>``, then its first
            frame's time written by ``stamp``), and the pack gives its pixels and its
            ``(1, h, w)`` grid as an image's (``pixel_values`` / ``image_grid_thw``): GLM's
            forward fills images and videos through one ``<|image|>`` mask, so a call with
            both fails, while its vision tower and positions read a patch exactly as a
            one-patch image. Video and image conversations then share packs.
        stamp: GLM: a temporal patch's time as its text writes it, from its first frame's
            seconds.
        unread: ``video_config`` names the family's video processor does not read: refused
            there, naming them (a setting the packer would apply and the processor not).
        reads: What that video processor reads instead (the refusal's words).
    """

    name: str
    defaults: Mapping[str, Any]
    fields: tuple[str, ...] = _GRID
    timed_patches: bool = False
    scaled_seconds: bool = False
    processor_size: Mapping[str, Any] | None = None
    whole_offsets: bool = False
    frames_as_tiles: bool = False
    sampling: str | None = None
    frames_as_images: bool = False
    stamp: Callable[[float], str] | None = None
    unread: tuple[str, ...] = ()
    reads: str = ""

    def __repr__(self) -> str:
        return f"VideoStyle({self.name})"

    @property
    def time_aligned(self) -> bool:
        """Whether the temporal positions are the patches' times (the Omni thinkers)."""
        return self.processor_size is not None


_QWEN2_DEFAULTS = dict(
    sample=False,
    fps=None,
    min_pixels=128 * 28 * 28,
    max_pixels=28 * 28 * 768,
    patch_size=14,
    mean=_OPENAI_CLIP[0],
    std=_OPENAI_CLIP[1],
    max_video_tokens=128000,
)

QWEN2_VL = VideoStyle(name="qwen2_vl", defaults=_QWEN2_DEFAULTS)
QWEN2_5_VL = VideoStyle(
    name="qwen2_5_vl",
    defaults=_QWEN2_DEFAULTS,
    fields=(*_GRID, "second_per_grid_ts"),
    scaled_seconds=True,
)
QWEN3_VL = VideoStyle(
    name="qwen3_vl",
    defaults=dict(
        sample=True,
        fps=2.0,
        min_pixels=128 * 32 * 32,
        max_pixels=32 * 32 * 768,
        patch_size=16,
        mean=_HALF[0],
        std=_HALF[1],
        max_video_tokens=768,
    ),
    timed_patches=True,
)
# the Omni thinkers' video processor is Qwen2VLVideoProcessor (transformers' auto table)
QWEN2_5_OMNI = VideoStyle(
    name="qwen2_5_omni",
    defaults=_QWEN2_DEFAULTS,
    fields=(*_GRID, "video_second_per_grid"),
    processor_size=dict(min_pixels=128 * 28 * 28, max_pixels=768 * 28 * 28, fps=2.0),
)
QWEN3_OMNI = VideoStyle(
    name="qwen3_omni",
    defaults=_QWEN2_DEFAULTS,
    fields=(*_GRID, "video_second_per_grid"),
    processor_size=dict(min_pixels=128 * 32 * 32, max_pixels=768 * 32 * 32, fps=1.0),
    whole_offsets=True,
)
# InternVLVideoProcessor: every frame (do_sample_frames off), each resized to 384 x 384;
# sampling by fps or num_frames starts half a step in (initial_shift)
INTERNVL = VideoStyle(
    name="internvl",
    defaults=dict(
        sample=False,
        fps=None,
        frame_size=(384, 384),
        initial_shift=True,
        mean=_OPENAI_CLIP[0],
        std=_OPENAI_CLIP[1],
        # Qwen's pixel bounds and patches: not read where frames are tiles
        min_pixels=0,
        max_pixels=0,
        patch_size=1,
    ),
    fields=("pixel_values",),
    frames_as_tiles=True,
    unread=(
        "min_frames",
        "max_frames",
        "min_pixels",
        "max_pixels",
        "cap_pixels_per_frame",
        "max_video_tokens",
    ),
    reads=(
        "it keeps every frame, or samples num_frames / fps, each resized to size's height and width"
    ),
)


def _whole_seconds(seconds: float) -> str:
    return str(int(seconds))


def _tenths(seconds: float) -> str:
    return f"{seconds:.1f} seconds"


_GLM_DEFAULTS = dict(
    sample=True,
    fps=2.0,
    min_pixels=112 * 112,
    max_pixels=28 * 28 * 2 * 30000,
    patch_size=14,
    mean=_OPENAI_CLIP[0],
    std=_OPENAI_CLIP[1],
)
#: what GLM's video processors read of Qwen's and InternVL's names: none of these
_GLM_UNREAD = (
    "num_frames",
    "min_frames",
    "max_frames",
    "min_pixels",
    "max_pixels",
    "cap_pixels_per_frame",
    "max_video_tokens",
)
# Glm4vVideoProcessor: fps frames a second (the class default 2), frames as images, each
# temporal patch stamped with its first frame's whole second
GLM4V = VideoStyle(
    name="glm4v",
    defaults=_GLM_DEFAULTS,
    timed_patches=True,
    sampling="per_second",
    frames_as_images=True,
    stamp=_whole_seconds,
    unread=_GLM_UNREAD,
    reads="it samples fps frames a second, each sized by size's shortest and longest edge",
)
# Glm46VVideoProcessor: its rate by the clip's length (fps unread), stamped "{s:.1f} seconds"
GLM46V = VideoStyle(
    name="glm46v",
    defaults=_GLM_DEFAULTS,
    timed_patches=True,
    sampling="by_length",
    frames_as_images=True,
    stamp=_tenths,
    unread=(*_GLM_UNREAD, "fps"),
    reads=(
        "it samples at a rate set by the clip's length, each frame sized by size's shortest "
        "and longest edge"
    ),
)
