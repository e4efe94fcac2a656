"""One loader pack as the keyword arguments of a Hugging Face model's own forward.

``transformers`` runs a packed row (several conversations end to end) through its own
padding-free path when ``attention_mask is None``, there is no cache and ``position_ids``
restart per conversation (``masking_utils.find_packed_sequence_indices``). :func:`to_hf` gives
each family that form::

    pack        A A A A A p p p B B B B B B B B B B p p | tail pad
    text row    0 1 2 3 4 5 6 7 0 1 2 3 4 5 6 7 8 9 ...   restarts per padded extent
    labels      - A A A A - - - - B B B B B B B B B - -   ids where token_mask > 0, else -100

* Qwen2/2.5/3-VL (mRoPE, 3-row ``position_ids`` in the batch): ``position_ids [4, 1, C]``, the
  text row first, then the pack's mRoPE rows (a ``[3, 1, C]`` tensor is read as mRoPE alone and
  no packing is detected: the conversations see each other);
* Gemma 3 (``token_type_ids``) and Gemma 4 (``mm_token_type_ids``; image blocks on its sliding
  layers only): ``position_ids [1, C]`` and the mask mapping its forward takes (:mod:`.masks`),
  since ``transformers`` remaps its image-block overlay wrongly in a pack;
* every other family: ``position_ids [1, C]``.

How the family is known: from ``model.config`` or ``config`` (mRoPE: the text config's rope
parameters name an ``mrope_section``; Gemma 3: its model type's family has image blocks); without either, from
the batch (3-row positions: mRoPE; ``token_type_ids``: Gemma 3, which then needs ``model=`` or
``config=`` for its sliding window, an error; else 1-row).

A model whose layers carry state along the row (Gated DeltaNet, Mamba, short convolutions:
:mod:`energon_packing.encoding.models`) is refused, naming the layer type, unless
``allow_stateful_layers=True`` on a GPU (it then gets the boundaries as flash-attention-2 does).

Flash-attention-2 (``_attn_implementation`` of the config, or ``attn_implementation=``) also gets
``cu_seq_lens_q/k`` (the padded boundaries, int32) and ``max_length_q/k``: what
``transformers`` would derive from the text row itself (``prepare_fa_kwargs_from_position_ids``),
given so no layer has to; its modality encoders drop them (``accepts_precomputed_kwargs``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from energon_packing.encoding import hf_compat
from energon_packing.encoding.families import REFUSED, family_of_model
from energon_packing.encoding.models import (
    ModelInfo,
    StatefulLayersError,
    check_layers,
    check_rope,
    model_info,
    text_config,
)
from energon_packing.hf.masks import gemma3_mask_mapping
from energon_packing.schema import (
    CU_SEQLENS,
    CU_SEQLENS_PADDED,
    IMAGE_GRID_THW,
    INPUT_IDS,
    POSITION_IDS,
    SOURCE_IDS,
    TOKEN_MASK,
    VIDEO_GRID_THW,
    PackContractError,
    is_empty,
    model_fields,
    not_prepacked,
    pack_from_batch,
)
from energon_packing.trainer.shim import text_positions

__all__ = ["IGNORE_INDEX", "HFInputs", "text_positions", "to_hf"]

#: The label ``transformers``' losses ignore.
IGNORE_INDEX = -100
_TOKEN_TYPE_IDS = "token_type_ids"


class HFInputs(dict):
    """Keyword arguments for ``model(**inputs)``, with the pack's bookkeeping as attributes
    (attributes never reach the forward; ``dict(inputs)`` drops them).

    Attributes:
        loss_weights: ``[1, C]`` float32, the pack's ``token_mask`` (fractional loss weights,
            which ``labels`` cannot carry); weigh token ``t``'s loss when predicting it.
        source_ids: The pack's conversation keys, in row order.
        cu_seqlens: ``[n + 1]`` real boundaries of the conversations.
        cu_seqlens_padded: ``[n + 1]`` padded boundaries (last entry = C).
    """

    __slots__ = ("cu_seqlens", "cu_seqlens_padded", "loss_weights", "source_ids")


def _has_mrope(config: Any) -> bool:
    family = family_of_model(getattr(config, "model_type", None))
    if family is not None and family.mrope:  # ERNIE-4.5-VL's config may leave it to a default
        return True
    text = text_config(config)
    for name in ("rope_parameters", "rope_scaling"):
        rope = getattr(text, name, None)
        if isinstance(rope, Mapping) and rope.get("mrope_section") is not None:
            return True
    return False


def _dtype_of(model: Any, config: Any) -> torch.dtype:
    """The model's dtype: what an additive mask must have (sdpa wants the query's), and what
    a tower that casts nothing takes its pixels in (``Family.pixels_in_model_dtype``)."""
    if isinstance(getattr(model, "dtype", None), torch.dtype):
        return model.dtype
    for owner in (text_config(config), config):
        dtype = getattr(owner, "dtype", None) if owner is not None else None
        if isinstance(dtype, str):
            dtype = getattr(torch, dtype, None)
        if isinstance(dtype, torch.dtype):
            return dtype
    return torch.float32


def to_hf(
    batch: Mapping[str, Any],
    *,
    model: Any = None,
    config: Any = None,
    row: int | None = None,
    attn_implementation: str | None = None,
    allow_stateful_layers: bool = False,
) -> HFInputs:
    """The keyword arguments of ``model(**inputs)`` for one pack of a loader batch.

    Args:
        batch: A prepacked batch of the loader (:func:`energon_packing.schema.collate`).
        model: The ``transformers`` model the pack goes to: its config names the family and
            the attention implementation; tensors move to its device.
        config: Its config instead (``PretrainedConfig``), when no model is at hand.
        row: Which pack of the batch; ``None`` requires a batch of one pack.
        attn_implementation: Overrides the config's (``"flash_attention_2"`` adds the varlen
            boundaries); with neither model nor config, ``"sdpa"``.
        allow_stateful_layers: Accept a model whose layers carry state along the row
            (linear attention / Gated DeltaNet, Mamba, short convolutions: refused otherwise,
            naming the layer type). It then gets the boundaries its kernels read
            (``cu_seq_lens_q/k``, ``max_length_q/k``) and must sit on a GPU: the CPU
            fallbacks of those layers ignore them.

    Returns:
        :class:`HFInputs`: ``input_ids [1, C]``, ``position_ids`` (``[4, 1, C]`` for mRoPE,
        else ``[1, C]``), the pack's media and token-aligned fields, ``labels [1, C]`` (ids
        where ``token_mask > 0``, -100 elsewhere: on pads, prompts and every conversation's
        first token; unshifted, the model shifts), ``use_cache=False``, no ``attention_mask``
        (Gemma 3: its mask mapping), and with flash-attention-2 ``cu_seq_lens_q/k`` and
        ``max_length_q/k``.

    Raises:
        PackContractError: not a prepacked batch, a broken pack, or positions that do not fit
            the model's family.
        ValueError: an empty batch, a batch of several packs without ``row=``, both ``model``
            and ``config``, or Gemma 3 without either.
        StatefulLayersError: a model whose layers mix packed conversations (a ValueError).
        ValueError: a model whose rotary frequencies follow the row (longrope, dynamic NTK:
            :func:`~energon_packing.encoding.models.check_rope`) given a pack wider than its
            bound.
    """
    if model is not None and config is not None:
        raise ValueError("to_hf: pass model= or config=, not both")
    row = _row(batch, row)
    pack = pack_from_batch(batch, row)
    pack.check()
    if model is not None:
        config = model.config
    if config is None and _TOKEN_TYPE_IDS in batch:
        raise ValueError(
            "to_hf: the batch carries token_type_ids (Gemma 3, PaliGemma): its forward needs "
            "the model's config (Gemma 3's mask mapping, built with its sliding window; "
            "PaliGemma's positions, counted from 1); pass model= or config="
        )
    model_type = getattr(config, "model_type", None)
    if model_type in REFUSED:
        raise ValueError(f"to_hf: model type {model_type!r} is not packed: {REFUSED[model_type]}")
    broken = hf_compat.broken_forward(model_type)
    if broken:
        raise ValueError(f"to_hf: model type {model_type!r}: {broken}")
    attn = attn_implementation or hf_compat.attn_implementation(text_config(config))
    varlen = "flash" in (attn or "")
    if config is not None:
        info = model_info(config, source=type(model or config).__name__)
        if _stateful(info, model, allow_stateful_layers):
            varlen = True  # the boundaries are what those layers' kernels read
        # longrope / dynamic rotary frequencies follow the row's width
        check_rope(info, width=int(batch[INPUT_IDS][row].shape[-1]), where="to_hf")
    family = family_of_model(model_type)
    gemma3 = family is not None and family.image_blocks
    prefix = family is not None and family.prefix_lm
    named = {"gemma3": "Gemma 3", "gemma4": "Gemma 4", "paligemma": "PaliGemma"}.get(
        getattr(family, "name", ""), ""
    )
    if (gemma3 or prefix) and varlen:
        raise ValueError(
            f"to_hf: {named} does not run flash attention (attn_implementation={attn!r}: its "
            f"{'prompt' if prefix else 'image'} tokens attend bidirectionally); use sdpa or "
            f"eager"
        )
    block_layers = _block_layers(family, config) if gemma3 else ()
    cu_padded = torch.as_tensor(batch[CU_SEQLENS_PADDED][row])
    ids = batch[INPUT_IDS][row]
    token_mask = batch[TOKEN_MASK][row]
    inputs = HFInputs(
        input_ids=ids[None],
        position_ids=_positions(batch, row, config, cu_padded, pack.source_ids),
        labels=torch.where(token_mask > 0, ids, IGNORE_INDEX)[None],
        use_cache=False,
    )
    media, tokens = model_fields(batch)
    per_pack = {key: batch[key][row] for key in media}
    if (
        varlen
        and any(len(v) for v in per_pack.values())
        and not hf_compat.vision_takes_own_kwargs()
    ):
        import transformers

        raise ValueError(
            f"to_hf: transformers {transformers.__version__} passes flash attention's "
            f"cu_seq_lens_q on into the vision tower (get_image_features(**kwargs)), where it "
            f"collides with the tower's own, for a pack with images or videos (source_ids="
            f"{pack.source_ids}); use sdpa or eager, or transformers >= 5.18"
        )
    _require_audio_apart(family, config, batch, row, pack.source_ids)
    # a pack without images (or clips) has none: another pack of the batch may, and its empty
    # rows here would reach the tower (Gemma 3n's timm tower fails on an empty batch)
    inputs.update({key: value for key, value in per_pack.items() if len(value)})
    if family is not None and family.pixels_in_model_dtype:  # its tower casts nothing
        dtype = _dtype_of(model, config)
        for key in per_pack:
            if key in inputs and torch.is_floating_point(inputs[key]):
                inputs[key] = inputs[key].to(dtype)
    for key in tokens:
        inputs[key] = batch[key][row][None]
    if family is not None and family.first_position:  # where the model counts from (1)
        inputs["position_ids"] = inputs["position_ids"] + family.first_position
    if gemma3:  # its image overlay, remapped per conversation, would read the wrong tokens
        token_types = inputs.get(family.token_types or _TOKEN_TYPE_IDS)
        if token_types is None:
            token_types = (ids == config.image_token_id).long()
        inputs["attention_mask"] = gemma3_mask_mapping(
            cu_seqlens_padded=cu_padded,
            token_type_ids=token_types,
            sliding_window=int(text_config(config).sliding_window),
            dtype=_dtype_of(model, config),
            block_layers=block_layers,
            window_cuts_blocks=None,  # the installed release's rule (Gemma 4 as Gemma 3)
        )
    if varlen:
        boundaries = cu_padded.to(torch.int32)
        longest = int(boundaries.diff().max())
        inputs.update(
            cu_seq_lens_q=boundaries,
            cu_seq_lens_k=boundaries,
            max_length_q=longest,
            max_length_k=longest,
        )
    if getattr(model, "device", None) is not None:
        _move(inputs, model.device)
    inputs.loss_weights = token_mask[None].to(inputs["input_ids"].device)
    inputs.source_ids = list(pack.source_ids)
    inputs.cu_seqlens = torch.as_tensor(batch[CU_SEQLENS][row])
    inputs.cu_seqlens_padded = cu_padded
    return inputs


def _require_audio_apart(family: Any, config: Any, batch: Mapping, row: int, keys: list) -> None:
    """Raises where the pack's clips would be heard otherwise than alone: the installed
    release's audio encoder lets the clips of one call attend to each other
    (:func:`~energon_packing.encoding.hf_compat.omni_audio_mixing`) and the pack holds clips of
    two conversations or more; or the family's model mixes a call's clips with the rest of the
    call (``AudioRule.alone``, Phi-4-multimodal: its encoder reads the padding of the longest
    clip, its projection whether the call holds images) and the pack holds clips of two
    conversations, or clips of a conversation without images beside another's images."""
    if family is None or family.audio is None:
        return
    mixing = hf_compat.omni_audio_mixing(family.name)
    if mixing is None and not family.audio.alone:
        return
    token = _config_id(config, "audio_token_id", "audio_config")
    ids = batch[INPUT_IDS][row]
    bounds = [int(b) for b in batch[CU_SEQLENS_PADDED][row]]
    spans = list(zip(bounds, bounds[1:]))
    hearing = [k for k, (a, b) in enumerate(spans) if bool((ids[a:b] == token).any())]
    if len(hearing) > 1:
        what, fix = mixing or (
            f"{family.name}'s audio encoder reads the padding of the longest clip of a call",
            "the loader packs a conversation with clips beside text only (AudioRule.alone)",
        )
        raise ValueError(
            f"to_hf: {what}, and this pack holds clips of {len(hearing)} conversations "
            f"({', '.join(str(keys[k]) for k in hearing)}): each would hear the others'; {fix}"
        )
    if not (family.audio.alone and hearing):
        return
    image = _config_id(config, "image_token_id", "vision_config")
    seeing = [k for k, (a, b) in enumerate(spans) if bool((ids[a:b] == image).any())]
    if seeing and hearing[0] not in seeing:
        raise ValueError(
            f"to_hf: {family.name}'s audio projection is its vision-speech one whenever the "
            f"call holds images, and this pack holds clips of {keys[hearing[0]]} (no image) "
            f"beside images of {', '.join(str(keys[k]) for k in seeing)}: the clips would be "
            f"projected otherwise than alone; the loader packs a conversation with clips beside "
            f"text only (AudioRule.alone)"
        )


