"""The shard check: exact findings on hand-built tars, and proofs that Energon really drops
what the check says it drops (and nothing else), through its own prepare and loader."""

from __future__ import annotations

import ast
import contextlib
import glob
import io
import json
import tarfile
from pathlib import Path

import pytest
from helpers import SAMPLE_DATA
from hypothesis import given, settings
from hypothesis import strategies as st

from energon_packing.incoming.shards import (
    LOSSES_FILE,
    SHARD_REASONS,
    Finding,
    load_losses,
    scan_dataset,
    scan_shard,
    write_losses,
)
from energon_packing.incoming.tar_walk import walk

HEADER = 512


def document(key: str) -> bytes:
    messages = [
        {"role": "user", "content": f"what is {key}?"},
        {"role": "assistant", "content": f"{key} is a test conversation."},
    ]
    return json.dumps({"messages": messages}).encode()


def tar(members, *, fmt=tarfile.USTAR_FORMAT) -> bytes:
    """``(name, bytes)`` for a file, ``(name, type, linkname)`` for anything else."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt) as writer:
        for member in members:
            info = tarfile.TarInfo(member[0])
            if len(member) == 2:
                info.size = len(member[1])
                writer.addfile(info, io.BytesIO(member[1]))
            else:
                info.type, info.linkname = member[1], member[2]
                writer.addfile(info)
    return out.getvalue()


def conversations(*keys: str) -> list:
    return [(f"{key}.json", document(key)) for key in keys]


def lie_about_size(data: bytes, offset: int, size: int) -> bytes:
    """The header at ``offset`` claims ``size`` bytes (checksum kept valid)."""
    info = tarfile.TarInfo.frombuf(data[offset : offset + HEADER], "utf-8", "surrogateescape")
    info.size = size
    return data[:offset] + info.tobuf(tarfile.USTAR_FORMAT) + data[offset + HEADER :]


def findings(data: bytes, tmp_path: Path, name: str = "x.tar") -> list[tuple]:
    (tmp_path / name).write_bytes(data)
    return [(f.reason, f.key, f.offset, f.lost) for f in scan_shard(tmp_path / name)[1]]


EIGHT = conversations(*(f"s{i}" for i in range(8)))  # each member: header + 1 block = 1 KiB


def test_the_walk_reads_what_tarfile_reads(tmp_path):
    """Same members, offsets and sizes as Python's tarfile (Energon's reader) on WebDataset's
    pax shards, GNU long names, ustar prefixes, links and directories."""
    long_name = "d/" + "n" * 150 + ".json"
    built = {
        "gnu.tar": tar([(long_name, b"{}"), *EIGHT[:2]], fmt=tarfile.GNU_FORMAT),
        "pax.tar": tar(
            [("é.json", b"{}"), ("a" * 120 + ".json", b"x" * 700)], fmt=tarfile.PAX_FORMAT
        ),
        "ustar.tar": tar(
            [
                ("p" * 90 + "/" + "q" * 90 + ".json", b"{}"),
                ("l", tarfile.SYMTYPE, "x"),
                ("dir/", tarfile.DIRTYPE, ""),
            ]
        ),
    }
    for name, data in built.items():
        (tmp_path / name).write_bytes(data)
    paths = sorted(glob.glob(str(SAMPLE_DATA / "shards" / "*.tar"))) + sorted(
        str(tmp_path / n) for n in built
    )
    for path in paths:
        with open(path, "rb") as f:
            members, how, _ = walk(f, Path(path).stat().st_size, 0)
        with tarfile.open(path) as reference:
            expected = [(m.name, m.offset, m.offset_data, m.size) for m in reference]
        assert [(m.name, m.offset, m.offset_data, m.size) for m in members] == expected, path
        assert how == "end"


_NAME_CHARS = st.characters(codec="utf-8", exclude_characters="\0/", exclude_categories=["Cs"])
_PART = st.text(_NAME_CHARS, min_size=1, max_size=12) | st.sampled_from(["a.json", ".", "x"])


_MEMBER = st.fixed_dictionaries(
    {
        "name": st.builds(
            lambda parts, end: "/".join(parts) + end,
            st.lists(_PART, min_size=1, max_size=3),
            st.sampled_from(["", ".json", ".img0.jpg", "x" * 120 + ".png"]),
        ),
        "type": st.sampled_from([tarfile.REGTYPE] * 4 + [tarfile.DIRTYPE, tarfile.SYMTYPE]),
        "mtime": st.sampled_from([0, 1_700_000_000, 1_700_000_000.25]),
        "comment": st.text(_NAME_CHARS, max_size=3) | st.just("c" * 700),
        "size": st.integers(0, 1500),
    }
)


def random_tar(fmt: int, members: list[dict]) -> bytes:
    """A tar as Python's tarfile (WebDataset's writer) writes it; names ustar cannot hold are
    left out."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt, encoding="utf-8") as writer:
        for spec in members:
            info = tarfile.TarInfo(spec["name"])
            info.type, info.mtime = spec["type"], spec["mtime"]
            if fmt == tarfile.PAX_FORMAT and spec["comment"]:
                info.pax_headers = {"comment": spec["comment"]}
            if info.type == tarfile.SYMTYPE:
                info.linkname = "target.json"
            try:
                if info.isreg():
                    info.size = spec["size"]
                    writer.addfile(info, io.BytesIO(bytes(info.size)))
                else:
                    writer.addfile(info)
            except ValueError:  # a name ustar cannot hold
                pass
    return out.getvalue()


