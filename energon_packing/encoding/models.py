"""What a model is: its type, read from its config, and whether its layers keep packed
conversations apart.

A pack is exact when every layer sees each conversation alone. Attention layers do, given
positions that restart per conversation (the padding-free path); a layer that carries state along
the sequence does not: a linear-attention / Gated DeltaNet or Mamba state, or a short causal
convolution, reads the previous conversation's last tokens::

    pack          A A A A B B B B B
    attention     A sees A, B sees B          (positions restart: exact)
    conv / SSM    B's state starts from A's   (the first B tokens are off, then all of B)

So a model is accepted only when every layer type of its text model is one that keeps
conversations apart (:data:`SEPARATE_LAYER_TYPES`); anything else is refused, naming the layer
type, unless ``allow_stateful_layers=True`` (the kernels must then be told the boundaries:
:func:`energon_packing.hf.to_hf` passes them; nothing on a CPU path does). Imports
``transformers`` only in the functions that read a config.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from energon_packing.encoding import hf_compat

__all__ = [
    "SEPARATE_LAYER_TYPES",
    "ModelInfo",
    "StatefulLayersError",
    "check_layers",
    "check_rope",
    "find_model_config",
    "info_of",
    "model_info",
    "model_info_for_type",
    "read_config_json",
    "read_model_info",
    "text_config",
]

logger = logging.getLogger(__name__)

#: Layer types that see each packed conversation alone when positions restart per conversation
#: (transformers' names; ``attention``/``mlp``/``moe``/``dense``/``sparse`` as hybrid configs
#: spell their non-recurrent blocks).
SEPARATE_LAYER_TYPES = frozenset(
    {
        "full_attention",
        "sliding_attention",
        # Llama 4's: attention within chunks (before transformers 5.23 of the row's index,
        # so check_rope bounds the width to one chunk there)
        "chunked_attention",
        "attention",
        "mlp",
        "moe",
        "dense",
        "sparse",
    }
)
#: What the stateful layer types are, for the refusal (anything else not separate is named as is).
STATEFUL_NAMES = {
    "linear_attention": "linear attention (Gated DeltaNet / Mamba / lightning: a recurrent state)",
    "mamba": "Mamba (a state-space recurrence)",
    "mamba2": "Mamba-2 (a state-space recurrence)",
    "conv": "short causal convolutions",
    "hybrid": "attention + state-space hybrid blocks",
    "hybrid_sliding": "sliding attention + state-space hybrid blocks",
    "recurrent": "recurrent (RG-LRU) blocks",
}
#: Model types whose configs list no layer types because every layer is recurrent.
ALL_RECURRENT = {
    "mamba": "mamba",
    "mamba2": "mamba2",
    "falcon_mamba": "mamba",
    "rwkv": "recurrent",
    "xlstm": "recurrent",
}
#: Model types whose default config lists every layer as attention, though their published
#: models are hybrids (LFM2: ``full_attn_idxs`` defaults to every layer; its checkpoints keep
#: a few and make the rest short convolutions).
_DEFAULT_HIDES = {"lfm2": "conv", "lfm2_moe": "conv"}
#: Hybrid pattern letters (Nemotron-H's ``hybrid_override_pattern``).
_PATTERN = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}
#: Where a multimodal ``config.json`` nests its decoder's config, in the order looked at.
_TEXT_KEYS = ("text_config", "llm_config")
#: The attributes a text config names its layers' kinds under (by transformers release).
_LAYER_LISTS = ("layer_types", "layers_block_type", "block_types")
#: What the refusal says makes such a model exact.
STATEFUL_FIX = (
    "a pack is exact only if each such layer is told where conversations start (the "
    "flash-linear-attention / Mamba kernels with cu_seqlens or seq_idx, on a GPU); "
    "allow_stateful_layers=True accepts the model, and to_hf(..., allow_stateful_layers=True) "
    "then passes those boundaries (not proven on a CPU path, which ignores them); or train "
    "unpacked (unpacked=True)"
)


class StatefulLayersError(ValueError):
    """A model whose layers carry state from one packed conversation into the next."""


@dataclass(kw_only=True, slots=True, frozen=True)
class ModelInfo:
    """A model as its config describes it.

    Attributes:
        model_type: The config's ``model_type`` (e.g. ``"qwen3_5"``).
        layer_types: The text model's layer kinds in order (``()`` when its config lists none).
        source: Where it was read (for error messages).
        rope_bound: Where the text model's rotary frequencies follow the row's largest
            position (``longrope``, ``dynamic`` NTK): the longest row that keeps them as a
            conversation alone has them (``original_max_position_embeddings``; dynamic: its
            ``max_position_embeddings``), so a pack is exact only that wide. None: they do not
            depend on the row.
        rope_type: That rotary type (for the message).
        row_bounds: Other rules that follow the row's absolute positions rather than each
            conversation's, each ``(what, bound)``: the widest pack that keeps them as alone
            (Llama 4: its attention chunks, ``attention_chunk_size``; its attention temperature
            on the layers without rotary embeddings, constant below ``floor_scale - 1``).
    """

    model_type: str
    layer_types: tuple[str, ...] = ()
    source: str = ""
    rope_bound: int | None = None
    rope_type: str = ""
    row_bounds: tuple[tuple[str, int], ...] = ()

    @property
    def stateful_layers(self) -> dict[str, int]:
        """Each layer type that does not keep packed conversations apart, with its count."""
        counts: dict[str, int] = {}
        for kind in self.layer_types:
            if kind not in SEPARATE_LAYER_TYPES:
                counts[kind] = counts.get(kind, 0) + 1
        return counts

    def describe_stateful(self) -> str:
        """``"18 of 24 layers are linear_attention (linear attention (...))"``, or ``""``."""
        parts = [
            f"{count} of {len(self.layer_types)} layers are {kind} "
            f"({STATEFUL_NAMES.get(kind, 'not known to keep conversations apart')})"
            for kind, count in self.stateful_layers.items()
        ]
        return "; ".join(parts)


def _layer_types(text: Any, model_type: str) -> tuple[str, ...]:
    for name in _LAYER_LISTS:
        found = _get(text, name)
        if found and isinstance(found, (list, tuple)) and all(isinstance(k, str) for k in found):
            return tuple(found)
    pattern = _get(text, "hybrid_override_pattern")
    if isinstance(pattern, str) and pattern:
        return tuple(_PATTERN.get(c, c) for c in pattern)
    if model_type in ALL_RECURRENT:
        layers = _get(text, "num_hidden_layers")
        return (ALL_RECURRENT[model_type],) * (layers if isinstance(layers, int) else 1)
    return ()


def _get(config: Any, name: str) -> Any:
    if isinstance(config, Mapping):
        return config.get(name)
    try:
        return getattr(config, name, None)
    except Exception:  # a config property that needs fields this config lacks
        return None


def text_config(config: Any, *, holding: str | None = None) -> Any:
    """The decoder's config of a ``transformers`` config (``get_text_config(decoder=True)``) or
    of its ``config.json`` as a dict (the first of ``text_config`` / ``llm_config`` that is
    one); the config itself where it is flat.

    Args:
        config: A ``transformers`` config or the dict of a ``config.json``.
        holding: A dict's nested config only where it sets this field (``"hidden_size"``:
            the sizes, where a config may nest a stub such as ``{"model_type": "llama"}`` and
            keep them at the top level), else the top level.
    """
    if isinstance(config, Mapping):
        for key in _TEXT_KEYS:
            nested = config.get(key)
            if isinstance(nested, Mapping) and nested and (holding is None or nested.get(holding)):
                return nested
        return config
    getter = getattr(config, "get_text_config", None)
    try:
        return getter(decoder=True) if callable(getter) else config
    except (ValueError, TypeError):  # several text configs (an encoder and a decoder)
        return config


def read_config_json(file: Path) -> Any:
    """A model's ``config.json`` as JSON.

    Raises:
        ValueError: it does not read or parse (naming the file).
    """
    try:
        return json.loads(file.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{file}: not a readable JSON model config ({e})") from e


def model_info(config: Any, *, source: str = "") -> ModelInfo:
    """:class:`ModelInfo` of a ``transformers`` config (or its ``config.json`` as a dict)."""
    model_type = _get(config, "model_type") or ""
    text = text_config(config)
    text_type = _get(text, "model_type") or model_type
    rope_type, bound = _rope_bound(text)
    return ModelInfo(
        model_type=str(model_type),
        layer_types=_layer_types(text, str(text_type)),
        source=source,
        rope_bound=bound,
        rope_type=rope_type,
        row_bounds=_row_bounds(text),
    )


def _row_bounds(text: Any) -> tuple[tuple[str, int], ...]:
    """:attr:`ModelInfo.row_bounds` of a text config: transformers' Llama 4 scales its
    queries by the row's index (``arange``), whatever ``position_ids``; before 5.23 its
    attention chunks follow the row's index too (:func:`hf_compat.masks_follow_packed_positions`)."""
    found = []
    chunk = _get(text, "attention_chunk_size")
    layers = _get(text, "layer_types")
    chunked = not isinstance(layers, (list, tuple)) or "chunked_attention" in layers
    # since 5.23 a padding-free row's chunks follow each conversation's positions
    row_chunks = not hf_compat.masks_follow_packed_positions()
    if isinstance(chunk, int) and chunk > 0 and chunked and row_chunks:
        found.append(
            (
                f"chunked attention (attention_chunk_size={chunk:,}: chunks of the row's "
                f"positions, not of each conversation's)",
                chunk,
            )
        )
    floor = _get(text, "floor_scale")
    if _get(text, "attn_temperature_tuning") and isinstance(floor, int) and floor > 1:
        found.append(
            (
                f"attention temperature tuning (floor_scale={floor:,}: the layers without "
                f"rotary embeddings scale their queries by the row's position from "
                f"{floor - 1:,} on)",
                floor - 1,
            )
        )
    return tuple(found)


