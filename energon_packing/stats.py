"""Counters and the skip report: nothing is dropped without a count, a key and a reason.

Each skip reason is logged once per process (the first key and why), then only counted; the
counts are exported as a flat ``{"packing/...": number}`` dict that a logger can take.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field

__all__ = ["KEYS_PER_REASON", "MetricsAggregator", "PackingStats"]

logger = logging.getLogger("energon_packing")

#: Keys remembered per skip reason (the counts are exact, the key lists are samples).
KEYS_PER_REASON = 32


@dataclass(kw_only=True, slots=True)
class PackingStats:
    """What one loader process saw: samples read, skipped (by reason), packed, and the packs."""

    read: int = 0
    skipped: Counter = field(default_factory=Counter)
    skipped_keys: dict = field(default_factory=dict)  # reason -> [key, ...] (first few)
    truncated: int = 0
    truncated_tokens: int = 0
    packs: int = 0
    packed: int = 0
    real_tokens: int = 0
    pack_tokens: int = 0
    carry_events: int = 0  # times a sample went back into the buffer
    carried_emitted: int = 0  # samples that left after waiting >= 1 extra round
    held_rounds_max: int = 0  # the longest wait, in select rounds
    worker: int = 0  # the loader worker these numbers belong to (within the rank)
    #: (key, reason) of every skip not yet handed to the trainer inside a batch
    events: list = field(default_factory=list)

    def skip(self, key: str, reason: str, detail: str) -> None:
        if not self.skipped[reason]:
            logger.warning(
                "skipping sample %r (%s: %s); further %r skips are counted, not logged "
                "(PackingTaskEncoder.stats, metrics packing/skipped/%s)",
                key,
                reason,
                detail,
                reason,
                reason,
            )
        self.skipped[reason] += 1
        self.events.append((key, reason))
        keys = self.skipped_keys.setdefault(reason, [])
        if len(keys) < KEYS_PER_REASON:
            keys.append(key)

    def add_pack(self, *, sources: int, real_tokens: int, capacity: int) -> None:
        self.packs += 1
        self.packed += sources
        self.real_tokens += real_tokens
        self.pack_tokens += capacity

    def add_carry(self, *, carried: int, emitted_counts: list[int]) -> None:
        """One carry round: how many samples stayed, and the carry counts of those that left."""
        self.carry_events += carried
        waited = [c for c in emitted_counts if c]
        self.carried_emitted += len(waited)
        self.held_rounds_max = max([self.held_rounds_max, *waited])

    @property
    def efficiency(self) -> float:
        """Real tokens / pack tokens over every pack emitted so far."""
        return self.real_tokens / self.pack_tokens if self.pack_tokens else 0.0

    def drain(self) -> list[tuple[str, str]]:
        """The skips since the last call (each is handed to the trainer exactly once)."""
        events, self.events = self.events, []
        return events

    def metrics(self) -> dict[str, float]:
        """A flat dict for a metrics logger (wandb, TensorBoard, NeMo-RL's logger)."""
        out: dict[str, float] = {
            "packing/worker": self.worker,
            "packing/read": self.read,
            "packing/packed": self.packed,
            "packing/skipped": sum(self.skipped.values()),
            "packing/truncated": self.truncated,
            "packing/truncated_tokens": self.truncated_tokens,
            "packing/packs": self.packs,
            "packing/real_tokens": self.real_tokens,
            "packing/pack_tokens": self.pack_tokens,
            "packing/efficiency": self.efficiency,
            "packing/samples_per_pack": self.packed / self.packs if self.packs else 0.0,
        }
        if self.carry_events:
            out["packing/carry/events"] = self.carry_events
            out["packing/carry/emitted_after_wait"] = self.carried_emitted
            out["packing/carry/held_rounds_max"] = self.held_rounds_max
        for reason, count in sorted(self.skipped.items()):
            out[f"packing/skipped/{reason}"] = count
        return out


#: Counters that add up across workers (the rest are recomputed or maxed).
_SUMMED = (
    "read",
    "packed",
    "skipped",
    "truncated",
    "truncated_tokens",
    "packs",
    "real_tokens",
    "pack_tokens",
    "carry/events",
    "carry/emitted_after_wait",
)


class MetricsAggregator:
    """Trainer side: every worker's packing numbers, summed into one flat dict.

    Each batch carries its worker's cumulative ``packing_metrics`` and the skips since that
    worker's previous batch (``packing_skipped``); feed every batch to :meth:`update`::

        aggregate = MetricsAggregator()
        for batch in loader:
            logger.log(aggregate.update(batch))   # {"packing/read": ..., "packing/efficiency": ...}
    """

    def __init__(self) -> None:
        self._latest: dict[int, dict[str, float]] = {}
        #: every (key, reason) skipped so far, across workers
        self.skipped: list[tuple[str, str]] = []

    def update(self, batch: dict) -> dict[str, float]:
        latest = batch.get("packing_metrics")
        if latest:
            self._latest[int(latest["packing/worker"])] = latest
        self.skipped.extend(tuple(event) for event in batch.get("packing_skipped", ()))
        return self.metrics()

    def metrics(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for worker in self._latest.values():
            for key, value in worker.items():
                name = key.removeprefix("packing/")
                if name in _SUMMED or name.startswith("skipped/"):
                    out[key] = out.get(key, 0) + value
                elif name == "carry/held_rounds_max":
                    out[key] = max(out.get(key, 0), value)
        if out:
            out["packing/workers"] = len(self._latest)
            out["packing/efficiency"] = (
                out["packing/real_tokens"] / out["packing/pack_tokens"]
                if (out.get("packing/pack_tokens"))
                else 0.0
            )
            out["packing/samples_per_pack"] = (
                out["packing/packed"] / out["packing/packs"] if (out.get("packing/packs")) else 0.0
            )
        return out
