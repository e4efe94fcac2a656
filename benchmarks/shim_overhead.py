"""CPU cost of the trainer-side shim per microbatch at C=8192, next to trainer-side packing.

Loader packs of ~8 conversations each (random lengths, a few images), then per pack:
``prepacked_microbatches()`` with and without contract validation, both boundary modes, CP=1 and 2;
and, as the baseline in the same run, the trainer-side path squeezing the same conversations
from a padded batch.

    python benchmarks/shim_overhead.py [--packs 200]
"""

from __future__ import annotations

import argparse
import random
import time

import numpy as np
import torch

from energon_packing.packing import pack
from energon_packing.schema import IMAGE_GRID_THW, PIXEL_VALUES, Source, collate, layout
from energon_packing.trainer import pack_microbatches, prepacked_microbatches

CAPACITY = 8192
PAD_MULTIPLE = 8


def make_packs(count: int, seed: int) -> tuple[list[dict], list[dict]]:
    rng = random.Random(seed)
    lengths = [rng.randint(64, 2400) for _ in range(count * 6)]
    groups = pack([-(-n // PAD_MULTIPLE) * PAD_MULTIPLE for n in lengths], CAPACITY)[:count]
    prepacked, ordinary = [], []
    for g, group in enumerate(groups):
        sources = [
            Source(
                key=f"s{i}", input_ids=[5] * lengths[i], token_mask=[0.0] + [1.0] * (lengths[i] - 1)
            )
            for i in group
        ]
        p = layout(sources, width=CAPACITY, pad_multiple=PAD_MULTIPLE, pad_id=0)
        images = g % 3  # a few images on the first source, as pixels the shim passes through
        p.media = {
            PIXEL_VALUES: np.zeros((64 * images, 1176), dtype=np.float32),
            IMAGE_GRID_THW: np.asarray([[1, 8, 8]] * images, dtype=np.int64).reshape(-1, 3),
        }
        p.image_source_index = np.zeros(images, dtype=np.int64)
        prepacked.append(collate([p]))
        width = max(lengths[i] for i in group)
        ids = torch.zeros(len(group), width, dtype=torch.long)
        mask = torch.zeros(len(group), width)
        for r, i in enumerate(group):
            ids[r, : lengths[i]] = 5
            mask[r, 1 : lengths[i]] = 1.0
        ordinary.append(
            {
                "input_ids": ids,
                "input_lengths": torch.tensor([lengths[i] for i in group]),
                "token_mask": mask,
                "position_ids": torch.arange(width).repeat(len(group), 1),
                "source_ids": [[f"s{i}"] for i in group],
            }
        )
    return prepacked, ordinary


def per_pack_us(batches: list[dict], split, **kwargs) -> float:
    start = time.perf_counter()
    for batch in batches:
        split(batch, **kwargs)
    return (time.perf_counter() - start) / len(batches) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--packs", type=int, default=200)
    args = parser.parse_args()
    torch.set_num_threads(1)
    prepacked, ordinary = make_packs(args.packs, seed=0)
    sources = sum(len(b["source_ids"][0]) for b in prepacked) / len(prepacked)
    print(f"{len(prepacked)} packs at C={CAPACITY}, {sources:.1f} conversations each, 1 thread\n")
    prepacked_microbatches(prepacked[0], pad_multiple=PAD_MULTIPLE)  # warm up (PackedSeqParams)
    rows = [
        ("loader pack, validate, padded", dict(pad_multiple=PAD_MULTIPLE)),
        ("loader pack, no validate", dict(pad_multiple=PAD_MULTIPLE, validate=False)),
        ("loader pack, validate, real", dict(pad_multiple=PAD_MULTIPLE, boundary="real")),
        (
            "loader pack, validate, CP=2 rank 0",
            dict(pad_multiple=PAD_MULTIPLE, cp_size=2, cp_rank=0),
        ),
    ]
    print(f"{'path':<40}{'us per pack':>14}")
    for label, kwargs in rows:
        best = min(per_pack_us(prepacked, prepacked_microbatches, **kwargs) for _ in range(3))
        print(f"{label:<40}{best:>14.0f}")
    best = min(
        per_pack_us(ordinary, pack_microbatches, token_budget=CAPACITY, pad_multiple=PAD_MULTIPLE)
        for _ in range(3)
    )
    print(f"{'trainer-side packing (baseline)':<40}{best:>14.0f}")
    print("\ntarget: well under 1000 us per loader pack")


if __name__ == "__main__":
    main()