#: Rotary types whose frequencies transformers picks per forward from the row's largest
#: position (``modeling_rope_utils.dynamic_rope_update``): a short conversation packed beside
#: positions past the bound gets other frequencies than alone (tests/test_rope_bound.py,
#: tests/test_phi4_couplings.py).
ROW_DEPENDENT_ROPE = ("longrope", "dynamic")


def _rope_bound(text: Any) -> tuple[str, int | None]:
    """``(rope type, bound)`` of a text config whose rotary frequencies follow the row's
    largest position (:data:`ROW_DEPENDENT_ROPE`), else ``("", None)``; per-layer-type rope
    parameters (Gemma 3's) are each looked at."""
    found = _get(text, "rope_parameters") or _get(text, "rope_scaling")
    if not isinstance(found, Mapping):
        return "", None
    nested = [v for v in found.values() if isinstance(v, Mapping)]
    for rope in nested or [found]:
        kind = str(rope.get("rope_type") or rope.get("type") or "")
        if not any(k in kind for k in ROW_DEPENDENT_ROPE):
            continue
        if "dynamic" in kind:  # it recomputes past its max_position_embeddings
            bound = _get(text, "max_position_embeddings")
        else:
            bound = rope.get("original_max_position_embeddings") or _get(
                text, "original_max_position_embeddings"
            )
        if isinstance(bound, int) and bound > 0:
            return kind, bound
    return "", None


