"""``energon-packing convert``: users' corpora in, packs out, every record packed or reported.

Corpora are written as users' tools write them (:mod:`energon_packing.testing.corpora`: a LLaVA
JSON list + image folder, ShareGPT JSONL, OpenAI-style messages JSONL, a the_cauldron-style
dataset through ``datasets``' own ``save_to_disk`` and ``to_parquet``), with broken records
planted; the converted folder is read by the real Energon loader through PackingTaskEncoder.
"""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers import loader_batches

from energon_packing import PackingTaskEncoder
from energon_packing.testing import corpora
from energon_packing.tools import convert as convert_module
from energon_packing.tools.cli import main
from energon_packing.tools.convert import MAP_FILE, REPORT_FILE, convert, read_records


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _packed_keys(out: Path, split: str = "train") -> list[str]:
    """Every conversation key the real loader puts in a pack (split ``split``)."""
    from megatron.energon import WorkerConfig, get_loader, get_val_dataset

    te = PackingTaskEncoder(tokenizer="bundled", max_input_seq_length=8192)
    if split == "train":
        batches = loader_batches(out, te, buffer=32)
    else:
        batches = get_loader(
            get_val_dataset(
                out,
                split_part="val",
                worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0),
                batch_size=1,
                packing_buffer_size=32,
                task_encoder=te,
            )
        )
    keys, skipped = [], []
    for batch in batches:
        keys += [k for pack in batch["source_ids"] for k in pack]
        skipped += batch.get("packing_skipped", [])
    assert not skipped, skipped
    return keys


@pytest.fixture(scope="module")
def llava(tmp_path_factory):
    """A LLaVA corpus with four broken records planted (indices 30-33)."""
    folder = tmp_path_factory.mktemp("llava")
    source = corpora.llava_json(folder, 30)
    records = json.loads(source.read_text())
    (folder / "images" / "broken.jpg").write_bytes(b"\xff\xd8 not really a jpeg")
    turns = [{"from": "human", "value": "<image>\nWhat?"}, {"from": "gpt", "value": "This."}]
    records += [
        {"id": "gone", "image": "coco/missing.jpg", "conversations": turns},
        {"id": "bad", "image": "broken.jpg", "conversations": turns},
        {"id": "shape", "conversations": "not a list"},
        {"id": "role", "conversations": [{"from": "robot", "value": "hi"}]},
    ]
    source.write_text(json.dumps(records))
    return folder, source, records


def test_llava_records_are_packed_or_reported_exactly_once(llava, tmp_path):
    folder, source, records = llava
    out = tmp_path / "out"
    result = convert(source=source, out=out, media_root=folder / "images", val_fraction=0.25)
    report = _lines(out / REPORT_FILE)
    assert [(r["file"], r["index"], r["reason"]) for r in report] == [
        ("llava.json", 30, "missing_image"),
        ("llava.json", 31, "unreadable_image"),
        ("llava.json", 32, "malformed_record"),
        ("llava.json", 33, "malformed_record"),
    ]
    mapping = _lines(out / MAP_FILE)
    assert [m["index"] for m in mapping] == list(range(30))
    assert [m["id"] for m in mapping] == [r["id"] for r in records[:30]]
    assert all("." not in m["key"] for m in mapping)
    assert len({m["key"] for m in mapping}) == 30 == result.converted
    train, val = _packed_keys(out), _packed_keys(out, "val")
    assert sorted(train + val) == sorted(m["key"] for m in mapping)  # exactly once, nothing lost
    assert not set(train) & set(val) and result.val == len(val) > 0