def _config_id(config: Any, name: str, nested: str) -> Any:
    """A token id of the config: top level, the thinker's, or under ``nested`` (Phi-4's
    ``audio_config.audio_token_id``)."""
    for where in (config, getattr(config, "thinker_config", None), getattr(config, nested, None)):
        found = getattr(where, name, None)
        if found is not None:
            return found
    return None


def _block_layers(family: Any, config: Any) -> tuple[str, ...]:
    """The layer types whose image blocks are bidirectional: the family's; for Gemma 4 only
    where its text config's ``use_bidirectional_attention`` is ``"vision"`` (else causal);
    ``"all"`` (no layer causal) is refused."""
    if family.name != "gemma4":
        return family.block_layers
    mode = getattr(text_config(config), "use_bidirectional_attention", None)
    if mode == "vision" and hf_compat.gemma4_mask_rule() is None:
        import transformers

        raise ValueError(
            f"to_hf: transformers {transformers.__version__}'s Gemma 4 opens its image blocks on "
            f"the full-attention layers too, a mask rule energon_packing does not reproduce "
            f"(it does 5.5-5.8's and 5.13+'s); use another transformers release"
        )
    if mode == "all":
        raise ValueError(
            f"to_hf: {config.model_type!r} with use_bidirectional_attention='all' attends both "
            f"ways over the whole row: no pack of several conversations is causal per "
            f"conversation; train it unpacked (unpacked=True)"
        )
    return family.block_layers if mode == "vision" else ()


