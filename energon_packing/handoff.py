"""The handoff of a batch from a ``DataLoader`` worker to the main process.

A batch made in a worker crosses by pickle. Torch moves every tensor of it to shared memory,
and each shared storage costs a file descriptor passed through a socket (a connection, an
authentication and an mmap, on both sides). So a worker's batch is a :class:`WorkerBatch`:

* tensors under :data:`OWN_STORAGE_BYTES` (ids, masks, positions, grids) cross inline, as bytes
  in the pickle: a text batch passes no file descriptor;
* larger ones (pixels, as a rule) cross in shared memory, a storage each: in a segment the
  worker reuses once the main process has let go of it (:mod:`energon_packing.shm_pool`; a
  fresh shared page costs about ten times a reused one), else in torch's fresh shared memory.
  A pack's media that its sources join are written there when the pack is laid out
  (:func:`media_buffer`), not copied at the handoff.

The main process gets a plain ``dict`` of plain tensors, value for value the batch (a pool
segment's tensor is a view of the main process's own mapping of it). Measured in
``benchmarks/handoff.py`` and ``benchmarks/long_run.py``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from energon_packing import shm_pool

__all__ = ["OWN_STORAGE_BYTES", "WorkerBatch", "in_worker", "media_buffer", "shared", "to_tensor"]

#: A tensor of at least this many bytes crosses to the main process in shared memory, on a
#: storage of its own; smaller ones cross inline, as bytes in the pickle (their copy costs less
#: than a storage's file descriptor: ``benchmarks/handoff.py``).
OWN_STORAGE_BYTES = 1 << 20


def in_worker() -> bool:
    """Whether this runs inside a ``DataLoader`` worker process."""
    import torch

    return torch.utils.data.get_worker_info() is not None


def media_buffer(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray | None:
    """An uninitialised array of ``shape`` and ``dtype`` in shared memory (a free pool segment,
    else torch's), for a media field that will cross to the main process there (inside a
    worker, at least :data:`OWN_STORAGE_BYTES`); None otherwise (the caller allocates as
    usual). :func:`to_tensor` turns it into its tensor, which the handoff passes as it is."""
    import torch

    nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    if nbytes < OWN_STORAGE_BYTES or not in_worker():
        return None
    segments = shm_pool.pool()
    array = segments.array(shape, dtype) if segments is not None else None
    if array is not None:  # reused memory: no fresh page to allocate, zero and free
        return array
    # What torch's own default_collate does in a worker: a storage made in shared memory, so
    # no private copy is made first and copied again (the only torch internal this package
    # reads; without it the handoff copies, as it would anyway)
    new_shared = getattr(torch.UntypedStorage, "_new_shared", None)
    if new_shared is None:
        return None
    kind = torch.from_numpy(np.empty(0, dtype=dtype)).dtype
    return torch.empty(0, dtype=kind).set_(new_shared(nbytes)).view(shape).numpy()


def to_tensor(array: np.ndarray) -> Any:
    """``torch.from_numpy(array)``, but the shared tensor itself where ``array`` is all of a
    :func:`media_buffer` (from_numpy would hide that its memory is shared, and the handoff would
    copy it)."""
    import torch

    base = array.base
    if (
        isinstance(base, torch.Tensor)
        and base.is_shared()
        and base.data_ptr() == array.__array_interface__["data"][0]
        and tuple(base.shape) == array.shape
        and base.untyped_storage().nbytes() == array.nbytes
        and array.flags.c_contiguous
    ):
        return base
    return torch.from_numpy(array)


class WorkerBatch(dict):
    """A batch made in a DataLoader worker. Pickled (the handoff to the main process), it
    carries its tensors under :data:`OWN_STORAGE_BYTES` inline as bytes, not in shared memory.
    It unpickles as a plain ``dict`` of plain tensors, value for value the batch."""

    __slots__ = ()

    def __copy__(self) -> WorkerBatch:
        # torch's default_convert (a DataLoader with batch_size=None, as Energon's) copies a
        # mapping with copy.copy; without this the copy would go through __reduce__ as a dict
        return WorkerBatch(self)

    def __reduce__(self):
        items = [
            (key, [_wrap(v) for v in value] if isinstance(value, list) else _wrap(value))
            for key, value in self.items()
        ]
        return (dict, (), None, None, iter(items))


class _Inline:
    """A small tensor that pickles as its bytes, dtype and shape."""

    __slots__ = ("tensor",)

    def __init__(self, tensor: Any):
        self.tensor = tensor

    def __reduce__(self):
        import torch

        t = self.tensor.contiguous()
        raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        return (_tensor_from_bytes, (raw, str(t.dtype).removeprefix("torch."), tuple(t.shape)))


def _crosses_inline(value: Any) -> bool:
    """Whether ``value`` is a tensor under :data:`OWN_STORAGE_BYTES` (pickled as bytes)."""
    import torch

    return isinstance(value, torch.Tensor) and value.nbytes < OWN_STORAGE_BYTES


def _wrap(value: Any) -> Any:
    """``value`` as it pickles: a small tensor inline, a pool segment's by its segment."""
    if _crosses_inline(value):
        return _Inline(value)
    segment = _segment_of(value)
    return _Pooled(value, segment) if segment is not None else value


