"""The training loader over many epochs: RSS and CPU per 1,000 packs stay flat.

A repeating dataset (``get_train_dataset``'s default ``repeat=True``: an infinite stream) read
through Energon's loader with ``PackingTaskEncoder(tokenizer="bundled",
max_input_seq_length=4096, carry=True)``, packing buffer 256, batch size 1, for at least
``--epochs`` passes, with ``num_workers`` 0 and 2 (each in a fresh process, so the settings share
no memory). Text-only generated conversations (1-3 turns, a lognormal number of words per
message, so a pack holds several), in 5 shards, prepared once. Epochs are counted from the
packs' ``source_ids``; the run stops at the first 1,000-pack boundary past ``--epochs`` passes.

Every 1,000 packs: the main process's VmRSS and the sum of the workers' (from ``/proc``; RSS
counts pages shared with the main process in each worker) and the CPU seconds those packs cost
(main ``time.process_time`` plus the workers' utime + stime). Target: flat, i.e. the RSS slope
over the windows after the first epoch ~0 MiB per 1,000 packs and CPU last/first window
within 1.3x. Usage:
``python benchmarks/long_run.py [--conversations 5000] [--epochs 10] [--workers 0 2]
[--rounds 3]`` (``--rounds``: the settings run this often, interleaved; each ratio to 0 workers
is taken within a round and its median printed, as one run swings by +-20 % on a shared
machine).
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from _proc import children, cpu_seconds, status_mib  # benchmarks/_proc.py (this script's folder)

WINDOW = 1000  # packs per measurement
SHARDS = 5
REPO = Path(__file__).resolve().parents[1]
#: The media mixes: the bundled datasets, already prepared, and their conversation counts.
MIXES = {
    "text": None,
    "images": (REPO / "sample_data", 400),
    "videos": (REPO / "sample_data" / "video", 32),
}
#: What the issue measured before the handoff was fixed (text, CPU s per 1,000 packs).
BASELINE = "0 workers 4.2-4.7, 2 workers 7.6-9.5 (ratio 1.8-2.0)"
WORDS = (
    "bread", "dough", "flour", "water", "salt", "yeast", "oven", "crumb", "crust", "rise",
    "the", "a", "of", "and", "to", "in", "is", "that", "it", "for", "slow", "cool", "kitchen",
    "flavour", "weigh", "measure", "cup", "result", "ratio", "loaf", "sandwich", "percent",
    "time", "effort", "garden", "soil", "seed", "plant", "light", "shade", "river", "stone",
    "bridge", "train", "station", "ticket", "morning", "evening",
)  # fmt: skip


def generate(out: Path, n: int, seed: int = 0) -> None:
    """``n`` text-only conversations in ``SHARDS`` tar shards, prepared as a train split."""
    from energon_packing.incoming.prepare import prepare_dataset

    rng = random.Random(seed)
    (out / "shards").mkdir(parents=True)
    per_shard = math.ceil(n / SHARDS)
    for shard, start in enumerate(range(0, n, per_shard)):
        with tarfile.open(out / "shards" / f"shard-{shard:05d}.tar", "w") as tar:
            for i in range(start, min(n, start + per_shard)):
                messages = []
                for _ in range(rng.randint(1, 3)):
                    for role in ("user", "assistant"):
                        words = min(400, max(1, int(rng.lognormvariate(4.6, 1.0))))
                        text = " ".join(rng.choice(WORDS) for _ in range(words))
                        messages.append({"role": role, "content": text})
                doc = json.dumps({"messages": messages}).encode()
                info = tarfile.TarInfo(f"c{i:08d}.json")
                info.size = len(doc)
                tar.addfile(info, io.BytesIO(doc))
    prepare_dataset(out, split_parts=["train:shards/.*"], num_workers=2)


def child(
    path: str, workers: int, conversations: int, epochs: int, window: int, least: int
) -> None:
    """Iterates the repeating loader, printing one ``ROW {json}`` line per ``window`` packs,
    until ``epochs`` passes and ``least`` windows are done."""
    import warnings

    from megatron.energon import WorkerConfig, get_loader, get_train_dataset

    from energon_packing import PackingTaskEncoder

    te = PackingTaskEncoder(tokenizer="bundled", max_input_seq_length=4096, carry=True)
    dataset = get_train_dataset(
        path,
        split_part="train",
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=workers),
        batch_size=1,
        packing_buffer_size=256,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        task_encoder=te,
    )
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*pin_memory.*")
        loader = get_loader(dataset)
    packs = landed = 0
    worker_cpu: dict[int, float] = {}  # at the previous window, per worker pid
    main_cpu, wall = time.process_time(), time.perf_counter()
    for batch in loader:
        packs += 1
        landed += sum(len(ids) for ids in batch["source_ids"])
        if packs % window:
            continue
        now_cpu, now_wall = time.process_time(), time.perf_counter()
        pids = children() if workers else []
        cpu = {pid: cpu_seconds(pid) for pid in pids}
        row = dict(
            packs=packs,
            epoch=landed / conversations,
            main_rss=status_mib("self", "VmRSS"),
            workers_rss=sum(status_mib(pid, "VmRSS") for pid in pids),
            main_cpu=now_cpu - main_cpu,
            workers_cpu=sum(c - worker_cpu.get(pid, 0.0) for pid, c in cpu.items()),
            wall=now_wall - wall,
            processes=len(pids),
        )
        print("ROW " + json.dumps(row), flush=True)
        worker_cpu, main_cpu, wall = cpu, now_cpu, now_wall
        if landed >= epochs * conversations and packs >= least * window:
            break
    import multiprocessing

    for process in multiprocessing.active_children():  # skip the ~5 s/worker teardown
        process.terminate()
        process.join(timeout=5)


def slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of ``ys`` over ``xs`` (0 for fewer than two points)."""
    if len(xs) < 2:
        return 0.0
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den else 0.0


