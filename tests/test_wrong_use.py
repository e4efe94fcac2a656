"""Every wrong use a new user made (issue 24) ends in one line that names the fix."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tarfile

import pytest
from click.testing import CliRunner
from helpers import REPO, SAMPLE_DATA, loader_batches

from energon_packing import PackingTaskEncoder
from energon_packing.tools.cli import main


def _last_line(result) -> str:
    return result.output.strip().splitlines()[-1]


def test_an_unknown_algorithm_is_a_usage_error():
    result = CliRunner().invoke(main, ["stats", str(SAMPLE_DATA), "--algorithm", "ffd"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert _last_line(result).startswith(
        "Error: Invalid value for '--algorithm': 'ffd' is not one of 'subset_fill'"
    )


def test_a_folder_inside_a_prepared_dataset_names_the_dataset():
    result = CliRunner().invoke(main, ["stats", str(SAMPLE_DATA / "shards")])
    assert result.exit_code == 2
    assert _last_line(result).endswith(
        f"is a folder inside the prepared dataset {SAMPLE_DATA.resolve()}: pass "
        f"{SAMPLE_DATA.resolve()}"
    )


def test_a_processor_folder_that_is_no_model(tmp_path):
    (tmp_path / "README.md").write_text("not a model")
    result = CliRunner().invoke(main, ["stats", str(SAMPLE_DATA), "--processor", str(tmp_path)])
    assert result.exit_code != 0 and "sentencepiece" not in result.output
    assert f"{tmp_path} is no Hugging Face model directory" in _last_line(result)


def test_a_builtin_knob_with_a_processor_is_named_before_any_conflict():
    pytest.importorskip("transformers")
    from energon_packing.testing.families import build

    processor = build("qwen2_vl", model=False)[0]
    with pytest.raises(ValueError, match=r"^max_pixels=1000 does not apply with processor="):
        PackingTaskEncoder(max_input_seq_length=2048, processor=processor, max_pixels=1000)


def test_an_unprepared_folder_from_python(tmp_path):
    from megatron.energon import WorkerConfig, get_train_dataset

    from energon_packing.loader.energon import DatasetNotPreparedError

    shutil.copytree(SAMPLE_DATA / "shards", tmp_path / "shards")
    te = PackingTaskEncoder(tokenizer="bundled", max_input_seq_length=2048)
    with pytest.raises(DatasetNotPreparedError) as info:
        get_train_dataset(
            tmp_path,
            worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0),
            batch_size=1,
            packing_buffer_size=16,
            task_encoder=te,
            shuffle_buffer_size=None,
            max_samples_per_sequence=None,
        )
    assert str(info.value) == (
        f"{tmp_path} is not a prepared Energon dataset (no .nv-meta/): run "
        f"`energon-packing prepare {tmp_path}` (it writes .nv-meta/)"
    )
    assert info.value.__suppress_context__  # Energon's "Invalid dataset" is not what one reads


def test_a_capacity_nothing_fits_stops_with_our_line_not_a_sample_dump():
    from energon_packing.loader.task_encoder import PackingError

    te = PackingTaskEncoder(tokenizer="bundled", max_input_seq_length=16, max_skips_without_pack=50)
    with pytest.raises(PackingError) as info:
        list(loader_batches(SAMPLE_DATA, te, buffer=16))
    message = str(info.value)
    assert message.startswith("this loader worker skipped 50 samples and packed none")
    assert "raise max_input_seq_length to at least" in message and "\n" not in message
    assert info.value.__suppress_context__ and "ConversationSample(" not in message


def test_stats_prints_the_pack_count_and_the_capacity_that_keeps_the_over_long():
    result = CliRunner().invoke(
        main,
        [
            "stats",
            str(SAMPLE_DATA),
            "--capacity",
            "512",
            "--buffer",
            "64",
            "--algorithm",
            "subset_fill",
        ],
    )
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    hint = next(line for line in lines if "are longer than C=512" in line)
    assert hint.startswith("60 of 400 conversations (15.0%) are longer than C=512")
    assert "--capacity 3040 keeps all of them" in hint  # the longest costs 3,040 at pad 8
    recommended = next(line for line in lines if line.startswith("recommended:"))
    assert " packs (lower bound " in recommended


def test_preview_reports_its_skips_and_its_picture_says_what_its_text_says(tmp_path):
    picture = tmp_path / "p.png"
    result = CliRunner().invoke(
        main,
        ["preview", str(SAMPLE_DATA), "--capacity", "1024", "--picture", str(picture)],
    )
    assert result.exit_code == 0, result.output
    assert "while packing these, skipped: overlong: 2 (e.g. sample000013)" in result.output
    from energon_packing.tools.picture import Layout, Segment, fill

    pack = Layout(
        capacity=1000, segments=[Segment(key="a", start=0, real_end=995, padded_end=1000)]
    )
    assert fill(pack) == "99.5 %"  # one rounding for both (the picture used to say 100%)


def test_no_pin_memory_warning_on_a_cpu_machine():
    snippet = (
        "from helpers import SAMPLE_DATA, loader_batches\n"
        "from energon_packing import PackingTaskEncoder\n"
        "te = PackingTaskEncoder(tokenizer='bundled', max_input_seq_length=2048)\n"
        "next(iter(loader_batches(SAMPLE_DATA, te, buffer=8)))\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", snippet],
        cwd=REPO / "tests",
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO / "tests"), "TQDM_DISABLE": "1"},
    )
    assert run.returncode == 0, run.stderr
    assert "pin_memory" not in run.stderr


# ---- convert (issue 31): a run that converts nothing says why in one line, exit 1 --------------

_TURNS = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
_WRONG_CONVERTS = {
    "a JSON that is not a list": (
        "data.json",
        '"hello"',
        [],
        "Error: converted 0 of 1 records read (malformed_record 1); the first rejected, "
        "data.json index 0, does not read (malformed_record: the file does not hold a JSON "
        "list of records, nor objects). Only convert_report.jsonl",
    ),
    "the wrong --format": (
        "data.jsonl",
        {"messages": _TURNS},
        ["--format", "alpaca"],
        "the first rejected, data.jsonl index 0, has keys 'messages'; --format alpaca reads "
        "'instruction' + 'output' (+ 'input', 'history', 'system'); --format auto reads 1 of "
        "the first 1 rejected.",
    ),
    "a shape we do not read": (
        "data.jsonl",
        {"prompt": "hi", "chosen": "a", "rejected": "b"},
        [],
        "has keys 'prompt', 'chosen', 'rejected'; --format auto reads turns under "
        "'conversations' / 'messages' / 'conversation', 'query' + 'response', 'instruction' + "
        "'output', or 'texts' + 'images'; no other --format or --columns reads them.",
    ),
    "columns under other names": (
        "data.jsonl",
        {"dialogue": _TURNS, "pics": ["a.png"]},
        [],
        "has keys 'dialogue', 'pics'; --format auto reads turns under 'conversations' / "
        "'messages' / 'conversation', 'query' + 'response', 'instruction' + 'output', or "
        "'texts' + 'images'; --columns messages=dialogue,images=pics reads 1 of the first 1 "
        "rejected.",
    ),
    "a VQA pair": (
        "data.jsonl",
        {"question": "What is it?", "answer": "A cat.", "image": "a.png"},
        [],
        "has keys 'question', 'answer', 'image'; --format auto reads turns under "
        "'conversations' / 'messages' / 'conversation', 'query' + 'response', 'instruction' + "
        "'output', or 'texts' + 'images'; --columns query=question,response=answer,images=image "
        "reads 1 of the first 1 rejected.",
    ),
    "a problem and its solution": (
        "data.jsonl",
        {"Problem": "2+2?", "Solution": "4", "images": []},
        [],
        "--columns query=Problem,response=Solution reads 1 of the first 1 rejected.",
    ),
}


def test_the_suggested_columns_read_a_vqa_pair_with_its_image(tmp_path):
    """What the one line suggests for a VQA record (question / answer / image) converts it:
    the question a user turn after its image, the answer the assistant's."""
    from PIL import Image

    Image.new("RGB", (8, 8), (200, 10, 10)).save(tmp_path / "a.png")
    source = tmp_path / "vqa.jsonl"
    source.write_text(json.dumps({"question": "Colour?", "answer": "Red.", "image": "a.png"}))
    out = tmp_path / "out"
    flags = ["--columns", "query=question,response=answer,images=image"]
    result = CliRunner().invoke(main, ["convert", str(source), str(out), *flags])
    assert result.exit_code == 0, result.output
    with tarfile.open(next((out / "shards").glob("*.tar"))) as tar:
        document = json.load(tar.extractfile("r000000000.json"))
        assert tar.extractfile("r000000000.img0.png").read() == (tmp_path / "a.png").read_bytes()
    assert document == {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image", "image": "img0.png"},
                    {"type": "text", "text": "Colour?"},
                ],
            },
            {"role": "assistant", "content": "Red."},
        ],
        "images": ["img0.png"],
    }


