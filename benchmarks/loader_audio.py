"""Loader throughput with audio: the same conversations with their clips and without them.

Through the real Energon loader and the tiny offline Qwen2.5-Omni processor
(:func:`energon_packing.testing.families.build`; C=4096, pad_multiple 8, carry on, buffer 64,
batch 1), with 0 and 2 loader workers, two generated datasets of the same conversations:

* with audio: each conversation asks about one clip (1-6 s, WAV / FLAC / MP3 / Opus in turn,
  synthesised by :func:`energon_packing.testing.audio.clip`);
* without audio: the same documents with the clip removed and its part replaced by the words
  ``(a clip)``.

Each run is a fresh process. conversations/s: packed conversations over the wall time of one
epoch from creating the loader to its last pack (worker start-up included). Peak RSS: the main
process's ``VmHWM`` plus each worker's (the sum of per-process peaks).

    python benchmarks/loader_audio.py [--count 200] [--workers 0 2]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

# benchmarks/_runs.py (this script's folder)
from _runs import arguments, finish, spawn, timed_epoch

CAPACITY, BUFFER = 4096, 64
SUFFIXES = ("wav", "flac", "mp3", "opus")


def build(root: Path, count: int, *, seed: int) -> dict[str, Path]:
    """The two datasets, prepared under ``root``: ``with audio`` and ``without audio``."""
    import numpy as np

    from energon_packing.incoming.prepare import prepare_dataset
    from energon_packing.testing.audio import clip
    from energon_packing.testing.synth import Conversation, write_shards

    rng = np.random.default_rng(seed)
    with_audio, without = [], []
    for i in range(count):
        suffix = SUFFIXES[i % len(SUFFIXES)]
        name = f"speech.{suffix}"
        answer = " ".join(["A tone and some noise."] * int(rng.integers(1, 12)))

        def document(part):
            return {
                "messages": [
                    {"role": "user", "content": [part, {"type": "text", "text": "What is it?"}]},
                    {"role": "assistant", "content": answer},
                ],
                **({"audios": [name]} if part["type"] == "audio" else {}),
            }

        data = clip(suffix, seconds=float(rng.uniform(1, 6)), seed=i)
        with_audio.append(
            Conversation(
                key=f"a{i:06d}",
                document=document({"type": "audio", "audio": name}),
                images={},
                audios={name: data},
            )
        )
        without.append(
            Conversation(
                key=f"a{i:06d}", document=document({"type": "text", "text": "(a clip)"}), images={}
            )
        )
    paths = {}
    for label, items in (("with audio", with_audio), ("without audio", without)):
        path = root / label.replace(" ", "_")
        write_shards(path / "shards", items, per_shard=max(16, -(-count // 8)))
        prepare_dataset(path, split_parts=["train:shards/.*"])
        paths[label] = path
    return paths


def child(path: str, workers: int) -> None:
    """One epoch; prints one JSON line."""
    import numpy as np

    from energon_packing import PackingTaskEncoder
    from energon_packing.testing.families import build as build_family

    te = PackingTaskEncoder(
        processor=build_family("qwen2_5_omni", model=False)[0],
        max_input_seq_length=CAPACITY,
        pad_multiple=8,
        carry=True,
        max_skips_without_pack=None,
    )
    token = te.chat.audio.token_id
    counts = dict(audio_tokens=0)

    def tally(batch: dict) -> None:
        counts["audio_tokens"] += int(np.count_nonzero(np.asarray(batch["input_ids"]) == token))

    run = timed_epoch(path, te, buffer=BUFFER, workers=workers, tally=tally)
    finish(dict(run, **counts, skipped=dict(te.stats.skipped)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("--count", type=int, default=200, help="Conversations per dataset.")
    args = arguments(parser, child)
    if args is None:  # this process was a child
        return
    with tempfile.TemporaryDirectory() as tmp:
        datasets = build(Path(tmp), args.count, seed=args.seed)
        print(
            f"{args.count} generated conversations (one 1-6 s clip each), with and without "
            f"the clip; Qwen2.5-Omni (tiny, offline), C={CAPACITY}, buffer {BUFFER}, carry, "
            f"batch 1; RSS: peak MiB (VmHWM), workers summed\n"
        )
        head = f"{'workers':<8}{'dataset':<15}{'conv':>6}{'conv/s':>8}{'packs':>6}"
        print(f"{head}{'audio tok':>10}{'main MiB':>10}{'workers':>9}  skipped")
        for workers in args.workers:
            rates = {}
            for name, path in datasets.items():
                r = spawn(__file__, path, workers)
                rates[name] = r["conv_per_s"]
                print(
                    f"{workers:<8}{name:<15}{r['conversations']:>6}{r['conv_per_s']:>8.1f}"
                    f"{r['packs']:>6}{r['audio_tokens']:>10,}{r['main_mb']:>10.0f}"
                    f"{r['workers_mb']:>9.0f}  {r['skipped'] or '-'}"
                )
            ratio = rates["with audio"] / rates["without audio"]
            print(f"{'':<8}with/without audio conv/s: {ratio:.2f}x")


if __name__ == "__main__":
    main()
