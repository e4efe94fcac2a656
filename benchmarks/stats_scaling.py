"""``energon-packing stats``' read at 20k, 200k and 1M conversations: ms per conversation and
peak RSS, with Energon's open tar files as they ship (every header kept in ``members``) and
with the package's fix (``loader.energon.keep_no_tar_members``), side by side in one run.

Text-only generated conversations (the cost measured is the read: tar, JSON, tokenizing), 10k
per shard, prepared once per size. Each read runs in a fresh process; target: ms/conversation
within 1.3x across sizes and flat RSS with the fix. Usage:
``python benchmarks/stats_scaling.py [--sizes 20000 200000 1000000] [--unfixed-max 200000]``
(the unfixed read grows superlinearly: it is skipped above ``--unfixed-max``).
"""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path


def generate(out: Path, n: int, per_shard: int = 10_000) -> None:
    from energon_packing.loader.prepare import prepare_dataset

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
    prepare_dataset(out, split_parts=["train:shards/.*"], num_workers=2)


def child(path: str, fixed: bool) -> None:
    import energon_packing.loader.energon as internals

    if not fixed:  # as Energon ships: the encoder would install the fix, so skip that
        internals.keep_no_tar_members = lambda: None
    from energon_packing import PackingTaskEncoder
    from energon_packing.loader.loading import epoch

    te = PackingTaskEncoder(tokenizer="bundled", max_input_seq_length=4096)
    start, n = time.process_time(), 0
    for _ in epoch(path, te, packing_buffer_size=None, batch_size=None):
        n += 1
    seconds = time.process_time() - start
    with open("/proc/self/status") as status:
        peak = next(int(line.split()[1]) for line in status if line.startswith("VmHWM")) / 1024
    print(json.dumps(dict(n=n, ms=1000 * seconds / n, rss=peak)))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[20_000, 200_000, 1_000_000])
    parser.add_argument("--unfixed-max", type=int, default=200_000)
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], args.child[1] == "fixed")
        return
    print(
        f"{'conversations':>13} {'as shipped ms/conv':>19} {'RSS MiB':>8} {'fixed ms/conv':>14} {'RSS MiB':>8}"
    )
    rows = []
    for n in args.sizes:
        with tempfile.TemporaryDirectory() as tmp:
            generate(Path(tmp) / "data", n)
            result = {}
            for mode in ("shipped", "fixed"):
                if mode == "shipped" and n > args.unfixed_max:
                    result[mode] = None
                    continue
                out = subprocess.run(
                    [sys.executable, __file__, "--child", str(Path(tmp) / "data"), mode],
                    check=True, capture_output=True, text=True,
                ).stdout  # fmt: skip
                result[mode] = json.loads(out.strip().splitlines()[-1])
        shipped, fixed = result["shipped"], result["fixed"]
        left = (
            f"{shipped['ms']:>19.3f} {shipped['rss']:>8.0f}"
            if shipped
            else f"{'(skipped)':>19} {'':>8}"
        )
        print(f"{n:>13,} {left} {fixed['ms']:>14.3f} {fixed['rss']:>8.0f}", flush=True)
        rows.append(fixed["ms"])
    print(
        f"fixed: slowest / fastest ms per conversation = {max(rows) / min(rows):.2f} (target <= 1.3)"
    )


if __name__ == "__main__":
    main()
