"""Write the small synthetic test clips of this folder (deterministic, seeded).

Run with the project venv (needs only ``av`` and numpy)::

    .venv/bin/python tests/data/video/make_clips.py

Each clip is a moving colour gradient plus seeded, coarse noise blocks that drift across the
frame and a bright square that moves every frame, so every frame differs from its neighbours
(frame sampling is visible in the pixels) while the clip still compresses to a few tens of KB.

Reproducibility: the same PyAV/FFmpeg build writes the same bytes, whatever the process
did before (checked from two venvs and two folders). That takes: RGB -> yuv420p done here in
integer numpy (not by swscale inside ``encode``), every byte of each frame buffer set (row
padding included), libx264 with ``asm=0`` and one thread (with its SIMD code on, a clip's
bytes changed with the clips encoded before it in the same process), libvpx with one thread
and no lag, and the muxers in ``bitexact`` mode (no random Matroska UIDs, no dates).

``reference.json`` (made by ``make_reference.py``) is tied to the exact bytes of these files
and records each clip's sha256: a rebuilt clip whose hash differs needs a new reference.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from fractions import Fraction

import av
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


@dataclass(frozen=True)
class Clip:
    name: str  # file name in this folder
    codec: str  # PyAV encoder name
    width: int
    height: int
    fps: int
    n_frames: int
    seed: int
    options: tuple[tuple[str, str], ...] = ()


H264 = (
    ("crf", "30"),
    ("preset", "medium"),
    (
        "x264-params",
        "asm=0:threads=1:lookahead-threads=1:sync-lookahead=0:rc-lookahead=10:bframes=2",
    ),
)
VP9 = (
    ("crf", "40"),
    ("b", "0"),
    ("deadline", "good"),
    ("cpu-used", "4"),
    ("threads", "1"),
    ("row-mt", "0"),
    ("lag-in-frames", "0"),
    ("auto-alt-ref", "0"),
)

CLIPS = (
    Clip("h264_48x36_10fps_2s.mp4", "libx264", 48, 36, 10, 20, 1, H264),
    Clip("h264_160x120_24fps_3s.mp4", "libx264", 160, 120, 24, 72, 2, H264),
    Clip("h264_224x160_30fps_1.5s.mp4", "libx264", 224, 160, 30, 45, 3, H264),
    # 0.9 s at 25 fps rounds up to an odd frame count (23 frames = 0.92 s)
    Clip("h264_100x60_25fps_23f.mp4", "libx264", 100, 60, 25, 23, 4, H264),
    Clip("h264_portrait_90x160_15fps_4s.mp4", "libx264", 90, 160, 15, 60, 5, H264),
    Clip("vp9_128x96_20fps_2.5s.webm", "libvpx-vp9", 128, 96, 20, 50, 6, VP9),
    Clip("h264_64x64_12fps_5s.mkv", "libx264", 64, 64, 12, 60, 7, H264),
    Clip("h264_120x80_30fps_1s.mov", "libx264", 120, 80, 30, 30, 8, H264),
)


def frames(clip: Clip):
    """Yield ``n_frames`` RGB uint8 frames (H, W, 3)."""
    rng = np.random.default_rng(clip.seed)
    h, w, n = clip.height, clip.width, clip.n_frames
    # coarse noise texture (8x8-pixel blocks), about twice the frame size so it can drift
    block = 8
    tex = rng.integers(0, 256, size=(2 * h // block + 2, 2 * w // block + 2, 3), dtype=np.uint8)
    tex = np.repeat(np.repeat(tex, block, axis=0), block, axis=1).astype(np.float32)
    phase = rng.uniform(0, 2 * np.pi, size=3)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    side = max(4, min(h, w) // 6)
    for t in range(n):
        red = np.sin(2 * np.pi * (xx / w + t / n) + phase[0])
        green = np.sin(2 * np.pi * (yy / h - 2 * t / n) + phase[1])
        blue = np.sin(2 * np.pi * ((xx + yy) / (w + h) + 3 * t / n) + phase[2])
        grad = 127.5 + 127.5 * np.stack([red, green, blue], axis=-1)
        dy, dx = (2 * t) % h, (3 * t) % w
        img = 0.65 * grad + 0.35 * tex[dy : dy + h, dx : dx + w]
        # a bright square that moves one step per frame: an unambiguous frame marker
        y0, x0 = (3 * t + h // 3) % (h - side), (5 * t + w // 2) % (w - side)
        img[y0 : y0 + side, x0 : x0 + side] = 255.0
        yield np.clip(np.rint(img), 0, 255).astype(np.uint8)


def rgb_to_yuv420p(rgb: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """BT.601 limited-range RGB -> the Y, U, V planes of yuv420p (uint8), in integers."""
    h, w, _ = rgb.shape
    c = rgb.astype(np.int32)
    r, g, b = c[..., 0], c[..., 1], c[..., 2]
    y = ((66 * r + 129 * g + 25 * b + 128) >> 8) + 16
    # chroma from the rounded 2x2 block mean
    m = (c.reshape(h // 2, 2, w // 2, 2, 3).sum(axis=(1, 3)) + 2) >> 2
    r, g, b = m[..., 0], m[..., 1], m[..., 2]
    u = ((-38 * r - 74 * g + 112 * b + 128) >> 8) + 128
    v = ((112 * r - 94 * g - 18 * b + 128) >> 8) + 128
    return tuple(np.clip(p, 0, 255).astype(np.uint8) for p in (y, u, v))


def yuv_frame(planes: tuple[np.ndarray, np.ndarray, np.ndarray]) -> av.VideoFrame:
    """A yuv420p frame whose every byte is set, the row padding (``line_size > width``) too:
    ``VideoFrame.from_ndarray`` leaves the padding uninitialized, and an encoder's SIMD row
    copies may read it."""
    h, w = planes[0].shape
    frame = av.VideoFrame(w, h, "yuv420p")
    for plane, data in zip(frame.planes, planes):
        padded = np.zeros((data.shape[0], plane.line_size), dtype=np.uint8)
        padded[:, : data.shape[1]] = data
        plane.update(padded.tobytes())
    return frame


def write(clip: Clip, path: str) -> None:
    with av.open(path, mode="w", options={"fflags": "+bitexact"}) as container:
        stream = container.add_stream(clip.codec, rate=clip.fps)
        stream.width = clip.width
        stream.height = clip.height
        stream.pix_fmt = "yuv420p"
        stream.time_base = Fraction(1, clip.fps)
        stream.options = dict(clip.options)
        stream.thread_count = 1
        for i, rgb in enumerate(frames(clip)):
            frame = yuv_frame(rgb_to_yuv420p(rgb))
            frame.pts = i
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def main() -> None:
    total = 0
    for clip in CLIPS:
        path = os.path.join(HERE, clip.name)
        write(clip, path)
        size = os.path.getsize(path)
        total += size
        with open(path, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        print(f"{clip.name:40s} {size:8d} B  sha256={digest[:16]}")
        assert size < 150_000, f"{clip.name} is {size} bytes"
    print(f"total {total} B (av {av.__version__}, FFmpeg {av.ffmpeg_version_info})")
    assert total < 800_000, total


if __name__ == "__main__":
    main()
