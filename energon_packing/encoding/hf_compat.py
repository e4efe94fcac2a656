"""The transformers internals this package reads, in one module (as Energon's are in
:mod:`energon_packing.loader.energon`).

Everything else calls transformers' public API (a processor's ``image_processor``,
``tokenizer``, ``apply_chat_template``, ``AutoProcessor``). What is private, or changed between
the releases of the supported range (``SUPPORTED``), is read here, each use checked on the
installed release: a missing or changed internal raises :class:`TransformersCompatError`, one
line naming the installed version and the range, never an ``AttributeError`` three calls deep.
The rules that changed inside the range follow the INSTALLED release (docs/compatibility.md
lists each with the version where it changed). Imports transformers lazily; no torch.
"""

from __future__ import annotations

import functools
import inspect
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

__all__ = [
    "ALPHA_ON_WHITE_SINCE",
    "BACKEND_METHODS",
    "BROKEN_FORWARD",
    "FRACTIONAL_TIME_INTERVAL_SINCE",
    "GEMMA3_WINDOW_CUTS_BLOCKS_SINCE",
    "LATER_PROCESSOR_MEDIA_SINCE",
    "MASKS_FOLLOW_PACKED_POSITIONS_SINCE",
    "OMNI_AUDIO_WINDOWS_SINCE",
    "PACK_RULES",
    "PROCESSOR_MEDIA_SINCE",
    "QWEN3_VIDEO_KEEPS_MARKUP_SINCE",
    "QWEN3_VIDEO_KEEPS_MARKUP_UNTIL",
    "SUPPORTED",
    "VIDEO_CAP_FROM_CALL_SINCE",
    "VIDEO_FRAMES_APART_SINCE",
    "TransformersCompatError",
    "alpha_on_white",
    "anyres_tiles",
    "attn_implementation",
    "backend_class",
    "broken_forward",
    "check",
    "compile_chat_template",
    "dotted",
    "fractional_time_interval",
    "gemma3_window_cuts_blocks",
    "gemma4_mask_rule",
    "glm_samples_one_frame_at_least",
    "masks_follow_packed_positions",
    "merged_images_kwargs",
    "mixin_token_types",
    "module_function",
    "number_of_features",
    "omni_audio_clips_apart",
    "omni_audio_mixing",
    "omni_position_id_per_seconds",
    "pack_rules",
    "processor_media_api",
    "processor_media_refusal",
    "processor_method",
    "processor_mixin",
    "qwen3_video_keeps_markup",
    "require_processor_media",
    "returns_mm_token_types",
    "rule_in_force",
    "smart_resize_of",
    "torchvision_available",
    "transformers_version",
    "video_cap_from_call",
    "video_frames_apart",
]

