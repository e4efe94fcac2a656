"""A record's media for ``convert``: loaded from a path, a ``data:`` URI, bytes or a Hugging
Face ``{"bytes", "path"}`` entry, and checked before it goes into a shard.

An image is decoded (:func:`energon_packing.media.images.verify`: what the loader's decode
refuses, ``corrupt_image``, is reported here, with the record's id and the path), unless
``decode`` is off; then only its first bytes are read to recognise its format, and a file is
copied into the shard by the kernel as it is. A video is never decoded: its first bytes must
start a video container, and with ``decode`` its container header is read as the loader will
(:func:`energon_packing.media.video.probe`, PyAV; without PyAV that step is skipped, logged once).
An audio clip is recognised by its signature (else its name) and, with ``decode``, its length is
read as the loader will (:func:`energon_packing.media.audio.length`: ``audio_unreadable``,
``audio_no_stream``).
"""

from __future__ import annotations

import base64
import io
import logging
import os
import re
from collections.abc import Iterator
from concurrent.futures import Executor, Future
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from energon_packing.errors import Skip
from energon_packing.media.audio import AUDIO_SUFFIXES
from energon_packing.media.images import VIDEO_SUFFIXES

__all__ = [
    "VIDEO_EXTENSIONS",
    "FilePart",
    "MediaLoader",
    "data_uri",
    "of",
    "sniff_suffix",
    "suffix_of",
]

logger = logging.getLogger("energon_packing")

#: The extensions a video part may have (its source file's, lowercased): the ones the loader
#: reads as videos.
VIDEO_EXTENSIONS = tuple(sorted(VIDEO_SUFFIXES))


@dataclass(frozen=True, slots=True)
class FilePart:
    """A part whose bytes stay in a file until the shard is written (copied by the kernel)."""

    path: Path
    size: int


#: Bytes read from an image file to recognise it (the signatures :func:`sniff_suffix` checks).
_HEAD = 16


