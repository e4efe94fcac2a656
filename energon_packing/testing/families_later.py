"""The later image-text families, built offline as :mod:`.families` builds the first ones:
GLM-4V (4.1V, 4.5V-MoE, 4.6V), Gemma 4, Ovis2 and ERNIE-4.5-VL (each its own processor class
over the bundled BPE, its PIL image processor, a tiny random-init model). Reached through
:func:`energon_packing.testing.families.build`."""

from __future__ import annotations

from typing import Any

from energon_packing.encoding.processor_loading import image_only
from energon_packing.testing.families import (
    QWEN_SPECIALS,
    _built,
    _tiny_text,
    make_tokenizer,
)
from energon_packing.testing.templates import (
    ERNIE_VL_TEMPLATE,
    GEMMA4_TEMPLATE,
    GLM4V_TEMPLATE,
    chatml_interleaved,
)

__all__: list[str] = []  # builders reached through testing.families.build

GLM4V_SPECIALS = [
    "<|endoftext|>",
    "[gMASK]",
    "<sop>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|begin_of_image|>",
    "<|end_of_image|>",
    "<|begin_of_video|>",
    "<|end_of_video|>",
    "<|image|>",
    "<|video|>",
]


def _glm4v(family: str, model: bool) -> tuple[Any, Any, dict]:
    """GLM-4.1V (``glm4v``), GLM-4.5V (``glm4v_moe``: a MoE text model) and GLM-4.6V
    (``glm46v``: its own processor class, the same rules)."""
    import transformers

    tokenizer = make_tokenizer(extra=GLM4V_SPECIALS, eos="<|user|>", pad="<|endoftext|>")
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in GLM4V_SPECIALS}
    text = _tiny_text(
        tokenizer,
        eos_token_id=tokenizer.eos_token_id,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.5,
            "mrope_section": [2, 1, 1],
        },
    )
    names = ("Glm4vConfig", "Glm4vForConditionalGeneration", "Glm4vProcessor")
    if family == "glm4v_moe":
        names = ("Glm4vMoeConfig", "Glm4vMoeForConditionalGeneration", "Glm4vProcessor")
        text.update(
            moe_intermediate_size=32,
            n_routed_experts=4,
            num_experts_per_tok=2,
            first_k_dense_replace=1,
            head_dim=16,
        )
    elif family == "glm46v":
        names = ("Glm46VConfig", "Glm46VForConditionalGeneration", "Glm46VProcessor")
    config_cls, model_cls, processor_cls = (getattr(transformers, n) for n in names)
    patch = 14
    vision = dict(
        depth=1,
        hidden_size=32,
        intermediate_size=64,
        num_heads=2,
        out_hidden_size=64,
        patch_size=patch,
        image_size=56,
        spatial_merge_size=2,
        temporal_patch_size=2,
    )
    config = config_cls(
        text_config=text,
        vision_config=vision,
        image_token_id=ids["<|image|>"],
        video_token_id=ids["<|video|>"],
        image_start_token_id=ids["<|begin_of_image|>"],
        image_end_token_id=ids["<|end_of_image|>"],
        video_start_token_id=ids["<|begin_of_video|>"],
        video_end_token_id=ids["<|end_of_video|>"],
    )
    module = "glm46v" if family == "glm46v" else "glm4v"
    pil = getattr(
        __import__(f"transformers.models.{module}.image_processing_pil_{module}", fromlist=["_"]),
        "Glm46VImageProcessorPil" if family == "glm46v" else "Glm4vImageProcessorPil",
    )
    processor = image_only(processor_cls)(
        image_processor=pil(
            patch_size=patch,
            merge_size=2,
            size={"shortest_edge": 56 * 56, "longest_edge": 224 * 224},
        ),
        tokenizer=tokenizer,
        chat_template=GLM4V_TEMPLATE,
    )
    return _built(
        processor, config, model_cls, model, {"family": "glm46v" if family == "glm46v" else "glm4v"}
    )


def _gemma4(model: bool) -> tuple[Any, Any, dict]:
    """Gemma 4 with ``use_bidirectional_attention="vision"`` (its larger models: an image's
    soft tokens see each other on the sliding layers), no audio tower."""
    from transformers import Gemma4Config, Gemma4ForConditionalGeneration, Gemma4Processor
    from transformers.models.gemma4.feature_extraction_gemma4 import (
        Gemma4AudioFeatureExtractor,
    )
    from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil

    named = {
        "boi_token": "<|image>",
        "eoi_token": "<image|>",
        "image_token": "<|image|>",
        "boa_token": "<|audio>",
        "eoa_token": "<audio|>",
        "audio_token": "<|audio|>",
    }
    tokenizer = make_tokenizer(
        named=named,
        extra=["<|turn>", "<turn|>", "<|video|>"],
        bos="<bos>",
        eos="<eos>",
        pad="<pad>",
        add_bos=True,
    )
    patch, kernel = 4, 3  # at most 70 soft tokens (630 patches of 4 px) per image
    processor = image_only(Gemma4Processor)(
        feature_extractor=Gemma4AudioFeatureExtractor(),
        image_processor=Gemma4ImageProcessorPil(
            patch_size=patch, max_soft_tokens=70, pooling_kernel_size=kernel
        ),
        tokenizer=tokenizer,
        chat_template=GEMMA4_TEMPLATE,
        image_seq_length=70,
    )
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in named.values()}
    text = _tiny_text(
        tokenizer,
        head_dim=16,
        global_head_dim=16,
        sliding_window=8,
        layer_types=["sliding_attention", "full_attention"],
        use_bidirectional_attention="vision",
        hidden_size_per_layer_input=0,
        vocab_size_per_layer_input=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    config = Gemma4Config(
        text_config=text,
        vision_config=dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=2,
            head_dim=16,
            patch_size=patch,
            pooling_kernel_size=kernel,
            position_embedding_size=64,
        ),
        audio_config=None,
        boi_token_id=ids["<|image>"],
        eoi_token_id=ids["<image|>"],
        image_token_id=ids["<|image|>"],
        video_token_id=processor.video_token_id,
        boa_token_id=ids["<|audio>"],
        eoa_token_index=ids["<audio|>"],
        audio_token_id=ids["<|audio|>"],
    )
    info = {"family": "gemma4", "sliding_window": 8}
    return _built(processor, config, Gemma4ForConditionalGeneration, model, info)