#: The transformers releases this package supports (setup.cfg's ``[hf]``; .ci/stacks.txt: the
#: ones CI runs the suite on).
SUPPORTED = ">=5.5"
#: ``image_transforms.convert_to_rgb`` (what every PIL image processor converts with)
#: composites an image's alpha on white since 5.21.0; before, PIL's ``convert("RGB")`` drops it.
ALPHA_ON_WHITE_SINCE = (5, 21, 0)
#: Gemma 3's sliding layers: ``window AND (causal OR image block)`` since 5.13.0
#: (``create_masks_for_vision_model``); before, ``(causal AND window) OR image block``.
GEMMA3_WINDOW_CUTS_BLOCKS_SINCE = (5, 13, 0)
#: ``ProcessorMixin.replace_image_token`` / ``get_text_with_replacements`` (a processor's
#: placeholder expansion as public methods; before, each processor expanded inside its
#: ``__call__``) and ``image_token_ids``: released in 5.10.0. The processor path calls them
#: where the processor has them; before, each family's rule of the release's ``__call__``.
PROCESSOR_MEDIA_SINCE = (5, 10, 0)
#: Gemma 3's, SmolVLM's and LLaVA-OneVision's processors define their own
#: ``replace_image_token`` since 5.15.0 (Qwen's and Idefics3's since 5.10.0; LLaVA-NeXT's and
#: InternVL's after 5.12.1 too); before, the ``ProcessorMixin`` one raises
#: ``NotImplementedError``, and the processor path uses the family's rule of that release
#: (``families.Family.expansion``).
LATER_PROCESSOR_MEDIA_SINCE = (5, 15, 0)
#: Qwen2-VL's and Qwen2.5-VL's ``get_vision_position_ids`` gives a video's frames their own
#: temporal index since 5.6.0; 5.5.x gives all frames the start position times the interval
#: and counts rows over all frames at once.
VIDEO_FRAMES_APART_SINCE = (5, 6, 0)
#: Qwen2.5-VL's temporal position step became ``tokens_per_second * second_per_grid_ts`` in
#: float, truncated per index (transformers #48669, released in 5.18.0); before it the seconds
#: were truncated first: ``tokens_per_second * int(second_per_grid_ts)``.
FRACTIONAL_TIME_INTERVAL_SINCE = (5, 18, 0)
#: A VLM's forward stops passing its own keyword arguments on into its vision tower
#: (``get_image_features(**kwargs)``) in 5.18.0: before, flash attention's ``cu_seq_lens_q``
#: given for the text reaches the tower too and collides with the tower's own.
VISION_TAKES_OWN_KWARGS_SINCE = (5, 18, 0)
#: Qwen3-Omni's audio encoder keeps its attention windows (so each clip) apart on sdpa and eager
#: (before, only flash attention read its ``cu_seqlens``: every clip of a call attended to every
#: other, those of other conversations in a pack included); the first release the CI proves it
#: on (5.8.1 does not; the fix landed between the two)
OMNI_AUDIO_WINDOWS_SINCE = (5, 12, 1)
#: Qwen3-VL's processor replaces the template's ``<|vision_start|><|video_pad|><|vision_end|>``
#: whole by a video's per-frame expansion before 5.10.0; from 5.10.0 (the generic
#: ``get_text_with_replacements``) only the video token, keeping the pair around the frames;
#: from 5.25.0 (Qwen3-VL's own ``get_text_with_replacements``) the whole again.
QWEN3_VIDEO_KEEPS_MARKUP_SINCE = PROCESSOR_MEDIA_SINCE
QWEN3_VIDEO_KEEPS_MARKUP_UNTIL = (5, 25, 0)
#: Qwen2-VL's and Qwen3-VL's video processors cap a frame's pixels by a call's
#: ``max_video_tokens`` (before, by their own alone): an Omni processor, which passes
#: ``video_config`` in its call, takes a ``video_config`` cap from this release on
VIDEO_CAP_FROM_CALL_SINCE = (5, 25, 0)
#: The masks of a padding-free row (packed sequences found from ``position_ids``) take each
#: sequence's own positions for their rules (``remap_positions_for_packed_sequence``) since
#: 5.23.0: Llama 4's attention chunks then follow each conversation; before, the row's index
#: (tests/test_llama4.py measures both)
MASKS_FOLLOW_PACKED_POSITIONS_SINCE = (5, 23, 0)
#: Models whose forward is broken on some releases, by model type: ``(since, until, what)``:
#: it raises, or it runs a packed row otherwise than each conversation alone. Llama 4's raises
#: on every call in 5.24.0 (its output class lost the ``image_outputs`` its forward sets); 5.23
#: and 5.25 run it. PaliGemma's prompt block (``token_type_ids`` 0) spans every conversation of
#: a padding-free row from 5.9 to 5.23: its ``block_sequence_ids`` put every prompt token in
#: one block, and ``masking_utils`` ORs that overlay in after the packed-sequence mask (5.24
#: ANDs it after; before 5.9 each run of prompt tokens is a block of its own:
#: tests/test_paligemma.py measures both)
BROKEN_FORWARD: dict[str, tuple[tuple[int, int, int], tuple[int, int, int], str]] = {
    "llama4": (
        (5, 24, 0),
        (5, 25, 0),
        "Llama4ForConditionalGeneration.forward raises AttributeError ('image_outputs') on "
        "every call",
    ),
    "paligemma": (
        (5, 9, 0),
        (5, 24, 0),
        "PaliGemma's prompt block (token_type_ids 0) spans every conversation of a packed row "
        "(its block_sequence_ids put all prompt tokens in one block, and the packed-sequence "
        "mask is applied before that overlay)",
    ),
}
#: The rules above that change what a pack holds (ids, pixels, positions, masks), by name: the
#: release it came in with, or ``(since, until)`` for one that a later release took back. A
#: checkpoint records which were in force (:func:`pack_rules`) and a restore under other rules
#: is refused, naming the rule and both releases.
PACK_RULES: dict[str, tuple] = {
    "video_frames_apart": VIDEO_FRAMES_APART_SINCE,
    "qwen3_video_keeps_markup": (QWEN3_VIDEO_KEEPS_MARKUP_SINCE, QWEN3_VIDEO_KEEPS_MARKUP_UNTIL),
    "fractional_time_interval": FRACTIONAL_TIME_INTERVAL_SINCE,
    "gemma3_window_cuts_blocks": GEMMA3_WINDOW_CUTS_BLOCKS_SINCE,
    "alpha_on_white": ALPHA_ON_WHITE_SINCE,
}


