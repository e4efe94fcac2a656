"""``energon-packing convert`` against plain ``tar`` of the same files, and its memory.

A generated LLaVA corpus (JSON list + an image folder; every record but each third has an image
file of its own, a photo-like JPEG of ~50 KB) at two sizes; tar archives the same JSON and image
files, so both move the same bytes. Printed side by side, in one run:

* records/s and MB/s of ``convert`` (shards only, no prepare; MB/s of the shards it writes,
  every record with its image), with its default image decoding and with ``--no-decode``, and
  of ``tar cf`` over the same JSON file and image folder (MB/s of the archive; target: convert
  >= 0.5x tar's MB/s with decoding on);
* peak RSS of the converting process at both sizes (target: flat, the stream never holds the
  dataset);
* CPU seconds of convert and of tar (user + system): on a shared machine wall-clock rates swing
  with the load, CPU time does not; decoding runs with ``workers`` threads (``decode``: the
  default, the CPUs convert may use; ``decode-1``: one), so its wall-clock gain is the cores'.

Usage: ``python benchmarks/convert.py [--sizes 10000 100000]`` (100k: ~4 GB of disk). Each size runs
in a fresh process (peak RSS is per process).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def child(folder: Path, out: Path, mode: str) -> None:
    import resource

    from energon_packing.incoming.convert import convert

    start = time.perf_counter()
    result = convert(
        source=folder / "llava.json",
        out=out,
        media_root=folder / "images",
        prepare=False,
        decode=mode != "no-decode",
        workers=1 if mode == "decode-1" else None,
    )
    seconds = time.perf_counter() - start
    usage = resource.getrusage(resource.RUSAGE_SELF)
    # VmHWM, not ru_maxrss: Linux carries ru_maxrss across exec, so it would report the
    # parent's peak (the corpus generator's) instead of this process's
    with open("/proc/self/status") as status:
        peak = next(int(line.split()[1]) for line in status if line.startswith("VmHWM")) / 1024
    written = sum(p.stat().st_size for p in result.shards)
    cpu = usage.ru_utime + usage.ru_stime  # the whole process: imports and corpus read too
    print(
        json.dumps(
            dict(records=result.converted, seconds=seconds, rss_mib=peak, bytes=written, cpu=cpu)
        )
    )


def photos(count: int) -> list[bytes]:
    """Photo-like JPEGs (noise, quality 90, 40-60 KB): their entropy is a camera's."""
    import io

    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    out = []
    for _ in range(count):
        pixels = rng.integers(0, 256, size=(180, 240, 3), dtype=np.uint8)
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, format="JPEG", quality=90)
        out.append(buffer.getvalue())
    return out


def corpus(folder: Path, n: int) -> list[Path]:
    """A LLaVA corpus where every image record has an image file of its own (a JPEG with a
    unique tail after its end marker, as a dataset's distinct photos are distinct files), and
    the files a plain tar of it holds."""
    from energon_packing.testing.corpora import llava_json

    source = llava_json(folder, n, images=1)
    records = json.loads(source.read_text())
    bases = photos(8)
    images = folder / "images" / "u"
    images.mkdir(parents=True)
    for i, record in enumerate(records):
        if "image" in record:
            record["image"] = f"u/{i:07d}.jpg"
            (images / f"{i:07d}.jpg").write_bytes(bases[i % 8] + i.to_bytes(8, "little"))
    source.write_text(json.dumps(records))
    return [source]


def tar_rate(folder: Path, files: list[Path], records: int) -> tuple[float, float, float]:
    """(records/s, MB/s, CPU seconds) of ``tar cf`` over the corpus's files (the JSON and the
    image folder, each file once); MB/s counts the archive's bytes, as convert's counts its
    shards'."""
    import resource

    target = folder / "plain.tar"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(
        ["tar", "cf", str(target), "-C", str(folder), "llava.json", "images"], check=True
    )
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return records / seconds, target.stat().st_size / seconds / 1e6, cpu


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(Path(args.child[0]), Path(args.child[1]), args.child[2])
        return
    print(f"{'records':>9} {'decode':>9} {'convert rec/s':>14} {'convert MB/s':>13} "
          f"{'tar rec/s':>10} {'tar MB/s':>9} {'ratio':>6} {'peak RSS MiB':>13} "
          f"{'convert CPU s':>14} {'tar CPU s':>10}")  # fmt: skip
    for n in args.sizes:
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            files = corpus(folder, n)
            for mode in ("decode", "decode-1", "no-decode"):
                # next to each run: the same load
                tar_records, tar_mb, tar_cpu = tar_rate(folder, files, n)
                out = folder / f"out-{mode}"
                printed = subprocess.run(
                    [sys.executable, __file__, "--child", str(folder), str(out), mode],
                    check=True,
                    capture_output=True,
                    text=True,
                ).stdout
                result = json.loads(printed.strip().splitlines()[-1])
                rate = result["records"] / result["seconds"]
                mb = result["bytes"] / result["seconds"] / 1e6
                print(
                    f"{n:>9,} {mode:>9} {rate:>14,.0f} {mb:>13.1f} {tar_records:>10,.0f} "
                    f"{tar_mb:>9.1f} {mb / tar_mb:>6.2f} {result['rss_mib']:>13.0f} "
                    f"{result['cpu']:>14.2f} {tar_cpu:>10.2f}"
                )


if __name__ == "__main__":
    main()
