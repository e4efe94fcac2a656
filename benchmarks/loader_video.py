"""Loader throughput with videos: the same conversations with their clips and without them.

Through the real Energon loader (C=2048, pad_multiple 8, carry on, buffer 64, batch 1), with
0 and 2 loader workers, two datasets of the same conversations:

* with videos: the bundled ``sample_data/video`` (32 conversations, half with a 1-3 s h264
  clip), or with ``--count N`` N generated ones (:func:`~energon_packing.testing.clips.
  video_conversations`, a temp dir);
* without videos: the same documents with each video part removed and each reference to it
  replaced by the words ``(a video)`` (:func:`~energon_packing.testing.clips.without_videos`);
  text and images unchanged.

Each run is a fresh process. conversations/s: packed conversations over the wall time of one
epoch from creating the loader to its last pack (worker start-up included; with 32
conversations that dominates, so use ``--count`` for rates). Peak RSS: the main process's
``VmHWM`` plus each worker's (read from ``/proc`` while it runs; the sum of per-process peaks,
an upper bound of the peak they held together).

    python benchmarks/loader_video.py [--count 400] [--workers 0 2] [--repeats 1]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import tarfile
import tempfile
from pathlib import Path

# benchmarks/_runs.py (this script's folder)
from _runs import arguments, finish, spawn, timed_epoch

REPO = Path(__file__).resolve().parents[1]
BUNDLED = REPO / "sample_data" / "video"
CAPACITY, BUFFER = 2048, 64


def read_conversations(path: Path) -> list:
    """The conversations of a dataset's shards (``<key>.json`` plus its parts), in order."""
    from energon_packing.incoming.shards import shard_paths
    from energon_packing.media.images import may_be_video
    from energon_packing.testing.synth import Conversation

    items: dict[str, Conversation] = {}
    for name in shard_paths(path):
        with tarfile.open(path / name) as tar:
            for member in tar:
                if not member.isfile():
                    continue
                key, _, part = member.name.rpartition("/")[2].partition(".")
                data = tar.extractfile(member).read()
                item = items.setdefault(key, Conversation(key=key, document={}, images={}))
                if part == "json":
                    item.document = json.loads(data)
                elif may_be_video(part):
                    item.videos[part] = data
                else:
                    item.images[part] = data
    return list(items.values())


def build(root: Path, count: int | None, *, seed: int) -> dict[str, Path]:
    """The two datasets, prepared under ``root``: ``with videos`` and ``without videos``."""
    from energon_packing.incoming.prepare import prepare_dataset
    from energon_packing.testing.clips import video_conversations, without_videos
    from energon_packing.testing.synth import write_shards

    if count is None:
        if not (BUNDLED / ".nv-meta").is_dir():
            raise SystemExit(f"{BUNDLED} is missing: run sample_data/regenerate.py --video")
        items, with_videos = read_conversations(BUNDLED), BUNDLED
    else:
        items = list(video_conversations(count, seed=seed, prefix="bench"))
        with_videos = root / "with_videos"
        write_shards(with_videos / "shards", items, per_shard=max(16, -(-count // 8)))
        prepare_dataset(with_videos, split_parts=["train:shards/.*"])
    without = root / "without_videos"
    per_shard = max(16, -(-len(items) // 8)) if count is not None else 16
    write_shards(without / "shards", [without_videos(i) for i in items], per_shard=per_shard)
    prepare_dataset(without, split_parts=["train:shards/.*"])
    return {"with videos": with_videos, "without videos": without}


def child(path: str, workers: int) -> None:
    """One epoch; prints one JSON line."""
    from energon_packing import PackingTaskEncoder
    from energon_packing.tools.report import video_token_id

    te = PackingTaskEncoder(
        tokenizer="bundled",
        max_input_seq_length=CAPACITY,
        pad_multiple=8,
        carry=True,
        max_skips_without_pack=None,
    )
    video_pad = video_token_id(te)
    counts = dict(clips=0, video_tokens=0, real_tokens=0)

    def tally(batch: dict) -> None:
        counts["clips"] += sum(len(v) for v in batch.get("video_source_index") or ())
        counts["video_tokens"] += int((batch["input_ids"] == video_pad).sum())
        counts["real_tokens"] += int(sum(int(cu[-1]) for cu in batch["cu_seqlens"]))

    run = timed_epoch(path, te, buffer=BUFFER, workers=workers, tally=tally)
    finish(dict(run, **counts))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument(
        "--count",
        type=int,
        default=None,
        help="Generate this many conversations (half with a clip) into a temp dir instead of "
        "reading the bundled sample_data/video.",
    )
    parser.add_argument("--repeats", type=int, default=1, help="Runs per cell; the fastest.")
    args = arguments(parser, child)
    if args is None:  # this process was a child
        return

    with tempfile.TemporaryDirectory() as tmp:
        with contextlib.redirect_stdout(io.StringIO()):
            datasets = build(Path(tmp), args.count, seed=args.seed)
        source = "sample_data/video" if args.count is None else f"{args.count} generated"
        print(
            f"{source} conversations, with and without their videos; C={CAPACITY}, buffer "
            f"{BUFFER}, carry, batch 1; fastest of {args.repeats}; RSS: peak MiB (VmHWM), "
            f"workers summed\n"
        )
        results: dict[tuple[str, int], dict] = {}
        for workers in args.workers:
            for name, path in datasets.items():
                runs = [spawn(__file__, path, workers) for _ in range(args.repeats)]
                results[name, workers] = max(runs, key=lambda r: r["conv_per_s"])
        side = f"{'conv':>6}{'conv/s':>8}{'packs':>6}{'clips':>6}{'main MiB':>10}{'workers':>9}"
        width = len(side)
        print(f"{'':<8}{'with videos':^{width}}  | {'without videos':^{width}}")
        print(f"{'workers':<8}{side}  | {side}{'conv/s ratio':>14}")
        print("-" * (8 + 2 * width + 18))
        for workers in args.workers:
            cells = []
            for name in datasets:
                r = results[name, workers]
                cells.append(
                    f"{r['conversations']:>6}{r['conv_per_s']:>8.1f}{r['packs']:>6}{r['clips']:>6}"
                    f"{r['main_mb']:>10.0f}{r['workers_mb'] if workers else 0:>9.0f}"
                )
            ratio = (
                results["with videos", workers]["conv_per_s"]
                / results["without videos", workers]["conv_per_s"]
            )
            print(f"{workers:<8}{cells[0]}  | {cells[1]}{ratio:>14.2f}")
        print()
        for workers in args.workers:
            w, wo = results["with videos", workers], results["without videos", workers]
            print(
                f"workers {workers}: with videos {w['real_tokens']:,} real tokens "
                f"({w['video_tokens']:,} video tokens) in {w['seconds']:.2f} s; without "
                f"{wo['real_tokens']:,} in {wo['seconds']:.2f} s"
            )


if __name__ == "__main__":
    main()