@settings(max_examples=80, deadline=None)
@given(
    fmt=st.sampled_from([tarfile.PAX_FORMAT, tarfile.GNU_FORMAT, tarfile.USTAR_FORMAT]),
    members=st.lists(_MEMBER, max_size=8),
)
def test_the_walk_reads_what_tarfile_reads_on_random_tars(fmt, members):
    """The fast walk (pax headers read inline, checksums in batches) against Python's
    tarfile, member for member, on random names (unicode, dots, folders, past 100 and 255
    bytes), sizes, member types, float mtimes and extra pax records (one block of records, or
    several)."""
    import tempfile

    data = random_tar(fmt, members)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "x.tar"
        path.write_bytes(data)
        with open(path, "rb") as f:
            got, how, _ = walk(f, len(data), 0)
        with tarfile.open(path, encoding="utf-8") as reference:
            expected = [(m.name, m.offset, m.offset_data, m.size, m.isreg()) for m in reference]
    assert [(m.name, m.offset, m.offset_data, m.size, m.kind == "file") for m in got] == expected
    assert how == "end"


def test_a_clean_shard_has_no_findings(tmp_path):
    assert findings(tar(EIGHT), tmp_path) == []
    scan = scan_dataset(SAMPLE_DATA)
    assert scan.findings == [] and sum(s.samples for s in scan.shards) == 400


def test_a_shard_cut_inside_a_member(tmp_path):
    """Energon's prepare fails the whole shard; the check names the member and the offset
    where the whole samples end."""
    data = tar(EIGHT)[: 5 * 1024 + HEADER + 40]  # 40 bytes into s5's document
    (tmp_path / "x.tar").write_bytes(data)
    summary, found = scan_shard(tmp_path / "x.tar")
    assert [(f.reason, f.key, f.offset, f.lost) for f in found] == [
        ("truncated_member", "s5", 5 * 1024, True)
    ]
    assert "the shard ends at 5,672" in found[0].detail
    assert (summary.cut_at, summary.samples, summary.cut_member) == (5 * 1024, 5, "s5.json")


def test_a_shard_cut_inside_a_header(tmp_path):
    """tarfile stops silently at a header cut short: the member vanishes."""
    data = tar(EIGHT)[: 6 * 1024 + 200]
    assert findings(data, tmp_path) == [("truncated_member", "s6", 6 * 1024, True)]


def test_a_cut_sample_loses_its_earlier_parts(tmp_path):
    data = tar([*EIGHT[:2], ("s2.json", document("s2")), ("s2.img0.png", b"p" * 900)])
    assert findings(data[: 3 * 1024 + HEADER + 100], tmp_path) == [
        ("lost_in_shard", "s2", 2 * 1024, True),
        ("truncated_member", "s2.img0", 3 * 1024, False),
    ]


def test_a_member_that_lies_about_its_size(tmp_path):
    """Its claimed end is no header: tarfile stops there, silently; the members after it
    vanish (the liar's own sample reaches the loader, with the wrong bytes)."""
    data = lie_about_size(tar(EIGHT), 3 * 1024, 700)
    assert findings(data, tmp_path) == [
        ("truncated_member", "s3", 3 * 1024, False),
        *[("lost_in_shard", f"s{i}", i * 1024, True) for i in range(4, 8)],
    ]


