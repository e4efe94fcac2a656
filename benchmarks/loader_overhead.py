"""Loader cost of packing: throughput vs the unpacked loader, worker memory vs decoding up front.

Through the real Energon loader (``num_workers=0``: the worker's work in this process), on
generated conversations (0-3 images each):

1. conversations/s with packing (buffer 256) vs the same encoder without packing
   (``packing_buffer_size=None``: ordinary padded rows, one conversation each), same data;
2. peak RSS at buffer 1024: ours (images stay compressed in the buffer, decoded for the emitted
   pack only) vs an encoder that decodes pixels in ``encode_sample`` (up front) vs unpacked.
   Each mode runs in its own process so the peaks do not mix.

    python benchmarks/loader_overhead.py [--samples 3000] [--max-pixels 200704]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

os.environ.setdefault("TQDM_DISABLE", "1")
warnings.filterwarnings("ignore", message=".*pin_memory.*")


def build(path: Path, samples: int) -> None:
    from energon_packing.incoming.prepare import prepare_dataset
    from energon_packing.testing.synth import conversations, write_shards

    write_shards(path / "shards", conversations(samples, seed=99), per_shard=500)
    prepare_dataset(path, split_parts=["train:shards/.*"])


def make_encoder(mode: str, max_pixels: int, *, unpacked: bool = False):
    from energon_packing import PackingTaskEncoder
    from energon_packing.encoding.vision import patchify

    class DecodeUpFront(PackingTaskEncoder):
        """What a naive loader does: pixels decoded when the sample is encoded, so they sit
        in the packing buffer."""

        def encode_sample(self, sample):
            encoded = super().encode_sample(sample)
            encoded.images = [patchify(data, self.config.vision) for data in encoded.images]
            return encoded

        def decode_images(self, sample):
            return sample.images

    cls = DecodeUpFront if mode == "upfront" else PackingTaskEncoder
    return cls(
        max_input_seq_length=4096,
        tokenizer="bundled",
        pad_multiple=8,
        max_pixels=max_pixels,
        unpacked=unpacked,
    )


def run(path: Path, mode: str, buffer: int | None, max_pixels: int) -> dict:
    from energon_packing.loader.loading import epoch

    te = make_encoder(mode, max_pixels, unpacked=buffer is None)
    loader = epoch(path, te, packing_buffer_size=buffer)
    start = time.perf_counter()
    rows = conversations = 0
    for batch in loader:
        rows += 1
        conversations += sum(len(keys) for keys in batch["source_ids"])
    elapsed = time.perf_counter() - start
    return {
        "mode": mode,
        "buffer": buffer,
        "rows": rows,
        "conversations": conversations,
        "seconds": elapsed,
        "conv_per_s": conversations / elapsed,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def child(args: argparse.Namespace) -> None:
    buffer = None if args.buffer == 0 else args.buffer
    print(json.dumps(run(Path(args.path), args.mode, buffer, args.max_pixels)))


def spawn(path: Path, mode: str, buffer: int, max_pixels: int) -> dict:
    out = subprocess.run(
        [
            sys.executable,
            __file__,
            "--child",
            "--path",
            str(path),
            "--mode",
            mode,
            "--buffer",
            str(buffer),
            "--max-pixels",
            str(max_pixels),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=3000)
    parser.add_argument("--max-pixels", type=int, default=448 * 448)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--path", help=argparse.SUPPRESS)
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    parser.add_argument("--buffer", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp)
        build(path, args.samples)
        print(
            f"{args.samples} generated conversations, C=4096, max_pixels={args.max_pixels}, "
            f"num_workers=0, batch_size=1; best of {args.repeats} epochs\n"
        )
        print("1. Throughput (conversations/s read and delivered)")
        results = {}
        for label, buffer in (("packed, buffer 256", 256), ("unpacked", 0)):
            runs = [spawn(path, "ours", buffer, args.max_pixels) for _ in range(args.repeats)]
            best = max(runs, key=lambda r: r["conv_per_s"])
            results[label] = best
            print(
                f"   {label:<20} {best['conv_per_s']:8.1f} conv/s  ({best['rows']} rows, "
                f"{best['seconds']:.2f} s)"
            )
        ratio = results["packed, buffer 256"]["conv_per_s"] / results["unpacked"]["conv_per_s"]
        print(f"   packed / unpacked = {ratio:.3f}  (target >= 0.95)\n")

        print("2. Peak RSS of the loader process, buffer 1024")
        for label, mode, buffer in (
            ("ours (decode at pack time)", "ours", 1024),
            ("decode up front", "upfront", 1024),
            ("unpacked loader", "ours", 0),
        ):
            result = spawn(path, mode, buffer, args.max_pixels)
            print(f"   {label:<28} {result['peak_rss_mb']:8.0f} MB")


if __name__ == "__main__":
    main()
