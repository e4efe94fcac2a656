"""Each family's image rule: the fields a processor's ``replace_image_token`` reads, derived
from image ``(height, width)`` alone as its image processor would derive them (Qwen's
``smart_resize``, Idefics3's tiling, LLaVA-OneVision's anyres grid, Gemma 3's fixed sequence),
and the expansion an older release's ``__call__`` writes. The registry
(:mod:`energon_packing.encoding.families`) names them per family. No torch.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from energon_packing.encoding import hf_compat
from energon_packing.encoding.vision import MAX_ASPECT_RATIO
from energon_packing.errors import Skip

__all__ = [
    "aya_vision_expansion",
    "ernie_moe_token_types",
    "gemma3_expansion",
    "gemma3_inputs",
    "gemma3n_expansion",
    "gemma3n_inputs",
    "gemma4_expansion",
    "gemma4_inputs",
    "glm4v_inputs",
    "idefics3_expansion",
    "idefics3_inputs",
    "image_settings",
    "internvl_expansion",
    "llava_expansion",
    "llava_inputs",
    "llava_next_expansion",
    "llava_next_inputs",
    "llava_next_tiles",
    "llava_onevision_expansion",
    "llava_onevision_inputs",
    "llava_onevision_tiles",
    "ovis2_expansion",
    "ovis2_inputs",
    "paligemma_expansion",
    "pixtral_inputs",
    "pixtral_kwargs",
    "qwen_expansion",
    "qwen_inputs",
    "qwen_rows",
    "smolvlm_expansion",
    "tile_count_inputs",
]


class _Shape:
    """Stands in for a processed tile where a processor only reads its ``shape``."""

    def __init__(self, shape: tuple[int, ...]):
        self.shape = shape


def qwen_inputs(processor: Any, sizes: list[list[tuple[int, int]]]) -> dict:
    """Qwen's ``smart_resize`` of each image: ``image_grid_thw`` rows ``(1, h, w)``."""
    return _grids(processor, sizes, lambda resize, h, w, **bounds: resize(h, w, **bounds))


def glm4v_inputs(processor: Any, sizes: list[list[tuple[int, int]]]) -> dict:
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


def qwen_rows(processed: Any) -> dict[str, list[int]]:
    grids = np.asarray(processed["image_grid_thw"]).reshape(-1, 3)
    return {"pixel_values": grids.prod(axis=1).tolist(), "image_grid_thw": [1] * len(grids)}


