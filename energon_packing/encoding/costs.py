"""A model's sizes, read for the step-cost model that balanced emission targets.

:class:`~energon_packing.packing.balance.StepCostModel` prices a pack as the decoder's linear
layers, its causal attention and the vision encoder over the pack's image and video grids.
This module reads those sizes from a model's ``config.json`` (or a ``transformers`` config,
or the dict of one)::

    step_cost_model("/models/Qwen2.5-VL-7B-Instruct")   # decoder 28 x 3584, vision 32 x 1280
    cost_model_for(processor, model_type=None)          # what the task encoder uses

The packing core stays pure: it receives the sizes, never a config. Vision towers are read
for the families whose packs carry ``image_grid_thw`` / ``video_grid_thw`` (Qwen2-VL,
Qwen2.5-VL with its windowed layers, Qwen3-VL with its deepstack mergers), Kimi-K2.5's
MoonViT, Llama 4's and InternVL's tiles (an image's grids then as its tokens imply them,
InternVL's videos' frames a tile each), Idefics3's, SmolVLM's and Aya Vision's tiles, the
fixed squares of Gemma 3, PaliGemma and LLaVA (CLIP or SigLIP), LLaVA-NeXT's and
LLaVA-OneVision's anyres tiles (``Family.tiles``), Ovis2's tiles through its visual
tokenizer, and Mistral 3's and Pixtral-12B's images at their own sizes (Pixtral); another
family's encoder is
left unpriced (logged). Imports ``transformers`` only to build a config from a
model type.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from energon_packing.encoding.models import find_model_config, read_config_json, text_config
from energon_packing.packing.audio_tower import AudioTower
from energon_packing.packing.balance import Grid, StepCostModel, VisionTower

__all__ = [
    "DEFAULT_TOWER",
    "TILES_FROM_TOKENS",
    "audio_tower",
    "cost_model_for",
    "default_cost_model",
    "grids_from_tokens",
    "step_cost_model",
    "vision_tower",
]

logger = logging.getLogger(__name__)

#: Qwen2-VL-7B's vision encoder: what the built-in layout's images (Qwen2-VL's pipeline) feed
#: when no model is named.
DEFAULT_TOWER = {"depth": 32, "hidden_size": 1280, "intermediate_size": 5120}


def _as_dict(config: Any) -> dict:
    """A ``transformers`` config (``to_dict``), a mapping, or a path's ``config.json``."""
    if isinstance(config, Mapping):
        return dict(config)
    if isinstance(config, (str, Path)):
        file = Path(config)
        file = file / "config.json" if file.is_dir() else file
        raw = read_config_json(file)
        if not isinstance(raw, dict):
            raise ValueError(f"{file}: a model config is a JSON object, not {type(raw).__name__}")
        return raw
    to_dict = getattr(config, "to_dict", None)
    if callable(to_dict):
        return to_dict()
    raise TypeError(
        f"a model config is a transformers config, a dict or a path, not {type(config).__name__}"
    )


def _thinker(config: dict) -> dict:
    """The Omni models' (Qwen2.5-Omni, Qwen3-Omni) ``thinker_config``, which holds their text,
    vision and audio configs (the talker speaks; it is not what a pack trains), under the
    top-level model type; any other config as it is."""
    thinker = config.get("thinker_config")
    if not isinstance(thinker, Mapping):
        return config
    return {**thinker, "model_type": config.get("model_type") or thinker.get("model_type")}


