"""The energon-packing CLI, through click's CliRunner; its numbers against the library's."""

from __future__ import annotations

import itertools
import json
import re
import tarfile

import pytest
from click.testing import CliRunner
from helpers import SAMPLE_DATA, loader_batches

from energon_packing import PackingTaskEncoder
from energon_packing.incoming.prepare import YAMLS
from energon_packing.packing.algorithms import lower_bound
from energon_packing.testing.synth import conversations, write_shards
from energon_packing.tools.cli import main
from energon_packing.tools.picture import describe, pack_segments
from energon_packing.tools.report import format_table, measure_costs, packing_table

VIDEO_DATA = SAMPLE_DATA / "video"


def invoke(*args):
    result = CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def test_help_lists_every_command():
    output = invoke("--help")
    for command in ("demo", "stats", "preview", "bench", "check", "prepare"):
        assert command in output


@pytest.mark.parametrize("bundled", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_demo_reports_the_librarys_numbers(tmp_path, synth_dataset, bundled):
    """The demo's numbers are the library's: on 120 generated conversations by default, on the
    bundled sample data (what ``energon-packing demo`` runs) in -m slow."""
    picture = tmp_path / "demo.png"
    data = SAMPLE_DATA if bundled else synth_dataset
    output = invoke("demo", "--picture", picture, *(() if bundled else ("--data", data)))
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    knobs = dict(max_input_seq_length=2048, tokenizer="bundled", pad_multiple=8, carry=True)
    te = PackingTaskEncoder(**knobs)
    batches = list(loader_batches(data, te, buffer=64))
    measured = measure_costs(data, PackingTaskEncoder(**knobs), progress=False)
    bound = lower_bound(measured.costs, 2048)
    assert (
        f"{te.stats.read} conversations read, {te.stats.packed} packed into {len(batches)} packs"
        in output
    )
    assert (
        f"lower bound {bound} packs, so {100 * (len(batches) / bound - 1):+.2f} % over it" in output
    )
    assert f"efficiency {100 * te.stats.efficiency:.1f} % real tokens" in output
    for reason, count in te.stats.skipped.items():
        assert f"{reason}: {count}" in output
    assert format_table(packing_table(measured, buffers=(64, 256))) in output
    assert re.search(
        r"^loader packs\s+" + str(len(batches)) + r"\s+" + f"{len(batches) * 2048:,}", output, re.M
    )
    assert "trainer packs (batch 16, modified_first_fit_decreasing)" in output
    # the bundled conversations with videos follow the default run only (not --data)
    assert (f"\nVideos: {VIDEO_DATA}\n" in output) == bundled


def test_stats_table_equals_the_library(synth_dataset):
    output = invoke(
        "stats",
        synth_dataset,
        "--capacity",
        2048,
        "--buffer",
        16,
        "--buffer",
        64,
        "--algorithm",
        "subset_fill",
        "--algorithm",
        "first_fit_decreasing",
    )
    measured = measure_costs(
        synth_dataset,
        PackingTaskEncoder(tokenizer="bundled", max_input_seq_length=2048, pad_multiple=8),
        progress=False,
    )
    rows = packing_table(
        measured, algorithms=("subset_fill", "first_fit_decreasing"), buffers=(16, 64)
    )
    assert format_table(rows) in output
    assert f"{len(measured.costs)} conversations" in output
    assert "recommended: algorithm='subset_fill', carry=True" in output


def test_preview_prints_the_packs_it_draws(synth_dataset, tmp_path):
    picture = tmp_path / "preview.png"
    output = invoke(
        "preview", synth_dataset, "--capacity", 2048, "--packs", 3, "--picture", picture
    )
    te = PackingTaskEncoder(
        tokenizer="bundled", max_input_seq_length=2048, pad_multiple=8, carry=True
    )
    batches = list(itertools.islice(loader_batches(synth_dataset, te, buffer=64), 3))
    expected = describe(
        [pack_segments(b, 0, image_pad_id=te.tokenizer.special.image_pad) for b in batches]
    )
    assert expected in output
    assert expected.count("pack ") == 3 and "image" in expected
    assert picture.exists()


@pytest.mark.slow  # the command end to end; tests/test_bench.py holds its numbers by default
def test_bench_losses_agree_between_loader_and_trainer_packs(tmp_path):
    picture = tmp_path / "bench.png"
    output = invoke("bench", "--steps", 3, "--hidden", 32, "--picture", picture)
    rows = {}
    for line in output.splitlines():
        match = re.match(
            r"^(loader packs|trainer packs|padded batches)\s+([\d,]+)\s+([\d,]+)\s+([\d.]+)%"
            r"\s+([\d,]+)\s+([\d.]+)\s+([\d.e+-]+)$",
            line,
        )
        if match:
            rows[match.group(1)] = match.groups()[1:]
    assert set(rows) == {"loader packs", "trainer packs", "padded batches"}
    real = {name: int(v[0].replace(",", "")) for name, v in rows.items()}
    assert len(set(real.values())) == 1, "every path trains on the same conversations"
    assert int(rows["loader packs"][1].replace(",", "")) == 3 * 2048
    assert int(rows["padded batches"][1].replace(",", "")) > int(
        rows["trainer packs"][1].replace(",", "")
    )
    for name in ("trainer packs", "padded batches"):
        assert float(rows[name][5]) < 1e-4, f"{name} loss drifts from the loader path"
    assert picture.exists()


def test_prepare_writes_the_yamls(tmp_path):
    write_shards(tmp_path / "shards", conversations(12, seed=1), per_shard=6)
    output = invoke("prepare", tmp_path, "--split-parts", "train:shards/.*")
    for name, text in YAMLS.items():
        assert (tmp_path / ".nv-meta" / name).read_text() == text
        assert f"wrote {tmp_path / '.nv-meta' / name}" in output


def test_demo_without_data_says_what_to_pass(monkeypatch):
    import energon_packing.tools.cli as cli

    result = CliRunner().invoke(cli.main, ["demo", "--data", "/nonexistent"])
    assert result.exit_code != 0 and "does not exist" in result.output


@pytest.mark.parametrize("command", ["stats", "preview"])
def test_commands_reject_a_missing_path(command):
    result = CliRunner().invoke(main, [command, "/no/such/dataset"])
    assert result.exit_code == 2 and "does not exist" in result.output


@pytest.fixture(scope="module")
def processor_dir(tmp_path_factory):
    """A Gemma 3 processor saved to a local directory, as a user's would be (beside the
    model's config.json)."""
    pytest.importorskip("transformers")
    from energon_packing.testing.families import build

    path = tmp_path_factory.mktemp("processor")
    processor, model, _ = build("gemma3")
    processor.save_pretrained(path)
    model.config.save_pretrained(path)
    return path


@pytest.mark.slow
def test_a_processor_dir_without_its_model_config_needs_model_type(tmp_path, synth_dataset):
    from energon_packing.testing.families import build

    build("gemma3", model=False)[0].save_pretrained(tmp_path)
    args = ["stats", str(synth_dataset), "--capacity", "2048", "--processor", str(tmp_path)]
    refused = CliRunner().invoke(main, args)
    assert refused.exit_code == 2, refused.output
    assert "Gemma3Processor serves several models" in refused.output
    assert "--model-type" in refused.output
    out = invoke(
        "stats",
        synth_dataset,
        "--capacity",
        2048,
        "--processor",
        tmp_path,
        "--model-type",
        "gemma3",
    )
    assert "packs" in out


@pytest.mark.slow  # each command through a processor dir: also tests/test_processor_loading.py
def test_the_tool_runs_any_family_through_its_processor_dir(processor_dir, synth_dataset, tmp_path):
    output = invoke("demo", "--processor", processor_dir, "--picture", tmp_path / "demo.png")
    te = PackingTaskEncoder(
        max_input_seq_length=2048, processor=str(processor_dir), pad_multiple=8, carry=True
    )
    batches = list(loader_batches(SAMPLE_DATA, te, buffer=64))
    assert "through ProcessorChat(Gemma3Processor, family=gemma3)" in output
    assert (
        f"{te.stats.read} conversations read, {te.stats.packed} packed into {len(batches)}"
        in output
    )
    stats = invoke(
        "stats", synth_dataset, "--capacity", 2048, "--processor", processor_dir, "--buffer", 64
    )
    measured = measure_costs(
        synth_dataset,
        PackingTaskEncoder(max_input_seq_length=2048, processor=str(processor_dir), pad_multiple=8),
        progress=False,
    )
    assert format_table(packing_table(measured, buffers=(64,))) in stats
    preview = invoke(
        "preview",
        synth_dataset,
        "--capacity",
        2048,
        "--processor",
        processor_dir,
        "--packs",
        2,
        "--picture",
        tmp_path / "preview.png",
    )
    assert preview.startswith("pack 0  2048 tokens")


# ---- videos: sample_data/video (16 of its 32 conversations hold a clip) ---------------


def video_encoder() -> PackingTaskEncoder:
    """The demo's, preview's and stats' encoder over the video data (C=2048)."""
    return PackingTaskEncoder(
        tokenizer="bundled",
        max_input_seq_length=2048,
        pad_multiple=8,
        carry=True,
        max_skips_without_pack=None,
    )


@pytest.fixture(scope="module")
def video_packs():
    """The video data through the loader directly: the encoder (its stats) and every pack."""
    te = video_encoder()
    return te, [b for b in loader_batches(VIDEO_DATA, te, buffer=64) if b["input_ids"].shape[0]]


def test_demo_video_section_counts_what_the_loader_packed(tmp_path, video_packs):
    """The section's numbers are the direct loader run's, counted from its packs: conversations
    with videos (video_source_index), clips, video-pad and image-pad tokens, real tokens."""
    picture = tmp_path / "demo.png"
    output = invoke("demo", "--data", VIDEO_DATA, "--videos", VIDEO_DATA, "--picture", picture)
    te, batches = video_packs
    video_pad, image_pad = te.chat.tokenizer.special.video_pad, te.image_token_id
    assert video_pad == 1633
    owners = [
        b["video_source_index"][0].tolist() if "video_source_index" in b else [] for b in batches
    ]
    ids = [b["input_ids"][0] for b in batches]
    clips = sum(len(o) for o in owners)
    with_videos = sum(len(set(o)) for o in owners)
    video_tokens = sum(int((i == video_pad).sum()) for i in ids)
    image_tokens = sum(int((i == image_pad).sum()) for i in ids)
    real = sum(int(b["cu_seqlens"][0][-1]) for b in batches)
    # every clip's tokens are its grid's, t*h*w / merge_size**2
    grids = sum(int(g.prod()) // 4 for b in batches for g in b.get("video_grid_thw", [[]])[0])
    assert video_tokens == grids > 0 and clips == with_videos == 16
    section = output[output.index(f"\nVideos: {VIDEO_DATA}\n") :]
    stats = te.stats
    assert re.search(
        rf"^  {stats.read} conversations read, {stats.packed} packed into {len(batches)} packs of "
        rf"2048 tokens in [\d.]+ s \(same loader, buffer 64, carry on\)$",
        section,
        re.M,
    )
    assert (
        f"  in the packs: {with_videos} conversations with videos, {clips} video clips, "
        f"{video_tokens:,} video tokens, {image_tokens:,} image tokens, {real:,} real tokens\n"
    ) in section
    assert f"  efficiency {100 * stats.efficiency:.1f} % real tokens\n" in section
    assert stats.skipped == {"overlong": 1}  # the section lists the reasons, with a key
    assert f"  skipped: overlong: 1 (e.g. {stats.skipped_keys['overlong'][0]})\n" in section
    second = tmp_path / "demo-video.png"
    assert f"picture of the first {len(batches)} packs with videos: {second}" in section
    assert second.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---- audio: sample_data/audio (8 of its 16 conversations hold 1-2 clips) ---------------

AUDIO_DATA = SAMPLE_DATA / "audio"


def test_demo_audio_section_counts_what_the_loader_packed(tmp_path):
    """The demo's audio section packs the bundled clips through the tiny offline Qwen2.5-Omni
    processor; its numbers are a direct loader run's through the same processor, counted from
    the packs: conversations with audio, clips (one audio-token run each, every one of the
    documents' ``audios``), audio and image tokens, real tokens."""
    from helpers import require_processor_media

    from energon_packing.testing.families import build

    require_processor_media("qwen2_5_omni")
    picture = tmp_path / "demo.png"
    output = invoke(
        "demo", "--data", VIDEO_DATA, "--audio", AUDIO_DATA, "--picture", picture,
    )  # fmt: skip
    te = PackingTaskEncoder(
        processor=build("qwen2_5_omni", model=False)[0],
        max_input_seq_length=2048,
        pad_multiple=8,
        carry=True,
        max_skips_without_pack=None,
    )
    batches = [b for b in loader_batches(AUDIO_DATA, te, buffer=64) if b["input_ids"].shape[0]]
    audio_id = te.chat.audio.token_id
    layouts = [
        pack_segments(b, 0, image_pad_id=te.image_token_id, audio_pad_id=audio_id) for b in batches
    ]
    segments = [s for layout in layouts for s in layout.segments]
    documents = {}  # every document's audios, read from the shards themselves
    for shard in sorted((AUDIO_DATA / "shards").glob("*.tar")):
        with tarfile.open(shard) as tar:
            for member in tar:
                if member.name.endswith(".json"):
                    documents[member.name] = json.load(tar.extractfile(member)).get("audios", [])
    clips = sum(len(s.audios) for s in segments)
    assert (
        clips == sum(map(len, documents.values())) == 10
    )  # every clip of the documents, packed once
    with_audio = sum(bool(s.audios) for s in segments)
    audio_tokens = sum(int((b["input_ids"][0] == audio_id).sum()) for b in batches)
    image_tokens = sum(int((b["input_ids"][0] == te.image_token_id).sum()) for b in batches)
    real = sum(int(b["cu_seqlens"][0][-1]) for b in batches)
    section = output[output.index(f"\nAudio: {AUDIO_DATA}\n") :]
    stats = te.stats
    assert stats.read == stats.packed == 16 and not stats.skipped
    assert re.search(
        rf"^  16 conversations read, 16 packed into {len(batches)} packs of 2048 tokens in "
        r"[\d.]+ s \(same loader, buffer 64, carry on\) through "
        r"ProcessorChat\(Qwen2_5OmniProcessor, family=qwen2_5_omni\)$",
        section,
        re.M,
    )
    assert (
        f"  in the packs: {with_audio} conversations with audio, {clips} audio clips, "
        f"{audio_tokens:,} audio tokens, {image_tokens:,} image tokens, {real:,} real tokens\n"
    ) in section
    assert with_audio == 8 and audio_tokens > 0
    third = tmp_path / "demo-audio.png"
    assert f"picture of the first {len(batches)} packs with audio: {third}" in section
    assert third.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_demo_audio_section_names_what_to_install(tmp_path, monkeypatch):
    """Without transformers the audio section says what it needs, and the demo goes on."""
    import energon_packing.testing.families as families

    def missing(*args, **kwargs):
        raise ImportError("No module named 'transformers'", name="transformers")

    monkeypatch.setattr(families, "build", missing)
    output = invoke(
        "demo", "--data", VIDEO_DATA, "--audio", AUDIO_DATA, "--picture", tmp_path / "demo.png",
    )  # fmt: skip
    assert output.endswith(
        f"\nAudio: {AUDIO_DATA}\n  not packed: audio needs a processor that takes it "
        "(Qwen2.5-Omni, Qwen3-Omni), and transformers is not installed: pip install "
        "'transformers>=5.5' (or the checkout with [hf])\n"
    )


def test_stats_counts_the_video_tokens_of_every_conversation():
    """Video tokens: the video-pad ids of every encoded conversation, and as many as the
    clips' headers plan (Qwen2-VL's rule at 2 fps); image tokens beside them."""
    from energon_packing.encoding import BUILTIN_VIDEO_SETTINGS
    from energon_packing.loader.loading import epoch
    from energon_packing.media import video_styles
    from energon_packing.media.video import probe
    from energon_packing.media.video_rules import VideoRule

    output = invoke(
        "stats", VIDEO_DATA, "--capacity", 2048, "--buffer", 64, "--algorithm", "subset_fill"
    )
    te = video_encoder()
    rule = VideoRule.of(video_styles.QWEN2_VL, BUILTIN_VIDEO_SETTINGS)
    video_pad = te.chat.tokenizer.special.video_pad
    video_tokens = image_tokens = planned = clips = 0
    for sample in epoch(VIDEO_DATA, te, packing_buffer_size=None, batch_size=None):
        video_tokens += int((sample.input_ids == video_pad).sum())
        image_tokens += int((sample.input_ids == te.image_token_id).sum())
        planned += sum(rule.tokens(probe(data)) for data in sample.videos)
        clips += len(sample.videos)
    assert video_tokens == planned > 0
    assert (
        f" real tokens ({image_tokens:,} image tokens, {video_tokens:,} video tokens from "
        f"{clips} clips), C=2048, pad_multiple=8\n"
    ) in output


def test_preview_marks_the_video_pad_runs(tmp_path, video_packs):
    """Each video's span in the text is a run of video-pad ids as long as its grid says,
    between <|vision_start|> and <|vision_end|>."""
    output = invoke(
        "preview", VIDEO_DATA, "--capacity", 2048, "--packs", 3, "--picture", tmp_path / "p.png"
    )
    te, batches = video_packs
    special = te.chat.tokenizer.special
    expected = describe(
        [
            pack_segments(b, 0, image_pad_id=te.image_token_id, video_pad_id=special.video_pad)
            for b in batches[:3]
        ]
    )
    assert expected in output
    spans = []
    for n, block in enumerate(re.split(r"^pack \d+ ", output, flags=re.M)[1:4]):
        ids = batches[n]["input_ids"][0]
        for t, h, w, a, b in re.findall(r"(\d+)x(\d+)x(\d+) at \[\s*(\d+),\s*(\d+)\)", block):
            a, b = int(a), int(b)
            assert b - a == int(t) * int(h) * int(w) // 4
            assert (ids[a:b] == special.video_pad).all()
            assert ids[a - 1] == special.vision_start and ids[b] == special.vision_end
            spans.append((n, a, b))
    assert (
        len(spans)
        == sum(len(b["video_source_index"][0]) for b in batches[:3] if "video_source_index" in b)
        > 0
    )
    assert (tmp_path / "p.png").exists()


# ---- the shard check, prepare's refusal, and wrong uses ----------------------------------


def run(*args):
    """The command as a user runs it: errors are click's, never a traceback."""
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert "Traceback" not in result.output, result.output
    if result.exit_code not in (0, 1, 2) or not isinstance(
        result.exception, (SystemExit, type(None))
    ):
        raise AssertionError(f"{result.exception!r}: {result.output}")
    return result


def error_line(result) -> str:
    lines = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(lines) == 1, result.output
    return lines[0]


def bad_shards(path):
    """A shard cut inside its 6th document and one whose 2nd header lies about its size."""
    from test_shards import EIGHT, conversations, lie_about_size, tar

    path.mkdir(parents=True, exist_ok=True)
    (path / "cut.tar").write_bytes(tar(EIGHT)[: 5 * 1024 + 512 + 40])
    (path / "lie.tar").write_bytes(lie_about_size(tar(conversations("q0", "q1", "q2")), 1024, 700))
    return path


def test_check_prints_the_losses_and_exits_1(tmp_path):
    result = run("check", bad_shards(tmp_path))
    assert result.exit_code == 1
    table = re.findall(r"^(\w+)\s+(\d+)\s+(\d+)$", result.output, re.M)
    assert table == [
        ("truncated_member", "2", "1"),
        ("lost_in_shard", "1", "1"),
        ("total", "3", "2"),
    ]
    assert re.search(
        r"^cut\.tar\s+5,120\s+s5\s+truncated_member: claims \d+ bytes", result.output, re.M
    )
    assert re.search(r"^lie\.tar\s+2,048\s+q2\s+lost_in_shard: after q1\.json", result.output, re.M)
    assert "prepare" in result.output and "--allow-losses" in result.output
    clean = run("check", SAMPLE_DATA)
    assert clean.exit_code == 0 and "nothing lost" in clean.output
    # **/*.tar: the main 4 shards of 100 and video/'s 2 shards of 16
    assert "4 shards" in clean.output and "400 samples" in clean.output


def test_prepare_refuses_losses_unless_allowed(tmp_path):
    path = bad_shards(tmp_path)
    refused = run("prepare", path)
    assert refused.exit_code == 1
    line = error_line(refused)
    assert "2 conversation(s) would vanish below the loader" in line and "--allow-losses" in line
    assert not (path / ".nv-meta").exists()
    allowed = run("prepare", path, "--allow-losses")
    assert allowed.exit_code == 0, allowed.output
    assert f"wrote {path / '.nv-meta' / 'energon_packing_losses.json'}" in allowed.output
    from energon_packing.incoming.shards import load_losses

    assert [(k, r) for k, r, _ in load_losses(path)] == [
        ("s5", "truncated_member"),
        ("q2", "lost_in_shard"),
    ]
    stats = run("stats", path, "--capacity", 2048, "--buffer", 8, "--algorithm", "subset_fill")
    assert "lost_in_shard: 1, malformed_json: 1 (e.g. q1), truncated_member: 1" in stats.output


def test_prepare_names_a_split_pattern_that_matches_no_shard(tmp_path):
    write_shards(tmp_path / "shards", conversations(4, seed=1), per_shard=2)
    result = run("prepare", tmp_path, "--split-parts", "train:nomatch.*")
    assert result.exit_code == 2
    line = error_line(result)
    assert "'nomatch.*' matches no shard" in line
    assert "shards/shard-00000.tar, shards/shard-00001.tar" in line
    assert not (tmp_path / ".nv-meta").exists()


@pytest.fixture
def wrong_datasets(tmp_path, synth_dataset):
    import shutil

    never = tmp_path / "never"
    write_shards(never / "shards", conversations(2, seed=1), per_shard=2)
    no_yaml = tmp_path / "no_yaml"
    shutil.copytree(synth_dataset, no_yaml)
    (no_yaml / ".nv-meta" / "dataset.yaml").unlink()
    typo = tmp_path / "typo"
    shutil.copytree(synth_dataset, typo)
    yaml = typo / ".nv-meta" / "dataset.yaml"
    yaml.write_text(yaml.read_text().replace("sample_loader:", "sample_loadr:"))
    return {"never": never, "no_yaml": no_yaml, "typo": typo, "good": synth_dataset}


@pytest.mark.parametrize(
    ("case", "extra", "expected"),
    [
        ("never", (), "was never prepared (no .nv-meta/): run `energon-packing prepare "),
        ("no_yaml", (), "dataset.yaml is missing: run `energon-packing prepare "),
        ("typo", (), "dataset.yaml does not load (AssertionError: Either field_map or sample_loader"),
        ("good", ("--pad-multiple", 3, "--capacity", 2048), "--pad-multiple 3 does not divide "
         "--capacity 2048: use --capacity 2046"),
    ],
)  # fmt: skip
@pytest.mark.parametrize("command", ["stats", "preview"])
def test_wrong_uses_end_in_one_line_with_the_fix(wrong_datasets, command, case, extra, expected):
    result = run(command, wrong_datasets[case], *extra)
    assert result.exit_code == 2
    assert expected in error_line(result)


@pytest.mark.parametrize("command", ["preview", "stats"])
def test_stats_and_preview_say_that_everything_was_skipped(tmp_path, command):
    """Before: preview crashed (IndexError), stats printed a table of zeros."""
    from helpers import make_dataset

    path = make_dataset(tmp_path / "six", conversations(6, seed=3), per_shard=6)
    extra = ("--picture", tmp_path / "p.png") if command == "preview" else ()
    result = run(command, path, "--capacity", 16, *extra)
    assert result.exit_code == 1
    assert f"nothing to pack: all 6 conversations read from {path} were skipped" in result.output
    assert re.search(r"^  text_too_long: \d+ \(e\.g\. conv", result.output, re.M)
    assert re.search(r"the shortest conversation costs \d+ tokens \(padded\), more than "
                     r"--capacity 16: pass --capacity \d+ or more", result.output)  # fmt: skip
    assert "IndexError" not in result.output and "efficiency" not in result.output


def test_knob_errors_name_the_cli_flags(synth_dataset):
    """The config's own checks speak of max_input_seq_length; the CLI user typed --capacity."""
    line = error_line(run("stats", synth_dataset, "--capacity", 0))
    assert "--capacity" in line and "max_input_seq_length" not in line


def test_check_reads_every_video_header(tmp_path):
    """``check`` reads each video part's container header: a clip the loader would skip is
    named with its shard, key and reason, and the exit code is 1; ``--no-videos`` skips it."""
    from test_video_packs import CLIPS, _mixed_dataset

    path, expected = _mixed_dataset(tmp_path / "mixed")
    result = run("check", path)
    assert result.exit_code == 1, result.output
    parts = len(CLIPS) + 4  # noise, cut, twice, unplaced ("gone" has no part)
    assert f"{parts} video parts" in result.output and "2 unreadable" in result.output
    for key in ("noise", "cut"):
        assert f"  {key}  {expected[key]}: " in result.output
    assert run("check", path, "--no-videos").exit_code == 0
    clean = run("check", SAMPLE_DATA / "video")
    assert clean.exit_code == 0 and "every one reads" in clean.output


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["stats", "--help"],
        ["stats", "/nonexistent"],
        ["convert", "a.jsonl", "out", "--columns", "conv=messages"],
    ],
)
def test_help_and_argument_errors_import_neither_energon_nor_torch(tmp_path, argv):
    """`--help` and argument errors answer in well under 0.5 s: they import no Energon (~2 s
    with torch), which only the commands that load a dataset import."""
    import subprocess
    import sys

    (tmp_path / "a.jsonl").write_text("{}\n")
    snippet = (
        "import sys\n"
        "from energon_packing.tools.cli import main\n"
        f"try:\n    main({argv!r})\nexcept SystemExit:\n    pass\n"
        "heavy = sorted({'torch', 'megatron.energon', 'webdataset'} & set(sys.modules))\n"
        "print('HEAVY', heavy)\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", snippet], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert run.stdout.strip().splitlines()[-1] == "HEAVY []", run.stdout + run.stderr
