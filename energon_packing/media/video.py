"""Videos as the Qwen2-VL, Qwen2.5-VL and Qwen3-VL video processors see them (and the Qwen
Omni thinkers' processors, whose video processor is Qwen2-VL's), without
torchvision (it does not import beside the CPU torch wheel, and transformers' video processors
need it).

Four steps, each the family's own rule (transformers 5.24, read from its code):

* :func:`probe`: the container, no decode: fps and size from the header, the frame count from
  its packets (demuxed, not decoded: packets an MP4 edit list discards, as clips cut with
  ``-c copy`` have, never decode, and Matroska / WebM / MPEG-TS headers hold no count).
* :meth:`VideoRule.indices`: the frames the processor samples (Qwen2/2.5: an ``arange`` of
  float steps over ``fps``-derived counts, or every frame when ``do_sample_frames`` is off;
  Qwen3: ``linspace``), and :meth:`VideoRule.size`: ``smart_resize`` (Qwen3's budget counts
  the frames). So :meth:`VideoRule.grid` and :meth:`VideoRule.tokens` come from the header.
* :func:`decode`: the sampled frames, decoded with PyAV as transformers' pyav loader decodes
  them (``rgb24``, the i-th decoded frame).
* :func:`process`: the processor's tensor path: uint8 bicubic antialiased resize (torch's own
  kernel, which torchvision calls), fused rescale and normalise in float32, the last frame
  repeated to a multiple of the temporal patch, patchify.

``pixel_values_videos`` and ``video_grid_thw`` are bit-equal to the real processors' with
transformers' pyav loader (``tests/data/video/reference.json``, made once with torchvision
present; transformers' stock ``fetch_videos`` would ask for torchcodec).
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from energon_packing.errors import Skip
from energon_packing.resize import smart_resize

__all__ = [
    "FAMILIES",
    "VideoError",
    "VideoHeader",
    "VideoPlan",
    "VideoRule",
    "VideoSide",
    "decode",
    "probe",
    "process",
]

FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen2_5_omni", "qwen3_omni")

_MISSING = object()
_OPENAI_CLIP = ((0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711))
_HALF = ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))


class VideoError(Skip):
    """A video that cannot be used: a :class:`~energon_packing.errors.Skip` under its reason
    (``video_*`` in ``energon_packing.stats.REASONS``)."""


@dataclass(kw_only=True, slots=True, frozen=True)
class VideoHeader:
    """What a container's header says about its first video stream."""

    frames: int
    fps: float
    width: int
    height: int
    #: the stream header's own frame count differs from the packets' (0: it holds none)
    counted: bool = False


#: The demuxers a video part may be read with: MP4 / QuickTime, Matroska / WebM, AVI (the
#: containers of VIDEO_SUFFIXES). Others are refused before they read anything: FFmpeg would
#: otherwise take an ffconcat or playlist text as a "video" and open the files it names.
DEMUXERS = "mov,mp4,m4a,3gp,3g2,mj2,matroska,webm,avi"


def _open(data: bytes) -> Any:
    """``data`` opened by PyAV with one of :data:`DEMUXERS`, or :class:`VideoError`
    ``unsupported_video`` when PyAV (the ``[video]`` extra) is not installed."""
    try:
        import av
    except ImportError:
        raise VideoError(
            "unsupported_video",
            "PyAV is not installed: pip install 'av>=14' (the [video] extra: pip install "
            "'.[video]' in the checkout, or the built wheel with [video])",
        ) from None
    return av.open(io.BytesIO(data), options={"format_whitelist": DEMUXERS})


def probe(data: bytes) -> VideoHeader:
    """The header of the first video stream of ``data`` (no frame is decoded).

    Raises:
        VideoError: ``video_unreadable`` (not a container PyAV opens with one of
            :data:`DEMUXERS`), ``video_no_stream``.
    """
    try:
        with _open(data) as container:
            if not container.streams.video:
                raise VideoError("video_no_stream", "the container holds no video stream")
            stream = container.streams.video[0]
            frames = sum(
                1 for packet in container.demux(stream) if packet.size and not packet.is_discard
            )
            counted = frames != int(stream.frames or 0)
            rate = stream.average_rate
            return VideoHeader(
                frames=frames,
                fps=float(rate) if rate else 0.0,
                width=int(stream.width),
                height=int(stream.height),
                counted=counted,
            )
    except VideoError:
        raise
    except Exception as e:  # PyAV raises its own FFmpeg error types, and OSError
        raise VideoError("video_unreadable", f"{type(e).__name__}: {e}") from None