class MediaLoader:
    """Loads a record's media: a path (relative to ``root``), a ``data:`` URI, raw bytes or a
    Hugging Face ``{"bytes", "path"}`` entry (see the module docstring).

    Args:
        root: Where relative paths point.
        decode: Decode every image and read every video's container header (the loader's
            checks); off: an image file whose first bytes show a common format is copied as it
            is, unread.
        pool: Where images are decoded (threads: Pillow decodes without the GIL): each
            decode is then a future, collected by :meth:`pending` and settled before the
            record is written; an image file is then copied by the kernel, as without
            ``decode``. None: decoded here, before the call returns.
    """

    def __init__(self, root: Path, *, decode: bool = True, pool: Executor | None = None):
        self.root = root
        self.decode = decode
        self.pool = pool
        self._pending: list[Future] = []
        self._no_video_check = False

    def pending(self) -> list[Future]:
        """The image decodes submitted to ``pool`` since the last call (each raises the
        record's :class:`Skip` from ``result()``)."""
        out, self._pending = self._pending, []
        return out

    def _check(self, data: bytes | Path, what: str, record_id: Any) -> None:
        if self.pool is None:
            _verify(data, what, record_id)
        else:
            self._pending.append(self.pool.submit(_verify, data, what, record_id))

    def __call__(
        self, source: Any, kind: str, *, record_id: Any = None
    ) -> tuple[bytes | FilePart, str]:
        _refuse_remote(source, kind, record_id, self.root)
        if kind == "video":
            return self._video(source, record_id)
        if kind == "audio":
            return self._audio(source, record_id)
        data, path = _entry(source, kind, record_id)
        if data is None:
            return self._file(path, kind, record_id)
        suffix = sniff_suffix(data)
        if suffix is None:
            raise Skip("unreadable_image", f"{path or 'the image bytes'} is not an image")
        if self.decode:
            self._check(data, f"{kind} {path!r}" if path else f"the {kind} bytes", record_id)
        return data, suffix

    def _file(self, path: str, kind: str, record_id: Any) -> tuple[bytes | FilePart, str]:
        with self._open(path, kind, f"{kind} file {path!r}{of(record_id)}") as (f, file, size):
            head = f.read(_HEAD)
            suffix = sniff_suffix(head, whole=False)
            if suffix is not None and (not self.decode or self.pool is not None):
                if self.decode:  # read again, and decoded, in the pool
                    self._check(file, f"{kind} file {path!r}", record_id)
                return FilePart(file, size), suffix
            data = head + f.read()  # decoded, or another format: Pillow decides
        if suffix is None:
            suffix = sniff_suffix(data)
        if suffix is None:
            raise Skip("unreadable_image", f"{path} is not an image Pillow reads")
        if self.decode:
            self._check(data, f"{kind} file {path!r}", record_id)
        return data, suffix

    @contextmanager
    def _open(self, path: str, kind: str, what: str) -> Iterator[tuple[BinaryIO, Path, int]]:
        """A record's media file (``path``, relative to ``root`` unless absolute) open for
        reading, with where it is and its size; a file that is not there is the kind's
        ``missing_*``, one that does not open or read its unreadable reason (a folder given as
        a video: how to encode its frames into one)."""
        missing, unreadable = _REASONS.get(kind, _REASONS["image"])
        file = Path(path) if Path(path).is_absolute() else self.root / path
        try:
            with open(file, "rb") as f:
                yield f, file, os.fstat(f.fileno()).st_size
        except FileNotFoundError:
            raise Skip(
                missing,
                f"{what} not found at {file}: put it there, or pass --media-root the folder "
                "the record's paths are relative to",
            ) from None
        except IsADirectoryError as e:
            detail = _frames_folder(what, file) if kind == "video" else f"{what}: {e.strerror}"
            raise Skip(unreadable, detail) from None
        except OSError as e:
            raise Skip(unreadable, f"{what}: {e.strerror or e}") from None

    def _video(self, source: Any, record_id: Any) -> tuple[bytes | FilePart, str]:
        """A video's bytes (a file's stay in it) and its part suffix."""
        data, name = _entry(source, "video", record_id)
        if data is None:
            return self._video_file(name, record_id)
        what = f"the video bytes{f' of {name!r}' if name else ''}{of(record_id)}"
        suffix = _video_suffix(name or "", data[:_VIDEO_HEAD], len(data), what)
        self._probe(data, what)
        return data, suffix

    def _audio(self, source: Any, record_id: Any) -> tuple[bytes, str]:
        """A clip's bytes and its part suffix (from its signature, else its name); with
        ``decode``, its length read as the loader will (the header where exact, else a
        decode): an unreadable clip is reported now, not skipped at training time."""
        data, name = _entry(source, "audio", record_id)
        what = f"audio {'file ' + repr(name) if name else 'bytes'}{of(record_id)}"
        if data is None:
            with self._open(name, "audio", what) as (f, _, _):
                data = f.read()
        suffix = audio_suffix(data) or suffix_of(name or "")
        if suffix.lstrip(".") not in AUDIO_SUFFIXES:
            raise Skip(
                "audio_unreadable",
                f"{what} is no {', '.join(sorted(AUDIO_SUFFIXES))} clip ({len(data):,} bytes "
                f"starting {data[:12]!r}); convert it to one of them (e.g. ffmpeg -i IN OUT.flac)",
            )
        if self.decode:
            from energon_packing.media.audio import length

            try:
                length(data)
            except Skip as e:
                raise Skip(e.reason, f"{what}: {e.detail}") from None
        return data, suffix

    def _video_file(self, path: str, record_id: Any) -> tuple[FilePart, str]:
        what = f"video file {path!r}{of(record_id)}"
        with self._open(path, "video", what) as (f, file, size):
            head = f.read(_VIDEO_HEAD)
        suffix = _video_suffix(path, head, size, what)
        if self.decode and not self._no_video_check:
            self._probe(file.read_bytes(), what)
        return FilePart(file, size), suffix

    def _probe(self, data: bytes, what: str) -> None:
        """The loader's container-header read (:func:`energon_packing.media.video.probe`)."""
        if not self.decode or self._no_video_check:
            return
        try:
            from energon_packing.media.video import probe
        except ImportError as e:  # PyAV: the [video] extra
            logger.warning("video headers not checked (%s): pip install 'av>=14'", e)
            self._no_video_check = True
            return
        try:
            if not probe(data).frames:
                raise Skip("video_empty", "the video stream holds no frame")
        except Skip as e:
            raise Skip(e.reason, f"{what}: {e.detail}") from None


