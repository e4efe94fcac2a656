"""What the benchmarks read of their own processes from ``/proc`` (Linux): memory fields, CPU
time and the loader's worker processes."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

__all__ = ["children", "cpu_seconds", "status_mib"]


def status_mib(pid: int | str, field: str) -> float:
    """A ``/proc/<pid>/status`` field (``VmRSS``, ``VmHWM``) in MiB, 0 if the process is
    gone."""
    with contextlib.suppress(OSError), open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return 0.0


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process from ``/proc/<pid>/stat`` (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children() -> list[int]:
    """The pids of this process's children (its loader workers), sorted."""
    pids: set[int] = set()
    for task in Path("/proc/self/task").iterdir():
        with contextlib.suppress(OSError):
            pids.update(int(p) for p in (task / "children").read_text().split())
    return sorted(pids)
