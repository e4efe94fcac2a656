"""Carry: which packs of a buffer leave it, and which samples stay for the next round.

Energon packs its buffer and empties it, so the last packs of every buffer are under-full: that
is a floor of +0.7..2.6 % packs at a 256-sample buffer whatever the algorithm. Carrying the
samples of under-full packs back into the buffer lets them meet fresh samples instead.

    round k:  [######## full ][######## full ][###     under-full ]
                  emitted          emitted      samples carried -> round k+1

Pure: no Energon, no torch. :func:`energon_packing.packing.algorithms.select_packs` applies it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = [
    "DEFAULT_BUDGET",
    "DEFAULT_MAX_CARRIES",
    "DEFAULT_MIN_FILL",
    "CarryPolicy",
    "Selection",
    "emit_all",
    "split",
]

#: A sample is carried at most this many times, then emitted.
DEFAULT_MAX_CARRIES = 4
#: Packs using at least this fraction of the capacity are always emitted.
DEFAULT_MIN_FILL = 0.998
#: At most this fraction of the buffer is carried, so fresh samples keep flowing in.
DEFAULT_BUDGET = 0.5


@dataclass(kw_only=True, slots=True, frozen=True)
class CarryPolicy:
    """When under-full packs go back into the buffer instead of leaving it.

    Attributes:
        max_carries: A sample is carried at most this many times, then emitted whatever its
            pack's fill: no sample waits more than ``max_carries`` select rounds.
        min_fill: Packs using at least this fraction of the capacity are always emitted.
        budget: At most ``floor(budget * buffer_size)`` samples are carried per round
            (``< 1``, so every full-buffer round emits something).
    """

    max_carries: int = DEFAULT_MAX_CARRIES
    min_fill: float = DEFAULT_MIN_FILL
    budget: float = DEFAULT_BUDGET

    def __post_init__(self) -> None:
        if (
            isinstance(self.max_carries, bool)
            or not isinstance(self.max_carries, int)
            or (self.max_carries < 0)
        ):
            raise ValueError(f"max_carries must be an integer >= 0, got {self.max_carries!r}")
        if not 0.0 <= self.min_fill <= 1.0:
            raise ValueError(f"min_fill must be within [0, 1], got {self.min_fill!r}")
        if not 0.0 <= self.budget < 1.0:
            raise ValueError(f"budget must be within [0, 1), got {self.budget!r}")


@dataclass(kw_only=True, slots=True)
class Selection:
    """One select round: packs to emit and samples to keep, as positions in the buffer.

    Every buffer position is in exactly one pack or in ``carried``.
    """

    packs: list[list[int]]
    carried: list[int] = field(default_factory=list)
    #: Tokens left empty in the emitted packs (``capacity * len(packs) - their volume``).
    waste: int = 0


def split(
    groups: list[list[int]],
    lengths: Sequence[int],
    capacity: int,
    *,
    policy: CarryPolicy,
    carry_counts: Sequence[int],
    buffer_size: int,
    members: Sequence[int] | None = None,
) -> Selection:
    """Carries the samples of the emptiest packs below ``min_fill``, within the budget, never a
    sample already carried ``max_carries`` times. Emitted packs keep their order.
    ``members``: how many samples each position stands for (a unit of the company rule), for
    the budget (default one each)."""
    budget = int(policy.budget * buffer_size)
    threshold = policy.min_fill * capacity
    loads = [sum(lengths[i] for i in group) for group in groups]
    carried: list[int] = []
    held = 0  # samples carried
    keep = [True] * len(groups)
    for g in sorted(range(len(groups)), key=lambda g: (loads[g], g)):
        group = groups[g]
        size = sum(members[i] for i in group) if members is not None else len(group)
        if loads[g] >= threshold or held + size > budget:
            continue
        if all(carry_counts[i] < policy.max_carries for i in group):
            carried.extend(group)
            held += size
            keep[g] = False
    emitted = [g for g in range(len(groups)) if keep[g]]
    return Selection(
        packs=[groups[g] for g in emitted],
        carried=sorted(carried),
        waste=sum(capacity - loads[g] for g in emitted),
    )


def emit_all(groups: list[list[int]], lengths: Sequence[int], capacity: int) -> Selection:
    return Selection(packs=groups, waste=sum(capacity - sum(lengths[i] for i in g) for g in groups))