#: Bytes read from a video file to recognise its container (WebM's DocType is within them).
_VIDEO_HEAD = 64
#: Top-level boxes an MP4 / QuickTime file starts with.
_MP4_BOXES = (b"ftyp", b"moov", b"mdat", b"free", b"skip", b"wide", b"pnot")


def _verify(data: bytes | Path, what: str, record_id: Any) -> None:
    """:func:`energon_packing.media.images.verify` of the bytes (or a file's), its skip
    naming the medium and record."""
    from energon_packing.media.images import verify

    try:
        verify(data if isinstance(data, bytes) else _read(data))
    except Skip as e:
        raise Skip(e.reason, f"{what}{of(record_id)}: {e.detail}") from None


def _read(file: Path) -> bytes:
    try:
        return file.read_bytes()
    except OSError as e:  # it went away since it was opened
        raise Skip("unreadable_image", f"unreadable ({e.strerror or e})") from None


def _refuse_remote(source: Any, kind: str, record_id: Any, root: Path) -> None:
    """A medium behind an http(s) URL: ``remote_media``, naming the URL to download."""
    url = source.get("path") if isinstance(source, dict) and not source.get("bytes") else source
    if isinstance(url, str) and url.startswith(("http://", "https://")):
        raise Skip(
            "remote_media",
            f"{kind} {url}{of(record_id)} is a URL: convert reads local files; download it "
            f"under {root} and write its path relative to that folder",
        )


def of(record_id: Any) -> str:
    return f" (record id {record_id!r})" if record_id is not None else ""


#: each kind's reasons: (missing entry, unreadable bytes)
_REASONS = {
    "image": ("missing_image", "unreadable_image"),
    "video": ("missing_video", "unreadable_video"),
    "audio": ("missing_audio", "audio_unreadable"),
}


def _entry(source: Any, kind: str, record_id: Any) -> tuple[bytes | None, str | None]:
    """A record's media entry as ``(bytes, its name or None)`` or ``(None, its path)``: a
    datasets ``Image`` / ``Video`` / ``Audio`` dict, raw bytes, a ``data:`` URI or a path
    (``file://`` dropped). Remote URLs are refused before (:func:`_refuse_remote`)."""
    missing, unreadable = _REASONS.get(kind, _REASONS["image"])
    an = "an" if kind[0] in "aeiou" else "a"
    if isinstance(source, dict):  # a datasets Image / Video / Audio entry
        data, name = source.get("bytes"), source.get("path")
        if data is None and name is None:
            raise Skip(missing, f"{an} {kind} entry with neither bytes nor path{of(record_id)}")
        return data, name
    if isinstance(source, (bytes, bytearray)):
        return bytes(source), None
    if isinstance(source, str):
        try:
            data = data_uri(source)
        except Skip as e:
            raise Skip(unreadable, f"{e.detail}{of(record_id)}") from None
        return (data, None) if data is not None else (None, source.removeprefix("file://"))
    if isinstance(source, list) and kind == "video":
        raise Skip(
            "malformed_record",
            f"a video given as a list of {len(source)} items (frames?){of(record_id)}: "
            "convert stores video files; encode the frames into one and name it",
        )
    raise Skip("malformed_record", f"{an} {kind} given as {type(source).__name__}{of(record_id)}")


def _container(head: bytes) -> str | None:
    """The video container ``head`` (a file's first bytes) starts, as an extension; None if
    none of :data:`VIDEO_EXTENSIONS`'."""
    if head[4:8] in _MP4_BOXES:
        brand = head[8:12] if head[4:8] == b"ftyp" else b""
        return "mov" if brand == b"qt  " else "m4v" if brand.startswith(b"M4V") else "mp4"
    if head.startswith(b"\x1a\x45\xdf\xa3"):  # EBML: Matroska, or WebM by its DocType
        return "webm" if b"webm" in head else "mkv"
    if head[:4] == b"RIFF" and head[8:12] == b"AVI ":
        return "avi"
    return None


