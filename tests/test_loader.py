"""The task encoder through the real Energon loader, on generated shards."""

from __future__ import annotations

import itertools
import subprocess
import sys

import pytest
import torch
from helpers import REPO, SAMPLE_DATA, check_batch, loader_batches, make_dataset

from energon_packing import PackingTaskEncoder
from energon_packing.incoming.prepare import YAMLS
from energon_packing.testing.synth import Conversation, conversations

#: full-size variants run under -m slow (.ci/run runs them); the default set keeps one
S = pytest.mark.slow

#: the loader tests .ci/run also runs on the oldest supported Energon release
pytestmark = pytest.mark.energon

ALL_KEYS = {f"conv{i:06d}" for i in range(120)}


def keys_of(batches):
    return [key for batch in batches for keys in batch["source_ids"] for key in keys]


def test_every_pack_meets_the_contract(synth_dataset):
    te = PackingTaskEncoder(tokenizer="bundled", max_input_seq_length=2048, pad_multiple=8)
    batches = list(loader_batches(synth_dataset, te, buffer=16))
    for batch in batches:
        check_batch(batch, te)
        for row, positions in enumerate(batch["position_ids"]):  # restart at every source
            starts = batch["cu_seqlens_padded"][row][:-1].long()
            assert (positions[starts] == 0).all()
    packed = keys_of(batches)
    skipped = [k for keys in te.stats.skipped_keys.values() for k in keys]
    assert sorted(packed + skipped) == sorted(ALL_KEYS), "every conversation: packed or reported"
    assert te.stats.packs == len(batches) and te.stats.packed == len(packed)
    assert sum(len(b["source_ids"][0]) for b in batches) / len(batches) > 3  # really packing


@pytest.mark.parametrize("workers", [pytest.param(0, marks=S), 2])
def test_exactly_once_over_ranks_and_workers(synth_dataset, workers):
    te = PackingTaskEncoder(
        tokenizer="bundled", max_input_seq_length=8192
    )  # nothing is over-long at 8k
    per_rank = []
    for rank in range(2):
        batches = list(
            loader_batches(synth_dataset, te, buffer=8, workers=workers, rank=rank, world_size=2)
        )
        per_rank.append(keys_of(batches))
    assert not set(per_rank[0]) & set(per_rank[1]), "ranks get disjoint shares"
    everything = per_rank[0] + per_rank[1]
    assert len(everything) == len(set(everything)) == len(ALL_KEYS)
    assert set(everything) == ALL_KEYS


def snapshot(batch):
    return (
        batch["source_ids"],
        batch["input_ids"].clone(),
        batch["token_mask"].clone(),
        [p.clone() for p in batch["pixel_values"]],
        [c.clone() for c in batch["cu_seqlens_padded"]],
    )


def assert_same(a, b):
    assert a[0] == b[0]
    assert torch.equal(a[1], b[1]) and torch.equal(a[2], b[2])
    assert all(torch.equal(x, y) for x, y in zip(a[3], b[3]))
    assert all(torch.equal(x, y) for x, y in zip(a[4], b[4]))


def test_save_and_restore_mid_epoch_continues_identically(synth_dataset):
    te = PackingTaskEncoder(tokenizer="bundled", max_input_seq_length=2048, pad_multiple=8)
    loader = loader_batches(synth_dataset, te, buffer=16, savable=True)
    it = iter(loader)
    for _ in range(3):
        next(it)
    state = loader.save_state_rank()
    expected = [snapshot(b) for b in itertools.islice(it, 4)]

    fresh = PackingTaskEncoder(tokenizer="bundled", max_input_seq_length=2048, pad_multiple=8)
    restored = loader_batches(synth_dataset, fresh, buffer=16, savable=True)
    restored.restore_state_rank(state)
    got = [snapshot(b) for b in itertools.islice(iter(restored), 4)]
    assert len(got) == len(expected) == 4
    for a, b in zip(expected, got):
        assert_same(a, b)


LONG = [
    {"role": "user", "content": "<image>\nTell me everything."},
    {
        "role": "assistant",
        "content": "The picture shows a red square on a cream background. " * 120,
    },
]


