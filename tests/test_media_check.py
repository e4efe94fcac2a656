"""Media faults before training (issue 31 item 4): ``convert`` and ``check`` decode every image
by default (``--no-decode`` for speed); ``check`` and ``stats`` write every skipped key with its
reason (``--skips FILE``)."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from helpers import make_dataset, raw_sample
from PIL import Image

from energon_packing.incoming.convert import convert
from energon_packing.tools.cli import main

TURNS = [{"from": "human", "value": "<image>\nWhat?"}, {"from": "gpt", "value": "This."}]


def jpeg(size=(64, 48)) -> bytes:
    pixels = np.random.default_rng(0).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()


GOOD = jpeg()
#: the faults of issue 31: a JPEG cut short, and a body that is no image behind JPEG magic
BROKEN = {
    "cut.jpg": GOOD[: len(GOOD) // 2],
    "garbage.jpg": GOOD[:4] + np.random.default_rng(1).bytes(4000),
}


def run(*args):
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert "Traceback" not in result.output, result.output
    return result


def test_convert_decodes_every_image_and_no_decode_copies_them(tmp_path):
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "good.jpg").write_bytes(GOOD)
    for name, data in BROKEN.items():
        (tmp_path / "images" / name).write_bytes(data)
    records = [{"id": "good", "image": "good.jpg", "conversations": TURNS}]
    records += [{"id": n, "image": n, "conversations": TURNS} for n in BROKEN]
    # the same broken JPEG as a data: URI (bytes in the record, not a file)
    cut = "data:image/jpeg;base64," + base64.b64encode(BROKEN["cut.jpg"]).decode()
    records.append({"id": "inline", "image": cut, "conversations": TURNS})
    source = tmp_path / "llava.json"
    source.write_text(json.dumps(records))

    result = convert(
        source=source, out=tmp_path / "out", media_root=tmp_path / "images", prepare=False,
        min_converted=0,
    )  # fmt: skip
    assert (result.converted, result.reported) == (1, {"corrupt_image": 3})
    report = [json.loads(line) for line in (tmp_path / "out" / "convert_report.jsonl").open()]
    assert [r["index"] for r in report] == [1, 2, 3]
    for row, name in zip(report, [*BROKEN, "the image bytes"], strict=True):
        assert name in row["detail"] and row["reason"] == "corrupt_image"
    assert "record id 'cut.jpg'" in report[0]["detail"] and "truncated" in report[0]["detail"]

    fast = convert(
        source=source,
        out=tmp_path / "fast",
        media_root=tmp_path / "images",
        prepare=False,
        min_converted=0,
        decode=False,
    )
    assert (fast.converted, fast.reported) == (4, {})  # what the loader alone would find


def test_decoding_in_threads_writes_the_same_bytes_as_decoding_in_line(tmp_path):
    """``workers``: images are decoded in threads ahead of the writer, and every shard, the
    report and the map are byte for byte those of one thread; a record with several images, one
    broken, is reported once, in its place."""
    images = tmp_path / "images"
    images.mkdir()
    two = [
        {"from": "human", "value": "<image><image>\nTwo?"},
        {"from": "gpt", "value": "Two."},
    ]
    records = []
    for i in range(40):
        name = f"{i:02d}.jpg"
        broken = list(BROKEN.values())[i % 2] if i % 7 == 3 else None
        (images / name).write_bytes(broken or jpeg((32 + i, 24)))
        if i % 5 == 0:
            records.append({"id": i, "image": [name, "good.jpg"], "conversations": two})
        else:
            records.append({"id": i, "image": name, "conversations": TURNS})
    records.insert(11, {"id": "text", "conversations": [TURNS[0] | {"value": "hi"}, TURNS[1]]})
    (images / "good.jpg").write_bytes(GOOD)
    source = tmp_path / "llava.json"
    source.write_text(json.dumps(records))
    outs = {}
    for workers in (1, 3):
        out = tmp_path / f"out{workers}"
        result = convert(
            source=source, out=out, media_root=images, prepare=False, workers=workers,
            samples_per_shard=8,
        )  # fmt: skip
        outs[workers] = {
            p.relative_to(out): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()
        }
        assert result.reported == {"corrupt_image": 6} and result.converted == 35
    assert outs[1] == outs[3] and len(outs[1]) == 7  # 5 shards, the report and the map
    with pytest.raises(ValueError, match="workers=0 must be >= 1"):
        convert(source=source, out=tmp_path / "none", workers=0)


@pytest.mark.parametrize(
    "name",
    ["r000000001.json", "r000000001.img0.jpg", "a" * 100, "a" * 101, "é图片 (1).png",
     "x/" + "b" * 120, "k.\udcff.png", "a" * 99 + "é"],
)  # fmt: skip
@pytest.mark.parametrize("size", [0, 1, 511, 512, 40_273, 8**11 - 1, 8**11, 2**40])
def test_the_tar_header_is_tarfiles_byte_for_byte(name, size):
    import tarfile

    from energon_packing.incoming.tar_writer import ustar_header

    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = size, 0, 0o644
    try:
        expected = info.tobuf(tarfile.USTAR_FORMAT, "utf-8", "surrogateescape")
    except ValueError as e:  # a name USTAR cannot hold: the same refusal
        with pytest.raises(ValueError, match=str(e)):
            ustar_header(name, size)
        return
    assert ustar_header(name, size) == expected


@pytest.fixture(scope="module")
def faulty(tmp_path_factory):
    """Shards with a good image, a cut one, an unlisted cut part, and a broken document."""

    def doc(*images):
        return {"messages": [{"role": "user", "content": "<image>" * len(images) + "What?"},
                             {"role": "assistant", "content": "This."}], "images": list(images)}  # fmt: skip

    samples = [
        raw_sample("good", doc("a.jpg"), {"a.jpg": GOOD}),
        raw_sample("cut", doc("a.jpg"), {"a.jpg": BROKEN["cut.jpg"]}),
        # a part no document lists is never decoded by the loader: not a finding
        raw_sample("extra", doc("a.jpg"), {"a.jpg": GOOD, "notes.bin": b"\xff\xd8\xff junk"}),
        raw_sample("broken", "{not json"),
    ]
    return make_dataset(tmp_path_factory.mktemp("faulty"), [], raw=samples)


def test_check_decodes_listed_images_and_writes_every_skip(faulty, tmp_path):
    skips = tmp_path / "skips.jsonl"
    result = run("check", faulty, "--skips", skips)
    assert result.exit_code == 1, result.output
    assert "3 image parts" in result.output and "1 unreadable" in result.output
    assert "  cut  corrupt_image: image does not decode" in result.output
    rows = [json.loads(line) for line in skips.open()]
    assert [(r["key"], r["reason"]) for r in rows] == [("cut", "corrupt_image")]
    assert rows[0]["member"] == "cut.a.jpg" and rows[0]["shard"].endswith(".tar")

    fast = run("check", faulty, "--no-decode")
    assert fast.exit_code == 0, fast.output
    assert "image parts" not in fast.output


@pytest.mark.energon
def test_stats_writes_every_skipped_key_with_its_reason(faulty, tmp_path):
    skips = tmp_path / "skips.jsonl"
    result = run("stats", faulty, "--capacity", 512, "--buffer", 4, "--skips", skips)
    assert result.exit_code == 0, result.output
    rows = sorted((r["key"], r["reason"]) for r in map(json.loads, skips.open()))
    # stats reads headers, never pixels: the cut image is the loader's to find
    assert rows == [("broken", "malformed_json")]
    assert f"1 skipped key(s) with their reasons in {skips}" in result.output


def test_check_reads_every_audio_part_as_the_loader_will(tmp_path):
    """Every audio part's length is read (``media.audio.length``): a clip that is no
    audio container, and one with no audio stream, are listed under the loader's reasons;
    ``--no-audio`` leaves them unread."""
    pytest.importorskip("av")
    from energon_packing.testing.audio import clip

    def doc(name):
        return json.dumps(
            {
                "messages": [
                    {"role": "user", "content": [{"type": "audio", "audio": name}]},
                    {"role": "assistant", "content": "Heard."},
                ],
                "audios": [name],
            }
        )

    # an MP4 with a video stream only
    silent_video = (Path(__file__).parent / "data/video/h264_48x36_10fps_2s.mp4").read_bytes()
    samples = [
        raw_sample("good", doc("a.flac"), {"a.flac": clip("flac", seconds=0.3)}),
        raw_sample("lossy", doc("a.opus"), {"a.opus": clip("opus", seconds=0.3)}),
        raw_sample("noise", doc("a.wav"), {"a.wav": b"RIFF\0\0\0\0WAVE not a clip"}),
        raw_sample("mute", doc("a.m4a"), {"a.m4a": silent_video}),
    ]
    root = make_dataset(tmp_path / "ds", [], raw=samples)
    skips = tmp_path / "skips.jsonl"
    result = run("check", root, "--skips", skips)
    assert result.exit_code == 1, result.output
    assert "4 audio parts" in result.output and "2 unreadable" in result.output
    rows = sorted((r["key"], r["reason"]) for r in map(json.loads, skips.open()))
    assert rows == [("mute", "audio_no_stream"), ("noise", "audio_unreadable")]

    unread = run("check", root, "--no-audio")
    assert unread.exit_code == 0, unread.output
    assert "audio parts" not in unread.output


def test_check_reads_every_videos_own_track_for_a_track_run(tmp_path):
    """``--video-tracks`` reads each video's own audio track as a run with
    ``audio_config['load_audio_from_video']`` will: a silent video is listed under
    ``audio_no_stream`` naming the switch, a video with sound passes; without it the silent
    video reads (its frames are fine); with ``--no-videos`` it is refused, naming why."""
    pytest.importorskip("av")
    from energon_packing.testing.audio import clip
    from energon_packing.testing.clips import with_sound

    def doc():
        return json.dumps(
            {
                "messages": [
                    {"role": "user", "content": [{"type": "video", "video": "v.mp4"}]},
                    {"role": "assistant", "content": "Seen and heard."},
                ],
                "videos": ["v.mp4"],
            }
        )

    silent = (Path(__file__).parent / "data/video/h264_48x36_10fps_2s.mp4").read_bytes()
    samples = [
        raw_sample("loud", doc(), {"v.mp4": with_sound(silent, clip("m4a", seconds=1.0))}),
        raw_sample("silent", doc(), {"v.mp4": silent}),
    ]
    root = make_dataset(tmp_path / "ds", [], raw=samples)
    assert run("check", root).exit_code == 0
    skips = tmp_path / "skips.jsonl"
    result = run("check", root, "--video-tracks", "--skips", skips)
    assert result.exit_code == 1, result.output
    assert "2 video parts" in result.output and "1 unreadable" in result.output
    (row,) = map(json.loads, skips.open())
    assert (row["key"], row["reason"]) == ("silent", "audio_no_stream")
    assert "the video's own audio track" in row["detail"]
    assert "load_audio_from_video" in row["detail"]
    refused = run("check", root, "--video-tracks", "--no-videos")
    assert refused.exit_code == 2 and "drop --no-videos" in refused.output
