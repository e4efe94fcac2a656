"""What Energon and WebDataset would drop from a folder of tar shards, found before training.

:func:`scan_dataset` walks every header of every ``.tar`` shard the way Energon's ``prepare``
and its reader do (Python's ``tarfile`` rules; payloads are never read or decoded) and reports
each member that would vanish, with shard, byte offset, key and reason. Energon 7.4.1 and
WebDataset 1.0.2 split a member name with ``^((?:.*/|)[^.]+)[.]([^/]*)$``: the key is
everything up to the FIRST dot of the file name, the part name is the rest, and consecutive
members with the same key form one sample (a later part of the same name replaces the earlier).

Reasons (each also a skip reason in ``energon_packing.stats.REASONS``):

``truncated_member``
    A member whose header claims more bytes than it holds. Past the end of the shard (a shard
    cut mid-member): Energon's prepare fails the WHOLE shard (``tarfile.ReadError: unexpected
    end of data``, then ``AssertionError: Shard ... has no samples``); :func:`cut_shard_back`
    keeps the whole samples before the cut. Inside the shard (a header that lies): its claimed
    end is no tar header (``tarfile`` stops there, silently), or lands in the end-of-archive
    zeros with a header inside the claimed bytes; the members after it vanish. A header cut
    short at the end of a shard: that member vanishes.
``lost_in_shard``
    A member the tar walk never reaches: after (or inside the bytes of) a header whose size
    lies, after the end-of-archive zero blocks (``cat a.tar b.tar``), or the rest of a sample
    cut by ``truncated_member``.
``duplicate_key``
    A key seen before. Adjacent (``a.json``, ``a.json``): one sample, the earlier document is
    replaced by the later, silently. Apart, or in two shards: Energon's prepare refuses the
    dataset (``DuplicateSampleKeyError``; ``energon prepare --fix-duplicates`` renames them).
``not_regular_file``
    A symlink, hardlink, directory, device or fifo member named like a part: Energon skips it
    (``TarInfo.isreg()``), so its sample loses the part, or vanishes when it had no other.
``dotted_key``
    A ``.json`` member whose key holds a dot: WebDataset cuts the key at the first dot, so
    ``www.example.com_000.json`` .. ``003.json`` become ONE sample ``www`` with parts
    ``example.com_000.json`` ..; the loader then reports ``www`` as ``missing_json``.
``unreachable_part``
    A member no sample holds: no dot after a non-empty stem (``README``, ``.json``), or a
    ``__name__`` meta name, which Energon skips.
``missing_json``
    A sample (as Energon groups it) without a ``json`` part. The loader reports this one
    itself, so it is not written to the losses file.

Not seen by a header walk: a lying header whose claimed end lands exactly on a later header
(the members in between are swallowed; finding them needs every payload read), compressed
``.tgz`` shards (skipped, with a warning). A payload that is itself a tar may be taken for
swallowed members when it is the last member of its shard.

Losses file (``PATH/.nv-meta/energon_packing_losses.json``, written by :func:`write_losses`
when ``energon-packing prepare`` goes on with ``--allow-losses``)::

    {
      "format": "energon_packing.losses/1",
      "shards": 3,                       # shards scanned
      "losses": [
        {"key": "sample_000007", "reason": "lost_in_shard",
         "detail": "after sample_000004.json (at 4,096), whose size lies",
         "shard": "shards/part-000.tar", "offset": 10240, "member": "sample_000007.json"},
        ...
      ]
    }

Only conversations that never reach the loader under their own key are listed (one entry per
lost ``.json`` document; ``key`` is the key the writer meant: the member name without
``.json``). :func:`load_losses` returns ``[(key, reason, detail), ...]`` in file order, ``[]``
when there is no file: the loader adds them to its skip report once, so "every conversation is
in one pack or in the skip report" holds from the tar bytes up.
"""

from __future__ import annotations

import gc
import json
import logging
import os
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from energon_packing.incoming.tar_walk import (
    BLOCK,
    Member,
    is_meta,
    nts,
    resync,
    split_key,
    walk,
    walk_all,
)

__all__ = [
    "LOSSES_FILE",
    "SHARD_REASONS",
    "Finding",
    "Scan",
    "ShardScan",
    "cut_losses",
    "cut_shard_back",
    "enclosing_dataset",
    "load_losses",
    "scan_dataset",
    "scan_shard",
    "write_losses",
]

logger = logging.getLogger("energon_packing")

#: Where :func:`write_losses` puts the list, inside the dataset folder.
LOSSES_FILE = ".nv-meta/energon_packing_losses.json"
LOSSES_FORMAT = "energon_packing.losses/1"

