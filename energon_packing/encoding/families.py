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
from energon_packing.media import video_styles
from energon_packing.media.video_styles import VideoStyle

__all__ = [
    "FAMILIES",
    "REFUSED",
    "AudioRule",
    "Family",
    "audio_families",
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


def _qwen_expansion(processor: Any, inputs: dict, index: int) -> str:
    """Qwen2/2.5/3-VL's image expansion as their processor's ``__call__`` writes it where the
    processor has no ``replace_image_token`` (before transformers 5.10): the image token,
    ``grid.prod() // merge_size**2`` times."""
    grid = np.asarray(inputs["image_grid_thw"]).reshape(-1, 3)[index]
    merge = processor.image_processor.merge_size
    return processor.image_token * int(grid.prod() // (merge * merge))


def _gemma3_expansion(processor: Any, inputs: dict, index: int) -> str:
    """Gemma 3 before 5.15: its ``__call__`` replaces the begin-of-image token the template
    writes (``boi_token``, not ``image_token``) by ``full_image_sequence``."""
    crops = int(inputs["num_crops"][index])
    if not crops:
        return processor.full_image_sequence
    return (
        f"Here is the original image {processor.full_image_sequence} and here are some crops to "
        f"help you see better " + " ".join([processor.full_image_sequence] * crops)
    )


def _idefics3_expansion(processor: Any, inputs: dict, index: int) -> str:
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


def _smolvlm_expansion(processor: Any, inputs: dict, index: int) -> str:
    """SmolVLM before 5.15: its own public ``expand_text_with_image_tokens`` on one
    placeholder."""
    rows = [r for per_text in inputs["rows"] for r in per_text]
    cols = [c for per_text in inputs["cols"] for c in per_text]
    (expanded,) = processor.expand_text_with_image_tokens(
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


def _llava_next_expansion(processor: Any, inputs: dict, index: int) -> str:
    return _features(processor, inputs, index)


def _llava_onevision_expansion(processor: Any, inputs: dict, index: int) -> str:
    """Several images in one text: each ``num_image_tokens + 1`` (its newline), else anyres."""
    counts, first = list(inputs["batch_num_images"]), 0
    for count in counts:
        if index < first + count:
            break
        first += count
    multi = count != 1
    return _features(processor, inputs, index, processor.num_image_tokens + 1 if multi else None)


def _llava_expansion(processor: Any, inputs: dict, index: int) -> str:
    """LLaVA before 5.10: every image's patches from the processed side."""
    height, width = inputs["pixel_values"][index].shape[-2:]
    tokens = (height // processor.patch_size) * (width // processor.patch_size)
    tokens += processor.num_additional_image_tokens
    if processor.vision_feature_select_strategy == "default":
        tokens -= 1
    return processor.image_token * tokens


def _internvl_expansion(processor: Any, inputs: dict, index: int) -> str:
    tokens = processor.image_token * processor.image_seq_length * inputs["num_patches"][index]
    return f"{processor.start_image_token}{tokens}{processor.end_image_token}"


def _aya_vision_expansion(processor: Any, inputs: dict, index: int) -> str:
    patches = int(inputs["num_patches"][index])
    tile = processor.img_patch_token * (processor.img_size // processor.patch_size) ** 2
    tiles = "".join(f"{processor.tile_token}_{i}{tile}" for i in range(1, patches))
    return (
        f"{processor.start_of_img_token}{tiles}{processor.tile_global_token}{tile}"
        f"{processor.end_of_img_token}"
    )


def _gemma3_inputs(processor: Any, sizes: list[list[tuple[int, int]]]) -> dict:
    if getattr(processor.image_processor, "do_pan_and_scan", False):
        raise ValueError("Gemma 3 with do_pan_and_scan=True is not supported (crops need pixels)")
    return {"num_crops": [0] * sum(len(s) for s in sizes)}


def _gemma3n_inputs(processor: Any, sizes: list[list[tuple[int, int]]]) -> dict:
    """Gemma 3n: every image resized to one side, ``image_seq_length`` tokens (its
    ``replace_image_token`` reads nothing)."""
    return {}


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


def _pixtral_patch(processor: Any) -> int:
    """Pixtral's resize step: its processor's ``_process_images`` passes the image processor
    ``patch_size * spatial_merge_size`` (Mistral 3: 14 * 2 = 28 px)."""
    return processor.patch_size * processor.spatial_merge_size


def _pixtral_kwargs(processor: Any) -> dict:
    step = _pixtral_patch(processor)
    return {"patch_size": {"height": step, "width": step}}


def _pixtral_inputs(processor: Any, sizes: list[list[tuple[int, int]]]) -> dict:
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


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(kw_only=True, slots=True, frozen=True)
class AudioRule:
    """How a family's processor turns one conversation's clips (16 kHz samples) into audio
    tokens and features, as its ``_process_audio`` does (transformers 5.24).

    Attributes:
        name: The rule's name (the restore fingerprint holds it).
        padding: ``"max_length"``: the processor pads every clip to the feature extractor's
            maximum (Qwen2.5-Omni: 5 minutes) and cuts longer ones, so a clip's features do
            not depend on its neighbours; the pack holds them padded to the longest clip of
            the pack only (the model reads the masked frames alone), and a clip over the
            maximum is skipped (``audio_too_long``), never cut. ``"longest"``: the processor
            pads the clips of one call to the longest of them (Qwen3-Omni), and the longest
            clip's frame count and last frames differ from a padded one's: a conversation's
            clips go through one call of their own, never one call per pack. ``"multiple"``:
            as ``"longest"``, the longest rounded up to ``multiple`` samples, and a call cut at
            ``max_samples`` (Gemma 3n: 128 samples, 30 s; a longer clip is skipped
            ``audio_too_long``, where the processor would cut it silently).
        tokens: Audio tokens of a clip of ``frames`` mel frames (the processor's
            ``_get_feat_extract_output_lengths``; Gemma 3n: ``audio_seq_length``, whatever
            the clip), given the processor.
        expansion: A clip's placeholder expansion, given the processor and its tokens, as
            its ``replace_audio_token`` writes it (None: the audio token, that many times).
        mask: The name the model reads the features' frame mask under (Qwen's
            ``feature_attention_mask``; Gemma 3n's ``input_features_mask``, boolean).
        multiple: See ``"multiple"``.
        max_samples: See ``"multiple"``.
    """

    name: str
    padding: str
    tokens: Callable[[int, Any], int]
    expansion: Callable[[Any, int], str] | None = None
    mask: str = "feature_attention_mask"
    multiple: int = 1
    max_samples: int | None = None

    def frames(self, samples: list[int], extractor: Any) -> list[int]:
        """Each clip's mel frames (the mask's sum) in a call with the conversation's clips
        (the mask is the samples' mask at every ``hop``-th sample, cut to the frames the STFT
        keeps of the padded length: Whisper's ``padded // hop``, Gemma 3n's
        ``(padded - frame_length - 1) // hop + 1``)."""
        hop = extractor.hop_length
        if self.padding == "longest":
            kept = max(samples) // hop
            return [min(_ceil_div(n, hop), kept) for n in samples]
        if self.padding == "multiple":
            padded = _ceil_div(max(samples), self.multiple) * self.multiple
            if self.max_samples is not None:
                padded = min(padded, self.max_samples)
            kept = (padded - extractor.frame_length - 1) // hop + 1
            return [min(_ceil_div(n, hop), kept) for n in samples]
        return [_ceil_div(n, hop) for n in samples]

    def call_kwargs(self, samples: list[int], extractor: Any) -> dict:
        """What the feature extractor is called with for one conversation's clips."""
        if self.padding == "longest":
            return {"padding": True, "truncation": False}
        if self.padding == "multiple":  # the extractor's own defaults, as the processor calls it
            return {}
        # every frame a clip's mask covers sees the same zeros as under the processor's
        # 5-minute pad, and the clip's max (the log-mel floor) counts an all-zero frame as it
        # does; frames past that are the pad's own values
        hop = extractor.hop_length
        width = _ceil_div(max(samples), hop) * hop + 2 * extractor.n_fft
        return {"padding": "max_length", "max_length": width, "truncation": True}

    @property
    def needs(self) -> tuple[str, ...]:
        """The feature extractor's attributes this rule reads."""
        own = {"max_length": ("n_fft", "n_samples"), "multiple": ("frame_length",)}
        return ("hop_length", "sampling_rate", *own.get(self.padding, ()))


def _qwen2_5_omni_tokens(frames: int, processor: Any) -> int:
    return ((frames - 1) // 2 + 1 - 2) // 2 + 1


def _qwen3_omni_tokens(frames: int, processor: Any) -> int:
    chunk = 2 * getattr(processor, "n_window", 50)
    left = (frames % chunk - 1) // 2 + 1
    return ((left - 1) // 2 + 1 - 1) // 2 + 1 + (frames // chunk) * 13


QWEN2_5_OMNI_AUDIO = AudioRule(
    name="qwen2_5_omni", padding="max_length", tokens=_qwen2_5_omni_tokens
)
QWEN3_OMNI_AUDIO = AudioRule(name="qwen3_omni", padding="longest", tokens=_qwen3_omni_tokens)


def _gemma3n_audio_tokens(frames: int, processor: Any) -> int:
    return processor.audio_seq_length


def _gemma3n_audio_expansion(processor: Any, tokens: int) -> str:
    return processor.full_audio_sequence


#: Gemma 3n: ``audio_seq_length`` (188) tokens a clip, its encoder's output padded to them by
#: the model, ``\n\n<start_of_audio>`` before and ``<end_of_audio>\n\n`` after (its
#: ``full_audio_sequence``); the extractor's defaults (a call padded to its longest clip in
#: steps of 128 samples, cut at 30 s)
GEMMA3N_AUDIO = AudioRule(
    name="gemma3n",
    padding="multiple",
    tokens=_gemma3n_audio_tokens,
    expansion=_gemma3n_audio_expansion,
    mask="input_features_mask",
    multiple=128,
    max_samples=480_000,
)


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
        videos: How the family's processor treats a video (its video processor's defaults and
            where its rules part from Qwen2-VL's: :mod:`energon_packing.media.video_styles`,
            ruled by :mod:`~energon_packing.media.video_rules`); None: a video is skipped
            ``unsupported_video``.
        expansion: Where the installed processor has no ``replace_image_token`` of its own
            (older transformers: :data:`~.hf_compat.PROCESSOR_MEDIA_SINCE`), the expansion of
            image ``index`` as that release's own ``__call__`` writes it, from the same
            ``replacement_inputs`` (None: the processor path refuses such a release).
        placeholder: The processor attribute naming the token such a release's ``__call__``
            replaces (Gemma 3: ``boi_token``; since, ``image_token`` is that token).
        video_takes_markup: On such a release, the processor's ``__call__`` replaces the
            template's ``vision_start video_token vision_end`` whole by a video's expansion
            (Qwen3-VL before 5.10; since, only the video token, keeping the pair around it).
        image_blocks: Whether an image's tokens attend to each other both ways (Gemma 3): a
            pack needs the model's mask mapping per conversation
            (:func:`energon_packing.hf.gemma3_mask_mapping`), not the padding-free path alone.
        block_layers: The layer types that read the image blocks (Gemma 3: all; Gemma 4: its
            sliding layers, its full layers stay causal).
        audio: How the family's processor takes audio clips (None: an audio clip is skipped
            ``unsupported_audio``).
        token_fields: Token-aligned model inputs besides the token types, each ``(name,
            processor method)`` the processor's own ``__call__`` adds them by (ERNIE-4.5-VL's
            ``moe_mm_token_type_ids``, ``create_moe_mm_token_type_ids``).
        vision_start: The token that opens an image's block (mRoPE families: Qwen's
            ``<|vision_start|>``, GLM's ``<|begin_of_image|>``).
        image_kwargs: What the processor's own ``__call__`` adds to its image processor's
            keyword arguments, given the processor (Pixtral's: ``patch_size`` times
            ``spatial_merge_size``).
        needs: Packages the family's processor class needs beyond transformers, which the
            family table names (Pixtral's: torchvision; without it the class does not build,
            and loading such a directory fails in one line naming it).
    """

    name: str
    classes: tuple[str, ...]
    replacement_inputs: Callable[[Any, list[list[tuple[int, int]]]], dict]
    mrope: bool = False
    token_types: str | None = None
    image_rows: Callable[[Any], dict[str, list[int]]] | None = None
    model_types: tuple[str, ...] = ()
    stateful_model_types: tuple[str, ...] = ()
    videos: VideoStyle | None = None
    expansion: Callable[[Any, dict, int], str] | None = None
    video_takes_markup: bool = False
    placeholder: str = "image_token"
    image_blocks: bool = False
    block_layers: tuple[str, ...] = ("full_attention", "sliding_attention")
    audio: AudioRule | None = None
    token_fields: tuple[tuple[str, str], ...] = ()
    vision_start: str = "<|vision_start|>"
    image_kwargs: Callable[[Any], dict] | None = None
    needs: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        assert self.model_types, f"{self.name}: a family names the model types it packs"
        assert self.videos is None or self.videos.name == self.name, (
            f"{self.name}: its video style is named {self.videos.name!r}"
        )


def _qwen(
    name: str,
    processor_class: str,
    *,
    model_types: tuple[str, ...] | None = None,
    stateful_model_types: tuple[str, ...] = (),
    videos: VideoStyle,
) -> Family:
    """Qwen2-VL's size rule, mRoPE, per-image rows and token types, shared by its successors."""
    return Family(
        name=name,
        classes=(processor_class,),
        model_types=model_types or (name,),
        stateful_model_types=stateful_model_types,
        videos=videos,
        replacement_inputs=_qwen_inputs,
        expansion=_qwen_expansion,
        video_takes_markup=name == "qwen3_vl",
        mrope=True,
        image_rows=_qwen_rows,
        token_types="mm_token_type_ids",
    )


FAMILIES: tuple[Family, ...] = (
    _qwen("qwen2_vl", "Qwen2VLProcessor", videos=video_styles.QWEN2_VL),
    _qwen("qwen2_5_vl", "Qwen2_5_VLProcessor", videos=video_styles.QWEN2_5_VL),
    # Qwen3.5 ships Qwen3-VL's processor (the same ids and positions), but 3 of 4 of its text
    # layers are Gated DeltaNet: a recurrent state (:mod:`.models`)
    _qwen(
        "qwen3_vl",
        "Qwen3VLProcessor",
        model_types=("qwen3_vl", "qwen3_vl_moe"),
        stateful_model_types=("qwen3_5", "qwen3_5_moe"),
        videos=video_styles.QWEN3_VL,
    ),
    Family(
        name="gemma3",
        expansion=_gemma3_expansion,
        placeholder="boi_token",
        classes=("Gemma3Processor",),
        model_types=("gemma3",),
        replacement_inputs=_gemma3_inputs,
        image_blocks=True,
        token_types="token_type_ids",  # Gemma3Processor renames mm_token_type_ids
    ),
    # Gemma 3n: a fixed image sequence (``\n\n<start_of_image>``, image_seq_length soft tokens,
    # ``<end_of_image>\n\n``); unlike Gemma 3 its text model is causal over an image too;
    # proven on the newest release only (no expansion rule of older ones)
    Family(
        name="gemma3n",
        classes=("Gemma3nProcessor",),
        model_types=("gemma3n",),
        replacement_inputs=_gemma3n_inputs,
        token_types="token_type_ids",  # Gemma3nProcessor renames mm_token_type_ids
        audio=GEMMA3N_AUDIO,
    ),
    Family(
        name="idefics3",
        expansion=_idefics3_expansion,
        classes=("Idefics3Processor",),
        model_types=("idefics3",),
        replacement_inputs=_idefics3_inputs,
    ),
    Family(
        name="smolvlm",
        expansion=_smolvlm_expansion,
        classes=("SmolVLMProcessor",),
        model_types=("smolvlm",),
        replacement_inputs=_idefics3_inputs,
    ),
    Family(
        name="llava",
        expansion=_llava_expansion,
        classes=("LlavaProcessor",),
        model_types=("llava",),
        replacement_inputs=_llava_inputs,
    ),
    Family(
        name="llava_next",
        expansion=_llava_next_expansion,
        classes=("LlavaNextProcessor",),
        model_types=("llava_next",),
        replacement_inputs=_llava_next_inputs,
    ),
    Family(
        name="internvl",
        expansion=_internvl_expansion,
        classes=("InternVLProcessor",),
        model_types=("internvl",),
        replacement_inputs=_tile_count_inputs,
    ),
    Family(
        name="aya_vision",
        expansion=_aya_vision_expansion,
        classes=("AyaVisionProcessor",),
        model_types=("aya_vision",),
        replacement_inputs=_tile_count_inputs,
    ),
    Family(
        name="llava_onevision",
        expansion=_llava_onevision_expansion,
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
    # Mistral 3 (Mistral Small 3.x, Ministral 3) and Pixtral-12B (a LLaVA model): each image's
    # patch rows, [IMG_BREAK] after each, [IMG_END] last; pixels padded to the widest image of
    # a call, which the Pixtral tower crops back by image_sizes
    Family(
        name="mistral3",
        classes=("PixtralProcessor",),
        model_types=("mistral3", "llava"),
        replacement_inputs=_pixtral_inputs,
        image_kwargs=_pixtral_kwargs,
        needs=("torchvision",),
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
    # the Omni thinkers: Qwen2-VL's image rule, time-aligned mRoPE (audio positions run on as
    # text's do; an image's as Qwen2-VL's; a video's temporal positions are its patches' times),
    # audio through the Whisper feature extractor, videos through Qwen2-VL's video processor
    # (a video's own audio track, use_audio_in_video, is not laid out)
    Family(
        name="qwen2_5_omni",
        classes=("Qwen2_5OmniProcessor",),
        model_types=("qwen2_5_omni", "qwen2_5_omni_thinker"),
        replacement_inputs=_qwen_inputs,
        videos=video_styles.QWEN2_5_OMNI,
        mrope=True,
        image_rows=_qwen_rows,
        audio=QWEN2_5_OMNI_AUDIO,
        vision_start="<|vision_bos|>",
    ),
    Family(
        name="qwen3_omni",
        classes=("Qwen3OmniMoeProcessor",),
        model_types=("qwen3_omni_moe", "qwen3_omni_moe_thinker"),
        replacement_inputs=_qwen_inputs,
        videos=video_styles.QWEN3_OMNI,
        mrope=True,
        image_rows=_qwen_rows,
        audio=QWEN3_OMNI_AUDIO,
    ),
)


def audio_families() -> list[str]:
    """The families whose processors take audio clips (``unsupported_audio`` names them)."""
    return [f.name for f in FAMILIES if f.audio is not None]


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
    "pixtral": (
        "the Pixtral vision encoder alone (PixtralVisionModel), no language model; Pixtral-12B's "
        "config.json names model type 'llava' (packed as mistral3 with its PixtralProcessor)"
    ),
    "kimi_k25": "its processor needs torchvision (transformers 5.24); not laid out",
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

    def needs(family: Family) -> str:
        return f" (needs {', '.join(family.needs)})" if family.needs else ""

    rows = [
        "| family | processor | model types packed exactly | only with `allow_stateful_layers` "
        "| positions | videos | audio | attention per conversation |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for f in FAMILIES:
        rows.append(
            f"| {f.name} | {code(f.classes)}{needs(f)} | {code(f.model_types)} | "
            f"{code(f.stateful_model_types)} | {'mRoPE (3 rows)' if f.mrope else '1-D'} | "
            f"{'yes' if f.videos else 'skipped (`unsupported_video`)'} | "
            f"{'yes' if f.audio else 'skipped (`unsupported_audio`)'} | "
            f"{_attention(f)} |"
        )
    return "\n".join(rows)


def refused_table() -> str:
    """The refused models of ``docs/models.md``, from :data:`REFUSED` (a test keeps them equal)."""
    rows = ["| model type | why it is refused |", "|---|---|"]
    rows += [f"| `{t}` | {why} |" for t, why in REFUSED.items()]
    return "\n".join(rows)