class TransformersCompatError(RuntimeError):
    """An internal of transformers this package reads is missing or changed."""


@functools.cache  # read per conversation (mRoPE rules); the installed release does not change
def transformers_version() -> tuple[int, int, int] | None:
    """The installed transformers release as ``(major, minor, patch)``; None if not installed."""
    try:
        from importlib.metadata import PackageNotFoundError, version

        found = version("transformers")
    except PackageNotFoundError:
        return None
    parts = [int("".join(c for c in p if c.isdigit()) or 0) for p in found.split(".")[:3]]
    return tuple((parts + [0, 0, 0])[:3])  # type: ignore[return-value]


def _fail(what: str, error: BaseException | str) -> TransformersCompatError:
    import transformers

    return TransformersCompatError(
        f"transformers {transformers.__version__}: {what} failed ({error}); energon_packing "
        f"supports transformers {SUPPORTED} (CI-tested releases: docs/compatibility.md); "
        f"install one of them"
    )


def dotted(version: tuple[int, ...] | None) -> str:
    """``(5, 12, 1)`` as ``"5.12.1"`` (None, no transformers: ``"none"``)."""
    return "none" if version is None else ".".join(map(str, version))


def processor_media_api(processor: Any = None) -> bool:
    """Whether a processor (instance or class; None: the installed ``ProcessorMixin``) expands
    image placeholders by public methods: ``get_text_with_replacements`` and a
    ``replace_image_token`` of its own (``ProcessorMixin``'s raises ``NotImplementedError``)."""
    try:
        from transformers.processing_utils import ProcessorMixin
    except ImportError:
        return False
    if processor is None:
        return hasattr(ProcessorMixin, "replace_image_token")
    cls = processor if isinstance(processor, type) else type(processor)
    own = getattr(cls, "replace_image_token", None)
    return (
        hasattr(cls, "get_text_with_replacements")
        and own is not None
        and own is not getattr(ProcessorMixin, "replace_image_token", None)
    )


def processor_media_refusal(processor: Any, family: Any = None) -> str | None:
    """Why the processor path with images and videos cannot run for ``processor`` (instance or
    class) of ``family`` (a :class:`~.families.Family`) on the installed release, in one line
    naming the release and the fix; None where it can: the processor expands placeholders by
    public methods, or the family declares the release's own expansion (``Family.expansion``)."""
    if processor_media_api(processor) or getattr(family, "expansion", None) is not None:
        return None
    import transformers

    name = processor.__name__ if isinstance(processor, type) else type(processor).__name__
    return (
        f"transformers {transformers.__version__}: {name} has no replace_image_token / "
        f"get_text_with_replacements of its own and energon_packing knows no expansion rule of "
        f"this release for it (it knows one for eighteen families back to 5.5, "
        f"docs/compatibility.md): the processor path with images and videos needs a transformers "
        f"release where {name} defines them (not before {dotted(PROCESSOR_MEDIA_SINCE)}; the "
        f"later families are proven on the newest release CI runs); on this release use the "
        f"built-in layout (tokenizer=...) or a text processor, or upgrade transformers"
    )


def require_processor_media(processor: Any, *, family: Any = None) -> None:
    """Raises :class:`TransformersCompatError` (:func:`processor_media_refusal`'s line) where
    the processor path cannot expand ``processor``'s image placeholders exactly."""
    refusal = processor_media_refusal(processor, family)
    if refusal:
        raise TransformersCompatError(refusal)


# ---- processors --------------------------------------------------------------------------------


def processor_model_types(class_name: str) -> tuple[str, ...]:
    """The model types whose ``AutoProcessor`` is ``class_name``, as the installed release maps
    them (``PROCESSOR_MAPPING_NAMES``, an auto-class table; ``()`` where it has none: a family is
    then refused only by the model a processor names)."""
    try:
        from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES
    except ImportError:
        return ()
    return tuple(sorted(t for t, name in PROCESSOR_MAPPING_NAMES.items() if name == class_name))


