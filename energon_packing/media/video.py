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

This module holds the container side (:func:`probe`, :func:`decode`) and the tensor path
(:func:`process`); the families' rules are :mod:`.video_rules` (:class:`~.video_rules.VideoRule`),
a video's plan :mod:`.video_plan`, a layout's video work :mod:`.video_side`. Torch is imported
by :func:`process` alone, when a pack's videos are processed.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from energon_packing.errors import Skip

if TYPE_CHECKING:
    import torch

    from energon_packing.media.video_rules import VideoRule

__all__ = ["VideoError", "VideoHeader", "decode", "probe", "process", "process_tiles"]


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
    #: seconds, as transformers' PyAV loader computes them: the frames over the stream's exact
    #: (rational) rate, then a float (None: ``frames / fps``, which may differ in the last bit)
    duration: float | None = None

    @property
    def seconds(self) -> float:
        """The clip's length in seconds (0 without a frame rate)."""
        if self.duration is not None:
            return self.duration
        return self.frames / self.fps if self.fps else 0.0


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
                duration=float(frames / rate) if rate else None,
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


def process(frames: np.ndarray, rule: VideoRule) -> tuple[torch.Tensor, tuple[int, int, int]]:
    """``pixel_values_videos`` (float32 ``[t*h*w, 3*tp*p*p]``) and ``video_grid_thw`` of
    uint8 ``[T, H, W, 3]`` frames, as the family's video processor computes them."""
    import torch  # here alone: encoding a conversation (its plan) needs no torch

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


def process_tiles(frames: np.ndarray, rule: VideoRule) -> torch.Tensor:
    """InternVL's ``pixel_values_videos`` of one video (float32 ``[T, 3, height, width]``, a
    tile per frame) from uint8 ``[T, H, W, 3]`` frames: each resized to the rule's
    ``frame_size`` (the kernel :func:`process` uses), then rescaled and normalised fused."""
    import torch

    video = torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2)  # T, C, H, W
    size = list(rule.frame_size)
    if size != list(video.shape[2:]):  # torchvision returns an image of that size as it is
        video = torch.nn.functional.interpolate(
            video, size=size, mode="bicubic", align_corners=False, antialias=True
        )
    mean = torch.tensor(rule.mean) * (1.0 / rule.rescale_factor)
    std = torch.tensor(rule.std) * (1.0 / rule.rescale_factor)
    video = video.to(torch.float32)
    return video.sub_(mean.view(-1, 1, 1)).div_(std.view(-1, 1, 1))
