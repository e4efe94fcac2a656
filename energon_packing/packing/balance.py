"""Rank-balanced emission: every data-parallel rank emits packs of similar attention cost at the
same step, with no communication.

A pack's attention cost grows with the sum of its sources' squared lengths, so a step waits for
the rank that drew the costliest pack. Each rank sees only its own loader; what ranks can share
is a rule. Each rank keeps a pool of W pending packs and, at step t, emits the pool's pack whose
cost is nearest to a *target*::

    u_t     = frac(0.5 + t * 0.618...)              shared: the same on every rank
    target  = u_t-quantile of this rank's recent pack costs
    emitted = the pooled pack nearest to target (log scale)

Ranks draw from the same data distribution, so their recent-cost quantiles agree and step t
costs about the same everywhere; the golden-ratio sequence visits quantiles evenly, so pools
stay representative. Matching by value over a pool is far tighter than matching ranks inside
small sorted windows (measured in ``benchmarks/carry_loader.py``). The pack count is unchanged:
only the order changes. Pure.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence

__all__ = ["HISTORY", "RecentCosts", "attention_cost", "imbalance", "pick", "target_quantile"]

GOLDEN = (math.sqrt(5) - 1) / 2
#: Recent pack costs a rank remembers for its quantiles.
HISTORY = 2048


def attention_cost(lengths: Sequence[int]) -> int:
    """Sum of squared source lengths: what causal varlen attention spends on a pack."""
    return sum(n * n for n in lengths)


def target_quantile(step: int, seed: int = 0) -> float:
    """The shared quantile of step ``step``: a low-discrepancy (golden-ratio) sequence."""
    return (0.5 + seed * GOLDEN * GOLDEN + step * GOLDEN) % 1.0


def pick(pool_costs: Sequence[int], target: int) -> int:
    """Position of the pooled pack nearest to ``target`` on a log scale (ties: earliest)."""
    goal = math.log(max(target, 1))
    return min(
        range(len(pool_costs)), key=lambda i: (abs(math.log(max(pool_costs[i], 1)) - goal), i)
    )


class RecentCosts:
    """The last :data:`HISTORY` pack costs of a rank, with quantiles.

    ``costs`` (arrival order) is the whole state; a sorted mirror makes quantiles O(log n).
    """

    def __init__(self, costs: Sequence[int] = ()):
        self.costs = list(costs)[-HISTORY:]
        self._sorted = sorted(self.costs)

    def add(self, cost: int) -> None:
        self.costs.append(cost)
        bisect.insort(self._sorted, cost)
        if len(self.costs) > HISTORY:
            oldest = self.costs.pop(0)
            del self._sorted[bisect.bisect_left(self._sorted, oldest)]

    def quantile(self, q: float) -> int:
        return self._sorted[min(len(self._sorted) - 1, int(q * len(self._sorted)))]


def imbalance(step_costs: Sequence[Sequence[float]]) -> float:
    """Mean over steps of ``max / mean`` of the per-rank costs (1.0 = perfectly balanced).

    Args:
        step_costs: ``step_costs[t][r]``: the cost rank r spends at step t.
    """
    ratios = [max(costs) / (sum(costs) / len(costs)) for costs in step_costs if sum(costs)]
    return sum(ratios) / len(ratios) if ratios else 1.0