@pytest.mark.parametrize("case", list(_WRONG_CONVERTS))
def test_a_convert_that_converts_nothing_says_why_in_one_line(tmp_path, case):
    name, content, flags, expected = _WRONG_CONVERTS[case]
    source = tmp_path / name
    source.write_text(content if isinstance(content, str) else json.dumps(content) + "\n")
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["convert", str(source), str(out), *flags])
    assert result.exit_code == 1 and "Traceback" not in result.output
    line = _last_line(result)
    assert line.startswith("Error: converted 0 of 1 records read (malformed_record 1)")
    assert expected in line
    assert line.endswith(
        f"Only convert_report.jsonl (every rejected record, its reason and keys) is left in {out}"
    )
    assert sorted(p.name for p in out.iterdir()) == ["convert_report.jsonl"]


def test_an_out_a_failed_run_left_takes_the_rerun_and_a_good_one_needs_overwrite(tmp_path):
    source = tmp_path / "data.jsonl"
    source.write_text(json.dumps({"messages": _TURNS}) + "\n")
    out = tmp_path / "out"
    runner = CliRunner()
    failed = runner.invoke(main, ["convert", str(source), str(out), "--format", "alpaca"])
    assert failed.exit_code == 1
    rerun = runner.invoke(main, ["convert", str(source), str(out)])  # no --overwrite needed
    assert rerun.exit_code == 0, rerun.output
    assert _last_line(rerun) == f"prepared: energon-packing stats {out}"
    again = runner.invoke(main, ["convert", str(source), str(out)])
    assert again.exit_code == 2
    assert _last_line(again) == (
        f"Error: {out} exists and is not empty: convert writes a new dataset folder; pass "
        "--overwrite to replace what an earlier convert wrote"
    )
    assert runner.invoke(main, ["convert", str(source), str(out), "--overwrite"]).exit_code == 0
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("mine")
    refused = runner.invoke(main, ["convert", str(source), str(mine), "--overwrite"])
    assert refused.exit_code == 2 and (mine / "thesis.tex").exists()
    assert _last_line(refused) == (
        f"Error: {mine} holds files convert does not write (thesis.tex): --overwrite replaces "
        "only a folder an earlier convert wrote; choose another OUT"
    )


