"""Regenerates the bundled sample dataset (shards + .nv-meta) from a fixed seed.

    .venv/bin/python sample_data/regenerate.py

400 conversations (0-3 images each) from :mod:`energon_packing.testing.synth`, 4 shards of 100, then
``energon prepare`` (train: all shards; val and test: the last shard, so the default
``energon lint`` finds all three splits) and our dataset yamls. Beside them, ``llava/``: a small
LLaVA-style corpus (``llava.json`` + ``images/``) for the README's ``energon-packing convert``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from energon_packing.loader.prepare import prepare_dataset
from energon_packing.testing.corpora import llava_json
from energon_packing.testing.synth import conversations, write_shards

HERE = Path(__file__).resolve().parent
SEED = 2024
COUNT = 400


def main() -> None:
    for stale in (HERE / "shards", HERE / ".nv-meta"):
        shutil.rmtree(stale, ignore_errors=True)
    write_shards(HERE / "shards", conversations(COUNT, seed=SEED, prefix="sample"), per_shard=100)
    prepare_dataset(
        HERE,
        split_parts=[
            "train:shards/.*",
            "val:shards/shard-00003.tar",
            "test:shards/shard-00003.tar",
        ],
    )
    shutil.rmtree(HERE / "llava", ignore_errors=True)
    llava_json(HERE / "llava", 60, seed=SEED, images=6)
    print(f"wrote {COUNT} conversations to {HERE}, a LLaVA corpus to {HERE / 'llava'}")


if __name__ == "__main__":
    main()