#: Every reason a finding carries, with what Energon / WebDataset do today.
SHARD_REASONS = {
    "truncated_member": "a member's header claims more bytes than the shard holds (cut "
    "mid-member: Energon's prepare fails the whole shard), or its claimed end is no tar header "
    "(the members after it vanish)",
    "lost_in_shard": "a member the tar walk never reaches: after a lying header, after the "
    "end-of-archive blocks, or the rest of a cut sample",
    "duplicate_key": "a key seen before: adjacent, the later part replaces the earlier "
    "silently; apart or in two shards, Energon's prepare refuses the dataset",
    "not_regular_file": "a symlink, hardlink, directory, device or fifo member named like a "
    "part: Energon skips it",
    "dotted_key": "a .json member whose key holds a dot: WebDataset cuts the key at the first "
    "dot and merges it with its neighbours",
    "unreachable_part": "a member no sample holds (no dot after the stem, or a __meta__ name)",
    "missing_json": "a sample without a json part (the loader reports it too)",
}


@dataclass(kw_only=True, slots=True)
class Finding:
    """One member (or sample) that Energon or WebDataset would drop or alter.

    Attributes:
        shard: The shard's path relative to the dataset folder.
        offset: Byte offset of the member's header in the shard.
        key: The key the writer meant (the member name without its extension; for a ``.json``
            member the name without ``.json``).
        member: The member's name in the tar.
        reason: One of :data:`SHARD_REASONS`.
        detail: What happens to it, with numbers.
        lost: A conversation (a ``.json`` document) that never reaches the loader under its
            own key: listed in the losses file.
    """

    shard: str
    offset: int
    key: str
    member: str
    reason: str
    detail: str
    lost: bool = False


@dataclass(kw_only=True, slots=True)
class ShardScan:
    """The walk over one shard."""

    shard: str
    size: int
    members: int = 0  # headers reached
    samples: int = 0  # samples Energon indexes (after the cut, for a cut shard)
    cut_at: int | None = None  # a cut shard: the whole samples end here (cut_shard_back)
    cut_member: str | None = None
    keys: list = field(default_factory=list, repr=False)  # (key, offset) of each sample


@dataclass(kw_only=True, slots=True)
class Scan:
    """Every shard of a dataset folder, and what would be lost."""

    path: Path
    shards: list[ShardScan] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)

    @property
    def bytes(self) -> int:
        return sum(s.size for s in self.shards)

    @property
    def losses(self) -> list[Finding]:
        """Findings whose conversation never reaches the loader: the losses file."""
        return [f for f in self.findings if f.lost]

    def counts(self) -> Counter:
        return Counter(f.reason for f in self.findings)

    @property
    def cut(self) -> list[ShardScan]:
        return [s for s in self.shards if s.cut_at is not None]

    @property
    def repeated_apart(self) -> list[Finding]:
        """Keys repeated in separate samples: Energon's prepare refuses these."""
        return [f for f in self.findings if f.reason == "duplicate_key" and "apart" in f.detail]

    @property
    def empty(self) -> list[ShardScan]:
        """Shards without a sample: Energon's prepare fails on them ("has no samples")."""
        return [s for s in self.shards if s.samples == 0]


def _intended_key(name: str) -> str:
    """The key the writer meant: the name without its last extension."""
    stem, dot, _ = name.rpartition(".")
    return stem if dot and stem and not stem.endswith("/") else name


def _is_json(name: str) -> bool:
    return name.endswith(".json")


