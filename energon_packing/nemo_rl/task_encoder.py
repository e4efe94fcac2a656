"""A task encoder NeMo-RL's Energon loader constructs as it constructs its own.

NeMo-RL builds its SFT task encoder with
``encoder(adapter=..., cooker_functions=..., include_source_ids=..., packer=..., tokenizer=...,
sequence_length_pad_multiple=..., only_unmask_final=..., **task_encoder.options)``.
:class:`NemoRLTaskEncoder` takes exactly those and maps each onto this package's knobs:

========================================  =================================================
NeMo-RL argument                          here
========================================  =================================================
``adapter`` (its processor adapter)       ``processor=adapter.processor``
``tokenizer``                             the processor's tokenizer, or a text-only model's
``packer`` (``get_packer(...)``)          ``algorithm`` by the packer's name,
                                          ``max_input_seq_length = packer.bin_capacity``,
                                          ``max_per_pack``, ``delta``
``sequence_length_pad_multiple``          ``pad_multiple``
``only_unmask_final``                     ``train_on="last_assistant_message"`` (default
                                          ``"assistant_messages"``: the whole rendered
                                          assistant message, as NeMo-RL's producer trains)
``include_source_ids``                    ``source_ids`` in each batch
``cooker_functions``                      the cookers of crude datasets
``**options``                             any :class:`~energon_packing.config.PackingConfig`
                                          knob (they win over the packer's)
========================================  =================================================

Its batches are NeMo-RL's (:func:`~energon_packing.nemo_rl.batch.to_nemo_rl`): a
``BatchedDataDict`` of what NeMo-RL's data plane and prepacked consumer take, the rest in its
``extras`` attribute. A worker's leftover skips (after its last pack) are logged, not sent: an
accounting-only batch would reach NeMo-RL's loop, which takes every batch as a step.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

from megatron.energon import stateless

from energon_packing.loader.task_encoder import PackingTaskEncoder
from energon_packing.nemo_rl.batch import to_nemo_rl
from energon_packing.packing.algorithms import ALGORITHMS

__all__ = ["NEMO_RL_PACKERS", "NemoRLTaskEncoder"]

logger = logging.getLogger("energon_packing")

#: NeMo-RL packer class -> this package's algorithm of the same name.
NEMO_RL_PACKERS = {
    "ConcatenativePacker": "concatenative",
    "FirstFitDecreasingPacker": "first_fit_decreasing",
    "FirstFitShufflePacker": "first_fit_shuffle",
    "ModifiedFirstFitDecreasingPacker": "modified_first_fit_decreasing",
    "GreedyKnapsackPacker": "greedy_knapsack",
    "BalancedGreedyKnapsackPacker": "balanced_greedy_knapsack",
}


def _packer_knobs(packer: Any) -> dict[str, Any]:
    """This package's knobs for a NeMo-RL packer object (or an algorithm name)."""
    if packer is None:
        return {}
    if isinstance(packer, str):
        return {"algorithm": packer.lower()}
    name = next(
        (
            NEMO_RL_PACKERS[k.__name__]
            for k in type(packer).__mro__
            if k.__name__ in NEMO_RL_PACKERS
        ),
        None,
    )
    if name is None:
        raise ValueError(
            f"packer {type(packer).__name__} has no counterpart here; known: "
            f"{', '.join(NEMO_RL_PACKERS)}, or pass algorithm= (one of {', '.join(ALGORITHMS)})"
        )
    knobs: dict[str, Any] = {"algorithm": name, "max_input_seq_length": int(packer.bin_capacity)}
    per_bin = getattr(packer, "max_sequences_per_bin", None)
    if isinstance(per_bin, int) and per_bin > 0:
        knobs["max_per_pack"] = per_bin
    delta = getattr(packer, "delta", getattr(packer, "balanced_knapsack_delta", None))
    if name == "balanced_greedy_knapsack" and isinstance(delta, int):
        knobs["delta"] = delta
    return knobs


class NemoRLTaskEncoder(PackingTaskEncoder):
    """:class:`~energon_packing.PackingTaskEncoder` with NeMo-RL's constructor and batches.

    Args:
        adapter: NeMo-RL's processor adapter (its ``processor`` is used), or None.
        cooker_functions: Energon cookers for crude datasets (default: this package's).
        include_source_ids: Put ``source_ids`` in each batch (NeMo-RL's worker tags rows).
        packer: A NeMo-RL packer (``get_packer(name, capacity, ...)``) or an algorithm name.
        tokenizer: The tokenizer NeMo-RL passes; used when the adapter has no processor.
        sequence_length_pad_multiple: ``pad_multiple``.
        only_unmask_final: Train the last assistant message only.
        loss_mask_mode: NeMo-RL's; only ``None`` (masks from the template) is supported.
        **options: :class:`~energon_packing.config.PackingConfig` knobs.
    """

    def __init__(
        self,
        *,
        adapter: Any = None,
        cooker_functions: Any = None,
        include_source_ids: bool = True,
        packer: Any = None,
        tokenizer: Any = None,
        sequence_length_pad_multiple: int = 1,
        only_unmask_final: bool = False,
        loss_mask_mode: str | None = None,
        **options: Any,
    ):
        if loss_mask_mode is not None:
            raise ValueError(
                f"loss_mask_mode={loss_mask_mode!r} is not supported: the loss mask comes from "
                f"the chat template (train_on)"
            )
        knobs = {
            **_packer_knobs(packer),
            "pad_multiple": sequence_length_pad_multiple,
            "train_on": "last_assistant_message" if only_unmask_final else "assistant_messages",
            **options,
        }
        if "max_input_seq_length" not in knobs:
            raise ValueError(
                "NemoRLTaskEncoder needs the pack width: pass NeMo-RL's packer (its bin_capacity) "
                "or max_input_seq_length"
            )
        processor = getattr(adapter, "processor", None) if adapter is not None else None
        source = processor if processor is not None else tokenizer
        if source is None:
            raise ValueError("NemoRLTaskEncoder needs an adapter with a processor, or a tokenizer")
        super().__init__(processor=source, **knobs)
        # the attributes NeMo-RL's own encoder carries (its loader reads some of them)
        self.adapter, self.packer, self.tokenizer = adapter, packer, tokenizer
        self.include_source_ids = include_source_ids
        self.sequence_length_pad_multiple = sequence_length_pad_multiple
        self.only_unmask_final = only_unmask_final
        if cooker_functions:
            self.cookers = tuple(cooker_functions)

    @stateless
    def batch(self, samples: list) -> Any:
        """NeMo-RL's batch: ``to_nemo_rl`` data as a ``BatchedDataDict``, ``.extras`` beside."""
        data, extras = to_nemo_rl(super().batch(samples), source_ids=self.include_source_ids)
        data.extras = extras
        return data

    def _tail(self) -> None:
        """NeMo-RL takes every batch as a step: leftover skips are logged instead."""
        events = self.stats.drain()
        if events:
            reasons = Counter(reason for _, reason in events)
            logger.warning(
                "%d sample(s) skipped after this worker's last pack (%s); counted in the "
                "worker's PackingTaskEncoder.stats",
                len(events),
                ", ".join(f"{reason}: {n}" for reason, n in sorted(reasons.items())),
            )
        return None