def _kwargs_class(cls: type) -> Any:
    """The ``ProcessingKwargs`` TypedDict a processor class's own ``__call__`` merges with: its
    ``valid_processor_kwargs`` where the class sets one (Qwen since 5.10), else
    ``<ProcessorClass>Kwargs`` of its module (what ``__call__`` names; gone in 5.23)."""
    from transformers.processing_utils import ProcessingKwargs

    for klass in cls.__mro__:
        declared = klass.__dict__.get("valid_processor_kwargs")
        if declared is not None and declared is not ProcessingKwargs:
            return declared
        module = sys.modules.get(klass.__module__)
        # the module's own names only: 5.23+ keeps the old class names as deprecated aliases
        found = vars(module).get(f"{klass.__name__}Kwargs") if module else None
        if isinstance(found, type) and issubclass(found, dict):
            return found
    return ProcessingKwargs


def merged_images_kwargs(processor: Any) -> dict:
    """What the processor's own ``__call__`` passes its image processor (``images_kwargs`` of
    ``ProcessorMixin._merge_kwargs``, ``return_tensors="np"``)."""
    return dict(_merged(processor)["images_kwargs"])


def returns_mm_token_types(processor: Any, *, field: str | None = None) -> bool:
    """Whether the processor's own ``__call__`` returns its token types (``mm_token_type_ids``,
    or ``field`` where it renames them): its merged ``text_kwargs`` say so before 5.23 (the
    kwargs class's ``_defaults``), the merged kwargs' top level or the processor's
    ``return_mm_token_type_ids`` attribute since. Where neither names the switch, whether its
    ``model_input_names`` lists ``field``: such a ``__call__`` adds them by hand, whatever the
    keywords (Gemma 3n before 5.19)."""
    merged = _merged(processor)
    for found in (merged.get("text_kwargs", {}), merged):
        if "return_mm_token_type_ids" in found:
            return bool(found["return_mm_token_type_ids"])
    if hasattr(processor, "return_mm_token_type_ids"):
        return bool(processor.return_mm_token_type_ids)
    return field is not None and field in (getattr(processor, "model_input_names", None) or ())


def _merged(processor: Any) -> dict:
    """``ProcessorMixin._merge_kwargs`` as the processor's own ``__call__`` calls it. Before
    5.23 the kwargs class is a required positional argument (``__call__`` names its own);
    since, it defaults to the processor's ``valid_processor_kwargs`` and is left to it."""
    merge = getattr(processor, "_merge_kwargs", None)
    if merge is None:
        raise _fail(f"{type(processor).__name__}._merge_kwargs", "no such method")
    try:
        first = next(iter(inspect.signature(merge).parameters.values()), None)
        required = first is not None and first.default is inspect.Parameter.empty
        args = (_kwargs_class(type(processor)),) if required else ()
        merged = merge(
            *args, tokenizer_init_kwargs=processor.tokenizer.init_kwargs, return_tensors="np"
        )
        merged["images_kwargs"]
        return merged
    except (TypeError, KeyError, ValueError) as e:
        raise _fail(f"{type(processor).__name__}._merge_kwargs(KwargsClass, ...)", e) from e


def processor_mixin() -> type:
    """``transformers.processing_utils.ProcessorMixin`` (the base an image-only processor
    class slots its ``video_processor`` handling in front of:
    :func:`energon_packing.encoding.processor_loading.image_only`)."""
    from transformers.processing_utils import ProcessorMixin

    return ProcessorMixin


def mixin_token_types() -> Callable | None:
    """``ProcessorMixin.create_mm_token_type_ids`` (a modality per id), None where it has none:
    a processor that inherits it unchanged types each id alone."""
    try:
        from transformers.processing_utils import ProcessorMixin
    except ImportError:
        return None
    return getattr(ProcessorMixin, "create_mm_token_type_ids", None)


def smart_resize_of(image_processor: Any, name: str = "smart_resize") -> Callable:
    """The module-level size rule ``name`` of an image processor's module (the function its
    ``preprocess`` calls and there is no public handle on: Qwen's and GLM's ``smart_resize``,
    Gemma 4's ``get_aspect_ratio_preserving_size``)."""
    module = sys.modules.get(type(image_processor).__module__)
    found = getattr(module, name, None)
    if not callable(found):
        raise _fail(f"{type(image_processor).__module__}.{name} (the size rule)", "not found")
    return found


