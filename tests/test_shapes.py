"""Every public record shape (issue 31), written by its own writer (JSON, JSONL, parquet
through ``datasets``, ``save_to_disk``), converted: each record lands once with each medium in
its turn, or is reported with its exact reason; the converted folder goes through the real
Energon loader once, every converted record in exactly one pack."""

from __future__ import annotations

import io
import json
import shutil
import tarfile
from pathlib import Path

import pytest
from helpers import loader_batches

from energon_packing import PackingTaskEncoder
from energon_packing.incoming.convert import MAP_FILE, REPORT_FILE, ConvertError, convert
from energon_packing.testing.audio import clip as audio_clip

CLIP = Path(__file__).parent / "data" / "video" / "h264_48x36_10fps_2s.mp4"


def _png(seed: int) -> bytes:
    """A small image of its own colour: its bytes name the record and position it is for."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (32 + seed % 7, 28), (seed * 37 % 256, seed * 91 % 256, 200)).save(
        buffer, "PNG"
    )
    return buffer.getvalue()


def _jsonl(path: Path, records: list) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _documents(result) -> dict[tuple[str, int], tuple[dict, dict[str, bytes]]]:
    """``(file, index)`` of each converted record -> its document and its media parts."""
    members: dict[str, bytes] = {}
    for shard in result.shards:
        with tarfile.open(shard) as tar:
            members.update({m.name: tar.extractfile(m).read() for m in tar})
    out = {}
    for entry in _lines(result.out / MAP_FILE):
        key = entry["key"]
        document = json.loads(members[f"{key}.json"])
        parts = {n[len(key) + 1 :]: b for n, b in members.items() if n.startswith(f"{key}.")}
        out[entry["file"], entry["index"]] = (document, parts)
    return out


def _placed(document: dict, parts: dict[str, bytes]) -> list[tuple[int, str, bytes]]:
    """Each medium of a document as ``(message index, role, bytes)``, in order."""
    placed = []
    for m, message in enumerate(document["messages"]):
        content = message["content"]
        for part in content if isinstance(content, list) else ():
            if part["type"] in ("image", "video", "audio"):
                placed.append((m, message["role"], parts[part[part["type"]]]))
    return placed


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """One folder, one file per public shape, and what each record must become: the media
    ``(message index, role, bytes)`` of a converted record, or its report reason."""
    pytest.importorskip("datasets")
    import datasets

    root = tmp_path_factory.mktemp("shapes")
    (root / "img").mkdir()
    png = {i: _png(i) for i in range(40)}
    for i, data in png.items():
        (root / "img" / f"{i}.png").write_bytes(data)
    shutil.copyfile(CLIP, root / "clip.mp4")
    clip = CLIP.read_bytes()
    speech = {
        suffix: audio_clip(suffix, seconds=0.5, seed=i) for i, suffix in enumerate(("wav", "m4a"))
    }
    (root / "speech.wav").write_bytes(speech["wav"])
    (root / "voice.bin").write_bytes(speech["m4a"])  # named wrong: read by its signature
    (root / "noise.wav").write_bytes(b"RIFF\x00\x00\x00\x00WAVEnot a clip")
    expected: dict[tuple[str, int], object] = {}

    # Mantis-Instruct: parquet, `conversation` of role/content beside `images` entries
    mantis = datasets.Dataset.from_dict(
        {
            "id": ["m0", "m1"],
            "images": [
                [{"bytes": png[0], "path": "0.png"}, {"bytes": png[1], "path": "1.png"}],
                [{"bytes": png[2], "path": None}],
            ],
            "conversation": [
                [
                    {"role": "user", "content": "<image> <image> Which is darker?"},
                    {"role": "assistant", "content": "The first."},
                    {"role": "user", "content": "Sure?"},
                    {"role": "assistant", "content": "Yes."},
                ],
                [
                    {"role": "user", "content": "Describe it."},
                    {"role": "assistant", "content": "A square."},
                ],
            ],
        }
    ).cast_column("images", datasets.Sequence(datasets.Image()))
    mantis.to_parquet(str(root / "mantis.parquet"))
    expected["mantis.parquet", 0] = [(0, "user", png[0]), (0, "user", png[1])]
    expected["mantis.parquet", 1] = [(0, "user", png[2])]

    # ms-swift: messages + images / videos / audios, grounding, URLs, pairs and `conversation`
    _jsonl(
        root / "swift.jsonl",
        [
            {
                "messages": [
                    {"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "Hi"},
                    {"role": "assistant", "content": "Hello."},
                    {"role": "user", "content": "<image>What is it?"},
                    {"role": "assistant", "content": "A shape."},
                ],
                "images": ["img/3.png"],
            },
            {
                "messages": [
                    {"role": "user", "content": "<video>What moves?"},
                    {"role": "assistant", "content": "A square."},
                ],
                "videos": ["clip.mp4"],
            },
            {
                "messages": [
                    {"role": "user", "content": "<audio>What is said?"},
                    {"role": "assistant", "content": "Hello."},
                ],
                "audios": ["speech.wav"],
            },
            {
                "messages": [
                    {"role": "user", "content": [{"type": "audio", "audio": "voice.bin"}]},
                    {"role": "assistant", "content": "Hi."},
                    {"role": "user", "content": "And this?"},
                    {"role": "assistant", "content": "Noise."},
                ],
            },
            {
                "messages": [
                    {"role": "user", "content": "<image>What do you see and hear?"},
                    {"role": "assistant", "content": "A shape and a voice."},
                ],
                "images": ["img/6.png"],
                "audios": ["speech.wav"],
            },
            {
                "messages": [
                    {"role": "user", "content": "<audio>What is this?"},
                    {"role": "assistant", "content": "Static."},
                ],
                "audios": ["noise.wav"],
            },
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "input_audio",
                                "input_audio": {"data": "AAAA", "format": "wav"},
                            },
                            {"type": "text", "text": "Said?"},
                        ],
                    },
                    {"role": "assistant", "content": "Hi."},
                ],
            },
            {
                "messages": [
                    {"role": "user", "content": "<image>Find <ref-object>"},
                    {"role": "assistant", "content": "<bbox>"},
                ],
                "images": ["img/4.png"],
                "objects": {"ref": ["cat"], "bbox": [[1, 2, 3, 4]]},
            },
            {
                "messages": [
                    {"role": "user", "content": "<image>What is it?"},
                    {"role": "assistant", "content": "A cat."},
                ],
                "images": ["https://example.com/cat.png"],
            },
            {
                "system": "Be brief.",
                "query": "<image>And this one?",
                "response": "Blue.",
                "history": [["What colour is the sky?", "Blue."]],
                "images": ["img/5.png"],
            },
            {"messages": [], "images": []},
        ],
    )
    expected["swift.jsonl", 0] = [(3, "user", png[3])]
    expected["swift.jsonl", 1] = [(0, "user", clip)]
    expected["swift.jsonl", 2] = [(0, "user", speech["wav"])]
    expected["swift.jsonl", 3] = [(0, "user", speech["m4a"])]
    # no <audio> tag: the clip leads the first user turn, before the placed image
    expected["swift.jsonl", 4] = [(0, "user", speech["wav"]), (0, "user", png[6])]
    expected["swift.jsonl", 5] = "audio_unreadable"
    expected["swift.jsonl", 6] = "unsupported_media"
    expected["swift.jsonl", 7] = "unsupported_field"
    expected["swift.jsonl", 8] = "remote_media"
    expected["swift.jsonl", 9] = [(3, "user", png[5])]  # system, history pair, then the query
    expected["swift.jsonl", 10] = "empty_conversation"
    (root / "swift_conversation.json").write_text(
        json.dumps(
            [
                {
                    "system": "You are kind.",
                    "conversation": [
                        {"human": "<image>What is it?", "assistant": "A square."},
                        {"human": "And the colour?", "assistant": "Red."},
                    ],
                    "images": ["img/6.png"],
                }
            ]
        )
    )
    expected["swift_conversation.json", 0] = [(1, "user", png[6])]

    # InternVL: `image` a path or a list, from/value with <image>, a video, text only
    _jsonl(
        root / "internvl.jsonl",
        [
            {
                "id": 0,
                "image": "img/7.png",
                "width": 33,
                "height": 28,
                "conversations": [
                    {"from": "human", "value": "<image>\nWhat is it?"},
                    {"from": "gpt", "value": "A <ref>square</ref><box>[[1, 2, 3, 4]]</box>."},
                ],
            },
            {
                "id": 1,
                "image": ["img/8.png", "img/9.png"],
                "conversations": [
                    {"from": "human", "value": "Image-1: <image>\nImage-2: <image>\nSame?"},
                    {"from": "gpt", "value": "No."},
                    {"from": "human", "value": "Why?"},
                    {"from": "gpt", "value": "Colours."},
                ],
            },
            {
                "id": 2,
                "video": "clip.mp4",
                "conversations": [
                    {"from": "human", "value": "<video>\nWhat happens?"},
                    {"from": "gpt", "value": "It moves."},
                ],
            },
            {
                "id": 3,
                "conversations": [
                    {"from": "human", "value": "How do I loop a <video> element in HTML?"},
                    {"from": "gpt", "value": "Add the loop attribute: <video loop>."},
                ],
            },
            {"id": 4, "image": "img/10.png", "conversations": []},
        ],
    )
    expected["internvl.jsonl", 0] = [(0, "user", png[7])]
    expected["internvl.jsonl", 1] = [(0, "user", png[8]), (0, "user", png[9])]
    expected["internvl.jsonl", 2] = [(0, "user", clip)]
    expected["internvl.jsonl", 3] = []
    expected["internvl.jsonl", 4] = "empty_conversation"

    # qwen-vl-utils: content parts naming their file (file:// or relative), a URL
    _jsonl(
        root / "qwen.jsonl",
        [
            {
                "messages": [
                    {"role": "user", "content": [{"type": "text", "text": "Compare."}]},
                    {"role": "assistant", "content": [{"type": "text", "text": "Which?"}]},
                    {
                        "role": "user",
                        "content": [
                            {"type": "image", "image": f"file://{root / 'img' / '11.png'}"},
                            {"type": "image", "image": "img/12.png", "max_pixels": 50176},
                            {"type": "text", "text": "These two."},
                        ],
                    },
                    {"role": "assistant", "content": "The first is darker."},
                ]
            },
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "video", "video": "clip.mp4", "fps": 1.0},
                            {"type": "text", "text": "What happens?"},
                        ],
                    },
                    {"role": "assistant", "content": "It moves."},
                ]
            },
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "image", "image": "http://example.com/a.jpg"},
                            {"type": "text", "text": "?"},
                        ],
                    },
                    {"role": "assistant", "content": "A."},
                ]
            },
        ],
    )
    expected["qwen.jsonl", 0] = [(2, "user", png[11]), (2, "user", png[12])]
    expected["qwen.jsonl", 1] = [(0, "user", clip)]
    expected["qwen.jsonl", 2] = "remote_media"

    # TRL: indexed image parts, `images` listed in another order; a save_to_disk dataset
    trl = datasets.Dataset.from_dict(
        {
            "messages": [
                [
                    {
                        "role": "user",
                        "content": [
                            {"type": "image", "index": 1, "text": None},
                            {"type": "text", "index": None, "text": "then"},
                            {"type": "image", "index": 0, "text": None},
                        ],
                    },
                    {
                        "role": "assistant",
                        "content": [{"type": "text", "index": None, "text": "Two."}],
                    },
                ]
            ],
            "images": [[{"bytes": png[13], "path": None}, {"bytes": png[14], "path": None}]],
        }
    ).cast_column("images", datasets.Sequence(datasets.Image()))
    trl.save_to_disk(str(root / "trl"))
    expected["trl", 0] = [(0, "user", png[14]), (0, "user", png[13])]
    return root, expected


def _check(result, expected: dict, *, prefix: str = "") -> None:
    documents = _documents(result)
    report = {(r["file"], r["index"]): r for r in _lines(result.out / REPORT_FILE)}
    assert not set(documents) & set(report)  # once: converted or reported, never both
    assert set(documents) | set(report) == {(prefix + f, i) for f, i in expected}
    for (file, index), want in expected.items():
        where = (prefix + file, index)
        if isinstance(want, str):
            assert report[where]["reason"] == want, report[where]
        else:
            assert where in documents, report.get(where)
            assert _placed(*documents[where]) == want, where


def test_every_public_shape_is_converted_with_its_media_in_its_turn_or_reported(corpus, tmp_path):
    root, expected = corpus
    source = tmp_path / "src"
    shutil.copytree(root, source)
    result = convert(source=source, out=tmp_path / "out")
    _check(result, expected)
    assert result.read == len(expected)
    reported = {
        r["index"]: r for r in _lines(result.out / REPORT_FILE) if r["file"] == "swift.jsonl"
    }
    assert reported[5]["keys"] == ["messages", "audios"]  # the keys the row has
    assert "audio file 'noise.wav'" in reported[5]["detail"]
    assert "input_audio" in reported[6]["detail"]
    assert reported[8]["detail"].startswith("image https://example.com/cat.png is a URL")
    assert "'objects' and <bbox>, <ref-object>" in reported[7]["detail"]
    documents = _documents(result)
    html = documents["internvl.jsonl", 3][0]
    assert html == {
        "messages": [
            {"role": "user", "content": "How do I loop a <video> element in HTML?"},
            {"role": "assistant", "content": "Add the loop attribute: <video loop>."},
        ]
    }
    swift = documents["swift.jsonl", 9][0]["messages"]
    assert [m["role"] for m in swift] == ["system", "user", "assistant", "user", "assistant"]
    # the real loader: every converted record in exactly one pack; the built-in layout takes
    # no audio, so exactly the records with clips are skipped, under unsupported_audio
    te = PackingTaskEncoder(tokenizer="bundled", max_input_seq_length=4096)
    keys, skipped = [], []
    for batch in loader_batches(result.out, te, buffer=32):
        keys += [k for pack in batch["source_ids"] for k in pack]
        skipped += batch.get("packing_skipped", [])
    keys_of = {(m["file"], m["index"]): m["key"] for m in _lines(result.out / MAP_FILE)}
    with_audio = {keys_of[w] for w, (d, _) in documents.items() if d.get("audios")}
    assert len(with_audio) == 3
    assert sorted(map(tuple, skipped)) == sorted((k, "unsupported_audio") for k in with_audio)
    assert sorted(keys) == sorted(set(keys_of.values()) - with_audio)


@pytest.mark.parametrize(
    ("fmt", "file"),
    [("swift", "swift.jsonl"), ("messages", "mantis.parquet"), ("llava", "internvl.jsonl")],
)
def test_an_explicit_format_reads_its_shapes_as_auto_does(corpus, tmp_path, fmt, file):
    root, expected = corpus
    result = convert(
        source=root / file, out=tmp_path / "out", format=fmt, prepare=False, min_converted=0
    )
    _check(result, {key: want for key, want in expected.items() if key[0] == file})


def test_llama_factory_sharegpt_under_its_own_name_and_from_its_dataset_info(tmp_path):
    """``mllm_demo.json`` as LLaMA-Factory ships it (role/content ``messages``), read under
    ``--format sharegpt``; a dataset with other column and tag names read through its
    ``dataset_info.json`` entry, and an alpaca one."""
    data = tmp_path / "data"
    (data / "mllm_demo_data").mkdir(parents=True)
    (data / "mllm_demo_data" / "1.png").write_bytes(_png(20))
    demo = [
        {
            "messages": [
                {"role": "user", "content": "<image>Who are they?"},
                {"role": "assistant", "content": "Players."},
                {"role": "user", "content": "What are they doing?"},
                {"role": "assistant", "content": "Celebrating."},
            ],
            "images": ["mllm_demo_data/1.png"],
        }
    ]
    (data / "mllm_demo.json").write_text(json.dumps(demo, indent=2))
    result = convert(source=data / "mllm_demo.json", out=tmp_path / "demo", format="sharegpt")
    _check(result, {("mllm_demo.json", 0): [(0, "user", _png(20))]})

    (data / "custom.json").write_text(
        json.dumps(
            [
                {
                    "dialog": [
                        {"speaker": "person", "text": "<image>Colour?"},
                        {"speaker": "bot", "text": "Teal."},
                    ],
                    "pics": ["mllm_demo_data/1.png"],
                }
            ]
        )
    )
    (data / "alpaca.jsonl").write_text(
        json.dumps({"q": "Describe", "extra": "<image>briefly", "a": "A square.", "img": []}) + "\n"
    )
    info = {
        "mllm_demo": {
            "file_name": "mllm_demo.json",
            "formatting": "sharegpt",
            "columns": {"messages": "messages", "images": "images"},
            "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user",
                     "assistant_tag": "assistant"},
        },
        "custom": {
            "file_name": "custom.json",
            "formatting": "sharegpt",
            "columns": {"messages": "dialog", "images": "pics"},
            "tags": {"role_tag": "speaker", "content_tag": "text", "user_tag": "person",
                     "assistant_tag": "bot"},
        },
        "plain": {
            "file_name": "alpaca.jsonl",
            "columns": {"prompt": "q", "query": "extra", "response": "a", "images": "img"},
        },
        "hub": {"hf_hub_url": "someone/some_dataset"},
    }  # fmt: skip
    (data / "dataset_info.json").write_text(json.dumps(info))
    for name in ("mllm_demo", "custom"):
        result = convert(
            source=data, out=tmp_path / name, dataset_info=data / "dataset_info.json", dataset=name
        )
        _check(result, {(f"{name}.json", 0): [(0, "user", _png(20))]})
    with pytest.raises(ConvertError, match="placeholder"):  # alpaca: its <image> lists none
        convert(source=data, out=tmp_path / "a", dataset_info=data / "dataset_info.json",
                dataset="plain")  # fmt: skip
    document = _documents(
        convert(
            source=data,
            out=tmp_path / "b",
            dataset_info=data / "dataset_info.json",
            dataset="plain",
            columns="input=a,output=q",  # --columns adds to (and overrides) the entry's
            prepare=False,
        )
    )["alpaca.jsonl", 0][0]
    assert document == {
        "messages": [
            {"role": "user", "content": "Describe\nA square."},
            {"role": "assistant", "content": "Describe"},
        ]
    }
    with pytest.raises(ValueError, match="'hub' names no file_name .*someone/some_dataset"):
        convert(source=data, out=tmp_path / "c", dataset_info=data / "dataset_info.json",
                dataset="hub")  # fmt: skip


def test_columns_map_a_records_keys(tmp_path):
    (tmp_path / "a.png").write_bytes(_png(21))
    records = [
        {"conv": [{"role": "user", "content": "<image>Hm?"}, {"role": "assistant", "content": "A."}],
         "imgs": ["a.png"]},
    ]  # fmt: skip
    path = _jsonl(tmp_path / "r.jsonl", records)
    for i, columns in enumerate(
        ["messages=conv,images=imgs", '{"conv": "messages", "imgs": "images"}',
         {"messages": "conv", "images": "imgs"}]
    ):  # fmt: skip
        result = convert(source=path, out=tmp_path / f"o{i}", columns=columns, prepare=False)
        _check(result, {("r.jsonl", 0): [(0, "user", _png(21))]})
    with pytest.raises(ValueError, match=r"names 'conv'.*did you mean messages=conv"):
        convert(source=path, out=tmp_path / "bad", columns="conv=messages")


@pytest.mark.parametrize(
    ("document", "reason"),
    [
        ({"messages": [{"role": "user", "content": "<audio>Said?"},
                       {"role": "assistant", "content": "Hi."}], "audios": ["a.wav"]},
         "missing_audio"),
        ({"messages": [{"role": "user", "content": [{"type": "audio", "audio": "a.wav"}]},
                       {"role": "assistant", "content": "Hi."}]}, "missing_audio"),
        ({"messages": [{"role": "user", "content": "Find <ref-object>"},
                       {"role": "assistant", "content": "<bbox>"}],
          "objects": {"ref": ["cat"], "bbox": [[1, 2, 3, 4]]}}, "unsupported_field"),
        ({"messages": [{"role": "user", "content": "Does <audio> autoplay?"},
                       {"role": "assistant", "content": "Not on mobile."}]}, None),
    ],
)  # fmt: skip
def test_the_loader_skips_a_document_with_audio_or_grounding_never_packs_its_text(document, reason):
    """A document written into shards by hand (not by convert) with what we do not pack is
    skipped under its reason (audio without its part: ``missing_audio``; with it, on a layout
    that takes no audio: ``unsupported_audio``, tests/test_audio.py); ``<audio>`` in a
    document that lists no audio is text."""
    from helpers import conversation_sample
    from megatron.energon import SkipSample

    te = PackingTaskEncoder(tokenizer="bundled", max_input_seq_length=1024)
    sample = conversation_sample("k", document)
    if reason is None:
        encoded = te.encode_sample(sample)
        assert "<audio>" in te.tokenizer.decode(encoded.input_ids.tolist())
        return
    with pytest.raises(SkipSample):
        te.encode_sample(sample)
    assert list(te.stats.skipped_keys) == [reason]