def _ovis2(model: bool) -> tuple[Any, Any, dict]:
    """Ovis2: tiles of 28 px (4x4 patches: 16 visual tokens each), up to 4 tiles and a
    thumbnail per image, its five visual indicator tokens."""
    from transformers import Ovis2Config, Ovis2ForConditionalGeneration, Ovis2Processor
    from transformers.models.ovis2.image_processing_pil_ovis2 import Ovis2ImageProcessorPil

    indicators = ["<IMG_START>", "<IMG_GRID>", "<IMG_COL>", "<IMG_ROW>", "<IMG_END>"]
    tokenizer = make_tokenizer(
        extra=[*QWEN_SPECIALS, "<image>", "<IMG_ATOM>", *indicators],
        eos="<|im_end|>",
        pad="<|endoftext|>",
    )
    side, patch = 28, 7
    processor = Ovis2Processor(
        image_processor=Ovis2ImageProcessorPil(
            size={"height": side, "width": side},
            crop_to_patches=True,
            max_patches=4,
            image_mean=[0.5] * 3,
            image_std=[0.5] * 3,
        ),
        tokenizer=tokenizer,
        chat_template=chatml_interleaved("<image>"),
        image_seq_length=(side // patch) ** 2,
    )
    config = Ovis2Config(
        text_config=_tiny_text(tokenizer, model_type="qwen2"),
        vision_config=dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            image_size=side,
            patch_size=patch,
            vocab_size=64,
            hidden_stride=1,
            num_visual_indicator_tokens=len(indicators),
        ),
        image_token_id=tokenizer.convert_tokens_to_ids("<IMG_ATOM>"),
        visual_indicator_token_ids=tokenizer.convert_tokens_to_ids(indicators),
        vocab_size=len(tokenizer),
        hidden_size=64,
    )
    return _built(processor, config, Ovis2ForConditionalGeneration, model, {"family": "ovis2"})


def _ernie_vl(model: bool) -> tuple[Any, Any, dict]:
    """ERNIE-4.5-VL: Qwen2-VL's image grid (patch 14, merge 2, one frame), a dense first layer
    and a MoE layer with its vision experts."""
    from transformers import (
        Ernie4_5_VLMoeConfig,
        Ernie4_5_VLMoeForConditionalGeneration,
        Ernie4_5_VLMoeProcessor,
    )
    from transformers.models.ernie4_5_vl_moe.image_processing_pil_ernie4_5_vl_moe import (
        Ernie4_5_VLMoeImageProcessorPil,
    )

    named = {
        "image_token": "<|IMAGE_PLACEHOLDER|>",
        "image_start_token": "<|IMAGE_START|>",
        "image_end_token": "<|IMAGE_END|>",
        "video_token": "<|VIDEO_PLACEHOLDER|>",
        "video_start_token": "<|VIDEO_START|>",
        "video_end_token": "<|VIDEO_END|>",
    }
    tokenizer = make_tokenizer(
        named=named,
        extra=["<|end_of_sentence|>"],
        bos="<|begin_of_sentence|>",
        eos="<|end_of_sentence|>",
        pad="<|endoftext|>",
        add_bos=True,
    )
    ids = {k: tokenizer.convert_tokens_to_ids(t) for k, t in named.items()}
    processor = image_only(Ernie4_5_VLMoeProcessor)(
        image_processor=Ernie4_5_VLMoeImageProcessorPil(
            size={"shortest_edge": 56 * 56, "longest_edge": 224 * 224}
        ),
        tokenizer=tokenizer,
        chat_template=ERNIE_VL_TEMPLATE,
    )
    text = _tiny_text(
        tokenizer,
        head_dim=16,
        moe_intermediate_size=[32, 32],
        moe_k=2,
        moe_num_experts=4,
        moe_num_shared_experts=1,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 500000.0,
            "mrope_section": [3, 3, 2],
        },
    )
    config = Ernie4_5_VLMoeConfig(
        text_config=text,
        vision_config=dict(
            depth=1,
            hidden_size=32,
            intermediate_size=64,
            num_heads=2,
            patch_size=14,
            spatial_merge_size=2,
            temporal_merge_size=2,
        ),
        image_token_id=ids["image_token"],
        image_start_token_id=ids["image_start_token"],
        image_end_token_id=ids["image_end_token"],
        video_token_id=ids["video_token"],
        video_start_token_id=ids["video_start_token"],
        video_end_token_id=ids["video_end_token"],
    )
    info = {"family": "ernie4_5_vl_moe"}
    return _built(processor, config, Ernie4_5_VLMoeForConditionalGeneration, model, info)