def _int(value: Any) -> int | None:
    if isinstance(value, (list, tuple)) and value:  # patch_size as [h, w]
        value = value[0]
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def vision_tower(config: Any, *, model_type: str = "") -> VisionTower | None:
    """The vision encoder of a model config (its ``vision_config``), or None where it has none
    or is not priced (logged): Qwen-VL's fields (the Qwen-VL families, GLM-4V, ERNIE-4.5-VL),
    or a family's own rule (Kimi-K2.5, Llama 4, InternVL, Idefics3, SmolVLM, Aya Vision,
    Gemma 3, PaliGemma, LLaVA, LLaVA-NeXT, LLaVA-OneVision, Mistral 3, Ovis2)."""
    raw = _thinker(_as_dict(config))
    vision = raw.get("vision_config")
    if not isinstance(vision, Mapping):
        return None
    kind = str(model_type or raw.get("model_type") or vision.get("model_type") or "")
    own = _OWN_TOWERS.get(kind)
    if own is not None:  # a family whose tower reads other fields
        out = _int(text_config(raw, holding="hidden_size").get("hidden_size"))
        return own(vision, out=out, top=raw)
    merge = _int(vision.get("spatial_merge_size"))
    depth = _int(vision.get("depth"))
    if not merge or not depth:
        logger.info(
            "model type %r: its vision encoder is not priced (priced: towers of Qwen-VL's "
            "fields and by their own rules: Kimi-K2.5, Llama 4, InternVL, Idefics3, SmolVLM, "
            "Aya Vision, Gemma 3, PaliGemma, LLaVA, LLaVA-NeXT, LLaVA-OneVision, Mistral 3, "
            "Ovis2); balancing counts the decoder alone",
            kind,
        )
        return None
    # Qwen2-VL: width embed_dim, hidden_size is the merger's output; later: hidden_size
    width = _int(vision.get("embed_dim")) or _int(vision.get("hidden_size"))
    out = _int(vision.get("out_hidden_size"))
    if out is None:
        out = _int(vision.get("hidden_size")) if vision.get("embed_dim") else None
    out = out or _int(text_config(raw, holding="hidden_size").get("hidden_size")) or width
    mlp = _int(vision.get("intermediate_size"))
    if mlp is None and width:
        mlp = int(width * float(vision.get("mlp_ratio", 4)))
    if not width or not mlp:
        raise ValueError(
            f"model type {kind!r}: vision_config gives depth {depth} and merge size {merge} but "
            f"no width (embed_dim or hidden_size) or MLP width (intermediate_size or mlp_ratio)"
        )
    patch = _int(vision.get("patch_size")) or _int(vision.get("spatial_patch_size")) or 14
    window = 0
    full: tuple[int, ...] = ()
    if _int(vision.get("window_size")) and vision.get("fullatt_block_indexes") is not None:
        window = int(vision["window_size"]) // merge // patch  # pixels -> merged tokens
        full = tuple(int(i) for i in vision["fullatt_block_indexes"])
    return VisionTower(
        depth=depth,
        hidden_size=width,
        intermediate_size=mlp,
        gated_mlp="qwen2_5" in kind,  # Qwen2.5-VL: gate/up/down; Qwen2-VL, Qwen3-VL: fc1/fc2
        out_hidden_size=out,
        patch_size=patch,
        temporal_patch_size=_int(vision.get("temporal_patch_size")) or 2,
        spatial_merge_size=merge,
        in_channels=_int(vision.get("in_channels")) or _int(vision.get("in_chans")) or 3,
        window_size=window,
        full_attention_layers=full,
        mergers=1 + len(vision.get("deepstack_visual_indexes") or ()),
    )


def _kimi_tower(vision: Mapping, *, out: int | None, top: Mapping) -> VisionTower:
    """Kimi-K2.5's MoonViT: Qwen2-VL's shape (a patch a token, attention within each image,
    a 2 x 2 merger into the decoder's width), its fields named otherwise; an image's patch
    embedding reads one frame."""
    width = int(vision.get("hidden_size", 1152))
    return VisionTower(
        depth=int(vision.get("num_hidden_layers", 27)),
        hidden_size=width,
        intermediate_size=int(vision.get("intermediate_size", 4304)),
        out_hidden_size=out or width,
        patch_size=_int(vision.get("patch_size")) or 14,
        temporal_patch_size=1,
        spatial_merge_size=_int(vision.get("merge_kernel_size")) or 2,
    )


