"""The family registry: what this package knows of each model family beyond its processor's
public API, one :class:`Family` declaration each (its processor classes and model types, its
image rule (:mod:`.image_rules`), positions, masks, and media: a
:class:`~energon_packing.media.video_styles.VideoStyle` and an
:class:`~energon_packing.media.audio_rules.AudioRule`), the refused model types, and the
tables the docs print. Image rules let a conversation be costed from image headers, with no
pixel decoded; at pack time the image processor's real outputs must give the same replacements
(:class:`~energon_packing.encoding.processor.ProcessorChat`). No torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from energon_packing.encoding import hf_compat, image_rules, kimi_grid, llama4_tiles, prefix_lm
from energon_packing.encoding.models import ModelInfo
from energon_packing.media import video_styles
from energon_packing.media.audio_rules import (
    GEMMA3N_AUDIO,
    PHI4_AUDIO,
    QWEN2_5_OMNI_AUDIO,
    QWEN3_OMNI_AUDIO,
    AudioRule,
)
from energon_packing.media.video_styles import VideoStyle

__all__ = [
    "FAMILIES",
    "REFUSED",
    "Family",
    "audio_families",
    "check_model",
    "family_of",
    "family_of_model",
    "family_table",
    "refusal",
    "refused_table",
]


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
            processor method, older rule)``: the method the processor's own ``__call__`` adds
            them by (ERNIE-4.5-VL's ``moe_mm_token_type_ids``, ``create_moe_mm_token_type_ids``),
            and where the processor has none, what that release's ``__call__`` writes, given the
            processor and rows of ids (None: no older rule).
        vision_start: The token that opens an image's block (mRoPE families: Qwen's
            ``<|vision_start|>``, GLM's ``<|begin_of_image|>``).
        image_kwargs: What the processor's own ``__call__`` adds to its image processor's
            keyword arguments, given the processor (Pixtral's: ``patch_size`` times
            ``spatial_merge_size``).
        slot_token: The token the model fills with vision features, where the processor's
            image token only marks an image (Llama 4: ``<|patch|>``, its
            ``image_token_index``; ``<|image|>`` opens the global view); None: the
            processor's image token(s).
        pixels_in_model_dtype: The model's vision tower takes its pixels in the model's own
            dtype and casts nothing (Llama 4: float32 pixels fail in a bfloat16 model):
            ``to_hf`` casts them to it (a pack holds them in float32).
        needs: Packages the family's processor class needs beyond transformers, which the
            family table names (Pixtral's: torchvision; without it the class does not build,
            and loading such a directory fails in one line naming it).
        template: The family's layout as a chat template, where its processor ships none
            (PaliGemma's ``text`` + ``suffix``: :mod:`.prefix_lm`).
        prefix_lm: The user turn is a prefix the model reads both ways and the assistant turn
            a suffix (``token_type_ids`` 0 and 1), tokenized apart as the processor's
            ``text_pair`` (:mod:`.prefix_lm`).
        first_position: The position of a conversation's first token where the model counts
            positions itself (PaliGemma: 1); ``to_hf`` starts each conversation there.
        tiles: The tiles the vision tower runs over for each image, from the texts' image
            sizes, where its tokens do not tell them (anyres: LLaVA-NeXT, LLaVA-OneVision): the
            step-cost model's images (None: their grids or tokens tell).
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
    token_fields: tuple[tuple[str, str, Callable[[Any, list[list[int]]], list] | None], ...] = ()
    vision_start: str = "<|vision_start|>"
    image_kwargs: Callable[[Any], dict] | None = None
    needs: tuple[str, ...] = ()
    slot_token: str | None = None
    pixels_in_model_dtype: bool = False
    template: str | None = None
    prefix_lm: bool = False
    first_position: int = 0
    tiles: Callable[[Any, list[list[tuple[int, int]]]], list[int]] | None = None

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
        replacement_inputs=image_rules.qwen_inputs,
        expansion=image_rules.qwen_expansion,
        video_takes_markup=name == "qwen3_vl",
        mrope=True,
        image_rows=image_rules.qwen_rows,
        token_types="mm_token_type_ids",
    )


#: GLM-4.1V, GLM-4.5V (MoE) and GLM-4.6V: either processor class serves any of them (the
#: image layout is one; GLM-4.6V-Flash's config names glm4v), the class decides the video rules
_GLM_MODELS = ("glm4v", "glm4v_moe", "glm46v")

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
        expansion=image_rules.gemma3_expansion,
        placeholder="boi_token",
        classes=("Gemma3Processor",),
        model_types=("gemma3",),
        replacement_inputs=image_rules.gemma3_inputs,
        image_blocks=True,
        token_types="token_type_ids",  # Gemma3Processor renames mm_token_type_ids
    ),
    # Gemma 3n: a fixed image sequence (``\n\n<start_of_image>``, image_seq_length soft tokens,
    # ``<end_of_image>\n\n``); unlike Gemma 3 its text model is causal over an image too
    Family(
        name="gemma3n",
        expansion=image_rules.gemma3n_expansion,
        classes=("Gemma3nProcessor",),
        model_types=("gemma3n",),
        replacement_inputs=image_rules.gemma3n_inputs,
        token_types="token_type_ids",  # Gemma3nProcessor renames mm_token_type_ids
        audio=GEMMA3N_AUDIO,
    ),
    Family(
        name="idefics3",
        expansion=image_rules.idefics3_expansion,
        classes=("Idefics3Processor",),
        model_types=("idefics3",),
        replacement_inputs=image_rules.idefics3_inputs,
    ),
    Family(
        name="smolvlm",
        expansion=image_rules.smolvlm_expansion,
        classes=("SmolVLMProcessor",),
        model_types=("smolvlm",),
        replacement_inputs=image_rules.idefics3_inputs,
    ),
    Family(
        name="llava",
        expansion=image_rules.llava_expansion,
        classes=("LlavaProcessor",),
        model_types=("llava",),
        replacement_inputs=image_rules.llava_inputs,
    ),
    Family(
        name="llava_next",
        expansion=image_rules.llava_next_expansion,
        classes=("LlavaNextProcessor",),
        model_types=("llava_next",),
        replacement_inputs=image_rules.llava_next_inputs,
        tiles=image_rules.llava_next_tiles,
    ),
    # InternVL: an image's tiles, and a video's frames (each one tile), in the model's
    # pixel_values in the text's order
    Family(
        name="internvl",
        expansion=image_rules.internvl_expansion,
        classes=("InternVLProcessor",),
        model_types=("internvl",),
        replacement_inputs=image_rules.tile_count_inputs,
        videos=video_styles.INTERNVL,
    ),
    Family(
        name="aya_vision",
        expansion=image_rules.aya_vision_expansion,
        classes=("AyaVisionProcessor",),
        model_types=("aya_vision",),
        replacement_inputs=image_rules.tile_count_inputs,
    ),
    Family(
        name="llava_onevision",
        expansion=image_rules.llava_onevision_expansion,
        classes=("LlavaOnevisionProcessor",),
        model_types=("llava_onevision",),
        replacement_inputs=image_rules.llava_onevision_inputs,
        tiles=image_rules.llava_onevision_tiles,
    ),
    # Gemma 4: an image's soft tokens see each other on the sliding layers (the models whose
    # use_bidirectional_attention is "vision"), causal on the full ones
    Family(
        name="gemma4",
        expansion=image_rules.gemma4_expansion,
        classes=("Gemma4Processor",),
        model_types=("gemma4",),
        replacement_inputs=image_rules.gemma4_inputs,
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
        replacement_inputs=image_rules.qwen_inputs,
        mrope=True,
        image_rows=image_rules.qwen_rows,
        token_types="mm_token_type_ids",
        expansion=image_rules.qwen_expansion,
        token_fields=(
            (
                "moe_mm_token_type_ids",
                "create_moe_mm_token_type_ids",
                image_rules.ernie_moe_token_types,
            ),
        ),
        vision_start="<|IMAGE_START|>",
    ),
    # Ovis2: the model fills <IMG_ATOM>, which its processor writes in place of its <image>
    Family(
        name="ovis2",
        expansion=image_rules.ovis2_expansion,
        classes=("Ovis2Processor",),
        model_types=("ovis2",),
        replacement_inputs=image_rules.ovis2_inputs,
        slot_token="<IMG_ATOM>",
    ),
    # Mistral 3 (Mistral Small 3.x, Ministral 3) and Pixtral-12B (a LLaVA model): each image's
    # patch rows, [IMG_BREAK] after each, [IMG_END] last; pixels padded to the widest image of
    # a call, which the Pixtral tower crops back by image_sizes
    Family(
        name="mistral3",
        classes=("PixtralProcessor",),
        model_types=("mistral3", "llava"),
        replacement_inputs=image_rules.pixtral_inputs,
        image_kwargs=image_rules.pixtral_kwargs,
        needs=("torchvision",),
    ),
    # GLM-4.1V/4.5V and GLM-4.6V: Qwen2-VL's positions over the <|image|> runs (get_rope_index),
    # their own smart_resize; a video's temporal patches are images stamped with their time
    # (video_styles.GLM4V / GLM46V: each processor samples and stamps its own way)
    *(
        Family(
            name=name,
            expansion=image_rules.qwen_expansion,
            classes=classes,
            model_types=model_types,
            replacement_inputs=image_rules.glm4v_inputs,
            videos=videos,
            mrope=True,
            image_rows=image_rules.qwen_rows,
            token_types="mm_token_type_ids",
            vision_start="<|begin_of_image|>",
        )
        for name, classes, model_types, videos in (
            ("glm4v", ("Glm4vProcessor",), _GLM_MODELS, video_styles.GLM4V),
            ("glm46v", ("Glm46VProcessor",), _GLM_MODELS, video_styles.GLM46V),
        )
    ),
    # the Omni thinkers: Qwen2-VL's image rule, time-aligned mRoPE (audio positions run on as
    # text's do; an image's as Qwen2-VL's; a video's temporal positions are its patches' times),
    # audio through the Whisper feature extractor, videos through Qwen2-VL's video processor
    # (a video's own audio track, use_audio_in_video, is not laid out)
    Family(
        name="qwen2_5_omni",
        expansion=image_rules.qwen_expansion,
        classes=("Qwen2_5OmniProcessor",),
        model_types=("qwen2_5_omni", "qwen2_5_omni_thinker"),
        replacement_inputs=image_rules.qwen_inputs,
        videos=video_styles.QWEN2_5_OMNI,
        mrope=True,
        image_rows=image_rules.qwen_rows,
        audio=QWEN2_5_OMNI_AUDIO,
        vision_start="<|vision_bos|>",
    ),
    # Llama 4: each image's tiles (at most max_patches of 336 px, the canvas its image
    # processor picks by size) and a global view, <|patch|> runs between tile separators;
    # 1-D positions; its attention temperature (and, before transformers 5.23, its chunked
    # attention) follow the row's index, so a pack is exact up to floor_scale - 1 (and one
    # chunk) wide (models.check_rope)
    Family(
        name="llama4",
        classes=("Llama4Processor",),
        model_types=("llama4",),
        replacement_inputs=llama4_tiles.llama4_inputs,
        expansion=llama4_tiles.llama4_expansion,
        image_kwargs=llama4_tiles.llama4_kwargs,
        needs=("torchvision",),
        slot_token="<|patch|>",
        pixels_in_model_dtype=True,
    ),
    # Phi-4-multimodal: the image's HD crops of 448 px (at most dynamic_hd) and a global
    # view, a token count fixed by its size; crops padded across a call (their masks with
    # ones: schema.MEDIA_FILL); 1-D positions, its longrope bound on the pack's width
    # (models.check_rope)
    Family(
        name="phi4_multimodal",
        classes=("Phi4MultimodalProcessor",),
        model_types=("phi4_multimodal",),
        replacement_inputs=image_rules.phi4_inputs,
        expansion=image_rules.phi4_expansion,
        needs=("torchvision",),
        audio=PHI4_AUDIO,
    ),
    # Kimi-K2.5 (and K2.6): each image's patches at most max_patches (scaled down, never up,
    # padded to whole merges; kimi_grid), one <|media_pad|> a merge; 1-D positions over its
    # DeepSeek-V3 text model; its vision tower attends within each image. Only since 5.13
    # (a replace_image_token of its own, so no older expansion)
    Family(
        name="kimi_k25",
        classes=("Kimi_K25Processor",),
        model_types=("kimi_k25",),
        replacement_inputs=kimi_grid.kimi_inputs,
        image_rows=image_rules.qwen_rows,
        needs=("torchvision",),
    ),
    # PaliGemma and PaliGemma 2: image_seq_length tokens an image, all images first; the
    # prompt a bidirectional prefix, the answer a causal suffix (prefix_lm); no chat template
    Family(
        name="paligemma",
        classes=("PaliGemmaProcessor",),
        model_types=("paligemma",),
        replacement_inputs=image_rules.gemma3n_inputs,
        expansion=image_rules.paligemma_expansion,
        template=prefix_lm.PALIGEMMA_TEMPLATE,
        prefix_lm=True,
        first_position=1,
    ),
    Family(
        name="qwen3_omni",
        expansion=image_rules.qwen_expansion,
        classes=("Qwen3OmniMoeProcessor",),
        model_types=("qwen3_omni_moe", "qwen3_omni_moe_thinker"),
        replacement_inputs=image_rules.qwen_inputs,
        videos=video_styles.QWEN3_OMNI,
        mrope=True,
        image_rows=image_rules.qwen_rows,
        audio=QWEN3_OMNI_AUDIO,
    ),
)


def audio_families() -> list[str]:
    """The families whose processors take audio clips (``unsupported_audio`` names them)."""
    return [f.name for f in FAMILIES if f.audio is not None]


#: Image-text models that energon_packing refuses, measured or read on transformers 5.24, and why
#: (the error names the model type and this reason).
REFUSED: dict[str, str] = {
    "pixtral": (
        "the Pixtral vision encoder alone (PixtralVisionModel), no language model; Pixtral-12B's "
        "config.json names model type 'llava' (packed as mistral3 with its PixtralProcessor)"
    ),
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
    if family.prefix_lm:
        return "the prompt (and its images) bidirectional, the answer causal"
    if not family.image_blocks:
        return "causal"
    if set(family.block_layers) == {"full_attention", "sliding_attention"}:
        return "causal, an image bidirectional"
    return f"causal, an image bidirectional on {', '.join(family.block_layers)} layers"


def _positions(family: Family) -> str:
    if family.mrope:
        return "mRoPE (3 rows)"
    return f"1-D (from {family.first_position})" if family.first_position else "1-D"


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
            f"{code(f.stateful_model_types)} | {_positions(f)} | "
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