def _video_suffix(name: str, head: bytes, size: int, what: str) -> str:
    """A video part's suffix: ``name``'s extension, lowercased (one of
    :data:`VIDEO_EXTENSIONS`), or the container's when ``name`` has none.

    Raises:
        Skip: ``unreadable_video``: another extension, or ``head`` starts no video.
    """
    extension = Path(name).suffix.lower().removeprefix(".")
    if extension and extension not in VIDEO_EXTENSIONS:
        raise Skip(
            "unreadable_video",
            f"{what}: extension .{extension} is not one of {', '.join(VIDEO_EXTENSIONS)}; "
            "remux it (ffmpeg -i IN -c copy OUT.mp4) and point the record at the new file",
        )
    container = _container(head)
    if container is None:
        raise Skip("unreadable_video", f"{what} is not a video file: {_looks(head, size)}")
    return f".{extension or container}"


def _looks(head: bytes, size: int) -> str:
    """What a file that is no video looks like, and the fix."""
    if head.startswith(b"version https://git-lfs"):
        return f"its {size:,} bytes are a Git LFS pointer; fetch the file (git lfs pull)"
    if not size:
        return "it is empty (0 bytes); download it again"
    return (
        f"its {size:,} bytes start {head[:12]!r}, as no {', '.join(VIDEO_EXTENSIONS)} "
        "file does; download it again or fix the record's path"
    )


def _frames_folder(what: str, folder: Path) -> str:
    """A video path that is a folder (ShareGPTVideo's videos are folders of frames)."""
    try:
        count = f"{sum(1 for _ in os.scandir(folder)):,} files"
    except OSError:
        count = "files"
    return (
        f"{what} is a folder ({count}), not a video file: encode its frames into one, e.g. "
        f"ffmpeg -framerate 2 -pattern_type glob -i '{folder}/*.jpg' {folder.name}.mp4, and "
        "point the record at it"
    )


def data_uri(source: str) -> bytes | None:
    """The bytes of a ``data:...;base64,`` URI, else None."""
    if not source.startswith("data:"):
        return None
    head, _, payload = source.partition(",")
    if ";base64" not in head:
        raise Skip("unreadable_image", "a data: URI that is not base64")
    try:
        return base64.b64decode(payload, validate=True)
    except ValueError as e:
        raise Skip("unreadable_image", f"a data: URI that does not decode ({e})") from None


#: The magic bytes of the formats most datasets hold: no Pillow open for them.
_MAGIC = ((b"\xff\xd8\xff", ".jpg"), (b"\x89PNG\r\n\x1a\n", ".png"), (b"GIF8", ".gif"))


def sniff_suffix(data: bytes, *, whole: bool = True) -> str | None:
    """The image format of ``data`` as a part suffix (``.jpg``), None if it is no image.
    JPEG, PNG, GIF and WebP by their signature; with ``whole`` (``data`` is the whole file),
    every other format Pillow opens, by Pillow."""
    for magic, suffix in _MAGIC:
        if data.startswith(magic):
            return suffix
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return ".webp"
    if not whole:
        return None
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as image:
            fmt = (image.format or "").lower()
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError):
        return None
    return {"jpeg": ".jpg", "tiff": ".tif"}.get(fmt, f".{fmt}" if fmt else ".bin")


def audio_suffix(head: bytes) -> str | None:
    """An audio clip's part suffix by its signature (WAV, FLAC, MP3, Ogg Vorbis / Opus, M4A),
    None where it shows none of them."""
    if head[:4] == b"RIFF" and head[8:12] == b"WAVE":
        return ".wav"
    if head[:4] == b"fLaC":
        return ".flac"
    if head[:4] == b"OggS":
        return ".opus" if b"OpusHead" in head[:64] else ".ogg"
    if head[:3] == b"ID3" or (len(head) > 1 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0):
        return ".mp3"
    if head[4:8] == b"ftyp":
        return ".m4a"
    return None


def suffix_of(path: str) -> str:
    suffix = Path(path).suffix.lower()
    return suffix if re.fullmatch(r"\.[a-z0-9]{1,5}", suffix) else ""
