"""``energon-packing check``'s media pass: every image decoded and every video's container
header read, before training.

The shard scan (:func:`energon_packing.incoming.shards.scan_dataset`) reads tar headers only.
This pass reads each image part a document lists and each video part's bytes and checks them as the loader will: an image
is decoded (:func:`energon_packing.media.images.verify`; ``corrupt_image``: a truncated JPEG,
a body that is no image behind a JPEG's first bytes), a video's container header read
(:func:`energon_packing.media.video.probe`: the stream, its rate and size, the packets that
decode; no frame is decoded; ``video_unreadable``, ``video_no_stream``, ``video_empty``,
``unsupported_video`` without PyAV), an audio clip's length read as the loader reads it
(:func:`energon_packing.media.audio.length`: its header where exact, else a decode;
``audio_unreadable``, ``audio_no_stream``), and with ``tracks`` each video's own audio track
read as a run with ``audio_config['load_audio_from_video']`` reads it (a silent video:
``audio_no_stream``). Each one the loader would skip is named with its shard,
offset and key before a run starts; each costs its conversation only (the loader skips it and
counts the reason).
"""

from __future__ import annotations

import json
import tarfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from energon_packing.errors import Skip
from energon_packing.incoming.shards import Finding, shard_paths
from energon_packing.incoming.tar_walk import split_key
from energon_packing.media.audio import may_be_audio
from energon_packing.media.images import may_be_image, may_be_video

__all__ = ["MediaScan", "scan_media"]


@dataclass(kw_only=True, slots=True)
class MediaScan:
    """What the media pass read: image, video and audio parts, their bytes, and the ones the
    loader would skip (``Finding`` with the loader's reason; ``lost`` is False: the skip report
    has them)."""

    images: int = 0
    videos: int = 0
    audios: int = 0
    bytes: int = 0
    findings: list[Finding] = field(default_factory=list)


def scan_media(
    path: Path | str,
    *,
    images: bool = True,
    videos: bool = True,
    audios: bool = True,
    tracks: bool = False,
    shards: Sequence[str] | None = None,
    progress: Callable[[int], None] | None = None,
) -> MediaScan:
    """Decodes every image part, reads the header of every video part (``.mp4 .m4v .mkv
    .webm .mov .avi``) and the length of every audio part (``.wav .flac .mp3 .ogg .opus
    .m4a``) of a dataset folder's shards.

    Args:
        path: The dataset folder.
        images, videos, audios: Which parts to read.
        tracks: Also read each video's own audio track (with ``videos``), as a run with
            ``audio_config['load_audio_from_video']`` (the Omni thinkers) does.
        shards: Shard paths relative to ``path``; default: those ``energon prepare`` finds.
        progress: Called with each part's size in bytes, after it is read.

    Raises:
        ImportError: ``videos`` or ``audios`` and PyAV (the ``[video]`` extra) is not installed.
    """
    from energon_packing.media.audio import length, track_length
    from energon_packing.media.images import verify

    if audios or (videos and tracks):
        import av  # noqa: F401  (PyAV: the [video] extra; without it every clip reads as unreadable)

    probe = None
    if videos:
        from energon_packing.media.video import probe  # PyAV: the [video] extra

    root = Path(path)
    scan = MediaScan()
    for name in shards if shards is not None else shard_paths(root):
        if name.endswith(".tgz"):
            continue  # the shard scan warns about it
        try:
            with tarfile.open(root / name, "r:") as tar:
                for key, members in _samples(tar):
                    for member, check in _media(
                        tar, key, members, images=images, videos=videos, audios=audios
                    ):
                        data = tar.extractfile(member).read()
                        scan.bytes += len(data)
                        try:
                            if check == "video":
                                scan.videos += 1
                                if not probe(data).frames:
                                    raise Skip("video_empty", "the video stream holds no frame")
                                if tracks:
                                    try:
                                        track_length(data)
                                    except Skip as e:
                                        raise Skip(e.reason, f"the video's {e.detail}") from None
                            elif check == "audio":
                                scan.audios += 1
                                length(data)
                            else:
                                scan.images += 1
                                verify(data)
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


def _samples(tar: tarfile.TarFile):
    """``(key, members)`` of each sample, its members consecutive as Energon reads them."""
    key, members = None, []
    for member in tar:
        name = split_key(member.name) if member.isreg() else None
        if name is None:
            continue
        if name != key and members:
            yield key, members
            members = []
        key = name
        members.append(member)
    if members:
        yield key, members


def _media(
    tar: tarfile.TarFile, key: str, members: list, *, images: bool, videos: bool, audios: bool
):
    """``(member, "image" | "video" | "audio")`` for the parts the loader decodes: the video and
    audio parts, and
    the image parts the sample's document lists under ``images`` (a part it does not list is
    never decoded; a document that does not parse is the loader's ``malformed_json``)."""
    parts = {m.name[len(key) + 1 :]: m for m in members}
    listed: list = []
    if images and "json" in parts:
        try:
            document = json.loads(tar.extractfile(parts["json"]).read())
            listed = document.get("images") or [] if isinstance(document, dict) else []
        except (ValueError, UnicodeDecodeError):
            listed = []
    for part in dict.fromkeys(p for p in listed if isinstance(p, str)):
        if part in parts and may_be_image(part) and not may_be_video(part):
            yield parts[part], "image"
    for part, member in parts.items():
        if videos and may_be_video(part):
            yield member, "video"
        elif audios and may_be_audio(part):
            yield member, "audio"
