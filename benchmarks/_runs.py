"""The loader benchmarks' frame: one epoch in a fresh process per setting, its peak memory and
its rate, reported as one JSON line to the parent (``loader_video.py``, ``loader_audio.py``).
Importing it quiets tqdm and the loader's pin_memory warning, in the parent and each child."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _proc import children, status_mib  # benchmarks/_proc.py (this script's folder)

__all__ = ["arguments", "finish", "spawn", "timed_epoch"]

os.environ.setdefault("TQDM_DISABLE", "1")
warnings.filterwarnings("ignore", message=".*pin_memory.*")


def arguments(
    parser: argparse.ArgumentParser, child: Callable[[str, int], None]
) -> argparse.Namespace | None:
    """``parser``'s arguments with the frame's own: ``--seed``, ``--workers`` (default 0 and
    2) and the hidden ``--child PATH WORKERS`` that :func:`spawn` passes. In a child: runs
    ``child(PATH, WORKERS)`` and returns None."""
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not args.child:
        return args
    child(args.child[0], int(args.child[1]))
    return None


def timed_epoch(
    path: str | Path,
    task_encoder: Any,
    *,
    buffer: int,
    workers: int,
    tally: Callable[[dict], None] = lambda batch: None,
) -> dict:
    """One epoch of ``path`` through the real loader: packed conversations and packs, the
    wall time from creating the loader to its last pack (worker start-up included),
    conversations/s, and peak RSS (the main process's ``VmHWM``, each worker's summed).
    ``tally`` sees every non-empty batch (a benchmark's own counts)."""
    from energon_packing.loader.loading import epoch
    from energon_packing.schema import is_empty

    peaks: dict[int, float] = {}
    conversations = packs = 0
    start = time.perf_counter()
    for batch in epoch(path, task_encoder, packing_buffer_size=buffer, num_workers=workers):
        for pid in children() if workers else ():
            peaks[pid] = max(peaks.get(pid, 0.0), status_mib(pid, "VmHWM"))
        if is_empty(batch):
            continue
        packs += len(batch["source_ids"])
        conversations += sum(len(keys) for keys in batch["source_ids"])
        tally(batch)
    seconds = time.perf_counter() - start
    return dict(
        conversations=conversations,
        packs=packs,
        seconds=seconds,
        conv_per_s=conversations / seconds,
        main_mb=status_mib("self", "VmHWM"),
        workers_mb=sum(peaks.values()),
        processes=len(peaks),
    )


def finish(result: dict) -> None:
    """A child's last act: ``result`` as one JSON line, then its loader workers ended (their
    ~5 s teardown each is not what is measured)."""
    import multiprocessing

    print(json.dumps(result), flush=True)
    for process in multiprocessing.active_children():
        process.terminate()
        process.join(timeout=5)


def spawn(script: str, path: Path, workers: int) -> dict:
    """``script --child PATH WORKERS`` in a fresh process (nothing shared between settings);
    the JSON line it printed last."""
    done = subprocess.run(
        [sys.executable, script, "--child", str(path), str(workers)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode:
        raise SystemExit(f"the run over {path} with {workers} workers failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])
