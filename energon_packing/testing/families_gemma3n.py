"""Gemma 3n, built offline as :mod:`.families` builds the others: transformers' own
``Gemma3nProcessor`` (the bundled BPE plus Gemma 3n's special tokens, its PIL SigLIP image
processor at 64x64 px, its ``Gemma3nAudioFeatureExtractor``, Gemma 3n's chat template) and a tiny
random-init ``Gemma3nForConditionalGeneration``.

The processor needs neither torchvision nor timm; the model's vision tower is timm's
``mobilenetv5_300m_enc`` (``TimmWrapperModel``, built with ``pretrained=False``), and timm
imports torchvision: the model exists only where both import (:func:`timm_missing` says why not;
the tests marked ``torchvision`` skip with it and run on the ``torchvision`` CI stack,
.ci/stacks.txt, which pins timm). Reached through :func:`energon_packing.testing.families.build`.
"""

from __future__ import annotations

from typing import Any

from energon_packing.testing.families import _built, make_tokenizer
from energon_packing.testing.templates import GEMMA3N_TEMPLATE

__all__ = ["GEMMA3N_NAMED", "IMAGE_TOKENS", "timm_missing"]

#: Gemma 3n's media tokens, by the attribute names its processor reads off the tokenizer, in
#: the id order the model's embedders need (as google/gemma-3n-*: the begin tokens are text
#: tokens; the end-of-image and image tokens open the vision range, ``embed_vision``'s
#: ``vocab_offset``; the end-of-audio and audio tokens the audio range after it).
GEMMA3N_NAMED = {
    "boi_token": "<start_of_image>",
    "boa_token": "<start_of_audio>",
    "eoi_token": "<end_of_image>",
    "image_token": "<image_soft_token>",
    "eoa_token": "<end_of_audio>",
    "audio_token": "<audio_soft_token>",
}
#: Tokens per image: the tower's 64x64 px input pooled to 2x2 by its multi-scale fusion adapter.
IMAGE_TOKENS = 4


def timm_missing() -> str | None:
    """Why no ``Gemma3nForConditionalGeneration`` can be built here (None: it can)."""
    try:
        import timm  # noqa: F401  (it imports torchvision)
    except ImportError as e:
        return (
            f"Gemma3nForConditionalGeneration's vision tower needs timm (and torchvision), which "
            f"do not import here ({e}); the torchvision CI stack runs these (.ci/stacks.txt)"
        )
    return None


def _gemma3n(model: bool) -> tuple[Any, Any, dict]:
    """Gemma 3n over a 4-layer text model (sliding and full layers, the last two reading the
    first two's keys and values, the first with activation sparsity), a one-block conformer
    audio tower and timm's MobileNetV5 encoder at an eighth of its channels."""
    import transformers
    from transformers.models.gemma3n.feature_extraction_gemma3n import (
        Gemma3nAudioFeatureExtractor,
    )
    from transformers.models.siglip.image_processing_pil_siglip import SiglipImageProcessorPil

    # the turn tokens first: every id from the end-of-image token on is a media token
    tokenizer = make_tokenizer(
        extra=["<start_of_turn>", "<end_of_turn>", *GEMMA3N_NAMED.values()],
        bos="<bos>",
        eos="<eos>",
        pad="<pad>",
        add_bos=True,
    )
    tokenizer._set_model_specific_special_tokens(GEMMA3N_NAMED)
    ids = {name: tokenizer.convert_tokens_to_ids(t) for name, t in GEMMA3N_NAMED.items()}
    vision_offset, audio_offset = ids["eoi_token"], ids["eoa_token"]
    assert len(tokenizer) == audio_offset + 2 and ids["image_token"] == vision_offset + 1
    processor = transformers.Gemma3nProcessor(
        feature_extractor=Gemma3nAudioFeatureExtractor(),
        image_processor=SiglipImageProcessorPil(size={"height": 64, "width": 64}),
        tokenizer=tokenizer,
        chat_template=GEMMA3N_TEMPLATE,
        image_seq_length=IMAGE_TOKENS,
    )
    text = dict(
        vocab_size=len(tokenizer),
        vocab_size_per_layer_input=vision_offset,
        hidden_size=64,
        hidden_size_per_layer_input=8,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        sliding_window=8,
        layer_types=["sliding_attention", "full_attention"] * 2,
        num_kv_shared_layers=2,
        laurel_rank=8,
        activation_sparsity_pattern=[0.95, 0.0, 0.0, 0.0],
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    config = transformers.Gemma3nConfig(
        text_config=text,
        vision_config=dict(
            architecture="mobilenetv5_300m_enc",
            model_args={"channel_multiplier": 0.125, "msfa_output_resolution": 2},
            vocab_size=2,
            vocab_offset=vision_offset,
        ),
        audio_config=dict(
            vocab_size=2,
            vocab_offset=audio_offset,
            hidden_size=32,
            conf_num_attention_heads=2,
            conf_num_hidden_layers=1,
            sscp_conv_channel_size=[8, 4],
        ),
        vision_soft_tokens_per_image=IMAGE_TOKENS,
        audio_soft_tokens_per_image=processor.audio_seq_length,
        **{f"{name.removesuffix('_token')}_token_id": i for name, i in ids.items()},
    )
    return _built(
        processor,
        config,
        transformers.Gemma3nForConditionalGeneration,
        model,
        {
            "family": "gemma3n",
            "sliding_window": text["sliding_window"],
            "image_token_id": ids["image_token"],
        },
    )