@pytest.fixture(scope="module")
def overlong_dataset(tmp_path_factory):
    from PIL import Image

    from energon_packing.testing.synth import encode_image

    image = encode_image(Image.new("RGB", (112, 112), (200, 40, 40)), "png")  # 16 image tokens
    long_items = [
        Conversation(
            key=f"long{i}",
            document={"messages": LONG, "images": ["img0.png"]},
            images={"img0.png": image},
        )
        for i in range(3)
    ]
    return make_dataset(
        tmp_path_factory.mktemp("overlong"),
        list(conversations(20, seed=3)) + long_items,
        per_shard=30,
    )


def test_overlong_drop_is_counted_with_keys(overlong_dataset):
    te = PackingTaskEncoder(tokenizer="bundled", max_input_seq_length=512, overlong="drop")
    packed = keys_of(loader_batches(overlong_dataset, te, buffer=8))
    assert {"long0", "long1", "long2"} <= set(te.stats.skipped_keys["overlong"])
    assert not {"long0", "long1", "long2"} & set(packed)
    assert te.stats.skipped["overlong"] + len(packed) == 23 - sum(
        n for r, n in te.stats.skipped.items() if r != "overlong"
    )


def test_overlong_truncate_keeps_images(overlong_dataset):
    te = PackingTaskEncoder(tokenizer="bundled", max_input_seq_length=512, overlong="truncate")
    batches = list(loader_batches(overlong_dataset, te, buffer=8))
    for batch in batches:
        check_batch(batch, te)
    assert {"long0", "long1", "long2"} <= set(keys_of(batches))
    assert te.stats.truncated >= 3 and te.stats.truncated_tokens > 0


def test_overlong_error_through_loader(overlong_dataset):
    # Energon re-raises our PackingError (a FatalSampleError) with the sample in front
    from megatron.energon.errors import FatalSampleError

    te = PackingTaskEncoder(tokenizer="bundled", max_input_seq_length=512, overlong="error")
    with pytest.raises(
        FatalSampleError,
        match=(
            r"sample '\w+': \d+ tokens \(\d+ padded to pad_multiple=1\) > max_input_seq_length=512\. "
            r"Set overlong='truncate' or 'drop', or raise max_input_seq_length"
        ),
    ):
        list(loader_batches(overlong_dataset, te, buffer=8))


def test_both_content_styles_through_the_loader(tmp_path):
    import random

    from energon_packing.testing.synth import draw, encode_image, random_scene

    image = encode_image(draw(random_scene(random.Random(5))), "jpg")
    llava = {
        "messages": [
            {"role": "user", "content": "<image>\nWhat is shown?"},
            {"role": "assistant", "content": "Shapes."},
        ],
        "images": ["img0.jpg"],
    }
    hf = {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image", "image": "img0.jpg"},
                    {"type": "text", "text": "\nWhat is shown?"},
                ],
            },
            {"role": "assistant", "content": [{"type": "text", "text": "Shapes."}]},
        ],
        "images": ["img0.jpg"],
    }
    items = [
        Conversation(key="llava", document=llava, images={"img0.jpg": image}),
        Conversation(key="hf", document=hf, images={"img0.jpg": image}),
    ]
    path = make_dataset(tmp_path, items)
    te = PackingTaskEncoder(tokenizer="bundled", max_input_seq_length=1024)
    (batch,) = list(loader_batches(path, te, buffer=8))
    check_batch(batch, te)
    cu = batch["cu_seqlens_padded"][0]
    ids = batch["input_ids"][0]
    first, second = ids[cu[0] : cu[1]], ids[cu[1] : cu[2]]
    length = int(batch["cu_seqlens"][0][1])
    assert torch.equal(first[:length], second[:length])


def test_images_are_decoded_only_for_the_emitted_pack(synth_dataset, monkeypatch):
    import energon_packing.encoding.builtin as module

    decoded = []
    real = module.patchify
    monkeypatch.setattr(
        module, "patchify", lambda data, cfg, **kw: decoded.append(1) or real(data, cfg, **kw)
    )
    te = PackingTaskEncoder(tokenizer="bundled", max_input_seq_length=2048)
    batch = next(iter(loader_batches(synth_dataset, te, buffer=32)))
    # the whole buffer (32 conversations, ~40 images) was encoded, only this pack decoded
    assert te.stats.read >= 32
    assert len(decoded) == len(batch["image_grid_thw"][0])