def module_function(obj: Any, name: str) -> Callable:
    """The module-level function ``name`` of the module that defines ``obj``'s class (an older
    release's expansion helper: Idefics3's ``get_image_prompt_string``)."""
    module = sys.modules.get(type(obj).__module__)
    found = getattr(module, name, None)
    if not callable(found):
        raise _fail(f"{type(obj).__module__}.{name}", "not found")
    return found


def processor_method(obj: Any, name: str) -> Callable:
    """The processor's own method ``name`` (an older release's public expansion helper:
    SmolVLM's ``expand_text_with_image_tokens``, gone since 5.15)."""
    found = getattr(obj, name, None)
    if not callable(found):
        raise _fail(f"{type(obj).__name__}.{name}", "not found")
    return found


def number_of_features(processor: Any, height: int, width: int, *processed: int) -> int:
    """LLaVA-NeXT's / LLaVA-OneVision's ``_get_number_of_features`` (an image's anyres token
    count, before their ``replace_image_token``: 5.15)."""
    count = getattr(processor, "_get_number_of_features", None)
    if count is None:
        raise _fail(f"{type(processor).__name__}._get_number_of_features", "no such method")
    return int(count(height, width, *processed))


def anyres_tiles(height: int, width: int, *, grid_pinpoints: list, tile: int) -> int:
    """The tiles LLaVA-NeXT's (and LLaVA-OneVision's) vision tower runs over for an image of
    ``height x width``: its best-fit grid of ``tile`` px squares plus the whole image
    (``modeling_llava_next.image_size_to_num_patches``, the function their models unpad
    ``pixel_values`` by)."""
    try:
        from transformers.models.llava_next.modeling_llava_next import image_size_to_num_patches
    except ImportError as e:
        raise _fail("modeling_llava_next.image_size_to_num_patches", str(e)) from None
    pinpoints = [list(p) for p in grid_pinpoints]
    return int(image_size_to_num_patches((int(height), int(width)), pinpoints, int(tile)))


@functools.cache
def glm_samples_one_frame_at_least() -> bool:
    """Whether the installed ``Glm4vVideoProcessor.sample_frames`` takes a frame of a clip
    shorter than one step of its fps (``max(floor(seconds x fps), 1)``, transformers 5.13 and
    later) or none (5.5-5.12: the processor then fails on the clip). Read from its module's
    source, which imports torchvision on those releases; a rule of neither shape is taken as
    the later one (logged)."""
    import importlib.util

    spec = importlib.util.find_spec("transformers.models.glm4v.video_processing_glm4v")
    text = Path(spec.origin).read_text() if spec is not None and spec.origin else ""
    if "max(int(math.floor(duration * requested_fps)), 1)" in text:
        return True
    if "n = int(math.floor(duration * requested_fps))" in text:
        return False
    logger.warning(
        "Glm4vVideoProcessor.sample_frames: neither known frame count rule found; taking the "
        "one of transformers 5.13+ (a clip shorter than a step samples one frame)"
    )
    return True


def torchvision_available() -> bool:
    """Whether transformers can use torchvision (its video processors need it)."""
    from transformers.utils import is_torchvision_available

    return bool(is_torchvision_available())


def attn_implementation(config: Any) -> str | None:
    """The attention a model config was set to (``config._attn_implementation``: no public
    getter); None for no config or none set."""
    return getattr(config, "_attn_implementation", None) if config is not None else None


# ---- the text side -----------------------------------------------------------------------------


def compile_chat_template(template: str) -> Any:
    """transformers' own compiled Jinja template (``_compile_jinja_template``), what
    ``apply_chat_template`` renders with. Raises :class:`TransformersCompatError` where it is
    gone (callers then render with ``apply_chat_template`` alone)."""
    try:
        from transformers.utils.chat_template_utils import _compile_jinja_template
    except ImportError as e:
        raise _fail("transformers.utils.chat_template_utils._compile_jinja_template", e) from e
    return _compile_jinja_template(template)


#: ``TokenizersBackend``'s methods whose override means a tokenizer encodes otherwise
BACKEND_METHODS = ("__call__", "_encode_plus", "set_truncation_and_padding", "backend_tokenizer")


def backend_class() -> type:
    """``TokenizersBackend`` (transformers 5's fast tokenizer base). Raises
    :class:`TransformersCompatError` where it is gone (callers then call the tokenizer)."""
    try:
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
    except ImportError as e:
        raise _fail("transformers.tokenization_utils_tokenizers.TokenizersBackend", e) from e
    for name in BACKEND_METHODS:
        if not hasattr(TokenizersBackend, name):
            raise _fail(f"TokenizersBackend.{name}", "no such attribute")
    return TokenizersBackend


