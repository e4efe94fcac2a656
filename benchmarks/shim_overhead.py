"""CPU cost of the trainer-side shim per microbatch at C=8192, next to trainer-side packing.

Loader packs of ~8 conversations each (random lengths, a few images), then per pack:
``microbatches()`` with and without contract validation, both boundary modes, CP=1 and 2;
and, as the baseline in the same run, the trainer-side path squeezing the same conversations
from a padded batch.

    python benchmarks/shim_overhead.py [--packs 200]
"""

from __future__ import annotations

import argparse
import random
import time

import torch

from energon_packing.algorithms import pack
from energon_packing.assemble import SourceTokens, assemble
from energon_packing.trainer import microbatches

CAPACITY = 8192
PAD_MULTIPLE = 8


def make_packs(count: int, seed: int) -> tuple[list[dict], list[dict]]:
    rng = random.Random(seed)
    lengths = [rng.randint(64, 2400) for _ in range(count * 6)]
    groups = pack([-(-n // PAD_MULTIPLE) * PAD_MULTIPLE for n in lengths], CAPACITY)[:count]
    prepacked, ordinary = [], []
    for g, group in enumerate(groups):
        sources = [
            SourceTokens(
                key=f"s{i}", input_ids=[5] * lengths[i], token_mask=[0.0] + [1.0] * (lengths[i] - 1)
            )
            for i in group
        ]
        p = assemble(sources, capacity=CAPACITY, pad_multiple=PAD_MULTIPLE, pad_id=0)
        pixels = torch.zeros(64 * (g % 3), 1176)
        grids = torch.tensor([[1, 8, 8]] * (g % 3), dtype=torch.int64).reshape(-1, 3)
        prepacked.append(
            {
                "input_ids": torch.from_numpy(p.input_ids)[None],
                "input_lengths": torch.tensor([CAPACITY]),
                "token_mask": torch.from_numpy(p.token_mask)[None],
                "cu_seqlens": [torch.from_numpy(p.cu_seqlens)],
                "cu_seqlens_padded": [torch.from_numpy(p.cu_seqlens_padded)],
                "position_ids": torch.from_numpy(p.position_ids)[None],
                "padding_mask": torch.from_numpy(p.padding_mask)[None],
                "source_ids": [p.source_ids],
                "pixel_values": [pixels],
                "image_grid_thw": [grids],
            }
        )
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


def per_pack_us(batches: list[dict], **kwargs) -> float:
    start = time.perf_counter()
    for batch in batches:
        microbatches(batch, **kwargs)
    return (time.perf_counter() - start) / len(batches) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--packs", type=int, default=200)
    args = parser.parse_args()
    torch.set_num_threads(1)
    prepacked, ordinary = make_packs(args.packs, seed=0)
    sources = sum(len(b["source_ids"][0]) for b in prepacked) / len(prepacked)
    print(f"{len(prepacked)} packs at C={CAPACITY}, {sources:.1f} conversations each, 1 thread\n")
    microbatches(prepacked[0], pad_multiple=PAD_MULTIPLE)  # warm up (imports, PackedSeqParams)
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
        best = min(per_pack_us(prepacked, **kwargs) for _ in range(3))
        print(f"{label:<40}{best:>14.0f}")
    best = min(
        per_pack_us(ordinary, token_budget=CAPACITY, pad_multiple=PAD_MULTIPLE) for _ in range(3)
    )
    print(f"{'trainer-side packing (baseline)':<40}{best:>14.0f}")
    print("\ntarget: well under 1000 us per loader pack")


if __name__ == "__main__":
    main()