def check_rope(info: ModelInfo, *, width: int, where: str) -> None:
    """Raises where packs ``width`` wide would give the model other rotary frequencies than
    each conversation alone (:attr:`ModelInfo.rope_bound`), or other attention
    (:attr:`ModelInfo.row_bounds`)."""
    for what, bound in info.row_bounds:
        if width > bound:
            raise ValueError(
                f"{where}: model type {info.model_type!r} ({info.source}) uses {what}; a pack "
                f"{width:,} wide (padding included) would give a conversation that does not "
                f"start the row other attention than alone: set max_input_seq_length <= "
                f"{bound:,}, or train unpacked (unpacked=True)"
            )
    if info.rope_bound is None or width <= info.rope_bound:
        return
    raise ValueError(
        f"{where}: model type {info.model_type!r} ({info.source}) uses {info.rope_type} "
        f"rotary embeddings, which take other frequencies at every position once the row's "
        f"largest position passes {info.rope_bound:,}; a pack {width:,} wide (padding "
        f"included) would give its conversations other frequencies than alone: set "
        f"max_input_seq_length <= {info.rope_bound:,}, or train unpacked (unpacked=True)"
    )


def read_model_info(path: str | Path) -> ModelInfo | None:
    """The model of a local directory (its ``config.json``), or None where it has none.

    ``transformers`` builds the config when it knows the type (defaults and legacy field names
    resolved as the model sees them); else the raw JSON is read.
    """
    file = Path(path) / "config.json"
    if not file.is_file():
        return None
    source = str(file)
    raw = read_config_json(file)
    if not isinstance(raw, dict) or not isinstance(raw.get("model_type"), str):
        return None
    try:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(str(path), local_files_only=True)
    except Exception as e:  # a type this transformers does not know: what the file says
        logger.debug("%s: transformers does not build its config (%s); reading the JSON", file, e)
        return model_info(raw, source=source)
    return model_info(config, source=source)