def decode(data: bytes, indices: Sequence[int], *, max_pixels: int | None = None) -> np.ndarray:
    """The distinct frames of ``indices`` of the first video stream, uint8 ``[T, H, W, 3]``
    RGB, decoded as transformers' pyav loader does (the i-th frame the decoder yields, each
    once, in order).

    Args:
        max_pixels: Pixels a frame may have. Every frame is checked before it is converted
            (against this, and against the first frame's size), so a stream whose frames
            outgrow its header costs no more memory than the budget.

    Raises:
        VideoError: ``video_corrupt`` when the stream ends before the last index or its frames
            change size; ``video_too_large`` for a frame over ``max_pixels``.
    """
    wanted = sorted(set(int(i) for i in indices))  # a frame sampled twice decodes once
    if not wanted:
        raise VideoError("video_empty", "no frame sampled")
    slot = {index: n for n, index in enumerate(wanted)}
    last, out, found, size = wanted[-1], None, 0, None
    try:
        with _open(data) as container:
            for i, frame in enumerate(container.decode(video=0)):
                if i > last:
                    break
                if i not in slot:
                    continue
                if max_pixels is not None and frame.width * frame.height > max_pixels:
                    raise VideoError(
                        "video_too_large",
                        f"frame {i} is {frame.width}x{frame.height} = "
                        f"{frame.width * frame.height:,} pixels, more than max_image_pixels="
                        f"{max_pixels:,} (its header said less)",
                    )
                width, height = size = size or (frame.width, frame.height)
                if (frame.width, frame.height) != size:
                    raise VideoError(
                        "video_corrupt",
                        f"frame {i} is {frame.width}x{frame.height}, the stream's frames are "
                        f"{width}x{height} (a size change mid-stream)",
                    )
                if out is None:  # one array, filled in place: no second copy of the frames
                    out = np.empty((len(wanted), height, width, 3), dtype=np.uint8)
                out[slot[i]] = frame.to_ndarray(format="rgb24")
                found += 1
    except VideoError:
        raise
    except Exception as e:
        raise VideoError("video_corrupt", f"decoding failed: {type(e).__name__}: {e}") from None
    if found < len(wanted):
        raise VideoError(
            "video_corrupt",
            f"the stream decoded {found} of the {len(wanted)} sampled frames (up to frame "
            f"{last}); the header promised more",
        )
    return out


def _smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int):
    """Qwen2-VL's ``smart_resize`` (per frame)."""
    try:
        return smart_resize(
            height, width, factor=factor, min_pixels=min_pixels, max_pixels=max_pixels
        )
    except ValueError as e:
        raise VideoError("video_aspect_ratio", f"frames of {width}x{height}: {e} > 200") from None