def scan_shard(path: Path | str, *, name: str | None = None) -> tuple[ShardScan, list[Finding]]:
    """Walks one shard's headers; returns its summary and its findings (no payload is read).

    Samples are grouped as Energon does: consecutive regular members with the same key.
    Keys repeated across samples are found by :func:`scan_dataset`, which sees every shard.
    """
    path = Path(path)
    shard = name or path.name
    size = path.stat().st_size
    summary = ShardScan(shard=shard, size=size)
    findings: list[Finding] = []

    def find(member: Member, reason: str, detail: str, *, key: str | None = None, lost=False):
        findings.append(
            Finding(
                shard=shard,
                offset=member.offset,
                key=key if key is not None else _intended_key(member.name),
                member=member.name,
                reason=reason,
                detail=detail,
                lost=lost,
            )
        )

    with path.open("rb") as f:
        reached, how, stop = walk(f, size, 0)
        lost_members: list[tuple[Member, str]] = []
        last = reached[-1] if reached else None
        # a last member whose claimed size swallows the members after it (its end lands in
        # the end-of-archive zeros, or past the end of the file): a header inside its bytes
        inside = None
        if how in ("end", "cut") and last is not None and last.kind == "file":
            inside = resync(f, min(last.offset_data + last.size, size), last.offset_data)
        swallowed = (
            f"; a tar header follows inside them, at {inside:,}: its size lies" if inside else ""
        )
        if inside is not None:
            why = f"inside the bytes claimed by {last.name} (at {last.offset:,}), whose size lies"
            lost_members += [(m, why) for m in walk_all(f, size, inside)]
        if how == "cut" and last is not None:
            summary.cut_member = last.name
            find(
                last,
                "truncated_member",
                f"claims {last.size:,} bytes from {last.offset_data:,}, but the shard ends at "
                f"{size:,} ({last.offset_data + last.size - size:,} bytes short){swallowed}: "
                f"Energon's prepare fails the whole shard (ReadError, then 'Shard ... has no "
                f"samples')",
                lost=_is_json(last.name),
            )
        elif inside is not None:
            find(
                last,
                "truncated_member",
                f"claims {last.size:,} bytes{swallowed}: tarfile skips every member from there "
                f"to the end of the archive, silently",
            )
        elif how == "short":
            partial = os.pread(f.fileno(), BLOCK, stop)
            name = nts(partial[:100]) if len(partial) >= 100 else ""
            header = Member(name=name or "?", offset=stop, offset_data=size, size=0, kind="file")
            find(
                header,
                "truncated_member",
                f"the shard ends {size - stop:,} bytes into this member's header: tarfile stops "
                f"there silently, the member vanishes",
                lost=_is_json(name),
            )
        elif how in ("garbage", "unreadable"):
            found = resync(f, size, last.offset_data if last is not None else BLOCK)
            if found is not None:
                if last is not None:
                    find(
                        last,
                        "truncated_member",
                        f"claims {last.size:,} bytes, but at its claimed end ({stop:,}) lies no "
                        f"tar header; the next one is at {found:,}: tarfile stops there "
                        f"silently, so every member after it vanishes",
                    )
                    why = f"after {last.name} (at {last.offset:,}), whose size lies"
                else:
                    why = "the shard's first block is no tar header (Energon skips the shard)"
                lost_members += [(m, why) for m in walk_all(f, size, found)]
        elif how == "end" and stop + BLOCK <= size:
            found = resync(f, size, stop)
            if found is not None:
                why = f"after the end-of-archive blocks at {stop:,} (tars concatenated?)"
                lost_members += [(m, why) for m in walk_all(f, size, found)]
    summary.members = len(reached)
    for member, why in lost_members:
        find(member, "lost_in_shard", why, lost=_is_json(member.name) and member.kind == "file")

    samples, outside = _group(reached)
    if how == "cut" and samples and last is not None:
        cut_sample = samples.pop()  # the sample holding the cut member goes with it
        summary.cut_at = cut_sample[1][0].offset
        for member in cut_sample[1][:-1]:
            find(
                member,
                "lost_in_shard",
                f"its sample {cut_sample[0]!r} is cut at {size:,} (in {last.name}); the whole "
                f"samples before {summary.cut_at:,} are kept",
                lost=_is_json(member.name),
            )
    summary.samples = len(samples)
    summary.keys = [(key, members[0].offset) for key, members in samples]

    # members no sample holds (rare): one pass over those only
    sample_keys = {key for key, _ in samples} if outside else set()
    for member in outside:
        if summary.cut_at is not None and member.offset >= summary.cut_at:
            continue  # the cut sample: reported above
        if member.kind != "file":
            if member.kind in ("symlink", "hardlink") or split_key(member.name) is not None:
                # a sample with no regular member does not exist at all
                alone = split_key(member.name) not in sample_keys
                find(
                    member,
                    "not_regular_file",
                    f"a {member.kind}: Energon skips it (TarInfo.isreg() is false), so "
                    + (
                        "its sample vanishes (it has no regular member)"
                        if alone
                        else "its sample lacks this part"
                    ),
                    # a link stands for a document; a directory, device or fifo holds none
                    lost=alone and _is_json(member.name) and member.kind.endswith("link"),
                )
        else:
            if is_meta(member.name):
                detail = "a __meta__ name: Energon skips it"
            else:
                detail = "no dot after a non-empty stem: no sample can hold it"
            find(member, "unreachable_part", detail, lost=_is_json(member.name))
    # the samples: one pass, findings only for what is wrong (a member's own findings in the
    # order dotted_key, duplicate_key, missing_json, as the sort below keeps them)
    for key, members in samples:
        start = len(key) + 1
        names = [m.name[start:] for m in members]
        if "json" in names and len(set(names)) == len(names) and ".json" not in "/".join(names):
            continue  # the common sample: one document, parts apart, no dotted key ("/" is
            # in no part name, so no ".json" spans two)
        parts: dict[str, Member] = {}
        for member in members:
            part = member.name[start:]
            if part != "json" and part.endswith(".json"):
                mates = [m.name for m in members if m is not member]
                find(
                    member,
                    "dotted_key",
                    f"WebDataset cuts the key at the first dot: key {key!r}, part "
                    f"{part!r}, one sample with {len(mates)} other "
                    f"member(s) ({', '.join(mates[:3])}{', ...' if len(mates) > 3 else ''})",
                    key=member.name[: -len(".json")],
                    lost=True,
                )
            earlier = parts.get(part)
            if earlier is not None:
                find(
                    earlier,
                    "duplicate_key",
                    f"{member.name} twice in a row (at {earlier.offset:,} and "
                    f"{member.offset:,}): one sample, the later part replaces this one"
                    + (": this document vanishes" if part == "json" else ""),
                    key=key,
                    lost=part == "json",
                )
            parts[part] = member
        if "json" not in parts:
            find(
                members[0],
                "missing_json",
                f"sample {key!r} has no json part (parts: {', '.join(sorted(parts)[:4])}); "
                f"the loader reports it as missing_json",
                key=key,
            )
    findings.sort(key=lambda f: f.offset)  # stable: a member's own finding first
    return summary, findings


