"""Throughput of ``energon-packing check`` (the tar-header scan of prepare) next to ``tar tf``.

Reads every header of every shard of the bundled sample data, then of a ~1 GB generated shard
set (WebDataset's layout: a pax header per member, one ``.json`` and 1-2 image parts of random
bytes per sample, 64 MB shards) written to a temporary folder and deleted afterwards. Both
tools run over the same files, warm in the page cache, best of ``--repeat``; MB/s counts the
shard bytes, so both skip the payloads (neither reads them).

    python benchmarks/check_shards.py [--gigabytes 1.0] [--repeat 3]
"""

from __future__ import annotations

import argparse
import io
import os
import random
import resource
import shutil
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path

from energon_packing.loader.shards import scan_dataset, shard_paths

SAMPLE_DATA = Path(__file__).resolve().parents[1] / "sample_data"


def generate(path: Path, *, total_bytes: int, shard_bytes: int = 64 << 20, seed: int = 0) -> int:
    """Shards of samples ``{key}.json`` + ``{key}.img{i}.jpg`` (random bytes); returns members."""
    rng = random.Random(seed)
    noise = os.urandom(1 << 20)
    written = members = shard = 0
    while written < total_bytes:
        target = path / f"shards/part-{shard:05d}.tar"
        target.parent.mkdir(parents=True, exist_ok=True)
        with tarfile.open(target, "w", format=tarfile.PAX_FORMAT) as tar:
            size = 0
            while size < shard_bytes and written + size < total_bytes:
                key = f"sample-{shard:05d}-{members:08d}"
                parts = [("json", rng.randint(300, 3000))]
                parts += [
                    (f"img{i}.jpg", rng.randint(20_000, 400_000)) for i in range(rng.randint(1, 2))
                ]
                for part, length in parts:
                    info = tarfile.TarInfo(f"{key}.{part}")
                    info.size, info.mtime = length, time.time()  # float mtime: a pax header
                    start = rng.randrange(0, len(noise) - length)
                    tar.addfile(info, io.BytesIO(noise[start : start + length]))
                    size += length + 1536
                    members += 1
        written += target.stat().st_size
        shard += 1
    return members


def best(fn, repeat: int) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process and its children), best of ``repeat``."""
    runs = []
    for _ in range(repeat):
        before = (
            resource.getrusage(resource.RUSAGE_SELF),
            resource.getrusage(resource.RUSAGE_CHILDREN),
        )
        start = time.perf_counter()
        fn()
        wall = time.perf_counter() - start
        after = (
            resource.getrusage(resource.RUSAGE_SELF),
            resource.getrusage(resource.RUSAGE_CHILDREN),
        )
        cpu = sum(a.ru_utime + a.ru_stime - b.ru_utime - b.ru_stime for a, b in zip(after, before))
        runs.append((wall, cpu))
    return min(r[0] for r in runs), min(r[1] for r in runs)


def tar_tf(path: Path) -> None:
    for name in shard_paths(path):
        subprocess.run(["tar", "tf", str(path / name)], stdout=subprocess.DEVNULL, check=True)


def measure(label: str, path: Path, repeat: int) -> None:
    scan = scan_dataset(path)  # warm the page cache, and count
    megabytes = scan.bytes / 1e6
    members = sum(s.members for s in scan.shards)
    ours = best(lambda: scan_dataset(path), repeat)
    theirs = best(lambda: tar_tf(path), repeat)
    print(
        f"{label:<22}{len(scan.shards):>7}{megabytes:>10,.0f}{members:>10,}"
        f"{megabytes / ours[0]:>12,.0f}{megabytes / theirs[0]:>12,.0f}{ours[0] / theirs[0]:>8.2f}x"
        f"{ours[1] / theirs[1]:>8.2f}x{len(scan.findings):>10}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gigabytes", type=float, default=1.0)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(
        f"{os.cpu_count()} CPUs; {subprocess.run(['tar', '--version'], capture_output=True, text=True).stdout.splitlines()[0]}"
    )
    print(
        f"{'shards':<22}{'files':>7}{'MB':>10}{'members':>10}{'check MB/s':>12}{'tar tf MB/s':>12}"
        f"{'wall':>9}{'cpu':>9}{'findings':>10}"
    )
    measure("bundled sample_data", SAMPLE_DATA, args.repeat)
    folder = Path(tempfile.mkdtemp(prefix="check-shards-"))
    try:
        start = time.perf_counter()
        generate(folder, total_bytes=int(args.gigabytes * 1e9))
        made = time.perf_counter() - start
        measure(f"generated {args.gigabytes:g} GB", folder, args.repeat)
        print(f"(generated in {made:.1f} s; wall/cpu: check over tar tf, 1.00x = as fast)")
    finally:
        shutil.rmtree(folder)


if __name__ == "__main__":
    main()