def _llama4_tower(vision: Mapping, *, out: int | None, top: Mapping) -> VisionTower:
    """Llama 4's vision encoder, over each tile alone (a class token beside its patches),
    pixel-shuffled by ``pixel_shuffle_ratio`` (0.5: 2 x 2 patches a token), then its MLP
    (``intermediate_size`` to ``projector_input_dim``, ``projector_output_dim`` square) and the
    projector into the decoder's width (``vision_output_dim`` in)."""
    width = int(vision.get("hidden_size", 1408))
    mlp = int(vision.get("intermediate_size", 5632))
    ratio = float(vision.get("pixel_shuffle_ratio", 0.5))
    projected = int(vision.get("projector_output_dim", 4096))
    return VisionTower(
        depth=int(vision.get("num_hidden_layers", 34)),
        hidden_size=width,
        intermediate_size=mlp,
        out_hidden_size=out or projected,
        patch_size=_int(vision.get("patch_size")) or 14,
        temporal_patch_size=1,
        spatial_merge_size=round(1 / ratio),
        class_tokens=1,
        head=(
            (mlp, int(vision.get("projector_input_dim", 4096))),
            (projected, projected),
            (int(vision.get("vision_output_dim", 4096)), out or projected),
        ),
    )


def _internvl_tower(vision: Mapping, *, out: int | None, top: Mapping) -> VisionTower:
    """InternVL's InternViT, over each tile alone (a class token beside its ``image_size /
    patch_size`` squared patches, the last layer's class token dropped after), pixel-shuffled
    by the model's ``downsample_ratio`` (0.5: 2 x 2 patches a token), then the projector
    (``hidden_size * 4`` to the decoder's width, then square)."""
    merge = round(1 / float(top.get("downsample_ratio", 0.5)))
    return _tiles(
        vision,
        merge=merge,
        head=lambda d: ((d * merge * merge, out or d), (out or d, out or d)),
        out=out,
        class_tokens=1,
        sizes=_INTERNVIT,
    )


def _fixed_tile(
    vision: Mapping,
    *,
    merge: int,
    head: Callable[[int], tuple[tuple[int, int], ...]],
    out: int | None,
) -> VisionTower | None:
    """A CLIP or SigLIP encoder over one fixed ``image_size`` square (a class token beside
    the patches for CLIP), ``merge x merge`` patches a token, then ``head(width)``'s layers;
    None (logged) for another encoder, a SigLIP whose pooling head runs beside it
    (``vision_use_head``: published Gemma 3 and PaliGemma checkpoints turn it off), or a
    ``merge`` below 1. A size the config leaves out is its config class's default."""
    kind = str(vision.get("model_type") or "")
    clip = kind.startswith("clip")
    if not (clip or kind.startswith("siglip")) or (
        not clip and vision.get("vision_use_head", True) is not False
    ):
        logger.info(
            "vision encoder %r (vision_use_head %s) is not priced (priced: CLIP, SigLIP "
            "without its pooling head); balancing counts the decoder alone",
            kind,
            vision.get("vision_use_head"),
        )
        return None
    if merge < 1:
        logger.info("vision encoder %r: %d patches a token side; not priced", kind, merge)
        return None
    sizes = _CLIP if clip else _SIGLIP
    return _tiles(vision, merge=merge, head=head, out=out, class_tokens=int(clip), sizes=sizes)


#: a fixed-tile encoder config class's sizes, for what a config leaves out: (width, layers,
#: MLP width, image side, patch side) of CLIP's, SigLIP's, InternViT's, Idefics3's (and
#: SmolVLM's), Ovis2's and Pixtral's vision config classes
_CLIP = (768, 12, 3072, 224, 32)
_SIGLIP = (768, 12, 3072, 224, 16)
_INTERNVIT = (1024, 24, 4096, 448, 14)
_IDEFICS3_VISION = (1152, 12, 3072, 224, 32)
_OVIS2_VISION = (1024, 24, 2816, 224, 14)
_PIXTRAL = (1024, 24, 4096, 1024, 16)