# ---- rules that changed inside the range -------------------------------------------------------


@functools.cache
def vision_takes_own_kwargs() -> bool:
    """Whether the installed release keeps the forward's flash-attention arguments out of a
    VLM's vision tower (5.18+; also without transformers)."""
    found = transformers_version()
    return found is None or found >= VISION_TAKES_OWN_KWARGS_SINCE


def omni_audio_clips_apart(family: str) -> bool:
    """Whether the installed ``family`` thinker's audio encoder keeps the clips of one call
    apart on every attention implementation (Qwen2.5-Omni: always, by its block mask;
    Qwen3-Omni: from :data:`OMNI_AUDIO_WINDOWS_SINCE`; also without transformers)."""
    found = transformers_version()
    return family != "qwen3_omni" or found is None or found >= OMNI_AUDIO_WINDOWS_SINCE


def omni_audio_mixing(family: str) -> tuple[str, str] | None:
    """``(what, fix)`` where the installed ``family`` audio encoder mixes the clips of one call
    (:func:`omni_audio_clips_apart` false), the two halves of the line ``to_hf`` refuses a pack
    with and the encoder's build warns with; None where it keeps them apart."""
    if omni_audio_clips_apart(family):
        return None
    what = (
        f"transformers {dotted(transformers_version())}: the {family} audio encoder lets every "
        f"clip of a call attend to every other on sdpa and eager (only flash attention reads "
        f"its windows)"
    )
    return (
        what,
        f"use transformers >= {dotted(OMNI_AUDIO_WINDOWS_SINCE)}, where the clips stay apart",
    )


def gemma4_mask_rule() -> str | None:
    """Which image-block mask the installed Gemma 4 builds (a ``use_bidirectional_attention``
    ``"vision"`` model): ``"vision_model"`` (``create_masks_for_vision_model``, 5.13+: the
    window cuts image blocks), ``"causal_mapping"`` (``create_causal_mask_mapping``, 5.5-5.8:
    an image block stays whole under the window), both on the sliding layers only; None for
    another (5.12's, which opens the full layers' blocks too: not reproduced)."""
    try:
        from transformers.models.gemma4 import modeling_gemma4
    except ImportError:
        return None
    rules = {
        "create_masks_for_vision_model": "vision_model",
        "create_causal_mask_mapping": "causal_mapping",
    }
    return next((rule for name, rule in rules.items() if hasattr(modeling_gemma4, name)), None)


def fractional_time_interval() -> bool:
    """Whether the installed Qwen2.5-VL scales video time by the float product
    ``tokens_per_second * second_per_grid_ts`` (True, 5.18+; also without transformers: the
    newest rule) or by ``tokens_per_second * int(second_per_grid_ts)`` (before 5.18)."""
    found = transformers_version()
    return found is None or found >= FRACTIONAL_TIME_INTERVAL_SINCE


#: the Omni thinkers' config classes (their ``position_id_per_seconds``)
OMNI_THINKER_CONFIGS = {
    "qwen2_5_omni": "Qwen2_5OmniThinkerConfig",
    "qwen3_omni": "Qwen3OmniMoeThinkerConfig",
}


@functools.cache
def omni_position_id_per_seconds(family: str) -> float:
    """The installed thinker config's default ``position_id_per_seconds`` for ``family`` (a
    model's own config.json may set another: ``load_processor`` reads it)."""
    import transformers

    klass = getattr(transformers, OMNI_THINKER_CONFIGS[family])
    found = getattr(klass, "position_id_per_seconds", None)  # 5.x: a declared field
    if not isinstance(found, (int, float)) or isinstance(found, bool):
        found = inspect.signature(klass.__init__).parameters["position_id_per_seconds"].default
    return float(found)


def omni_track_timing(processor: Any) -> tuple[float, float]:
    """``(position_id_per_seconds, seconds_per_chunk)`` the Omni processor's own ``__call__``
    interleaves a video's audio track by: its merged kwargs' top level since 5.25 (the
    processor's class attributes), their ``videos_kwargs`` before (the kwargs class's
    ``_defaults``)."""
    merged = _merged(processor)
    found = []
    for name in ("position_id_per_seconds", "seconds_per_chunk"):
        value = merged.get(name, merged.get("videos_kwargs", {}).get(name))
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise _fail(f"{type(processor).__name__}'s {name}", f"not a number: {value!r}")
        found.append(float(value))
    return found[0], found[1]