def _group(members: Iterable[Member]) -> tuple[list[tuple[str, list[Member]]], list[Member]]:
    """Energon's prepare: regular, non-meta members whose name splits, consecutive same key;
    and the members no sample holds (not regular, ``__meta__``, or no key), in order."""
    samples: list[tuple[str, list[Member]]] = []
    outside: list[Member] = []
    key, group = None, []
    for member in members:
        name = member.name
        if member.kind != "file" or (name[:2] == "__" and is_meta(name)):
            outside.append(member)
            continue
        if "/" in name or "\n" in name:
            this = split_key(name)
        else:  # split_key for a plain name: up to the first dot
            stem, dot, _ = name.partition(".")
            this = stem if dot and stem else None
        if this is None:
            outside.append(member)
        elif this == key:
            group.append(member)
        else:
            key, group = this, [member]
            samples.append((key, group))
    return samples, outside


def shard_paths(path: Path | str) -> list[str]:
    """The shards of a dataset folder, relative: a prepared one's own (its
    ``.nv-meta/.info.json``, present on disk: another dataset nested inside it is not its),
    else those ``energon prepare`` would find (``**/*.tar`` and ``**/*.tgz``), sorted."""
    root = Path(path)
    try:
        listed = json.loads((root / ".nv-meta" / ".info.json").read_text())["shard_counts"]
        return sorted(name for name in listed if (root / name).is_file())
    except (OSError, ValueError, KeyError, TypeError):
        pass
    found = list(root.glob("**/*.tar")) + list(root.glob("**/*.tgz"))
    return [str(p.relative_to(root)) for p in sorted(found)]


def enclosing_dataset(path: Path | str) -> Path | None:
    """The prepared dataset (a folder with ``.nv-meta/``) ``path`` lies inside, if any: what a
    user meant who passed its ``shards/`` folder."""
    return next((p for p in Path(path).resolve().parents if (p / ".nv-meta").is_dir()), None)


def scan_dataset(path: Path | str, *, shards: Sequence[str] | None = None) -> Scan:
    """Scans every shard of a dataset folder (or the given relative ``shards``).

    Args:
        path: The dataset folder (what ``energon prepare`` takes).
        shards: Shard paths relative to ``path``; default: those ``energon prepare`` finds.
    """
    root = Path(path)
    scan = Scan(path=root)
    # the scan allocates a few objects per sample and creates no cycles: Python's collector
    # would walk every live one again and again (60 % of the CPU at 1M conversations)
    collecting = gc.isenabled()
    gc.disable()
    try:
        _scan_shards(root, scan, shards if shards is not None else shard_paths(root))
    finally:
        if collecting:
            gc.enable()
    order = {name: i for i, name in enumerate(s.shard for s in scan.shards)}
    scan.findings.sort(key=lambda f: (order[f.shard], f.offset))
    return scan


