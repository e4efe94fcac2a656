"""Loader-side sequence packing for Megatron-Energon: full-width multimodal packs, at the bound.

The package is split into rooms by what they may import (``tests/test_layout.py`` enforces it):

* :mod:`energon_packing.packing`: the pure packing core (no torch, no Energon);
* :mod:`energon_packing.encoding`: conversations to tokens, masks, image costs (no Energon);
* :mod:`energon_packing.loader`: everything that touches Energon;
* :mod:`energon_packing.incoming`: data coming in (convert, the shard check, ``prepare``);
* :mod:`energon_packing.trainer`: the trainer-side shim (no Energon);
* :mod:`energon_packing.schema`, :mod:`energon_packing.config`, :mod:`energon_packing.stats`,
  :mod:`energon_packing.errors`:
  the pack schema, the knobs and the accounting every room shares;
* :mod:`energon_packing.tools` (the CLI, an extra) and :mod:`energon_packing.testing`
  (generated data, the tiny reference model): never imported by the library.

The names below are imported on first use (PEP 562), so ``import energon_packing.packing``
stays light.
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

logging.getLogger("energon_packing").addHandler(logging.NullHandler())

__version__ = "0.2.0"

# public name -> module that defines it (imported lazily, PEP 562)
_LAZY = {
    "PackingTaskEncoder": "loader.task_encoder",
    "PackingError": "loader.task_encoder",
    "RestoreMismatchError": "loader.energon",
    "ShardChangedError": "loader.energon",
    "ConversationSample": "loader.samples",
    "EncodedConversation": "loader.samples",
    "PackedSample": "loader.samples",
    "PackingConfig": "config",
    "PackingStats": "stats",
    "MetricsAggregator": "stats",
    "SkipWarning": "stats",
    "PackContractError": "schema",
    "StatefulLayersError": "encoding.models",
    "load_processor": "encoding.processor_loading",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'energon_packing' has no attribute {name!r}")
    return getattr(importlib.import_module(f"energon_packing.{module}"), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
