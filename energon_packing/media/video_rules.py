"""Each video family's processor settings and rules over a video's header
(:class:`VideoRule`): the frames it samples, their size, the grid and the tokens, worked out
before anything is decoded (transformers 5.24's Qwen2-VL, Qwen2.5-VL, Qwen3-VL video
processors, and the Qwen Omni processors over Qwen2-VL's)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from energon_packing.media.video import VideoError, VideoHeader
from energon_packing.media.video_plan import VideoPlan, timestamps
from energon_packing.media.video_styles import VideoStyle
from energon_packing.resize import smart_resize

__all__ = ["VideoRule"]

_MISSING = object()


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


@dataclass(kw_only=True, slots=True, frozen=True, repr=False)
class VideoRule:
    """One family's video processor settings, and its rules over a :class:`VideoHeader`."""

    family: str
    #: how the family's processor treats a video (its registry entry's ``videos``); not in
    #: the repr (the restore check's ``video_rule``): the family names it
    style: VideoStyle = field(repr=False, compare=False)
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
    mean: tuple[float, ...]
    std: tuple[float, ...]
    rescale_factor: float = 1 / 255
    cap_pixels_per_frame: bool = False
    max_video_tokens: int = 128000
    #: the Omni thinkers' ``video_second_per_grid``: temporal patch / the call's fps (the
    #: processor's default where ``video_config`` gives none); None: from the sampled rate.
    #: Not in the repr (the restore check's ``video_rule``, as older releases saved it): the
    #: family and ``video_config`` decide it
    grid_seconds: float | None = field(default=None, repr=False)
    #: InternVL (``VideoStyle.frames_as_tiles``): each frame's (height, width) after its
    #: resize, the video processor's ``size``; its sampling's first step starts
    #: ``initial_shift`` frames in (True: half a step); context tokens per frame (the
    #: processor's ``image_seq_length``). In the repr for such a family only (the restore
    #: check's ``video_rule``, as the Qwen families' rules were saved before them)
    frame_size: tuple[int, int] | None = field(default=None, repr=False)
    initial_shift: bool | float = field(default=True, repr=False)
    tile_tokens: int = field(default=0, repr=False)
    #: GLM-4.1V / 4.5V (``VideoStyle.sampling`` ``"per_second"``): past this many seconds, its
    #: ``max_duration * fps`` frames spread over the clip. In the repr for that family only
    max_duration: float = field(default=300, repr=False)
    #: GLM-4.1V / 4.5V: a clip shorter than one step of ``fps`` still samples one frame
    #: (transformers 5.13 and later); before, none (the processor then fails on it): the
    #: installed release's rule, ``hf_compat.glm_samples_one_frame_at_least``
    one_frame_at_least: bool = field(default=True, repr=False)

    def __repr__(self) -> str:
        shown = ", ".join(
            f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self) if f.repr
        )
        if self.style.frames_as_tiles:
            shown += (
                f", frame_size={self.frame_size!r}, initial_shift={self.initial_shift!r}, "
                f"tile_tokens={self.tile_tokens!r}"
            )
        if self.style.sampling == "per_second":
            shown += f", max_duration={self.max_duration!r}"
        return f"VideoRule({shown})"

    @classmethod
    def of(
        cls,
        style: VideoStyle,
        config: Mapping[str, Any] | Any = None,
        *,
        overrides: Mapping[str, Any] | None = None,
        reads_call_cap: bool = False,
        tile_tokens: int = 0,
        one_frame_at_least: bool = True,
    ) -> VideoRule:
        """``style``'s defaults, overridden by a video processor's settings (its
        ``video_preprocessor_config.json`` as a dict, or the processor object itself), then by
        ``overrides`` (``video_config``, the same names). The Omni processors pass their own
        ``size`` over their video processor's pixel bounds (only ``overrides`` pass over it)
        and state ``video_second_per_grid`` from the call's fps (``overrides``), else their
        default. ``reads_call_cap``: whether the video processor's pixel cap reads a call's
        ``max_video_tokens`` (transformers 5.25+); before, an Omni's ``video_config`` one that
        differs from the video processor's own is refused (its call passes it, unread).
        ``tile_tokens``: a frames-as-tiles family's context tokens per frame (InternVL's
        ``image_seq_length``). ``one_frame_at_least``: GLM-4.1V's sampling takes a frame of a
        clip shorter than its step (transformers 5.13+; before, none)."""
        family = style.name
        values = dict(style.defaults)
        overrides = dict(overrides or {})

        def get(name: str, missing: Any = None) -> Any:
            if name in overrides:
                return overrides[name]
            if omni is not None and name in _PIXEL_BOUNDS:
                return missing
            if isinstance(config, Mapping):
                return config.get(name, missing)
            return getattr(config, name, missing) if config is not None else missing

        omni = style.processor_size
        # an Omni processor passes video_config in its call, and Qwen2VLVideoProcessor's pixel
        # cap reads its own max_video_tokens, not the call's, before transformers 5.25
        unread = omni is not None and not reads_call_cap
        called_cap = overrides.pop("max_video_tokens", _MISSING) if unread else _MISSING
        if omni is not None:  # the processor's size passes over the video processor's
            values.update(min_pixels=omni["min_pixels"], max_pixels=omni["max_pixels"])
        size = get("size")
        if size is not None:
            size = dict(size) if isinstance(size, Mapping) else vars(size)
        if size is not None and style.frames_as_tiles:  # a frame is resized to it, exactly
            if not (size.get("height") and size.get("width")):
                raise ValueError(
                    f"{family}: video size {size}: frames are resized to a height and width "
                    f"(the video processor's size={{'height': ..., 'width': ...}}); other "
                    f"sizes are not supported"
                )
            values["frame_size"] = (int(size["height"]), int(size["width"]))
        elif size is not None and (size.get("height") or size.get("width")):
            raise ValueError(
                f"{family}: video size {size}: {family}'s frames are sized by pixel bounds "
                f"(size={{'shortest_edge': ..., 'longest_edge': ...}}), not to a height and width"
            )
        elif size is not None:
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
            initial_shift="initial_shift",
            max_duration="max_duration",
        )
        for ours, theirs in renames.items():
            value = get(theirs, _MISSING)
            if value is _MISSING or (value is None and ours not in ("fps", "num_frames")):
                continue  # fps / num_frames: None set explicitly means "not this way"
            values[ours] = tuple(value) if ours in ("mean", "std") else value
        for flag in ("do_resize", "do_rescale", "do_normalize", "do_convert_rgb"):
            if get(flag) is False:
                raise ValueError(f"{family}: {flag}=False is not supported for videos")
        if style.frames_as_tiles and get("do_center_crop"):  # Qwen's processors ignore it
            raise ValueError(f"{family}: do_center_crop=True is not supported for videos")
        unread = sorted(set(overrides) & set(style.unread))
        if unread:
            raise ValueError(
                f"video_config {unread}: {family}'s video processor reads none of them "
                f"({style.reads}); cap a video with the "
                f"encoder's own knobs, max_video_frames and max_video_tokens"
            )
        if "max_duration" in overrides and style.sampling != "per_second":
            raise ValueError(
                f"video_config['max_duration'] is GLM-4.1V's sampling; {family}'s video "
                f"processor reads none: leave it out"
            )
        resample = get("resample")
        resample = getattr(resample, "value", resample)
        resample = resample.get("value") if isinstance(resample, Mapping) else resample
        if resample is not None and resample != 3:  # PIL's BICUBIC
            raise ValueError(f"{family}: resample={resample!r}; videos are resized bicubic only")
        if (
            values["sample"]
            and not style.frames_as_tiles  # InternVL's sampling takes num_frames first
            and style.sampling is None  # GLM's reads no num_frames
            and values["fps"] is not None
            and values.get("num_frames") is not None
        ):
            raise ValueError(
                f"{family}: fps={values['fps']} and num_frames={values.get('num_frames')} are "
                f"mutually exclusive (the processor refuses both); set one to None"
            )
        values["one_frame_at_least"] = one_frame_at_least
        if style.frames_as_tiles:
            values["tile_tokens"] = tile_tokens
        elif "initial_shift" in overrides:
            raise ValueError(
                f"video_config['initial_shift'] is InternVL's sampling; {family}'s video "
                f"processor has none: leave it out"
            )
        if (
            values["sample"]
            and not style.timed_patches
            and values["fps"] is None
            and values.get("num_frames") is None
        ):
            raise ValueError(
                f"{family}: do_sample_frames needs fps or num_frames (the processor's defaults "
                f"have neither; qwen-vl-utils samples at fps=2.0)"
            )
        if style.sampling == "per_second" and values["sample"] and not values["fps"]:
            raise ValueError(
                f"{family}: fps={values['fps']!r}: its video processor samples fps frames a "
                f"second; set video_config['fps'] to a positive number (its default is 2)"
            )
        if called_cap is not _MISSING and called_cap != values["max_video_tokens"]:
            raise ValueError(
                f"video_config['max_video_tokens']={called_cap}: {family}'s processor passes "
                f"video_config in its call, and its video processor (Qwen2VLVideoProcessor) caps "
                f"a frame's pixels by its own max_video_tokens ({values['max_video_tokens']}), "
                f"not the call's (before transformers 5.25); set it in the video processor's "
                f"settings (video_preprocessor_config.json), leave it out of video_config, or "
                f"run transformers 5.25 or newer"
            )
        if omni is not None:
            fps = overrides.get("fps") or omni["fps"]
            values["grid_seconds"] = values.get("temporal_patch_size", 2) / fps
        return cls(family=family, style=style, **values)

    @property
    def frame_per_index(self) -> bool:
        """GLM's sampling repeats its last index to an even count for a decoder that returns
        a frame per index (torchcodec, transformers' default): its size rule and its pixels
        take a frame for every index, the repeat included."""
        return self.style.sampling is not None

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
        if self.style.frames_as_tiles:
            return self._shifted(header)
        if self.style.sampling is not None:
            return self._by_seconds(header)
        if self.style.timed_patches:
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
        import torch  # its float arange, as the processor's; imported on first use

        return torch.arange(0, total, total / count).int().numpy()

    def _shifted(self, header: VideoHeader) -> np.ndarray:
        """InternVL's ``sample_frames``: ``num_frames`` (or ``frames / fps x fps``) frames,
        one a step of ``frames / count``, the first ``initial_shift`` in (True: half a step)."""
        total, count = header.frames, self.num_frames
        if count is None:
            if not header.fps:
                raise VideoError("video_no_fps", "sampling by fps needs the stream's frame rate")
            count = int(total / header.fps * self.fps)
        if count <= 0 or count > total:
            raise VideoError("video_too_short", f"{total} frames cannot give {count} samples")
        shift = total / count / 2 if self.initial_shift is True else float(self.initial_shift)
        if shift >= total:  # the processor's arange fails so
            raise VideoError(
                "video_too_short",
                f"{total} frames: sampling starts at frame {shift:g} (initial_shift)",
            )
        import torch  # its float arange, as the processor's; imported on first use

        return torch.arange(shift, total, total / count).int().numpy()

    def _by_seconds(self, header: VideoHeader) -> np.ndarray:
        """GLM's ``sample_frames`` (``VideoStyle.sampling``), each frame once, an odd count
        padded with the last. ``"per_second"`` (GLM-4.1V): ``floor(seconds x fps)`` frames (at least one), the
        i-th at ``ceil(i x stream fps / fps)``; past ``max_duration`` seconds,
        ``max_duration x fps`` spread by ``linspace`` (every frame if that is more).
        ``"by_length"`` (GLM-4.6V): 3, 1 or 0.5 frame pairs a second for clips up to 30 s, 300 s, longer
        (at most 640 frames, 2,400 s), one at each step of that rate, ``linspace`` where the
        steps fall short."""
        total = header.frames
        if not header.fps:
            raise VideoError("video_no_fps", "sampling by seconds needs the stream's frame rate")
        last = total - 1
        duration = header.seconds  # transformers' pyav metadata: frames / the exact rate
        if self.style.sampling == "per_second":
            fps = self.fps
            if duration <= self.max_duration:
                count = math.floor(duration * fps)
                count = max(count, 1) if self.one_frame_at_least else count
                found = [min(last, math.ceil(i * header.fps / fps)) for i in range(count)]
            elif int(self.max_duration * fps) >= total:
                found = list(range(total))
            else:
                seconds = np.linspace(0, duration, int(self.max_duration * fps), endpoint=True)
                found = [min(last, math.ceil(t * header.fps)) for t in seconds]
        else:
            found = self._by_length(total, header.fps, duration)
        uniq = list(dict.fromkeys(found))
        if not uniq:
            raise VideoError(
                "video_too_short",
                f"{total} frames ({duration:.2f} s): {self.family}'s sampling takes none",
            )
        if len(uniq) & 1:
            uniq.append(uniq[-1])
        return np.asarray(uniq, dtype=np.int64)

    def _by_length(self, total: int, fps: float, duration: float) -> list[int]:
        """Glm46VVideoProcessor's frame indices before they are made unique."""
        effective = min(duration, 2400)
        rate = 3 if effective <= 30 else 1 if effective <= 300 else 0.5
        wanted = min(int(effective * rate * self.temporal_patch_size), 640)
        if total < wanted:
            return np.linspace(0, total - 1, wanted, dtype=int).tolist()
        found: list[int] = []
        current, step, most = 0, 1 / (self.temporal_patch_size * rate), int(duration)
        per_frame = 1 / fps
        for index in range(total):
            if index * per_frame >= current:
                current += step
                found.append(index)
                if current >= most:
                    break
        if len(found) < wanted:
            start, end = (found[0], found[-1]) if found else (0, max(total - 1, 0))
            return np.linspace(start, end, wanted, dtype=int).tolist()
        if len(found) > wanted:
            return np.linspace(0, total - 1, wanted, dtype=int).tolist()
        return found

    def size(self, frames: int, height: int, width: int) -> tuple[int, int]:
        """The resized frame size for ``frames`` sampled frames of ``height`` x ``width``."""
        if self.frame_size is not None:
            return self.frame_size
        max_pixels = self.max_pixels
        if self.style.timed_patches:
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
        # each sampled frame decodes once, or once per index (GLM: frame_per_index)
        frames = len(indices) if self.frame_per_index else len(set(indices))
        height, width = self.size(frames, header.height, header.width)
        if self.style.frames_as_tiles:  # no temporal patches: a frame is a tile
            return VideoPlan(
                style=self.style,
                header=header,
                indices=indices,
                grid=(len(indices), height, width),
                merge_size=1,
                tile_tokens=self.tile_tokens,
            )
        tps = self.temporal_patch_size
        sampled = len(indices) / header.frames * header.fps if header.fps else 24
        seconds = tps / sampled if self.grid_seconds is None else self.grid_seconds
        return VideoPlan(
            style=self.style,
            header=header,
            indices=indices,
            grid=(-(-frames // tps), height // self.patch_size, width // self.patch_size),
            merge_size=self.merge_size,
            timestamps=self._timestamps(indices, header.fps, -(-frames // tps)),
            second_per_grid=seconds,
        )

    def _timestamps(self, indices: tuple[int, ...], fps: float, patches: int) -> tuple:
        """Each temporal patch's time: Qwen3-VL's (:func:`.video_plan.timestamps`); GLM's, its
        first frame's seconds (the processor's ``metadata.timestamps[::2]``, fps 24 where the
        stream gives none); none for the other families."""
        if self.style.stamp is not None:
            seconds = [i / (fps or 24) for i in indices[:: self.temporal_patch_size]]
            seconds = seconds[:patches]
            return tuple(seconds + seconds[-1:] * (patches - len(seconds)))
        if self.style.timed_patches:
            return timestamps(indices, fps, self.temporal_patch_size)
        return ()

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
