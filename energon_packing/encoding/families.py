"""What this package knows of each model family beyond its processor's public API.

Per family, one size rule: the fields a processor's ``replace_image_token`` reads, derived from
image ``(height, width)`` alone as its image processor would derive them (Qwen's
``smart_resize``, Idefics3's tiling, LLaVA-OneVision's anyres grid, Gemma 3's fixed sequence).
They let a conversation be costed from image headers, with no pixel decoded; at pack time the
image processor's real outputs must give the same replacements
(:class:`~energon_packing.encoding.processor.ProcessorChat`). No torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from energon_packing.encoding import hf_compat
from energon_packing.encoding.models import ModelInfo
from energon_packing.encoding.vision import MAX_ASPECT_RATIO
from energon_packing.errors import Skip

__all__ = [
    "FAMILIES",
    "REFUSED",
    "Family",
    "check_model",
    "family_of",
    "family_of_model",
    "family_table",
    "refusal",
    "refused_table",
]


class _Shape:
    """Stands in for a processed tile where a processor only reads its ``shape``."""

    def __init__(self, shape: tuple[int, ...]):
        self.shape = shape


def _qwen_inputs(processor: Any, sizes: list[list[tuple[int, int]]]) -> dict:
    """Qwen's ``smart_resize`` of each image: ``image_grid_thw`` rows ``(1, h, w)``."""
    return _grids(processor, sizes, lambda resize, h, w, **bounds: resize(h, w, **bounds))


def _glm4v_inputs(processor: Any, sizes: list[list[tuple[int, int]]]) -> dict:
    """GLM-4.1V's ``smart_resize``: Qwen's bounds, counted over the ``temporal_patch_size``
    frames an image is repeated to."""
    frames = processor.image_processor.temporal_patch_size
    return _grids(
        processor,
        sizes,
        lambda resize, h, w, **bounds: resize(
            num_frames=frames, height=h, width=w, temporal_factor=frames, **bounds
        ),
    )