def test_without_packing_batches_are_ordinary_padded_rows(synth_dataset):
    te = PackingTaskEncoder(
        tokenizer="bundled", max_input_seq_length=8192, pad_multiple=8, unpacked=True
    )
    batches = list(loader_batches(synth_dataset, te, buffer=None, batch_size=4))
    assert sum(len(b["source_ids"]) for b in batches) == 120
    for batch in batches:
        assert "cu_seqlens" not in batch and "cu_seqlens_padded" not in batch
        rows, width = batch["input_ids"].shape
        lengths = batch["input_lengths"]
        assert width % 8 == 0 and width == -(-int(lengths.max()) // 8) * 8
        assert [len(keys) for keys in batch["source_ids"]] == [1] * rows
        for r in range(rows):
            n = int(lengths[r])
            assert not batch["padding_mask"][r, :n].any() and batch["padding_mask"][r, n:].all()
            assert (batch["token_mask"][r, n:] == 0).all() and batch["token_mask"][r, 0] == 0
            assert batch["position_ids"][r, :n].tolist() == list(range(n))
            grids = batch["image_grid_thw"][r]
            assert batch["pixel_values"][r].shape[0] == int(grids.prod(dim=1).sum())


def test_crude_route_gives_the_same_packs(synth_dataset):
    plain = PackingTaskEncoder(tokenizer="bundled", max_input_seq_length=2048)
    crude = PackingTaskEncoder(tokenizer="bundled", max_input_seq_length=2048)
    a = list(itertools.islice(loader_batches(synth_dataset, plain, buffer=16), 3))
    b = list(
        itertools.islice(
            loader_batches(synth_dataset, crude, buffer=16, dataset_config="dataset_crude.yaml"), 3
        )
    )
    for x, y in zip(a, b):
        assert x["source_ids"] == y["source_ids"]
        assert torch.equal(x["input_ids"], y["input_ids"])


def test_metadataset_example_applies_subflavor_loss_weight():
    from megatron.energon import WorkerConfig, get_loader, get_train_dataset

    te = PackingTaskEncoder(tokenizer="bundled", max_input_seq_length=2048)
    dataset = get_train_dataset(
        REPO / "configs" / "metadataset.yaml",
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0),
        batch_size=1,
        packing_buffer_size=16,
        task_encoder=te,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
    )
    weights = set()
    for batch in itertools.islice(get_loader(dataset), 40):
        check_batch(batch, te)
        mask, cu = batch["token_mask"][0], batch["cu_seqlens_padded"][0]
        for k, key in enumerate(batch["source_ids"][0]):
            trained = mask[cu[k] : cu[k + 1]]
            weight = float(trained[trained > 0].max()) if (trained > 0).any() else None
            weights.add(weight)
            dataset, _, name = key.partition("/")  # a blend: ids name their entry
            assert dataset in ("sample_data", "sample_data#2")
            if weight == 0.5:
                assert dataset == "sample_data#2", "only the second entry is down-weighted"
                assert int(name.removeprefix("sample")) >= 300, "the val shard"
    assert {0.5, 1.0} <= weights


def test_config_yamls_match_what_prepare_writes():
    for name, text in YAMLS.items():
        assert (REPO / "configs" / name).read_text() == text
        assert (SAMPLE_DATA / ".nv-meta" / name).read_text() == text


def energon(*args):
    code = "from megatron.energon.cli.main import main; main()"
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300, cwd=REPO
    )


@pytest.mark.slow  # Energon's CLI in subprocesses; the README's shell block runs them too
def test_energon_info_and_lint_on_the_sample_data():
    info = energon("info", str(SAMPLE_DATA))
    assert info.returncode == 0, info.stderr
    assert "ConversationSample <energon_packing.loader.samples.ConversationSample>" in info.stdout
    assert "`train`: 100%, 400 samples in 4 shards" in info.stdout
    lint = energon("lint", str(SAMPLE_DATA))
    output = lint.stdout + lint.stderr
    assert lint.returncode == 0
    # lint exits 0 even when samples fail (7.4.1): look for what its error handler prints
    for marker in ("Traceback", "Except ", "Validation failed", "failed:"):
        assert marker not in output, output[-2000:]
    assert "Checking the index files" in output