def _smart_resize_frames(
    num_frames: int, height: int, width: int, temporal: int, factor: int, min_pixels, max_pixels
):
    """Qwen3-VL's ``smart_resize``: the pixel budget counts the frames."""
    if num_frames < temporal:
        raise VideoError("video_too_short", f"{num_frames} frames < temporal patch {temporal}")
    if height < factor or width < factor:
        scale = max(factor / height, factor / width)
        height, width = int(height * scale), int(width * scale)
    if max(height, width) / min(height, width) > 200:
        raise VideoError(
            "video_aspect_ratio",
            f"aspect ratio {max(height, width) / min(height, width):.0f} > 200",
        )
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    t_bar = round(num_frames / temporal) * temporal
    if t_bar * h_bar * w_bar > max_pixels:
        beta = math.sqrt((num_frames * height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif t_bar * h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (num_frames * height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


#: each family's video processor defaults (transformers 5.24 class attributes)
_DEFAULTS: dict[str, dict[str, Any]] = {
    "qwen2_vl": dict(
        sample=False,
        fps=None,
        min_pixels=128 * 28 * 28,
        max_pixels=28 * 28 * 768,
        patch_size=14,
        mean=_OPENAI_CLIP[0],
        std=_OPENAI_CLIP[1],
        max_video_tokens=128000,
    ),
    "qwen3_vl": dict(
        sample=True,
        fps=2.0,
        min_pixels=128 * 32 * 32,
        max_pixels=32 * 32 * 768,
        patch_size=16,
        mean=_HALF[0],
        std=_HALF[1],
        max_video_tokens=768,
    ),
}
_DEFAULTS["qwen2_5_vl"] = dict(_DEFAULTS["qwen2_vl"])
# the Omni thinkers' video processor is Qwen2VLVideoProcessor (transformers' auto table)
_DEFAULTS["qwen2_5_omni"] = dict(_DEFAULTS["qwen2_vl"])
_DEFAULTS["qwen3_omni"] = dict(_DEFAULTS["qwen2_vl"])

#: the Omni processors' own ``videos_kwargs`` (transformers 5.24 class attributes): a ``size``
#: that passes over the video processor's own (only ``video_config`` passes over it), and the
#: fps their ``video_second_per_grid`` (``temporal_patch_size / fps``) assumes where the call
#: passes none, whatever the video's rate or sampling
_OMNI: dict[str, dict[str, Any]] = {
    "qwen2_5_omni": dict(min_pixels=128 * 28 * 28, max_pixels=768 * 28 * 28, fps=2.0),
    "qwen3_omni": dict(min_pixels=128 * 32 * 32, max_pixels=768 * 32 * 32, fps=1.0),
}


@dataclass(kw_only=True, slots=True, frozen=True)
class VideoRule:
    """One family's video processor settings, and its rules over a :class:`VideoHeader`."""

    family: str
    sample: bool  # do_sample_frames
    fps: float | None
    num_frames: int | None = None
    min_frames: int = 4
    max_frames: int = 768
    min_pixels: int
    max_pixels: int
    patch_size: int
    temporal_patch_size: int = 2
    merge_size: int = 2
    mean: tuple[float, ...] = field(default=_OPENAI_CLIP[0])
    std: tuple[float, ...] = field(default=_OPENAI_CLIP[1])
    rescale_factor: float = 1 / 255
    cap_pixels_per_frame: bool = False
    max_video_tokens: int = 128000
    #: the Omni thinkers' ``video_second_per_grid``: temporal patch / the call's fps (the
    #: processor's default where ``video_config`` gives none); None: from the sampled rate.
    #: Not in the repr (the restore check's ``video_rule``, as older releases saved it): the
    #: family and ``video_config`` decide it
    grid_seconds: float | None = field(default=None, repr=False)

    @classmethod
    def of(
        cls,
        family: str,
        config: Mapping[str, Any] | Any = None,
        *,
        overrides: Mapping[str, Any] | None = None,
    ) -> VideoRule:
        """The family's defaults, overridden by a video processor's settings (its
        ``video_preprocessor_config.json`` as a dict, or the processor object itself), then by
        ``overrides`` (``video_config``, the same names). The Omni processors pass their own
        ``size`` over their video processor's pixel bounds (only ``overrides`` pass over it)
        and state ``video_second_per_grid`` from the call's fps (``overrides``), else their
        default."""
        if family not in FAMILIES:
            raise ValueError(f"no video rule for {family!r}; families: {', '.join(FAMILIES)}")
        values = dict(_DEFAULTS[family])
        overrides = dict(overrides or {})

        def get(name: str, missing: Any = None) -> Any:
            if name in overrides:
                return overrides[name]
            if omni is not None and name in _PIXEL_BOUNDS:
                return missing
            if isinstance(config, Mapping):
                return config.get(name, missing)
            return getattr(config, name, missing) if config is not None else missing

        omni = _OMNI.get(family)
        if omni is not None:  # the processor's size passes over the video processor's
            values.update(min_pixels=omni["min_pixels"], max_pixels=omni["max_pixels"])
        size = get("size")
        if size is not None:
            size = dict(size) if isinstance(size, Mapping) else vars(size)
            values["min_pixels"] = size.get("shortest_edge") or values["min_pixels"]
            values["max_pixels"] = size.get("longest_edge") or values["max_pixels"]
        renames = dict(
            sample="do_sample_frames",
            fps="fps",
            num_frames="num_frames",
            min_frames="min_frames",
            max_frames="max_frames",
            min_pixels="min_pixels",
            max_pixels="max_pixels",
            patch_size="patch_size",
            temporal_patch_size="temporal_patch_size",
            merge_size="merge_size",
            mean="image_mean",
            std="image_std",
            rescale_factor="rescale_factor",
            cap_pixels_per_frame="cap_pixels_per_frame",
            max_video_tokens="max_video_tokens",
        )
        for ours, theirs in renames.items():
            value = get(theirs, _MISSING)
            if value is _MISSING or (value is None and ours not in ("fps", "num_frames")):
                continue  # fps / num_frames: None set explicitly means "not this way"
            values[ours] = tuple(value) if ours in ("mean", "std") else value
        for flag in ("do_resize", "do_rescale", "do_normalize", "do_convert_rgb"):
            if get(flag) is False:
                raise ValueError(f"{family}: {flag}=False is not supported for videos")
        resample = get("resample")
        resample = getattr(resample, "value", resample)
        resample = resample.get("value") if isinstance(resample, Mapping) else resample
        if resample is not None and resample != 3:  # PIL's BICUBIC
            raise ValueError(f"{family}: resample={resample!r}; videos are resized bicubic only")
        if values["sample"] and values["fps"] is not None and values.get("num_frames") is not None:
            raise ValueError(
                f"{family}: fps={values['fps']} and num_frames={values.get('num_frames')} are "
                f"mutually exclusive (the processor refuses both); set one to None"
            )
        if (
            values["sample"]
            and family != "qwen3_vl"
            and values["fps"] is None
            and values.get("num_frames") is None
        ):
            raise ValueError(
                f"{family}: do_sample_frames needs fps or num_frames (the processor's defaults "
                f"have neither; qwen-vl-utils samples at fps=2.0)"
            )
        if omni is not None:
            fps = overrides.get("fps") or omni["fps"]
            values["grid_seconds"] = values.get("temporal_patch_size", 2) / fps
        return cls(family=family, **values)

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size

    def indices(self, header: VideoHeader) -> np.ndarray:
        """The frame indices the processor decodes (ascending)."""
        total = header.frames
        if total <= 0:
            raise VideoError("video_empty", "the stream holds no frame")
        if not self.sample:
            return np.arange(total)
        if self.family == "qwen3_vl":
            count = self.num_frames
            if count is None and self.fps is not None:
                count = int(total / (header.fps or 24) * self.fps)
                count = min(max(count, self.min_frames), self.max_frames, total)
            if count is None:
                count = min(max(total, self.min_frames), self.max_frames)
            return np.linspace(0, total - 1, count).round().astype(int)
        count, tps = self.num_frames, self.temporal_patch_size
        if count is not None:
            count = round(count / tps) * tps
        elif self.fps is not None:
            if not header.fps:
                raise VideoError("video_no_fps", "sampling by fps needs the stream's frame rate")
            most = math.floor(min(self.max_frames, total) / tps) * tps
            count = total / header.fps * self.fps
            count = math.floor(min(max(count, self.min_frames), most, total) / tps) * tps
        if count is None:
            return np.arange(total)
        if count > total or count <= 0:
            raise VideoError("video_too_short", f"{total} frames cannot give {count} samples")
        return torch.arange(0, total, total / count).int().numpy()

    def size(self, frames: int, height: int, width: int) -> tuple[int, int]:
        """The resized frame size for ``frames`` sampled frames of ``height`` x ``width``."""
        max_pixels = self.max_pixels
        if self.family == "qwen3_vl":
            if self.cap_pixels_per_frame:
                cap = self.max_video_tokens * self.factor * self.factor
                per_frame = max(min(cap, self.max_pixels // frames), int(self.min_pixels * 1.05))
                max_pixels = per_frame * frames
            return _smart_resize_frames(
                frames,
                height,
                width,
                self.temporal_patch_size,
                self.factor,
                self.min_pixels,
                max_pixels,
            )
        if self.cap_pixels_per_frame:
            total = int(self.max_video_tokens * self.factor * self.factor * 0.9)
            max_pixels = max(
                min(max_pixels, total * self.temporal_patch_size // frames),
                int(self.min_pixels * 1.05),
            )
        return _smart_resize(height, width, self.factor, self.min_pixels, max_pixels)

    def plan(self, header: VideoHeader) -> VideoPlan:
        """Everything the family's processor will make of the video, from its header alone
        (the sampled indices worked out once; the rest follows from them)."""
        indices = tuple(int(i) for i in self.indices(header))
        frames = len(set(indices))  # each sampled frame decodes once
        height, width = self.size(frames, header.height, header.width)
        tps = self.temporal_patch_size
        sampled = len(indices) / header.frames * header.fps if header.fps else 24
        seconds = tps / sampled if self.grid_seconds is None else self.grid_seconds
        return VideoPlan(
            family=self.family,
            header=header,
            indices=indices,
            grid=(-(-frames // tps), height // self.patch_size, width // self.patch_size),
            merge_size=self.merge_size,
            timestamps=_timestamps(indices, header.fps, tps) if self.family == "qwen3_vl" else (),
            second_per_grid=seconds,
        )

    def grid(self, header: VideoHeader) -> tuple[int, int, int]:
        """``video_grid_thw`` of the video, from its header alone."""
        return self.plan(header).grid

    def tokens(self, header: VideoHeader) -> int:
        """Placeholder tokens the video expands to (before Qwen3's timestamps)."""
        return self.plan(header).tokens

    def second_per_grid(self, header: VideoHeader) -> float:
        """Qwen2.5-VL's ``second_per_grid_ts``: temporal patch / sampled fps."""
        return self.plan(header).second_per_grid

    def expansion(
        self, header: VideoHeader, *, video_token: str, vision_start: str, vision_end: str
    ) -> str:
        """:meth:`VideoPlan.expansion` of the video with this header."""
        return self.plan(header).expansion(
            video_token=video_token, vision_start=vision_start, vision_end=vision_end
        )


#: the names that bound a frame's pixels (an Omni processor's own ``size`` passes over them)
_PIXEL_BOUNDS = ("size", "min_pixels", "max_pixels")


def _timestamps(indices: Sequence[int], fps: float, tps: int) -> tuple[float, ...]:
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

    family: str
    header: VideoHeader
    #: the sampled frame indices (ascending; Qwen3 may repeat one)
    indices: tuple[int, ...]
    #: ``video_grid_thw``
    grid: tuple[int, int, int]
    merge_size: int
    #: Qwen3-VL: the time of each temporal patch, in seconds (else empty)
    timestamps: tuple[float, ...] = ()
    #: seconds a temporal patch spans: Qwen2.5-VL's ``second_per_grid_ts``, the Omni thinkers'
    #: ``video_second_per_grid``
    second_per_grid: float = 1.0

    @property
    def frames(self) -> int:
        """Frames decoded: the distinct sampled indices."""
        return len(set(self.indices))

    @property
    def tokens(self) -> int:
        """Video-pad tokens in the text (Qwen3's timestamps and markers come on top)."""
        t, h, w = self.grid
        return t * h * w // (self.merge_size * self.merge_size)

    def expansion(self, *, video_token: str, vision_start: str, vision_end: str) -> str:
        """What the processor puts in place of the video's one ``video_token`` in the rendered
        chat template (which wraps it in ``vision_start`` / ``vision_end`` itself): Qwen2/2.5
        repeat it ``t*h*w/merge**2`` times; Qwen3 writes ``<{seconds:.1f} seconds>`` and one
        ``vision_start video_token*(h*w/merge**2) vision_end`` per temporal patch (5.24 keeps
        the template's outer pair around them)."""
        t, h, w = self.grid
        per_patch = h * w // (self.merge_size * self.merge_size)
        if self.family != "qwen3_vl":
            return video_token * (t * per_patch)
        return "".join(
            f"<{self.timestamps[i]:.1f} seconds>{vision_start}{video_token * per_patch}{vision_end}"
            for i in range(t)
        )

    def rope_grids(self) -> list[tuple[int, int, int]]:
        """The grids ``get_rope_index`` reads for this video, one per run of video tokens:
        Qwen3-VL splits it into ``t`` grids ``(1, h, w)`` (its timestamps separate them)."""
        t, h, w = self.grid
        return [(1, h, w)] * t if self.family == "qwen3_vl" else [self.grid]

    def time_intervals(
        self, tokens_per_second: float | None, *, fractional: bool = True
    ) -> list[float]:
        """The temporal position step of each of :meth:`rope_grids`: Qwen2.5-VL's
        ``tokens_per_second * second_per_grid_ts`` (``fractional=False``: the seconds truncated
        first, ``tokens_per_second * int(second_per_grid_ts)``, transformers before 5.18); 1 for
        the other families."""
        if self.family == "qwen2_5_vl":  # in float32, as the model multiplies them
            seconds = np.float32(self.second_per_grid)
            if not fractional:
                seconds = np.float32(int(seconds))
            return [float(np.float32(tokens_per_second) * seconds)]
        return [1.0] * len(self.rope_grids())

    def time_aligned(self, position_id_per_seconds: float) -> np.ndarray:
        """The Omni thinkers' temporal offset of each temporal patch (:func:`time_offsets`)."""
        return time_offsets(
            self.family, self.grid[0], self.second_per_grid, position_id_per_seconds
        )


def time_offsets(
    family: str, patches: int, second_per_grid: float, position_id_per_seconds: float
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
    if family == "qwen3_omni" and not np.array_equal(offsets, np.floor(offsets)):
        fractional = offsets[offsets != np.floor(offsets)]
        raise ValueError(
            f"qwen3_omni: video_second_per_grid {second_per_grid:g} s x "
            f"position_id_per_seconds {position_id_per_seconds:g} gives fractional temporal "
            f"positions ({float(fractional[0]):g}, ...), which Qwen3-Omni keeps as floats and a "
            f"pack's integer position_ids cannot hold; set video_config['fps'] so that "
            f"temporal_patch_size / fps x position_id_per_seconds is a whole number (the "
            f"processor's default fps 1.0 is)"
        )
    return offsets.astype(np.int64)


#: model input names of a video, per family (what its processor returns)
VIDEO_FIELDS = {
    "qwen2_vl": ("pixel_values_videos", "video_grid_thw"),
    "qwen2_5_vl": ("pixel_values_videos", "video_grid_thw", "second_per_grid_ts"),
    "qwen3_vl": ("pixel_values_videos", "video_grid_thw"),
    "qwen2_5_omni": ("pixel_values_videos", "video_grid_thw", "video_second_per_grid"),
    "qwen3_omni": ("pixel_values_videos", "video_grid_thw", "video_second_per_grid"),
}


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
        self.fields = VIDEO_FIELDS[rule.family]

    def __repr__(self) -> str:
        return f"VideoSide({self.rule.family}, max_frames={self.max_frames})"

    def check_time_aligned(self, position_id_per_seconds: float) -> None:
        """Raises ValueError where an Omni thinker's video positions under these settings
        cannot be packed (:func:`time_offsets`, for as many temporal patches as
        ``max_video_frames`` allows); nothing for the other families."""
        if self.rule.grid_seconds is None:
            return
        patches = -(-self.max_frames // self.rule.temporal_patch_size)
        time_offsets(self.rule.family, patches, self.rule.grid_seconds, position_id_per_seconds)

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


def process(frames: np.ndarray, rule: VideoRule) -> tuple[torch.Tensor, tuple[int, int, int]]:
    """``pixel_values_videos`` (float32 ``[t*h*w, 3*tp*p*p]``) and ``video_grid_thw`` of
    uint8 ``[T, H, W, 3]`` frames, as the family's video processor computes them."""
    video = torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2)  # T, C, H, W
    count, _, height, width = video.shape
    new_h, new_w = rule.size(count, height, width)
    if (new_h, new_w) != (height, width):
        # torchvision's resize on uint8 CPU tensors calls this kernel as it is (bicubic is native)
        video = torch.nn.functional.interpolate(
            video, size=[new_h, new_w], mode="bicubic", align_corners=False, antialias=True
        )
    mean = torch.tensor(rule.mean) * (1.0 / rule.rescale_factor)
    std = torch.tensor(rule.std) * (1.0 / rule.rescale_factor)
    video = video.to(torch.float32)
    video = video.sub_(mean.view(-1, 1, 1)).div_(std.view(-1, 1, 1)).unsqueeze(0)
    tps, p, merge = rule.temporal_patch_size, rule.patch_size, rule.merge_size
    if pad := -count % tps:
        video = torch.cat((video, video[:, -1:].expand(-1, pad, -1, -1, -1)), dim=1)
        count += pad
    t, h, w = count // tps, new_h // p, new_w // p
    patches = video.reshape(1, t, tps, 3, h // merge, merge, p, w // merge, merge, p)
    patches = patches.permute(0, 1, 4, 7, 5, 8, 3, 2, 6, 9)
    return patches.reshape(t * h * w, 3 * tps * p * p), (t, h, w)
