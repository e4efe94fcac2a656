"""``energon-packing convert``: users' corpora in, packs out, every record packed or reported.

Corpora are written as users' tools write them (:mod:`energon_packing.testing.corpora`: a LLaVA
JSON list + image folder, ShareGPT JSONL, OpenAI-style messages JSONL, a the_cauldron-style
dataset through ``datasets``' own ``save_to_disk`` and ``to_parquet``), with broken records
planted; the converted folder is read by the real Energon loader through PackingTaskEncoder.
"""

from __future__ import annotations

import base64
import json
import shutil
import tarfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers import loader_batches

from energon_packing import PackingTaskEncoder
from energon_packing.incoming import sources, tar_writer
from energon_packing.incoming.convert import MAP_FILE, REPORT_FILE, convert, read_records
from energon_packing.testing import corpora
from energon_packing.tools.cli import main


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
    monkeypatch.setattr(sources, "_CHUNK", 7)
    assert [r for _, _, r in read_records(path)] == tricky
    path.write_text(json.dumps(tricky)[:-30])  # cut: the rest is one broken record
    got = list(read_records(path))
    assert isinstance(got[-1][2], sources.Broken) and len(got) < 41


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
        .endswith(
            "exists and is not empty: convert writes a new dataset folder; pass --overwrite to "
            "replace what an earlier convert wrote"
        )
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
    assert detail.startswith("conversations[0]: the speaker is 'robot'")
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
    part, bytes as they were (the loader packs it: tests/test_video_packs.py)."""
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
    # decode=False: the clip is header bytes only (its bytes are carried, never read)
    result = convert(
        source=source, out=tmp_path / "out", val_files=("val.jsonl",), prepare=False, decode=False
    )
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

    monkeypatch.setattr(tar_writer.Shards, "add", boom)
    with pytest.raises(RuntimeError, match="disk full"):
        convert(source=source, out=tmp_path / "out")
    assert not (tmp_path / "out").exists()
    monkeypatch.undo()
    assert convert(source=source, out=tmp_path / "out").converted == 4  # the rerun is not refused


# ---- videos: LLaVA-Video-178K, Video-LLaVA / ShareGPT4Video SFT, HF messages ---------------------

CLIPS = Path(__file__).parent / "data" / "video"
MP4, WEBM, MOV, MKV = (
    "h264_48x36_10fps_2s.mp4",
    "vp9_128x96_20fps_2.5s.webm",
    "h264_120x80_30fps_1s.mov",
    "h264_64x64_12fps_5s.mkv",
)


def _clip(folder: Path, relative: str, clip: str = MP4) -> bytes:
    """A real clip of ``tests/data/video`` copied to ``folder / relative``; its bytes."""
    target = folder / relative
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(CLIPS / clip, target)
    return target.read_bytes()


def _written(result) -> tuple[list[str], dict[str, bytes]]:
    """The member names of every shard, in order, and each member's bytes."""
    names, members = [], {}
    for shard in result.shards:
        with tarfile.open(shard) as tar:
            for member in tar.getmembers():
                names.append(member.name)
                members[member.name] = tar.extractfile(member).read()
    return names, members


def _jsonl(path: Path, records: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_a_llava_video_record_writes_its_image_placeholder_as_the_video(tmp_path):
    """LLaVA-Video-178K as downloaded: a bucket folder with its ``*_processed.json`` list and
    the extracted ``academic_source/...`` clips; the record's ``<image>`` is its video."""
    bucket = tmp_path / "0_30_s_academic_v0_1"
    clip = _clip(bucket, "academic_source/Charades/RW587.mp4")
    record = {
        "id": "RW587",
        "conversations": [
            {"from": "human", "value": "<image>\nWhat does the person do first?"},
            {"from": "gpt", "value": "They open a cabinet."},
            {"from": "human", "value": "What do they take out?"},
            {"from": "gpt", "value": "A blue cup."},
        ],
        "data_source": "0_30_s_academic_v0_1",
        "video": "academic_source/Charades/RW587.mp4",
    }
    source = bucket / "0_30_s_academic_oe_v0_1_qa_processed.json"
    source.write_text(json.dumps([record], indent=4))
    out = tmp_path / "out"
    result = convert(source=source, out=out)  # prepared too: prepare takes video parts
    names, members = _written(result)
    assert names == ["r000000000.json", "r000000000.vid0.mp4"]
    assert json.loads(members["r000000000.json"]) == {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "video", "video": "vid0.mp4"},
                    {"type": "text", "text": "\nWhat does the person do first?"},
                ],
            },
            {"role": "assistant", "content": "They open a cabinet."},
            {"role": "user", "content": "What do they take out?"},
            {"role": "assistant", "content": "A blue cup."},
        ],
        "videos": ["vid0.mp4"],
    }
    assert members["r000000000.vid0.mp4"] == clip  # the file's bytes, not re-encoded
    from helpers import conversation_sample

    sample = conversation_sample(
        "r000000000", json.loads(members["r000000000.json"]), {"vid0.mp4": clip}
    )
    assert sample.problem is None and sample.video_names == ["vid0.mp4"]  # as the loader reads it
    assert sample.videos == {"vid0.mp4": clip}
    assert _lines(out / MAP_FILE) == [
        {"file": source.name, "index": 0, "id": "RW587", "key": "r000000000"}
    ]
    assert not result.reported and (out / ".nv-meta").is_dir()


