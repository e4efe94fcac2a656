"""Corrupt shards skip, they do not end the epoch.

In Energon 7.4.1 a sample whose tar bytes cannot be read (a truncated or overwritten shard, a
shard deleted after ``energon prepare``) raises out of the reader and stops the loader. The
task encoder wraps every reader of the datasets it builds: such a sample becomes one carrying
``__corrupt__`` instead, which the loader turns into a ``corrupt_shard`` skip (counted, key
``<shard>#<index>``, reported like every skip) and reading goes on with the next sample.
"""

from __future__ import annotations

import tarfile
from typing import Any

from megatron.energon.flavors.base_dataset import SavableDataset
from megatron.energon.flavors.webdataset.sample_loader import (
    WebdatasetSampleLoaderDataset,
)

#: What Energon's tar reader raises for unreadable bytes (ValueError: "Unexpected end of tar
#: file", "Inconsistent sample base name"; OSError: missing or unreadable shard files).
READ_ERRORS = (tarfile.TarError, EOFError, OSError, ValueError)


class TolerantReader:
    """An Energon ``ITarReader`` whose unreadable samples come back marked ``__corrupt__``."""

    def __init__(self, reader: Any):
        self.reader = reader

    def __getitem__(self, index: int) -> Any:
        try:
            return self.reader[index]
        except READ_ERRORS as e:
            shard = self._shard(index)
            return {
                "__key__": f"{shard}#{index}",
                "__shard__": shard,
                "__restore_key__": ("Webdataset", index),
                "__sources__": (),
                "__corrupt__": f"{shard}: {type(e).__name__}: {e}",
            }

    def _shard(self, index: int) -> str:
        try:
            return str(
                self.reader.tar_filenames[self.reader._get_itar_sample_pointer(index).tar_file_id]
            )
        except Exception:  # the index itself may be what is broken
            return "unknown-shard"

    def __len__(self) -> int:
        return len(self.reader)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.reader, name)


def make_tolerant(dataset: Any, _seen: set[int] | None = None) -> int:
    """Wraps the readers of every webdataset loader inside ``dataset``; returns how many."""
    seen = set() if _seen is None else _seen
    if id(dataset) in seen:
        return 0
    seen.add(id(dataset))
    wrapped = 0
    if isinstance(dataset, WebdatasetSampleLoaderDataset):
        dataset.join_readers = [
            r if isinstance(r, TolerantReader) else TolerantReader(r) for r in dataset.join_readers
        ]
        return len(dataset.join_readers)
    for value in vars(dataset).values():
        children = value if isinstance(value, (list, tuple)) else (value,)
        for child in children:
            if isinstance(child, tuple):  # BlendDataset keeps (dataset, weight) pairs
                child = child[0] if child else None
            if isinstance(child, SavableDataset):
                wrapped += make_tolerant(child, seen)
    return wrapped
