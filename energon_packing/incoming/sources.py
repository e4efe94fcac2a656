"""The records of a source: files of users' records read one at a time, never whole.

* a ``.json`` file holding a list of records (LLaVA, ShareGPT), read as a stream (or objects
  one after another: JSON lines under a ``.json`` name);
* a ``.jsonl`` file, one record per line (messages, ShareGPT, LLaVA); a broken line is reported;
* a Hugging Face dataset: a ``save_to_disk`` folder (``*.arrow``) or ``.parquet`` files (a file
  or a folder of them); image columns as ``{"bytes", "path"}``;
* a folder of ``.json`` / ``.jsonl`` files (in name order).

A record that does not read is a :class:`Broken` (reported ``malformed_record``). A folder
holding the hub's split files of several splits (``train-*``, ``test-*``) is refused by
:func:`check_source` unless the held-out ones are named.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Broken", "check_source", "read_records"]

_CHUNK = 1 << 20


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
