"""``energon-packing convert``: users' data -> prepared Energon WebDataset shards, exactly once.

Sources (``--format auto`` decides record by record what the explicit format would):

* a ``.json`` file holding a list of records (LLaVA, ShareGPT), read as a stream;
* a ``.jsonl`` file, one record per line (messages, ShareGPT, LLaVA); a broken line is reported;
* a Hugging Face dataset: a ``save_to_disk`` folder (``*.arrow``) or ``.parquet`` files (a file
  or a folder of them); image columns as ``{"bytes", "path"}``;
* a folder of ``.json`` / ``.jsonl`` files (in name order).

Videos (LLaVA-Video-178K / LLaVA-NeXT-Video and Video-LLaVA records with a ``video`` path or
list, messages with ``{"type": "video"}`` parts, a dataset's ``{"bytes", "path"}`` video
entries) are stored as they are: each file's bytes become the part ``<key>.vidN.<ext>``, never
decoded, its extension one of :data:`VIDEO_EXTENSIONS`; the document lists them under
``videos`` and refers to each by a ``{"type": "video", "video": "vidN.<ext>"}`` part. A
LLaVA-Video record writes ``<image>`` for its video (LLaVA-NeXT's trainer reads the video in
its place): with a ``video`` and no ``image``, that placeholder is the video. A video that is
not there, or is no video file, is reported (``missing_video``, ``unreadable_video``) with the
record's id and the path.

Output (``OUT`` is created, refused if it exists and is not empty)::

    OUT/shards/train-00000.tar ...     <key>.json + <key>.img0.jpg ...   (keys: r000000000 ...)
    OUT/shards/val-00000.tar ...       with --val-fraction (disjoint from train)
    OUT/convert_report.jsonl           {"file", "index", "reason", "detail"} per record not converted
    OUT/convert_map.jsonl              {"file", "index", "id", "key"} per converted record
    OUT/.nv-meta/...                   prepared (energon-packing prepare), train and val splits

``file`` is the record's file, as a path relative to a source folder (a ``save_to_disk`` folder
is one file, named by the folder); ``index`` is 0-based within it: the position in a JSON list,
the line of a JSONL file (broken and blank lines counted), the row of a dataset or parquet file.
A JSON list that stops parsing is reported once, at the first record it cannot read, with the
note that no later record of that file was read. A folder holding the hub's split files of
several splits (``train-*``, ``test-*``) is refused unless ``--val-file`` names the held-out
ones; nothing is written before every check passed, and a failed run removes what it wrote. Memory stays flat in the dataset size: records stream in,
samples stream out, one shard open at a time.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from energon_packing.encoding.images import VIDEO_SUFFIXES
from energon_packing.tools.records import (
    FORMATS,
    IMAGE,
    VIDEO,
    Converted,
    RecordError,
    data_uri,
    detect_format,
    sniff_suffix,
    to_document,
)

__all__ = ["ConvertResult", "convert", "read_records"]

logger = logging.getLogger("energon_packing")

REPORT_FILE = "convert_report.jsonl"
MAP_FILE = "convert_map.jsonl"
#: 1 / golden ratio: record i goes to val when frac(i * PHI) < val_fraction (evenly spread)
PHI = 0.6180339887498949
_CHUNK = 1 << 20
#: The extensions a video part may have (its source file's, lowercased): the ones the loader
#: reads as videos.
VIDEO_EXTENSIONS = tuple(sorted(VIDEO_SUFFIXES))


@dataclass(kw_only=True, slots=True)
class ConvertResult:
    out: Path
    converted: int = 0
    train: int = 0
    val: int = 0
    reported: dict[str, int] = field(default_factory=dict)
    shards: list[Path] = field(default_factory=list)

    @property
    def total_reported(self) -> int:
        return sum(self.reported.values())


@dataclass(frozen=True, slots=True)
class Broken:
    """A record that could not be read (reported as ``malformed_record`` with ``detail``)."""

    detail: str


#: A record larger than this that still does not parse is broken, not cut by a chunk boundary.
_MAX_RECORD = 64 << 20


def _json_list(path: Path) -> Iterator[tuple[int, Any]]:
    """The records of a file holding one JSON list, one at a time (never the whole list). A
    record that does not parse ends the read: it is reported with the indices not read."""
    decoder = json.JSONDecoder()
    with open(path, encoding="utf-8-sig", errors="strict") as f:
        buffer, position, eof = "", 0, False

        def more(size: int = _CHUNK) -> None:
            nonlocal buffer, position, eof
            chunk = f.read(size)
            buffer, position, eof = buffer[position:] + chunk, 0, not chunk

        def skip(characters: str) -> bool:
            """Skips ``characters``; False at the end of the file."""
            nonlocal position
            while True:
                while position < len(buffer) and buffer[position] in characters:
                    position += 1
                if position < len(buffer):
                    return True
                if eof:
                    return False
                more()

        try:
            if not skip(" \t\r\n") or buffer[position] != "[":
                yield 0, Broken("the file does not hold a JSON list of records")
                return
            position += 1
            index = 0
            while skip(" \t\r\n,"):
                if buffer[position] == "]":
                    return
                try:
                    record, end = decoder.raw_decode(buffer, position)
                except json.JSONDecodeError as error:
                    if eof or len(buffer) - position > _MAX_RECORD:
                        yield (
                            index,
                            Broken(
                                f"not JSON ({error.msg}); the list does not parse from record "
                                f"{index} on, so no later record of this file was read"
                            ),
                        )
                        return
                    more(max(_CHUNK, len(buffer) - position))  # doubles: linear in the record
                    continue
                yield index, record
                index, position = index + 1, end
            yield index, Broken("the list never closes (the file is cut)")
        except UnicodeDecodeError as error:
            yield 0, Broken(f"the file is not UTF-8 ({error.reason}); nothing of it was read")


def _json_lines(path: Path) -> Iterator[tuple[int, Any]]:
    with open(path, "rb") as f:
        for index, raw in enumerate(f):
            if index == 0:
                raw = raw.removeprefix(b"\xef\xbb\xbf")  # a UTF-8 byte-order mark
            if not raw.strip():
                continue
            try:
                yield index, json.loads(raw.decode("utf-8"))
            except UnicodeDecodeError as error:
                yield index, Broken(f"the line is not UTF-8 ({error.reason})")
            except ValueError as error:
                yield index, Broken(f"the line is not JSON ({error})")


def _pyarrow() -> Any:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise ImportError(
            "reading a Hugging Face dataset needs pyarrow: pip install 'energon_packing[datasets]'"
        ) from None
    return pa, pq


def _arrow_rows(paths: list[Path]) -> Iterator[tuple[int, Any]]:
    """Rows of a ``save_to_disk`` folder's Arrow streams, numbered as the dataset's rows."""
    pa, _ = _pyarrow()
    index = 0
    for path in paths:
        for batch in pa.ipc.open_stream(pa.memory_map(str(path))):
            for row in batch.to_pylist():
                yield index, row
                index += 1


def _parquet_rows(path: Path) -> Iterator[tuple[int, Any]]:
    _, pq = _pyarrow()
    index = 0
    for batch in pq.ParquetFile(path).iter_batches(batch_size=256):
        for row in batch.to_pylist():
            yield index, row
            index += 1


#: File name prefixes of the Hugging Face hub's split files (``data/test-00000-of-00001.parquet``)
_SPLIT_FILES = ("train", "test", "validation", "valid", "val", "dev")


_KINDS = (".json", ".jsonl", ".parquet")


def _arrow_files(source: Path) -> list[Path]:
    """The Arrow streams of a ``save_to_disk`` folder (none for anything else)."""
    return sorted(source.glob("*.arrow")) if source.is_dir() else []


def _files(source: Path) -> list[tuple[Path, str]]:
    """(path, name) of every record file under ``source``: JSON, JSONL and parquet files, each
    named by its path relative to ``source`` (its own name for a file source)."""
    if source.is_file():
        if source.suffix not in _KINDS:
            raise ValueError(
                f"{source}: not a .json, .jsonl or .parquet file, nor a dataset folder"
            )
        return [(source, source.name)]
    paths = sorted(p for p in source.rglob("*") if p.suffix in _KINDS and p.is_file())
    return [(p, p.relative_to(source).as_posix()) for p in paths]


def _split_of(name: str) -> str | None:
    stem = name.rsplit("/", 1)[-1].split(".")[0]
    return next((s for s in _SPLIT_FILES if stem == s or stem.startswith(f"{s}-")), None)


def check_source(source: Path, val_files: tuple[str, ...] = ()) -> None:
    """Refuses, before anything is written, a source convert would misread: a DatasetDict
    folder, split files of several splits without ``val_files``, or ``val_files`` it lacks."""
    if source.is_dir() and (source / "dataset_dict.json").exists():
        splits = [p.name for p in sorted(source.iterdir()) if p.is_dir()]
        raise ValueError(
            f"{source} is a DatasetDict: convert one split folder, e.g. "
            f"{source / (splits[0] if splits else 'train')}"
        )
    files = [(source, source.name)] if _arrow_files(source) else _files(source)
    if not files:
        raise ValueError(f"{source} holds no .json, .jsonl, .arrow or .parquet records")
    names = {name for _, name in files}
    missing = sorted(set(val_files) - names)
    if missing:
        raise ValueError(
            f"val_files {missing} name no source file under {source} (it holds {sorted(names)})"
        )
    splits = {_split_of(name) for name in names} - {None}
    if len(splits) > 1 and not val_files:
        raise ValueError(
            f"{source} holds files of several splits ({', '.join(sorted(splits))}): name the "
            f"held-out ones with --val-file (e.g. {sorted(n for n in names if _split_of(n) != 'train')[0]}), "
            f"or convert one split's files"
        )


def read_records(source: Path) -> Iterator[tuple[str, int, Any]]:
    """``(file, index, record)`` of every record under ``source`` (a record that could not be
    read: a :class:`Broken`, reported as ``malformed_record``). ``file`` is the path relative
    to a source folder; ``index`` counts from 0 in each file (a ``save_to_disk`` folder is one
    file: its rows)."""
    source = Path(source)
    if arrow := _arrow_files(source):
        for index, row in _arrow_rows(arrow):
            yield source.name, index, row
        return
    for path, name in _files(source):
        if path.suffix == ".parquet":
            rows = _parquet_rows(path)
        elif path.suffix == ".jsonl":
            rows = _json_lines(path)
        else:
            rows = _json_list(path)
        for index, record in rows:
            yield name, index, record


@dataclass(frozen=True, slots=True)
class FilePart:
    """A part whose bytes stay in a file until the shard is written (copied by the kernel)."""

    path: Path
    size: int


#: Bytes read from an image file to recognise it (the signatures :func:`sniff_suffix` checks).
_HEAD = 16


class _MediaLoader:
    """Loads a record's media: a path (relative to ``root``), a ``data:`` URI, raw bytes or a
    Hugging Face ``{"bytes", "path"}`` entry. An image is checked to be one; a file is not
    read when its first bytes show a common image format: it is copied into the shard as it
    is. A video is never decoded: its first bytes must start a video container."""

    def __init__(self, root: Path):
        self.root = root

    def __call__(
        self, source: Any, kind: str, *, record_id: Any = None
    ) -> tuple[bytes | FilePart, str]:
        if kind == "video":
            return self._video(source, record_id)
        path = None
        if isinstance(source, dict):  # a datasets Image entry
            data, path = source.get("bytes"), source.get("path")
            if data is None and path is None:
                raise RecordError("missing_image", f"an {kind} entry with neither bytes nor path")
        elif isinstance(source, (bytes, bytearray)):
            data = bytes(source)
        elif isinstance(source, str):
            data = data_uri(source)
            path = None if data is not None else source.removeprefix("file://")
        else:
            raise RecordError("malformed_record", f"an {kind} given as {type(source).__name__}")
        if data is None:
            return self._file(path, kind)
        suffix = sniff_suffix(data)
        if suffix is None:
            raise RecordError("unreadable_image", f"{path or 'the image bytes'} is not an image")
        return data, suffix

    def _file(self, path: str, kind: str) -> tuple[bytes | FilePart, str]:
        file = Path(path) if Path(path).is_absolute() else self.root / path
        try:
            with open(file, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                head = f.read(_HEAD)
                suffix = sniff_suffix(head, whole=False)
                if suffix is not None:
                    return FilePart(file, size), suffix
                data = head + f.read()  # another format: Pillow decides from the whole file
        except FileNotFoundError:
            raise RecordError(
                "missing_image", f"{kind} file {path!r} not found under {self.root}"
            ) from None
        except OSError as e:
            raise RecordError("unreadable_image", f"{kind} file {path!r}: {e}") from None
        suffix = sniff_suffix(data)
        if suffix is None:
            raise RecordError("unreadable_image", f"{path} is not an image Pillow reads")
        return data, suffix

    def _video(self, source: Any, record_id: Any) -> tuple[bytes | FilePart, str]:
        """A video's bytes (a file's stay in it) and its part suffix."""
        name = None
        if isinstance(source, dict):  # a datasets Video entry
            data, name = source.get("bytes"), source.get("path")
            if data is None and name is None:
                raise RecordError(
                    "missing_video", f"a video entry with neither bytes nor path{_of(record_id)}"
                )
        elif isinstance(source, (bytes, bytearray)):
            data = bytes(source)
        elif isinstance(source, str):
            data = _video_uri(source, record_id)
            name = None if data is not None else source.removeprefix("file://")
        elif isinstance(source, list):
            raise RecordError(
                "malformed_record",
                f"a video given as a list of {len(source)} items (frames?){_of(record_id)}: "
                "convert stores video files; encode the frames into one and name it",
            )
        else:
            raise RecordError(
                "malformed_record", f"a video given as {type(source).__name__}{_of(record_id)}"
            )
        if data is None:
            return self._video_file(name, record_id)
        what = f"the video bytes{f' of {name!r}' if name else ''}{_of(record_id)}"
        return data, _video_suffix(name or "", data[:_VIDEO_HEAD], len(data), what)

    def _video_file(self, path: str, record_id: Any) -> tuple[FilePart, str]:
        what = f"video file {path!r}{_of(record_id)}"
        if path.startswith(("http://", "https://")):
            raise RecordError(
                "missing_video",
                f"{what} is a URL: convert reads local files; download it under {self.root} "
                "and write its path relative to that folder",
            )
        file = Path(path) if Path(path).is_absolute() else self.root / path
        try:
            with open(file, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                head = f.read(_VIDEO_HEAD)
        except FileNotFoundError:
            raise RecordError(
                "missing_video",
                f"{what} not found at {file}: put it there, or pass --media-root the folder "
                "the record's paths are relative to",
            ) from None
        except IsADirectoryError:
            raise RecordError("unreadable_video", _frames_folder(what, file)) from None
        except OSError as e:
            raise RecordError("unreadable_video", f"{what}: {e.strerror or e}") from None
        return FilePart(file, size), _video_suffix(path, head, size, what)


#: Bytes read from a video file to recognise its container (WebM's DocType is within them).
_VIDEO_HEAD = 64
#: Top-level boxes an MP4 / QuickTime file starts with.
_MP4_BOXES = (b"ftyp", b"moov", b"mdat", b"free", b"skip", b"wide", b"pnot")


def _of(record_id: Any) -> str:
    return f" (record id {record_id!r})" if record_id is not None else ""


def _video_uri(source: str, record_id: Any) -> bytes | None:
    """The bytes of a ``data:video/...;base64,`` URI, else None."""
    try:
        return data_uri(source)
    except RecordError as e:
        raise RecordError("unreadable_video", f"{e.detail}{_of(record_id)}") from None


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
        RecordError: ``unreadable_video``: another extension, or ``head`` starts no video.
    """
    extension = Path(name).suffix.lower().removeprefix(".")
    if extension and extension not in VIDEO_EXTENSIONS:
        raise RecordError(
            "unreadable_video",
            f"{what}: extension .{extension} is not one of {', '.join(VIDEO_EXTENSIONS)}; "
            "remux it (ffmpeg -i IN -c copy OUT.mp4) and point the record at the new file",
        )
    container = _container(head)
    if container is None:
        raise RecordError("unreadable_video", f"{what} is not a video file: {_looks(head, size)}")
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


