"""Blends keep identity (issue 25 item 1): two datasets with the same keys, one loader.

Generated datasets all name their conversations ``conv000000...``; in a metadataset blend every
source id and every skip reads ``<dataset>/<key>`` (the dataset's folder name; ``#2`` for a
second entry with the same name), so no two conversations share an id and a skip says which
dataset it came from. A single dataset keeps bare keys.
"""

from __future__ import annotations

import collections

import pytest
from helpers import loader_batches, make_dataset, raw_sample

from energon_packing import PackingTaskEncoder
from energon_packing.testing.synth import conversations

pytestmark = pytest.mark.energon

N = 30


@pytest.fixture(scope="module")
def blend(tmp_path_factory):
    """``alpha`` and ``beta``: N generated conversations each, the same keys, and each one
    malformed sample under the same key; a metadataset over both (and alpha a second time,
    at half loss weight)."""
    root = tmp_path_factory.mktemp("blend")
    for name, seed in (("alpha", 1), ("beta", 2)):
        make_dataset(
            root / name,
            conversations(N, seed=seed, prefix="conv"),
            raw=[raw_sample("broken", "{not json")],
        )
    (root / "blend.yaml").write_text(
        "__module__: megatron.energon\n"
        "__class__: MetadatasetV2\n"
        "splits:\n"
        "  train:\n"
        "    blend_epochized:\n"
        "      - repetitions: 1\n        path: alpha\n"
        "      - repetitions: 1\n        path: beta\n"
        "      - repetitions: 1\n        path: alpha\n        subflavors: {loss_weight: 0.5}\n"
    )
    return root


def _epoch(path, workers: int):
    te = PackingTaskEncoder(tokenizer="bundled", max_input_seq_length=4096, carry=True)
    ids, skipped = [], []
    for batch in loader_batches(path, te, buffer=16, workers=workers):
        ids += [key for pack in batch["source_ids"] for key in pack]
        skipped += batch.get("packing_skipped", [])
    return ids, skipped + [tuple(s) for s in te.stats.drain()]


@pytest.mark.parametrize("workers", [0, 2])
def test_colliding_keys_stay_apart_in_a_blend(blend, workers):
    ids, skipped = _epoch(blend / "blend.yaml", workers)
    keys = [f"conv{i:06d}" for i in range(N)]
    expected = {f"{name}/{key}" for name in ("alpha", "beta", "alpha#2") for key in keys}
    assert collections.Counter(ids) == collections.Counter(expected)  # exactly once, 3 x N ids
    assert sorted((key, reason) for key, reason in skipped) == [
        ("alpha#2/broken", "malformed_json"),
        ("alpha/broken", "malformed_json"),
        ("beta/broken", "malformed_json"),
    ]


def test_a_single_dataset_keeps_bare_keys(blend):
    ids, skipped = _epoch(blend / "alpha", 0)
    assert sorted(ids) == [f"conv{i:06d}" for i in range(N)]
    assert [(key, reason) for key, reason in skipped] == [("broken", "malformed_json")]


def test_a_restore_after_a_blended_shard_changed_names_that_shard(blend, tmp_path):
    """The checkpoint holds every blended dataset's shards (alpha once, though it is blended
    twice): cutting one of beta's refuses the restore by its path."""
    import shutil

    from energon_packing import ShardChangedError

    root = tmp_path / "blend"
    shutil.copytree(blend, root, copy_function=shutil.copy2)

    def loader():
        te = PackingTaskEncoder(tokenizer="bundled", max_input_seq_length=4096, carry=True)
        return loader_batches(root / "blend.yaml", te, buffer=16, savable=True)

    first = loader()
    batches = iter(first)
    next(batches)
    state = first.save_state_rank()
    del batches
    alpha, beta = (sorted((root / name / "shards").glob("*.tar")) for name in ("alpha", "beta"))
    assert f"[{alpha[0].stat().st_size}, {alpha[0].stat().st_mtime_ns}, " in repr(state)
    shard = beta[-1]
    shard.write_bytes(shard.read_bytes()[:1024])
    restored = loader()
    with pytest.raises(ShardChangedError, match=f"{shard} is 1,024 bytes where it was"):
        restored.restore_state_rank(state)
        next(iter(restored))