def _tiles(
    vision: Mapping,
    *,
    merge: int,
    head: Callable[[int], tuple[tuple[int, int], ...]],
    out: int | None,
    sizes: tuple[int, int, int, int, int],
    class_tokens: int = 0,
    gated_mlp: bool = False,
    tiled: bool = True,
) -> VisionTower:
    """An encoder over each fixed ``image_size`` tile alone (``class_tokens`` beside its
    patches; ``tiled=False``: over each image at its own size), ``merge x merge`` patches a
    token, then ``head(width)``'s layers; a size the config leaves out is ``sizes``' (its
    config class's default); ``gated_mlp``: a gate beside the MLP's up projection (SwiGLU)."""
    width, depth, mlp, image, patch = sizes
    width = _int(vision.get("hidden_size")) or width
    patch = _int(vision.get("patch_size")) or patch
    layers = head(width)
    return VisionTower(
        depth=_int(vision.get("num_hidden_layers")) or depth,
        hidden_size=width,
        intermediate_size=_int(vision.get("intermediate_size")) or mlp,
        gated_mlp=gated_mlp,
        out_hidden_size=out or layers[-1][1],
        patch_size=patch,
        temporal_patch_size=1,
        spatial_merge_size=merge,
        class_tokens=class_tokens,
        head=layers,
        tile_size=(_int(vision.get("image_size")) or image) // patch if tiled else 0,
    )


def _fixed_patch(vision: Mapping) -> int:
    """A CLIP's or SigLIP's patch side (its config class's default where left out)."""
    clip = str(vision.get("model_type") or "").startswith("clip")
    return _int(vision.get("patch_size")) or (_CLIP if clip else _SIGLIP)[4]


def _gemma3_tower(vision: Mapping, *, out: int | None, top: Mapping) -> VisionTower | None:
    """Gemma 3's SigLIP over its square, average-pooled to ``mm_tokens_per_image`` (896 px
    of 14: 4 x 4 patches a token), then projected into the decoder's width."""
    side = (_int(vision.get("image_size")) or 224) // _fixed_patch(vision)
    merge = side // math.isqrt(int(top.get("mm_tokens_per_image", 256)))
    return _fixed_tile(vision, merge=merge, head=lambda d: ((d, out or d),), out=out)


def _paligemma_tower(vision: Mapping, *, out: int | None, top: Mapping) -> VisionTower | None:
    """PaliGemma's SigLIP, a patch a token, then one linear layer to ``projection_dim`` (the
    model's, at the top level: its config writes it over the vision config's)."""
    projected = _int(top.get("projection_dim")) or _int(vision.get("projection_dim"))
    return _fixed_tile(
        vision, merge=1, head=lambda d: ((d, projected or out or d),), out=projected or out
    )


def _pixtral(
    vision: Mapping, *, merge: int, head: Callable[[int], tuple[tuple[int, int], ...]], out
) -> VisionTower:
    """A Pixtral encoder: each image at its own size (no tile), a patch a token (no class
    token), full attention within the image, a gated MLP; ``merge x merge`` patches a token
    after it, then ``head(width)``'s layers."""
    return _tiles(
        vision, merge=merge, head=head, out=out, sizes=_PIXTRAL, gated_mlp=True, tiled=False
    )


def _feature_layers(top: Mapping, default: int) -> int:
    """How many encoder layers the projector reads, concatenated (``vision_feature_layer``)."""
    layers = top.get("vision_feature_layer", default)
    return len(layers) if isinstance(layers, (list, tuple)) else 1


def _mistral3_tower(vision: Mapping, *, out: int | None, top: Mapping) -> VisionTower | None:
    """Mistral 3's Pixtral encoder, its patch merger (``spatial_merge_size`` squared patches
    into one, a linear layer back to the encoder's width), then the two-layer projector."""
    if str(vision.get("model_type") or "") != "pixtral":
        logger.info("Mistral 3 with vision encoder %r is not priced", vision.get("model_type"))
        return None
    merge = _int(top.get("spatial_merge_size")) or 2
    count = _feature_layers(top, -1)
    return _pixtral(
        vision,
        merge=merge,
        head=lambda d: ((d * merge * merge, d), (d * count, out or d), (out or d, out or d)),
        out=out,
    )


