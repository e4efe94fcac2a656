"""The Omni thinkers, built offline: Qwen2.5-Omni and Qwen3-Omni processors (their PIL image
processor, a Whisper feature extractor, the bundled BPE plus their special tokens, their chat
templates; no video processor: its settings as a model directory's preprocessor config gives
them, ``video_settings``) and tiny random-init thinkers. Reached through
:func:`energon_packing.testing.families.build`."""

from __future__ import annotations

from typing import Any

from energon_packing.encoding.processor_loading import image_only
from energon_packing.testing.families import _built, _tiny_text, make_tokenizer
from energon_packing.testing.templates import QWEN2_5_OMNI_TEMPLATE, QWEN3_OMNI_TEMPLATE

__all__: list[str] = []  # builders reached through testing.families.build

#: Qwen2.5-Omni's special tokens, by the attribute names its processor reads off the tokenizer
QWEN2_5_OMNI_NAMED = {
    "image_token": "<|IMAGE|>",
    "audio_token": "<|AUDIO|>",
    "video_token": "<|VIDEO|>",
    "vision_bos_token": "<|vision_bos|>",
    "vision_eos_token": "<|vision_eos|>",
    "audio_bos_token": "<|audio_bos|>",
    "audio_eos_token": "<|audio_eos|>",
}


def _whisper(**fields: Any) -> Any:
    """The Omni thinkers' audio front end: Whisper's log-mel, 128 bins at 16 kHz."""
    from transformers import WhisperFeatureExtractor

    return WhisperFeatureExtractor(
        feature_size=128, sampling_rate=16000, hop_length=160, n_fft=400, **fields
    )


def _qwen2_5_omni(model: bool) -> tuple[Any, Any, dict]:
    """Qwen2.5-Omni's thinker (the text-out model) and processor, without its video processor."""
    import transformers
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    tokenizer = make_tokenizer(
        named=QWEN2_5_OMNI_NAMED,
        extra=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        eos="<|im_end|>",
        pad="<|endoftext|>",
    )
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in QWEN2_5_OMNI_NAMED.values()}
    # the processor's __init__ passes (image, video, feature extractor, tokenizer) on
    # positionally to a mixin that, without the video processor, expects three: the feature
    # extractor and tokenizer go in the video processor's and feature extractor's places,
    # as from_pretrained passes them
    processor = image_only(transformers.Qwen2_5OmniProcessor)(
        Qwen2VLImageProcessorPil(
            patch_size=14, merge_size=2, min_pixels=56 * 56, max_pixels=224 * 224
        ),
        _whisper(chunk_length=300),
        tokenizer,
        chat_template=QWEN2_5_OMNI_TEMPLATE,
    )
    text = _tiny_text(
        tokenizer,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
    )
    config = transformers.Qwen2_5OmniThinkerConfig(
        text_config=text,
        vision_config=dict(
            depth=2,
            hidden_size=32,
            intermediate_size=64,
            num_heads=2,
            out_hidden_size=64,
            patch_size=14,
            spatial_merge_size=2,
            temporal_patch_size=2,
            window_size=56,
            fullatt_block_indexes=[1],
            in_channels=3,
        ),
        audio_config=dict(
            num_mel_bins=128,
            encoder_layers=1,
            encoder_attention_heads=2,
            encoder_ffn_dim=64,
            d_model=32,
            output_dim=64,
            n_window=100,
            max_source_positions=1500,
        ),
        audio_token_index=ids["<|AUDIO|>"],
        image_token_index=ids["<|IMAGE|>"],
        video_token_index=ids["<|VIDEO|>"],
        audio_start_token_id=ids["<|audio_bos|>"],
        audio_end_token_id=ids["<|audio_eos|>"],
        vision_start_token_id=ids["<|vision_bos|>"],
        vision_end_token_id=ids["<|vision_eos|>"],
    )
    model_cls = transformers.Qwen2_5OmniThinkerForConditionalGeneration
    return _built(processor, config, model_cls, model, {"family": "qwen2_5_omni"})


#: Qwen3-Omni's special tokens, by the attribute names its processor reads off the tokenizer
QWEN3_OMNI_NAMED = {
    "image_token": "<|image_pad|>",
    "audio_token": "<|audio_pad|>",
    "video_token": "<|video_pad|>",
    "vision_bos_token": "<|vision_start|>",
    "vision_eos_token": "<|vision_end|>",
    "audio_bos_token": "<|audio_start|>",
    "audio_eos_token": "<|audio_end|>",
}


def _qwen3_omni(model: bool) -> tuple[Any, Any, dict]:
    """Qwen3-Omni's thinker (MoE text model, Qwen3-VL-style vision tower, chunked audio
    encoder) and processor, without its video processor."""
    import transformers
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    tokenizer = make_tokenizer(
        named=QWEN3_OMNI_NAMED,
        extra=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        eos="<|im_end|>",
        pad="<|endoftext|>",
    )
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in QWEN3_OMNI_NAMED.values()}
    processor = image_only(transformers.Qwen3OmniMoeProcessor)(  # arguments as _qwen2_5_omni
        Qwen2VLImageProcessorPil(
            patch_size=16,
            merge_size=2,
            min_pixels=64 * 64,
            max_pixels=256 * 256,
            image_mean=[0.5] * 3,
            image_std=[0.5] * 3,
        ),
        _whisper(),
        tokenizer,
        chat_template=QWEN3_OMNI_TEMPLATE,
    )
    # its video processor (Qwen2VLVideoProcessor) takes the published preprocessor config's
    # patch and normalisation, as load_processor reads them from a directory (video_settings)
    processor.video_settings = {
        "patch_size": 16,
        "temporal_patch_size": 2,
        "merge_size": 2,
        "image_mean": [0.5] * 3,
        "image_std": [0.5] * 3,
    }
    text = _tiny_text(
        tokenizer,
        head_dim=16,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        moe_intermediate_size=32,
        num_experts=4,
        num_experts_per_tok=2,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 1000000.0,
            "mrope_section": [2, 3, 3],
            "mrope_interleaved": True,
        },
    )
    config = transformers.Qwen3OmniMoeThinkerConfig(
        text_config=text,
        vision_config=dict(
            depth=2,
            hidden_size=32,
            intermediate_size=64,
            num_heads=2,
            out_hidden_size=64,
            patch_size=16,
            spatial_merge_size=2,
            temporal_patch_size=2,
            num_position_embeddings=64,
            deepstack_visual_indexes=[0],
            in_channels=3,
        ),
        audio_config=dict(
            num_mel_bins=128,
            encoder_layers=1,
            encoder_attention_heads=2,
            encoder_ffn_dim=64,
            d_model=32,
            output_dim=64,
            n_window=50,
            n_window_infer=100,
            conv_chunksize=500,
            downsample_hidden_size=16,
            max_source_positions=1500,
        ),
        audio_token_id=ids["<|audio_pad|>"],
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        audio_start_token_id=ids["<|audio_start|>"],
        audio_end_token_id=ids["<|audio_end|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
    )
    model_cls = transformers.Qwen3OmniMoeThinkerForConditionalGeneration
    return _built(processor, config, model_cls, model, {"family": "qwen3_omni"})