def test_a_member_whose_size_swallows_the_rest_of_the_shard(tmp_path):
    """The issue's shard: the 5th of 12 headers claims 9,000 bytes, its end lands in the
    end-of-archive zeros; tarfile ends there, and 7 of the 12 samples vanish."""
    twelve = conversations(*(f"c{i:02d}" for i in range(12)))
    assert findings(lie_about_size(tar(twelve), 4 * 1024, 9000), tmp_path) == [
        ("truncated_member", "c04", 4 * 1024, False),
        *[("lost_in_shard", f"c{i:02d}", i * 1024, True) for i in range(5, 12)],
    ]
    past_the_end = lie_about_size(tar(twelve), 4 * 1024, 90_000)  # and past the end of the file
    assert findings(past_the_end, tmp_path) == [
        ("truncated_member", "c04", 4 * 1024, True),  # cut back with its sample
        *[("lost_in_shard", f"c{i:02d}", i * 1024, True) for i in range(5, 12)],
    ]


def test_tars_concatenated(tmp_path):
    data = tar(EIGHT[:2]) + tar(conversations("t0", "t1"))
    assert findings(data, tmp_path) == [
        ("lost_in_shard", "t0", 10240, True),
        ("lost_in_shard", "t1", 10240 + 1024, True),
    ]


def test_keys_repeated_adjacent_and_apart(tmp_path):
    adjacent = tar([*conversations("a", "a"), ("a.img0.png", b"1"), ("a.img0.png", b"2")])
    assert findings(adjacent, tmp_path) == [
        ("duplicate_key", "a", 0, True),  # the earlier document vanishes
        ("duplicate_key", "a", 2048, False),  # the earlier image is replaced
    ]
    (tmp_path / "one").mkdir()
    (tmp_path / "one" / "a.tar").write_bytes(tar(conversations("k", "m", "k")))
    (tmp_path / "one" / "b.tar").write_bytes(tar(conversations("m")))
    scan = scan_dataset(tmp_path / "one")
    assert [(f.shard, f.reason, f.key, f.offset) for f in scan.findings] == [
        ("a.tar", "duplicate_key", "k", 2048),
        ("b.tar", "duplicate_key", "m", 0),
    ]
    assert len(scan.repeated_apart) == 2 and "a.tar at 1,024" in scan.findings[1].detail


def test_members_that_are_no_regular_file(tmp_path):
    data = tar(
        [
            *conversations("a"),
            ("b.json", tarfile.SYMTYPE, "a.json"),  # b has no other member: it vanishes
            ("c.json", tarfile.LNKTYPE, "a.json"),
            ("c.img0.png", b"png"),  # c exists without its document: missing_json
            ("d.json", tarfile.DIRTYPE, ""),
            ("e.json", tarfile.FIFOTYPE, ""),
            ("f.img0.png", tarfile.CHRTYPE, ""),
            ("folder", tarfile.DIRTYPE, ""),  # an ordinary directory entry: nothing lost
        ]
    )
    assert findings(data, tmp_path) == [
        ("not_regular_file", "b", 1024, True),
        ("not_regular_file", "c", 1536, False),
        ("missing_json", "c", 2048, False),
        ("not_regular_file", "d", 3072, False),
        ("not_regular_file", "e", 3584, False),
        ("not_regular_file", "f.img0", 4096, False),
    ]


def test_dotted_keys_merge_into_one_sample(tmp_path):
    """WebDataset's key is the name up to the FIRST dot: four conversations become one
    sample 'www' without a json part."""
    dotted = [f"www.example.com_{i:03d}" for i in range(4)]
    data = tar(conversations("a", *dotted, "z"))
    assert findings(data, tmp_path) == [
        *[("dotted_key", key, 1024 * (i + 1), True) for i, key in enumerate(dotted)][:1],
        ("missing_json", "www", 1024, False),
        *[("dotted_key", key, 1024 * (i + 1), True) for i, key in enumerate(dotted)][1:],
    ]
    (tmp_path / "x.tar").write_bytes(data)
    detail = scan_shard(tmp_path / "x.tar")[1][0].detail
    assert "key 'www', part 'example.com_000.json'" in detail and "3 other" in detail