_BLOCK = 512
_RECORD = 20 * _BLOCK  # tar's record: an archive's length is a multiple of it


class _Shards:
    """Tar shards of one split, cut at ``max_count`` samples or ``max_bytes``, written as
    ``tarfile`` writes USTAR (headers from ``TarInfo.tobuf``: mtime 0, root owner, so the same
    input gives the same bytes); file parts are copied by the kernel (``os.sendfile``)."""

    def __init__(self, folder: Path, prefix: str, *, max_count: int, max_bytes: int):
        self.folder, self.prefix = folder, prefix
        self.max_count, self.max_bytes = max_count, max_bytes
        self.out: Any = None
        self.paths: list[Path] = []
        self.count = self.bytes = self.offset = 0

    def add(self, key: str, parts: dict[str, bytes | FilePart]) -> None:
        if self.out is None or self.count >= self.max_count or self.bytes >= self.max_bytes:
            self.close()
            path = self.folder / f"{self.prefix}-{len(self.paths):05d}.tar"
            self.paths.append(path)
            self.out = open(path, "wb")  # noqa: SIM115 (closed in close)
            self.count = self.bytes = self.offset = 0
        for part, data in parts.items():
            info = tarfile.TarInfo(f"{key}.{part}")
            info.size = data.size if isinstance(data, FilePart) else len(data)
            info.mtime, info.mode = 0, 0o644
            self._write(info.tobuf(tarfile.USTAR_FORMAT, "utf-8", "surrogateescape"))
            if isinstance(data, FilePart):
                self._copy(data)
            else:
                self._write(data)
            self._write(bytes(-info.size % _BLOCK))
            self.bytes += info.size + _BLOCK
        self.count += 1

    def _write(self, data: bytes) -> None:
        self.out.write(data)
        self.offset += len(data)

    def _copy(self, part: FilePart) -> None:
        self.out.flush()
        with open(part.path, "rb") as source:
            left, position = part.size, 0
            while left > 0:
                sent = os.sendfile(self.out.fileno(), source.fileno(), position, left)
                if sent == 0:  # the file shrank since it was measured
                    raise OSError(f"{part.path} is shorter than {part.size} bytes")
                left, position = left - sent, position + sent
        self.out.seek(0, os.SEEK_END)
        self.offset += part.size

    def close(self) -> None:
        if self.out is not None:
            end = self.offset + 2 * _BLOCK  # two zero blocks end the archive
            self._write(bytes(2 * _BLOCK + (-end % _RECORD)))
            self.out.close()
            self.out = None