@functools.cache
def omni_seconds_per_chunk(family: str) -> float:
    """The installed thinker config's default ``seconds_per_chunk`` (Qwen2.5-Omni's positions
    chunk a video's interleaved track by it; 2.0 where the config has none)."""
    import transformers

    klass = getattr(transformers, OMNI_THINKER_CONFIGS[family])
    found = getattr(klass, "seconds_per_chunk", None)
    if not isinstance(found, (int, float)) or isinstance(found, bool):
        parameter = inspect.signature(klass.__init__).parameters.get("seconds_per_chunk")
        found = parameter.default if parameter is not None else 2.0
    return float(found)


@functools.cache
def alpha_on_white() -> bool:
    """Whether the installed image processors composite alpha on white (5.21+; also without
    transformers: the newest rule)."""
    found = transformers_version()
    return found is None or found >= ALPHA_ON_WHITE_SINCE


@functools.cache
def gemma3_window_cuts_blocks() -> bool:
    """Whether the installed Gemma 3 cuts an image block by the sliding window (5.13+; also
    without transformers: the newest rule)."""
    found = transformers_version()
    return found is None or found >= GEMMA3_WINDOW_CUTS_BLOCKS_SINCE


def video_cap_from_call() -> bool:
    """Whether the installed Qwen video processors read a call's ``max_video_tokens`` (5.25+;
    also without transformers: the newest rule)."""
    found = transformers_version()
    return found is None or found >= VIDEO_CAP_FROM_CALL_SINCE


def broken_forward(model_type: str | None) -> str | None:
    """Why the installed release cannot run ``model_type``'s forward (:data:`BROKEN_FORWARD`),
    naming the releases that can; None where it can."""
    found = transformers_version()
    if model_type not in BROKEN_FORWARD or found is None:
        return None
    since, until, what = BROKEN_FORWARD[model_type]
    if not since <= found < until:
        return None
    return (
        f"on transformers {dotted(found)}, {what}: install another release (before "
        f"{dotted(since)} or from {dotted(until)} on)"
    )


def masks_follow_packed_positions() -> bool:
    """Whether the installed masks take a packed sequence's own positions for chunks (5.23+;
    also without transformers: the newest rule)."""
    found = transformers_version()
    return found is None or found >= MASKS_FOLLOW_PACKED_POSITIONS_SINCE


@functools.cache
def video_frames_apart() -> bool:
    """Whether the installed Qwen2-VL / Qwen2.5-VL position a video frame by frame (5.6+; also
    without transformers: the newest rule)."""
    found = transformers_version()
    return found is None or found >= VIDEO_FRAMES_APART_SINCE


def _window(name: str) -> tuple[tuple[int, int, int], tuple[int, int, int] | None]:
    """``(since, until)`` of rule ``name`` of :data:`PACK_RULES` (until None: still in force)."""
    when = PACK_RULES[name]
    return when if isinstance(when[0], tuple) else (when, None)


def rule_in_force(name: str, release: tuple[int, int, int] | None) -> bool:
    """Whether rule ``name`` of :data:`PACK_RULES` holds on ``release`` (None: no transformers,
    the newest rules)."""
    since, until = _window(name)
    if release is None:
        return until is None
    return release >= since and (until is None or release < until)


def qwen3_video_keeps_markup() -> bool:
    """Whether the installed Qwen3-VL processor keeps the template's vision pair around a
    video's per-frame expansion (5.10 to 5.24) or replaces it with the expansion (before 5.10,
    and since 5.25; also without transformers: the newest rule)."""
    return rule_in_force("qwen3_video_keeps_markup", transformers_version())


def pack_rules() -> dict[str, Any]:
    """The installed release (``"release"``: its version, None without transformers) and,
    per rule of :data:`PACK_RULES`, ``"<name> (since X.Y.Z)"``: whether it is in force (without
    transformers: the newest rules). The key names the release the rule came in with, also for
    one a later release took back (a checkpoint saved before that compares under the same key)."""
    found = transformers_version()
    rules: dict[str, Any] = {"release": dotted(found) if found else None}
    for name in PACK_RULES:
        rules[f"{name} (since {dotted(_window(name)[0])})"] = rule_in_force(name, found)
    return rules