def _scan_shards(root: Path, scan: Scan, names: Sequence[str]) -> None:
    seen: dict[
        str, int
    ] = {}  # key -> its shard (in scan.shards) << 40 | offset of its first sample
    for name in names:
        if name.endswith(".tgz"):
            logger.warning("%s is compressed: not scanned (only plain .tar shards are)", name)
            continue
        summary, findings = scan_shard(root / name, name=name)
        scan.shards.append(summary)
        scan.findings += findings
        # keys repeated apart: Energon's index holds each key once (UNIQUE), prepare refuses
        for key, first_offset in summary.keys:
            if key in seen:
                where, at = scan.shards[seen[key] >> 40].shard, seen[key] & (2**40 - 1)
                scan.findings.append(
                    Finding(
                        shard=name,
                        offset=first_offset,
                        key=key,
                        member=key,
                        reason="duplicate_key",
                        detail=f"key {key!r} apart from its first sample ({where} at {at:,}): "
                        f"Energon's prepare refuses the dataset (DuplicateSampleKeyError)",
                    )
                )
            else:
                seen[key] = (len(scan.shards) - 1) << 40 | first_offset
        summary.keys = []  # consumed: a million (key, offset) pairs need not outlive the scan


def _entry(f: Finding) -> dict:
    return {
        "key": f.key,
        "reason": f.reason,
        "detail": f.detail,
        "shard": f.shard,
        "offset": f.offset,
        "member": f.member,
    }


def write_losses(path: Path | str, findings: Iterable[Finding], *, shards: int = 0) -> Path:
    """Writes the lost conversations (``finding.lost``) to ``PATH/.nv-meta/`` (format above)."""
    target = Path(path) / LOSSES_FILE
    target.parent.mkdir(parents=True, exist_ok=True)
    losses = [_entry(f) for f in findings if f.lost]
    document = {"format": LOSSES_FORMAT, "shards": shards, "losses": losses}
    temporary = target.with_suffix(".tmp")
    temporary.write_text(json.dumps(document, indent=1, ensure_ascii=False) + "\n")
    temporary.replace(target)
    return target


def load_losses(path: Path | str) -> list[tuple[str, str, str]]:
    """``[(key, reason, detail), ...]`` from the dataset's losses file; ``[]`` without one."""
    target = Path(path) / LOSSES_FILE
    if not target.is_file():
        return []
    document = json.loads(target.read_text())
    if document.get("format") != LOSSES_FORMAT:
        raise ValueError(
            f"{target}: format {document.get('format')!r}, expected {LOSSES_FORMAT!r}; "
            f"rerun `energon-packing prepare {path} --allow-losses`"
        )
    return [(e["key"], e["reason"], e["detail"]) for e in document["losses"]]


CUT_FOLDER = ".nv-meta/energon_packing_cut"


def cut_shard_back(path: Path | str, shard: ShardScan, findings: Iterable[Finding] = ()) -> Path:
    """Makes a shard cut mid-member whole again: truncates it where its last whole sample ends
    and writes the end-of-archive blocks, so Energon indexes the samples before the cut.

    The bytes removed are kept in ``.nv-meta/energon_packing_cut/<shard>.tail`` and the lost
    conversations among ``findings`` next to them (``.json``), so a later prepare, which sees
    a whole shard, still lists them (:func:`cut_losses`).
    """
    if shard.cut_at is None:
        raise ValueError(f"{shard.shard} is not cut")
    root = Path(path)
    tar = root / shard.shard
    keep = root / CUT_FOLDER / (shard.shard.replace("/", "__") + ".tail")
    keep.parent.mkdir(parents=True, exist_ok=True)
    lost = [_entry(f) for f in findings if f.lost and f.shard == shard.shard]
    keep.with_suffix(".json").write_text(json.dumps(lost, indent=1, ensure_ascii=False) + "\n")
    with tar.open("r+b") as f:
        f.seek(shard.cut_at)
        keep.write_bytes(f.read())
        f.truncate(shard.cut_at)
        f.seek(shard.cut_at)
        f.write(bytes(2 * BLOCK))
    logger.warning(
        "%s: cut back to its whole samples (%s bytes from %s kept in %s)",
        shard.shard,
        f"{shard.size - shard.cut_at:,}",
        f"{shard.cut_at:,}",
        keep,
    )
    return keep


def cut_losses(path: Path | str) -> list[Finding]:
    """The conversations lost when shards were cut back by earlier prepares."""
    root = Path(path)
    found = []
    for record in sorted((root / CUT_FOLDER).glob("*.json")):
        for e in json.loads(record.read_text()):
            if (root / e["shard"]).is_file():
                found.append(Finding(**e, lost=True))
    return found
