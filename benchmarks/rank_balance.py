"""Balance of the whole model's step cost across 8, 32 and 128 data-parallel ranks (issue 34
item 2; issue 25 item 3 for text), ranks simulated in one process through the loader's own
packing loop (``energon_packing.testing.ranks``).

The model is Qwen2-VL-7B as its published ``config.json`` gives it (decoder 28 x 3584 with
GQA and its vocabulary; vision encoder 32 x 1280, MLP 5120, patch 14, merge 2), read by
``energon_packing.encoding.costs.step_cost_model``. Mixes (``benchmarks/mixes.py``): ``images``
(image-heavy: 0-6 images per conversation at their own resolution), ``video`` (70 % one clip at
2 fps, the rest as ``images``), ``text`` (long-tail lengths). C = 4096 and 32768, buffer 256,
carry on; each rank holds enough conversations for about ``--steps`` packs per pass.

Per (mix, C, W), three emissions of the same streams (training regime: the loader repeats, so
every rank emits a pack at every step; cut after two passes):

* ``order``: selection order (``balance_window=0``);
* ``decoder``: balanced on the decoder's cost alone (what release 0.4 targeted);
* ``model``: balanced on the whole model's cost (decoder + vision encoder), this release.

Columns: mean / p95 over steps of max/mean across ranks of the modelled step cost of the whole
model; the same for the best order of the same packs (``bound``: each rank's packs sorted by
cost, step k holding every rank's k-th costliest; what is above it is in the packs a rank
holds, which no emission order changes); of the decoder alone (without the encoders), of
attention alone and of the vision encoder alone; the vision encoder's share of the cost; data packs against the lower bound; and
``lost``: conversations missing from one finite pass (``repeat=False``) of the ``model`` run
(must be 0). Targets (``model``): mean <= 1.03, p95 <= 1.06, packs <= bound + 0.5 %, lost 0.
Usage: ``python benchmarks/rank_balance.py [--ranks 8 32 128] [--mixes images video text]
[--capacities 4096 32768] [--window N] [--steps N]`` (default 150 packs a rank, 600 for text
above C=8192: ``LONG_TEXT``; a pool of 128 packs, twice the ranks past 64).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from mixes import MEDIA_MIXES, conversations

from energon_packing.encoding.costs import step_cost_model
from energon_packing.testing.configs import QWEN2_VL_7B
from energon_packing.testing.ranks import simulate_ranks, split_ranks

BUFFER = 256
PARTS = ("total", "decoder", "attention", "vision")
#: Packs a rank holds per pass for text at C=32768. There a pack is a few long conversations
#: whose attention spreads a pack's cost 1.4x, and over 150 packs the costliest ones a rank
#: happens to hold differ so much between 128 ranks that the best order of the same packs
#: misses the p95 target itself (bound 1.082-1.088): the sample, not the emission. Over 600
#: (a short run) the bound is 1.010/1.047, and balanced emission reaches 1.011/1.051.
LONG_TEXT = 600


def spread(costs: np.ndarray) -> tuple[float, float]:
    ratios = costs.max(axis=1) / np.maximum(costs.mean(axis=1), 1e-30)
    return float(ratios.mean()), float(np.percentile(ratios, 95))


def order_bound(costs: np.ndarray) -> tuple[float, float]:
    """:func:`spread` of the same packs in the best order any emission could give them:
    each rank's own packs sorted by cost, so step k holds every rank's k-th costliest (the
    order that minimises the sum over steps of the costliest rank). What is left above it
    is in the packs each rank holds, not in the order it emits them."""
    return spread(-np.sort(-costs, axis=0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[8, 32, 128])
    parser.add_argument("--mixes", nargs="+", default=list(MEDIA_MIXES), choices=MEDIA_MIXES)
    parser.add_argument("--capacities", type=int, nargs="+", default=[4096, 32768])
    parser.add_argument(
        "--window",
        type=int,
        default=None,
        help="balance_window (default: 128, twice the ranks past 64: the knob's documented setting)",
    )
    parser.add_argument(
        "--steps",
        type=int,
        default=None,
        help="packs per rank per pass (default: 150; 600 for text above C=8192, see LONG_TEXT)",
    )
    args = parser.parse_args()
    model = step_cost_model(QWEN2_VL_7B, source="Qwen2-VL-7B config.json")
    decoder_only = dataclasses.replace(model, vision=None)
    print(f"model: {model.describe()}")
    print(
        f"{'mix':<7}{'C':>6}{'W':>5} {'emission':<8}"
        + "".join(f"{name + ' mean/p95':>17}" for name in ("model", "bound", "no-enc", "attention"))
        + f"{'vision mean/p95':>17}{'vis share':>10}{'packs/rank':>11}{'vs bound':>10}"
        f"{'lost':>6}{'s':>6}"
    )
    failed = []
    for mix in args.mixes:
        for capacity in args.capacities:
            sample = conversations(mix, 2000, capacity, seed=0)
            mean_length = sum(n for n, _ in sample) / len(sample)
            packs = args.steps or (LONG_TEXT if mix == "text" and capacity > 8192 else 150)
            per_rank_n = max(500, math.ceil(packs * capacity / mean_length))
            for world in args.ranks:
                data = conversations(mix, world * per_rank_n, capacity, seed=1)
                per_rank = split_ranks(data, world)
                steps = 2 * sum(n for n, _ in data) // capacity // world
                pool = args.window or (2 * world if world > 64 else 128)
                for emission, window, target in (
                    ("order", 0, model),
                    ("decoder", pool, decoder_only),
                    ("model", pool, model),
                ):
                    start = time.perf_counter()
                    run = simulate_ranks(
                        per_rank,
                        capacity=capacity,
                        buffer_size=BUFFER,
                        balance_window=window,
                        steps=steps,
                        cost_model=target,
                    )
                    parts = run.step_parts(model)
                    cells = [spread(parts[part]) for part in PARTS]
                    cells.insert(1, order_bound(parts["total"]))
                    share = float((parts["vision"] / parts["total"]).mean())
                    counts = run.counts
                    over = sum(counts) / run.bound() - 1
                    lost = "-"
                    if emission == "model":  # one finite pass: every conversation exactly once
                        once = simulate_ranks(
                            per_rank,
                            capacity=capacity,
                            buffer_size=BUFFER,
                            balance_window=window,
                            cost_model=target,
                        )
                        held = [Counter(c for p in packs for c in p) for packs in once.packs]
                        lost = sum(  # missing, or packed twice
                            (Counter(r) - h).total() + (h - Counter(r)).total()
                            for r, h in zip(per_rank, held, strict=True)
                        )
                        mean, p95 = cells[0]
                        if mean > 1.03 or p95 > 1.06 or over > 0.005 or lost:
                            bound_mean, bound_p95 = cells[1]
                            held = bound_mean > 1.03 or bound_p95 > 1.06
                            failed.append(f"{mix} C={capacity} W={world}" + " (bound too)" * held)
                    seconds = time.perf_counter() - start
                    print(
                        f"{mix:<7}{capacity:>6}{world:>5} {emission:<8}"
                        + "".join(f"{a:>10.3f}/{b:<6.3f}" for a, b in cells)
                        + f"{share:>10.3f}{min(counts):>6}-{max(counts):<4}{100 * over:>+9.3f}%"
                        f"{lost!s:>6}{seconds:>6.0f}",
                        flush=True,
                    )
    print(
        "\nemission: order = selection order (balance_window=0); decoder = balanced on the "
        "decoder alone (release 0.4); model = balanced on the whole model. Columns: max/mean "
        "across ranks of the modelled step cost, mean/p95 over steps: of the whole model, of "
        "the same packs in the best order (bound: each rank's packs sorted by cost), of "
        "the decoder without the encoders (no-enc), of attention alone, of the vision encoder "
        "alone. "
        "vs bound: data packs against ceil(tokens / C). lost: conversations not in exactly one "
        "pack over one finite pass."
    )
    verdict = "all within" if not failed else f"OUTSIDE in {', '.join(failed)}"
    print(f"targets (model rows: mean <= 1.03, p95 <= 1.06, +0.5 %, lost 0): {verdict}")
    if any(f.endswith("(bound too)") for f in failed):
        # No emission order reaches a target its own bound misses: the packs a rank holds
        # differ (a few full-width conversations over a short run); a longer run evens them.
        print(
            "(bound too): the best order of the same packs misses as well, so the spread is in "
            "the packs each rank holds over this run, not in the emission; rerun with a larger "
            "--steps (text C=32768 W=8: 150 -> model 1.017/1.082, bound 1.017/1.080; "
            "600 -> model 1.005/1.019, bound 1.004/1.015)"
        )


if __name__ == "__main__":
    main()
