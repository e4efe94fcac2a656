"""The trainer side: the shim (prepacked batches -> microbatches with varlen attention params),
the trainer-side packing path, data-parallel rank alignment and the step's loss normalisation.
Never imports Energon."""

from energon_packing.trainer.loss import (
    DEFAULT_DENOMINATOR,
    DENOMINATORS,
    GRAD_REDUCTIONS,
    StepCounts,
    StepLoss,
    counts_of,
    step_loss,
    token_loss,
    weighted_loss_sum,
    weights_of,
)
from energon_packing.trainer.ranks import FILLER_KEY, align_ranks, check_microbatches, filler_batch
from energon_packing.trainer.shim import (
    MICRO_BATCH_INDICES,
    MICRO_BATCH_LENGTHS,
    Microbatch,
    check_model_inputs,
    cp_indices,
    is_prepacked,
    make_packed_seq_params,
    micro_batch_shapes,
    packed_seq_params_class,
    prepacked_microbatches,
    validate_prepacked,
)
from energon_packing.trainer.trainer_side import pack_microbatches, padded_microbatch

__all__ = [
    "DEFAULT_DENOMINATOR",
    "DENOMINATORS",
    "FILLER_KEY",
    "GRAD_REDUCTIONS",
    "MICRO_BATCH_INDICES",
    "MICRO_BATCH_LENGTHS",
    "Microbatch",
    "StepCounts",
    "StepLoss",
    "align_ranks",
    "check_microbatches",
    "check_model_inputs",
    "counts_of",
    "cp_indices",
    "filler_batch",
    "is_prepacked",
    "make_packed_seq_params",
    "micro_batch_shapes",
    "pack_microbatches",
    "packed_seq_params_class",
    "padded_microbatch",
    "prepacked_microbatches",
    "step_loss",
    "token_loss",
    "validate_prepacked",
    "weighted_loss_sum",
    "weights_of",
]
