"""Gemma 3's mask mapping for one pack, built from the pack's boundaries and image blocks.

Gemma 3 attends causally, except that the tokens of one image see each other (bidirectional);
its sliding layers also keep a window. ``transformers`` builds that overlay for a packed row
with the image blocks remapped by the per-conversation positions, so a conversation reads the
first conversation's blocks. The forward takes the finished mapping instead
(``attention_mask={"full_attention": ..., "sliding_attention": ...}``), built here::

    segments   0 0 0 0 0 0 | 1 1 1 1 1 1 1 1      (padded extents: cu_seqlens_padded)
    blocks     . i i . . . | . . j j j . . .      (runs of token_type_ids == 1)
    allowed    same segment AND (key <= query OR same block) [AND key > query - window]

On the sliding layers that is transformers 5.13's rule (``create_masks_for_vision_model``:
the window cuts image blocks too); before 5.13 an image block stays whole under the window,
``(key <= query AND key > query - window) OR same block``. The installed release's rule is
built (:func:`energon_packing.encoding.hf_compat.gemma3_window_cuts_blocks`).

Additive ``[1, 1, C, C]`` in the model's dtype (0 where allowed, the dtype's minimum elsewhere),
the form eager and sdpa both read: two of them per pack (at C = 8192 in bfloat16, 128 MiB
each), dense attention over the row. No ``transformers`` import here.
"""

from __future__ import annotations

from typing import Any

import torch

from energon_packing.encoding import hf_compat

__all__ = ["MaskMapping", "additive_mask", "gemma3_mask_mapping", "image_blocks", "segment_ids"]


class MaskMapping(dict):
    """The per-layer-type masks of one pack (``{"full_attention": ..., "sliding_attention":
    ...}``), which Gemma's forward reads as they are.

    Gemma 3's forward before 5.13 (and Gemma 4's on 5.5) computes its own loss by cropping
    ``attention_mask[:, -n:]`` as a 2-D padding mask, which a plain dict cannot be (it raises
    there). Cropped so, this mapping is the 2-D mask of a pack: every position real to the
    loss (its labels already hold -100 where nothing is trained), so ``out.loss`` is the mean
    over the pack's labels, as newer releases compute it. A ``dict`` subclass: what rebuilds a
    mapping by its type (``Trainer._prepare_input``, DDP's input mover, ``copy``, ``pickle``)
    keeps it; ``torch.utils._pytree`` treats it as one leaf.
    """

    __slots__ = ()

    def __getitem__(self, key: Any) -> torch.Tensor:
        """The mask of a layer type; a tuple key (the older loss' ``[:, -n:]``) crops the
        pack's ``[1, C]`` all-ones 2-D mask."""
        if not isinstance(key, tuple):
            return super().__getitem__(key)
        if not self:
            raise KeyError(f"an empty mask mapping has no 2-D mask to crop by {key!r}")
        some = next(iter(self.values()))
        ones = torch.ones(some.shape[0], some.shape[-1], dtype=torch.long, device=some.device)
        return ones[key]


def segment_ids(
    cu_seqlens_padded: torch.Tensor, *, device: torch.device | None = None
) -> torch.Tensor:
    """``[C]``: which conversation (padded extent) each position belongs to."""
    bounds = torch.as_tensor(cu_seqlens_padded, dtype=torch.int64, device=device)
    return torch.repeat_interleave(torch.arange(len(bounds) - 1, device=device), bounds.diff())


def image_blocks(token_type_ids: torch.Tensor) -> torch.Tensor:
    """``[C]``: one id per run of image (or video) tokens (``token_type_ids`` 1 or 2), -1
    elsewhere; as ``transformers``' ``get_block_sequence_ids_for_mask`` numbers them, over the
    whole row."""
    types = token_type_ids.reshape(-1)
    image = (types == 1) | (types == 2)
    starts = image & ~torch.nn.functional.pad(image[:-1], (1, 0))
    return torch.where(image, torch.cumsum(starts.long(), 0) - 1, -1)


def additive_mask(
    segments: torch.Tensor,
    *,
    blocks: torch.Tensor | None = None,
    window: int | None = None,
    window_cuts_blocks: bool = True,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """``[1, 1, C, C]``: 0 where a query (row) may attend a key (column), dtype min elsewhere.
    ``window_cuts_blocks=False``: an image block is whole under the window (transformers
    before 5.13)."""
    positions = torch.arange(len(segments), device=segments.device)
    query, key = positions[:, None], positions[None, :]
    allowed = key <= query
    if window is not None and not window_cuts_blocks:
        allowed &= key > query - window
    if blocks is not None:
        allowed = allowed | ((blocks[:, None] == blocks[None, :]) & (blocks[:, None] >= 0))
    allowed &= segments[:, None] == segments[None, :]
    if window is not None and window_cuts_blocks:
        allowed &= key > query - window
    mask = torch.zeros(allowed.shape, dtype=dtype, device=segments.device)
    return mask.masked_fill_(~allowed, torch.finfo(dtype).min)[None, None]


def gemma3_mask_mapping(
    *,
    cu_seqlens_padded: torch.Tensor,
    token_type_ids: torch.Tensor,
    sliding_window: int,
    dtype: torch.dtype,
    device: torch.device | None = None,
    block_layers: tuple[str, ...] = ("full_attention", "sliding_attention"),
    window_cuts_blocks: bool | None = None,
) -> MaskMapping:
    """The ``attention_mask`` mapping (a :class:`MaskMapping`) Gemma 3's (and Gemma 4's)
    forward reads, for one pack of ``C`` tokens.

    ``block_layers``: the layer types whose image blocks are bidirectional (Gemma 4: only
    ``sliding_attention``; none where its ``use_bidirectional_attention`` is not
    ``"vision"``). ``window_cuts_blocks``: None for the installed Gemma 3 rule
    (:func:`~energon_packing.encoding.hf_compat.gemma3_window_cuts_blocks`)."""
    segments = segment_ids(cu_seqlens_padded, device=device)
    blocks = image_blocks(token_type_ids.to(device))
    if window_cuts_blocks is None:
        window_cuts_blocks = hf_compat.gemma3_window_cuts_blocks()
    return MaskMapping(
        {
            "full_attention": additive_mask(
                segments, blocks=blocks if "full_attention" in block_layers else None, dtype=dtype
            ),
            "sliding_attention": additive_mask(
                segments,
                blocks=blocks if "sliding_attention" in block_layers else None,
                window=sliding_window,
                window_cuts_blocks=window_cuts_blocks,
                dtype=dtype,
            ),
        }
    )
