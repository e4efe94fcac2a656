"""What the benchmarks read of their own processes from ``/proc`` (Linux): memory fields and
the loader's worker processes."""

from __future__ import annotations

import contextlib
from pathlib import Path

__all__ = ["children", "status_mib"]


def status_mib(pid: int | str, field: str) -> float:
    """A ``/proc/<pid>/status`` field (``VmRSS``, ``VmHWM``) in MiB, 0 if the process is
    gone."""
    with contextlib.suppress(OSError), open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return 0.0


def children() -> list[int]:
    """The pids of this process's children (its loader workers), sorted."""
    pids: set[int] = set()
    for task in Path("/proc/self/task").iterdir():
        with contextlib.suppress(OSError):
            pids.update(int(p) for p in (task / "children").read_text().split())
    return sorted(pids)
