"""Shared-memory segments a loader worker reuses for its batches' large tensors.

A fresh shared-memory page costs several times a reused one: tmpfs allocates, zeroes and
accounts every page, and frees it when the main process lets go (~28 ms per 30 MB of pixels on
the 2-core benchmark VM, where writing the same bytes into reused memory costs ~3 ms). So a
worker keeps a few segments (memfds) and lays a pack's pixels out in a free one. A segment is
free again once the worker holds no view of it and the main process has let go of every tensor
it rebuilt from it. Its first page holds two counters, each with one writer::

    | sent (worker) | released (main) | ...  (one page) | data ............. (capacity bytes) |

Pickling a segment's tensor (the handoff) counts ``sent`` and passes the segment's file
descriptor; the main process maps the segment, and when the last view of the tensor it rebuilt
dies, counts ``released``. ``sent == released`` and no view in the worker: free. A segment
grows (never shrinks) to the largest tensor it held; a worker keeps at most :data:`SEGMENTS`
of at most :data:`BUDGET` bytes together, until it exits, and a tensor that finds none free
gets fresh shared memory of its own, as before.
"""

from __future__ import annotations

import mmap
import os
import struct
import threading
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["BUDGET", "SEGMENTS", "Pool", "pool", "rebuild"]

#: Segments a worker keeps: the packs in flight (the loader's prefetch, the trainer's step, the
#: worker's own) fit; beyond that a tensor gets shared memory of its own.
SEGMENTS = 6
#: The bytes a worker's segments may hold together; a tensor that would take more gets shared
#: memory of its own (long packs' pixels: a C=32768 pack of images can hold ~600 MB).
BUDGET = 512 << 20
HEADER = mmap.PAGESIZE  # the counters' page; the data starts page-aligned after it
GRAIN = 1 << 20  # a segment grows in whole MiB
_SENT, _RELEASED = 0, 8
_COUNTER = struct.Struct("<q")


@dataclass(kw_only=True, slots=True, eq=False)
class _Segment:
    fd: int
    capacity: int  # data bytes
    map: mmap.mmap
    held: bool = False  # a worker-side view of it lives

    def count(self, offset: int) -> int:
        return _COUNTER.unpack_from(self.map, offset)[0]

    def free(self) -> bool:
        return not self.held and self.count(_SENT) == self.count(_RELEASED)


class Pool:
    """One worker process's segments (:func:`pool`)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.segments: list[_Segment] = []
        self.by_address: dict[int, _Segment] = {}  # data address -> its held segment
        self.lock = threading.Lock()

    def array(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray | None:
        """An uninitialised array of ``shape`` and ``dtype`` in a free segment (grown or made
        as needed), or None: all :data:`SEGMENTS` taken, :data:`BUDGET` reached, or the one
        free segment still being let go by another thread."""
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        with self.lock:
            segment = self._take(nbytes)
            if segment is None:
                return None
            segment.held = True
            flat = np.frombuffer(segment.map, dtype=dtype, count=nbytes // dtype.itemsize,
                                 offset=HEADER)  # fmt: skip
            self.by_address[flat.__array_interface__["data"][0]] = segment
            weakref.finalize(flat, self._let_go, segment)
        return flat.reshape(shape)

    def segment_of(self, tensor: Any) -> _Segment | None:
        """The held segment whose data ``tensor`` is, all of it from its start, or None."""
        segment = self.by_address.get(tensor.data_ptr())
        if segment is None or not tensor.is_contiguous():
            return None
        return segment

    def sent(self, segment: _Segment) -> None:
        """Counts a pickle of ``segment``'s tensor: it stays taken until the main process lets
        go of what it rebuilt."""
        with self.lock:
            _COUNTER.pack_into(segment.map, _SENT, segment.count(_SENT) + 1)

    def _take(self, nbytes: int) -> _Segment | None:
        free = [s for s in self.segments if s.free()]
        fitting = [s for s in free if s.capacity >= nbytes]
        if fitting:
            return min(fitting, key=lambda s: s.capacity)
        capacity = -(-nbytes // GRAIN) * GRAIN
        held = sum(s.capacity for s in self.segments)
        if free:  # grown: nobody maps it now, a larger file keeps its counters
            segment = max(free, key=lambda s: s.capacity)
            if held - segment.capacity + capacity > BUDGET:
                return None
            try:
                segment.map.close()
            except BufferError:  # its last view's teardown (another thread) is not done yet
                return None
            os.ftruncate(segment.fd, HEADER + capacity)
            segment.map = mmap.mmap(segment.fd, HEADER + capacity)
            segment.capacity = capacity
            return segment
        if len(self.segments) >= SEGMENTS or held + capacity > BUDGET:
            return None
        fd = os.memfd_create("energon-packing-handoff", os.MFD_CLOEXEC)
        os.ftruncate(fd, HEADER + capacity)
        segment = _Segment(fd=fd, capacity=capacity, map=mmap.mmap(fd, HEADER + capacity))
        self.segments.append(segment)
        return segment

    def _let_go(self, segment: _Segment) -> None:
        with self.lock:
            segment.held = False
            for address, held in list(self.by_address.items()):
                if held is segment:
                    del self.by_address[address]


_pool: Pool | None = None


def pool() -> Pool | None:
    """This process's pool (a forked child gets its own), or None where memfds do not exist."""
    global _pool
    if not hasattr(os, "memfd_create"):
        return None
    if _pool is None or _pool.pid != os.getpid():
        _pool = Pool()
    return _pool


_released_lock = threading.Lock()


def rebuild(df: Any, capacity: int, nbytes: int, dtype: str, shape: tuple[int, ...]) -> Any:
    """The main process's tensor of a segment (unpickling :func:`Pool.sent`'s tensor): a view of
    its own mapping of the segment, which counts ``released`` once its last view dies."""
    import torch

    fd = df.detach()
    try:
        segment = mmap.mmap(fd, HEADER + capacity)
    finally:
        os.close(fd)
    kind = np.dtype(dtype)
    flat = np.frombuffer(segment, dtype=kind, count=nbytes // kind.itemsize, offset=HEADER)
    weakref.finalize(flat, _release, segment)
    return torch.from_numpy(flat.reshape(shape))


def _release(segment: mmap.mmap) -> None:
    with _released_lock:
        _COUNTER.pack_into(segment, _RELEASED, _COUNTER.unpack_from(segment, _RELEASED)[0] + 1)