def test_a_converted_document_carries_the_record_as_it_was(llava, tmp_path):
    folder, source, records = llava
    out = tmp_path / "out"
    convert(source=source, out=out, media_root=folder / "images", prepare=False)
    with tarfile.open(out / "shards" / "train-00000.tar") as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
    record = records[1]  # an image record: "<image>\n" leads its first human turn
    document = json.loads(members["r000000001.json"])
    first = record["conversations"][0]["value"].removeprefix("<image>")
    assert document["images"] == ["img0" + Path(record["image"]).suffix]
    assert document["messages"][0] == {
        "role": "user",
        "content": [
            {"type": "image", "image": document["images"][0]},
            {"type": "text", "text": first},
        ],
    }
    roles = [m["role"] for m in document["messages"]]
    assert roles == ["user", "assistant"] * (len(record["conversations"]) // 2)
    texts = [m["content"] for m in document["messages"][1:]]
    assert texts == [t["value"] for t in record["conversations"][1:]]
    image = members[f"r000000001.{document['images'][0]}"]
    assert image == (folder / "images" / record["image"]).read_bytes()  # copied, not re-encoded
    assert "system" not in roles  # nothing invented


@pytest.mark.parametrize("fmt", ["sharegpt", "messages", "hf-disk", "hf-parquet"])
def test_every_format_round_trips_and_auto_writes_what_explicit_writes(fmt, tmp_path):
    if fmt == "sharegpt":
        source, explicit = corpora.sharegpt_jsonl(tmp_path / "src", 24), "sharegpt"
    elif fmt == "messages":
        source, explicit = corpora.messages_jsonl(tmp_path / "src", 24), "messages"
    else:
        pytest.importorskip("datasets")
        disk, parquet = corpora.cauldron_dataset(tmp_path / "src", 18)
        source, explicit = (disk if fmt == "hf-disk" else parquet), "hf"
    auto = convert(source=source, out=tmp_path / "auto", prepare=False)
    named = convert(source=source, out=tmp_path / "named", format=explicit)
    assert auto.converted == named.converted > 0 and not named.reported
    for a, b in zip(auto.shards, named.shards, strict=True):
        assert a.read_bytes() == b.read_bytes()  # same input, same bytes
    keys = _packed_keys(tmp_path / "named")
    assert sorted(keys) == sorted(m["key"] for m in _lines(tmp_path / "named" / MAP_FILE))


def test_the_cauldron_puts_every_image_in_the_first_user_turn(tmp_path):
    pytest.importorskip("datasets")
    disk, parquet = corpora.cauldron_dataset(tmp_path, 6)
    for source in (disk, parquet):
        rows = [record for _, _, record in read_records(source)]
        out = tmp_path / f"out-{source.name}"
        convert(source=source, out=out, prepare=False)
        with tarfile.open(out / "shards" / "train-00000.tar") as tar:
            documents = [
                json.loads(tar.extractfile(m).read()) for m in tar if m.name.endswith(".json")
            ]
        for row, document in zip(rows, documents, strict=True):
            first = document["messages"][0]
            images = [p for p in first["content"] if isinstance(p, dict) and p["type"] == "image"]
            assert len(images) == len(row["images"]) == len(document.get("images", []))
            later = document["messages"][1:]
            assert not any(isinstance(m["content"], list) for m in later)
            assert [m["role"] for m in document["messages"]] == ["user", "assistant"] * len(
                row["texts"]
            )


def test_jsonl_broken_lines_are_reported_with_their_line_index(tmp_path):
    source = corpora.messages_jsonl(tmp_path, 4)
    lines = source.read_text().splitlines()
    lines.insert(2, '{"messages": [')  # broken
    lines.insert(4, "")  # blank: not a record, still counted as a line
    source.write_text("\n".join(lines) + "\n")
    result = convert(source=source, out=tmp_path / "out", prepare=False)
    report = _lines(tmp_path / "out" / REPORT_FILE)
    assert [(r["index"], r["reason"]) for r in report] == [(2, "malformed_record")]
    assert report[0]["detail"].startswith("the line is not JSON")
    assert [m["index"] for m in _lines(tmp_path / "out" / MAP_FILE)] == [0, 1, 3, 5]
    assert result.converted == 4


def test_a_json_list_streams_across_chunk_boundaries(tmp_path, monkeypatch):
    tricky = [
        {"id": i, "conversations": [{"from": "human", "value": 'a ] , [ " é 😀' * i}]}
        for i in range(40)
    ]
    path = tmp_path / "list.json"
    path.write_text(json.dumps(tricky, ensure_ascii=False, indent=2))
    monkeypatch.setattr(convert_module, "_CHUNK", 7)
    assert [r for _, _, r in read_records(path)] == tricky
    path.write_text(json.dumps(tricky)[:-30])  # cut: the rest is one broken record
    got = list(read_records(path))
    assert isinstance(got[-1][2], convert_module.Broken) and len(got) < 41


def test_cli_counts_strict_and_refuses_a_non_empty_out(llava, tmp_path):
    folder, source, _ = llava
    runner = CliRunner()
    args = ["convert", str(source), str(tmp_path / "out"), "--media-root", str(folder / "images")]
    result = runner.invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "converted 30 records" in result.output and "reported 4" in result.output
    again = runner.invoke(main, args)
    assert again.exit_code == 2
    assert (
        again.output.strip()
        .splitlines()[-1]
        .endswith("exists and is not empty: convert writes a new dataset folder")
    )
    strict = runner.invoke(main, [*args[:2], str(tmp_path / "strict"), *args[3:], "--strict"])
    assert strict.exit_code == 1


# ---- the shapes users write, read by the loader as they are --------------------------------------


def _encoded(document, images):
    from helpers import conversation_sample

    te = PackingTaskEncoder(tokenizer="bundled", max_input_seq_length=8192)
    return te.encode_sample(conversation_sample("k", document, images))


def _jpeg(seed: int = 0) -> bytes:
    import random

    from energon_packing.testing.synth import draw, encode_image, random_scene

    return encode_image(draw(random_scene(random.Random(seed))), "jpg")


def test_shapes_users_write_are_read_as_the_explicit_form():
    """Image parts named only in the content, one image part for one <image>, LLaVA's
    from/value with its 'image' field: each encodes exactly as the explicit document."""
    image, other = _jpeg(0), _jpeg(1)
    hf_parts = [{"type": "image", "image": "b.png"}, {"type": "image", "image": "a.jpg"}]
    explicit = {
        "messages": [
            {"role": "user", "content": [*hf_parts, {"type": "text", "text": "Compare."}]},
            {"role": "assistant", "content": "The first is brighter."},
        ],
    }
    parts = {"a.jpg": image, "b.png": other}
    implied = _encoded(explicit, parts)
    listed = _encoded({**explicit, "images": ["b.png", "a.jpg"]}, parts)
    assert implied.input_ids.tolist() == listed.input_ids.tolist()
    assert implied.images == listed.images == [other, image]

    single = {
        "messages": [
            {"role": "user", "content": "<image>\nWhat?"},
            {"role": "assistant", "content": "A cat."},
        ]
    }
    one = _encoded(single, {"jpg": image})
    assert (
        one.input_ids.tolist()
        == _encoded({**single, "images": ["jpg"]}, {"jpg": image}).input_ids.tolist()
    )

    llava = {
        "image": "000000033471.jpg",
        "conversations": [
            {"from": "human", "value": "<image>\nWhat?"},
            {"from": "gpt", "value": "A cat."},
        ],
    }
    assert _encoded(llava, {"jpg": image}).input_ids.tolist() == one.input_ids.tolist()


def test_what_cannot_be_read_names_convert():
    from helpers import conversation_sample

    sample = conversation_sample("k", {"conversations": [{"from": "robot", "value": "hi"}]})
    reason, detail = sample.problem
    assert reason == "malformed_message"
    assert detail.startswith("conversations[0]: 'from' is 'robot'")
    assert "energon-packing convert" in detail
    sample = conversation_sample("k", {"dialogue": []})
    reason, detail = sample.problem
    assert reason == "missing_messages" and "energon-packing convert" in detail


def test_a_problem_written_as_text_by_an_older_sample_loader_is_still_a_skip():
    """Release 0.3 documented ``problem`` as ``"reason: detail"``; a user's sample loader
    that still writes it so gets the skip, not an encode error."""
    import dataclasses

    from helpers import conversation_sample
    from megatron.energon import SkipSample

    from energon_packing import PackingTaskEncoder

    te = PackingTaskEncoder(tokenizer="bundled", max_input_seq_length=256)
    sample = conversation_sample("k", {"messages": [{"role": "user", "content": "hi"}]})
    with pytest.raises(SkipSample):
        te.encode_sample(dataclasses.replace(sample, problem="malformed_json: a bad byte"))
    assert te.stats.skipped_keys == {"malformed_json": ["k"]}


def test_a_val_split_by_file_and_llava_video_records_carried(tmp_path):
    """A source folder with a train and a val file; LLaVA-Video records keep their clip as a
    part (packing video is not there yet: the loader reports them, nothing vanishes)."""
    source = tmp_path / "src"
    corpora.sharegpt_jsonl(source, 6)
    clip = b"\x00\x00\x00\x18ftypmp42" + bytes(64)
    (source / "clips").mkdir()
    (source / "clips" / "c0.mp4").write_bytes(clip)
    video = {
        "id": "v0",
        "video": "clips/c0.mp4",
        "conversations": [
            {"from": "human", "value": "<video>\nWhat happens?"},
            {"from": "gpt", "value": "A ball rolls."},
        ],
    }
    (source / "val.jsonl").write_text(json.dumps(video) + "\n")
    with pytest.raises(ValueError, match=r"val_files \['nope.jsonl'\] name no source file"):
        convert(source=source, out=tmp_path / "bad", val_files=("nope.jsonl",))
    result = convert(source=source, out=tmp_path / "out", val_files=("val.jsonl",), prepare=False)
    assert (result.train, result.val) == (6, 1)
    with tarfile.open(tmp_path / "out" / "shards" / "val-00000.tar") as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
    document = json.loads(members["r000000006.json"])
    assert document["videos"] == ["vid0.mp4"] and members["r000000006.vid0.mp4"] == clip
    assert document["messages"][0]["content"][0] == {"type": "video", "video": "vid0.mp4"}


# ---- what real corpora hold (issue 24 review) --------------------------------------------------


def _convert_records(tmp_path, records, name="data.jsonl", **kwargs):
    source = tmp_path / "src"
    source.mkdir(exist_ok=True)
    (source / name).write_text("\n".join(json.dumps(r) for r in records) + "\n")
    out = tmp_path / "out"
    result = convert(source=source / name, out=out, prepare=False, **kwargs)
    documents = []
    for shard in result.shards:
        with tarfile.open(shard) as tar:
            documents += [
                json.loads(tar.extractfile(m).read()) for m in tar if m.name.endswith(".json")
            ]
    return result, documents, _lines(out / REPORT_FILE)


def test_messages_records_keep_every_image_or_report_it(tmp_path):
    image = _jpeg(3)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.jpg").write_bytes(image)
    records = [
        {  # a string user turn with <image>, the assistant's turn as parts
            "messages": [
                {"role": "user", "content": "<image>\nWhat is it?"},
                {"role": "assistant", "content": [{"type": "text", "text": "A shape."}]},
            ],
            "images": ["a.jpg"],
        },
        {  # <image> inside a text part
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "See <image> here."}]},
                {"role": "assistant", "content": "Yes."},
            ],
            "images": ["file://" + str(tmp_path / "src" / "a.jpg")],
        },
        {  # more listed images than references: reported, not dropped
            "messages": [
                {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "?"}]},
                {"role": "assistant", "content": "One."},
            ],
            "images": ["a.jpg", "a.jpg"],
        },
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]},
    ]
    result, documents, report = _convert_records(tmp_path, records)
    assert [(r["index"], r["reason"]) for r in report] == [(2, "malformed_record")]
    assert "1 listed image(s) no message refers to" in report[0]["detail"]
    assert result.converted == 3
    first, second = documents[:2]
    assert first["messages"][0]["content"][0] == {"type": "image", "image": "img0.jpg"}
    assert second["messages"][0]["content"] == [
        {"type": "text", "text": "See "},
        {"type": "image", "image": "img0.jpg"},
        {"type": "text", "text": " here."},
    ]


