"""Packs over the lower bound, efficiency and packer time: every algorithm, chunk and carry.

The four mixes of ``benchmarks/mixes.py`` (generated from seeds), C in {4096, 8192}, buffers
{64, 256, 1024, offline}; mean of 3 seeds. Peers' algorithms in chunk mode (what Energon does
with them today) are the baseline rows, measured in the same run.

    python benchmarks/packing_quality.py               # full table (~5 min on 2 cores)
    python benchmarks/packing_quality.py --quick       # 4,096 samples, 1 seed
    python benchmarks/packing_quality.py --csv out.csv # plus every measurement, long format
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from mixes import MIXES, generate

from energon_packing.packing.algorithms import (
    ALGORITHMS,
    DEFAULT_ALGORITHM,
    lower_bound,
    pack,
    pack_stream,
)

BUFFERS = (64, 256, 1024, 0)  # 0 = offline: one call over everything
CAPACITIES = (4096, 8192)
TARGETS = {64: 2.0, 256: 0.3, 1024: 0.1}  # default + carry, packs over the bound, every mix


def measure(lengths, capacity, buffer, algorithm, carry):
    start = time.perf_counter()
    if buffer:
        packs = list(
            pack_stream(lengths, capacity, buffer_size=buffer, algorithm=algorithm, carry=carry)
        )
    else:
        packs = pack(lengths, capacity, algorithm=algorithm)
    elapsed = time.perf_counter() - start
    return len(packs), elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=32768)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="4,096 samples, 1 seed")
    parser.add_argument("--csv", type=Path, help="write every measurement here")
    args = parser.parse_args()
    if args.quick:
        args.samples, args.seeds = 4096, 1

    rows = []  # (algorithm, mode, buffer, mix, capacity, over %, efficiency %, ms per 1024)
    configs = [(a, False, b) for a in ALGORITHMS for b in BUFFERS]
    configs += [(a, True, b) for a in ALGORITHMS for b in BUFFERS if b]
    for mix in MIXES:
        for capacity in CAPACITIES:
            data = [generate(mix, args.samples, capacity, seed=s) for s in range(args.seeds)]
            bounds = [lower_bound(d, capacity) for d in data]
            for algorithm, carry, buffer in configs:
                over = eff = secs = 0.0
                for lengths, bound in zip(data, bounds):
                    packs, elapsed = measure(lengths, capacity, buffer, algorithm, carry)
                    over += 100 * (packs / bound - 1)
                    eff += 100 * sum(lengths) / (packs * capacity)
                    secs += elapsed
                k = args.seeds
                ms = 1000 * secs / k / args.samples * 1024
                mode = "offline" if not buffer else ("carry" if carry else "chunk")
                rows.append((algorithm, mode, buffer, mix, capacity, over / k, eff / k, ms))
            print(f"  measured {mix} C={capacity}", file=sys.stderr, flush=True)

    print(
        f"\nPacks over the lower bound, % (mean over {len(MIXES)} mixes x {len(CAPACITIES)} "
        f"capacities [worst]); efficiency = real tokens / (packs * C); {args.samples} samples, "
        f"mean of {args.seeds} seed(s). 'chunk' = Energon 7.4.1 (pack the buffer, empty it)."
    )
    head = (
        f"{'algorithm':<30} {'mode':<7}"
        + "".join(f"{('N=' + str(b)) if b else 'offline':>17}" for b in BUFFERS)
        + f"{'eff% N=256':>11}{'ms/1024 N=256':>15}{'offline s':>10}"
    )
    print(head)
    print("-" * len(head))
    for carry in (False, True):
        for algorithm in ALGORITHMS:
            mode = "carry" if carry else "chunk"
            cells = []
            for buffer in BUFFERS:
                sel = [
                    r
                    for r in rows
                    if r[0] == algorithm
                    and r[2] == buffer
                    and (r[1] == mode or (not buffer and not carry))
                ]
                if not sel or (carry and not buffer):
                    cells.append(f"{'':>17}")
                    continue
                mean = sum(r[5] for r in sel) / len(sel)
                cells.append(f"{mean:>+9.2f} [{max(r[5] for r in sel):>+5.2f}]")
            mid = [r for r in rows if r[0] == algorithm and r[1] == mode and r[2] == 256]
            off = [r for r in rows if r[0] == algorithm and r[2] == 0]
            eff = sum(r[6] for r in mid) / len(mid)
            ms = sum(r[7] for r in mid) / len(mid)
            off_s = max(r[7] for r in off) * args.samples / 1024 / 1000
            tag = " *" if algorithm == DEFAULT_ALGORITHM else ""
            print(
                f"{algorithm + tag:<30} {mode:<7}"
                + "".join(cells)
                + f"{eff:>11.2f}{ms:>15.2f}{off_s if not carry else float('nan'):>10.2f}"
            )

    print(
        f"\nDefault ({DEFAULT_ALGORITHM}) + carry vs first-fit-decreasing chunk (baseline), "
        "packs over the bound %, per mix:"
    )
    print(
        f"{'mix':<10}{'C':>6}"
        + "".join(f"{'N=' + str(b):>18}" for b in BUFFERS if b)
        + f"{'offline':>18}"
    )
    for mix in MIXES:
        for capacity in CAPACITIES:

            def get(algorithm, mode, buffer):
                return next(
                    r[5]
                    for r in rows
                    if r[0] == algorithm
                    and r[1] == mode
                    and r[2] == buffer
                    and r[3] == mix
                    and r[4] == capacity
                )

            cells = [
                f"{get(DEFAULT_ALGORITHM, 'carry', b):>+7.2f} vs {get('first_fit_decreasing', 'chunk', b):>+6.2f}"
                for b in BUFFERS
                if b
            ]
            cells.append(
                f"{get(DEFAULT_ALGORITHM, 'offline', 0):>+7.2f} vs "
                f"{get('first_fit_decreasing', 'offline', 0):>+6.2f}"
            )
            print(f"{mix:<10}{capacity:>6}" + "".join(f"{c:>18}" for c in cells))

    print("\nTargets (default + carry, worst mix):")
    for buffer, target in TARGETS.items():
        worst = max(
            r[5] for r in rows if r[0] == DEFAULT_ALGORITHM and r[1] == "carry" and r[2] == buffer
        )
        slowest = max(r[7] for r in rows if r[0] == DEFAULT_ALGORITHM and r[2] == buffer)
        print(
            f"  N={buffer:<5} {worst:+.2f} % (target <= +{target} %)  "
            f"{'ok' if worst <= target else 'MISSED'};  slowest {slowest:.1f} ms / 1024 "
            f"(target <= 10)  {'ok' if slowest <= 10 else 'MISSED'}"
        )
    vlm = max(r[5] for r in rows if r[0] == DEFAULT_ALGORITHM and r[2] == 0 and r[3] == "vlm")
    off = max(r[7] for r in rows if r[0] == DEFAULT_ALGORITHM and r[2] == 0)
    off_s = off * args.samples / 1024 / 1000
    print(
        f"  offline vlm {vlm:+.2f} % (target <= +0.1 %)  {'ok' if vlm <= 0.1 else 'MISSED'};  "
        f"offline {args.samples} samples in {off_s:.2f} s (target < 1 s for 32,768)"
    )

    if args.csv:
        with args.csv.open("w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(
                [
                    "algorithm",
                    "mode",
                    "buffer",
                    "mix",
                    "capacity",
                    "over_lower_bound_pct",
                    "efficiency_pct",
                    "ms_per_1024",
                ]
            )
            writer.writerows(rows)


if __name__ == "__main__":
    main()