def qwen_expansion(processor: Any, inputs: dict, index: int) -> str:
    """Qwen2/2.5/3-VL's image expansion as their processor's ``__call__`` writes it where the
    processor has no ``replace_image_token`` (before transformers 5.10): the image token,
    ``grid.prod() // merge_size**2`` times."""
    grid = np.asarray(inputs["image_grid_thw"]).reshape(-1, 3)[index]
    merge = processor.image_processor.merge_size
    return processor.image_token * int(grid.prod() // (merge * merge))


def gemma3_expansion(processor: Any, inputs: dict, index: int) -> str:
    """Gemma 3 before 5.15: its ``__call__`` replaces the begin-of-image token the template
    writes (``boi_token``, not ``image_token``) by ``full_image_sequence``."""
    crops = int(inputs["num_crops"][index])
    if not crops:
        return processor.full_image_sequence
    return (
        f"Here is the original image {processor.full_image_sequence} and here are some crops to "
        f"help you see better " + " ".join([processor.full_image_sequence] * crops)
    )


def gemma3n_expansion(processor: Any, inputs: dict, index: int) -> str:
    """Gemma 3n before the public API: its ``__call__`` replaces every ``image_token`` by
    ``full_image_sequence`` (the same for every image)."""
    return processor.full_image_sequence


def paligemma_expansion(processor: Any, inputs: dict, index: int) -> str:
    """PaliGemma before its public ``replace_image_token``: its ``__call__`` repeats the image
    token ``image_seq_length`` times."""
    return processor.image_token * processor.image_seq_length


def gemma4_expansion(processor: Any, inputs: dict, index: int) -> str:
    """Gemma 4 before the public API: its ``__call__`` replaces each ``image_token`` by
    ``boi_token``, the image's soft tokens, ``eoi_token``."""
    count = int(inputs["num_soft_tokens_per_image"][index])
    return f"{processor.boi_token}{processor.image_token * count}{processor.eoi_token}"


def ovis2_expansion(processor: Any, inputs: dict, index: int) -> str:
    """Ovis2 before the public API: its ``__call__`` replaces each ``<image>`` by the image's
    atoms (``image_seq_length`` each): the whole image after ``<IMG_START>`` and
    ``<IMG_GRID>``, then, for a tiled image, each tile's, ``<IMG_COL>`` between the tiles of a
    row and ``<IMG_ROW>`` between rows; ``<IMG_END>`` last."""
    rows, cols = (int(n) for n in np.asarray(inputs["grids"]).reshape(-1, 2)[index])
    atoms = "<IMG_ATOM>" * processor.image_seq_length
    tiles = ""
    if rows * cols > 1:
        tiles = "<IMG_ROW>".join("<IMG_COL>".join([atoms] * cols) for _ in range(rows))
    return f"<IMG_START>{atoms}<IMG_GRID>{tiles}<IMG_END>"


def ernie_moe_token_types(processor: Any, input_ids: list[list[int]]) -> list[list[int]]:
    """ERNIE-4.5-VL's ``moe_mm_token_type_ids`` as its ``__call__`` writes them where the
    processor has no ``create_moe_mm_token_type_ids`` (before 5.19): image tokens and the image
    start/end tokens 1, video tokens and the video start/end tokens 2, text 0."""
    image = (processor.image_token_id, processor.image_start_token_id, processor.image_end_token_id)
    video = (processor.video_token_id, processor.video_start_token_id, processor.video_end_token_id)
    rows = []
    for ids in input_ids:
        ids = np.asarray(ids)
        types = np.zeros_like(ids)
        for kind, tokens in ((1, image), (2, video)):
            types[np.isin(ids, [t for t in tokens if t is not None])] = kind
        rows.append(types.tolist())
    return rows


def idefics3_expansion(processor: Any, inputs: dict, index: int) -> str:
    """Idefics3 before 5.10 (its module's ``get_image_prompt_string``, as its ``__call__``)."""
    rows = [r for per_text in inputs["rows"] for r in per_text]
    cols = [c for per_text in inputs["cols"] for c in per_text]
    prompt = hf_compat.module_function(processor, "get_image_prompt_string")
    return prompt(
        rows[index],
        cols[index],
        processor.image_seq_len,
        image_token=processor.image_token,
        fake_token_around_image=processor.fake_image_token,
        global_img_token=processor.global_image_tag,
    )


def smolvlm_expansion(processor: Any, inputs: dict, index: int) -> str:
    """SmolVLM before 5.15: its own public ``expand_text_with_image_tokens`` on one
    placeholder."""
    rows = [r for per_text in inputs["rows"] for r in per_text]
    cols = [c for per_text in inputs["cols"] for c in per_text]
    expand = hf_compat.processor_method(processor, "expand_text_with_image_tokens")
    (expanded,) = expand(
        [processor.image_token], image_rows=[[rows[index]]], image_cols=[[cols[index]]]
    )
    return expanded


def _features(processor: Any, inputs: dict, index: int, tokens: int | None = None) -> str:
    """LLaVA-NeXT's and LLaVA-OneVision's anyres count before 5.15 (their ``__call__``)."""
    if tokens is None:
        orig_height, orig_width = (int(v) for v in inputs["image_sizes"][index])
        height, width = inputs["pixel_values"][0][0].shape[-2:]
        tokens = hf_compat.number_of_features(processor, orig_height, orig_width, height, width)
    if processor.vision_feature_select_strategy == "default":
        tokens -= 1
    return processor.image_token * tokens


def llava_next_expansion(processor: Any, inputs: dict, index: int) -> str:
    return _features(processor, inputs, index)


def llava_onevision_expansion(processor: Any, inputs: dict, index: int) -> str:
    """Several images in one text: each ``num_image_tokens + 1`` (its newline), else anyres."""
    counts, first = list(inputs["batch_num_images"]), 0
    for count in counts:
        if index < first + count:
            break
        first += count
    multi = count != 1
    return _features(processor, inputs, index, processor.num_image_tokens + 1 if multi else None)


def llava_expansion(processor: Any, inputs: dict, index: int) -> str:
    """LLaVA before 5.10: every image's patches from the processed side."""
    height, width = inputs["pixel_values"][index].shape[-2:]
    tokens = (height // processor.patch_size) * (width // processor.patch_size)
    tokens += processor.num_additional_image_tokens
    if processor.vision_feature_select_strategy == "default":
        tokens -= 1
    return processor.image_token * tokens


def internvl_expansion(processor: Any, inputs: dict, index: int) -> str:
    tokens = processor.image_token * processor.image_seq_length * inputs["num_patches"][index]
    return f"{processor.start_image_token}{tokens}{processor.end_image_token}"


def aya_vision_expansion(processor: Any, inputs: dict, index: int) -> str:
    patches = int(inputs["num_patches"][index])
    tile = processor.img_patch_token * (processor.img_size // processor.patch_size) ** 2
    tiles = "".join(f"{processor.tile_token}_{i}{tile}" for i in range(1, patches))
    return (
        f"{processor.start_of_img_token}{tiles}{processor.tile_global_token}{tile}"
        f"{processor.end_of_img_token}"
    )


def gemma3_inputs(processor: Any, sizes: list[list[tuple[int, int]]]) -> dict:
    if getattr(processor.image_processor, "do_pan_and_scan", False):
        raise ValueError("Gemma 3 with do_pan_and_scan=True is not supported (crops need pixels)")
    return {"num_crops": [0] * sum(len(s) for s in sizes)}


def gemma3n_inputs(processor: Any, sizes: list[list[tuple[int, int]]]) -> dict:
    """Gemma 3n: every image resized to one side, ``image_seq_length`` tokens (its
    ``replace_image_token`` reads nothing)."""
    return {}


def gemma4_inputs(processor: Any, sizes: list[list[tuple[int, int]]]) -> dict:
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


def ovis2_inputs(processor: Any, sizes: list[list[tuple[int, int]]]) -> dict:
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


def idefics3_inputs(processor: Any, sizes: list[list[tuple[int, int]]]) -> dict:
    image_processor = processor.image_processor
    rows, cols = [], []
    for per_text in sizes:
        counts = [image_processor.get_number_of_image_patches(h, w, {}) for h, w in per_text]
        rows.append([r for _, r, _ in counts])
        cols.append([c for _, _, c in counts])
    return {"rows": rows, "cols": cols}


def llava_onevision_inputs(processor: Any, sizes: list[list[tuple[int, int]]]) -> dict:
    size = processor.image_processor.size
    side = (size["height"], size["width"]) if "height" in size else (size["shortest_edge"],) * 2
    return {
        "batch_num_images": [len(s) for s in sizes if s],
        "image_sizes": [list(s) for per_text in sizes for s in per_text],
        "pixel_values": [[_Shape((3, *side))]],
    }


def _anyres_side(image_processor: Any) -> tuple[int, int]:
    """The tile side LLaVA-NeXT's image processor crops an image's patches to."""
    crop, size = image_processor.crop_size, image_processor.size
    if crop and crop.get("height"):
        return (crop["height"], crop["width"])
    return (size["height"], size["width"]) if "height" in size else (size["shortest_edge"],) * 2


def llava_next_tiles(processor: Any, sizes: list[list[tuple[int, int]]]) -> list[int]:
    """The tiles the vision tower runs over for each image (anyres: its best-fit grid and the
    whole image), in order over the texts' images."""
    image_processor = processor.image_processor
    tile = _anyres_side(image_processor)[0]
    pinpoints = image_processor.image_grid_pinpoints
    return [
        hf_compat.anyres_tiles(h, w, grid_pinpoints=pinpoints, tile=tile)
        for per_text in sizes
        for h, w in per_text
    ]


def llava_onevision_tiles(processor: Any, sizes: list[list[tuple[int, int]]]) -> list[int]:
    """LLaVA-OneVision's: anyres for a text's only image, the whole image alone (one tile) for
    each of several (its model's ``batch_num_images`` rule)."""
    tiles = llava_next_tiles(processor, sizes)
    singles = [len(per_text) == 1 for per_text in sizes for _ in per_text]
    return [n if single else 1 for n, single in zip(tiles, singles)]


def llava_next_inputs(processor: Any, sizes: list[list[tuple[int, int]]]) -> dict:
    """LLaVA-NeXT's anyres: each image's size, and the tile side its patches are cropped to."""
    side = _anyres_side(processor.image_processor)
    return {
        "image_sizes": [list(s) for per_text in sizes for s in per_text],
        "pixel_values": [[_Shape((3, *side))]],
    }


def llava_inputs(processor: Any, sizes: list[list[tuple[int, int]]]) -> dict:
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


def tile_count_inputs(processor: Any, sizes: list[list[tuple[int, int]]]) -> dict:
    """InternVL's and Aya Vision's tiling (GOT-OCR2's image processor): tiles per image, with
    the processor's own image defaults (both crop to tiles)."""
    defaults = hf_compat.merged_images_kwargs(processor)
    count = processor.image_processor.get_number_of_image_patches
    return {"num_patches": [count(h, w, defaults) for per_text in sizes for h, w in per_text]}


def _pixtral_patch(processor: Any) -> int:
    """Pixtral's resize step: its processor's ``_process_images`` passes the image processor
    ``patch_size * spatial_merge_size`` (Mistral 3: 14 * 2 = 28 px)."""
    return processor.patch_size * processor.spatial_merge_size


def pixtral_kwargs(processor: Any) -> dict:
    step = _pixtral_patch(processor)
    return {"patch_size": {"height": step, "width": step}}


def pixtral_inputs(processor: Any, sizes: list[list[tuple[int, int]]]) -> dict:
    """Pixtral's resize: within the longest edge, aspect kept (floored), then up to whole
    patches of the processor's step; ``image_sizes`` are the resized ``(height, width)`` (its
    ``replace_image_token`` reads them: a row of ``[IMG]`` per step of height, each ended by
    ``[IMG_BREAK]``, the last by ``[IMG_END]``). The image processor's own rule, on a zero-copy
    stand-in of each image's shape."""
    image_processor = processor.image_processor
    rule = hf_compat.smart_resize_of(image_processor, "get_resize_output_image_size")
    size = hf_compat.merged_images_kwargs(processor).get("size") or image_processor.size
    bound = (
        (size["longest_edge"],) * 2 if size.get("longest_edge") else (size["height"], size["width"])
    )
    step = _pixtral_patch(processor)
    blank = np.zeros((), dtype=np.uint8)
    out = []
    for h, w in (s for per_text in sizes for s in per_text):
        shape = np.broadcast_to(blank, (h, w, 3))
        rh, rw = rule(shape, size=bound, patch_size=(step, step), input_data_format="channels_last")
        if not (rh and rw):  # the processor raises on a side resized to 0 px
            raise Skip(
                "image_aspect_ratio",
                f"image of {w}x{h} px (upright) has an aspect ratio of "
                f"{max(h, w) / min(h, w):,.1f}: {type(image_processor).__name__} fits it into "
                f"{bound[1]}x{bound[0]} px as {rw}x{rh}, a side of 0 px, which it refuses; crop "
                f"or pad such images (e.g. text lines) before packing",
            )
        out.append([rh, rw])
    return {"image_sizes": out}


@functools.cache
def _phi4_ratios(max_crops: int) -> tuple[tuple[int, int], ...]:
    """The crop grids Phi-4-multimodal's image processor chooses among, in its own set and
    order (ties keep its pick); built once per cap, not per image."""
    return tuple(
        sorted(
            {
                (i, j)
                for n in range(1, max_crops + 1)
                for i in range(1, n + 1)
                for j in range(1, n + 1)
                if 1 <= i * j <= max_crops
            },
            key=lambda r: r[0] * r[1],
        )
    )


def _phi4_layout(height: int, width: int, size: int, max_crops: int) -> tuple:
    """Phi-4-multimodal's crop grid ``(w_crops, h_crops)`` and the padding ``(w, h)`` in px its
    image processor adds (its ``_get_crop_layout``, in plain Python)."""
    w_crops, h_crops = math.ceil(width / size), math.ceil(height / size)
    if w_crops * h_crops > max_crops:
        aspect = width / height
        best, best_diff = (1, 1), float("inf")
        for ratio in _phi4_ratios(max_crops):
            diff = abs(aspect - ratio[0] / ratio[1])
            if diff < best_diff:
                best, best_diff = ratio, diff
            elif diff == best_diff and width * height > 0.5 * size * size * ratio[0] * ratio[1]:
                best = ratio
        w_crops, h_crops = best
    target_w, target_h = size * w_crops, size * h_crops
    if target_w / width < target_h / height:
        new_w, new_h = target_w, int(height * (target_w / width))
    else:
        new_w, new_h = int(width * (target_h / height)), target_h
    if min(new_h, target_h) < 10 or min(new_w, target_w) < 10:  # the processor raises
        raise Skip(
            "image_aspect_ratio",
            f"image of {width}x{height} px (upright) has an aspect ratio of "
            f"{max(height, width) / min(height, width):,.1f}: Phi-4-multimodal's image "
            f"processor fits it into {target_w}x{target_h} px as {new_w}x{new_h}, a side under "
            f"10 px, which it refuses; crop or pad such images (e.g. text lines) before packing",
        )
    return (w_crops, h_crops), (target_w - new_w, target_h - new_h)


def phi4_tokens(height: int, width: int, *, size: int, patch: int, max_crops: int) -> int:
    """Image tokens Phi-4-multimodal's processor writes for an image: its crop mask's valid
    patches at even rows and columns of each crop, one per valid row more, and the global
    image's fixed 256 + 1 + 16 (its ``_get_num_image_tokens``; fixed whatever the size)."""
    (w_crops, h_crops), (pad_w, pad_h) = _phi4_layout(height, width, size, max_crops)
    cells = size // patch
    rows, cols = cells * h_crops, cells * w_crops
    masked_rows = pad_h // patch if pad_h >= patch else 0
    masked_cols = pad_w // patch if pad_w >= patch else 0
    # the mask keeps each crop's even local rows (columns): (r % cells) % 2 == 0
    valid_rows = sum(1 for r in range(rows - masked_rows) if (r % cells) % 2 == 0)
    valid_cols = sum(1 for c in range(cols - masked_cols) if (c % cells) % 2 == 0)
    return 256 + 1 + valid_rows * valid_cols + valid_rows + 16


def image_settings(processor: Any, *, side: str = "height") -> tuple[Callable[[str], Any], int]:
    """``(setting, side)``: the image processor's setting ``name`` as the processor's own
    ``__call__`` passes it (its merged ``images_kwargs``, else the image processor's own), and
    the square side of its ``size`` (a crop's or a tile's; ``side``: the key that holds it,
    Kimi-K2.5's ``max_height``)."""
    kwargs = hf_compat.merged_images_kwargs(processor)
    image_processor = processor.image_processor

    def setting(name: str) -> Any:
        value = kwargs.get(name)
        return getattr(image_processor, name) if value is None else value

    size = setting("size")
    return setting, int(size[side] if isinstance(size, Mapping) else getattr(size, side, size))


def phi4_inputs(processor: Any, sizes: list[list[tuple[int, int]]]) -> dict:
    """Phi-4-multimodal: ``num_img_tokens`` per image, from its size and the image processor's
    ``size``, ``patch_size`` and ``dynamic_hd`` (what its ``replace_image_token`` reads)."""
    setting, side = image_settings(processor)
    count = functools.partial(
        phi4_tokens,
        size=side,
        patch=int(setting("patch_size")),
        max_crops=int(setting("dynamic_hd")),
    )
    return {"num_img_tokens": [count(h, w) for per_text in sizes for h, w in per_text]}


def phi4_expansion(processor: Any, inputs: dict, index: int) -> str:
    """Phi-4-multimodal before its public ``replace_image_token``: its ``__call__`` repeats
    the image token ``num_img_tokens`` times."""
    return processor.image_token * int(inputs["num_img_tokens"][index])
