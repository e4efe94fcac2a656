"""Real model families, built offline: each family's processor and a tiny random-init model.

    processor, model, info = build("qwen2_vl")

The processor is the family's own ``transformers`` processor class over the bundled byte-level
BPE plus the family's special tokens, the family's PIL image processor (torchvision is not
needed) at small image sizes, and the family's chat template (:mod:`.templates`). The model is
the family's ``*ForConditionalGeneration`` from a tiny config, float32, random init. Nothing is
downloaded. Families: :data:`FAMILIES`.

Two accommodations, neither of which touches image processing:

* processors that own a video processor (Qwen2/2.5/3-VL, LLaVA-OneVision) are built without it
  (:func:`energon_packing.encoding.processor_loading.image_only`: the video processor classes
  need torchvision; images never touch it);
* a random Gemma 3 zeroes ``mm_input_projection_weight`` at init, so it gets random values
  (else images would never reach the logits and an equivalence test would prove nothing).
"""

from __future__ import annotations

from typing import Any

from energon_packing.encoding.models import model_info
from energon_packing.encoding.processor_loading import image_only
from energon_packing.encoding.tokenizer import BUNDLED_TOKENIZER
from energon_packing.testing.templates import (
    ERNIE_VL_TEMPLATE,
    GEMMA3_TEMPLATE,
    GEMMA4_TEMPLATE,
    GLM4V_TEMPLATE,
    IDEFICS3_TEMPLATE,
    LLAVA_ONEVISION_TEMPLATE,
    QWEN2_5_OMNI_TEMPLATE,
    QWEN2_VL_TEMPLATE,
    QWEN3_OMNI_TEMPLATE,
    QWEN3_VL_TEMPLATE,
    chatml_interleaved,
)

__all__ = [
    "AUDIO_FAMILIES",
    "FAMILIES",
    "MODELS",
    "STATEFUL",
    "build",
    "make_tokenizer",
    "save_published",
]

FAMILIES = (
    "qwen2_vl",
    "qwen2_5_vl",
    "qwen3_vl",
    "gemma3",
    "idefics3",
    "llava_onevision",
    "llava",
    "llava_next",
    "internvl",
    "aya_vision",
    "glm4v",
    "gemma4",
    "ovis2",
    "ernie4_5_vl_moe",
)
#: Families whose processors take audio (and images): the Omni thinkers.
AUDIO_FAMILIES = ("qwen2_5_omni", "qwen3_omni")

QWEN_SPECIALS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
]
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
IDEFICS3_ROW_COL = [f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7)]


def make_tokenizer(
    *,
    extra: list[str] = (),
    named: dict[str, str] | None = None,
    bos: str | None = None,
    eos: str | None = None,
    pad: str | None = None,
    add_bos: bool = False,
) -> Any:
    """The bundled BPE as a ``PreTrainedTokenizerFast`` with a family's special tokens.

    ``named``: attribute-style special tokens a processor reads (Gemma 3's ``boi_token``...);
    ``add_bos``: prepend BOS like Gemma's and Llama 3's tokenizers do.
    """
    from tokenizers import AddedToken, processors
    from transformers import PreTrainedTokenizerFast

    kwargs = {
        name: value
        for name, value in (("bos_token", bos), ("eos_token", eos), ("pad_token", pad))
        if value
    }
    if named:
        kwargs["extra_special_tokens"] = dict(named)
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(BUNDLED_TOKENIZER), **kwargs)
    missing = [t for t in extra if t not in tokenizer.get_vocab()]
    if missing:
        tokenizer.add_tokens(
            [AddedToken(t, special=True, normalized=False) for t in missing], special_tokens=True
        )
    if add_bos:
        bos_id = tokenizer.convert_tokens_to_ids(bos)
        tokenizer._tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, bos_id)]
        )
    return tokenizer


def _tiny_text(tokenizer: Any, **fields: Any) -> dict:
    """A two-layer, 64-wide language model config over ``tokenizer``'s vocabulary."""
    return dict(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        pad_token_id=tokenizer.pad_token_id,
        **fields,
    )


def _tiny_siglip(*, model_type: str | None = "siglip_vision_model", **fields: Any) -> dict:
    """A one-layer, 32-wide SigLIP-style vision config (Idefics3 names no model type)."""
    typed = {} if model_type is None else {"model_type": model_type}
    return dict(
        **typed,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        **fields,
    )


def _built(
    processor: Any, config: Any, model_cls: type, model: bool, info: dict
) -> tuple[Any, Any, dict]:
    """``(processor, model or None, info)``: the processor names its model (as
    :func:`energon_packing.load_processor` does from a directory), the model is seeded."""
    import torch

    processor.model_info = model_info(config, source=f"testing.families {info['family']}")
    if not model:
        return processor, None, info
    torch.manual_seed(0)
    return processor, model_cls(config).eval(), info


