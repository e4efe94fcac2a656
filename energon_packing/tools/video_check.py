"""``energon-packing check``'s video pass: every video part's container header, read before
training.

The shard scan (:func:`energon_packing.loader.shards.scan_dataset`) reads tar headers only.
This pass reads each video part's bytes and its container header as the loader will
(:func:`energon_packing.media.video.probe`: the stream, its rate and size, the packets that
decode; no frame is decoded), so a clip the loader would skip (``video_unreadable``,
``video_no_stream``, ``video_empty``, ``unsupported_video`` without PyAV) is named with its shard, offset and key before a run
starts. Each one costs its conversation only: the loader skips it and counts the reason.
"""

from __future__ import annotations

import tarfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from energon_packing.encoding.images import may_be_video
from energon_packing.errors import Skip
from energon_packing.loader.shards import Finding, shard_paths
from energon_packing.loader.tar_walk import split_key

__all__ = ["VideoScan", "scan_videos"]


@dataclass(kw_only=True, slots=True)
class VideoScan:
    """What the video pass read: video parts, their bytes, and the ones the loader would
    skip (``Finding`` with a ``video_*`` reason; ``lost`` is False: the skip report has
    them)."""

    videos: int = 0
    bytes: int = 0
    findings: list[Finding] = field(default_factory=list)


def scan_videos(
    path: Path | str,
    *,
    shards: Sequence[str] | None = None,
    progress: Callable[[int], None] | None = None,
) -> VideoScan:
    """Reads the header of every video part (``.mp4 .m4v .mkv .webm .mov .avi``) of a dataset
    folder's shards.

    Args:
        path: The dataset folder.
        shards: Shard paths relative to ``path``; default: those ``energon prepare`` finds.
        progress: Called with each video's size in bytes, after it is read.
    """
    from energon_packing.media.video import probe  # PyAV: the [video] extra

    root = Path(path)
    scan = VideoScan()
    for name in shards if shards is not None else shard_paths(root):
        if name.endswith(".tgz"):
            continue  # the shard scan warns about it
        try:
            with tarfile.open(root / name, "r:") as tar:
                for member in tar:
                    key = split_key(member.name) if member.isreg() else None
                    if key is None or not may_be_video(member.name[len(key) + 1 :]):
                        continue
                    data = tar.extractfile(member).read()
                    scan.videos += 1
                    scan.bytes += len(data)
                    try:
                        if not probe(data).frames:
                            raise Skip("video_empty", "the video stream holds no frame")
                    except Skip as e:
                        scan.findings.append(
                            Finding(
                                shard=name,
                                offset=member.offset,
                                key=key,
                                member=member.name,
                                reason=e.reason,
                                detail=f"{e.detail}: the loader skips its conversation",
                            )
                        )
                    if progress is not None:
                        progress(len(data))
        except (tarfile.TarError, OSError):  # a broken shard: the shard scan reports it
            continue
    return scan
