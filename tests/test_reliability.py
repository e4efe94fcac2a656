"""Bad input, faults, exactly-once accounting and real data parallelism, through the real loader."""

from __future__ import annotations

import functools
import io
import itertools
import json
import random

import numpy as np
import pytest
import torch
from helpers import (
    check_batch,
    loader_batches,
    make_dataset,
    raw_sample,
    source,
    spawn_ranks,
    stop_workers,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from megatron.energon.errors import FatalSampleError
from PIL import Image

from energon_packing import PackingTaskEncoder
from energon_packing.encoding.positions import MRope, mrope_positions
from energon_packing.schema import IMAGE_GRID_THW, layout
from energon_packing.stats import MetricsAggregator
from energon_packing.testing.synth import conversations

#: full-size variants run under -m slow (.ci/run runs them); the default set keeps one
S = pytest.mark.slow

#: the loader tests .ci/run also runs on the oldest supported Energon release
pytestmark = pytest.mark.energon


def png(width, height, fmt="PNG"):
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (40, 120, 200)).save(buffer, format=fmt)
    return buffer.getvalue()


def ask(content, answer="Blue."):
    return [{"role": "user", "content": content}, {"role": "assistant", "content": answer}]


JPEG = png(320, 240, "JPEG")
LONG_ANSWER = "The picture shows a red square on a cream background. " * 120