@pytest.fixture(scope="module")
def lossy_dataset(tmp_path_factory):
    """A prepared dataset whose ``.nv-meta/`` lists two conversations lost in the shards (as
    ``energon-packing prepare --allow-losses`` writes it)."""
    from helpers import make_dataset

    from energon_packing.incoming.shards import Finding, write_losses
    from energon_packing.testing.synth import conversations

    path = make_dataset(tmp_path_factory.mktemp("lossy"), conversations(24, seed=3), per_shard=8)
    lost = [
        Finding(
            shard="shards/data-00000.tar",
            offset=512 * i,
            key=f"ghost{i}",
            member=f"ghost{i}.json",
            reason="lost_in_shard",
            detail="after a lying header",
            lost=True,
        )
        for i in range(2)
    ]
    write_losses(path, lost, shards=3)
    return path


GHOSTS = [("ghost0", "lost_in_shard"), ("ghost1", "lost_in_shard")]


def _ghosts(batches):
    return [tuple(e) for b in batches for e in b["packing_skipped"] if e[1] == "lost_in_shard"]


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_losses_below_the_loader_are_reported_once(lossy_dataset, workers):
    te = PackingTaskEncoder(tokenizer="bundled", max_input_seq_length=2048, carry=True)
    batches = list(loader_batches(lossy_dataset, te, buffer=8, workers=workers))
    assert _ghosts(batches) == GHOSTS
    assert _ghosts(batches[:1]) == GHOSTS  # the first batch of global worker 0 carries them
    if not workers:
        assert te.stats.skipped["lost_in_shard"] == 2


@pytest.mark.slow
def test_losses_are_reported_by_rank_0_only(lossy_dataset):
    reported = []
    for rank in range(2):
        te = PackingTaskEncoder(tokenizer="bundled", max_input_seq_length=2048)
        reported += _ghosts(loader_batches(lossy_dataset, te, buffer=8, rank=rank, world_size=2))
    assert reported == GHOSTS


def test_a_restore_does_not_report_losses_twice(lossy_dataset):
    """The first batch carries the dataset's losses; a restore after it does not repeat them,
    a new pass (another epoch) does."""
    knobs = dict(tokenizer="bundled", max_input_seq_length=2048)
    te = PackingTaskEncoder(**knobs)
    loader = loader_batches(lossy_dataset, te, buffer=8, savable=True)
    it = iter(loader)
    first = [next(it)]
    assert te.stats.skipped["lost_in_shard"] == 2
    state = loader.save_state_rank()
    restored = loader_batches(lossy_dataset, PackingTaskEncoder(**knobs), buffer=8, savable=True)
    restored.restore_state_rank(state)
    assert _ghosts(first) == GHOSTS and _ghosts(restored) == []
    again = loader_batches(lossy_dataset, PackingTaskEncoder(**knobs), buffer=8, savable=True)
    assert _ghosts(again) == GHOSTS  # a new pass (another epoch) reports them again


@pytest.mark.parametrize("workers", [0, 2])
def test_a_loader_without_packing_buffer_is_refused_when_built(workers):
    """Packing cannot be silently off: the loader refuses at construction, naming the knob."""
    te = PackingTaskEncoder(tokenizer="bundled", max_input_seq_length=2048, carry=True)
    with pytest.raises(ValueError, match="without packing_buffer_size") as info:
        loader_batches(SAMPLE_DATA, te, buffer=None, batch_size=1, workers=workers)
    assert "packing_buffer_size=256" in str(info.value) and "unpacked=True" in str(info.value)
    both = PackingTaskEncoder(tokenizer="bundled", max_input_seq_length=2048, unpacked=True)
    with pytest.raises(ValueError, match="packing_buffer_size=16: drop one"):
        loader_batches(SAMPLE_DATA, both, buffer=16)
    # per-sample reads (no batching) stay open: the CLI and the reports read conversations so
    plain = PackingTaskEncoder(tokenizer="bundled", max_input_seq_length=2048)
    assert next(iter(loader_batches(SAMPLE_DATA, plain, buffer=None, batch_size=None))).__key__