def _is_val(index: int, fraction: float) -> bool:
    return fraction > 0 and (index * PHI) % 1.0 < fraction


def convert(
    *,
    source: Path | str,
    out: Path | str,
    format: str = "auto",
    media_root: Path | str | None = None,
    val_fraction: float = 0.0,
    val_files: tuple[str, ...] = (),
    samples_per_shard: int = 1000,
    shard_bytes: int = 1 << 30,
    prepare: bool = True,
    progress: bool = False,
) -> ConvertResult:
    """Converts ``source`` into prepared Energon shards under ``out`` (see the module docstring).

    Args:
        source: A file or folder of records.
        out: The dataset folder to create (must not exist, or be empty).
        format: ``auto`` or one of ``llava``, ``sharegpt``, ``hf``, ``messages``.
        media_root: Where relative image and video paths point (default: the source's
            folder; LLaVA-Video-178K's paths are relative to the folder of their JSON file).
        val_fraction: Records (evenly spread, deterministic) that go to a ``val`` split.
        val_files: Source files (names, as the report and the map write them) whose records
            all go to ``val`` (a source folder holding train and val files).
        samples_per_shard, shard_bytes: Where a shard is cut.
        prepare: Run ``energon-packing prepare`` on the result.
        progress: A tqdm bar over the records.
    """
    source, out = Path(source), Path(out)
    val_files = tuple(val_files)
    if format != "auto" and format not in FORMATS:
        raise ValueError(f"format={format!r}; choose auto or one of {', '.join(FORMATS)}")
    if not 0 <= val_fraction < 1:
        raise ValueError(f"val_fraction={val_fraction} must be in [0, 1)")
    if not source.exists():
        raise FileNotFoundError(f"{source} does not exist")
    check_source(source, val_files)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"{out} exists and is not empty: convert writes a new dataset folder")
    root = (
        Path(media_root)
        if media_root is not None
        else (source if source.is_dir() else source.parent)
    )
    created = not out.exists()  # or empty: either way, all in it is this run's
    try:
        return _convert(
            source, out, format, _MediaLoader(root), val_fraction, val_files,
            samples_per_shard, shard_bytes, prepare, progress,
        )  # fmt: skip
    except BaseException:  # a failed run leaves no half-written folder for the next to refuse
        if created:
            shutil.rmtree(out, ignore_errors=True)
        else:
            for child in out.iterdir():
                shutil.rmtree(child) if child.is_dir() else child.unlink()
        raise