def _grids(processor: Any, sizes: list[list[tuple[int, int]]], call: Callable) -> dict:
    image_processor = processor.image_processor
    smart_resize = hf_compat.smart_resize_of(image_processor)
    patch, merge = image_processor.patch_size, image_processor.merge_size
    grids = []
    for h, w in (s for per_text in sizes for s in per_text):
        try:
            rh, rw = call(
                smart_resize,
                h,
                w,
                factor=patch * merge,
                min_pixels=image_processor.size["shortest_edge"],
                max_pixels=image_processor.size["longest_edge"],
            )
        except ValueError:
            ratio = max(h, w) / min(h, w)
            if ratio <= MAX_ASPECT_RATIO:
                raise  # not the aspect rule: the caller reports it as unsupported_image
            raise Skip(
                "image_aspect_ratio",
                f"image of {w}x{h} px (upright) has an aspect ratio of {ratio:,.1f}, above "
                f"{MAX_ASPECT_RATIO}, which {type(image_processor).__name__}'s smart_resize "
                f"refuses; crop or pad such images (e.g. text lines) before packing",
            ) from None
        grids.append([1, rh // patch, rw // patch])
    return {"image_grid_thw": np.asarray(grids, dtype=np.int64).reshape(-1, 3)}


def _qwen_rows(processed: Any) -> dict[str, list[int]]:
    grids = np.asarray(processed["image_grid_thw"]).reshape(-1, 3)
    return {"pixel_values": grids.prod(axis=1).tolist(), "image_grid_thw": [1] * len(grids)}


def _gemma3_inputs(processor: Any, sizes: list[list[tuple[int, int]]]) -> dict:
    if getattr(processor.image_processor, "do_pan_and_scan", False):
        raise ValueError("Gemma 3 with do_pan_and_scan=True is not supported (crops need pixels)")
    return {"num_crops": [0] * sum(len(s) for s in sizes)}


def _gemma4_inputs(processor: Any, sizes: list[list[tuple[int, int]]]) -> dict:
    """Gemma 4's aspect-preserving resize to at most ``max_soft_tokens`` pooled patches: the
    soft tokens of each image."""
    image_processor = processor.image_processor
    rule = hf_compat.smart_resize_of(image_processor, "get_aspect_ratio_preserving_size")
    patch, kernel = image_processor.patch_size, image_processor.pooling_kernel_size
    counts = []
    for h, w in (s for per_text in sizes for s in per_text):
        rh, rw = rule(
            height=h,
            width=w,
            patch_size=patch,
            max_patches=image_processor.max_soft_tokens * kernel**2,
            pooling_kernel_size=kernel,
        )
        counts.append((rh // patch) * (rw // patch) // kernel**2)
    return {"num_soft_tokens_per_image": counts}


def _ovis2_inputs(processor: Any, sizes: list[list[tuple[int, int]]]) -> dict:
    """Ovis2's tiling: each image's ``(rows, cols)`` grid, by the rule its image processor's
    ``crop_image_to_patches`` takes (the covering-area grid, or the closest aspect ratio), with
    the processor's own image defaults; ``(1, 1)`` without tiling."""
    image_processor = processor.image_processor
    defaults = hf_compat.merged_images_kwargs(processor)

    def setting(name: str) -> Any:
        found = defaults.get(name)
        return getattr(image_processor, name) if found is None else found

    size = setting("size")
    tile = (size["height"], size["width"])
    grids = []
    for h, w in (s for per_text in sizes for s in per_text):
        if not (setting("crop_to_patches") and setting("max_patches") > 1):
            grids.append([1, 1])
            continue
        if setting("use_covering_area_grid"):
            rule = hf_compat.smart_resize_of(image_processor, "get_min_tile_covering_grid")
            cols, rows = rule(
                (h, w), target_patch_size=tile[0], max_image_tiles=setting("max_patches")
            )
        else:
            rule = hf_compat.smart_resize_of(image_processor, "get_optimal_tiled_canvas")
            cols, rows = rule((h, w), tile, setting("min_patches"), setting("max_patches"))
        grids.append([rows, cols])
    return {"grids": np.asarray(grids, dtype=np.int64).reshape(-1, 2)}


def _idefics3_inputs(processor: Any, sizes: list[list[tuple[int, int]]]) -> dict:
    image_processor = processor.image_processor
    rows, cols = [], []
    for per_text in sizes:
        counts = [image_processor.get_number_of_image_patches(h, w, {}) for h, w in per_text]
        rows.append([r for _, r, _ in counts])
        cols.append([c for _, _, c in counts])
    return {"rows": rows, "cols": cols}


def _llava_onevision_inputs(processor: Any, sizes: list[list[tuple[int, int]]]) -> dict:
    size = processor.image_processor.size
    side = (size["height"], size["width"]) if "height" in size else (size["shortest_edge"],) * 2
    return {
        "batch_num_images": [len(s) for s in sizes if s],
        "image_sizes": [list(s) for per_text in sizes for s in per_text],
        "pixel_values": [[_Shape((3, *side))]],
    }


def _llava_next_inputs(processor: Any, sizes: list[list[tuple[int, int]]]) -> dict:
    """LLaVA-NeXT's anyres: each image's size, and the tile side its patches are cropped to."""
    image_processor = processor.image_processor
    crop, size = image_processor.crop_size, image_processor.size
    if crop and crop.get("height"):
        side = (crop["height"], crop["width"])
    else:
        side = (size["height"], size["width"]) if "height" in size else (size["shortest_edge"],) * 2
    return {
        "image_sizes": [list(s) for per_text in sizes for s in per_text],
        "pixel_values": [[_Shape((3, *side))]],
    }


def _llava_inputs(processor: Any, sizes: list[list[tuple[int, int]]]) -> dict:
    """LLaVA (1.5): every image resized and center-cropped to one side; its replacement reads
    only the processed image's shape (a zero-copy view stands in for it)."""
    image_processor = processor.image_processor
    crop, size = image_processor.crop_size, image_processor.size
    if getattr(image_processor, "do_center_crop", False) and crop:
        side = (crop["height"], crop["width"])
    elif "height" in size:
        side = (size["height"], size["width"])
    else:
        raise ValueError(
            f"{type(image_processor).__name__} without a center crop resizes by the shortest "
            f"edge: its output size is not costed here (set do_center_crop=True, as published)"
        )
    shape = np.broadcast_to(np.zeros((), dtype=np.float32), (3, *side))
    return {"pixel_values": [shape] * sum(len(s) for s in sizes)}


def _tile_count_inputs(processor: Any, sizes: list[list[tuple[int, int]]]) -> dict:
    """InternVL's and Aya Vision's tiling (GOT-OCR2's image processor): tiles per image, with
    the processor's own image defaults (both crop to tiles)."""
    defaults = hf_compat.merged_images_kwargs(processor)
    count = processor.image_processor.get_number_of_image_patches
    return {"num_patches": [count(h, w, defaults) for per_text in sizes for h, w in per_text]}


@dataclass(kw_only=True, slots=True, frozen=True)
class Family:
    """A model family.

    Attributes:
        name: The family key (README and error messages).
        classes: Processor class names that belong to it.
        replacement_inputs: The fields the processor's ``replace_image_token`` reads, derived
            from image ``(height, width)`` alone (one list of sizes per text).
        mrope: Qwen's 3-row (t, h, w) positions (else 1-D, restarting per conversation).
        token_types: The name under which the processor returns its
            ``create_mm_token_type_ids`` (None: it returns none).
        image_rows: Where the image processor processes each image alone and concatenates
            the outputs on dim 0 (no padding across images), the rows of each output field per
            image: a pack's images then go through one image-processor call, split per
            conversation after (None: one call per conversation).
        model_types: The models (``config.json``'s ``model_type``) packed exactly with this
            layout: per-source logits equal each conversation alone.
        stateful_model_types: Models with the same processor layout whose layers carry state
            across positions: accepted only with ``allow_stateful_layers=True``.
        videos: Whether this package lays out the family's videos (its video processor's rules:
            :mod:`energon_packing.media.video`); else a video is skipped ``unsupported_video``.
        image_blocks: Whether an image's tokens attend to each other both ways (Gemma 3): a
            pack needs the model's mask mapping per conversation
            (:func:`energon_packing.hf.gemma3_mask_mapping`), not the padding-free path alone.
        block_layers: The layer types that read the image blocks (Gemma 3: all; Gemma 4: its
            sliding layers, its full layers stay causal).
        token_fields: Token-aligned model inputs besides the token types, each ``(name,
            processor method)`` the processor's own ``__call__`` adds them by (ERNIE-4.5-VL's
            ``moe_mm_token_type_ids``, ``create_moe_mm_token_type_ids``).
        vision_start: The token that opens an image's block (mRoPE families: Qwen's
            ``<|vision_start|>``, GLM's ``<|begin_of_image|>``).
    """

    name: str
    classes: tuple[str, ...]
    replacement_inputs: Callable[[Any, list[list[tuple[int, int]]]], dict]
    mrope: bool = False
    token_types: str | None = None
    image_rows: Callable[[Any], dict[str, list[int]]] | None = None
    model_types: tuple[str, ...] = ()
    stateful_model_types: tuple[str, ...] = ()
    videos: bool = False
    image_blocks: bool = False
    block_layers: tuple[str, ...] = ("full_attention", "sliding_attention")
    token_fields: tuple[tuple[str, str], ...] = ()
    vision_start: str = "<|vision_start|>"

    def __post_init__(self) -> None:
        assert self.model_types, f"{self.name}: a family names the model types it packs"


def _qwen(
    name: str,
    processor_class: str,
    *,
    model_types: tuple[str, ...] | None = None,
    stateful_model_types: tuple[str, ...] = (),
) -> Family:
    """Qwen2-VL's size rule, mRoPE, per-image rows and token types, shared by its successors."""
    return Family(
        name=name,
        classes=(processor_class,),
        model_types=model_types or (name,),
        stateful_model_types=stateful_model_types,
        videos=True,
        replacement_inputs=_qwen_inputs,
        mrope=True,
        image_rows=_qwen_rows,
        token_types="mm_token_type_ids",
    )


FAMILIES: tuple[Family, ...] = (
    _qwen("qwen2_vl", "Qwen2VLProcessor"),
    _qwen("qwen2_5_vl", "Qwen2_5_VLProcessor"),
    # Qwen3.5 ships Qwen3-VL's processor (the same ids and positions), but 3 of 4 of its text
    # layers are Gated DeltaNet: a recurrent state (:mod:`.models`)
    _qwen(
        "qwen3_vl",
        "Qwen3VLProcessor",
        model_types=("qwen3_vl", "qwen3_vl_moe"),
        stateful_model_types=("qwen3_5", "qwen3_5_moe"),
    ),
    Family(
        name="gemma3",
        classes=("Gemma3Processor",),
        model_types=("gemma3",),
        replacement_inputs=_gemma3_inputs,
        image_blocks=True,
        token_types="token_type_ids",  # Gemma3Processor renames mm_token_type_ids
    ),
    Family(
        name="idefics3",
        classes=("Idefics3Processor",),
        model_types=("idefics3",),
        replacement_inputs=_idefics3_inputs,
    ),
    Family(
        name="smolvlm",
        classes=("SmolVLMProcessor",),
        model_types=("smolvlm",),
        replacement_inputs=_idefics3_inputs,
    ),
    Family(
        name="llava",
        classes=("LlavaProcessor",),
        model_types=("llava",),
        replacement_inputs=_llava_inputs,
    ),
    Family(
        name="llava_next",
        classes=("LlavaNextProcessor",),
        model_types=("llava_next",),
        replacement_inputs=_llava_next_inputs,
    ),
    Family(
        name="internvl",
        classes=("InternVLProcessor",),
        model_types=("internvl",),
        replacement_inputs=_tile_count_inputs,
    ),
    Family(
        name="aya_vision",
        classes=("AyaVisionProcessor",),
        model_types=("aya_vision",),
        replacement_inputs=_tile_count_inputs,
    ),
    Family(
        name="llava_onevision",
        classes=("LlavaOnevisionProcessor",),
        model_types=("llava_onevision",),
        replacement_inputs=_llava_onevision_inputs,
    ),
    # Gemma 4: an image's soft tokens see each other on the sliding layers (the models whose
    # use_bidirectional_attention is "vision"), causal on the full ones
    Family(
        name="gemma4",
        classes=("Gemma4Processor",),
        model_types=("gemma4",),
        replacement_inputs=_gemma4_inputs,
        image_blocks=True,
        block_layers=("sliding_attention",),
        token_types="mm_token_type_ids",
    ),
    # ERNIE-4.5-VL: Qwen2-VL's image grid, size rule and positions (its get_rope_index), and a
    # second token field its MoE routes by (the image tokens and their start/end tokens)
    Family(
        name="ernie4_5_vl_moe",
        classes=("Ernie4_5_VLMoeProcessor",),
        model_types=("ernie4_5_vl_moe",),
        replacement_inputs=_qwen_inputs,
        mrope=True,
        image_rows=_qwen_rows,
        token_types="mm_token_type_ids",
        token_fields=(("moe_mm_token_type_ids", "create_moe_mm_token_type_ids"),),
        vision_start="<|IMAGE_START|>",
    ),
    Family(
        name="ovis2",
        classes=("Ovis2Processor",),
        model_types=("ovis2",),
        replacement_inputs=_ovis2_inputs,
    ),
    # GLM-4.1V/4.5V/4.6V: Qwen2-VL's positions over the <|image|> runs (get_rope_index), its
    # own smart_resize; videos (timestamps in the text, frames by fps) are not laid out yet
    Family(
        name="glm4v",
        classes=("Glm4vProcessor", "Glm46VProcessor"),
        model_types=("glm4v", "glm4v_moe", "glm46v"),
        replacement_inputs=_glm4v_inputs,
        mrope=True,
        image_rows=_qwen_rows,
        token_types="mm_token_type_ids",
        vision_start="<|begin_of_image|>",
    ),
)


#: Image-text models that energon_packing refuses, measured or read on transformers 5.24, and why
#: (the error names the model type and this reason).
REFUSED: dict[str, str] = {
    "paligemma": (
        "its prompt attends bidirectionally (token_type_ids 0: one prefix-LM block over the "
        "whole row) and its positions start at 1; a pack would need each conversation's own "
        "prefix block, which is not laid out"
    ),
    "llama4": (
        "transformers 5.24's Llama4ForConditionalGeneration.forward raises AttributeError "
        "('image_outputs') on every call, and its attention temperature depends on the "
        "absolute position"
    ),
    "mistral3": (
        "its PixtralProcessor imports the torchvision image processor (transformers 5.24): no "
        "layout proven without torchvision"
    ),
    "pixtral": "as mistral3: PixtralProcessor needs torchvision (transformers 5.24)",
    "kimi_k25": "its processor needs torchvision (transformers 5.24); not laid out",
    "gemma3n": "its audio and vision towers need timm; not laid out",
}


def refusal(processor_class: str, model_type: str | None) -> str:
    """One line: why a processor with no family here (its class, the model type it came with,
    or the model types its class serves) is refused."""
    types = (model_type,) if model_type else hf_compat.processor_model_types(processor_class)
    named = ", ".join(repr(t) for t in types) or "unknown"
    why = "; ".join(f"{t!r}: {REFUSED[t]}" for t in types if t in REFUSED)
    return (
        f"model type {named} ({processor_class}) is not a model family energon_packing packs "
        f"exactly{f' ({why})' if why else ''} (known: {', '.join(f.name for f in FAMILIES)}: "
        f"docs/models.md); pass its tokenizer for text-only data"
    )


def family_of_model(model_type: str | None) -> Family | None:
    """The :class:`Family` that packs ``model_type`` (exactly, or with the stateful opt-in)."""
    return next(
        (f for f in FAMILIES if model_type in (*f.model_types, *f.stateful_model_types)), None
    )


def family_of(processor: Any) -> Family | None:
    """The :class:`Family` of a processor (by class name, subclasses included)."""
    names = {klass.__name__ for klass in type(processor).__mro__}
    return next((f for f in FAMILIES if names & set(f.classes)), None)


def check_model(family: Family, processor_class: str, info: ModelInfo | None) -> None:
    """Raises unless ``family``'s layout packs the model ``info`` describes exactly.

    A family is chosen by its processor class, but one class can serve several models
    (``Qwen3VLProcessor``: Qwen3-VL and Qwen3.5; ``Gemma3Processor``: Gemma 3 and T5Gemma 2):
    the model decides. With no model at hand (``info`` None), a class that serves a model the
    family does not pack is refused rather than guessed.
    """
    accepted = (*family.model_types, *family.stateful_model_types)
    if info is not None:
        if info.model_type not in accepted:
            raise ValueError(
                f"model type {info.model_type!r} ({info.source}) comes with {processor_class}, "
                f"which energon_packing lays out as the {family.name} family, exact for model "
                f"types {', '.join(accepted)} only; {info.model_type!r} is not packed (its "
                f"positions, masks or layers are not that family's)"
            )
        return
    others = sorted(set(hf_compat.processor_model_types(processor_class)) - set(family.model_types))
    if others:
        raise ValueError(
            f"{processor_class} serves several models ({', '.join(family.model_types)} are "
            f"packed as {family.name}; {', '.join(others)} are not, or only with "
            f"allow_stateful_layers=True) and this processor names none: load it with "
            f"load_processor(MODEL_DIR) from the directory that holds the model's config.json, "
            f"or pass model_type= (the model_type of that config.json)"
        )


def _attention(family: Family) -> str:
    if not family.image_blocks:
        return "causal"
    if set(family.block_layers) == {"full_attention", "sliding_attention"}:
        return "causal, an image bidirectional"
    return f"causal, an image bidirectional on {', '.join(family.block_layers)} layers"


def family_table() -> str:
    """The family table of ``docs/models.md``, from :data:`FAMILIES` (a test keeps them equal)."""

    def code(names: tuple[str, ...]) -> str:
        return ", ".join(f"`{n}`" for n in names) or "-"

    rows = [
        "| family | processor | model types packed exactly | only with `allow_stateful_layers` "
        "| positions | videos | attention per conversation |",
        "|---|---|---|---|---|---|---|",
    ]
    for f in FAMILIES:
        rows.append(
            f"| {f.name} | {code(f.classes)} | {code(f.model_types)} | "
            f"{code(f.stateful_model_types)} | {'mRoPE (3 rows)' if f.mrope else '1-D'} | "
            f"{'yes' if f.videos else 'skipped (`unsupported_video`)'} | "
            f"{_attention(f)} |"
        )
    return "\n".join(rows)


def refused_table() -> str:
    """The refused models of ``docs/models.md``, from :data:`REFUSED` (a test keeps them equal)."""
    rows = ["| model type | why it is refused |", "|---|---|"]
    rows += [f"| `{t}` | {why} |" for t, why in REFUSED.items()]
    return "\n".join(rows)
