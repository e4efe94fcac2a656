"""Tar headers as Python's ``tarfile`` (Energon's reader) walks them, fast: payloads are
never read, checksums are verified in batches, and the pax header WebDataset writes before
every member is read without ``tarfile`` (anything less plain goes through ``tarfile``).

:func:`walk` returns the members and why the walk ended; :func:`resync` finds the next valid
header after a bad one; :func:`split_key` is Energon's and WebDataset's key split.
"""

from __future__ import annotations

import mmap
import os
import re
from dataclasses import dataclass

__all__ = [
    "BLOCK",
    "SKIP_META",
    "SPLIT_NAME",
    "Member",
    "is_meta",
    "nts",
    "resync",
    "split_key",
    "walk",
    "walk_all",
]

# Energon 7.4.1 (flavors/webdataset/config.py) and WebDataset's own key split.
SPLIT_NAME = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")
SKIP_META = re.compile(r"__[^/]*__($|/)")

BLOCK = 512
_ZERO_BLOCK = bytes(BLOCK)
_REGULAR = (b"0", b"\0", b"7", b"S")  # tarfile.REGULAR_TYPES
_KINDS = {b"1": "hardlink", b"2": "symlink", b"3": "character device", b"4": "block device"}
_KINDS |= {b"5": "directory", b"6": "fifo"}
_EXTENDED = (b"L", b"K", b"x", b"g", b"X")  # GNU long names, pax headers: tarfile's parser
_CHECKSUM_CHARS = b"01234567 \0"


@dataclass(kw_only=True, slots=True)
class Member:
    """One tar member as ``tarfile`` reads its header (the payload is never read)."""

    name: str
    offset: int  # of its header (of its first extended header, if any)
    offset_data: int
    size: int
    kind: str  # "file", or one of _KINDS' values, or "other"


def nts(field_bytes: bytes) -> str:
    end = field_bytes.find(b"\0")
    return (field_bytes if end < 0 else field_bytes[:end]).decode("utf-8", "surrogateescape")


def _number(field_bytes: bytes) -> int:
    """tarfile's ``nti``: octal text, or GNU base-256."""
    if field_bytes[0] in (0o200, 0o377):
        n = int.from_bytes(field_bytes[1:], "big")
        return n - (256 ** (len(field_bytes) - 1)) if field_bytes[0] == 0o377 else n
    text = nts(field_bytes).strip() or "0"
    return int(text, 8)


def _parse(block: bytes) -> tuple[str, int, bytes, int] | None:
    """(name, size, type, checksum) of a header block, its checksum not yet verified; None
    where ``tarfile`` would raise ``InvalidHeaderError`` on its numbers."""
    field = block[148:156]
    if field.translate(None, _CHECKSUM_CHARS):
        return None
    try:
        checksum = int(field.split(b"\0", 1)[0].strip() or b"0", 8)
        size_field = block[124:136]
        if size_field[0] in (0o200, 0o377):
            size = _number(size_field)
        else:
            size = int(size_field.split(b"\0", 1)[0].strip() or b"0", 8)
    except ValueError:
        return None
    kind = block[156:157]
    if kind in (b"x", b"X", b"g"):  # a pax header's own name is never used
        return "", size, kind, checksum
    name = nts(block[:100])
    if kind == b"\0" and name.endswith("/"):
        kind = b"5"
    if kind == b"5":
        name = name.rstrip("/")
    if block[345] and kind not in (b"L", b"K", b"S"):
        prefix = nts(block[345:500])
        if prefix:
            name = f"{prefix}/{name}"
    return name, size, kind, checksum


def _header(block: bytes) -> tuple[str, int, bytes] | None:
    """(name, size, type) of a header block ``tarfile`` accepts (checksum verified), or None."""
    parsed = _parse(block)
    if parsed is None or _verify([(block, parsed[3], 0)]) is not None:
        return None
    return parsed[:3]


def _blocks(size: int) -> int:
    return (size + BLOCK - 1) // BLOCK * BLOCK


