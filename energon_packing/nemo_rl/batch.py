"""Loader batches in the form NeMo-RL's data path takes them (``to_nemo_rl``).

NeMo-RL's SFT worker, its data plane and its prepacked consumer accept, for a batch of B packs
(facts with their sources in ``tests/test_nemo_rl.py``):

* per-row tensors whose first dimension is B (the data plane refuses any other value:
  ``packing_metrics``, ``packing_skipped``, ``__restore_key__``);
* the jagged per-pack boundaries as ``PackedTensor(list_of_1d, dim_to_pack=0)`` (its TP
  broadcast rejects tensor-bearing Python lists), media likewise;
* no ``[B, S]``-validated key whose dimension 1 is not the sequence (mRoPE's ``[3, B, C]``
  ``position_ids`` would fail; NeMo-RL's model computes positions itself);
* no pixel key when no pack of the batch has an image.

``to_nemo_rl`` splits a batch into that ``data`` and ``extras`` (everything the trainer must not
broadcast: ``source_ids``, positions, masks NeMo-RL rebuilds, the accounting, the microbatch
shapes under NeMo-RL's lower-case names). NeMo-RL's own classes are used when importable.
"""

from __future__ import annotations

from collections import UserDict
from collections.abc import Mapping
from typing import Any

import torch

from energon_packing.schema import (
    CU_SEQLENS,
    CU_SEQLENS_PADDED,
    INPUT_IDS,
    INPUT_LENGTHS,
    SAMPLE_MASK,
    SOURCE_IDS,
    TOKEN_MASK,
    is_empty,
    model_fields,
    not_prepacked,
)
from energon_packing.trainer.shim import MICRO_BATCH_INDICES, MICRO_BATCH_LENGTHS

__all__ = [
    "NEMO_RL_MICRO_BATCH_INDICES",
    "NEMO_RL_MICRO_BATCH_LENGTHS",
    "NemoRLBatch",
    "batched_data_dict",
    "packed_tensor",
    "to_nemo_rl",
]

#: The names NeMo-RL's SFT worker publishes the microbatch shapes under (its extra info).
NEMO_RL_MICRO_BATCH_INDICES = MICRO_BATCH_INDICES.lower()  # "micro_batch_indices"
NEMO_RL_MICRO_BATCH_LENGTHS = MICRO_BATCH_LENGTHS.lower()
#: What NeMo-RL's prepacked producer emits per row (plus media and token fields).
_ROW_KEYS = (INPUT_IDS, INPUT_LENGTHS, TOKEN_MASK, SAMPLE_MASK)


def packed_tensor(rows: list[torch.Tensor]) -> Any:
    """NeMo-RL's ``PackedTensor(rows, dim_to_pack=0)`` when importable, else the list."""
    try:
        from nemo_rl.data.multimodal_utils import PackedTensor
    except ImportError:
        return list(rows)
    return PackedTensor(list(rows), dim_to_pack=0)


class NemoRLBatch(UserDict):
    """A batch for NeMo-RL when ``BatchedDataDict`` is not importable: a mapping (not a dict,
    so Energon adds no ``__restore_key__`` key), with :attr:`extras` beside its keys."""

    extras: dict


def batched_data_dict(data: Mapping[str, Any]) -> Any:
    """NeMo-RL's ``BatchedDataDict(data)`` when importable, else a :class:`NemoRLBatch`."""
    try:
        from nemo_rl.distributed.batched_data_dict import BatchedDataDict
    except ImportError:
        return NemoRLBatch(data)
    return BatchedDataDict(data)


def to_nemo_rl(batch: Mapping[str, Any], *, source_ids: bool = False) -> tuple[Any, dict]:
    """``(data, extras)``: what NeMo-RL's data path takes, and the rest.

    Args:
        batch: A prepacked loader batch.
        source_ids: Keep ``source_ids`` in ``data`` too (NeMo-RL's producer does; its SFT
            worker takes them out before the data plane and tags the rows with them).

    Returns:
        ``data`` (a ``BatchedDataDict`` when NeMo-RL is importable), or None for an
        accounting-only batch (zero rows: nothing to train on); and ``extras``.
    """
    rows = int(batch[INPUT_IDS].shape[0])
    extras = {key: value for key, value in batch.items() if key not in _ROW_KEYS}
    extras[NEMO_RL_MICRO_BATCH_INDICES] = [[[i, i + 1] for i in range(rows)]]
    extras[NEMO_RL_MICRO_BATCH_LENGTHS] = [[int(n) for n in batch[INPUT_LENGTHS]]]
    if is_empty(batch):
        return None, extras
    if CU_SEQLENS not in batch or CU_SEQLENS_PADDED not in batch:
        raise not_prepacked("to_nemo_rl")
    data = {key: batch[key] for key in _ROW_KEYS}
    data[CU_SEQLENS] = packed_tensor(batch[CU_SEQLENS])
    data[CU_SEQLENS_PADDED] = packed_tensor(batch[CU_SEQLENS_PADDED])
    media, tokens = model_fields(batch)
    for key in media:  # no pixel key when no pack has an image, as NeMo-RL's producer
        if any(len(value) for value in batch[key]):
            data[key] = packed_tensor(batch[key])
            extras.pop(key)
    for key in tokens:
        data[key] = batch[key]
        extras.pop(key)
    if source_ids:
        data[SOURCE_IDS] = batch[SOURCE_IDS]
    for key in (CU_SEQLENS, CU_SEQLENS_PADDED):
        extras.pop(key)
    return batched_data_dict(data), extras
