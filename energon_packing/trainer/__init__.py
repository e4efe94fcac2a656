"""The trainer side: the shim (prepacked batches -> microbatches with varlen attention params),
the trainer-side packing path, and data-parallel rank alignment. Never imports Energon."""

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
    token_loss,
    validate_prepacked,
)
from energon_packing.trainer.trainer_side import pack_microbatches, padded_microbatch

__all__ = [
    "FILLER_KEY",
    "MICRO_BATCH_INDICES",
    "MICRO_BATCH_LENGTHS",
    "Microbatch",
    "align_ranks",
    "check_microbatches",
    "check_model_inputs",
    "cp_indices",
    "filler_batch",
    "is_prepacked",
    "make_packed_seq_params",
    "micro_batch_shapes",
    "pack_microbatches",
    "packed_seq_params_class",
    "padded_microbatch",
    "prepacked_microbatches",
    "token_loss",
    "validate_prepacked",
]
