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
    GEMMA3_TEMPLATE,
    IDEFICS3_TEMPLATE,
    LLAVA_ONEVISION_TEMPLATE,
    QWEN2_VL_TEMPLATE,
    QWEN3_VL_TEMPLATE,
    SMOLVLM_TEMPLATE,
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
    "smolvlm",
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
IDEFICS3_ROW_COL = [f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7)]
IDEFICS3_SPECIALS = [
    "<fake_token_around_image>",
    "<image>",
    "<global-img>",
    *IDEFICS3_ROW_COL,
    "<end_of_utterance>",
]


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

    tokenizer = make_tokenizer(
        extra=IDEFICS3_SPECIALS,
        bos="<|begin_of_text|>",
        eos="<end_of_utterance>",
        pad="<|endoftext|>",
        add_bos=True,
    )
    parts = (Idefics3Processor, Idefics3ImageProcessorPil, Idefics3Config)
    processor, config = _tiles_of(*parts, tokenizer=tokenizer, template=IDEFICS3_TEMPLATE)
    return _built(
        processor, config, Idefics3ForConditionalGeneration, model, {"family": "idefics3"}
    )


def _smolvlm(model: bool) -> tuple[Any, Any, dict]:
    """SmolVLM: Idefics3's layout (tiles with row / column markers, a global image) after
    ChatML's start token; its processor needs num2words (its own requirement)."""
    from transformers import SmolVLMConfig, SmolVLMForConditionalGeneration, SmolVLMProcessor
    from transformers.models.smolvlm.image_processing_pil_smolvlm import (
        SmolVLMImageProcessorPil,
    )

    tokenizer = make_tokenizer(
        extra=["<|im_start|>", *IDEFICS3_SPECIALS], eos="<end_of_utterance>", pad="<|endoftext|>"
    )
    parts = (image_only(SmolVLMProcessor), SmolVLMImageProcessorPil, SmolVLMConfig)
    processor, config = _tiles_of(*parts, tokenizer=tokenizer, template=SMOLVLM_TEMPLATE)
    return _built(processor, config, SmolVLMForConditionalGeneration, model, {"family": "smolvlm"})


def _tiles_of(
    processor_cls: type, image_processor_cls: type, config_cls: type, *, tokenizer, template
) -> tuple[Any, Any]:
    """Idefics3's and SmolVLM's tiny processor and config: 32 px tiles of 4 x 4 patches of 8
    px, pixel-shuffled by 2 (4 tokens a tile), images resized to at most 64 px a side."""
    tile, patch, scale = 32, 8, 2
    processor = processor_cls(
        image_processor=image_processor_cls(
            size={"longest_edge": 2 * tile}, max_image_size={"longest_edge": tile}
        ),
        tokenizer=tokenizer,
        image_seq_len=(tile // patch) ** 2 // scale**2,
        chat_template=template,
    )
    config = config_cls(
        text_config=_tiny_text(tokenizer, model_type="llama"),
        vision_config=_tiny_siglip(model_type=None, image_size=tile, patch_size=patch),
        scale_factor=scale,
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
    )
    return processor, config


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
        chat_template=chatml_interleaved("<IMG_CONTEXT>", video="<video>"),
    )
    # its video processor's settings (the class needs torchvision), a frame one tile: as
    # load_processor reads them from a directory's video_preprocessor_config.json
    processor.video_settings = {
        "size": {"height": side, "width": side},
        "image_mean": [0.5] * 3,
        "image_std": [0.5] * 3,
    }
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


#: Other models of a family built here, packed exactly as that family (``info["family"]``).
MODELS = ("qwen3_vl_moe", "glm4v_moe", "glm46v")
#: Models built here that energon_packing refuses (their layers carry state along the row).
STATEFUL = ("qwen3_5",)


def build(family: str, *, model: bool = True) -> tuple[Any, Any, dict]:
    """``(processor, tiny model, info)`` of a family in :data:`FAMILIES` (or another model of
    one, :data:`MODELS`, or a refused model of :data:`STATEFUL`); offline, CPU. ``model=False``: the processor alone (the model is
    None), much faster."""
    from energon_packing.testing import (  # they import this
        families_gemma3n,
        families_later,
        families_omni,
        families_pixtral,
    )

    if family in families_pixtral.PIXTRAL_FAMILIES:  # torchvision: families_pixtral
        return families_pixtral._pixtral_family(family, model)
    if family == "llama4":  # torchvision: families_llama4
        from energon_packing.testing.families_llama4 import llama4

        return llama4(model)
    if family in ("paligemma", "paligemma2"):  # families_paligemma
        from energon_packing.testing.families_paligemma import paligemma

        return paligemma(model, version=1 if family == "paligemma" else 2)
    if family == "kimi_k25":  # torchvision: families_kimi
        from energon_packing.testing.families_kimi import kimi_k25

        return kimi_k25(model)
    if family == "phi4_multimodal":  # torchvision: families_phi4
        from energon_packing.testing.families_phi4 import phi4_multimodal

        return phi4_multimodal(model)
    if family.startswith("qwen") and "omni" not in family:
        return _qwen(family, model)
    if family.startswith("glm4"):
        return families_later._glm4v(family, model)
    builders = {
        "gemma3": _gemma3,
        "idefics3": _idefics3,
        "llava_onevision": _llava_onevision,
        "llava": _llava,
        "llava_next": _llava_next,
        "internvl": _internvl,
        "smolvlm": _smolvlm,
        "aya_vision": _aya_vision,
        "gemma4": families_later._gemma4,
        "qwen2_5_omni": families_omni._qwen2_5_omni,
        "qwen3_omni": families_omni._qwen3_omni,
        "gemma3n": families_gemma3n._gemma3n,
        "ovis2": families_later._ovis2,
        "ernie4_5_vl_moe": families_later._ernie_vl,
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
