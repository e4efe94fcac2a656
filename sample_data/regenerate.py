"""Regenerates the bundled sample datasets (shards + .nv-meta) from fixed seeds.

    .venv/bin/python sample_data/regenerate.py            # everything
    .venv/bin/python sample_data/regenerate.py --video    # only video/
    .venv/bin/python sample_data/regenerate.py --audio    # only audio/

400 conversations (0-3 images each) from :mod:`energon_packing.testing.synth`, 4 shards of 100, then
``energon prepare`` (train: all shards; val and test: the last shard, so the default
``energon lint`` finds all three splits) and our dataset yamls. Beside them, ``llava/``: a small
LLaVA-style corpus (``llava.json`` + ``images/``) for the README's ``energon-packing convert``.

``video/``: a small prepared dataset of its own, 32 conversations in 2 shards of 16 (every
other one about a short h264 clip, a few of those with an image too; the rest images or text
only), split like the main one; ``energon-packing demo`` packs it after the main report. The
clips' bytes are the same for the same PyAV/FFmpeg build. It is written after the main
dataset is prepared, so ``energon prepare`` of the main one never sees its shards.

``audio/``: 16 conversations in 2 shards of 8, every other one about 1-2 synthetic clips (tones
and noise, 1-3 s, WAV / FLAC / MP3 / Ogg / Opus / M4A in turn, answers that name the tones they
hold; :func:`energon_packing.testing.audio.audio_conversations`); ``energon-packing demo`` packs
it through the tiny offline Qwen2.5-Omni processor. Written after the main dataset, as ``video/``.

Only ``video/``'s and ``audio/``'s shards come out byte-identical on a rerun (fixed member times). The main
shards hold the same members but their tar headers carry the time they were written, and
``energon prepare`` writes a fresh ``index.uuid`` each time: regenerate only what changed
(many tests read the main dataset).
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from energon_packing.incoming.prepare import prepare_dataset
from energon_packing.testing.audio import audio_conversations
from energon_packing.testing.clips import video_conversations
from energon_packing.testing.corpora import llava_json
from energon_packing.testing.synth import conversations, write_shards

HERE = Path(__file__).resolve().parent
SEED = 2024
COUNT = 400
VIDEO = HERE / "video"
VIDEO_SEED = 2025
VIDEO_COUNT = 32
#: the video shards' member times (2026-01-01): the same conversations, the same tar bytes
VIDEO_MTIME = 1767225600.0
AUDIO = HERE / "audio"
AUDIO_SEED = 2026
AUDIO_COUNT = 16


def main_dataset() -> None:
    """``shards/``, ``.nv-meta/`` and ``llava/``."""
    for stale in (HERE / "shards", HERE / ".nv-meta"):
        shutil.rmtree(stale, ignore_errors=True)
    write_shards(HERE / "shards", conversations(COUNT, seed=SEED, prefix="sample"), per_shard=100)
    prepare_dataset(
        HERE,
        split_parts=[
            "train:shards/.*",
            "val:shards/shard-00003.tar",
            "test:shards/shard-00003.tar",
        ],
    )
    shutil.rmtree(HERE / "llava", ignore_errors=True)
    llava_json(HERE / "llava", 60, seed=SEED, images=6)
    print(f"wrote {COUNT} conversations to {HERE}, a LLaVA corpus to {HERE / 'llava'}")


def video_dataset() -> None:
    """``video/``: its shards and ``.nv-meta/``."""
    shutil.rmtree(VIDEO, ignore_errors=True)
    items = video_conversations(VIDEO_COUNT, seed=VIDEO_SEED, prefix="video")
    write_shards(VIDEO / "shards", items, per_shard=VIDEO_COUNT // 2, mtime=VIDEO_MTIME)
    prepare_dataset(
        VIDEO,
        split_parts=[
            "train:shards/.*",
            "val:shards/shard-00001.tar",
            "test:shards/shard-00001.tar",
        ],
    )
    size = sum(p.stat().st_size for p in VIDEO.rglob("*") if p.is_file())
    print(f"wrote {VIDEO_COUNT} conversations with clips to {VIDEO} ({size / 1e3:.0f} KB)")


def audio_dataset() -> None:
    """``audio/``: its shards and ``.nv-meta/``."""
    shutil.rmtree(AUDIO, ignore_errors=True)
    items = audio_conversations(AUDIO_COUNT, seed=AUDIO_SEED, prefix="audio")
    write_shards(AUDIO / "shards", items, per_shard=AUDIO_COUNT // 2, mtime=VIDEO_MTIME)
    prepare_dataset(
        AUDIO,
        split_parts=[
            "train:shards/.*",
            "val:shards/shard-00001.tar",
            "test:shards/shard-00001.tar",
        ],
    )
    size = sum(p.stat().st_size for p in AUDIO.rglob("*") if p.is_file())
    print(f"wrote {AUDIO_COUNT} conversations with audio clips to {AUDIO} ({size / 1e3:.0f} KB)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("--video", action="store_true", help="Regenerate only video/.")
    parser.add_argument("--audio", action="store_true", help="Regenerate only audio/.")
    args = parser.parse_args()
    if not (args.video or args.audio):
        # the video and audio shards lie under HERE: out of the way while the main dataset is
        # prepared
        shutil.rmtree(VIDEO, ignore_errors=True)
        shutil.rmtree(AUDIO, ignore_errors=True)
        main_dataset()
    if args.video or not args.audio:
        video_dataset()
    if args.audio or not args.video:
        audio_dataset()


if __name__ == "__main__":
    main()