def _convert(
    source, out, format, load, val_fraction, val_files, samples_per_shard, shard_bytes, prepare,
    progress,
) -> ConvertResult:  # fmt: skip
    shards_dir = out / "shards"
    shards_dir.mkdir(parents=True, exist_ok=True)
    splits = {
        name: _Shards(shards_dir, name, max_count=samples_per_shard, max_bytes=shard_bytes)
        for name in ("train", "val")
    }
    result = ConvertResult(out=out)
    records = read_records(source)
    if progress:
        from tqdm import tqdm

        records = tqdm(records, unit=" records", desc=f"convert {source.name}")
    position = 0
    with (
        open(out / REPORT_FILE, "w", encoding="utf-8") as report,
        open(out / MAP_FILE, "w", encoding="utf-8") as mapping,
    ):
        for file, index, record in records:
            key = f"r{position:09d}"
            position += 1
            try:
                converted = _document(record, format, load)
            except RecordError as e:
                result.reported[e.reason] = result.reported.get(e.reason, 0) + 1
                line = {"file": file, "index": index, "reason": e.reason, "detail": e.detail}
                report.write(json.dumps(line, ensure_ascii=False) + "\n")
                continue
            document = json.dumps(converted.document, ensure_ascii=False).encode("utf-8")
            is_val = file in val_files or _is_val(position - 1, val_fraction)
            split = "val" if is_val else "train"
            splits[split].add(key, {"json": document, **converted.parts})
            setattr(result, split, getattr(result, split) + 1)
            result.converted += 1
            entry = {"file": file, "index": index, "id": _plain(converted.id), "key": key}
            mapping.write(json.dumps(entry, ensure_ascii=False) + "\n")
    for shards in splits.values():
        shards.close()
        result.shards += shards.paths
    if result.converted and not result.train:
        raise ValueError(
            f"every converted record ({result.val:,}) went to val (val_files="
            f"{list(val_files)}, val_fraction={val_fraction}): nothing is left to train on"
        )
    if prepare and result.converted:
        from energon_packing.loader.prepare import prepare_dataset

        parts = [f"{name}:shards/{name}-.*\\.tar$" for name in splits if splits[name].paths]
        prepare_dataset(out, split_parts=parts)
    return result


