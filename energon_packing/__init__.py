"""Loader-side sequence packing for Megatron-Energon: full-width multimodal packs, at the bound.

The packing algorithms (:mod:`energon_packing.algorithms`) are pure Python. Names that need
Energon or torch are imported on first use, so ``import energon_packing.algorithms`` stays light.
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

logging.getLogger("energon_packing").addHandler(logging.NullHandler())

__version__ = "0.1.0"

# public name -> module that defines it (imported lazily, PEP 562)
_LAZY = {
    "PackingTaskEncoder": "task_encoder",
    "PackedSample": "task_encoder",
    "PackingError": "task_encoder",
    "ConversationSample": "samples",
    "EncodedConversation": "samples",
    "PackingConfig": "config",
    "PackingStats": "stats",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'energon_packing' has no attribute {name!r}")
    return getattr(importlib.import_module(f"energon_packing.{module}"), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
