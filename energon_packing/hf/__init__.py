"""Hugging Face ``transformers``: a loader pack through the model's own forward.

    for batch in loader:
        if is_empty(batch):  # an accounting-only batch: skips, no pack
            continue
        out = model(**to_hf(batch, model=model))  # out.loss: mean over the pack's labels

:func:`to_hf` gives the keyword arguments of one pack in the form each family's packed path
reads (see :mod:`energon_packing.hf.inputs`). Imports without ``transformers``.
"""

from energon_packing.hf.inputs import IGNORE_INDEX, HFInputs, text_positions, to_hf
from energon_packing.hf.masks import gemma3_mask_mapping
from energon_packing.schema import is_empty

__all__ = ["IGNORE_INDEX", "HFInputs", "gemma3_mask_mapping", "is_empty", "text_positions", "to_hf"]