# key -> (shard sample, expected skip reason or None when it must be packed)
CORPUS = {
    "ok_text": (raw_sample("ok_text", {"messages": ask("Hello?")}), None),
    "ok_image": (
        raw_sample(
            "ok_image",
            {"messages": ask("<image>What?"), "images": ["img0.png"]},
            {"img0.png": png(64, 64)},
        ),
        None,
    ),
    "malformed_json": (raw_sample("malformed_json", '{"messages": [oops'), "malformed_json"),
    "missing_messages": (raw_sample("missing_messages", {"images": []}), "missing_messages"),
    "unknown_role": (
        raw_sample(
            "unknown_role",
            {
                "messages": [
                    {"role": "robot", "content": "beep"},
                    {"role": "assistant", "content": "x"},
                ]
            },
        ),
        "unknown_role",
    ),
    "empty_conversation": (
        raw_sample("empty_conversation", {"messages": []}),
        "empty_conversation",
    ),
    "no_assistant": (
        raw_sample("no_assistant", {"messages": [{"role": "user", "content": "hi"}]}),
        "no_assistant_turn",
    ),
    "image_part_missing": (
        raw_sample("image_part_missing", {"messages": ask("<image>?"), "images": ["img0.jpg"]}),
        "missing_image",
    ),
    "image_named_twice": (
        raw_sample(
            "image_named_twice",
            {"messages": ask("<image><image>?"), "images": ["img0.png", "img0.png"]},
            {"img0.png": png(64, 64)},
        ),
        None,  # the same image shown twice: packed twice, as the processor lays it out
    ),
    "corrupt_jpeg_header": (
        raw_sample(
            "corrupt_jpeg_header",
            {"messages": ask("<image>?"), "images": ["img0.jpg"]},
            {"img0.jpg": b"\xff\xd8\xff" + bytes(range(256)) * 4},
        ),
        "corrupt_image",
    ),
    "corrupt_jpeg_body": (
        raw_sample(
            "corrupt_jpeg_body",
            {"messages": ask("<image>?"), "images": ["img0.jpg"]},
            {"img0.jpg": JPEG[: len(JPEG) // 3]},
        ),
        "corrupt_image",
    ),
    "zero_size_image": (
        raw_sample(
            "zero_size_image",
            {"messages": ask("<image>?"), "images": ["img0.png"]},
            {"img0.png": b""},
        ),
        "corrupt_image",
    ),
    "huge_image": (
        raw_sample(
            "huge_image",
            {"messages": ask("<image>Big?"), "images": ["img0.png"]},
            {"img0.png": png(6000, 4000)},
        ),
        None,
    ),
    "more_placeholders": (
        raw_sample(
            "more_placeholders",
            {"messages": ask("<image><image>?"), "images": ["img0.png"]},
            {"img0.png": png(64, 64)},
        ),
        "placeholder_mismatch",
    ),
    "more_images": (
        raw_sample(
            "more_images",
            {"messages": ask("<image>?"), "images": ["img0.png", "img1.png"]},
            {"img0.png": png(64, 64), "img1.png": png(64, 64)},
        ),
        "placeholder_mismatch",
    ),
    "non_utf8": (raw_sample("non_utf8", b'{"messages": "\xff\xfe\xfa"}'), "non_utf8"),
    "images_only": (
        raw_sample(
            "images_only",
            {
                "messages": [
                    {"role": "user", "content": [{"type": "image", "image": "img0.png"}]},
                    {"role": "assistant", "content": [{"type": "image", "image": "img1.png"}]},
                ],
                "images": ["img0.png", "img1.png"],
            },
            {"img0.png": png(64, 64), "img1.png": png(64, 64)},
        ),
        "empty_assistant",
    ),
    "overlong": (
        raw_sample(
            "overlong",
            {"messages": ask("<image>Tell me everything.", LONG_ANSWER), "images": ["img0.png"]},
            {"img0.png": png(112, 112)},
        ),
        "overlong",
    ),
}
CAPACITY = 512


@pytest.fixture(scope="module")
def bad_dataset(tmp_path_factory):
    return make_dataset(
        tmp_path_factory.mktemp("bad"),
        conversations(6, seed=4),
        raw=[sample for sample, _ in CORPUS.values()],
    )


def run(path, **knobs):
    te = PackingTaskEncoder(
        tokenizer="bundled", max_input_seq_length=CAPACITY, max_pixels=448 * 448, **knobs
    )
    batches = list(loader_batches(path, te, buffer=8))
    for batch in batches:
        check_batch(batch, te)
    packed = [k for b in batches for keys in b["source_ids"] for k in keys]
    return te, batches, packed


def test_every_bad_input_gets_its_outcome(bad_dataset, capfd):
    te, batches, packed = run(bad_dataset)
    skipped = dict(te.stats.drain() + [e for b in batches for e in b["packing_skipped"]])
    expected = {key: reason for key, (_, reason) in CORPUS.items() if reason}
    assert {k: r for k, r in skipped.items() if k in CORPUS} == expected
    assert {"ok_text", "ok_image", "huge_image"} <= set(packed)
    assert not set(expected) & set(packed)
    assert len(packed) + len(skipped) == len(CORPUS) + 6 == te.stats.read
    # the huge image was resized within max_pixels, not refused
    batch = next(b for b in batches if "huge_image" in b["source_ids"][0])
    k = batch["source_ids"][0].index("huge_image")
    (grid,) = batch["image_grid_thw"][0][batch["image_source_index"][0] == k].tolist()
    assert grid[1] * grid[2] * 14 * 14 <= te.config.vision.max_pixels
    # one warning per reason, never a traceback or a sample dump per sample
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Except " not in err
    for reason in set(expected.values()):
        assert err.count(f"({reason}:") <= 1


def test_overlong_policies_on_the_corpus(bad_dataset):
    dropped, _, _ = run(bad_dataset)
    over = dropped.stats.skipped_keys["overlong"]  # the corpus's own and a generated one
    te, _, packed = run(bad_dataset, overlong="truncate")
    assert set(over) <= set(packed) and te.stats.truncated == len(over) >= 1
    with pytest.raises(
        FatalSampleError,
        match=r"sample '\w+': \d+ tokens .* > max_input_seq_length=512\. "
        r"Set overlong='truncate' or 'drop'",
    ):
        run(bad_dataset, overlong="error")


@pytest.fixture(scope="module")
def mixed_dataset(tmp_path_factory):
    """Generated conversations with the bad corpus spread through four shards."""
    items = list(conversations(80, seed=12))
    return make_dataset(
        tmp_path_factory.mktemp("mixed"),
        items,
        per_shard=20,
        raw=[sample for sample, _ in CORPUS.values()],
    )


@pytest.mark.parametrize(
    "workers, carry",  # one corner of the grid by default, the rest in -m slow
    [(0, False)] + [pytest.param(w, c, marks=S) for w, c in [(2, True), (0, True), (2, False)]],
)
def test_accounting_reaches_the_trainer(mixed_dataset, workers, carry):
    te = PackingTaskEncoder(tokenizer="bundled", max_input_seq_length=2048, carry=carry)
    aggregate = MetricsAggregator()
    packed, batches = [], 0
    for batch in loader_batches(mixed_dataset, te, buffer=8, workers=workers):
        metrics = aggregate.update(batch)
        packed += batch["source_ids"][0]
        batches += 1
    skipped = [key for key, _ in aggregate.skipped]
    everything = {f"conv{i:06d}" for i in range(80)} | set(CORPUS)
    assert sorted(packed + skipped) == sorted(everything), "each key once: packed or reported"
    assert all(isinstance(v, (int, float)) for v in metrics.values())
    assert metrics["packing/read"] == len(everything)
    assert metrics["packing/packed"] == len(packed) and metrics["packing/packs"] == batches
    assert (
        metrics["packing/skipped"]
        == len(skipped)
        == metrics["packing/read"] - metrics["packing/packed"]
    )
    assert metrics["packing/efficiency"] == pytest.approx(
        metrics["packing/real_tokens"] / (batches * 2048)
    )
    assert metrics["packing/workers"] == max(workers, 1)
    for reason in {r for _, r in aggregate.skipped}:  # per-reason counters match the reported keys
        assert metrics[f"packing/skipped/{reason}"] == sum(
            r == reason for _, r in aggregate.skipped
        )


def snapshot(batch):
    return (
        batch["source_ids"],
        batch["input_ids"].clone(),
        [p.clone() for p in batch["pixel_values"]],
    )


@pytest.mark.parametrize(
    "workers, count",
    [
        (0, 4),
        pytest.param(2, 3, marks=pytest.mark.slow),  # the 2-worker restore runs in -m slow
        pytest.param(0, 11, marks=pytest.mark.slow),
        pytest.param(2, 11, marks=pytest.mark.slow),
    ],
)
def test_restore_at_random_points(synth_dataset, workers, count):
    knobs = dict(max_input_seq_length=512, tokenizer="bundled", carry=True, max_pixels=448 * 448)
    loader = loader_batches(
        synth_dataset, PackingTaskEncoder(**knobs), buffer=12, workers=workers, savable=True
    )
    batches, states = [], {}
    points = set(random.Random(workers + count).sample(range(2, 50), count))
    for step, batch in enumerate(loader):
        batches.append(snapshot(batch))
        if step in points:
            states[step] = loader.save_state_rank()
    stop_workers()
    assert len(states) == count and len(batches) > max(points) + 3
    for step, state in states.items():
        restored = loader_batches(
            synth_dataset, PackingTaskEncoder(**knobs), buffer=12, workers=workers, savable=True
        )
        restored.restore_state_rank(state)
        continuation = [snapshot(b) for b in itertools.islice(iter(restored), 3)]
        stop_workers()
        assert len(continuation) == 3
        for expected, got in zip(batches[step + 1 : step + 4], continuation):
            assert got[0] == expected[0]
            assert torch.equal(got[1], expected[1])
            assert all(torch.equal(a, b) for a, b in zip(got[2], expected[2]))


@pytest.mark.parametrize("workers", [pytest.param(0, marks=S), 2])
def test_a_corrupt_shard_is_skipped_with_a_report(tmp_path, workers):
    path = make_dataset(tmp_path, conversations(90, seed=2), per_shard=30)
    shard = sorted((path / "shards").glob("*.tar"))[1]
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])  # truncated after `energon prepare`
    aggregate = MetricsAggregator()
    packed = []
    for batch in loader_batches(
        path,
        PackingTaskEncoder(tokenizer="bundled", max_input_seq_length=4096),
        buffer=16,
        workers=workers,
    ):
        aggregate.update(batch)
        packed += batch["source_ids"][0]
    corrupt = [key for key, reason in aggregate.skipped if reason == "corrupt_shard"]
    # named by its key while the cut shard still holds the sample's first header, else by the
    # shard and the dataset-wide index
    in_tar = {f"conv{i:06d}" for i in range(30, 60)}
    named = [key for key in corrupt if key in in_tar]
    assert corrupt and named, corrupt  # the sample the cut runs through still has its header
    assert all(key in in_tar or key.startswith("shards/shard-00001.tar#") for key in corrupt)
    assert len(packed) + len(corrupt) == 90
    assert {f"conv{i:06d}" for i in list(range(30)) + list(range(60, 90))} <= set(packed)


