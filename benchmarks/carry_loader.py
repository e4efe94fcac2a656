"""Carry and balanced emission through the real Energon loader (7.4.1).

Generated shards whose token lengths follow the four mixes of ``benchmarks/mixes.py``
(text-only conversations of exact lengths under the bundled tokenizer; lengths below the
17-token ChatML frame are raised to 17). Side by side in one run:

1. packs over the lower bound and loader conversations/s, Energon's own chunk packing (our
   default algorithm, ``carry=False``) vs our carry stage, buffers 64 / 256 / 1024;
2. 8 data-parallel ranks (``WorkerConfig(rank=r, world_size=8)``): mean over steps of the
   max/mean attention cost across ranks, for packs in random order, in plain selection order,
   and with ``balance_window`` W; pack counts per rank for each.

    python benchmarks/carry_loader.py [--samples 8192] [--capacities 4096,8192]
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import sys
import tempfile
import time
import warnings
from pathlib import Path

os.environ.setdefault("TQDM_DISABLE", "1")
warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)
sys.path.insert(0, str(Path(__file__).resolve().parent))

from mixes import MIXES, generate  # noqa: E402

from energon_packing import PackingTaskEncoder  # noqa: E402
from energon_packing.incoming.prepare import prepare_dataset  # noqa: E402
from energon_packing.loader.loading import epoch  # noqa: E402
from energon_packing.packing import lower_bound  # noqa: E402
from energon_packing.packing.balance import attention_cost, imbalance  # noqa: E402
from energon_packing.testing.synth import sized_conversations, write_shards  # noqa: E402

MIN_LENGTH = 17


def build(path: Path, lengths: list[int]) -> Path:
    write_shards(path / "shards", sized_conversations(lengths), per_shard=4096)
    prepare_dataset(path, split_parts=["train:shards/.*"])
    return path


def run_loader(
    path: Path, capacity: int, buffer: int, *, rank: int = 0, world_size: int = 1, **knobs
):
    te = PackingTaskEncoder(max_input_seq_length=capacity, tokenizer="bundled", **knobs)
    loader = epoch(path, te, packing_buffer_size=buffer, rank=rank, world_size=world_size)
    start = time.perf_counter()
    costs, conversations = [], 0
    for batch in loader:
        cu = batch["cu_seqlens"][0]
        costs.append(attention_cost((cu[1:] - cu[:-1]).tolist()))
        conversations += len(batch["source_ids"][0])
    return costs, conversations / (time.perf_counter() - start)


def quality(args, tmp: Path) -> None:
    print("1. Packs over the lower bound (%) and loader conversations/s, through the real loader")
    print(
        f"   {args.samples} conversations per mix, num_workers=0, batch_size=1, algorithm subset_fill\n"
    )
    head = f"   {'mix':<9}{'C':>6}" + "".join(
        f"{f'N={b} chunk':>15}{'carry':>9}" for b in (64, 256, 1024)
    )
    print(head + f"{'conv/s chunk':>14}{'carry':>8}")
    worst = {64: 0.0, 256: 0.0, 1024: 0.0}
    speed = {"chunk": [], "carry": []}
    for capacity in args.capacities:
        for mix in MIXES:
            lengths = [max(MIN_LENGTH, n) for n in generate(mix, args.samples, capacity, seed=0)]
            path = build(tmp / f"{mix}-{capacity}", lengths)
            bound = lower_bound(lengths, capacity)
            cells, rates = [], {"chunk": [], "carry": []}
            for buffer in (64, 256, 1024):
                for mode in ("chunk", "carry"):
                    costs, rate = run_loader(path, capacity, buffer, carry=mode == "carry")
                    over = 100 * (len(costs) / bound - 1)
                    cells.append(f"{over:>+{15 if mode == 'chunk' else 9}.2f}")
                    rates[mode].append(rate)
                    if mode == "carry":
                        worst[buffer] = max(worst[buffer], over)
            for mode in rates:
                speed[mode].append(sum(rates[mode]) / len(rates[mode]))
            print(
                f"   {mix:<9}{capacity:>6}"
                + "".join(cells)
                + f"{speed['chunk'][-1]:>14.0f}{speed['carry'][-1]:>8.0f}",
                flush=True,
            )
    ratio = sum(speed["carry"]) / sum(speed["chunk"])
    print(
        f"\n   carry worst mix: N=64 {worst[64]:+.2f} % (target <= +2 %), N=256 {worst[256]:+.2f} % "
        f"(target <= +0.3 %), N=1024 {worst[1024]:+.2f} %"
    )
    print(f"   carry / chunk throughput = {ratio:.3f} (target >= 0.95)\n")


def balance(args, tmp: Path) -> None:
    ranks, capacity, buffer = 8, args.capacities[0], 256
    print(
        f"2. Cost balance across {ranks} data-parallel ranks (C={capacity}, buffer {buffer}, carry on):"
    )
    print("   mean over steps of max/mean attention cost (sum of squared lengths) across ranks\n")
    windows = args.windows
    print(
        f"   {'mix':<9}{'random':>8}{'as selected':>13}"
        + "".join(f"{f'W={w}':>9}" for w in windows)
        + "   packs per rank (W=0 / largest W)"
    )
    for mix in MIXES:
        lengths = [
            max(MIN_LENGTH, n) for n in generate(mix, ranks * args.per_rank, capacity, seed=1)
        ]
        path = build(tmp / f"balance-{mix}", lengths)
        row, counts = [], {}
        for window in (0, *windows):
            per_rank = [
                run_loader(
                    path,
                    capacity,
                    buffer,
                    rank=r,
                    world_size=ranks,
                    carry=True,
                    balance_window=window,
                )[0]
                for r in range(ranks)
            ]
            counts[window] = [len(c) for c in per_rank]
            steps = min(counts[window])
            if window == 0:
                shuffled = [random.Random(r).sample(c, len(c)) for r, c in enumerate(per_rank)]
                row.append(imbalance([[s[t] for s in shuffled] for t in range(steps)]))
            row.append(imbalance([[c[t] for c in per_rank] for t in range(steps)]))
        print(
            f"   {mix:<9}{row[0]:>8.3f}{row[1]:>13.3f}"
            + "".join(f"{v:>9.3f}" for v in row[2:])
            + f"   {sum(counts[0])} / {sum(counts[windows[-1]])}",
            flush=True,
        )
    print("\n   target: <= 1.10 with balancing, pack count unchanged")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=8192)
    parser.add_argument(
        "--capacities", type=lambda s: [int(x) for x in s.split(",")], default=[4096, 8192]
    )
    parser.add_argument("--per-rank", type=int, default=3000, help="conversations per rank, part 2")
    parser.add_argument(
        "--windows", type=lambda s: [int(x) for x in s.split(",")], default=[32, 128]
    )
    parser.add_argument("--skip-quality", action="store_true")
    parser.add_argument("--skip-balance", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if not args.skip_quality:
            quality(args, Path(tmp))
        if not args.skip_balance:
            balance(args, Path(tmp))


if __name__ == "__main__":
    main()
