"""Hugging Face ``transformers``: a loader pack through the model's own forward.

    for batch in loader:
        if is_empty(batch):  # an accounting-only batch: skips, no pack
            continue
        out = model(**to_hf(batch, model=model))  # out.loss: mean over the pack's labels

:func:`to_hf` gives the keyword arguments of one pack in the form each family's packed path
reads (see :mod:`energon_packing.hf.inputs`); :class:`PackedTrainer` (``transformers.Trainer``
with the step's exact loss, :mod:`energon_packing.hf.trainer`) trains on :class:`HFPacks`.
Imports without ``transformers`` (``PackedTrainer`` imports it when first used).
"""

from typing import Any

from energon_packing.hf.inputs import IGNORE_INDEX, HFInputs, text_positions, to_hf
from energon_packing.hf.masks import gemma3_mask_mapping
from energon_packing.hf.trainer import HFPacks, PackedLossMixin, packed_trainer_class
from energon_packing.schema import is_empty

__all__ = [
    "IGNORE_INDEX",
    "HFInputs",
    "HFPacks",
    "PackedLossMixin",
    "PackedTrainer",
    "gemma3_mask_mapping",
    "is_empty",
    "packed_trainer_class",
    "text_positions",
    "to_hf",
]


def __getattr__(name: str) -> Any:
    if name == "PackedTrainer":  # transformers.Trainer subclass: import transformers only now
        cls = packed_trainer_class()
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