def test_parts_no_sample_can_reach(tmp_path):
    data = tar(
        [
            *conversations("a"),
            ("README", b"notes"),
            (".json", document("hidden")),
            ("__meta__", b"m"),
            ("dir/.json", document("dir")),  # the regex makes 'dir/' its key: reachable
        ]
    )
    assert findings(data, tmp_path) == [
        ("unreachable_part", "README", 1024, False),
        ("unreachable_part", ".json", 2048, True),
        ("unreachable_part", "__meta__", 3072, False),
    ]


def test_samples_without_a_document(tmp_path):
    data = tar([*conversations("a"), ("b.img0.png", b"p"), ("b.txt", b"t"), *conversations("c")])
    assert findings(data, tmp_path) == [("missing_json", "b", 1024, False)]


def test_the_losses_file_round_trips(tmp_path):
    lost = Finding(
        shard="s.tar",
        offset=7,
        key="k1",
        member="k1.json",
        reason="lost_in_shard",
        detail="after x",
        lost=True,
    )
    kept = Finding(
        shard="s.tar", offset=9, key="k2", member="k2", reason="missing_json", detail="d"
    )
    assert load_losses(tmp_path) == []
    written = write_losses(tmp_path, [lost, kept], shards=1)
    assert written == tmp_path / LOSSES_FILE
    assert load_losses(tmp_path) == [("k1", "lost_in_shard", "after x")]
    document = json.loads(written.read_text())
    assert document["format"] == "energon_packing.losses/1" and document["shards"] == 1
    assert document["losses"][0] == {
        "key": "k1",
        "reason": "lost_in_shard",
        "detail": "after x",
        "shard": "s.tar",
        "offset": 7,
        "member": "k1.json",
    }


def test_every_shard_reason_is_a_registered_skip_reason():
    from energon_packing.incoming import shards
    from energon_packing.stats import REASONS

    emitted = {
        node.args[1].value
        for node in ast.walk(ast.parse(Path(shards.__file__).read_text()))
        if isinstance(node, ast.Call)
        and getattr(node.func, "id", None) == "find"
        and len(node.args) > 1
        and isinstance(node.args[1], ast.Constant)
    } | {"duplicate_key"}
    assert emitted == set(SHARD_REASONS)
    assert set(SHARD_REASONS) <= set(REASONS)


# ---- proofs through Energon's own prepare and loader ------------------------------------


def energon_prepare(path: Path) -> None:
    """Energon's own prepare, as a user runs it (no check first)."""
    from megatron.energon.cli.main import main as energon_cli

    from energon_packing.incoming.prepare import write_yamls

    args = ["prepare", str(path), "--non-interactive", "--skip-dataset-yaml",
            "--force-overwrite", "--no-progress", "--split-parts", "train:.*"]  # fmt: skip
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        energon_cli.main(args=args, standalone_mode=False)
    write_yamls(path)


def loader_keys(path: Path) -> tuple[list[str], dict]:
    from helpers import loader_batches

    from energon_packing import PackingTaskEncoder

    te = PackingTaskEncoder(tokenizer="bundled", max_input_seq_length=512)
    keys = [s.__key__ for s in loader_batches(path, te, buffer=None, batch_size=None)]
    return keys, {r: list(k) for r, k in te.stats.skipped_keys.items()}