def test_hf_image_entries_inside_content_parts_keep_their_bytes(tmp_path):
    pytest.importorskip("datasets")
    import datasets

    image = _jpeg(4)
    rows = {
        "messages": [
            [
                {
                    "role": "user",
                    "content": [{"type": "image", "text": None}, {"type": "text", "text": "What?"}],
                },
                {"role": "assistant", "content": [{"type": "text", "text": "A thing."}]},
            ]
        ],
        "images": [[{"bytes": image, "path": None}]],
    }
    dataset = datasets.Dataset.from_dict(rows)
    dataset = dataset.cast_column("images", datasets.Sequence(datasets.Image()))
    dataset.save_to_disk(str(tmp_path / "ds"))
    result = convert(source=tmp_path / "ds", out=tmp_path / "out", prepare=False)
    assert result.converted == 1 and not result.reported
    with tarfile.open(result.shards[0]) as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar}
    assert members["r000000000.img0.jpg"] == image


def test_conversations_with_role_content_and_empty_image_fields(tmp_path):
    records = [
        {
            "conversations": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "yo"},
            ]
        },
        {
            "image": "",
            "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}],
        },
    ]
    auto, documents, report = _convert_records(tmp_path, records)
    assert auto.converted == 2 and not report
    assert (
        documents[0]
        == documents[1]
        == {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
    )


def test_byte_order_marks_same_names_in_two_folders_and_split_files(tmp_path):
    source = tmp_path / "src"
    for folder in ("a", "b"):
        (source / folder).mkdir(parents=True)
        record = {
            "conversations": [{"from": "human", "value": folder}, {"from": "gpt", "value": "ok"}]
        }
        (source / folder / "data.jsonl").write_bytes(
            b"\xef\xbb\xbf" + json.dumps(record).encode() + b"\n"
        )
    (source / "list.json").write_bytes(b"\xef\xbb\xbf" + json.dumps([record]).encode())
    (source / "meta.json").write_text('{"name": "not a list"}')
    result = convert(
        source=source, out=tmp_path / "out", prepare=False, val_files=("b/data.jsonl",)
    )
    mapping = _lines(tmp_path / "out" / MAP_FILE)
    assert [(m["file"], m["index"]) for m in mapping] == [
        ("a/data.jsonl", 0),
        ("b/data.jsonl", 0),
        ("list.json", 0),
    ]
    assert (result.train, result.val) == (2, 1)
    report = _lines(tmp_path / "out" / REPORT_FILE)
    assert [(r["file"], r["index"], r["reason"]) for r in report] == [
        ("meta.json", 0, "malformed_record")
    ]

    split = tmp_path / "hub"
    (split / "data").mkdir(parents=True)
    for name in ("train-00000-of-00001.jsonl", "test-00000-of-00001.jsonl"):
        (split / "data" / name).write_text(json.dumps(record) + "\n")
    with pytest.raises(ValueError, match="files of several splits \\(test, train\\).*--val-file"):
        convert(source=split, out=tmp_path / "hub-out")
    assert not (tmp_path / "hub-out").exists()  # refused before anything was written


def test_a_failed_run_leaves_no_folder_behind(tmp_path, monkeypatch):
    source = corpora.messages_jsonl(tmp_path / "src", 4)

    def boom(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(convert_module._Shards, "add", boom)
    with pytest.raises(RuntimeError, match="disk full"):
        convert(source=source, out=tmp_path / "out")
    assert not (tmp_path / "out").exists()
    monkeypatch.undo()
    assert convert(source=source, out=tmp_path / "out").converted == 4  # the rerun is not refused