def _llava_tower(vision: Mapping, *, out: int | None, top: Mapping) -> VisionTower | None:
    """LLaVA's CLIP (or SigLIP), a patch a token (the class token dropped, ``default``), its
    selected layers concatenated into the two-layer projector; Pixtral-12B's Pixtral encoder
    (each image at its own size) likewise; LLaVA-NeXT's and LLaVA-OneVision's over each of an
    image's anyres tiles (``Family.tiles``: its tokens, unpadded, do not tell them)."""
    count = _feature_layers(top, -2)
    if str(vision.get("model_type") or "") == "pixtral":
        return _pixtral(
            vision, merge=1, head=lambda d: ((d * count, out or d), (out or d, out or d)), out=out
        )
    if top.get("vision_feature_select_strategy") == "full" and str(
        vision.get("model_type", "")
    ).startswith("clip"):
        logger.info("LLaVA keeping CLIP's class token ('full') is not priced")
        return None
    return _fixed_tile(
        vision,
        merge=1,
        head=lambda d: ((d * count, out or d), (out or d, out or d)),
        out=out,
    )


def _aya_vision_tower(vision: Mapping, *, out: int | None, top: Mapping) -> VisionTower | None:
    """Aya Vision's SigLIP over each tile, pixel-shuffled by ``downsample_factor``, then its
    SwiGLU projector (``alignment_intermediate_size``, halved by the gate, into the decoder's
    width)."""
    merge = int(top.get("downsample_factor", 2))
    inner = _int(top.get("alignment_intermediate_size")) or out

    def head(d: int) -> tuple[tuple[int, int], ...]:
        middle = inner or d * merge * merge
        return ((d * merge * merge, middle), (middle // 2, out or d))

    return _fixed_tile(vision, merge=merge, head=head, out=out)


def _idefics3_tower(vision: Mapping, *, out: int | None, top: Mapping) -> VisionTower:
    """Idefics3's and SmolVLM's SigLIP over each tile (``image_size`` square, no class
    token, no pooling head), pixel-shuffled by ``scale_factor``, then one linear layer."""
    merge = int(top.get("scale_factor", 2))
    return _tiles(
        vision,
        merge=merge,
        head=lambda d: ((d * merge * merge, out or d),),
        out=out,
        sizes=_IDEFICS3_VISION,
    )


def _ovis2_tower(vision: Mapping, *, out: int | None, top: Mapping) -> VisionTower:
    """Ovis2's visual tokenizer over each tile: its ViT (no class token, a gated MLP), the
    ``hidden_stride`` squared patches of a token concatenated into the head's logits over the
    visual vocabulary (``vocab_size`` less its indicator tokens), whose softmax times the
    visual embedding table (``vocab_size`` rows of the decoder's width) is the token."""
    stride = _int(vision.get("hidden_stride")) or 1
    vocab = _int(vision.get("vocab_size")) or 16384
    words = vocab - (_int(vision.get("num_visual_indicator_tokens")) or 5)
    return _tiles(
        vision,
        merge=stride,
        head=lambda d: ((d * stride * stride, words), (vocab, out or d)),
        out=out,
        sizes=_OVIS2_VISION,
        gated_mlp=True,
    )


#: Towers read by their own rule, by model type (the others: Qwen-VL's fields above).
_OWN_TOWERS = {
    "kimi_k25": _kimi_tower,
    "llama4": _llama4_tower,
    "internvl": _internvl_tower,
    "gemma3": _gemma3_tower,
    "paligemma": _paligemma_tower,
    "llava": _llava_tower,
    "idefics3": _idefics3_tower,
    "aya_vision": _aya_vision_tower,
    "smolvlm": _idefics3_tower,
    "mistral3": _mistral3_tower,
    "llava_next": _llava_tower,
    "llava_onevision": _llava_tower,
    "ovis2": _ovis2_tower,
}
#: Families whose packs carry no grids, their priced tower's images (Llama 4's tiles,
#: InternVL's tiles and frames, Idefics3's, SmolVLM's and Aya Vision's tiles, Gemma 3's,
#: PaliGemma's and LLaVA's squares, Ovis2's tiles, Mistral 3's images row by row) read from their
#: image tokens at emission as at selection: a run a tile, or a run cut into tiles of
#: ``VisionTower.tile_tokens``, or runs joined by a row break an image.
TILES_FROM_TOKENS = frozenset(
    {
        "llama4",
        "internvl",
        "gemma3",
        "paligemma",
        "llava",
        "idefics3",
        "smolvlm",
        "aya_vision",
        "mistral3",
        "ovis2",
    }
)

#: the audio encoders priced (their forward: :class:`AudioTower`), by ``audio_config``'s type
_AUDIO_ENCODERS = ("qwen2_5_omni_audio_encoder", "qwen3_omni_moe_audio_encoder")


def audio_tower(config: Any) -> AudioTower | None:
    """The audio encoder of a model config (an Omni thinker's ``audio_config``), or None where
    it has none or one this package does not price (logged)."""
    raw = _thinker(_as_dict(config))
    audio = raw.get("audio_config")
    if not isinstance(audio, Mapping):
        return None
    kind = str(audio.get("model_type") or "")
    if kind not in _AUDIO_ENCODERS:
        logger.info("audio encoder %r is not priced; balancing leaves its clips out", kind)
        return None
    window = _int(audio.get("n_window")) or 50
    down = _int(audio.get("downsample_hidden_size")) or 0
    infer = _int(audio.get("n_window_infer"))
    return AudioTower(
        depth=int(audio["encoder_layers"]),
        hidden_size=int(audio["d_model"]),
        intermediate_size=int(audio["encoder_ffn_dim"]),
        out_hidden_size=int(audio["output_dim"]),
        mel_bins=_int(audio.get("num_mel_bins")) or 128,
        chunk_frames=2 * window,
        downsample_hidden_size=down,
        window_chunks=max(1, infer // (2 * window)) if down and infer else 1,
    )


def step_cost_model(config: Any, *, source: str = "") -> StepCostModel:
    """The step-cost model of a model: its decoder and vision encoder, from its config.

    Args:
        config: A ``transformers`` config, the dict of a ``config.json``, or the path of one
            (or of the directory holding it).
        source: Where it came from, for messages (default: the path, or the model type).

    Raises:
        ValueError: the config names no decoder size (``hidden_size``, ``num_hidden_layers``).
    """
    raw = _thinker(_as_dict(config))
    kind = str(raw.get("model_type") or "")
    if not source:
        source = str(config) if isinstance(config, (str, Path)) else f"model_type={kind!r}"
    text = text_config(raw, holding="hidden_size")
    hidden, layers = _int(text.get("hidden_size")), _int(text.get("num_hidden_layers"))
    if not hidden or not layers:
        raise ValueError(
            f"{source}: no decoder size (hidden_size {hidden}, num_hidden_layers {layers}, at the "
            f"top level or in text_config); pass the model's own config.json"
        )
    heads = _int(text.get("num_attention_heads"))
    head_dim = _int(text.get("head_dim")) or (hidden // heads if heads else None)
    kv_heads = _int(text.get("num_key_value_heads")) or heads
    mlp = _int(text.get("intermediate_size"))
    experts = _int(text.get("num_experts_per_tok"))
    if experts and _int(text.get("moe_intermediate_size")):  # the experts a token runs through
        mlp = experts * int(text["moe_intermediate_size"])
        mlp += _int(text.get("shared_expert_intermediate_size")) or 0
    return StepCostModel(
        hidden_size=hidden,
        num_layers=layers,
        intermediate_size=mlp,
        attention_size=heads * head_dim if heads and head_dim else None,
        kv_size=kv_heads * head_dim if kv_heads and head_dim else None,
        vocab_size=_int(text.get("vocab_size")) or _int(raw.get("vocab_size")) or 0,
        vision=vision_tower(raw, model_type=kind),
        audio=audio_tower(raw),
        source=source,
    )


def default_cost_model(*, patch_size: int = 14, merge_size: int = 2) -> StepCostModel:
    """For a model nobody named: a 7B decoder (h=4096, 32 layers) and Qwen2-VL-7B's vision
    encoder at the layout's patch and merge sizes (the built-in layout is Qwen2-VL's)."""
    return StepCostModel(
        vision=VisionTower(
            **DEFAULT_TOWER,
            out_hidden_size=4096,
            patch_size=patch_size,
            spatial_merge_size=merge_size,
        )
    )


def _defaults_of(model_type: str) -> StepCostModel:
    """``transformers``' default sizes of ``model_type``."""
    from transformers import AutoConfig

    config = AutoConfig.for_model(model_type)
    return step_cost_model(
        config, source=f"model_type={model_type!r} (transformers' default sizes)"
    )


def cost_model_for(
    source: Any, *, model_type: str | None = None, patch_size: int = 14, merge_size: int = 2
) -> StepCostModel:
    """What balanced emission prices packs with: the model ``source`` (a processor, a
    tokenizer, or a local path) was saved with, else the default sizes of ``model_type`` (or
    of the model type a processor's ``model_info`` names; ``transformers``' defaults), else
    :func:`default_cost_model` (logged: nothing named the model).

    A ``config.json`` that is there but unreadable raises; a config that names no decoder size
    falls through to the next rule."""
    found = find_model_config(source) if source is not None else None
    if found is not None:
        try:
            model = step_cost_model(found)
        except ValueError as e:
            logger.info("%s; trying the next rule", e)
        else:
            logger.info("balanced emission prices packs for %s", model.describe())
            return model
    if model_type:
        model = _defaults_of(model_type)
        logger.info("balanced emission prices packs for %s", model.describe())
        return model
    named = getattr(getattr(source, "model_info", None), "model_type", None)
    if named:  # the model type a processor was given (model_info), its config not at hand
        try:
            model = _defaults_of(named)
        except (ValueError, KeyError) as e:
            logger.info("model type %r: %s; trying the next rule", named, e)
        else:
            logger.info("balanced emission prices packs for %s", model.describe())
            return model
    model = default_cost_model(patch_size=patch_size, merge_size=merge_size)
    logger.info(
        "no model config found beside the tokenizer or processor and no model_type: balanced "
        "emission prices packs for %s",
        model.describe(),
    )
    return model


def grids_from_tokens(
    input_ids: Sequence[int] | Any,
    *,
    token_id: int,
    merge_size: int,
    tile_tokens: int = 0,
    row_break: int | None = None,
) -> list[Grid]:
    """Each image's grid as its tokens imply it: one run of ``token_id`` of ``n`` tokens is
    ``n * merge_size**2`` patches in one slice (exact for the patch count, hence for linear
    layers and full attention); its shape, which only windowed attention reads, is taken as
    the most nearly square ``a x b = n`` merged tokens. ``tile_tokens``: a run is that many
    tokens a tile, each tile a grid of its own (InternVL: tiles are encoded apart).
    ``row_break``: runs that only this token parts are the rows of one image (Pixtral's
    ``[IMG_BREAK]``), whose grid is then exact: rows x the run's length (a tower of fixed
    tiles, ``tile_tokens``, cuts runs into its tiles instead: a cost model of another family,
    assigned by hand, prices what it knows and never fails a pack)."""
    import numpy as np

    ids = np.asarray(input_ids)
    hits = np.flatnonzero(ids == token_id)
    if not len(hits):
        return []
    breaks = np.flatnonzero(np.diff(hits) != 1)
    starts = np.concatenate(([0], breaks + 1))
    ends = np.concatenate((breaks + 1, [len(hits)]))
    runs = (ends - starts).tolist()
    if row_break is not None and not tile_tokens:
        first, last = hits[starts], hits[ends - 1]  # each run's first and last token
        joined = (first[1:] == last[:-1] + 2) & (ids[last[:-1] + 1] == row_break)
        images, rows = [], 1
        for n, same in zip(runs, [*joined.tolist(), False]):
            if same:
                rows += 1
                continue
            images.append((1, rows * merge_size, n * merge_size))
            rows = 1
        return images
    if tile_tokens:
        runs = [tile_tokens for n in runs for _ in range(n // tile_tokens)] + [
            n % tile_tokens for n in runs if n % tile_tokens
        ]
    grids = []
    for n in runs:
        a = next(d for d in range(math.isqrt(n), 0, -1) if n % d == 0)
        grids.append((1, a * merge_size, n // a * merge_size))
    return grids