def _stdlib_member(f, offset: int) -> tuple[Member, int] | None:
    """A member with extended headers (GNU long names, pax), through ``tarfile`` itself."""
    import tarfile

    f.seek(offset)
    stub = _TarStub(f, offset)
    try:
        info = tarfile.TarInfo.fromtarfile(stub)
    except (tarfile.HeaderError, EOFError):
        return None
    kind = "file" if info.isreg() else _KINDS.get(info.type, "other")
    end = stub.offset
    member = Member(
        name=info.name, offset=offset, offset_data=info.offset_data, size=info.size, kind=kind
    )
    return member, end


class _TarStub:
    """The attributes ``TarInfo.fromtarfile`` reads from its ``TarFile``."""

    def __init__(self, f, offset: int) -> None:
        import tarfile

        self.fileobj = f
        self.offset = offset
        self.encoding = "utf-8"
        self.errors = "surrogateescape"
        self.pax_headers: dict = {}
        self.tarinfo = tarfile.TarInfo


def walk(f, size: int, start: int) -> tuple[list[Member], str, int]:
    """Members from ``start`` as ``tarfile`` iterates them, and why the walk ended:
    ``("end", offset)`` (zero block, end of file), ``("short", offset)`` (a header cut short:
    tarfile stops silently), ``("cut", offset)`` (the last member's data runs past the end of
    the file: ``ReadError``), ``("garbage", offset)`` (no tar header at offset: tarfile stops
    silently) or ``("unreadable", 0)``.

    Checksums are verified in batches (numpy), and the walk is cut back to the first bad one.
    """
    members: list[Member] = []
    pending: list[tuple[bytes, int, int]] = []  # (block, checksum, index in members)
    offset = start
    # the file mapped: a header costs a slice, no system call (the kernel reads the pages)
    mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""

    while True:
        how = header = None
        if offset > size:
            how = "cut"
        else:
            block = mapped[offset : offset + BLOCK]
            if len(block) < BLOCK:
                how = "short" if block.strip(b"\0") else "end"
            elif block == _ZERO_BLOCK:
                how = "end"
            else:
                header = _parse(block)
                if header is None:
                    how = "garbage" if offset else "unreadable"
        if how is None and header[2] in _EXTENDED:
            got = _pax_member(mapped, block, header, offset, size)  # the common pax header
            if got is not None:
                member, following, checksum, end = got
                pending.append((block, header[3], len(members)))
                pending.append((following, checksum, len(members)))
                members.append(member)
                offset = end
                continue
            bad = _verify(pending)  # anything else: tarfile's own parser
            if bad is not None:
                return _cut_at(members, bad, pending)
            pending.clear()
            got = _stdlib_member(f, offset)
            if got is None:
                how = "garbage"
            else:
                member, offset = got
                members.append(member)
                continue
        if how is not None or len(pending) >= 4096:
            bad = _verify(pending)
            if bad is not None:
                return _cut_at(members, bad, pending)
            pending.clear()
            if how is not None:
                return members, how, offset
        name, length, kind, checksum = header
        data = offset + BLOCK
        regular = kind in _REGULAR
        kind_name = "file" if regular else _KINDS.get(kind, "other")
        pending.append((block, checksum, len(members)))
        members.append(
            Member(name=name, offset=offset, offset_data=data, size=length, kind=kind_name)
        )
        offset = data + (_blocks(length) if regular or kind_name == "other" else 0)


def _pax_member(mapped, block, header, offset: int, size: int):
    """A member behind one plain pax header (what Python's tarfile and WebDataset write for
    every member), read without ``tarfile``: (member, its header block, that block's
    checksum, next offset); None for anything less plain (global or GNU headers, sparse
    files, charsets, a bad following header), which ``tarfile`` then reads."""
    if header[2] not in (b"x", b"X"):
        return None
    fields = _pax_fields(mapped[offset + BLOCK : offset + BLOCK + header[1]])
    at = offset + BLOCK + _blocks(header[1])
    if fields is None or at + BLOCK > size:
        return None
    following = mapped[at : at + BLOCK]
    parsed = _parse(following)
    if parsed is None or parsed[2] in _EXTENDED or following == _ZERO_BLOCK:
        return None
    name, length, kind, checksum = parsed
    name = fields.get("path", name)
    if "size" in fields:
        try:
            length = int(fields["size"])
        except ValueError:
            length = 0
    regular = kind in _REGULAR
    kind_name = "file" if regular else _KINDS.get(kind, "other")
    data = at + BLOCK
    member = Member(name=name, offset=offset, offset_data=data, size=length, kind=kind_name)
    return (
        member,
        following,
        checksum,
        data + (_blocks(length) if regular or kind_name == "other" else 0),
    )


