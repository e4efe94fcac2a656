"""The trainer-side path: ordinary padded rows packed in the trainer, as NeMo-RL does.

A padded batch (the loader without a packing buffer: ``input_ids [B, S]`` + ``input_lengths``)
is binned by a token budget and each bin squeezed end to end by the same layout function the
loader uses (:func:`energon_packing.schema.layout`), only as wide as the bin needs::

    rows  A A A A A . . . . .      bin [A, B]   A A A A A p p p B B B B B B B B B B p p
          B B B B B B B B B B      ---------->  cu_seqlens [0, 5, 15], padded [0, 8, 20]

:func:`padded_microbatch` is the no-packing baseline: the rows as they are.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from energon_packing.packing.algorithms import DEFAULT_ALGORITHM, round_up
from energon_packing.packing.trainer_bins import trainer_bins
from energon_packing.schema import (
    IMAGE_GRID_THW,
    INPUT_IDS,
    INPUT_LENGTHS,
    PIXEL_VALUES,
    POSITION_IDS,
    SOURCE_IDS,
    TOKEN_MASK,
    Source,
    is_empty,
    layout,
)
from energon_packing.trainer.shim import (
    Microbatch,
    _per_row,
    _vision_index,
    build_microbatch,
    check_cp,
    row_positions,
)

__all__ = ["pack_microbatches", "padded_microbatch"]


def pack_microbatches(
    batch: Mapping[str, Any],
    *,
    token_budget: int,
    algorithm: str = DEFAULT_ALGORITHM,
    dp_size: int = 1,
    pad_multiple: int = 1,
    pack_multiple: int = 1,
    pad_id: int = 0,
    pad_to_largest: bool = False,
    max_per_bin: int | None = None,
    boundary: str = "padded",
    cp_size: int = 1,
    cp_rank: int = 0,
    cp_group: Any = None,
    image_token_id: int | None = None,
) -> list[Microbatch]:
    """Packs the rows of a padded batch into bins of ``token_budget`` tokens, one microbatch
    per bin (NeMo-RL's ``get_packer`` + ``_pack_sequences_for_megatron``).

    Args:
        batch: Ordinary padded rows (``input_ids [B, S]``, ``input_lengths``).
        token_budget: Tokens per bin.
        algorithm: Bin packing algorithm (``energon_packing.packing.ALGORITHMS``);
            ``concatenative``, ``first_fit_decreasing`` and ``modified_first_fit_decreasing``
            give NeMo-RL's bins exactly (:mod:`energon_packing.packing.trainer_bins`).
        dp_size: The bin count is made a multiple of this (NeMo-RL's ``_adjust_bin_count``).
        pad_multiple: Each row padded to a multiple of this before squeezing.
        pack_multiple: The packed width is rounded up to this.
        pad_to_largest: Every bin as wide as the widest (pipeline parallelism needs one shape
            per step, as NeMo-RL pads for pp > 1).
        max_per_bin: At most this many rows per bin (NeMo-RL's ``max_sequences_per_bin``).
        pad_id: The token between and after the squeezed rows (never attended by a real
            token, never trained).
        boundary, cp_size, cp_rank, cp_group, image_token_id: As for
            :func:`~energon_packing.trainer.shim.prepacked_microbatches`.
    """
    check_cp(cp_size, pad_multiple)
    if is_empty(batch):  # accounting only
        return []
    lengths = torch.as_tensor(batch[INPUT_LENGTHS]).tolist()
    padded = [round_up(n, pad_multiple) for n in lengths]
    bins = _bin_rows(batch, padded, token_budget, algorithm, dp_size, max_per_bin)
    widths = [round_up(sum(padded[r] for r in rows), pack_multiple) for rows in bins]
    return [
        _squeeze(
            batch,
            rows,
            lengths=lengths,
            width=max(widths) if pad_to_largest else width,
            pad_multiple=pad_multiple,
            pad_id=pad_id,
            boundary=boundary,
            cp_size=cp_size,
            cp_rank=cp_rank,
            cp_group=cp_group,
            image_token_id=image_token_id,
        )
        for rows, width in zip(bins, widths)
    ]


def _bin_rows(
    batch,
    padded: list[int],
    token_budget: int,
    algorithm: str,
    dp_size: int,
    max_per_bin: int | None,
) -> list[list[int]]:
    """Rows binned by a token budget; bin count a multiple of dp_size; packer order kept."""
    too_long = [(i, n) for i, n in enumerate(padded) if n > token_budget]
    if too_long:
        i, n = too_long[0]
        raise ValueError(
            f"row {i} ({batch[SOURCE_IDS][i] if SOURCE_IDS in batch else i}) needs {n} tokens "
            f"padded, more than token_budget={token_budget}; raise token_budget"
        )
    return trainer_bins(
        padded, token_budget, algorithm=algorithm, dp_size=dp_size, max_per_bin=max_per_bin
    )


def _squeeze(
    batch,
    rows: list[int],
    *,
    lengths: list[int],
    width: int,
    pad_multiple: int,
    pad_id: int,
    **common,
) -> Microbatch:
    """Rows of a padded batch (real ``lengths``) end to end, each padded to ``pad_multiple``,
    ``width`` wide (the tail folds into the last row, as in a loader pack)."""
    sources = []
    for r in rows:
        n = lengths[r]
        grids = _per_row(batch, IMAGE_GRID_THW, r)
        media = {}
        if grids is not None:
            media = {PIXEL_VALUES: batch[PIXEL_VALUES][r].numpy(), IMAGE_GRID_THW: grids.numpy()}
        sources.append(
            Source(
                key=str(r),
                input_ids=batch[INPUT_IDS][r, :n].numpy(),
                token_mask=batch[TOKEN_MASK][r, :n].numpy(),
                positions=row_positions(batch[POSITION_IDS], r)[..., :n].numpy(),
                media=media,
                images=0 if grids is None else len(grids),
            )
        )
    pack = layout(sources, width=width, pad_multiple=pad_multiple, pad_id=pad_id)
    return build_microbatch(
        ids=torch.from_numpy(pack.input_ids),
        positions=torch.from_numpy(pack.position_ids),
        token_mask=torch.from_numpy(pack.token_mask),
        cu=torch.from_numpy(pack.cu_seqlens),
        cu_padded=torch.from_numpy(pack.cu_seqlens_padded),
        media={name: torch.from_numpy(value) for name, value in pack.media.items()},
        token_fields={},
        source_ids=[k for r in rows for k in batch[SOURCE_IDS][r]] if SOURCE_IDS in batch else [],
        rows=tuple(rows),
        **common,
    )


def padded_microbatch(batch: Mapping[str, Any], *, image_token_id: int | None = None) -> Microbatch:
    """No packing: the padded ``[B, S]`` rows as they are, plain causal attention per row."""
    ids = batch[INPUT_IDS]
    vision = _vision_index(ids.flatten(), image_token_id)
    inputs = {"input_ids": ids, "position_ids": batch[POSITION_IDS], "packed_seq_params": None}
    if batch.get(PIXEL_VALUES):
        inputs["pixel_values"] = torch.cat(list(batch[PIXEL_VALUES]))
        inputs["image_grid_thw"] = torch.cat(list(batch[IMAGE_GRID_THW]))
        if vision is not None:
            inputs["vision_token_index"] = vision.view_as(ids)
    return Microbatch(
        model_inputs=inputs,
        labels=torch.roll(ids, -1, dims=-1),
        loss_mask=torch.roll(batch[TOKEN_MASK], -1, dims=-1),
        source_ids=[k for keys in batch.get(SOURCE_IDS, []) for k in keys],
        rows=tuple(range(ids.shape[0])),
        length=ids.shape[1],
        real_tokens=int(torch.as_tensor(batch[INPUT_LENGTHS]).sum()),
    )
