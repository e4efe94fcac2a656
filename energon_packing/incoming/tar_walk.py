"""Tar headers as Python's ``tarfile`` (Energon's reader) walks them, fast: payloads are
never read, one ``pread`` per member, checksums are verified in batches (numpy), and the pax
header WebDataset writes before every member is read inline, without ``tarfile`` (anything
less plain goes through ``tarfile`` itself).

:func:`walk` returns the members and why the walk ended; :func:`resync` finds the next valid
header after a bad one; :func:`split_key` is Energon's and WebDataset's key split; :func:`first_sample` names the first
sample's parts.
"""

from __future__ import annotations

import os
import re
import struct
from dataclasses import dataclass

__all__ = [
    "BLOCK",
    "SKIP_META",
    "SPLIT_NAME",
    "Member",
    "first_sample",
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
# name, size, checksum, type, prefix of a ustar header
_FIELDS = struct.Struct("100s24x12s12x8sc188x155s")
_PAX = struct.Struct("124x12s20xc")  # size, type
# pax keys that change nothing the walk reads (tarfile, WebDataset write mtime for every member)
_HARMLESS = frozenset([b"mtime", b"atime", b"ctime", b"uid", b"gid", b"uname", b"gname"])
_NEITHER = (None, None)


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
            if kind == b"5":  # tarfile's _proc_builtin strips again, after the prefix
                name = name.rstrip("/")
    return name, size, kind, checksum


def _header(block: bytes) -> tuple[str, int, bytes] | None:
    """(name, size, type) of a header block ``tarfile`` accepts (checksum verified), or None."""
    parsed = _parse(block)
    if parsed is None or not _checksum_ok(block, parsed[3]):
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
    # headers whose checksum is not verified yet, with the index of their member: a pax
    # header, its records and the member's header as read (1536 bytes), or one block
    pending: _Pending = ([], [], [], [])
    triples, triple_index, singles, single_index = pending
    offset = start
    fd = f.fileno()
    # one pread per member (an mmap costs a page fault per header: 3x the time)
    pread, unpack_pax, unpack, new = os.pread, _PAX.unpack_from, _FIELDS.unpack_from, Member
    last_triple = size - 3 * BLOCK  # the last offset a pax header and its member fit from

    while True:
        # The common case, inline: a pax header whose records fit one block (WebDataset's,
        # tarfile's), then a plain header; anything else, or any doubt, takes the general path.
        if offset <= last_triple:
            buf = pread(fd, 3 * BLOCK, offset)
            size_field, kind = unpack_pax(buf)
            if kind == b"x" and not size_field[11]:
                try:
                    length = int(size_field[:11], 8)
                except ValueError:
                    length = 0
                records = buf[BLOCK : BLOCK + length]
                space = records.find(b" ")
                digits = records[:space]
                got = None
                if 0 < length <= BLOCK and (length == BLOCK or not buf[BLOCK + length]):
                    if digits.isdigit() and int(digits) == length and records[-1] == 10:
                        key, equals, value = records[space + 1 : -1].partition(b"=")  # one
                        if key in _HARMLESS:
                            got = _NEITHER if equals else None
                        elif key and equals:
                            got = _pax_value(key, value)
                    else:
                        got = _pax_records(records)
                if got is not None:
                    name_field, size_field, _, kind, prefix = unpack(buf, 2 * BLOCK)
                    name = None
                    try:
                        if kind != b"0" or size_field[11]:
                            raise ValueError
                        length = int(size_field[:11], 8)
                    except ValueError:
                        following = _plain(unpack(buf, 2 * BLOCK))
                        if following is not None:
                            name, length, kind = following
                        else:
                            kind = None
                    path, length_pax = got
                    if length_pax is not None:
                        length = length_pax
                    if kind is not None and length >= 0:  # a negative size: the general path
                        if path is not None:
                            name = path
                        elif name is None:
                            name = name_field.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
                            if prefix[0]:
                                name = f"{nts(prefix)}/{name}"
                        data = offset + 3 * BLOCK
                        triples.append(buf)
                        triple_index.append(len(members))
                        offset = data
                        if kind == b"0":
                            kind_name = "file"
                            offset += (length + BLOCK - 1) // BLOCK * BLOCK
                        else:
                            regular = kind in _REGULAR
                            kind_name = "file" if regular else _KINDS.get(kind, "other")
                            if regular or kind_name == "other":
                                offset += (length + BLOCK - 1) // BLOCK * BLOCK
                        members.append(
                            new(
                                name=name,
                                offset=data - 3 * BLOCK,
                                offset_data=data,
                                size=length,
                                kind=kind_name,
                            )
                        )
                        if len(triples) >= 4096:
                            bad = _verify(pending)
                            if bad is not None:
                                return _cut_at(members, bad)
                        continue

        how = header = None
        if offset > size:
            how = "cut"
        else:
            block = pread(fd, BLOCK, offset)
            if len(block) < BLOCK:
                how = "short" if block.strip(b"\0") else "end"
            elif block == _ZERO_BLOCK:
                how = "end"
            else:
                header = _parse(block)
                if header is None or (header[1] < 0 and header[2] not in _KINDS):
                    how = "garbage" if offset else "unreadable"  # (a size that walks back)
        if how is None and header[2] in _EXTENDED:
            bad = _verify(pending)  # anything else: tarfile's own parser
            if bad is not None:
                return _cut_at(members, bad)
            got = _stdlib_member(f, offset)
            if got is None or got[1] <= offset:  # a negative size would walk back
                how = "garbage" if offset else "unreadable"
            else:
                member, offset = got
                members.append(member)
                continue
        if how is not None:
            bad = _verify(pending)
            if bad is not None:
                return _cut_at(members, bad)
            return members, how, offset
        name, length, kind, _ = header
        data = offset + BLOCK
        regular = kind in _REGULAR
        kind_name = "file" if regular else _KINDS.get(kind, "other")
        singles.append(block)
        single_index.append(len(members))
        members.append(
            Member(name=name, offset=offset, offset_data=data, size=length, kind=kind_name)
        )
        offset = data + (_blocks(length) if regular or kind_name == "other" else 0)


_Pending = tuple[list[bytes], list[int], list[bytes], list[int]]


def _plain(fields: tuple) -> tuple[str, int, bytes] | None:
    """(name, size, type) of the header after a pax header, from its unpacked fields, where
    it is no extended header and not the end; else None (``tarfile`` then reads it)."""
    name_field, size_field, checksum_field, kind, prefix = fields
    if kind in _EXTENDED or checksum_field.translate(None, _CHECKSUM_CHARS):
        return None
    try:
        checksum = int(checksum_field.split(b"\0", 1)[0].strip() or b"0", 8)
        if size_field[0] in (0o200, 0o377):
            length = _number(size_field)
        else:
            length = int(size_field.split(b"\0", 1)[0].strip() or b"0", 8)
    except ValueError:
        return None
    if not checksum:  # the zero block (the end), or a header tarfile refuses
        return None
    name = nts(name_field)
    if kind == b"\0" and name.endswith("/"):
        kind = b"5"
    if kind == b"5":
        name = name.rstrip("/")
    if prefix[0] and kind not in (b"L", b"K", b"S"):
        name = f"{nts(prefix)}/{name}"
        if kind == b"5":  # tarfile's _proc_builtin strips again, after the prefix
            name = name.rstrip("/")
    return name, length, kind


def _pax_value(key: bytes, value: bytes) -> tuple[str | None, int | None] | None:
    """(``path``, ``size``) a pax record sets (None where it sets neither); None for keys that
    change how ``tarfile`` reads the member (sparse files, ``hdrcharset``)."""
    if key == b"path":
        return value.decode("utf-8", "surrogateescape").rstrip("/"), None
    if key == b"size":
        try:
            return None, int(value)
        except ValueError:
            return None, 0
    if key.startswith(b"GNU.sparse") or key == b"hdrcharset":
        return None
    return _NEITHER


def _pax_records(data: bytes) -> tuple[str | None, int | None] | None:
    """(``path``, ``size``) of a pax header's records (None where absent), where ``tarfile``
    reads them the same way; None for keys that change how it reads the member (sparse
    files, ``hdrcharset``) or a malformed record."""
    path = size = None
    position = 0
    while position < len(data) and data[position]:
        space = data.find(b" ", position)
        digits = data[position:space]
        if space < 0 or not digits.isdigit():
            return None
        record_end = position + int(digits)
        if record_end > len(data) or record_end <= space or data[record_end - 1] != 10:
            return None
        key, equals, value = data[space + 1 : record_end - 1].partition(b"=")
        got = _pax_value(key, value) if key and equals else None
        if got is None:
            return None
        path = got[0] if got[0] is not None else path
        size = got[1] if got[1] is not None else size
        position = record_end
    return path, size


def _cut_at(members, index: int) -> tuple[list[Member], str, int]:
    offset = members[index].offset
    return members[:index], ("garbage" if offset else "unreadable"), offset


_POWERS = [8**5, 8**4, 8**3, 8**2, 8, 1]


def _verify(pending: _Pending) -> int | None:
    """The index of the first member with a header ``tarfile`` would refuse for its checksum
    (or None); empties ``pending``.

    Checksums as Python's tarfile and GNU tar write them (six octal digits and a NUL) are
    read and compared at once (numpy); any other, or a mismatch, is checked one by one.
    """
    triples, triple_index, singles, single_index = pending
    if not triples and not singles:
        return None
    import numpy as np

    # the pax header and the member's header of each triple (rows 0 and 2), then the singles
    triple_rows = np.frombuffer(b"".join(triples), np.uint8).reshape(-1, 3, BLOCK)[:, ::2]
    single_rows = np.frombuffer(b"".join(singles), np.uint8).reshape(-1, 1, BLOCK)
    owners = np.concatenate(
        [np.repeat(np.asarray(triple_index, np.int64), 2), np.asarray(single_index, np.int64)]
    )
    sums, stored, canonical = [], [], []
    for rows in (triple_rows, single_rows):
        field = rows[..., 148:156]
        # the checksum is summed with its own field as spaces (tarfile's calc_chksums)
        sums.append(
            (rows.sum(axis=2, dtype=np.uint32) - field.sum(axis=2, dtype=np.uint32) + 256).reshape(
                -1
            )
        )
        digits = field[..., :6].astype(np.int32) - ord("0")
        canonical.append(
            (((digits >= 0) & (digits < 8)).all(axis=2) & (field[..., 6] == 0)).reshape(-1)
        )
        stored.append((digits @ np.asarray(_POWERS, np.int32)).reshape(-1))
    sums, stored, canonical = (np.concatenate(x) for x in (sums, stored, canonical))
    suspects = np.flatnonzero(~canonical | (stored != sums))
    bad = None
    for i in sorted(suspects.tolist(), key=lambda i: owners[i]):
        if i < 2 * len(triples):
            block = triples[i // 2][i % 2 * 2 * BLOCK :][:BLOCK]
        else:
            block = singles[i - 2 * len(triples)]
        parsed = _parse(block)
        if parsed is None or not _checksum_ok(block, parsed[3]):
            bad = int(owners[i])
            break
    for column in pending:
        column.clear()
    return bad


def _checksum_ok(block: bytes, checksum: int) -> bool:
    unsigned = 256 + sum(block[:148]) + sum(block[156:])
    signed = 256 + sum(b - 256 if b > 127 else b for b in block[:148] + block[156:])
    return checksum in (unsigned, signed)


def resync(f, size: int, start: int) -> int | None:
    """The offset of the next valid tar header at or after ``start`` (512-aligned from it)."""
    chunk = 1 << 20
    position = start
    while position + BLOCK <= size:
        data = os.pread(f.fileno(), min(chunk, size - position), position)
        for at in _candidates(data):
            block = data[at : at + BLOCK]
            if block != _ZERO_BLOCK and _header(block) is not None:
                return position + at
        position += len(data) - len(data) % BLOCK
        if not data:
            break
    return None


def _candidates(data: bytes) -> list[int]:
    """Offsets of the whole blocks of ``data`` whose checksum field holds only the characters
    a header's can (octal digits, space, NUL), found at once (numpy): the rest is no header."""
    import numpy as np

    rows = np.frombuffer(data, np.uint8, count=len(data) // BLOCK * BLOCK).reshape(-1, BLOCK)
    allowed = np.zeros(256, bool)
    allowed[np.frombuffer(_CHECKSUM_CHARS, np.uint8)] = True
    return (np.flatnonzero(allowed[rows[:, 148:156]].all(axis=1)) * BLOCK).tolist()


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


def first_sample(path: str) -> tuple[str, list[str]] | None:
    """``(key, part names)`` of the first sample in the tar file at ``path`` (metadata members
    skipped, as Energon skips them); None when the file holds no sample. Reads headers only,
    up to the first member of the next sample."""
    import tarfile

    key, parts = None, []
    with tarfile.open(path, mode="r:") as tar:
        for member in tar:
            if not member.isfile() or is_meta(member.name):
                continue
            name = split_key(member.name)
            if name is None:
                continue
            if key is not None and name != key:
                break
            key = name
            parts.append(member.name[len(name) + 1 :])
    return (key, parts) if key is not None else None