def _qwen(family: str, model: bool) -> tuple[Any, Any, dict]:
    import transformers
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    tokenizer = make_tokenizer(extra=QWEN_SPECIALS, eos="<|im_end|>", pad="<|endoftext|>")
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in QWEN_SPECIALS}
    text = _tiny_text(
        tokenizer,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
    )
    vision = dict(spatial_merge_size=2, temporal_patch_size=2, in_channels=3)
    patch, template = 14, QWEN2_VL_TEMPLATE
    image_processor = dict(min_pixels=56 * 56, max_pixels=224 * 224)
    # Qwen2.5-VL and Qwen3-VL share the vision tower's shape (Qwen2-VL names its fields apart)
    tower = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64)
    if family == "qwen2_vl":
        names = ("Qwen2VLConfig", "Qwen2VLForConditionalGeneration", "Qwen2VLProcessor")
        vision.update(depth=1, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=2)
    elif family == "qwen2_5_vl":
        names = ("Qwen2_5_VLConfig", "Qwen2_5_VLForConditionalGeneration", "Qwen2_5_VLProcessor")
        vision.update(tower, window_size=56, fullatt_block_indexes=[1])
    else:  # qwen3_vl (and Qwen3.5): patch 16, mean/std 0.5, interleaved mRoPE, deepstack
        names = ("Qwen3VLConfig", "Qwen3VLForConditionalGeneration", "Qwen3VLProcessor")
        patch, template = 16, QWEN3_VL_TEMPLATE
        image_processor = dict(
            min_pixels=64 * 64, max_pixels=256 * 256, image_mean=[0.5] * 3, image_std=[0.5] * 3
        )
        text.update(
            head_dim=16, rope_parameters={**text["rope_parameters"], "mrope_interleaved": True}
        )
        text["rope_parameters"]["rope_theta"] = 5000000.0
        vision.update(tower, num_position_embeddings=64, deepstack_visual_indexes=[0])
        if family == "qwen3_vl_moe":  # Qwen3-VL's processor and tower; a MoE text model
            names = ("Qwen3VLMoeConfig", "Qwen3VLMoeForConditionalGeneration", "Qwen3VLProcessor")
            text.update(moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2)
        if family == "qwen3_5":  # Qwen3-VL's processor; a Gated DeltaNet layer, no deepstack
            names = ("Qwen3_5Config", "Qwen3_5ForConditionalGeneration", "Qwen3VLProcessor")
            del vision["deepstack_visual_indexes"]
            text.update(
                layer_types=["linear_attention", "full_attention"],
                linear_conv_kernel_dim=4,
                linear_key_head_dim=16,
                linear_value_head_dim=16,
                linear_num_key_heads=2,
                linear_num_value_heads=4,
            )
    config_cls, model_cls, processor_cls = (getattr(transformers, n) for n in names)
    config = config_cls(
        text_config=text,
        vision_config={**vision, "patch_size": patch},
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
    )
    processor = image_only(processor_cls)(
        image_processor=Qwen2VLImageProcessorPil(patch_size=patch, merge_size=2, **image_processor),
        tokenizer=tokenizer,
        chat_template=template,
    )
    info = {"family": "qwen3_vl" if family.startswith("qwen3_") else family}
    return _built(processor, config, model_cls, model, info)


def _gemma3(model: bool) -> tuple[Any, Any, dict]:
    import torch
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration, Gemma3Processor
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    tokenizer = make_tokenizer(
        named={
            "boi_token": "<start_of_image>",
            "eoi_token": "<end_of_image>",
            "image_token": "<image_soft_token>",
        },
        extra=["<start_of_turn>", "<end_of_turn>"],
        bos="<bos>",
        eos="<eos>",
        pad="<pad>",
        add_bos=True,
    )
    side, patch, tokens_per_image = 56, 14, 4  # 4x4 SigLIP patches pooled to 2x2
    processor = Gemma3Processor(
        image_processor=Gemma3ImageProcessorPil(size={"height": side, "width": side}),
        tokenizer=tokenizer,
        chat_template=GEMMA3_TEMPLATE,
        image_seq_length=tokens_per_image,
    )
    config = Gemma3Config(
        text_config=_tiny_text(
            tokenizer,
            head_dim=16,
            query_pre_attn_scalar=16,
            sliding_window=8,
            layer_types=["sliding_attention", "full_attention"],
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
        ),
        vision_config=_tiny_siglip(image_size=side, patch_size=patch),
        mm_tokens_per_image=tokens_per_image,
        boi_token_index=tokenizer.boi_token_id,
        eoi_token_index=tokenizer.eoi_token_id,
        image_token_index=tokenizer.image_token_id,
    )
    info = {"family": "gemma3", "sliding_window": 8, "image_token_id": tokenizer.image_token_id}
    processor.model_info = model_info(config, source="testing.families gemma3")
    if not model:
        return processor, None, info
    torch.manual_seed(0)
    model = Gemma3ForConditionalGeneration(config).eval()
    with torch.no_grad():  # zero at init: images would never reach the logits
        model.model.multi_modal_projector.mm_input_projection_weight.normal_(0.0, 0.5)
    return processor, model, info