def _segment_of(value: Any) -> Any:
    import torch

    segments = shm_pool.pool() if isinstance(value, torch.Tensor) else None
    return segments.segment_of(value) if segments is not None else None


class _Pooled:
    """A tensor in a pool segment: it pickles as the segment's file descriptor and its place,
    and counts the send (:mod:`energon_packing.shm_pool`)."""

    __slots__ = ("segment", "tensor")

    def __init__(self, tensor: Any, segment: Any):
        self.tensor, self.segment = tensor, segment

    def __reduce__(self):
        from multiprocessing.reduction import DupFd

        array = self.tensor.numpy()
        shm_pool.pool().sent(self.segment)
        handle = DupFd(self.segment.fd)
        return (
            shm_pool.rebuild,
            (handle, self.segment.capacity, array.nbytes, array.dtype.str, array.shape),
        )


def _tensor_from_bytes(raw: bytes, dtype: str, shape: tuple[int, ...]) -> Any:
    """The tensor :class:`_Inline` pickled: writable, on a storage of its own."""
    import torch

    kind = getattr(torch, dtype)
    if not raw:
        return torch.empty(shape, dtype=kind)
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(kind).view(shape)


def shared(batch: dict[str, Any]) -> WorkerBatch:
    """``batch`` as a :class:`WorkerBatch`, its tensors of at least :data:`OWN_STORAGE_BYTES`
    in shared memory, each on a storage of exactly its bytes (those already there, from
    :func:`media_buffer`, as they are; others copied once, as the handoff would). Values,
    dtypes and shapes are unchanged."""
    import torch

    out = WorkerBatch(
        (key, list(value) if isinstance(value, list) else value) for key, value in batch.items()
    )
    for key, value in out.items():
        for index, tensor in enumerate(value) if isinstance(value, list) else [(None, value)]:
            if not isinstance(tensor, torch.Tensor) or _crosses_inline(tensor):
                continue
            if _segment_of(tensor) is not None:
                continue  # in a pool segment: it crosses as it is
            exact = tensor.untyped_storage().nbytes() == tensor.nbytes and tensor.is_contiguous()
            if exact and tensor.is_shared():
                continue  # torch's shared memory (a media_buffer's): it crosses as it is
            pooled = _into_segment(tensor)
            if pooled is not None:
                _put(out, key, index, pooled)
                continue
            if not exact:
                tensor = tensor.clone(memory_format=torch.contiguous_format)  # exactly its bytes
            _put(out, key, index, tensor.share_memory_())
    return out


def _put(batch: dict[str, Any], key: str, index: int | None, tensor: Any) -> None:
    if index is None:
        batch[key] = tensor
    else:
        batch[key][index] = tensor


def _into_segment(tensor: Any) -> Any:
    """A copy of ``tensor`` in a free pool segment (one memcpy into reused memory, where
    ``share_memory_`` would copy into fresh pages), or None (no segment free, or a dtype numpy
    does not have)."""
    segments = shm_pool.pool()
    if segments is None:
        return None
    try:
        source = tensor.numpy()
    except (TypeError, RuntimeError):  # bfloat16, a tensor that requires grad
        return None
    array = segments.array(source.shape, source.dtype)
    if array is None:
        return None
    np.copyto(array, source)
    return to_tensor(array)
