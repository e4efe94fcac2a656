"""Loader batches in the form Megatron-Bridge's training steps read them (``to_megatron_bridge``).

Every name and convention below was read from Bridge's own code:

* ``step="sft"``: the packed SFT step (``training/gpt_step.py``) as Bridge's packed dataset
  collates it (``GPTSFTPackedDataset.collate_fn`` in ``data/datasets/sft.py``), in the
  megatron-bridge 0.3.1 wheel. Its ``get_packed_seq_params`` reads ``cu_seqlens`` as the
  PADDED boundaries, ``-1``-filled to one width for the batch and trimmed at
  ``cu_seqlens_argmin``; ``cu_seqlens_unpadded`` (and its argmin) as the real ones; and
  ``max_seqlen``. Without the argmins it trims at ``torch.argmin``, which is 0 for an array with
  no ``-1``: our ``cu_seqlens_padded`` as emitted gives empty boundaries there.
* ``step="vlm"``: the VLM step (``training/vlm_step.py``) of Bridge's newest public source,
  NVIDIA-NeMo/Megatron-Bridge at commit ``067f987df03b8355b03192d88d70f1709fedf51a``
  (2026-08-22), with the single THD row its collate-time in-batch packing builds
  (``data/packing/in_batch.py``, ``models/qwen_vl/data/collate_fn.py``). The 0.3.1 wheel's VLM
  step cannot take a loader pack: its ``get_batch`` returns no boundaries unless
  ``pack_sequences_in_batch``, and then re-packs every row as ONE sequence (its
  ``pack_batch_sequences`` cuts the row at its last non-pad token), so the conversations of a
  pack would attend to each other; its Qwen2.5-VL model also computes mRoPE positions over the
  whole row, and its ``get_packed_seq_params`` reads no ``cu_seqlens_q`` keys.
  ``step="sft"`` carries no media (``gpt_step`` reads none; a warning says so once).

Both give ``labels`` and ``loss_mask`` already shifted (position t predicts token t+1; the
weight is ``token_mask`` of t+1, which is 0 on every conversation's first token, so nothing is
learnt across a boundary) and 1-D ``position_ids`` restarting per conversation and continuing
through its padding, as Bridge's collates build them. Bridge's Qwen-VL models compute their
mRoPE positions themselves from ``input_ids``, the image grids and the boundaries; on real
tokens they equal the loader's (``tests/test_megatron_bridge.py``).

Bridge is optional: nothing here imports it. The media ride in Bridge's ``GenericVisualInputs``
when ``megatron.bridge`` is already imported and has it, else in :class:`VisualInputs`, ours,
with the same fields and methods (importing Bridge's package pulls Transformer Engine and its
model bridges, which a data loader must not pay for or fail on).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import torch

from energon_packing.schema import (
    CU_SEQLENS,
    CU_SEQLENS_PADDED,
    INPUT_IDS,
    TOKEN_MASK,
    is_empty,
    model_fields,
    not_prepacked,
)
from energon_packing.trainer.shim import is_prepacked, text_positions, validate_prepacked

__all__ = [
    "BRIDGE_COMMIT",
    "IGNORE_INDEX",
    "STEPS",
    "VisualInputs",
    "to_megatron_bridge",
    "visual_inputs_class",
]

logger = logging.getLogger("energon_packing")
_warned: set[str] = set()

#: The public Megatron-Bridge commit whose VLM step ``step="vlm"`` follows.
BRIDGE_COMMIT = "067f987df03b8355b03192d88d70f1709fedf51a"
STEPS = ("sft", "vlm")
#: Bridge's label for positions that train nothing (``data/datasets/utils.IGNORE_INDEX``).
IGNORE_INDEX = -100


@dataclass
class VisualInputs:
    """Bridge's ``GenericVisualInputs`` (``training/utils/visual_inputs.py`` at
    :data:`BRIDGE_COMMIT`), for when Bridge is not imported: the same fields, the same methods.

    Bridge's VLM step moves every field to the GPU through ``__dict__`` and passes
    :meth:`normalized_for_model` to the model, so this class is a drop-in for it.
    """

    pixel_values: torch.Tensor | None = None
    pixel_values_videos: torch.Tensor | None = None
    image_grid_thw: torch.Tensor | None = None
    video_grid_thw: torch.Tensor | None = None
    second_per_grid_ts: torch.Tensor | None = None
    image_sizes: torch.Tensor | None = None
    image_position_ids: torch.Tensor | None = None
    mm_token_type_ids: torch.Tensor | None = None

    def as_model_kwargs(self) -> dict[str, torch.Tensor]:
        """The fields that are set, as forward keyword arguments."""
        return {
            f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None
        }

    def normalized_for_model(self) -> dict[str, torch.Tensor]:
        """:meth:`as_model_kwargs` with batched Qwen-style tensors flattened, as Bridge does:
        ``[B, N, C, H, W] -> [B*N, C, H, W]`` and ``[B, N, 3] -> [B*N, 3]``."""
        kwargs = self.as_model_kwargs()
        for name in ("pixel_values", "pixel_values_videos"):
            value = kwargs.get(name)
            if isinstance(value, torch.Tensor) and value.dim() == 5:
                kwargs[name] = value.flatten(0, 1)
        for name in ("image_grid_thw", "video_grid_thw"):
            value = kwargs.get(name)
            if isinstance(value, torch.Tensor) and value.dim() == 3:
                kwargs[name] = value.reshape(-1, value.size(-1))
        return kwargs


def visual_inputs_class() -> type:
    """Bridge's ``GenericVisualInputs`` when ``megatron.bridge`` is imported and has it, else
    :class:`VisualInputs`. Never imports Bridge's package itself (see the module docstring)."""
    if "megatron.bridge" in sys.modules:
        try:
            from megatron.bridge.training.utils.visual_inputs import GenericVisualInputs
        except ImportError:  # Bridge 0.3.1 has only Qwen2_5_VLVisualInputs (two fields)
            return VisualInputs
        return GenericVisualInputs
    return VisualInputs


