"""``energon-packing convert`` against plain ``tar`` of the same files, and its memory.

A generated LLaVA corpus (JSON list + an image folder; every record but each third has one
image, ~6-40 KB) at two sizes. Printed side by side, in one run:

* records/s and MB/s of ``convert`` (shards only, no prepare) and of ``tar cf`` over the same
  JSON file and images (target: convert >= 0.5x tar's MB/s);
* peak RSS of the converting process at both sizes (target: flat, the stream never holds the
  dataset).

Usage: ``python benchmarks/convert.py [--sizes 10000 100000] [--images 2000]``. Each size runs
in a fresh process (peak RSS is per process).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def child(folder: Path, out: Path) -> None:
    from energon_packing.tools.convert import convert

    start = time.perf_counter()
    result = convert(
        source=folder / "llava.json", out=out, media_root=folder / "images", prepare=False
    )
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    written = sum(p.stat().st_size for p in result.shards)
    print(json.dumps(dict(records=result.converted, seconds=seconds, rss_mib=peak, bytes=written)))


def corpus(folder: Path, n: int, images: int) -> list[Path]:
    """The corpus, and the files a plain tar of it would hold (JSON + each image once)."""
    from energon_packing.testing.corpora import llava_json

    source = llava_json(folder, n, images=images)
    files = [source]
    for record in json.loads(source.read_text()):
        if "image" in record:
            files.append(folder / "images" / record["image"])
    return files


def tar_rate(folder: Path, files: list[Path], records: int) -> tuple[float, float]:
    """(records/s, MB/s) of ``tar cf`` over ``files`` (repeats included, as convert copies
    each record's image)."""
    listing = folder / "files.txt"
    listing.write_text("\n".join(str(p.relative_to(folder)) for p in files))
    target = folder / "plain.tar"
    start = time.perf_counter()
    subprocess.run(["tar", "cf", str(target), "-C", str(folder), "-T", str(listing)], check=True)
    seconds = time.perf_counter() - start
    return records / seconds, sum(p.stat().st_size for p in files) / seconds / 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(Path(args.child[0]), Path(args.child[1]))
        return
    print(f"{'records':>9} {'convert rec/s':>14} {'convert MB/s':>13} {'tar rec/s':>10} "
          f"{'tar MB/s':>9} {'ratio':>6} {'peak RSS MiB':>13}")  # fmt: skip
    for n in args.sizes:
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            files = corpus(folder, n, args.images)
            tar_records, tar_mb = tar_rate(folder, files, n)
            out = subprocess.run(
                [sys.executable, __file__, "--child", str(folder), str(folder / "out")],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            result = json.loads(out.strip().splitlines()[-1])
            rate = result["records"] / result["seconds"]
            mb = sum(p.stat().st_size for p in files) / result["seconds"] / 1e6
            print(
                f"{n:>9,} {rate:>14,.0f} {mb:>13.1f} {tar_records:>10,.0f} {tar_mb:>9.1f} "
                f"{mb / tar_mb:>6.2f} {result['rss_mib']:>13.0f}"
            )


if __name__ == "__main__":
    main()