def test_video_placeholders_keep_each_clip_in_place_with_its_extension(tmp_path):
    """Video-LLaVA's format (ShareGPT4Video's SFT recipe trains on it): ``video`` a path or a
    list, one ``<video>`` each, in order; the extension is kept, lowercased."""
    source = tmp_path / "src"
    first = _clip(source, "clips/a.mp4")
    second = _clip(source, "clips/b.WEBM", WEBM)
    record = {
        "id": "v_two",
        "video": ["clips/a.mp4", "clips/b.WEBM"],
        "conversations": [
            {"from": "human", "value": "<video>\n<video>\nWhich clip is longer?"},
            {"from": "gpt", "value": "The second."},
        ],
    }
    result = convert(
        source=_jsonl(source / "sft.jsonl", [record]), out=tmp_path / "out", prepare=False
    )
    names, members = _written(result)
    assert names == ["r000000000.json", "r000000000.vid0.mp4", "r000000000.vid1.webm"]
    assert json.loads(members["r000000000.json"]) == {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "video", "video": "vid0.mp4"},
                    {"type": "text", "text": "\n"},
                    {"type": "video", "video": "vid1.webm"},
                    {"type": "text", "text": "\nWhich clip is longer?"},
                ],
            },
            {"role": "assistant", "content": "The second."},
        ],
        "videos": ["vid0.mp4", "vid1.webm"],
    }
    assert members["r000000000.vid0.mp4"] == first
    assert members["r000000000.vid1.webm"] == second


def test_messages_with_video_parts_as_chat_templates_write_them(tmp_path):
    """``{"type": "video", "video"}`` (Qwen, ``file://`` too), transformers' ``path``, the
    OpenAI-style ``video_url``, a bare part taking the listed video, a ``data:`` URI."""
    source = tmp_path / "src"
    mov = _clip(source, "clips/c.mov", MOV)
    mkv = _clip(source, "clips/d.mkv", MKV)
    mp4 = (CLIPS / MP4).read_bytes()
    uri = "data:video/mp4;base64," + base64.b64encode(mp4).decode()
    parts = [
        {"type": "video", "video": f"file://{source / 'clips' / 'c.mov'}"},
        {"type": "video", "path": "clips/c.mov"},
        {"type": "video_url", "video_url": {"url": "clips/d.mkv"}},
        {"type": "video"},
    ]
    records = [
        {
            "id": f"m{i}",
            "messages": [
                {"role": "user", "content": [part, {"type": "text", "text": "What moves?"}]},
                {"role": "assistant", "content": "A square."},
            ],
            **({"videos": ["clips/d.mkv"]} if i == 3 else {}),
        }
        for i, part in enumerate(parts)
    ]
    records.append(
        {
            "id": "m4",
            "messages": [
                {"role": "user", "content": "<video>\nWhat moves?"},
                {"role": "assistant", "content": "A square."},
            ],
            "videos": [uri],
        }
    )
    result = convert(
        source=_jsonl(source / "chat.jsonl", records), out=tmp_path / "out", prepare=False
    )
    assert result.converted == 5 and not result.reported
    names, members = _written(result)
    suffixes = ["mov", "mov", "mkv", "mkv", "mp4"]  # the data: URI's by its container
    assert names == [
        name for i, s in enumerate(suffixes) for name in (f"r{i:09d}.json", f"r{i:09d}.vid0.{s}")
    ]
    for i, (suffix, data) in enumerate(zip(suffixes, [mov, mov, mkv, mkv, mp4], strict=True)):
        part = f"vid0.{suffix}"
        assert json.loads(members[f"r{i:09d}.json"]) == {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "video", "video": part},
                        {"type": "text", "text": "What moves?" if i < 4 else "\nWhat moves?"},
                    ],
                },
                {"role": "assistant", "content": "A square."},
            ],
            "videos": [part],
        }
        assert members[f"r{i:09d}.{part}"] == data