def to_megatron_bridge(
    batch: Mapping[str, Any], *, step: str = "sft", validate: bool = True
) -> dict[str, Any] | None:
    """One loader batch as a Megatron-Bridge training step reads it from its data iterator.

    Args:
        batch: A prepacked loader batch (B packs of width C).
        step: ``"sft"``: Bridge's packed SFT step (``gpt_step``): ``tokens``, ``labels``,
            ``loss_mask``, ``position_ids`` ``[B, C]``; ``cu_seqlens`` (padded) and
            ``cu_seqlens_unpadded`` (real) ``[B, n_max + 2]`` int32, ``-1``-filled; their
            ``*_argmin`` ``[B, 1]``; ``max_seqlen`` ``[B, 1]`` int32. Bridge's step reads one
            pack per micro-batch (``micro_batch_size=1``; its ``get_packed_seq_params`` calls
            ``.item()`` on the argmin). ``"vlm"``: Bridge's VLM step at :data:`BRIDGE_COMMIT`:
            the B packs end to end in one THD row, ``input_ids``, ``labels`` (``-100`` where
            nothing trains), ``loss_mask``, ``position_ids`` ``[1, B*C]``; ``cu_seqlens_q/kv``
            (real) and, where they differ, ``cu_seqlens_q/kv_padded`` (1-D int32);
            ``max_seqlen_q/kv`` (0-d int32 tensors: the step moves them with ``.cpu()``);
            ``total_tokens`` (the step recomputes it for hybrid models); ``visual_inputs``
            (see :func:`visual_inputs_class`).
        validate: Check the batch against the pack contract first.

    Returns:
        The step's batch dict, or None for an accounting-only batch (zero packs: nothing to
        train on; skip it).
    """
    if step not in STEPS:
        raise ValueError(f"step={step!r} is not valid; choose one of {', '.join(STEPS)}")
    if is_empty(batch):
        return None
    if not is_prepacked(batch):
        raise not_prepacked("to_megatron_bridge")
    if validate:
        validate_prepacked(batch)
    cu = [torch.as_tensor(c).to(torch.int32) for c in batch[CU_SEQLENS]]
    padded = [torch.as_tensor(c).to(torch.int32) for c in batch[CU_SEQLENS_PADDED]]
    ids = batch[INPUT_IDS]
    labels = torch.roll(ids, -1, dims=1)
    loss_mask = torch.roll(batch[TOKEN_MASK], -1, dims=1).to(torch.float32)
    positions = torch.stack([text_positions(p) for p in padded])
    if step == "sft":
        media = [key for key in model_fields(batch)[0] if any(len(v) for v in batch[key])]
        if media and "sft" not in _warned:
            _warned.add("sft")
            logger.warning(
                "to_megatron_bridge(step='sft'): Bridge's gpt_step reads no media; the packs' "
                "%s stay out of its batch (step='vlm' carries them)",
                ", ".join(media),
            )
        return _sft(ids, labels, loss_mask, positions, cu, padded)
    return _vlm(batch, ids, labels, loss_mask, positions, cu, padded)


