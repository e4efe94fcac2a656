"""Packs as text and as a picture: one coloured segment per conversation, images and padding
marked, ``source_ids`` labelled.

    pack 0  2048 tokens, 6 conversations, 94.5 % real
      [    0,  872)  sample000012   867 real   2 images  (1x16x22, 1x8x8)
      ...
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from energon_packing.schema import IMAGE_GRID_THW, pack_from_batch

__all__ = ["Layout", "Segment", "describe", "draw", "fill", "pack_segments"]


@dataclass(kw_only=True, slots=True)
class Segment:
    key: str
    start: int
    real_end: int
    padded_end: int
    images: list[tuple[int, int]] = field(default_factory=list)  # image-pad token runs
    grids: list[tuple[int, int, int]] = field(default_factory=list)


@dataclass(kw_only=True, slots=True)
class Layout:
    capacity: int
    segments: list[Segment]

    @property
    def real_tokens(self) -> int:
        return sum(s.real_end - s.start for s in self.segments)


def _runs(mask: np.ndarray, offset: int) -> list[tuple[int, int]]:
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(np.int8), [0]])))
    return [(offset + int(a), offset + int(b)) for a, b in zip(edges[::2], edges[1::2])]


def pack_segments(batch: dict, row: int, *, image_pad_id: int | None) -> Layout:
    """The segments of pack ``row`` of a prepacked batch (image grids where the family has
    them: Qwen2-VL's ``image_grid_thw``; else ``1x1x1`` per image)."""
    pack = pack_from_batch(batch, row)
    ids = pack.input_ids
    cu, cup = pack.cu_seqlens.tolist(), pack.cu_seqlens_padded.tolist()
    owners = pack.image_source_index.tolist()
    grids = (
        pack.media[IMAGE_GRID_THW].tolist()
        if IMAGE_GRID_THW in pack.media
        else [[1, 1, 1]] * len(owners)
    )
    segments = []
    for k, key in enumerate(pack.source_ids):
        start, real = cup[k], cu[k + 1] - cu[k]
        segments.append(
            Segment(
                key=key,
                start=start,
                real_end=start + real,
                padded_end=cup[k + 1],
                images=_runs(ids[start : start + real] == image_pad_id, start)
                if image_pad_id is not None
                else [],
                grids=[tuple(g) for g, o in zip(grids, owners) if o == k],
            )
        )
    return Layout(capacity=ids.shape[0], segments=segments)


def fill(pack: Layout) -> str:
    """How full a pack is, as the text and the picture both print it (``98.7 %``)."""
    return f"{100 * pack.real_tokens / pack.capacity:.1f} %"


def describe(layouts: Sequence[Layout]) -> str:
    lines = []
    for n, pack in enumerate(layouts):
        lines.append(
            f"pack {n}  {pack.capacity} tokens, {len(pack.segments)} conversations, "
            f"{fill(pack)} real"
        )
        for s in pack.segments:
            grids = ", ".join("x".join(map(str, g)) for g in s.grids)
            images = (
                f"   {len(s.grids)} image{'s' if len(s.grids) != 1 else ''}  ({grids})"
                if s.grids
                else ""
            )
            lines.append(
                f"  [{s.start:>6}, {s.padded_end:>6})  {s.key:<16}{s.real_end - s.start:>6} real"
                f"{s.padded_end - s.real_end:>5} pad{images}"
            )
    return "\n".join(lines)


def draw(layouts: Sequence[Layout], path: Path | str, *, title: str = "") -> Path:
    """Writes a PNG: one bar per pack, one colour per conversation; image tokens hatched,
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
            if s.real_end - s.start > pack.capacity / 40:
                ax.text(
                    (s.start + s.real_end) / 2,
                    y,
                    s.key.removeprefix("sample"),
                    ha="center",
                    va="center",
                    fontsize=6,
                    rotation=90 if s.real_end - s.start < pack.capacity / 12 else 0,
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
    ax.legend(
        handles=[
            Patch(facecolor=colours[0], label="conversation (one colour each)"),
            Patch(facecolor=colours[1], hatch="////", label="image tokens"),
            Patch(facecolor="#d9d9d9", label="padding / tail"),
        ],
        loc="upper center",
        bbox_to_anchor=(0.5, -0.12 - 0.3 / max(len(layouts), 1)),
        ncol=3,
        fontsize=8,
    )
    ax.set_title(title or "energon_packing: loader packs", fontsize=10)
    for spine in ("top", "right"):
        ax.spines[spine].set_visible(False)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