def test_a_record_with_an_image_and_a_video_lists_both(tmp_path):
    """Placeholders place each; without them the video leads, then the image (Video-LLaVA's
    order); with an ``image`` field ``<image>`` stays the image."""
    source = tmp_path / "src"
    clip = _clip(source, "clips/a.mp4")
    image = _jpeg(5)
    (source / "imgs").mkdir()
    (source / "imgs" / "a.jpg").write_bytes(image)
    media = {"image": "imgs/a.jpg", "video": "clips/a.mp4"}
    answer = {"from": "gpt", "value": "No."}
    records = [
        {"id": "placed", **media, "conversations": [
            {"from": "human", "value": "<video>\n<image>\nIs the photo from the clip?"}, answer]},
        {"id": "lead", **media, "conversations": [
            {"from": "human", "value": "Is the photo from the clip?"}, answer]},
        {"id": "image", **media, "conversations": [
            {"from": "human", "value": "<image>\nIs the photo from the clip?"}, answer]},
    ]  # fmt: skip
    result = convert(
        source=_jsonl(source / "mixed.jsonl", records), out=tmp_path / "out", prepare=False
    )
    names, members = _written(result)
    assert names == [  # each record's parts in the order they are first used
        *("r000000000.json", "r000000000.vid0.mp4", "r000000000.img0.jpg"),
        *("r000000001.json", "r000000001.vid0.mp4", "r000000001.img0.jpg"),
        *("r000000002.json", "r000000002.img0.jpg", "r000000002.vid0.mp4"),
    ]
    video, picture = {"type": "video", "video": "vid0.mp4"}, {"type": "image", "image": "img0.jpg"}
    question = {"type": "text", "text": "Is the photo from the clip?"}
    newline_question = {"type": "text", "text": "\nIs the photo from the clip?"}
    expected_content = [
        [video, {"type": "text", "text": "\n"}, picture, newline_question],
        [video, picture, question],
        [video, picture, newline_question],
    ]
    for i, content in enumerate(expected_content):
        assert json.loads(members[f"r{i:09d}.json"]) == {
            "messages": [
                {"role": "user", "content": content},
                {"role": "assistant", "content": "No."},
            ],
            "images": ["img0.jpg"],
            "videos": ["vid0.mp4"],
        }
        assert members[f"r{i:09d}.vid0.mp4"] == clip and members[f"r{i:09d}.img0.jpg"] == image


def test_videos_missing_or_not_video_files_are_reported_with_id_and_path(tmp_path):
    source = tmp_path / "src"
    clip = _clip(source, "clips/ok.mp4")
    _clip(source, "clips/old.flv")  # an mp4 under another extension
    (source / "clips" / "lfs.mp4").write_text(
        "version https://git-lfs.github.com/spec/v1\noid sha256:" + "0" * 64 + "\nsize 5780\n"
    )
    (source / "frames" / "v_1").mkdir(parents=True)  # ShareGPTVideo's videos: frame folders
    for i in range(3):
        (source / "frames" / "v_1" / f"c01_{i:04d}.jpg").write_bytes(_jpeg(i))
    turns = [{"from": "human", "value": "<video>\nWhat?"}, {"from": "gpt", "value": "This."}]
    videos = ["clips/ok.mp4", "clips/missing.mp4", "clips/lfs.mp4", "clips/old.flv",
              "frames/v_1", "https://example.com/v.mp4"]  # fmt: skip
    records = [{"id": f"v{i}", "video": v, "conversations": turns} for i, v in enumerate(videos)]
    records += [
        {  # LLaVA-Video with two <image> for its one video
            "id": "twice",
            "video": "clips/ok.mp4",
            "conversations": [{"from": "human", "value": "<image> <image>\nWhat?"}, turns[1]],
        },
        {  # ShareGPT4Video's caption file: no conversation
            "video_id": "abc",
            "video_path": "abc.mp4",
            "captions": [{"idx": "-1", "content": "A dog runs."}],
            "zip_folder": "panda_videos_1.zip",
        },
    ]
    path = _jsonl(source / "videos.jsonl", records)
    result = convert(source=path, out=tmp_path / "out", prepare=False, min_converted=0)
    assert (result.converted, result.reported) == (
        1,
        {"missing_video": 1, "remote_media": 1, "unreadable_video": 3, "malformed_record": 2},
    )
    report = _lines(tmp_path / "out" / REPORT_FILE)
    assert [(r["file"], r["index"], r["reason"]) for r in report] == [
        ("videos.jsonl", 1, "missing_video"),
        ("videos.jsonl", 2, "unreadable_video"),
        ("videos.jsonl", 3, "unreadable_video"),
        ("videos.jsonl", 4, "unreadable_video"),
        ("videos.jsonl", 5, "remote_media"),
        ("videos.jsonl", 6, "malformed_record"),
        ("videos.jsonl", 7, "malformed_record"),
    ]
    details = [r["detail"] for r in report]
    assert details[0] == (
        f"video file 'clips/missing.mp4' (record id 'v1') not found at "
        f"{source / 'clips' / 'missing.mp4'}: put it there, or pass --media-root the folder the "
        "record's paths are relative to"
    )
    assert details[1].startswith("video file 'clips/lfs.mp4' (record id 'v2') is not a video")
    assert "Git LFS pointer" in details[1]
    assert details[2].startswith("video file 'clips/old.flv' (record id 'v3'): extension .flv")
    assert details[3].startswith("video file 'frames/v_1' (record id 'v4') is a folder (3 files)")
    assert details[4].startswith(
        "video https://example.com/v.mp4 (record id 'v5') is a URL: convert reads local files; "
        f"download it under {source}"
    )
    assert details[5] == (
        "2 <video> placeholder(s) for 1 video(s) (record id 'twice'); its <image> placeholders "
        "stand for its video (a LLaVA-Video record)"
    )
    assert details[6].startswith("a caption record (1 captions of video 'abc')")
    _, members = _written(result)
    assert members["r000000000.vid0.mp4"] == clip

    cli = CliRunner().invoke(
        main, ["convert", str(path), str(tmp_path / "cli"), "--strict", "--min-converted", "0"]
    )
    assert cli.exit_code == 1
    assert (
        "reported 7 (malformed_record 2, missing_video 1, remote_media 1, unreadable_video 3)"
        in cli.output
    )