def _minus_one_filled(rows: list[torch.Tensor], width: int) -> torch.Tensor:
    out = torch.full((len(rows), width), -1, dtype=torch.int32)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
    return out


def _sft(ids, labels, loss_mask, positions, cu, padded) -> dict[str, Any]:
    # Bridge's collate fills to the longest boundary array + 1, so every row has a -1 to find
    width = max(len(c) for c in padded) + 1
    cu_seqlens = _minus_one_filled(padded, width)
    cu_seqlens_unpadded = _minus_one_filled(cu, width)
    max_seqlen = torch.stack([(p[1:] - p[:-1]).max() for p in padded]).to(torch.int32)
    return {
        "tokens": ids,
        "labels": labels,
        "loss_mask": loss_mask,
        "position_ids": positions,
        "cu_seqlens": cu_seqlens,
        "cu_seqlens_argmin": torch.argmin(cu_seqlens, dim=1, keepdim=True),
        "cu_seqlens_unpadded": cu_seqlens_unpadded,
        "cu_seqlens_unpadded_argmin": torch.argmin(cu_seqlens_unpadded, dim=1, keepdim=True),
        "max_seqlen": max_seqlen.unsqueeze(1),
    }


def _end_to_end(rows: list[torch.Tensor], offsets: list[int]) -> torch.Tensor:
    """Per-pack cumulative boundaries as the boundaries of the packs laid end to end."""
    parts = [rows[0][:1]] + [row[1:] + offset for row, offset in zip(rows, offsets)]
    return torch.cat(parts).to(torch.int32)


def _vlm(batch, ids, labels, loss_mask, positions, cu, padded) -> dict[str, Any]:
    rows, width = ids.shape
    cu_q = _end_to_end(cu, _running([int(c[-1]) for c in cu]))
    cu_padded = _end_to_end(padded, [i * width for i in range(rows)])
    max_seqlen = torch.tensor(int((cu_padded[1:] - cu_padded[:-1]).max()), dtype=torch.int32)
    labels = labels.masked_fill(loss_mask == 0, IGNORE_INDEX)
    out: dict[str, Any] = {
        "input_ids": ids.reshape(1, -1),
        "labels": labels.reshape(1, -1),
        "loss_mask": loss_mask.reshape(1, -1),
        "position_ids": positions.reshape(1, -1),
        "cu_seqlens_q": cu_q,
        "cu_seqlens_kv": cu_q,
    }
    if not torch.equal(cu_q, cu_padded):  # Bridge emits the padded pair only when it differs
        out["cu_seqlens_q_padded"] = cu_padded
        out["cu_seqlens_kv_padded"] = cu_padded
    out["max_seqlen_q"] = max_seqlen
    out["max_seqlen_kv"] = max_seqlen.clone()
    out["total_tokens"] = rows * width
    out["visual_inputs"] = _visual_inputs(batch)
    return out


def _running(totals: list[int]) -> list[int]:
    """Offsets of each pack's real boundaries: the real tokens of the packs before it."""
    offsets, acc = [], 0
    for total in totals:
        offsets.append(acc)
        acc += total
    return offsets


def _visual_inputs(batch: Mapping[str, Any]) -> Any:
    """The packs' media, concatenated in pack order, in Bridge's visual-inputs class; fields
    without an image anywhere stay None (Bridge's collate passes only present media)."""
    cls = visual_inputs_class()
    names = {f.name for f in fields(cls)}
    media, tokens = model_fields(batch)
    values: dict[str, torch.Tensor] = {}
    for key in media:
        parts = [torch.as_tensor(part) for part in batch[key] if len(part)]
        if parts:
            values[key] = torch.cat(parts) if len(parts) > 1 else parts[0]
    for key in tokens:
        values[key] = batch[key].reshape(1, -1)
    unknown = sorted(set(values) - names)
    if unknown:
        raise ValueError(
            f"{unknown[0]}: Bridge's {cls.__name__} has no field for the model inputs {unknown} "
            f"(its fields: {sorted(names)}); its VLM step would not pass them to the model "
            f"(source_ids={batch.get('source_ids')})"
        )
    return cls(**values)