def check() -> list[str]:
    """Every internal above, on the installed release: the names checked. Raises
    :class:`TransformersCompatError` on the first that fails."""
    from transformers import Qwen2VLProcessor
    from transformers.models.qwen2_vl import image_processing_pil_qwen2_vl as qwen_pil
    from transformers.processing_utils import ProcessorMixin

    checked = []
    from transformers import masking_utils

    if masks_follow_packed_positions() != hasattr(
        masking_utils, "remap_positions_for_packed_sequence"
    ):
        raise _fail(
            "masking_utils.remap_positions_for_packed_sequence",
            f"present on {dotted(transformers_version())} against the rule "
            f"(since {dotted(MASKS_FOLLOW_PACKED_POSITIONS_SINCE)})",
        )
    checked.append("masks_follow_packed_positions")
    from transformers.models.paligemma import modeling_paligemma

    # PaliGemma's prompt blocks stay per conversation where each run of prompt tokens is its
    # own block (before 5.9) or the packed-sequence mask comes after the overlay (5.24+)
    per_run = hasattr(modeling_paligemma, "token_type_ids_mask_function")
    packed_last = hasattr(masking_utils, "remap_positions_for_packed_sequence") and not hasattr(
        masking_utils, "packed_sequence_compatibility_function"
    )
    if (broken_forward("paligemma") is None) != (per_run or packed_last):
        raise _fail(
            "modeling_paligemma / masking_utils",
            f"PaliGemma's packed prompt blocks on {dotted(transformers_version())} against the "
            f"rule (BROKEN_FORWARD['paligemma'])",
        )
    checked.append("paligemma_prompt_blocks")
    compiled = compile_chat_template("{{ messages[0]['content'] }}")
    if compiled.render(messages=[{"content": "x"}]) != "x":
        raise _fail("_compile_jinja_template", "renders a probe otherwise")
    checked.append("compile_chat_template")
    backend_class()
    checked.append("backend_class")
    if mixin_token_types() is None:
        raise _fail("ProcessorMixin.create_mm_token_type_ids", "no such method")
    checked.append("mixin_token_types")
    parameters = list(inspect.signature(ProcessorMixin._merge_kwargs).parameters.values())
    if "tokenizer_init_kwargs" not in [p.name for p in parameters] or len(parameters) < 2:
        raise _fail("ProcessorMixin._merge_kwargs", f"its parameters are {parameters}")
    if parameters[1].default is inspect.Parameter.empty and "images_kwargs" not in getattr(
        _kwargs_class(Qwen2VLProcessor), "__annotations__", {}
    ):
        raise _fail("Qwen2VLProcessor's ProcessingKwargs", "no images_kwargs")
    checked.append("merged_images_kwargs")
    if not callable(getattr(qwen_pil, "smart_resize", None)):
        raise _fail("image_processing_pil_qwen2_vl.smart_resize", "not found")
    checked.append("smart_resize_of")
    if processor_mixin() is not ProcessorMixin:
        raise _fail("processing_utils.ProcessorMixin", "not the processors' base")
    checked.append("processor_mixin")
    torchvision_available()
    checked.append("torchvision_available")
    if anyres_tiles(10, 50, grid_pinpoints=[[28, 28], [28, 56]], tile=28) != 3:
        raise _fail("modeling_llava_next.image_size_to_num_patches", "a 10 x 50 probe is not 3")
    checked.append("anyres_tiles")
    glm_samples_one_frame_at_least()
    checked.append("glm_samples_one_frame_at_least")
    import transformers

    # an older release's own expansion helpers, where its processor has no public expansion
    for class_name, helper in (
        ("Idefics3Processor", "get_image_prompt_string"),
        ("SmolVLMProcessor", "expand_text_with_image_tokens"),
        ("LlavaNextProcessor", "_get_number_of_features"),
        ("LlavaOnevisionProcessor", "_get_number_of_features"),
    ):
        cls = getattr(transformers, class_name, None)
        if cls is None or processor_media_api(cls):
            continue
        module = sys.modules.get(cls.__module__)
        if not callable(getattr(cls, helper, None) or getattr(module, helper, None)):
            raise _fail(f"{class_name}'s {helper}", "not found")
    checked.append("expansion helpers")
    if "qwen2_vl" not in processor_model_types("Qwen2VLProcessor"):
        raise _fail("processing_auto.PROCESSOR_MAPPING_NAMES", "qwen2_vl is not mapped")
    checked.append("processor_model_types")
    return checked