def test_dataset_video_entries_keep_their_bytes_and_name_their_container(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    webm, mp4 = (CLIPS / WEBM).read_bytes(), (CLIPS / MP4).read_bytes()
    row = {
        "messages": [
            {"role": "user", "content": "<video>\nWhat moves?"},
            {"role": "assistant", "content": "A square."},
        ]
    }
    table = pa.Table.from_pylist(
        [
            {**row, "videos": [{"bytes": webm, "path": None}]},  # named by its container
            {**row, "videos": [{"bytes": mp4, "path": "clip.MOV"}]},  # by its path
        ]
    )
    pq.write_table(table, tmp_path / "rows.parquet")
    result = convert(source=tmp_path / "rows.parquet", out=tmp_path / "out", prepare=False)
    names, members = _written(result)
    assert names == [
        "r000000000.json",
        "r000000000.vid0.webm",
        "r000000001.json",
        "r000000001.vid0.mov",
    ]
    assert members["r000000000.vid0.webm"] == webm and members["r000000001.vid0.mov"] == mp4
    assert json.loads(members["r000000001.json"])["videos"] == ["vid0.mov"]


@pytest.mark.parametrize(
    ("kind", "missing", "unreadable"),
    [
        ("image", "missing_image", "unreadable_image"),
        ("video", "missing_video", "unreadable_video"),
        ("audio", "missing_audio", "audio_unreadable"),
    ],
)
def test_every_kind_of_media_entry_is_read_alike_with_its_own_reasons(
    tmp_path, kind, missing, unreadable
):
    """Images, videos and audio clips are read by one rule: a datasets dict, bytes, a
    ``data:`` URI, a ``file://`` path; a broken entry is reported under its own kind's reason
    (an audio ``data:`` URI that is not base64 once came out ``unreadable_image``)."""
    from energon_packing.errors import Skip
    from energon_packing.incoming.media import MediaLoader, _entry

    assert _entry({"bytes": b"x", "path": "a/b"}, kind, 7) == (b"x", "a/b")
    assert _entry(bytearray(b"xy"), kind, 7) == (b"xy", None)
    assert _entry("data:x/y;base64,eHk=", kind, 7) == (b"xy", None)
    assert _entry("file:///d/c.bin", kind, 7) == (None, "/d/c.bin")
    cases = [
        ({}, missing, "entry with neither bytes nor path (record id 7)"),
        ("data:x/y,plain", unreadable, "a data: URI that is not base64 (record id 7)"),
        ("data:x/y;base64,@@", unreadable, "a data: URI that does not decode"),
        (3, "malformed_record", f"{kind} given as int (record id 7)"),
    ]
    for source, reason, detail in cases:
        with pytest.raises(Skip) as info:
            _entry(source, kind, 7)
        assert (info.value.reason, detail in info.value.detail) == (reason, True), info.value
    # the reader itself, end to end: a missing file under its kind's reason
    with pytest.raises(Skip) as info:
        MediaLoader(tmp_path, decode=False)(f"nowhere.{kind}", kind, record_id=7)
    assert info.value.reason == missing
