"""Every record exactly once, proved on your own data: one finite epoch of each split through
the real loader (``repeat=False``), every pack's ``source_ids`` and every ``packing_skipped``
event counted, against the keys ``convert`` wrote (``OUT/convert_map.jsonl``).

A key packed twice, a key neither packed nor skipped, or a key no record has fails the proof;
a skipped key is accounted for (with its reason). A folder without ``convert_map.jsonl`` (shards
you wrote yourself) is checked for keys seen twice only.
"""

from __future__ import annotations

import json
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Accounting", "account"]


@dataclass(kw_only=True, slots=True)
class Accounting:
    """What one epoch of each split did with each key.

    Attributes:
        splits: The splits read, each with the keys it packed and skipped.
        expected: The keys ``convert_map.jsonl`` lists (None without one).
        packed: key -> how many packs held it.
        skipped: key -> the reasons it was skipped under.
    """

    splits: dict[str, int] = field(default_factory=dict)
    expected: set[str] | None = None
    packed: Counter = field(default_factory=Counter)
    skipped: dict[str, list[str]] = field(default_factory=dict)

    @property
    def twice(self) -> list[str]:
        """Keys packed more than once, or both packed and skipped, or skipped twice."""
        both = [k for k in self.skipped if k in self.packed or len(self.skipped[k]) > 1]
        return sorted({*(k for k, n in self.packed.items() if n > 1), *both})

    @property
    def missing(self) -> list[str]:
        """Expected keys neither packed nor skipped."""
        if self.expected is None:
            return []
        return sorted(self.expected - self.packed.keys() - self.skipped.keys())

    @property
    def unknown(self) -> list[str]:
        """Keys seen that no converted record has."""
        if self.expected is None:
            return []
        return sorted((self.packed.keys() | self.skipped.keys()) - self.expected)

    @property
    def exactly_once(self) -> bool:
        return not (self.twice or self.missing or self.unknown)

    def summary(self) -> str:
        """One line: the counts, and the first keys of each failure."""
        reasons = Counter(r for rs in self.skipped.values() for r in rs)
        line = (
            f"{sum(self.splits.values()):,} keys over {', '.join(self.splits)}: "
            f"{len(self.packed):,} packed, {len(self.skipped):,} skipped"
            + (
                f" ({', '.join(f'{r} {n:,}' for r, n in sorted(reasons.items()))})"
                if reasons
                else ""
            )
        )
        if self.expected is not None:
            line += f", of {len(self.expected):,} converted records"
        problems = [
            f"{len(keys):,} {what} (first: {', '.join(keys[:3])})"
            for what, keys in (
                ("seen twice", self.twice),
                ("never seen", self.missing),
                ("not in convert_map.jsonl", self.unknown),
            )
            if keys
        ]
        return line + (": " + "; ".join(problems) if problems else ": every record exactly once")


def account(
    path: Path | str,
    task_encoder: Any,
    *,
    splits: tuple[str, ...] = ("train", "val"),
    num_workers: int = 0,
    packing_buffer_size: int = 64,
) -> Accounting:
    """One finite epoch (``repeat=False``, no shuffling) of each split of a prepared folder
    that has it, through the real loader and ``task_encoder``; returns the accounting
    (:attr:`Accounting.exactly_once`, :meth:`Accounting.summary`).

    Args:
        path: A prepared dataset folder (``energon-packing convert``'s ``OUT``).
        task_encoder: A fresh :class:`~energon_packing.PackingTaskEncoder` (its settings are
            the run's; skips depend on them, e.g. ``overlong``).
        splits: The splits to read; one ``split.yaml`` does not list is left out.
        num_workers: Loader workers (the skips reach the batches either way).
        packing_buffer_size: The packing buffer.
    """
    import yaml
    from megatron.energon import WorkerConfig, get_loader, get_train_dataset

    from energon_packing.stats import MetricsAggregator

    path = Path(path)
    listed = yaml.safe_load((path / ".nv-meta" / "split.yaml").read_text()) or {}
    result = Accounting()
    mapping = path / "convert_map.jsonl"
    if mapping.exists():
        with open(mapping, encoding="utf-8") as f:
            result.expected = {json.loads(line)["key"] for line in f if line.strip()}
    for split in splits:
        if not (listed.get("split_parts") or {}).get(split):
            continue
        dataset = get_train_dataset(
            path,
            split_part=split,
            worker_config=WorkerConfig(rank=0, world_size=1, num_workers=num_workers),
            batch_size=1,
            packing_buffer_size=packing_buffer_size,
            task_encoder=task_encoder,
            shuffle_buffer_size=None,
            max_samples_per_sequence=None,
            repeat=False,
        )
        aggregate = MetricsAggregator()
        seen = 0
        with warnings.catch_warnings():  # "pin_memory ... no accelerator" on CPU machines
            warnings.filterwarnings("ignore", message=".*pin_memory.*")
            for batch in get_loader(dataset):
                aggregate.update(batch)
                for keys in batch.get("source_ids") or ():
                    result.packed.update(keys)
                    seen += len(keys)
        for key, reason in aggregate.skipped:
            result.skipped.setdefault(key, []).append(reason)
        result.splits[split] = seen + len(aggregate.skipped)
    return result