def _stateful(info: ModelInfo, model: Any, allow: bool) -> bool:
    """Whether the model (``info``: its config's) has layers that carry state along the row
    (accepted only with ``allow`` and on a GPU; raises otherwise)."""
    check_layers(info, allow_stateful_layers=allow, where="to_hf")
    if not info.stateful_layers:
        return False
    device = getattr(model, "device", None)
    if getattr(device, "type", None) != "cuda":
        raise StatefulLayersError(
            f"to_hf: allow_stateful_layers=True, but the model is on {device or 'no device'}: "
            f"the CPU fallbacks of its {', '.join(info.stateful_layers)} layers ignore the "
            f"conversations' boundaries, so every conversation after a pack's first would be "
            f"computed from the previous one's state; run it on a GPU with the "
            f"flash-linear-attention / causal-conv1d / mamba-ssm kernels installed"
        )
    return True


def _row(batch: Mapping[str, Any], row: int | None) -> int:
    """The pack to take: ``row``, or the only one."""
    if is_empty(batch):
        raise ValueError(
            "to_hf: the batch holds no pack (an accounting-only batch that carries skips); "
            "skip it with `if is_empty(batch): continue`"
        )
    if CU_SEQLENS_PADDED not in batch:
        raise not_prepacked("to_hf")
    rows = int(batch[INPUT_IDS].shape[0])
    if row is None:
        if rows != 1:
            raise ValueError(
                f"to_hf: the batch holds {rows} packs (source_ids={batch.get(SOURCE_IDS)}); "
                f"pass row=0..{rows - 1} for one of them, or load with batch_size=1"
            )
        return 0
    if not 0 <= row < rows:
        raise ValueError(f"to_hf: row={row} is out of range for a batch of {rows} packs")
    return row


