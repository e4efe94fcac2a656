"""Tar shards written as ``tarfile`` writes USTAR, one split's samples at a time, cut by
count or bytes; a file part's bytes are copied by the kernel, never read into Python."""

from __future__ import annotations

import os
import tarfile
from pathlib import Path
from typing import Any

from energon_packing.incoming.media import FilePart

__all__ = ["Shards", "ustar_header"]

_BLOCK = 512

_RECORD = 20 * _BLOCK  # tar's record: an archive's length is a multiple of it

# The fields of the USTAR header ``TarInfo.tobuf`` writes for a regular file of mode 0644,
# owner and group 0, mtime 0: after the name, before the size; after the mtime (the checksum
# field, then the type flag, no link, the magic, no owner names or device numbers, no prefix).
_MODE_OWNER = b"0000644\x000000000\x000000000\x00"
_MTIME = b"00000000000\x00"
_TAIL = b"0" + bytes(100) + b"ustar\x0000" + bytes(64 + 16 + 167)
#: the checksum counts its own field as 8 spaces
_FIXED_SUM = sum(_MODE_OWNER) + sum(_MTIME) + 8 * 32 + sum(_TAIL)


def ustar_header(name: str, size: int) -> bytes:
    """The 512-byte header ``tarfile`` writes for a regular file ``name`` of ``size`` bytes
    (mode 0644, owner 0, mtime 0), byte for byte, without building a ``TarInfo`` (its cost was
    a tenth of convert's own time per record); names over 100 bytes and sizes of 8 GiB and more
    take ``tarfile``'s own path."""
    encoded = name.encode("utf-8", "surrogateescape")
    if len(encoded) > 100 or size >= 8**11:
        info = tarfile.TarInfo(name)
        info.size, info.mtime, info.mode = size, 0, 0o644
        return info.tobuf(tarfile.USTAR_FORMAT, "utf-8", "surrogateescape")
    head = encoded.ljust(100, b"\0")
    sized = b"%011o\x00" % size
    checksum = sum(head) + sum(sized) + _FIXED_SUM
    return b"".join((head, _MODE_OWNER, sized, _MTIME, b"%06o\x00 " % checksum, _TAIL))


class Shards:
    """Tar shards of one split, cut at ``max_count`` samples or ``max_bytes``, written as
    ``tarfile`` writes USTAR (:func:`ustar_header`: mtime 0, root owner, so the same input
    gives the same bytes); file parts are copied by the kernel (``os.sendfile``)."""

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
            size = data.size if isinstance(data, FilePart) else len(data)
            self._write(ustar_header(f"{key}.{part}", size))
            if isinstance(data, FilePart):
                self._copy(data)
            else:
                self._write(data)
            self._write(bytes(-size % _BLOCK))
            self.bytes += size + _BLOCK
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
