"""The pack contract's invariants, checked by the producer and by the trainer-side shim.

One function for both sides, so they cannot drift apart. Pure numpy; a failure raises
:class:`PackContractError` naming the key, the numbers and the pack's ``source_ids``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def round_up(value: int, multiple: int) -> int:
    """``value`` padded up to a multiple of ``multiple`` (a source's padded length)."""
    return -(-value // multiple) * multiple


class PackContractError(ValueError):
    """A pack (or prepacked batch) breaks the contract; the message names key and sources."""


def check_pack(
    *,
    input_ids: np.ndarray,
    token_mask: np.ndarray,
    cu_seqlens: np.ndarray,
    cu_seqlens_padded: np.ndarray,
    source_ids: Sequence[str],
    padding_mask: np.ndarray | None = None,
    image_grid_thw: np.ndarray | None = None,
    image_source_index: np.ndarray | None = None,
    pad_multiple: int = 1,
    image_pad_id: int | None = None,
    merge_size: int = 2,
    cp_size: int = 1,
) -> None:
    """Raises :class:`PackContractError` unless one pack (row) meets every invariant."""

    def fail(key: str, message: str) -> None:
        raise PackContractError(f"{key}: {message} (pack source_ids={list(source_ids)})")

    capacity = int(input_ids.shape[-1])
    cu = np.asarray(cu_seqlens, dtype=np.int64)
    cup = np.asarray(cu_seqlens_padded, dtype=np.int64)
    if cu.ndim != 1 or cup.ndim != 1 or len(cu) != len(cup) or len(cu) < 2:
        fail(
            "cu_seqlens",
            f"cu_seqlens {cu.tolist()} and cu_seqlens_padded {cup.tolist()} "
            "must be 1-D, of equal length >= 2",
        )
    if cu[0] != 0 or cup[0] != 0:
        fail("cu_seqlens", f"must start at 0, got {cu[0]} and {cup[0]}")
    real, pad = np.diff(cu), np.diff(cup)
    if (real <= 0).any() or (pad <= 0).any():
        fail("cu_seqlens", f"must be strictly increasing: {cu.tolist()} / {cup.tolist()}")
    if (real > pad).any():
        i = int(np.argmax(real > pad))
        fail("cu_seqlens", f"source {i} has {real[i]} real tokens but a padded extent of {pad[i]}")
    if cup[-1] != capacity:
        fail("cu_seqlens_padded", f"last entry {cup[-1]} != pack width {capacity}")
    if len(source_ids) != len(real):
        fail("source_ids", f"{len(source_ids)} ids for {len(real)} sources")
    if (pad[:-1] % pad_multiple).any():
        i = int(np.argmax(pad[:-1] % pad_multiple != 0))
        fail(
            "cu_seqlens_padded",
            f"source {i} padded to {pad[i]}, not a multiple of pad_multiple={pad_multiple}",
        )
    if capacity % pad_multiple:
        fail("input_ids", f"pack width {capacity} is not a multiple of pad_multiple={pad_multiple}")
    if cp_size > 1 and (pad % (2 * cp_size)).any():
        i = int(np.argmax(pad % (2 * cp_size) != 0))
        fail(
            "cu_seqlens_padded",
            f"source {i} has padded length {pad[i]}, not divisible by "
            f"2*cp_size={2 * cp_size}; set pad_multiple to a multiple of {2 * cp_size}",
        )
    starts = cup[:-1]
    mask = np.asarray(token_mask)
    if mask.shape[-1] != capacity:
        fail("token_mask", f"width {mask.shape[-1]} != {capacity}")
    if (mask[starts] != 0).any():
        i = int(np.argmax(mask[starts] != 0))
        fail("token_mask", f"the first token of source {i} (position {starts[i]}) is trained")
    real_positions = np.zeros(capacity, dtype=bool)
    for s, n in zip(starts, real):
        real_positions[s : s + n] = True
    if (mask[~real_positions] != 0).any():
        fail(
            "token_mask",
            f"{int((mask[~real_positions] != 0).sum())} pad/tail positions are trained",
        )
    if padding_mask is not None and not np.array_equal(np.asarray(padding_mask), ~real_positions):
        fail("padding_mask", "must be True exactly on pad and tail positions")
    if image_grid_thw is not None and image_source_index is not None and image_pad_id is not None:
        grids = np.asarray(image_grid_thw, dtype=np.int64).reshape(-1, 3)
        owners = np.asarray(image_source_index, dtype=np.int64)
        if len(owners) != len(grids):
            fail("image_source_index", f"{len(owners)} owners for {len(grids)} images")
        ids = np.asarray(input_ids)
        for i, (s, n) in enumerate(zip(starts, real)):
            expected = int(grids[owners == i].prod(axis=1).sum()) // (merge_size**2)
            found = int((ids[s : s + n] == image_pad_id).sum())
            if found != expected:
                fail(
                    "input_ids",
                    f"source {i} ({source_ids[i]}) has {found} image-pad tokens, "
                    f"its images need {expected}",
                )
