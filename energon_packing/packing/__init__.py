"""The pure packing core: algorithms by name, the lower bound, carry, balance, the buffer loop.

Imports neither torch nor Energon (a test enforces it), so the loader worker, the trainer shim,
the tools and the benchmarks all run exactly this code::

    from energon_packing.packing import pack, pack_stream, lower_bound

    pack([6, 5, 4, 3, 2], 10)                                        # [[0, 2], [1, 3, 4]]
    list(pack_stream(lengths, 8192, buffer_size=256, carry=True))    # what the loader runs
"""

from energon_packing.packing.algorithms import (
    ALGORITHMS,
    DEFAULT_ALGORITHM,
    check_algorithm,
    lower_bound,
    pack,
    pack_stream,
    select_packs,
)
from energon_packing.packing.balance import StepCostModel
from energon_packing.packing.carry import CarryPolicy, Selection
from energon_packing.packing.company import Company

__all__ = [
    "ALGORITHMS",
    "DEFAULT_ALGORITHM",
    "CarryPolicy",
    "Company",
    "Selection",
    "StepCostModel",
    "check_algorithm",
    "lower_bound",
    "pack",
    "pack_stream",
    "select_packs",
]
