"""``energon-packing convert``: users' data -> prepared Energon WebDataset shards, exactly once.

Sources (``--format auto`` decides record by record what the explicit format would):

* a ``.json`` file holding a list of records (LLaVA, ShareGPT), read as a stream (or objects
  one after another: JSON lines under a ``.json`` name);
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
record's id and the path. Images are decoded and videos' container headers read, as the loader
will, unless ``decode`` is off (:mod:`energon_packing.incoming.media`): a truncated JPEG is
reported ``corrupt_image`` here, not at training time.

Output (``OUT`` is created; refused if it exists and is not empty, unless an earlier convert
wrote it and ``overwrite`` is set, or it holds only the report of a run that failed)::

    OUT/shards/train-00000.tar ...     <key>.json + <key>.img0.jpg ...   (keys: r000000000 ...)
    OUT/shards/val-00000.tar ...       with --val-fraction (disjoint from train)
    OUT/convert_report.jsonl           {"file", "index", "reason", "detail", "keys"} per record not converted
    OUT/convert_map.jsonl              {"file", "index", "id", "key"} per converted record
    OUT/.nv-meta/...                   prepared (energon-packing prepare), train and val splits

``file`` is the record's file, as a path relative to a source folder (a ``save_to_disk`` folder
is one file, named by the folder); ``index`` is 0-based within it: the position in a JSON list,
the line of a JSONL file (broken and blank lines counted), the row of a dataset or parquet file.
A JSON list that stops parsing is reported once, at the first record it cannot read, with the
note that no later record of that file was read. A folder holding the hub's split files of
several splits (``train-*``, ``test-*``) is refused unless ``--val-file`` names the held-out
ones; nothing is written before every check passed, and a failed run removes what it wrote.
A run that converts nothing, or less than ``min_converted`` of the records it read, raises
:class:`ConvertError` (one line: the reasons, the first rejected record's keys, the ``--format``
/ ``--columns`` that read it when another reader does) and leaves only its report in ``OUT``,
which the rerun replaces. Memory stays flat in the dataset size: records stream in, samples
stream out, one shard open at a time.
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

from energon_packing.incoming.media import VIDEO_EXTENSIONS, FilePart, MediaLoader, of
from energon_packing.incoming.records import (
    COLUMNS,
    FORMATS,
    IMAGE,
    NEEDS,
    VIDEO,
    Converted,
    RecordError,
    detect_format,
    map_columns,
    parse_columns,
    suffix_of,
    to_document,
)

__all__ = ["ConvertError", "ConvertResult", "convert", "read_records"]

logger = logging.getLogger("energon_packing")

REPORT_FILE = "convert_report.jsonl"
MAP_FILE = "convert_map.jsonl"
#: 1 / golden ratio: record i goes to val when frac(i * PHI) < val_fraction (evenly spread)
PHI = 0.6180339887498949
_CHUNK = 1 << 20


@dataclass(kw_only=True, slots=True)
class ConvertResult:
    out: Path
    converted: int = 0
    train: int = 0
    val: int = 0
    reported: dict[str, int] = field(default_factory=dict)
    shards: list[Path] = field(default_factory=list)
    #: records read (converted + reported)
    read: int = 0

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
    """The records of a ``.json`` file, one at a time (never the whole list): the items of one
    JSON list, or JSON objects one after another (JSON lines written as ``.json``, or a single
    object). A record that does not parse ends the read: it is reported with the indices not
    read."""
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
            if not skip(" \t\r\n") or buffer[position] not in "[{":
                yield 0, Broken("the file does not hold a JSON list of records, nor objects")
                return
            # "{": JSON lines in a .json file, or one object: each object is a record
            objects = buffer[position] == "{"
            position += 0 if objects else 1
            index = 0
            while skip(" \t\r\n" if objects else " \t\r\n,"):
                if buffer[position] == "]" and not objects:
                    return
                try:
                    record, end = decoder.raw_decode(buffer, position)
                except json.JSONDecodeError as error:
                    if eof or len(buffer) - position > _MAX_RECORD:
                        yield (
                            index,
                            Broken(
                                f"not JSON ({error.msg}); the file does not parse from record "
                                f"{index} on, so no later record of this file was read"
                            ),
                        )
                        return
                    more(max(_CHUNK, len(buffer) - position))  # doubles: linear in the record
                    continue
                yield index, record
                index, position = index + 1, end
            if not objects:
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
            "reading a Hugging Face dataset needs pyarrow: pip install 'pyarrow>=14' (the "
            "[datasets] extra: pip install '.[datasets]' in the checkout, or the wheel with "
            "[datasets])"
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
    """(path, name) of every record file under ``source``: JSON, JSONL and parquet files and
    ``save_to_disk`` folders, each named by its path relative to ``source`` (its own name for
    a file source)."""
    if source.is_file():
        if source.suffix not in _KINDS:
            raise ValueError(
                f"{source}: not a .json, .jsonl or .parquet file, nor a dataset folder"
            )
        return [(source, source.name)]
    # a save_to_disk folder inside is one file (its rows), its state and info JSON no records
    datasets = {p.parent for p in source.rglob("*.arrow") if (p.parent / "state.json").exists()}
    paths = sorted(
        p
        for p in source.rglob("*")
        if (p in datasets) or (p.suffix in _KINDS and p.is_file() and not datasets & set(p.parents))
    )
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
        if path.is_dir():
            rows = _arrow_rows(_arrow_files(path))
        elif path.suffix == ".parquet":
            rows = _parquet_rows(path)
        elif path.suffix == ".jsonl":
            rows = _json_lines(path)
        else:
            rows = _json_list(path)
        for index, record in rows:
            yield name, index, record


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


class ConvertError(Exception):
    """A convert that converted nothing, or less than ``min_converted`` of what it read: the
    message says why in one line; ``result`` holds the counts. ``OUT`` keeps only its report."""

    def __init__(self, message: str, *, result: ConvertResult):
        super().__init__(message)
        self.result = result


def convert(
    *,
    source: Path | str,
    out: Path | str,
    format: str = "auto",
    columns: str | dict[str, str] | None = None,
    dataset_info: Path | str | None = None,
    dataset: str | None = None,
    media_root: Path | str | None = None,
    val_fraction: float = 0.0,
    val_files: tuple[str, ...] = (),
    samples_per_shard: int = 1000,
    shard_bytes: int = 1 << 30,
    min_converted: float = 0.5,
    overwrite: bool = False,
    prepare: bool = True,
    progress: bool = False,
    decode: bool = True,
) -> ConvertResult:
    """Converts ``source`` into prepared Energon shards under ``out`` (see the module docstring).

    Args:
        source: A file or folder of records (with ``dataset_info``: LLaMA-Factory's dataset
            folder, the entry's ``file_name`` is read under it).
        out: The dataset folder to create (must not exist, or be empty; see ``overwrite``).
        format: ``auto`` or one of :data:`~energon_packing.incoming.records.FORMATS`.
        columns: The record keys that hold what we read, as ``{"messages": "conv", "images":
            "imgs"}``, ``"messages=conv,images=imgs"`` or ms-swift's JSON ``'{"conv":
            "messages"}'`` (names: :data:`~energon_packing.incoming.records.COLUMNS`).
        dataset_info, dataset: LLaMA-Factory's ``dataset_info.json`` and the entry to read: its
            ``file_name``, ``formatting``, ``columns`` and ``tags`` (``columns`` adds to them).
        media_root: Where relative image and video paths point (default: the source's
            folder; LLaVA-Video-178K's paths are relative to the folder of their JSON file).
        val_fraction: Records (evenly spread, deterministic) that go to a ``val`` split.
        val_files: Source files (names, as the report and the map write them) whose records
            all go to ``val`` (a source folder holding train and val files).
        samples_per_shard, shard_bytes: Where a shard is cut.
        min_converted: The fraction of the records read that must convert; a run that converts
            fewer (or none) raises :class:`ConvertError` and leaves only its report in ``out``.
        overwrite: Replace ``out`` when an earlier convert wrote it (never another folder).
        prepare: Run ``energon-packing prepare`` on the result.
        progress: A tqdm bar over the records.
        decode: Decode every image and read every video's container header, as the loader
            will (a record whose medium fails is reported under the loader's reason, e.g.
            ``corrupt_image``); off: faster, such faults surface only in the loader.

    Raises:
        ConvertError: Nothing, or less than ``min_converted``, converted (one line: the
            reasons, the first rejected record's keys, the ``--format`` / ``--columns`` that
            read it when one does).
    """
    source, out = Path(source), Path(out)
    val_files = tuple(val_files)
    columns = parse_columns(columns)
    tags: dict[str, str] = {}
    if dataset_info is not None:
        source, format, listed, tags = _from_dataset_info(
            Path(dataset_info), dataset, source, format
        )
        columns = {**listed, **columns}
    elif dataset is not None:
        raise ValueError("dataset= names an entry of dataset_info=: pass both (--dataset-info)")
    if format != "auto" and format not in FORMATS:
        raise ValueError(f"format={format!r}; choose auto or one of {', '.join(FORMATS)}")
    if not 0 <= val_fraction < 1:
        raise ValueError(f"val_fraction={val_fraction} must be in [0, 1)")
    if not 0 <= min_converted <= 1:
        raise ValueError(f"min_converted={min_converted} must be in [0, 1]")
    if not source.exists():
        raise FileNotFoundError(f"{source} does not exist")
    check_source(source, val_files)
    _clear_out(out, overwrite=overwrite)
    root = (
        Path(media_root)
        if media_root is not None
        else (source if source.is_dir() else source.parent)
    )
    created = not out.exists()  # or empty: either way, all in it is this run's
    how = _How(format=format, columns=columns, tags=tags)
    try:
        result, rejected = _convert(
            source, out, how, MediaLoader(root, decode=decode), val_fraction, val_files,
            samples_per_shard, shard_bytes, progress,
        )  # fmt: skip
        if not result.converted or result.converted < min_converted * result.read:
            _keep_only_report(out)
            raise ConvertError(_why(result, rejected, how, min_converted), result=result)
        if prepare:
            from energon_packing.incoming.prepare import prepare_dataset

            parts = [
                f"{name}:shards/{name}-.*\\.tar$"
                for name in ("train", "val")
                if getattr(result, name)
            ]
            prepare_dataset(out, split_parts=parts)
        return result
    except ConvertError:
        raise
    except BaseException:  # a failed run leaves no half-written folder for the next to refuse
        if created:
            shutil.rmtree(out, ignore_errors=True)
        else:
            for child in out.iterdir():
                shutil.rmtree(child) if child.is_dir() else child.unlink()
        raise


@dataclass(kw_only=True, slots=True)
class _How:
    """How records are read: the format and the column mapping (and LLaMA-Factory's tags)."""

    format: str
    columns: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)


#: What convert writes into OUT: a folder holding only these is an earlier convert's.
_OURS = {"shards", ".nv-meta", REPORT_FILE, MAP_FILE}


def _clear_out(out: Path, *, overwrite: bool) -> None:
    """Refuses an ``out`` that is not empty, unless it holds only a failed run's report (then
    it is replaced) or ``overwrite`` and an earlier convert wrote it all."""
    if not out.exists():
        return
    if not out.is_dir():
        raise FileExistsError(f"{out} is a file: convert writes a new dataset folder")
    children = {child.name for child in out.iterdir()}
    if not children:
        return
    failed = children == {REPORT_FILE}  # what a run that converted too little leaves
    ours = children <= _OURS and all(  # shards and the .tar.idx files prepare writes
        p.name.startswith(("train-", "val-")) and p.name.endswith((".tar", ".tar.idx"))
        for p in (out / "shards").glob("*")
    )
    if not failed and not overwrite:
        hint = "; pass --overwrite to replace what an earlier convert wrote" if ours else ""
        raise FileExistsError(
            f"{out} exists and is not empty: convert writes a new dataset folder{hint}"
        )
    if not failed and not ours:
        extra = sorted(children - _OURS)[:5]
        raise FileExistsError(
            f"{out} holds files convert does not write ({', '.join(extra)}): --overwrite "
            "replaces only a folder an earlier convert wrote; choose another OUT"
        )
    logger.info("replacing %s, written by an earlier convert", out)
    for name in children:
        path = out / name
        shutil.rmtree(path) if path.is_dir() else path.unlink()


def _keep_only_report(out: Path) -> None:
    """A run that converted too little leaves only its report: no dataset to mistake for a
    good one, nothing a rerun must be told to overwrite."""
    for child in out.iterdir():
        if child.name != REPORT_FILE:
            shutil.rmtree(child) if child.is_dir() else child.unlink()


def _from_dataset_info(
    info_path: Path, name: str | None, source: Path, format: str
) -> tuple[Path, str, dict[str, str], dict[str, str]]:
    """LLaMA-Factory's ``dataset_info.json`` entry ``name`` -> (the records' path, format,
    columns, tags)."""
    try:
        info = json.loads(info_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ValueError(f"--dataset-info {info_path} does not read as JSON ({e})") from None
    if not isinstance(info, dict):
        raise ValueError(f"--dataset-info {info_path} holds no object of datasets")
    if name not in info:
        raise ValueError(
            f"--dataset {name!r} is not in {info_path} (it lists {', '.join(sorted(info)[:20])})"
        )
    entry = info[name]
    if not isinstance(entry, dict):
        raise ValueError(f"{info_path}: entry {name!r} is not an object")
    if entry.get("ranking"):
        raise ValueError(
            f"{info_path}: {name!r} is preference data (ranking: true), not SFT conversations"
        )
    file_name = entry.get("file_name")
    if file_name is None:
        hub = next(
            (
                entry[k]
                for k in ("hf_hub_url", "ms_hub_url", "om_hub_url", "script_url")
                if k in entry
            ),
            None,
        )
        raise ValueError(
            f"{info_path}: {name!r} names no file_name"
            + (f" (it is {hub!r} on a hub: download it and pass its files)" if hub else "")
        )
    formatting = entry.get("formatting", "alpaca")  # LLaMA-Factory's default
    if formatting not in ("alpaca", "sharegpt"):
        raise ValueError(
            f"{info_path}: {name!r} has formatting {formatting!r}, not alpaca or sharegpt"
        )
    renames = {"prompt": "instruction", "query": "input", "response": "output"}
    columns = {}
    for ours, theirs in (entry.get("columns") or {}).items():
        if formatting == "alpaca":
            ours = renames.get(ours, ours)
        if ours in ("tools", "kto_tag", "chosen", "rejected"):
            continue  # not read: a record that fills them is refused by its shape
        columns[ours] = theirs
    tags = {k: v for k, v in (entry.get("tags") or {}).items() if isinstance(v, str)}
    if source.is_dir() and (source / file_name).exists():
        source = source / file_name
    if format == "auto":
        format = formatting
    return source, format, parse_columns(columns), tags


def _convert(
    source, out, how, load, val_fraction, val_files, samples_per_shard, shard_bytes, progress
) -> tuple[ConvertResult, list]:  # fmt: skip
    """Writes the shards, the report and the map; returns the result and the first rejected
    records (for :func:`_why`)."""
    shards_dir = out / "shards"
    shards_dir.mkdir(parents=True, exist_ok=True)
    splits = {
        name: _Shards(shards_dir, name, max_count=samples_per_shard, max_bytes=shard_bytes)
        for name in ("train", "val")
    }
    result = ConvertResult(out=out)
    rejected: list[tuple[str, int, Any, RecordError]] = []
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
                converted = _document(record, how, load)
            except RecordError as e:
                result.reported[e.reason] = result.reported.get(e.reason, 0) + 1
                line = {"file": file, "index": index, "reason": e.reason, "detail": e.detail}
                if isinstance(record, dict):
                    line["keys"] = list(record)
                report.write(json.dumps(line, ensure_ascii=False) + "\n")
                if len(rejected) < _TRIED:
                    rejected.append((file, index, record, e))
                continue
            document = json.dumps(converted.document, ensure_ascii=False).encode("utf-8")
            is_val = file in val_files or _is_val(position - 1, val_fraction)
            split = "val" if is_val else "train"
            splits[split].add(key, {"json": document, **converted.parts})
            setattr(result, split, getattr(result, split) + 1)
            result.converted += 1
            entry = {"file": file, "index": index, "id": _plain(converted.id), "key": key}
            mapping.write(json.dumps(entry, ensure_ascii=False) + "\n")
    result.read = position
    for shards in splits.values():
        shards.close()
        result.shards += shards.paths
    if result.converted and not result.train:
        raise ValueError(
            f"every converted record ({result.val:,}) went to val (val_files="
            f"{list(val_files)}, val_fraction={val_fraction}): nothing is left to train on"
        )
    return result, rejected


#: Rejected records kept to try the other readers on (:func:`_why`).
_TRIED = 20


def _why(result: ConvertResult, rejected: list, how: _How, min_converted: float) -> str:
    """One line: what was converted of what was read, the reasons, the first rejected record's
    keys next to what the format reads, and the ``--format`` / ``--columns`` that read the
    rejected records when another reader does."""
    reasons = ", ".join(
        f"{r} {n:,}" for r, n in sorted(result.reported.items(), key=lambda x: -x[1])
    )
    line = f"converted {result.converted:,} of {result.read:,} records read"
    if result.converted:
        line += f", less than --min-converted {min_converted:g} of them"
    line += f" ({reasons or 'no record in the source'})"
    if rejected:
        file, index, record, error = rejected[0]
        if isinstance(record, dict):
            has = f"has keys {', '.join(map(repr, record)) or 'none'}"
        elif isinstance(record, Broken):
            has = "does not read"
        else:
            has = f"is {type(record).__name__}, not an object"
        line += f"; the first rejected, {file} index {index}, {has}"
        if not error.detail.startswith("the record has keys"):
            line += f" ({error.reason}: {_short(error.detail)})"
        if error.reason == "malformed_record" and isinstance(record, dict):
            line += f"; --format {how.format} reads {NEEDS[how.format]}"
            if how.columns:
                line += f" with --columns {_columns_flag(how.columns)}"
            line += f"; {_suggest(rejected, how)}"
    line += (
        f". Only {REPORT_FILE} (every rejected record, its reason and keys) is left in {result.out}"
    )
    if result.converted:
        line += "; --min-converted 0 keeps the records that convert"
    return line


def _short(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _columns_flag(columns: dict[str, str]) -> str:
    return ",".join(f"{name}={key}" for name, key in columns.items())


def _stub(source: Any, kind: str, *, record_id: Any = None) -> tuple[bytes, str]:
    """A media loader that reads nothing: tries a reader on a record's shape alone."""
    return b"", ".mp4" if kind == "video" else ".jpg"


def _suggest(rejected: list, how: _How) -> str:
    """The ``--format`` / ``--columns`` that read the most of ``rejected`` (shape only, no
    media read), when that beats the ones used."""
    records = [record for _, _, record, _ in rejected if isinstance(record, dict)]
    if not records:
        return "no other --format reads a record that is not an object"

    def reads(candidate: _How) -> int:
        count = 0
        for record in records:
            try:
                _document(record, candidate, _stub)
                count += 1
            except RecordError:
                pass
        return count

    guessed = {**how.columns, **_guess_columns(records[0])}
    candidates = [
        _How(format=fmt, columns=cols, tags=how.tags)
        for cols in ([how.columns, guessed] if guessed != how.columns else [how.columns])
        for fmt in ("auto", *FORMATS)
    ]
    now = reads(how)
    best, count = max(((c, reads(c)) for c in candidates), key=lambda pair: pair[1])
    if count <= now:
        return "no other --format or --columns reads them"
    flags = [f"--format {best.format}"] if best.format != how.format else []
    if best.columns != how.columns:
        flags.append(f"--columns {_columns_flag(best.columns)}")
    flags = " ".join(flags)
    return f"{flags} reads {count} of the first {len(records)} rejected"


def _guess_columns(record: dict) -> dict[str, str]:
    """The columns a record's unknown keys look like: a list of turns, a list of media."""
    guessed: dict[str, str] = {}
    for key, value in record.items():
        if key in COLUMNS or key in ("image", "video", "conversations", "conversation"):
            continue
        items = value if isinstance(value, list) else [value]
        if items and all(
            isinstance(t, dict) and ({"from", "role", "human"} & set(t)) for t in items
        ):
            guessed.setdefault("messages", key)
        elif items and all(_looks_like_media(m) for m in items):
            kind = (
                "videos"
                if any(
                    str(m).lower().endswith(tuple(f".{e}" for e in VIDEO_EXTENSIONS)) for m in items
                )
                else "images"
            )
            guessed.setdefault(kind, key)
    return guessed


def _looks_like_media(value: Any) -> bool:
    if isinstance(value, dict):
        return "bytes" in value or "path" in value
    return isinstance(value, str) and bool(suffix_of(value)) and "\n" not in value


def _document(record: Any, how: _How, load: Any) -> Converted:
    """One record as read -> :class:`Converted`, or :class:`RecordError` (its report)."""
    if isinstance(record, Broken):
        raise RecordError("malformed_record", record.detail)
    record = map_columns(record, how.columns, how.tags)
    _refuse_captions(record)
    as_video = _with_video_placeholders(record)
    rewritten = as_video is not record
    record_id = record.get("id") if isinstance(record, dict) else None
    record = _with_video_parts(as_video)
    try:
        fmt = detect_format(record) if how.format == "auto" else how.format
        return to_document(record, fmt, partial(load, record_id=record_id))
    except RecordError as e:
        if not rewritten or e.reason != "malformed_record":
            raise
        note = "; its <image> placeholders stand for its video (a LLaVA-Video record)"
        raise RecordError(e.reason, f"{e.detail}{of(record_id)}{note}") from None


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
    for key in ("messages", "conversations", "conversation"):
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
