"""Rank-balanced emission: every data-parallel rank emits packs of similar attention cost at the
same step, with no communication.

Every pack computes C tokens, so a step's cost differs between ranks only by attention, which
grows with the sum of the sources' squared lengths: a step waits for the rank that drew the
costliest pack. :class:`StepCostModel` prices a pack in training FLOPs (the C tokens' linear
layers plus causal attention over each source) for a model's hidden size and depth, and that
price is what emission balances. Each rank sees only its own loader; what ranks can share
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
from dataclasses import dataclass

__all__ = [
    "HISTORY",
    "RecentCosts",
    "StepCostModel",
    "attention_cost",
    "imbalance",
    "pick",
    "target_quantile",
]

GOLDEN = (math.sqrt(5) - 1) / 2
#: Recent pack costs a rank remembers for its quantiles.
HISTORY = 2048


def attention_cost(lengths: Sequence[int]) -> int:
    """Sum of squared source lengths: what causal varlen attention spends on a pack."""
    return sum(n * n for n in lengths)


@dataclass(kw_only=True, slots=True, frozen=True)
class StepCostModel:
    """Training FLOPs of one C-wide pack of a dense decoder (forward + backward = 3x forward)::

        per layer, forward:  2*C*(4*h*h + 3*h*f)     linear: QKV + output, SwiGLU MLP
                           + 2*h*sum(L_i**2)         causal attention (QK^T and PV, halved)

    ``f`` is the SwiGLU width of the Llama rule (8h/3 rounded up to 256: 11008 for h=4096).
    The defaults are a 7B (h=4096, 32 layers). The linear part is the same for every pack
    (every pack is C tokens), so it sets how much attention differences weigh in a step's
    cost: at C=4096 one 4,096-token conversation adds 8 % to a 7B's pack and 33 % to a model
    with h=1024. For emission the model is an affine map of the attention cost (same C), so
    which pack is emitted hardly depends on h (identical packs for h from 512 to 16384 over
    the sample data): the package uses a 7B's and offers no knob. Grouped-query attention
    and the vocabulary projection are linear in C too and left out: they add the same to
    every pack.

    Args:
        hidden_size: The model's hidden size h.
        num_layers: Its decoder layers.
    """

    hidden_size: int = 4096
    num_layers: int = 32

    def __post_init__(self) -> None:
        for name in ("hidden_size", "num_layers"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")

    @property
    def ffn_hidden_size(self) -> int:
        return 256 * math.ceil(8 * self.hidden_size / 3 / 256)

    def pack_flops(self, lengths: Sequence[int], *, capacity: int) -> int:
        """Training FLOPs of a pack ``capacity`` tokens wide holding sources of ``lengths``."""
        h = self.hidden_size
        linear = 2 * capacity * (4 * h * h + 3 * h * self.ffn_hidden_size)
        return 3 * self.num_layers * (linear + 2 * h * attention_cost(lengths))


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
