"""A real Hugging Face model as the oracle of a pack: the same forward, packed and alone.

A prepacked microbatch (:func:`energon_packing.trainer.prepacked_microbatches`) becomes the
keyword arguments of a ``transformers`` model: the shim's ids, positions and the processor's
fields, plus an additive 4D block-causal mask built from the pack boundaries (the stand-in for
``packed_seq_params`` that an eager/sdpa model reads). Gemma 3 takes a mask per layer type:
causal except inside one image's tokens (bidirectional), with a sliding window on local layers
(Gemma 4: the image blocks on its sliding layers alone);
a model with sliding layers (Aya Vision's Cohere 2) likewise, without the image blocks.
Per-source logits of the pack must equal each conversation run alone through its processor.
"""

from __future__ import annotations

from typing import Any

import torch

from energon_packing.encoding import hf_compat

__all__ = ["packed_kwargs", "run"]

_NOT_MODEL_INPUTS = ("packed_seq_params", "vision_token_index")


def _mask(
    segment: torch.Tensor,
    *,
    blocks: torch.Tensor | None = None,
    window: int | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Additive ``[1, 1, T, T]``: 0 where allowed, the dtype's minimum elsewhere."""
    positions = torch.arange(len(segment))
    query, key = positions[:, None], positions[None, :]
    allowed = (segment[:, None] == segment[None, :]) & (key <= query)
    cuts = hf_compat.gemma3_window_cuts_blocks()  # before 5.13 an image block stays whole
    if window is not None and not cuts:
        allowed &= key > query - window
    if blocks is not None:  # an image's tokens see each other (Gemma 3)
        allowed |= (blocks[:, None] == blocks[None, :]) & (blocks[:, None] >= 0)
    if window is not None and cuts:
        allowed &= key > query - window
    mask = torch.zeros(allowed.shape, dtype=dtype)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None]


def _image_blocks(token_type_ids: torch.Tensor) -> torch.Tensor:
    """One id per run of image tokens (1 in ``token_type_ids``), -1 elsewhere."""
    image = token_type_ids.reshape(-1) == 1
    starts = image & ~torch.nn.functional.pad(image[:-1], (1, 0))
    return torch.where(image, torch.cumsum(starts.long(), 0) - 1, -1)


def packed_kwargs(model_inputs: dict, cu_seqlens_padded: torch.Tensor, info: dict) -> dict:
    """Model keyword arguments of one packed microbatch (CP 1)."""
    kwargs = {k: v for k, v in model_inputs.items() if k not in _NOT_MODEL_INPUTS}
    for name, value in list(kwargs.items()):
        if not isinstance(value, torch.Tensor):
            kwargs[name] = torch.as_tensor(value)
    bounds = cu_seqlens_padded.tolist()
    segment = torch.repeat_interleave(
        torch.arange(len(bounds) - 1), torch.tensor([b - a for a, b in zip(bounds, bounds[1:])])
    )
    if info["family"] == "gemma3":
        blocks = _image_blocks(kwargs["token_type_ids"])
        kwargs["attention_mask"] = {
            "full_attention": _mask(segment, blocks=blocks),
            "sliding_attention": _mask(segment, blocks=blocks, window=info["sliding_window"]),
        }
    elif info["family"] == "gemma4":  # image blocks on the sliding layers alone
        types = kwargs["mm_token_type_ids"]
        blocks = _image_blocks(((types == 1) | (types == 2)).long())
        kwargs["attention_mask"] = {
            "full_attention": _mask(segment),
            "sliding_attention": _mask(segment, blocks=blocks, window=info["sliding_window"]),
        }
    elif info.get("sliding_window"):  # local layers keep their window inside each source
        kwargs["attention_mask"] = {
            "full_attention": _mask(segment),
            "sliding_attention": _mask(segment, window=info["sliding_window"]),
        }
    else:
        kwargs["attention_mask"] = _mask(segment)
    return kwargs


def run(model: Any, kwargs: dict) -> torch.Tensor:
    """``logits [T, vocab]`` of one row."""
    with torch.no_grad():
        return model(**kwargs, use_cache=False).logits[0]