def _idefics3(model: bool) -> tuple[Any, Any, dict]:
    from transformers import Idefics3Config, Idefics3ForConditionalGeneration, Idefics3Processor
    from transformers.models.idefics3.image_processing_pil_idefics3 import (
        Idefics3ImageProcessorPil,
    )

    specials = [
        "<fake_token_around_image>",
        "<image>",
        "<global-img>",
        *IDEFICS3_ROW_COL,
        "<end_of_utterance>",
    ]
    tokenizer = make_tokenizer(
        extra=specials,
        bos="<|begin_of_text|>",
        eos="<end_of_utterance>",
        pad="<|endoftext|>",
        add_bos=True,
    )
    tile, patch, scale = 32, 8, 2  # a 32 px tile: 4x4 patches, pixel shuffle 2: 4 tokens
    processor = Idefics3Processor(
        image_processor=Idefics3ImageProcessorPil(
            size={"longest_edge": 2 * tile}, max_image_size={"longest_edge": tile}
        ),
        tokenizer=tokenizer,
        image_seq_len=(tile // patch) ** 2 // scale**2,
        chat_template=IDEFICS3_TEMPLATE,
    )
    config = Idefics3Config(
        text_config=_tiny_text(tokenizer, model_type="llama"),
        vision_config=_tiny_siglip(model_type=None, image_size=tile, patch_size=patch),
        scale_factor=scale,
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
    )
    return _built(
        processor, config, Idefics3ForConditionalGeneration, model, {"family": "idefics3"}
    )


def _llava_onevision(model: bool) -> tuple[Any, Any, dict]:
    from transformers import (
        LlavaOnevisionConfig,
        LlavaOnevisionForConditionalGeneration,
        LlavaOnevisionProcessor,
    )
    from transformers.models.llava_onevision.image_processing_pil_llava_onevision import (
        LlavaOnevisionImageProcessorPil,
    )

    tokenizer = make_tokenizer(
        extra=[*QWEN_SPECIALS, "<image>", "<video>"], eos="<|im_end|>", pad="<|endoftext|>"
    )
    side, patch = 28, 7  # a 28 px base tile: 4x4 = 16 features
    pinpoints = [[side * a, side * b] for a in (1, 2, 3) for b in (1, 2, 3)]
    processor = image_only(LlavaOnevisionProcessor)(
        image_processor=LlavaOnevisionImageProcessorPil(
            size={"height": side, "width": side},
            image_grid_pinpoints=pinpoints,
            image_mean=[0.5] * 3,
            image_std=[0.5] * 3,
        ),
        tokenizer=tokenizer,
        num_image_tokens=(side // patch) ** 2,
        vision_feature_select_strategy="full",
        chat_template=LLAVA_ONEVISION_TEMPLATE,
        vision_aspect_ratio="anyres_max_9",
    )
    config = LlavaOnevisionConfig(
        text_config=_tiny_text(tokenizer, model_type="qwen2"),
        vision_config=_tiny_siglip(image_size=side, patch_size=patch),
        image_token_index=tokenizer.convert_tokens_to_ids("<image>"),
        video_token_index=tokenizer.convert_tokens_to_ids("<video>"),
        vision_feature_select_strategy="full",
        vision_feature_layer=-1,
        image_grid_pinpoints=pinpoints,
        vision_aspect_ratio="anyres_max_9",
    )
    info = {"family": "llava_onevision"}
    return _built(processor, config, LlavaOnevisionForConditionalGeneration, model, info)


def _llava(model: bool) -> tuple[Any, Any, dict]:
    from transformers import LlavaConfig, LlavaForConditionalGeneration, LlavaProcessor
    from transformers.models.llava.image_processing_pil_llava import LlavaImageProcessorPil

    tokenizer = make_tokenizer(
        extra=[*QWEN_SPECIALS, "<image>"], eos="<|im_end|>", pad="<|endoftext|>"
    )
    side, patch = 28, 7  # resized by the short edge, center-cropped: 4x4 = 16 features
    processor = LlavaProcessor(
        image_processor=LlavaImageProcessorPil(
            size={"shortest_edge": side},
            crop_size={"height": side, "width": side},
            image_mean=[0.5] * 3,
            image_std=[0.5] * 3,
        ),
        tokenizer=tokenizer,
        patch_size=patch,
        vision_feature_select_strategy="full",
        chat_template=chatml_interleaved("<image>"),
    )
    config = LlavaConfig(
        text_config=_tiny_text(tokenizer, model_type="qwen2"),
        vision_config=_tiny_siglip(image_size=side, patch_size=patch),
        image_token_index=tokenizer.convert_tokens_to_ids("<image>"),
        vision_feature_select_strategy="full",
        vision_feature_layer=-1,
    )
    return _built(processor, config, LlavaForConditionalGeneration, model, {"family": "llava"})


def _llava_next(model: bool) -> tuple[Any, Any, dict]:
    from transformers import LlavaNextConfig, LlavaNextForConditionalGeneration, LlavaNextProcessor
    from transformers.models.llava_next.image_processing_pil_llava_next import (
        LlavaNextImageProcessorPil,
    )

    tokenizer = make_tokenizer(
        extra=[*QWEN_SPECIALS, "<image>"], eos="<|im_end|>", pad="<|endoftext|>"
    )
    side, patch = 28, 7  # a 28 px tile: 4x4 = 16 features, anyres up to 2x2 tiles
    pinpoints = [[side * a, side * b] for a in (1, 2) for b in (1, 2)]
    processor = LlavaNextProcessor(
        image_processor=LlavaNextImageProcessorPil(
            size={"shortest_edge": side},
            crop_size={"height": side, "width": side},
            image_grid_pinpoints=pinpoints,
            image_mean=[0.5] * 3,
            image_std=[0.5] * 3,
        ),
        tokenizer=tokenizer,
        patch_size=patch,
        vision_feature_select_strategy="full",
        num_additional_image_tokens=0,
        chat_template=chatml_interleaved("<image>"),
    )
    config = LlavaNextConfig(
        text_config=_tiny_text(tokenizer, model_type="qwen2"),
        vision_config=_tiny_siglip(image_size=side, patch_size=patch),
        image_token_index=tokenizer.convert_tokens_to_ids("<image>"),
        vision_feature_select_strategy="full",
        vision_feature_layer=-1,
        image_grid_pinpoints=pinpoints,
    )
    info = {"family": "llava_next"}
    return _built(processor, config, LlavaNextForConditionalGeneration, model, info)


def _internvl(model: bool) -> tuple[Any, Any, dict]:
    from transformers import InternVLConfig, InternVLForConditionalGeneration, InternVLProcessor
    from transformers.models.got_ocr2.image_processing_pil_got_ocr2 import (
        GotOcr2ImageProcessorPil,
    )

    named = {
        "start_image_token": "<img>",
        "end_image_token": "</img>",
        "context_image_token": "<IMG_CONTEXT>",
        "video_token": "<video>",
    }
    tokenizer = make_tokenizer(
        extra=QWEN_SPECIALS, named=named, eos="<|im_end|>", pad="<|endoftext|>"
    )
    side, patch = 28, 7  # 4x4 patches per tile, pixel-shuffled by 0.5: 4 tokens per tile
    processor = image_only(InternVLProcessor)(
        image_processor=GotOcr2ImageProcessorPil(
            size={"height": side, "width": side},
            max_patches=4,
            image_mean=[0.5] * 3,
            image_std=[0.5] * 3,
        ),
        tokenizer=tokenizer,
        image_seq_length=4,
        chat_template=chatml_interleaved("<IMG_CONTEXT>"),
    )
    config = InternVLConfig(
        vision_config=dict(
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=64,
            image_size=[side, side],
            patch_size=[patch, patch],
        ),
        text_config=_tiny_text(tokenizer, model_type="qwen2"),
        image_token_id=tokenizer.convert_tokens_to_ids("<IMG_CONTEXT>"),
        image_seq_length=4,
        downsample_ratio=0.5,
    )
    info = {"family": "internvl"}
    return _built(processor, config, InternVLForConditionalGeneration, model, info)


def _aya_vision(model: bool) -> tuple[Any, Any, dict]:
    from transformers import AyaVisionConfig, AyaVisionForConditionalGeneration, AyaVisionProcessor
    from transformers.models.got_ocr2.image_processing_pil_got_ocr2 import (
        GotOcr2ImageProcessorPil,
    )

    specials = [
        "<image>",
        "<|START_OF_IMG|>",
        "<|END_OF_IMG|>",
        "<|IMG_PATCH|>",
        "<|IMG_LINE_BREAK|>",
    ]
    tokenizer = make_tokenizer(
        extra=[*QWEN_SPECIALS, *specials], eos="<|im_end|>", pad="<|endoftext|>"
    )
    side, patch = 28, 7  # 4x4 SigLIP patches per tile, downsampled by 2: 4 tokens per tile
    processor = AyaVisionProcessor(
        image_processor=GotOcr2ImageProcessorPil(
            size={"height": side, "width": side},
            max_patches=4,
            image_mean=[0.5] * 3,
            image_std=[0.5] * 3,
        ),
        tokenizer=tokenizer,
        patch_size=patch,  # the processor multiplies it by downsample_factor
        img_size=side,
        downsample_factor=2,
        chat_template=chatml_interleaved("<image>"),
    )
    text = _tiny_text(tokenizer, model_type="cohere2", head_dim=16, sliding_window=8)
    text["layer_types"] = ["sliding_attention", "full_attention"]
    config = AyaVisionConfig(
        vision_config=_tiny_siglip(image_size=side, patch_size=patch),
        text_config=text,
        downsample_factor=2,
        image_token_index=tokenizer.convert_tokens_to_ids("<|IMG_PATCH|>"),
        vision_feature_select_strategy="full",
        vision_feature_layer=-1,
    )
    info = {"family": "aya_vision", "sliding_window": 8}
    return _built(processor, config, AyaVisionForConditionalGeneration, model, info)


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
    return _built(processor, config, model_cls, model, {"family": "glm4v"})


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


#: Other models of a family built here, packed exactly as that family (``info["family"]``).
MODELS = ("qwen3_vl_moe", "glm4v_moe", "glm46v")
#: Models built here that energon_packing refuses (their layers carry state along the row).
STATEFUL = ("qwen3_5",)


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


def build(family: str, *, model: bool = True) -> tuple[Any, Any, dict]:
    """``(processor, tiny model, info)`` of a family in :data:`FAMILIES` (or another model of
    one, :data:`MODELS`, or a refused model of :data:`STATEFUL`); offline, CPU. ``model=False``: the processor alone (the model is
    None), much faster."""
    if family.startswith("qwen") and "omni" not in family:
        return _qwen(family, model)
    if family.startswith("glm4"):
        return _glm4v(family, model)
    builders = {
        "gemma3": _gemma3,
        "idefics3": _idefics3,
        "llava_onevision": _llava_onevision,
        "llava": _llava,
        "llava_next": _llava_next,
        "internvl": _internvl,
        "aya_vision": _aya_vision,
        "gemma4": _gemma4,
        "qwen2_5_omni": _qwen2_5_omni,
        "qwen3_omni": _qwen3_omni,
        "ovis2": _ovis2,
        "ernie4_5_vl_moe": _ernie_vl,
    }
    if family not in builders:
        raise KeyError(f"unknown family {family!r}; known: {', '.join(FAMILIES)}")
    return builders[family](model)


def save_published(processor: Any, directory: Any) -> None:
    """Writes ``processor`` as a published model's directory lays it out: the tokenizer's files,
    ``preprocessor_config.json`` (the image processor under its published class name, e.g.
    ``Qwen2VLImageProcessor``, with ``processor_class``), ``processor_config.json`` (the
    processor's own settings, e.g. ``image_seq_length``) and ``chat_template.jinja``."""
    import json
    from pathlib import Path

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    processor.tokenizer.save_pretrained(str(directory))
    name = type(processor).__name__
    image = processor.image_processor.to_dict()
    image["image_processor_type"] = type(processor.image_processor).__name__.removesuffix("Pil")
    image["processor_class"] = name
    (directory / "preprocessor_config.json").write_text(json.dumps(image, indent=2, default=int))
    own = {
        k: v
        for k, v in processor.to_dict().items()
        if k not in ("image_processor", "video_processor", "tokenizer", "chat_template")
    }
    (directory / "processor_config.json").write_text(json.dumps({**own, "processor_class": name}))
    (directory / "chat_template.jinja").write_text(processor.chat_template)
    model = getattr(processor, "model_info", None)
    if model is not None:  # the model's config.json: what decides the family beside the class
        config = {"model_type": model.model_type}
        if model.layer_types:
            layers = list(model.layer_types)
            config["text_config"] = {"layer_types": layers, "num_hidden_layers": len(layers)}
        (directory / "config.json").write_text(json.dumps(config))