def _document(record: Any, format: str, load: _MediaLoader) -> Converted:
    """One record as read -> :class:`Converted`, or :class:`RecordError` (its report)."""
    if isinstance(record, Broken):
        raise RecordError("malformed_record", record.detail)
    _refuse_captions(record)
    as_video = _with_video_placeholders(record)
    rewritten = as_video is not record
    record_id = record.get("id") if isinstance(record, dict) else None
    record = _with_video_parts(as_video)
    try:
        fmt = detect_format(record) if format == "auto" else format
        return to_document(record, fmt, partial(load, record_id=record_id))
    except RecordError as e:
        if not rewritten or e.reason != "malformed_record":
            raise
        note = "; its <image> placeholders stand for its video (a LLaVA-Video record)"
        raise RecordError(e.reason, f"{e.detail}{_of(record_id)}{note}") from None


def _present(record: dict, *names: str) -> bool:
    """Whether ``record`` lists media under any of ``names`` (empty strings are none)."""
    for name in names:
        value = record.get(name)
        if any(v not in (None, "") for v in (value if isinstance(value, list) else [value])):
            return True
    return False


def _turn_key(turn: Any) -> str | None:
    """The key of a ``from``/``value`` turn's text (``value``, else ``content``)."""
    if not isinstance(turn, dict):
        return None
    return next((k for k in ("value", "content") if isinstance(turn.get(k), str)), None)


