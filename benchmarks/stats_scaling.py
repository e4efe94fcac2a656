"""``energon-packing stats``, ``check`` and ``prepare`` at 20k, 200k and 1M conversations: CPU
ms per conversation, wall seconds and peak RSS of each, side by side in one table.

What is measured, per size, each in a fresh child process that calls the library functions the
CLI command calls (not click):

``prepare``
    ``prepare_dataset`` (header scan, ``energon prepare`` with the CLI's one indexing worker,
    our yamls) on shards that were never prepared. CPU time and peak RSS include the indexing
    worker processes Energon forks (``os.times`` children, ``RUSAGE_CHILDREN``).
``stats``
    The read ``stats`` makes (``epoch`` without packing: tar, JSON, tokenizing), with Energon's
    open tar files as they ship (every header kept in ``members``; skipped above
    ``--unfixed-max``, it grows superlinearly) and with the package's fix
    (``loader.energon.keep_no_tar_members``).
``check``
    ``scan_dataset`` and ``format_scan``: every tar header of every shard.

Text-only generated conversations, 10k per shard (generating them is not counted). ms/conv is
CPU time (``time.process_time``) per conversation; RSS is the child's peak, ``VmHWM`` from
``/proc/self/status`` (``ru_maxrss`` of an exec'd child starts at its parent's peak).
Target (issue 25 item 2): per tool, the slowest ms/conversation within 1.3x of the fastest
across sizes, and flat RSS. Usage::

    python benchmarks/stats_scaling.py [--sizes 20000 200000 1000000] [--unfixed-max 200000]
        [--tools stats check prepare]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

TOOLS = ("stats", "check", "prepare")
SPLIT_PARTS = ["train:shards/.*"]


def generate(out: Path, n: int, per_shard: int = 10_000) -> None:
    """Writes ``n`` text conversations as tar shards under ``out/shards`` (not prepared)."""
    (out / "shards").mkdir(parents=True)
    for start in range(0, n, per_shard):
        with tarfile.open(out / "shards" / f"shard-{start // per_shard:05d}.tar", "w") as tar:
            for i in range(start, min(n, start + per_shard)):
                messages = [
                    {"role": "user", "content": f"question {i} " * 5},
                    {"role": "assistant", "content": f"answer {i} " * 8},
                ]
                doc = json.dumps({"messages": messages}).encode()
                info = tarfile.TarInfo(f"c{i:08d}.json")
                info.size = len(doc)
                tar.addfile(info, io.BytesIO(doc))


def _peak_mib() -> float:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM")) / 1024


def _report(n: int, cpu: float, wall: float, rss: float) -> None:
    print(json.dumps(dict(n=n, ms=1000 * cpu / n, wall=wall, rss=rss)))


def child_stats(path: str, fixed: bool) -> None:
    import energon_packing.loader.energon as internals

    if not fixed:  # as Energon ships: the encoder would install the fix, so skip that
        internals.keep_no_tar_members = lambda: None
    from energon_packing import PackingTaskEncoder
    from energon_packing.loader.loading import epoch

    te = PackingTaskEncoder(tokenizer="bundled", max_input_seq_length=4096)
    start, wall, n = time.process_time(), time.perf_counter(), 0
    for _ in epoch(path, te, packing_buffer_size=None, batch_size=None):
        n += 1
    _report(n, time.process_time() - start, time.perf_counter() - wall, _peak_mib())


def child_check(path: str) -> None:
    from energon_packing.incoming.shards import scan_dataset, shard_paths
    from energon_packing.tools.report import format_scan

    start, wall = time.process_time(), time.perf_counter()
    assert shard_paths(path)
    scan = scan_dataset(path)
    format_scan(scan, seconds=time.perf_counter() - wall, limit=50)
    cpu, wall = time.process_time() - start, time.perf_counter() - wall
    n = sum(s.samples for s in scan.shards)
    _report(n, cpu, wall, _peak_mib())


def child_prepare(path: str, n: int) -> None:
    import megatron.energon.cli.main  # noqa: F401  (imported by prepare_dataset: not timed)

    from energon_packing.incoming.prepare import prepare_dataset

    before, start, wall = os.times(), time.process_time(), time.perf_counter()
    prepare_dataset(path, split_parts=SPLIT_PARTS)  # the CLI's defaults: one indexing worker
    after = os.times()
    cpu = time.process_time() - start
    cpu += (after.children_user - before.children_user) + (
        after.children_system - before.children_system
    )
    wall = time.perf_counter() - wall
    workers = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # forked, no exec
    _report(n, cpu, wall, max(_peak_mib(), workers))


def run_child(*args: str) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--child", *args], check=True, capture_output=True, text=True
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def _cell(result: dict | None, wall: bool = True) -> str:
    if result is None:
        return f"{'(skipped)':>9} {'':>7} {'':>7}" if wall else f"{'(skipped)':>9} {'':>7}"
    text = f"{result['ms']:>9.3f} "
    if wall:
        text += f"{result['wall']:>7.1f} "
    return text + f"{result['rss']:>7.0f}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[20_000, 200_000, 1_000_000])
    parser.add_argument("--unfixed-max", type=int, default=200_000)
    parser.add_argument("--tools", nargs="+", choices=TOOLS, default=list(TOOLS))
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        what, path, *rest = args.child
        if what == "stats":
            child_stats(path, rest[0] == "fixed")
        elif what == "check":
            child_check(path)
        else:
            child_prepare(path, int(rest[0]))
        return
    tools = [t for t in TOOLS if t in args.tools]
    # columns: (label, key, show wall); stats as shipped only for comparison, no target
    columns = []
    if "stats" in tools:
        columns += [("stats as shipped", "shipped", False), ("stats (fixed)", "stats", True)]
    columns += [(t, t, True) for t in tools if t != "stats"]
    widths = [25 if wall else 17 for _, _, wall in columns]
    print(f"{'':>13} " + " | ".join(f"{label:^{w}}" for (label, _, _), w in zip(columns, widths)))
    print(
        f"{'conversations':>13} "
        + " | ".join(
            f"{'ms/conv':>9} {'wall s':>7} {'RSS MiB':>6}"
            if wall
            else f"{'ms/conv':>9} {'RSS MiB':>6}"
            for _, _, wall in columns
        ),
        flush=True,
    )
    rows: dict[str, list[dict]] = {key: [] for _, key, _ in columns}
    began = time.perf_counter()
    for n in args.sizes:
        with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR", "/tmp")) as tmp:
            data = Path(tmp) / "data"
            t = time.perf_counter()
            generate(data, n)
            print(f"  ({n:,}: generated in {time.perf_counter() - t:.0f} s)", file=sys.stderr)
            result: dict[str, dict | None] = {}
            if "prepare" in tools:  # measured on shards never prepared; stats reads its index
                result["prepare"] = run_child("prepare", str(data), str(n))
            elif "stats" in tools:
                from energon_packing.incoming.prepare import prepare_dataset

                prepare_dataset(data, split_parts=SPLIT_PARTS, num_workers=2)
            if "stats" in tools:
                result["shipped"] = (
                    run_child("stats", str(data), "shipped") if n <= args.unfixed_max else None
                )
                result["stats"] = run_child("stats", str(data), "fixed")
            if "check" in tools:
                result["check"] = run_child("check", str(data))
        for _, key, _ in columns:
            got = result[key]
            if got is not None and got["n"] != n:
                raise SystemExit(f"{key} at {n:,}: {got['n']:,} conversations counted")
        print(
            f"{n:>13,} " + " | ".join(_cell(result[key], wall) for _, key, wall in columns),
            flush=True,
        )
        for _, key, _ in columns:
            if result[key] is not None:
                rows[key].append(result[key])
    verdicts = []
    for tool in tools:
        ms = [r["ms"] for r in rows[tool]]
        rss = [r["rss"] for r in rows[tool]]
        ratio = max(ms) / min(ms)
        verdicts.append(
            f"{tool} {ratio:.2f} ({'meets' if ratio <= 1.3 else 'misses'}; "
            f"RSS {min(rss):.0f}-{max(rss):.0f} MiB)"
        )
    print(
        "slowest / fastest ms per conversation across sizes (target <= 1.3): " + ", ".join(verdicts)
    )
    print(f"total wall time {time.perf_counter() - began:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
