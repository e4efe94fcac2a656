"""Synthetic conversations with videos, that this project generates and owns.

Short h264 clips of one shape moving across a plain background (:class:`Motion`,
:func:`encode_clip`; 1-3 s at 8-12 fps, 64x48 to 160x96, a few KB each), with questions about
the motion that the answers get right (:func:`video_conversations`, mixed with the image and
text conversations of :mod:`.synth`). The clips are written with
``tests/data/video/make_clips.py``'s bit-exact settings, so the same PyAV/FFmpeg build writes
the same bytes. Used by ``sample_data/video``, the tests and ``benchmarks/loader_video.py``.
"""

from __future__ import annotations

import io
import random
from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from energon_packing.testing.synth import (
    BACKGROUNDS,
    COLORS,
    SHAPES,
    SYSTEM_PROMPTS,
    Conversation,
    Scene,
    Shape,
    _where,
    conversation,
    draw,
    encode_image,
)

__all__ = [
    "Motion",
    "encode_clip",
    "random_motion",
    "video_conversation",
    "video_conversations",
    "without_videos",
]

#: libx264 as ``tests/data/video/make_clips.py`` runs it: no SIMD and one thread (with SIMD on,
#: a clip's bytes changed with the clips encoded before it in the same process).
H264_OPTIONS = {
    "crf": "30",
    "preset": "medium",
    "x264-params": "asm=0:threads=1:lookahead-threads=1:sync-lookahead=0:rc-lookahead=10:bframes=2",
}


_STOPS = (0.2, 0.5, 0.8)


@dataclass(kw_only=True, slots=True)
class Motion:
    """One clip: a shape moving in a straight line, at a steady speed, over a plain background.

    Sizes are even (yuv420p halves the chroma planes); ``start`` and ``end`` are the shape's
    centre as fractions of the width and height.
    """

    width: int
    height: int
    fps: int
    frames: int
    background: str
    kind: str
    color: str
    size: float  # as a fraction of the shorter side
    start: tuple[float, float]
    end: tuple[float, float]

    @property
    def seconds(self) -> float:
        return self.frames / self.fps

    def scene(self, frame: int) -> Scene:
        """The picture of frame ``frame`` (the shape on its way from ``start`` to ``end``)."""
        t = frame / max(self.frames - 1, 1)
        x = self.start[0] + t * (self.end[0] - self.start[0])
        y = self.start[1] + t * (self.end[1] - self.start[1])
        return Scene(
            width=self.width,
            height=self.height,
            background=self.background,
            shapes=[Shape(kind=self.kind, color=self.color, x=x, y=y, size=self.size)],
        )


def random_motion(rng: random.Random) -> Motion:
    """A clip of 1-3 s at 8-12 fps, 64x48 to 160x96, whose shape crosses into another part of
    the frame (start and end name different places)."""
    fps = rng.choice((8, 10, 12))
    seconds = rng.choice((1.0, 1.5, 2.0, 2.5, 3.0))
    start = end = (0.0, 0.0)
    while _where_xy(start) == _where_xy(end):
        start = (rng.choice(_STOPS), rng.choice(_STOPS))
        end = (rng.choice(_STOPS), rng.choice(_STOPS))
    return Motion(
        width=rng.choice((64, 80, 96, 128, 160)),
        height=rng.choice((48, 64, 80, 96)),
        fps=fps,
        frames=round(seconds * fps),
        background=rng.choice(list(BACKGROUNDS)),
        kind=rng.choice(SHAPES),
        color=rng.choice([c for c in COLORS if c not in ("white", "gray")]),
        size=rng.uniform(0.25, 0.4),
        start=start,
        end=end,
    )


def _where_xy(point: tuple[float, float]) -> str:
    return _where(Shape(kind="", color="", x=point[0], y=point[1], size=0.0))


def _place(point: tuple[float, float]) -> str:
    """Where a point is, as a noun phrase: ``the top left``, ``the left side``, ``the centre``."""
    x, y = point
    vertical = "top" if y < 0.4 else ("bottom" if y > 0.6 else "")
    horizontal = "left" if x < 0.4 else ("right" if x > 0.6 else "")
    if vertical and horizontal:
        return f"the {vertical} {horizontal}"
    if horizontal:
        return f"the {horizontal} side"
    return f"the {vertical}" if vertical else "the centre"