def _with_video_placeholders(record: Any) -> Any:
    """A LLaVA-Video record (a ``video``, no ``image``) whose turns write ``<image>`` and never
    ``<video>``: the same record with ``<video>`` there, since LLaVA-NeXT's trainer reads the
    video in ``<image>``'s place; any other record as it is."""
    if not isinstance(record, dict) or not isinstance(record.get("conversations"), list):
        return record
    if _present(record, "image", "images") or not _present(record, "video", "videos"):
        return record
    turns = record["conversations"]
    texts = [turn[key] for turn in turns if (key := _turn_key(turn))]
    if any(VIDEO in text for text in texts) or not any(IMAGE in text for text in texts):
        return record
    return {**record, "conversations": [_image_is_video(turn) for turn in turns]}


def _image_is_video(turn: Any) -> Any:
    key = _turn_key(turn)
    return {**turn, key: turn[key].replace(IMAGE, VIDEO)} if key else turn


def _with_video_parts(record: Any) -> Any:
    """Messages whose video parts name their file as transformers' chat templates write it
    (``{"type": "video", "path" | "url": ...}``) or OpenAI-style (``{"type": "video_url",
    "video_url": {"url": ...}}``): the same with ``{"type": "video", "video": ...}``."""
    if not isinstance(record, dict):
        return record
    out = dict(record)
    for key in ("messages", "conversations"):
        if isinstance(record.get(key), list):
            out[key] = [_message_parts(message) for message in record[key]]
    return out