def model_info_for_type(model_type: str) -> ModelInfo:
    """:class:`ModelInfo` of a model type's default config (its layer types as published)."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.for_model(model_type)
    except Exception as e:
        raise ValueError(
            f"model_type={model_type!r} is not a model type this transformers knows ({e}); "
            f"use the model_type of the model's config.json"
        ) from e
    info = model_info(config, source=f"model_type={model_type!r}")
    text_type = _get(text_config(config), "model_type")
    hidden = _DEFAULT_HIDES.get(model_type) or _DEFAULT_HIDES.get(text_type)
    if hidden and not info.stateful_layers:  # its default config lists no such layer
        kinds = (hidden,) * max(len(info.layer_types), 1)
        return dataclasses.replace(info, layer_types=kinds)
    return info


def check_layers(info: ModelInfo, *, allow_stateful_layers: bool, where: str) -> None:
    """Raises :class:`StatefulLayersError` for a model whose layers mix packed conversations.

    Args:
        info: The model.
        allow_stateful_layers: Accept it anyway (logged once; its kernels must get the
            boundaries).
        where: Who asks (``"PackingTaskEncoder"``, ``"to_hf"``), for the message.
    """
    described = info.describe_stateful()
    if not described:
        return
    if allow_stateful_layers:
        logger.warning(
            "%s: model type %r (%s): %s; accepted by allow_stateful_layers=True: packs are "
            "exact only where those layers are given the conversations' boundaries",
            where,
            info.model_type,
            info.source,
            described,
        )
        return
    raise StatefulLayersError(
        f"{where}: model type {info.model_type!r} ({info.source}) cannot be packed exactly: "
        f"{described}: such layers do not keep packed conversations apart; "
        f"{STATEFUL_FIX}"
    )


def find_model_config(source: Any) -> Path | None:
    """The ``config.json`` of what a processor or tokenizer was loaded from (a local directory,
    or the Hugging Face cache of the hub id it names; never the network), or None. ``source``
    may also be that directory or file."""
    if isinstance(source, (str, Path)):
        names = [str(source)]
    else:
        tokenizer = getattr(source, "tokenizer", None) or source
        names = [getattr(tokenizer, "name_or_path", None), getattr(source, "name_or_path", None)]
    names = [n for n in names if isinstance(n, str) and n]
    for name in names:
        path = Path(name)
        if path.name == "config.json" and path.is_file():
            return path
        if (path / "config.json").is_file():
            return path / "config.json"
    for name in names:
        if name.count("/") == 1 and not Path(name).exists():
            try:  # a hub id: its cached snapshot
                from huggingface_hub import try_to_load_from_cache

                cached = try_to_load_from_cache(name, "config.json")
            except Exception:
                continue
            if isinstance(cached, str):
                return Path(cached)
    return None


def info_of(source: Any) -> ModelInfo | None:
    """The model a processor or tokenizer (or a model directory) was saved with, where it can
    be found offline: what :func:`energon_packing.load_processor` or the test builders attach
    (``model_info``), else its ``config.json`` (:func:`find_model_config`)."""
    found = getattr(source, "model_info", None)
    if isinstance(found, ModelInfo):
        return found
    file = find_model_config(source)
    return read_model_info(file.parent) if file is not None else None