def run(path: Path, workers: int, conversations: int, args: argparse.Namespace) -> float:
    """One loader setting in a fresh process; its CPU seconds per 1,000 packs after the first
    window (start-up and the first buffer fill left out)."""
    print(f"\nnum_workers={workers}")
    print(
        f"{'packs':>7} {'epoch':>6} {'main RSS MiB':>13} {'workers RSS MiB':>16} "
        f"{'CPU s main':>11} {'workers':>8} {'total':>7} {'wall s':>7}"
    )
    command = [sys.executable, __file__, "--child", str(path), str(workers)]
    command += ["--conversations", str(conversations), "--epochs", str(args.epochs)]
    command += ["--window", str(args.window), "--min-windows", str(args.min_windows)]
    env = {**os.environ, "TQDM_DISABLE": "1"}
    rows = []
    with tempfile.TemporaryFile("w+") as stderr:
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=stderr, text=True, env=env
        )
        for line in process.stdout:
            if not line.startswith("ROW "):
                continue
            r = json.loads(line[4:])
            r["cpu"] = r["main_cpu"] + r["workers_cpu"]
            rows.append(r)
            print(
                f"{r['packs']:>7,} {r['epoch']:>6.2f} {r['main_rss']:>13.1f} "
                f"{r['workers_rss']:>16.1f} {r['main_cpu']:>11.2f} {r['workers_cpu']:>8.2f} "
                f"{r['cpu']:>7.2f} {r['wall']:>7.2f}",
                flush=True,
            )
        if process.wait():
            stderr.seek(0)
            sys.exit(f"child failed ({process.returncode}):\n{stderr.read()[-4000:]}")
    if not rows:
        return math.nan
    first, last = rows[0], rows[-1]
    after = [r for r in rows if r["packs"] > args.window and r["epoch"] > 1.0]
    xs = [r["packs"] / 1000 for r in after]
    main_slope = slope(xs, [r["main_rss"] for r in after])
    workers_slope = slope(xs, [r["workers_rss"] for r in after])
    steady = rows[1:] or rows
    per_thousand = 1000 * sum(r["cpu"] for r in steady) / (args.window * len(steady))
    scale = 1000 / args.window
    print(
        f"summary num_workers={workers}: {last['packs']:,} packs, {last['epoch']:.2f} epochs; "
        f"RSS main {first['main_rss']:.1f} -> {last['main_rss']:.1f} MiB, workers "
        f"{first['workers_rss']:.1f} -> {last['workers_rss']:.1f} MiB; CPU s/1,000 packs "
        f"{scale * first['cpu']:.2f} -> {scale * last['cpu']:.2f} (last/first "
        f"{last['cpu'] / first['cpu']:.2f}), {per_thousand:.2f} after the first window; "
        f"RSS slope after epoch 1 (MiB per 1,000 packs, {len(after)} windows): main "
        f"{main_slope:+.3f}, workers {workers_slope:+.3f}"
    )
    print("target: flat (RSS slope ~0 MiB per 1,000 packs, CPU last/first within 1.3x)")
    return per_thousand


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mixes", nargs="+", default=list(MIXES), choices=MIXES)
    parser.add_argument("--conversations", type=int, default=5000, help="text mix only")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--window", type=int, default=WINDOW, help="packs per measurement")
    parser.add_argument("--min-windows", type=int, default=3)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    parser.add_argument(
        "--rounds", type=int, default=1, help="the worker settings this often, interleaved"
    )
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(
            args.child[0],
            int(args.child[1]),
            args.conversations,
            args.epochs,
            args.window,
            args.min_windows,
        )
        return
    start = time.perf_counter()
    cpu: dict[tuple[str, int], list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for mix in args.mixes:
            if mix == "text":
                path, conversations = Path(tmp) / "data", args.conversations
                generate(path, conversations)
            else:
                path, conversations = MIXES[mix]
            print(
                f"\n== {mix}: {conversations:,} conversations ({path.name if mix != 'text' else 'generated'}),"
                f" >= {args.epochs} epochs and >= {args.min_windows} windows of {args.window} packs, "
                f"packs of 4096 tokens, carry=True, packing buffer 256, batch size 1"
            )
            for k in range(args.rounds):
                if args.rounds > 1:
                    print(f"\n-- round {k + 1} of {args.rounds}")
                for workers in args.workers:
                    cpu.setdefault((mix, workers), []).append(
                        run(path, workers, conversations, args)
                    )
    if 0 in args.workers:
        # each round's settings ran back to back: the ratio is taken within a round (the
        # machine's speed drifts between rounds), its median over the rounds reported
        print(
            f"\nCPU s per 1,000 packs after the first window (main + workers; medians of "
            f"{args.rounds} interleaved round(s))"
        )
        print(
            f"{'mix':<8}"
            + "".join(f"{f'{w} workers':>11}" for w in args.workers)
            + "   ratio vs 0, median (per round) (target <= 1.2)"
        )
        for mix in args.mixes:
            line = "".join(f"{statistics.median(cpu[mix, w]):>11.2f}" for w in args.workers)
            ratios = []
            for w in (w for w in args.workers if w):
                each = [c / none for c, none in zip(cpu[mix, w], cpu[mix, 0])]
                per = ", ".join(f"{r:.2f}" for r in each)
                ratios.append(f"{statistics.median(each):.2f} ({per})")
            print(f"{mix:<8}{line}   {'; '.join(ratios)}")
        print(f"baseline (issue 34, text): {BASELINE}")
    print(f"\ntotal wall time {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
