"""Packs as text and as a picture: one coloured segment per conversation, images, videos and
padding marked, ``source_ids`` labelled.

    pack 2  2048 tokens, 5 conversations, 99.2 % real
      [     0,    520)  video000020        518 real    2 pad   1 video  (3x26x22 at [     6,    435))
      [   520,    912)  video000004        387 real    5 pad   1 image  (1x4x4)   1 video  (2x20x28 at [   533,    813))
      [  1304,   1688)  video000011        377 real    7 pad
      ...

Image tokens are hatched ``////`` in the picture, video tokens ``xxxx`` in a darker shade,
audio tokens ``....``; the text gives each audio clip's token span (``1 audio  (38 at [ 12, 50))``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from energon_packing.schema import IMAGE_GRID_THW, VIDEO_GRID_THW, pack_from_batch

__all__ = ["Layout", "Segment", "describe", "draw", "fill", "pack_segments"]


@dataclass(kw_only=True, slots=True)
class Segment:
    key: str
    start: int
    real_end: int
    padded_end: int
    images: list[tuple[int, int]] = field(default_factory=list)  # image-pad token runs
    grids: list[tuple[int, int, int]] = field(default_factory=list)
    videos: list[tuple[int, int]] = field(default_factory=list)  # video-pad token runs
    video_grids: list[tuple[int, int, int]] = field(default_factory=list)
    audios: list[tuple[int, int]] = field(default_factory=list)  # audio-token runs


@dataclass(kw_only=True, slots=True)
class Layout:
    capacity: int
    segments: list[Segment]

    @property
    def real_tokens(self) -> int:
        return sum(s.real_end - s.start for s in self.segments)

    @property
    def image_tokens(self) -> int:
        return sum(b - a for s in self.segments for a, b in s.images)

    @property
    def video_tokens(self) -> int:
        return sum(b - a for s in self.segments for a, b in s.videos)

    @property
    def audio_tokens(self) -> int:
        return sum(b - a for s in self.segments for a, b in s.audios)


def _runs(mask: np.ndarray, offset: int) -> list[tuple[int, int]]:
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(np.int8), [0]])))
    return [(offset + int(a), offset + int(b)) for a, b in zip(edges[::2], edges[1::2])]


def pack_segments(
    batch: dict,
    row: int,
    *,
    image_pad_id: int | None,
    video_pad_id: int | None = None,
    audio_pad_id: int | None = None,
) -> Layout:
    """The segments of pack ``row`` of a prepacked batch (image grids where the family has
    them: Qwen2-VL's ``image_grid_thw``; else ``1x1x1`` per image), with each conversation's
    runs of image-pad, (given ``video_pad_id``) video-pad tokens and ``video_grid_thw``, and
    (given ``audio_pad_id``) audio tokens: one run per clip."""
    pack = pack_from_batch(batch, row)
    ids = pack.input_ids
    cu, cup = pack.cu_seqlens.tolist(), pack.cu_seqlens_padded.tolist()
    owners = pack.image_source_index.tolist()
    grids = (
        pack.media[IMAGE_GRID_THW].tolist()
        if IMAGE_GRID_THW in pack.media
        else [[1, 1, 1]] * len(owners)
    )
    video_owners = pack.video_source_index.tolist()
    video_grids = (
        pack.media[VIDEO_GRID_THW].tolist()
        if VIDEO_GRID_THW in pack.media
        else [[1, 1, 1]] * len(video_owners)
    )
    segments = []
    for k, key in enumerate(pack.source_ids):
        start, real = cup[k], cu[k + 1] - cu[k]
        own = ids[start : start + real]
        segments.append(
            Segment(
                key=key,
                start=start,
                real_end=start + real,
                padded_end=cup[k + 1],
                images=_runs(own == image_pad_id, start) if image_pad_id is not None else [],
                grids=[tuple(g) for g, o in zip(grids, owners) if o == k],
                videos=_runs(own == video_pad_id, start) if video_pad_id is not None else [],
                video_grids=[tuple(g) for g, o in zip(video_grids, video_owners) if o == k],
                audios=_runs(own == audio_pad_id, start) if audio_pad_id is not None else [],
            )
        )
    return Layout(capacity=ids.shape[0], segments=segments)


def fill(pack: Layout) -> str:
    """How full a pack is, as the text and the picture both print it (``98.7 %``)."""
    return f"{100 * pack.real_tokens / pack.capacity:.1f} %"


def _plural(word: str, count: int) -> str:
    return f"{count} {word}{'s' if count != 1 else ''}"


def describe(layouts: Sequence[Layout]) -> str:
    """The packs as text: one line per pack, one per conversation (its span, real and padding
    tokens, its images' grids, and its videos' grids with the span of their video tokens)."""
    lines = []
    for n, pack in enumerate(layouts):
        lines.append(
            f"pack {n}  {pack.capacity} tokens, {len(pack.segments)} conversations, "
            f"{fill(pack)} real"
        )
        for s in pack.segments:
            grids = ", ".join("x".join(map(str, g)) for g in s.grids)
            images = f"   {_plural('image', len(s.grids))}  ({grids})" if s.grids else ""
            videos = ""
            if s.video_grids:
                spans = [f" at [{a:>6}, {b:>6})" for a, b in s.videos]
                if len(spans) != len(s.video_grids):  # no video-pad id given, or runs merged
                    spans = [""] * len(s.video_grids)
                clips = ", ".join(
                    "x".join(map(str, g)) + span for g, span in zip(s.video_grids, spans)
                )
                videos = f"   {_plural('video', len(s.video_grids))}  ({clips})"
            audios = ""
            if s.audios:
                spans = ", ".join(f"{b - a} at [{a:>6}, {b:>6})" for a, b in s.audios)
                audios = f"   {len(s.audios)} audio  ({spans})"
            lines.append(
                f"  [{s.start:>6}, {s.padded_end:>6})  {s.key:<16}{s.real_end - s.start:>6} real"
                f"{s.padded_end - s.real_end:>5} pad{images}{videos}{audios}"
            )
    return "\n".join(lines)


def _darker(colour: tuple[float, ...]) -> tuple[float, ...]:
    """The conversation's colour at 55 % brightness: its video tokens."""
    return tuple(0.55 * c for c in colour[:3])


def draw(layouts: Sequence[Layout], path: Path | str, *, title: str = "") -> Path:
    """Writes a PNG: one bar per pack, one colour per conversation; image tokens hatched
    ``////``, video tokens hatched ``xxxx`` in a darker shade, audio tokens dotted ``....``,
    padding grey."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    path = Path(path)
    height = 0.8
    fig, ax = plt.subplots(figsize=(12, 0.65 * len(layouts) + 1.6), dpi=110)
    colours = plt.get_cmap("tab20").colors
    for row, pack in enumerate(layouts):
        y = len(layouts) - 1 - row
        ax.broken_barh(
            [(0, pack.capacity)],
            (y - height / 2, height),
            facecolors="#d9d9d9",
            edgecolor="#999999",
            linewidth=0.5,
        )
        for k, s in enumerate(pack.segments):
            colour = colours[(2 * k) % len(colours)]
            ax.broken_barh(
                [(s.start, s.real_end - s.start)],
                (y - height / 2, height),
                facecolors=colour,
                edgecolor="white",
                linewidth=0.8,
            )
            for a, b in s.images:
                ax.broken_barh(
                    [(a, b - a)],
                    (y - height / 2, height),
                    facecolors=colours[(2 * k + 1) % len(colours)],
                    hatch="////",
                    edgecolor="black",
                    linewidth=0.0,
                )
            for a, b in s.videos:
                ax.broken_barh(
                    [(a, b - a)],
                    (y - height / 2, height),
                    facecolors=_darker(colours[(2 * k) % len(colours)]),
                    hatch="xxxx",
                    edgecolor="white",
                    linewidth=0.0,
                )
            for a, b in s.audios:
                ax.broken_barh(
                    [(a, b - a)],
                    (y - height / 2, height),
                    facecolors=colours[(2 * k + 1) % len(colours)],
                    hatch="....",
                    edgecolor="black",
                    linewidth=0.0,
                )
            if s.real_end - s.start > pack.capacity / 40:
                ax.text(
                    (s.start + s.real_end) / 2,
                    y,
                    s.key.removeprefix("sample").removeprefix("video"),
                    ha="center",
                    va="center",
                    fontsize=6,
                    rotation=90 if s.real_end - s.start < pack.capacity / 12 else 0,
                    # readable over the dark video tokens
                    bbox=dict(facecolor="white", alpha=0.7, pad=0.6, linewidth=0)
                    if s.videos
                    else None,
                )
        ax.text(
            pack.capacity * 1.005,
            y,
            fill(pack),  # as the text says it
            va="center",
            fontsize=8,
        )
    ax.set_yticks(
        range(len(layouts)),
        [f"pack {len(layouts) - 1 - i}" for i in range(len(layouts))],
        fontsize=8,
    )
    ax.set_xlim(0, layouts[0].capacity * 1.07 if layouts else 1)
    ax.set_xlabel("token position in the pack")
    handles = [
        Patch(facecolor=colours[0], label="conversation (one colour each)"),
        Patch(facecolor=colours[1], hatch="////", label="image tokens"),
    ]
    if any(s.videos for pack in layouts for s in pack.segments):
        handles.append(
            Patch(facecolor=_darker(colours[0]), hatch="xxxx", ec="white", label="video tokens")
        )
    if any(s.audios for pack in layouts for s in pack.segments):
        handles.append(Patch(facecolor=colours[1], hatch="....", ec="black", label="audio tokens"))
    handles.append(Patch(facecolor="#d9d9d9", label="padding / tail"))
    ax.legend(
        handles=handles,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.12 - 0.3 / max(len(layouts), 1)),
        ncol=len(handles),
        fontsize=8,
    )
    ax.set_title(title or "energon_packing: loader packs", fontsize=10)
    for spine in ("top", "right"):
        ax.spines[spine].set_visible(False)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