@pytest.mark.energon
def test_energon_drops_exactly_what_the_check_finds(tmp_path):
    """One folder with every class Energon's prepare accepts: the conversations that reach
    the loader (packed or skipped) are exactly the documents the check does not list as
    lost, and each lost one is absent."""
    shards = {
        "lie.tar": lie_about_size(tar(conversations(*(f"l{i}" for i in range(6)))), 2048, 700),
        "cat.tar": tar(conversations("c0")) + tar(conversations("c1")),
        "dup.tar": tar([("d0.json", document("old")), ("d0.json", document("d0"))]),
        "links.tar": tar(
            [
                *conversations("n0"),
                ("n1.json", tarfile.SYMTYPE, "n0.json"),
                ("n2.json", tarfile.LNKTYPE, "n0.json"),
                ("n3.json", tarfile.DIRTYPE, ""),
            ]
        ),
        "dots.tar": tar(conversations("w0", "www.example.com_000", "www.example.com_001")),
        "parts.tar": tar([*conversations("p0"), (".json", document("h")), ("p1.png", b"x")]),
        "head.tar": tar(conversations("h0", "h1", "h2"))[: 2 * 1024 + 100],
        "tail.tar": lie_about_size(tar(conversations(*(f"t{i}" for i in range(6)))), 0, 9000),
    }
    for name, data in shards.items():
        (tmp_path / name).write_bytes(data)
    scan = scan_dataset(tmp_path)
    energon_prepare(tmp_path)
    read, skipped = loader_keys(tmp_path)
    reached = set(read) | {k for keys in skipped.values() for k in keys}
    lost = {f.key for f in scan.losses}
    documents = {f"l{i}" for i in range(6)} | {"c0", "c1", "d0", "n0", "n1", "n2", "n3", "w0"}
    documents |= {"www.example.com_000", "www.example.com_001", "p0", ".json", "h0", "h1", "h2"}
    documents |= {f"t{i}" for i in range(6)}
    assert lost == {"l3", "l4", "l5", "c1", "d0", "n1", "n2", "www.example.com_000",
                    "www.example.com_001", ".json", "h2", "t1", "t2", "t3", "t4", "t5"}  # fmt: skip
    assert lost & set(read) == {"d0"}  # the later d0 document is read, the earlier is lost
    # n3.json is a directory: no document, nothing lost; www and p1 have no document
    assert reached == (documents - (lost - {"d0"}) - {"n3"}) | {"www", "p1"}
    assert set(skipped["missing_json"]) == {"www", "p1"}
    assert sorted(skipped["malformed_json"]) == ["l2", "t0"]  # the liars' own documents


@pytest.mark.energon
def test_energon_refuses_a_cut_shard_and_keys_repeated_apart(tmp_path):
    (tmp_path / "cut").mkdir()
    (tmp_path / "cut" / "x.tar").write_bytes(tar(EIGHT)[: 5 * 1024 + HEADER + 40])
    with pytest.raises(AssertionError, match="has no samples"):
        energon_prepare(tmp_path / "cut")
    (tmp_path / "dup").mkdir()
    (tmp_path / "dup" / "x.tar").write_bytes(tar(conversations("k", "m", "k")))
    with pytest.raises(SystemExit):  # after printing DuplicateSampleKeyError's advice
        energon_prepare(tmp_path / "dup")


@pytest.mark.energon
def test_prepare_keeps_the_whole_samples_of_a_cut_shard(tmp_path):
    from energon_packing.incoming.prepare import ShardLossError, prepare_dataset

    data = tar(EIGHT)
    (tmp_path / "cut.tar").write_bytes(data[: 5 * 1024 + HEADER + 40])
    # first in the folder: Energon's prepare prints its first two documents, and raises on the
    # liar's (malformed) one after writing the index
    (tmp_path / "a-lie.tar").write_bytes(
        lie_about_size(tar(conversations("q0", "q1", "q2")), 0, 700)
    )
    with pytest.raises(ShardLossError, match=r"3 conversation\(s\) would vanish"):
        prepare_dataset(tmp_path)
    assert not (tmp_path / ".nv-meta" / "index.sqlite").exists()
    prepare_dataset(tmp_path, allow_losses=True)
    read, skipped = loader_keys(tmp_path)
    assert read == [f"s{i}" for i in range(5)] and skipped == {"malformed_json": ["q0"]}
    expected = [("q1", "lost_in_shard"), ("q2", "lost_in_shard"), ("s5", "truncated_member")]
    assert [(k, r) for k, r, _ in load_losses(tmp_path)] == expected
    tail = tmp_path / ".nv-meta" / "energon_packing_cut" / "cut.tar.tail"
    assert data[5 * 1024 : 5 * 1024 + HEADER + 40] == tail.read_bytes()
    prepare_dataset(tmp_path, allow_losses=True)  # the shard now looks whole: still listed
    assert [(k, r) for k, r, _ in load_losses(tmp_path)] == expected


def test_webdatasets_own_iterator_splits_at_the_first_dot(tmp_path):
    """WebDataset 1.0.2's reader (not only Energon's) makes one sample 'www' of the dotted
    keys, and skips a symlinked document."""
    from webdataset.tariterators import group_by_keys, tar_file_iterator

    data = tar([*conversations("www.a_0", "www.a_1"), ("b.json", tarfile.SYMTYPE, "www.a_0.json")])
    files = [dict(f, __url__="x") for f in tar_file_iterator(io.BytesIO(data))]
    samples = list(group_by_keys(files))
    assert [sorted(k for k in s if not k.startswith("__")) for s in samples] == [
        ["a_0.json", "a_1.json"]
    ]
    assert samples[0]["__key__"] == "www"
