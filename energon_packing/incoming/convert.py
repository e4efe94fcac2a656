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
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from energon_packing.errors import Skip
from energon_packing.incoming.columns import from_dataset_info, parse_columns
from energon_packing.incoming.diagnosis import TRIED, why
from energon_packing.incoming.media import MediaLoader
from energon_packing.incoming.records import FORMATS
from energon_packing.incoming.reshape import How, read_record
from energon_packing.incoming.sources import check_source, read_records
from energon_packing.incoming.tar_writer import Shards

__all__ = ["ConvertError", "ConvertResult", "convert", "read_records"]

logger = logging.getLogger("energon_packing")

REPORT_FILE = "convert_report.jsonl"

MAP_FILE = "convert_map.jsonl"

#: 1 / golden ratio: record i goes to val when frac(i * PHI) < val_fraction (evenly spread)
PHI = 0.6180339887498949


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
    workers: int | None = None,
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
        workers: Threads decoding images (``decode``), records written in order all the same;
            default: the CPUs this process may run on, at most 8; 1: in the calling thread.

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
        source, format, listed, tags = from_dataset_info(
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
    workers = _workers(workers) if decode else 1
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
    how = How(format=format, columns=columns, tags=tags)
    # Pillow decodes without the GIL: threads decode the images of the records ahead
    pool = ThreadPoolExecutor(workers, thread_name_prefix="decode") if workers > 1 else None
    try:
        result, rejected = _convert(
            source, out, how, MediaLoader(root, decode=decode, pool=pool), val_fraction,
            val_files, samples_per_shard, shard_bytes, progress, 4 * workers if pool else 0,
        )  # fmt: skip
        if not result.converted or result.converted < min_converted * result.read:
            _keep_only_report(out)
            line = why(result, rejected, how, min_converted)
            line += f". Only {REPORT_FILE} (every rejected record, its reason and keys) is left in {out}"
            if result.converted:
                line += "; --min-converted 0 keeps the records that convert"
            raise ConvertError(line, result=result)
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
        if pool is not None:
            pool.shutdown(cancel_futures=True)
        if created:
            shutil.rmtree(out, ignore_errors=True)
        else:
            for child in out.iterdir():
                shutil.rmtree(child) if child.is_dir() else child.unlink()
        raise
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)


def _workers(workers: int | None) -> int:
    """The decode threads: ``workers``, else the CPUs this process may run on (at most 8)."""
    if workers is None:
        return max(1, min(8, len(os.sched_getaffinity(0))))
    if workers < 1:
        raise ValueError(f"workers={workers} must be >= 1 (1: decode in the converting thread)")
    return workers


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


def _convert(
    source, out, how, load, val_fraction, val_files, samples_per_shard, shard_bytes, progress,
    depth,
) -> tuple[ConvertResult, list]:  # fmt: skip
    """Writes the shards, the report and the map; returns the result and the first rejected
    records (for :func:`_why`)."""
    shards_dir = out / "shards"
    shards_dir.mkdir(parents=True, exist_ok=True)
    splits = {
        name: Shards(shards_dir, name, max_count=samples_per_shard, max_bytes=shard_bytes)
        for name in ("train", "val")
    }
    result = ConvertResult(out=out)
    rejected: list[tuple[str, int, Any, Skip]] = []
    records = read_records(source)
    if progress:
        from tqdm import tqdm

        records = tqdm(records, unit=" records", desc=f"convert {source.name}")
    position = 0
    # records whose images are still being decoded (load.pool), settled and written in order
    window: deque[tuple] = deque()
    with (
        open(out / REPORT_FILE, "w", encoding="utf-8") as report,
        open(out / MAP_FILE, "w", encoding="utf-8") as mapping,
    ):

        def settle(file, index, record, position, outcome, checks) -> None:
            try:
                if isinstance(outcome, Skip):
                    raise outcome
                for check in checks:
                    check.result()
            except Skip as e:
                result.reported[e.reason] = result.reported.get(e.reason, 0) + 1
                line = {"file": file, "index": index, "reason": e.reason, "detail": e.detail}
                if isinstance(record, dict):
                    line["keys"] = list(record)
                report.write(json.dumps(line, ensure_ascii=False) + "\n")
                if len(rejected) < TRIED:
                    rejected.append((file, index, record, e))
                return
            key = f"r{position:09d}"
            document = json.dumps(outcome.document, ensure_ascii=False).encode("utf-8")
            is_val = file in val_files or _is_val(position, val_fraction)
            split = "val" if is_val else "train"
            splits[split].add(key, {"json": document, **outcome.parts})
            setattr(result, split, getattr(result, split) + 1)
            result.converted += 1
            entry = {"file": file, "index": index, "id": _plain(outcome.id), "key": key}
            mapping.write(json.dumps(entry, ensure_ascii=False) + "\n")

        for file, index, record in records:
            try:
                outcome = read_record(record, how, load)
            except Skip as e:
                outcome = e
            checks = load.pending()
            if isinstance(outcome, Skip):
                for check in checks:  # its other media need no decode
                    check.cancel()
                checks = []
            window.append((file, index, record, position, outcome, checks))
            position += 1
            while len(window) > depth:
                settle(*window.popleft())
        while window:
            settle(*window.popleft())
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


def _plain(value: Any) -> Any:
    """A record id as JSON can hold it."""
    return value if value is None or isinstance(value, (str, int, float, bool)) else str(value)