def _pax_fields(data: bytes) -> dict[str, str] | None:
    """``path`` and ``size`` of pax records (``"%d %s=%s\\n"``); None for keys that change
    how ``tarfile`` reads the member (sparse files, ``hdrcharset``) or a malformed record."""
    fields: dict[str, str] = {}
    position = 0
    while position < len(data) and data[position]:
        space = data.find(b" ", position)
        if space < 0:
            return None
        try:
            length = int(data[position:space])
        except ValueError:
            return None
        record = data[space + 1 : position + length]
        key, equals, value = record[:-1].partition(b"=")
        if length < 1 or not record.endswith(b"\n") or not equals:
            return None
        if key in (b"path", b"size"):
            fields[key.decode()] = value.decode("utf-8", "surrogateescape")
        elif key.startswith(b"GNU.sparse") or key == b"hdrcharset":
            return None
        position += length
    return fields


def _cut_at(members, bad, pending) -> tuple[list[Member], str, int]:
    index = pending[bad][2]
    offset = members[index].offset
    return members[:index], ("garbage" if offset else "unreadable"), offset


def _verify(pending: list[tuple[bytes, int, int]]) -> int | None:
    """Index (in ``pending``) of the first block whose checksum ``tarfile`` would refuse."""
    if not pending:
        return None
    import numpy as np

    blocks = np.frombuffer(b"".join(p[0] for p in pending), np.uint8).reshape(-1, BLOCK)
    sums = blocks.sum(axis=1, dtype=np.int64) - blocks[:, 148:156].sum(axis=1, dtype=np.int64)
    expected = np.fromiter((p[1] for p in pending), np.int64, len(pending)) - 256
    for i in np.flatnonzero(sums != expected).tolist():
        block = pending[i][0]
        signed = 256 + sum(b - 256 if b > 127 else b for b in block[:148] + block[156:])
        if signed != pending[i][1]:
            return i
    return None


def resync(f, size: int, start: int) -> int | None:
    """The offset of the next valid tar header at or after ``start`` (512-aligned from it)."""
    chunk = 1 << 20
    position = start
    while position + BLOCK <= size:
        data = os.pread(f.fileno(), min(chunk, size - position), position)
        for at in range(0, len(data) - BLOCK + 1, BLOCK):
            block = data[at : at + BLOCK]
            if block[148:156].translate(None, _CHECKSUM_CHARS) or block == _ZERO_BLOCK:
                continue
            if _header(block) is not None:
                return position + at
        position += len(data) - len(data) % BLOCK
        if not data:
            break
    return None


def split_key(name: str) -> str | None:
    """The sample key Energon gives a member name (``SPLIT_NAME``), None if it gives none."""
    if "/" not in name and "\n" not in name:  # the regex, for plain names: the first dot
        stem, dot, _ = name.partition(".")
        return stem if dot and stem else None
    match = SPLIT_NAME.match(name)
    return match.group(1) if match else None


def is_meta(name: str) -> bool:
    return name.startswith("__") and SKIP_META.match(name) is not None


def walk_all(f, size: int, start: int) -> list[Member]:
    """Every member from ``start`` on, resyncing past any further bad header."""
    members: list[Member] = []
    while start is not None:
        more, how, stop = walk(f, size, start)
        members += more
        if how == "cut" or stop + BLOCK > size:
            break
        after = more[-1].offset_data if how == "garbage" and more else stop + BLOCK
        start = resync(f, size, max(after, stop + BLOCK) if how == "end" else after)
    return members
