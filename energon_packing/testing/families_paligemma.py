"""PaliGemma and PaliGemma 2 built offline, as :mod:`.families` builds the others:
transformers' own ``PaliGemmaProcessor`` (SigLIP's PIL image processor, the bundled BPE with
PaliGemma's ``<image>``; no chat template, as published) and a tiny random-init
``PaliGemmaForConditionalGeneration`` over a Gemma (PaliGemma) or Gemma 2 (PaliGemma 2, with
sliding layers and soft-capping) text model. Needs no torchvision. Reached through
:func:`energon_packing.testing.families.build` (``paligemma``, ``paligemma2``).
"""

from __future__ import annotations

from typing import Any

from energon_packing.testing.families import _built, _tiny_siglip, _tiny_text, make_tokenizer

__all__ = ["paligemma"]

#: The image side and patch of the tiny tower: 2 x 2 patches, 4 ``<image>`` tokens an image.
SIDE, PATCH = 28, 14


def paligemma(model: bool, *, version: int = 1) -> tuple[Any, Any, dict]:
    """The processor (``image_seq_length`` 4) and a model whose text layers are Gemma's
    (``version`` 1) or Gemma 2's (2: sliding layers of a 6-token window, shorter than a
    prompt, and attention and final-logit soft-capping)."""
    import torch
    import transformers
    from transformers.models.siglip.image_processing_pil_siglip import SiglipImageProcessorPil

    tokenizer = make_tokenizer(extra=["<image>"], bos="<bos>", eos="<eos>", pad="<pad>")
    image_processor = SiglipImageProcessorPil(size={"height": SIDE, "width": SIDE})
    image_processor.image_seq_length = (SIDE // PATCH) ** 2  # what a checkpoint's config sets
    processor = transformers.PaliGemmaProcessor(
        image_processor=image_processor, tokenizer=tokenizer
    )
    text = _tiny_text(
        tokenizer,
        model_type="gemma" if version == 1 else "gemma2",
        head_dim=16,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    if version == 2:
        text.update(
            query_pre_attn_scalar=16,
            sliding_window=6,
            layer_types=["sliding_attention", "full_attention"],
            attn_logit_softcapping=50.0,
            final_logit_softcapping=30.0,
        )
    config = transformers.PaliGemmaConfig(
        text_config=text,
        vision_config=_tiny_siglip(image_size=SIDE, patch_size=PATCH, vision_use_head=False),
        image_token_index=processor.image_token_id,
        projection_dim=64,
        hidden_size=64,
        vocab_size=len(tokenizer),
    )
    config._attn_implementation = "eager"
    name = "paligemma" if version == 1 else "paligemma2"
    info = {"family": "paligemma", "built": name}
    built = _built(processor, config, transformers.PaliGemmaForConditionalGeneration, model, info)
    if model:
        with torch.no_grad():  # Gemma's norms start at zero weight (1 + w): give them some
            for name_, param in built[1].named_parameters():
                if "norm" in name_ and param.dim() == 1:
                    param.normal_(0.0, 0.5)
    return built