@pytest.mark.parametrize("carry", [pytest.param(False, marks=S), True])
def test_a_failing_select_never_drops_the_buffer(synth_dataset, monkeypatch, carry):
    import energon_packing.loader.task_encoder as module

    def broken(*args, **kwargs):
        raise RuntimeError("bug in select")

    monkeypatch.setattr(module, "select_packs", broken)
    te = PackingTaskEncoder(tokenizer="bundled", max_input_seq_length=8192, carry=carry)
    packed = [k for b in loader_batches(synth_dataset, te, buffer=16) for k in b["source_ids"][0]]
    assert sorted(packed) == sorted(f"conv{i:06d}" for i in range(120))  # one pack each


def test_a_failing_pack_reports_its_members(synth_dataset, monkeypatch):
    import energon_packing.loader.task_encoder as module

    real, calls = module.layout, []

    def flaky(sources, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("bug in assembly")
        return real(sources, **kwargs)

    monkeypatch.setattr(module, "layout", flaky)
    te = PackingTaskEncoder(tokenizer="bundled", max_input_seq_length=2048)
    aggregate = MetricsAggregator()
    packed = []
    for batch in loader_batches(synth_dataset, te, buffer=16):
        aggregate.update(batch)
        packed += batch["source_ids"][0]
    lost = [key for key, reason in aggregate.skipped if reason == "pack_error"]
    assert lost and sorted(packed + [k for k, _ in aggregate.skipped]) == sorted(
        f"conv{i:06d}" for i in range(120)
    )


@S  # two gloo processes (~8 s): data parallelism in step is proven in -m slow
def test_two_ranks_one_epoch_in_step(synth_dataset, tmp_path):
    import dp_worker

    spawn_ranks(dp_worker.epoch, 2, tmp_path, str(synth_dataset), str(tmp_path / "out"))
    ranks = [json.loads((tmp_path / f"out.{r}").read_text()) for r in range(2)]
    assert [r["rank"] for r in ranks] == [0, 1] and {r["world_size"] for r in ranks} == {2}
    assert ranks[0]["steps"] == ranks[1]["steps"], "same microbatches and shapes at every step"
    assert all(step == [[1, 2048]] for step in ranks[0]["steps"])
    keys = ranks[0]["keys"] + ranks[1]["keys"]
    skipped = ranks[0]["skipped"] + ranks[1]["skipped"]
    assert not set(ranks[0]["keys"]) & set(ranks[1]["keys"])
    assert sorted(keys + skipped) == sorted(f"conv{i:06d}" for i in range(120))


def test_aligned_ranks_run_equal_steps_with_fillers_shaped_like_the_packs(tmp_path):
    """Three gloo ranks with 0, 1 and 2 packs: every rank runs 2 steps; rank 0, which never
    saw a pack, learns the fillers' width (24) and mRoPE layout from the others; each rank's
    skip rides on its first yielded batch."""
    import dp_worker

    spawn_ranks(dp_worker.aligned, 3, tmp_path, str(tmp_path / "out"), timeout=120)
    ranks = [json.loads((tmp_path / f"out.{r}").read_text()) for r in range(3)]
    filler = ranks[0]["filler"]
    assert [r["steps"] for r in ranks] == [
        [[filler, [1, 24], [3, 1, 24], ["lost-0"]], [filler, [1, 24], [3, 1, 24], []]],
        [["r1-0", [1, 24], [3, 1, 24], ["lost-1"]], [filler, [1, 24], [3, 1, 24], []]],
        [["r2-0", [1, 24], [3, 1, 24], ["lost-2"]], ["r2-1", [1, 24], [3, 1, 24], []]],
    ]


@S  # two gloo processes
def test_aligned_batches_of_several_packs_get_fillers_as_wide_or_an_error(tmp_path):
    import dp_worker

    spawn_ranks(dp_worker.aligned_rows, 2, tmp_path, str(tmp_path / "a"), [[2, 2], [2]])
    outcome = [json.loads((tmp_path / f"a.{r}").read_text()) for r in range(2)]
    assert outcome[1] == [[["r1"], ["r1"]], [["__filler__"], ["__filler__"]]]
    (tmp_path / "b").mkdir()  # a rendezvous of its own
    spawn_ranks(dp_worker.aligned_rows, 2, tmp_path / "b", str(tmp_path / "b"), [[2, 2], [2, 1]])
    for rank in range(2):  # a short last batch: every rank raises, none hangs
        assert "ranks bring batches of 1 to 2 packs at this step" in json.loads(
            (tmp_path / f"b.{rank}").read_text()
        )


@S  # two gloo processes
def test_a_shape_mismatch_is_an_error_not_a_hang(tmp_path):
    import dp_worker

    spawn_ranks(dp_worker.mismatch, 2, tmp_path, str(tmp_path / "out"), timeout=120)
    for rank in range(2):
        outcome = (tmp_path / f"out.{rank}").read_text()
        assert outcome.startswith(
            "MICRO_BATCH_LENGTHS: data-parallel ranks disagree at this step: "
            f"rank {rank} has {rank + 1} microbatches"
        ), outcome
        assert "ranges from [1, 36, 36] to [2, 72, 36]" in outcome


# ---- pack assembly, with images and mRoPE, under hypothesis --------------------------------

SPEC = MRope(vision_start_id=3, image_pad_id=5)


@st.composite
def conversation_tokens(draw, key):
    """Text tokens (>= 6) with image blocks: <vision_start> pads (t*h*w/4) <vision_end>."""
    ids, grids = [], []
    for _ in range(draw(st.integers(0, 3))):
        ids += draw(st.lists(st.integers(6, 50), min_size=1, max_size=5))
        grid = (1, 2 * draw(st.integers(1, 3)), 2 * draw(st.integers(1, 3)))
        ids += [3] + [5] * (grid[1] * grid[2] // 4) + [4]
        grids.append(grid)
    ids += draw(st.lists(st.integers(6, 50), min_size=1, max_size=20))
    mask = [0.0] + [float(t >= 6) * draw(st.sampled_from([0.0, 0.5, 1.0])) for t in ids[1:]]
    return ids, mask, grids


@st.composite
def packs(draw):
    pad_multiple = draw(st.sampled_from([1, 2, 4, 8]))
    sources = [draw(conversation_tokens(f"s{k}")) for k in range(draw(st.integers(1, 5)))]
    used = sum(-(-len(ids) // pad_multiple) * pad_multiple for ids, _, _ in sources)
    capacity = used + pad_multiple * draw(st.integers(0, 6))
    return sources, capacity, pad_multiple


@settings(max_examples=200, deadline=None)
@given(case=packs(), mrope=st.booleans())
def test_any_group_that_fits_meets_the_contract(case, mrope):
    sources, capacity, pad_multiple = case
    built = [
        source(f"s{k}", ids, mask, grids=grids, mrope=SPEC if mrope else None)
        for k, (ids, mask, grids) in enumerate(sources)
    ]
    pack = layout(built, width=capacity, pad_multiple=pad_multiple, pad_id=0)
    pack.check(pad_multiple=pad_multiple, image_pad_id=5)
    assert pack.input_ids.shape == (capacity,) and pack.cu_seqlens_padded[-1] == capacity
    for k, ((ids, _, grids), start) in enumerate(zip(sources, pack.cu_seqlens_padded[:-1])):
        n = len(ids)
        positions = pack.position_ids[..., start : start + n]
        if mrope:  # what Qwen2-VL computes for the source alone
            assert np.array_equal(positions, mrope_positions(ids, grids, SPEC))
        else:
            assert positions.tolist() == list(range(n))
        assert pack.media[IMAGE_GRID_THW][pack.image_source_index == k].tolist() == [
            list(g) for g in grids
        ]


# ---- never a silent hang ---------------------------------------------------------------------


def _train_loader(path, te, *, workers):
    """The README's train loader: repeats forever (a loader that skips everything hangs)."""
    from megatron.energon import WorkerConfig, get_loader, get_train_dataset

    dataset = get_train_dataset(
        path,
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=workers),
        batch_size=1,
        packing_buffer_size=8,
        task_encoder=te,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
    )
    return get_loader(dataset)


@functools.cache
def _synth_costs() -> list[int]:
    """The cost of each synth_dataset conversation (encoded wide enough for all)."""
    from energon_packing.loader.samples import ConversationSample, load_conversation

    wide = PackingTaskEncoder(tokenizer="bundled", max_input_seq_length=1 << 15)
    costs = []
    for c in conversations(120, seed=7):
        fields = load_conversation({"json": json.dumps(c.document).encode(), **c.images})
        sample = ConversationSample(__key__=c.key, __restore_key__=(), **fields)
        costs.append(wide.encode_sample(sample).cost)
    return costs


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_a_loader_that_packs_nothing_stops_naming_why(synth_dataset, workers):
    """max_input_seq_length below every conversation: an error naming the reasons, their
    counts, the cheapest conversation's cost and the width (never a loop without output)."""
    import signal

    def hung(*_):
        raise TimeoutError("the loader hung")

    te = PackingTaskEncoder(
        tokenizer="bundled",
        max_input_seq_length=16,
        carry=True,
        max_skips_without_pack=60,  # the default is 1,000; fewer keep the test fast
        **{"max_turns": 64, "max_text_chars": 1 << 20, "max_images": 64},  # only overlong
    )
    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(60)
    try:
        with pytest.raises(FatalSampleError) as info:
            next(iter(_train_loader(synth_dataset, te, workers=workers)))
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
        stop_workers()
    message = str(info.value)
    assert "skipped 60 samples and packed none (max_skips_without_pack=60)" in message
    assert "skip reasons: overlong 60." in message and "max_input_seq_length=16" in message
    import re

    found = re.search(r"the shortest over-long conversation costs ([\d,]+) tokens", message)
    cost = int(found.group(1).replace(",", ""))
    assert f"raise max_input_seq_length to at least {cost} " in message and cost > 16
    if workers:  # (slow) the cost is a real conversation's: the one of its share it read
        assert cost in _synth_costs()


def test_the_first_skip_of_each_reason_shows_without_logging_set_up():
    """The package adds only a NullHandler; without any logging set-up the first skip of a
    reason still reaches stderr (a warning), once per reason."""
    import subprocess
    import sys

    code = (
        "from energon_packing.stats import PackingStats\n"
        "s = PackingStats()\n"
        "for i in range(3):\n"
        "    s.skip(f'k{i}', 'overlong', 'too long')\n"
        "s.skip('t', 'too_many_turns', 'many')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stderr.count("SkipWarning: skipping sample 'k0' (overlong: too long)") == 1
    assert "'k1'" not in out.stderr and out.stderr.count("too_many_turns: many") == 1
