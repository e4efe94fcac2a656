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
from energon_packing.encoding.vision import MAX_ASPECT_RATIO
from energon_packing.errors import Skip

__all__ = ["FAMILIES", "Family", "family_of"]


class _Shape:
    """Stands in for a processed tile where a processor only reads its ``shape``."""

    def __init__(self, shape: tuple[int, ...]):
        self.shape = shape


def _qwen_inputs(processor: Any, sizes: list[list[tuple[int, int]]]) -> dict:
    image_processor = processor.image_processor
    smart_resize = hf_compat.smart_resize_of(image_processor)
    patch, merge = image_processor.patch_size, image_processor.merge_size
    grids = []
    for h, w in (s for per_text in sizes for s in per_text):
        try:
            rh, rw = smart_resize(
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
    """

    name: str
    classes: tuple[str, ...]
    replacement_inputs: Callable[[Any, list[list[tuple[int, int]]]], dict]
    mrope: bool = False
    token_types: str | None = None
    image_rows: Callable[[Any], dict[str, list[int]]] | None = None


def _qwen(name: str, processor_class: str) -> Family:
    """Qwen2-VL's size rule, mRoPE, per-image rows and token types, shared by its successors."""
    return Family(
        name=name,
        classes=(processor_class,),
        replacement_inputs=_qwen_inputs,
        mrope=True,
        image_rows=_qwen_rows,
        token_types="mm_token_type_ids",
    )


FAMILIES: tuple[Family, ...] = (
    _qwen("qwen2_vl", "Qwen2VLProcessor"),
    _qwen("qwen2_5_vl", "Qwen2_5_VLProcessor"),
    _qwen("qwen3_vl", "Qwen3VLProcessor"),
    Family(
        name="gemma3",
        classes=("Gemma3Processor",),
        replacement_inputs=_gemma3_inputs,
        token_types="token_type_ids",  # Gemma3Processor renames mm_token_type_ids
    ),
    Family(name="idefics3", classes=("Idefics3Processor",), replacement_inputs=_idefics3_inputs),
    Family(name="smolvlm", classes=("SmolVLMProcessor",), replacement_inputs=_idefics3_inputs),
    Family(
        name="llava_onevision",
        classes=("LlavaOnevisionProcessor",),
        replacement_inputs=_llava_onevision_inputs,
    ),
)


def family_of(processor: Any) -> Family | None:
    """The :class:`Family` of a processor (by class name, subclasses included)."""
    names = {klass.__name__ for klass in type(processor).__mro__}
    return next((f for f in FAMILIES if names & set(f.classes)), None)
