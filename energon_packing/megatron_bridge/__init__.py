"""Megatron-Bridge adapter: loader packs as Bridge's packed SFT step and its VLM step read them.

* :func:`to_megatron_bridge` (``step="sft"`` or ``step="vlm"``): one loader batch as the step's
  data iterator yields it;
* :class:`VisualInputs`: Bridge's visual-inputs container (same fields and methods), used when
  Bridge is not imported;
* :data:`BRIDGE_COMMIT`: the public Bridge commit the VLM format was read from.

Imports without Megatron-Bridge (it is optional); conventions and proofs in
:mod:`energon_packing.megatron_bridge.batch` and ``tests/test_megatron_bridge.py``.
"""

from __future__ import annotations

from energon_packing.megatron_bridge.batch import (
    BRIDGE_COMMIT,
    IGNORE_INDEX,
    STEPS,
    VisualInputs,
    to_megatron_bridge,
    visual_inputs_class,
)

__all__ = [
    "BRIDGE_COMMIT",
    "IGNORE_INDEX",
    "STEPS",
    "VisualInputs",
    "to_megatron_bridge",
    "visual_inputs_class",
]