def _rgb_to_yuv420p(rgb: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """BT.601 limited-range RGB -> yuv420p planes, in integers (make_clips.py's conversion:
    not swscale's, whose SIMD paths may differ between machines)."""
    h, w, _ = rgb.shape
    c = rgb.astype(np.int32)
    r, g, b = c[..., 0], c[..., 1], c[..., 2]
    y = ((66 * r + 129 * g + 25 * b + 128) >> 8) + 16
    m = (c.reshape(h // 2, 2, w // 2, 2, 3).sum(axis=(1, 3)) + 2) >> 2  # rounded 2x2 mean
    r, g, b = m[..., 0], m[..., 1], m[..., 2]
    u = ((-38 * r - 74 * g + 112 * b + 128) >> 8) + 128
    v = ((112 * r - 94 * g - 18 * b + 128) >> 8) + 128
    return tuple(np.clip(p, 0, 255).astype(np.uint8) for p in (y, u, v))


def _yuv_frame(planes: tuple[np.ndarray, np.ndarray, np.ndarray]) -> Any:
    """A yuv420p ``av.VideoFrame`` whose every byte is set, the row padding too."""
    import av

    h, w = planes[0].shape
    frame = av.VideoFrame(w, h, "yuv420p")
    for plane, data in zip(frame.planes, planes):
        padded = np.zeros((data.shape[0], plane.line_size), dtype=np.uint8)
        padded[:, : data.shape[1]] = data
        plane.update(padded.tobytes())
    return frame


def encode_clip(motion: Motion) -> bytes:
    """The clip as h264 in MP4 (a few KB): the same bytes for the same motion and PyAV build."""
    import av

    if motion.width % 2 or motion.height % 2:
        raise ValueError(f"yuv420p needs an even size, got {motion.width}x{motion.height}")
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format="mp4", options={"fflags": "+bitexact"}) as container:
        stream = container.add_stream("libx264", rate=motion.fps)
        stream.width, stream.height = motion.width, motion.height
        stream.pix_fmt = "yuv420p"
        stream.time_base = Fraction(1, motion.fps)
        stream.options = dict(H264_OPTIONS)
        stream.thread_count = 1
        for index in range(motion.frames):
            rgb = np.asarray(draw(motion.scene(index)), dtype=np.uint8)
            frame = _yuv_frame(_rgb_to_yuv420p(rgb))
            frame.pts = index
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buffer.getvalue()


def _direction(motion: Motion) -> str:
    dx, dy = motion.end[0] - motion.start[0], motion.end[1] - motion.start[1]
    across = "to the right" if dx > 0 else "to the left"
    vertical = "down" if dy > 0 else "up"
    if dx and dy:
        return f"diagonally {vertical} and {across}"
    return across if dx else f"straight {vertical}"


def _seconds(motion: Motion) -> str:
    value = f"{motion.seconds:g}"
    return f"{value} {'second' if value == '1' else 'seconds'}"


def describe_motion(motion: Motion, rng: random.Random) -> str:
    """A caption of the clip, true to it."""
    opening = rng.choice(
        (
            f"The clip lasts {_seconds(motion)} and is {motion.width} by {motion.height} pixels, "
            f"on a {motion.background} background.",
            f"This is a {_seconds(motion)} video ({motion.frames} frames at {motion.fps} frames "
            f"per second) with a {motion.background} background.",
        )
    )
    return (
        f"{opening} A {motion.color} {motion.kind} starts {_where_xy(motion.start)} and moves "
        f"{_direction(motion)} at a steady speed until it is {_where_xy(motion.end)}. Nothing "
        f"else moves."
    )


def motion_question(motion: Motion, rng: random.Random) -> tuple[str, str]:
    """One question about the clip and its answer."""
    kind = rng.choice(("direction", "end", "start", "color", "length", "shape"))
    if kind == "direction":
        return (
            f"Which way does the {motion.color} {motion.kind} move?",
            f"It moves {_direction(motion)}, from {_place(motion.start)} to {_place(motion.end)}.",
        )
    if kind == "end":
        return (
            f"Where does the {motion.kind} end up?",
            f"At the end of the clip the {motion.kind} is {_where_xy(motion.end)}.",
        )
    if kind == "start":
        return (
            "Where is the moving shape in the first frame?",
            f"In the first frame the {motion.color} {motion.kind} is {_where_xy(motion.start)}.",
        )
    if kind == "color":
        return ("What colour is the shape that moves?", f"It is {motion.color}.")
    if kind == "length":
        return (
            "How long is the video?",
            f"It lasts {_seconds(motion)}: {motion.frames} frames at {motion.fps} frames per "
            f"second.",
        )
    return (
        "What kind of shape moves in the video?",
        f"A {motion.kind}, coloured {motion.color}.",
    )


def video_conversation(
    rng: random.Random, key: str, *, clip: str = "clip.mp4", still: bool = False
) -> Conversation:
    """A conversation about one clip: a question about the motion (or a caption request), its
    answer, 0-2 follow-up questions; both content styles (``<video>`` strings and
    ``{"type": "video"}`` parts). With ``still``, the clip's first frame also comes as an image
    (``still.png``)."""
    motion = random_motion(rng)
    hf_style = rng.random() < 0.5
    videos = {clip: encode_clip(motion)}
    images = {"still.png": encode_image(draw(motion.scene(0)), "png")} if still else {}
    messages: list[dict] = []
    if rng.random() < 0.3:
        messages.append({"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
    lead = rng.choice(("Watch this clip.", "Here is a short video.", ""))
    if still:
        lead = "Here is the first frame and the whole clip."
    question, answer = (
        ("Describe what happens in the video.", describe_motion(motion, rng))
        if rng.random() < 0.5
        else motion_question(motion, rng)
    )
    text = f"{lead} {question}".strip()
    if hf_style:
        content: list[dict] = [{"type": "image", "image": name} for name in images]
        content += [{"type": "video", "video": clip}, {"type": "text", "text": text}]
        messages.append({"role": "user", "content": content})
    else:
        placeholders = "<image>\n" * len(images) + "<video>\n"
        messages.append({"role": "user", "content": placeholders + text})
    messages.append({"role": "assistant", "content": answer})
    for _ in range(rng.choice((0, 0, 1, 2))):
        question, answer = motion_question(motion, rng)
        messages.append({"role": "user", "content": question})
        messages.append({"role": "assistant", "content": answer})
    return Conversation(
        key=key,
        document={"messages": messages, "images": list(images), "videos": [clip]},
        images=images,
        videos=videos,
    )


def video_conversations(
    n: int, *, seed: int, prefix: str = "video", every: int = 2
) -> Iterator[Conversation]:
    """``n`` conversations, every ``every``-th (from the first) about a clip (a quarter of those
    with the clip's first frame as an image too), the others :func:`conversation`'s mix of
    0-2 images and text only."""
    rng = random.Random(seed)
    for index in range(n):
        key = f"{prefix}{index:06d}"
        if index % every == 0:
            yield video_conversation(rng, key, still=rng.random() < 0.25)
        else:
            yield conversation(rng, key, max_images=2)


def without_videos(item: Conversation) -> Conversation:
    """The same conversation without its videos: the video parts and the ``videos`` list
    dropped, each ``<video>`` and ``{"type": "video"}`` reference replaced by the words
    ``(a video)``; the text and the images unchanged."""
    messages = []
    for message in item.document["messages"]:
        content = message["content"]
        if isinstance(content, str):
            content = content.replace("<video>", "(a video)")
        else:
            content = [
                {"type": "text", "text": "(a video)"} if part.get("type") == "video" else part
                for part in content
            ]
        messages.append({**message, "content": content})
    document = {k: v for k, v in item.document.items() if k != "videos"}
    document["messages"] = messages
    return Conversation(key=item.key, document=document, images=dict(item.images))


def with_sound(video: bytes, sound: bytes) -> bytes:
    """``video`` (an MP4) with ``sound``'s audio stream (an M4A, AAC) muxed beside its own
    stream, packets copied (nothing re-encoded): a video with its own audio track."""
    import av

    out = io.BytesIO()
    with (
        av.open(io.BytesIO(video)) as frames,
        av.open(io.BytesIO(sound)) as heard,
        av.open(out, mode="w", format="mp4", options={"fflags": "+bitexact"}) as muxed,
    ):
        sources = [(frames, frames.streams.video[0]), (heard, heard.streams.audio[0])]
        # every stream before the first packet: the header is written with the first
        targets = [muxed.add_stream_from_template(stream) for _, stream in sources]
        for (container, stream), target in zip(sources, targets):
            for packet in container.demux(stream):
                if packet.dts is not None:  # the demuxer's final empty packet
                    packet.stream = target
                    muxed.mux(packet)
    return out.getvalue()