def _positions(
    batch: Mapping[str, Any], row: int, config: Any, cu_padded: torch.Tensor, source_ids: list
) -> torch.Tensor:
    """``[4, 1, C]`` (text row, then mRoPE rows) for an mRoPE model, else ``[1, C]``."""
    positions = torch.as_tensor(batch[POSITION_IDS])
    three = positions.ndim == 3
    mrope = three if config is None else _has_mrope(config)
    if three and not mrope:
        raise PackContractError(
            f"position_ids: the batch has 3-row mRoPE positions, but {config.model_type!r} "
            f"reads 1-row positions; build the loader with this model's processor "
            f"(source_ids={source_ids})"
        )
    if not mrope:
        return positions[row][None]
    if three:
        rope = positions[:, row]
    elif any(
        batch.get(key) is not None and len(batch[key][row])
        for key in (IMAGE_GRID_THW, VIDEO_GRID_THW)
    ):
        raise PackContractError(
            f"position_ids: {config.model_type!r} reads mRoPE positions and the pack has "
            f"images or videos, but its positions are 1-row; build the loader with this "
            f"model's processor, or mrope=True (source_ids={source_ids})"
        )
    else:  # text only: the three mRoPE rows are the text positions
        rope = positions[row].expand(3, -1)
    return torch.cat([text_positions(cu_padded)[None], rope])[:, None, :]


def _move(inputs: dict, device: Any) -> None:
    for key, value in inputs.items():
        if isinstance(value, torch.Tensor):
            inputs[key] = value.to(device)
        elif isinstance(value, dict):
            _move(value, device)
