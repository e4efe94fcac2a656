"""Balance across 8, 32 and 128 data-parallel ranks (issue 25 item 3), ranks simulated in one
process through the loader's own packing loop (``energon_packing.testing.ranks``).

Long-tail conversations (lognormal, median 256, sigma 1.4), 500 per rank, C=4096, buffer
256, carry on. Two regimes:

* **training** (the loader repeats, Energon's default): every rank emits a pack at every step,
  so counts are equal by construction; streams cut after two passes' worth of steps.
* **one finite pass** (validation, ``repeat=False``): counts differ; ``align_ranks`` runs
  filler packs on the ranks that are out, and the fillers are what that costs.

Per row: mean and p95 over steps of max/mean modelled step cost across ranks (7B: h=4096, 32
layers; and h=1024 where attention weighs 4x more), the same for attention alone, packs per
rank, packs against the lower bound of what they hold. Targets (7B, training): mean <= 1.05,
p95 <= 1.10, counts equal, packs <= bound + 0.5 %. Usage: ``python benchmarks/rank_balance.py
[--ranks 8 32 128] [--per-rank 500] [--window 128]``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from mixes import generate

from energon_packing.packing.balance import StepCostModel
from energon_packing.testing.ranks import simulate_ranks, split_ranks

C = 4096


def spread(costs: np.ndarray) -> tuple[float, float]:
    ratios = costs.max(axis=1) / costs.mean(axis=1)
    return float(ratios.mean()), float(np.percentile(ratios, 95))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[8, 32, 128])
    parser.add_argument("--per-rank", type=int, default=500)
    parser.add_argument("--window", type=int, default=128)
    args = parser.parse_args()
    models = {"7B": StepCostModel(), "h1024": StepCostModel(hidden_size=1024, num_layers=16)}
    print(
        f"{'W':>4} {'regime':<9}{'window':>7} {'7B mean/p95':>13} {'h1024 mean/p95':>15} "
        f"{'attn mean/p95':>14} {'packs/rank':>11} {'fillers':>8} {'vs bound':>9} {'s':>5}"
    )
    for world in args.ranks:
        lengths = [max(16, n) for n in generate("longtail", world * args.per_rank, C, seed=1)]
        per_rank = split_ranks(lengths, world)
        two_passes = 2 * sum(lengths) // C // world
        for regime, steps in (("training", two_passes), ("finite", None)):
            for window in (0, args.window):
                start = time.perf_counter()
                run = simulate_ranks(
                    per_rank, capacity=C, buffer_size=256, balance_window=window, steps=steps
                )
                seconds = time.perf_counter() - start
                if steps is None:  # exactly once: every rank's slice, each conversation once
                    held = [sorted(n for p in packs for n in p) for packs in run.packs]
                    assert held == [sorted(r) for r in per_rank], "a conversation was lost"
                cells = [spread(run.step_costs(m)) for m in (models["7B"], models["h1024"], None)]
                counts = run.counts
                fillers = sum(run.steps - c for c in counts)
                over = sum(counts) / run.bound() - 1
                print(
                    f"{world:>4} {regime:<9}{window:>7} "
                    + " ".join(f"{a:>6.3f}/{b:<6.3f}" for a, b in cells)
                    + f" {min(counts):>4}-{max(counts):<5}  {fillers:>7} {100 * over:>+8.3f}%"
                    f" {seconds:>5.1f}",
                    flush=True,
                )
    print(
        "\nfillers: packs align_ranks runs on ranks that are out of data (a finite pass only); "
        "vs bound: data packs against ceil(tokens / C) of what they hold"
    )


if __name__ == "__main__":
    main()