def _message_parts(message: Any) -> Any:
    if not isinstance(message, dict) or not isinstance(message.get("content"), list):
        return message
    return {**message, "content": [_video_part(part) for part in message["content"]]}


def _video_part(part: Any) -> Any:
    if not isinstance(part, dict):
        return part
    if part.get("type") == "video_url":
        source = part.get("video_url")
        return {"type": "video", "video": source.get("url") if isinstance(source, dict) else source}
    if part.get("type") == "video" and part.get("video") is None:
        source = next((part[k] for k in ("path", "url") if isinstance(part.get(k), str)), None)
        return {**part, "video": source} if source is not None else part
    return part


def _refuse_captions(record: Any) -> None:
    """ShareGPT4Video's caption records (``sharegpt4video_40k.jsonl``) hold no conversation:
    reported with the way out (convert writes no prompt of its own)."""
    if (
        isinstance(record, dict)
        and isinstance(record.get("captions"), list)
        and not any(key in record for key in ("conversations", "messages", "texts"))
    ):
        raise RecordError(
            "malformed_record",
            f"a caption record ({len(record['captions'])} captions of video "
            f"{record.get('video_id', record.get('video_path'))!r}), not a conversation: "
            "convert invents no prompt; convert the SFT file (LLaVA records with 'video' and "
            "<video>) or write each caption as a user/assistant pair",
        )


def _plain(value: Any) -> Any:
    """A record id as JSON can hold it."""
    return value if value is None or isinstance(value, (str, int, float, bool)) else str(value)