def test_far_less_converted_than_read_fails_unless_min_converted_allows_it(tmp_path):
    source = tmp_path / "data.jsonl"
    good, bad = {"messages": _TURNS}, {"messages": [{"role": "robot", "content": "beep"}]}
    source.write_text("".join(json.dumps(r) + "\n" for r in [good, bad, bad, bad]))
    runner = CliRunner()
    result = runner.invoke(main, ["convert", str(source), str(tmp_path / "a")])
    assert result.exit_code == 1
    assert _last_line(result).startswith(
        "Error: converted 1 of 4 records read, less than --min-converted 0.5 of them "
        "(malformed_record 3); the first rejected, data.jsonl index 1, has keys 'messages' "
        "(malformed_record: messages[0]: the speaker is 'robot', not one of human, user, gpt, "
        "assistant, system (map yours with `energon-packing convert --dataset-info`'s tags))"
    )
    assert _last_line(result).endswith("; --min-converted 0 keeps the records that convert")
    kept = runner.invoke(
        main, ["convert", str(source), str(tmp_path / "b"), "--min-converted", "0.25"]
    )
    assert kept.exit_code == 0 and "converted 1 records" in kept.output


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--columns", "conv=messages"], "--columns names 'conv', which is none of"),
        (["--columns", "messages"], "--columns 'messages' is not NAME=KEY (e.g. messages=conv)"),
        (["--dataset-info", "{info}"], "--dataset-info needs --dataset NAME"),
        (["--dataset-info", "{info}", "--dataset", "nope"], "--dataset 'nope' is not in"),
    ],
)
def test_convert_argument_errors_are_one_line(tmp_path, flags, expected):
    source = tmp_path / "data.jsonl"
    source.write_text(json.dumps({"messages": _TURNS}) + "\n")
    info = tmp_path / "dataset_info.json"
    info.write_text(json.dumps({"demo": {"file_name": "data.jsonl"}}))
    flags = [f.format(info=info) for f in flags]
    result = CliRunner().invoke(main, ["convert", str(source), str(tmp_path / "out"), *flags])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert expected in _last_line(result)
    assert not (tmp_path / "out").exists()
