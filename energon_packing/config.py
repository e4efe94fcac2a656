"""The one source of truth for every packing knob: three typed sections, each field declared.

* :class:`PackingKnobs` (``config.packing``): pack width, padding, algorithm, carry, balance;
* :class:`SampleKnobs` (``config.samples``): which conversations are accepted, and how;
* :class:`LayoutKnobs` (``config.layout``): what the built-in layout or a processor emits.

Every field declares (``dataclasses.field`` metadata, listed in :data:`KNOBS`) what it does,
whether it decides the packs (which conversations go where, or what tensors they carry), how it
may change when a checkpoint is restored (:data:`RESTORE_RULES`) and on which layout path it
applies. The restore check (:meth:`PackingConfig.settings`), the task encoder's keywords, the
defaults and the README's knob table (:func:`knob_table`) all come from those declarations.

``PackingConfig(**knobs)``, ``PackingConfig.from_dict(yaml_section)`` and
``PackingTaskEncoder(**knobs)`` take the flat names (unknown keys raise, listing the valid ones),
and ``config.max_turns`` reads a field wherever it lives. Pure: imports only the packing core.
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from energon_packing.packing.algorithms import ALGORITHMS, DEFAULT_ALGORITHM, check_algorithm
from energon_packing.packing.carry import (
    DEFAULT_BUDGET,
    DEFAULT_MAX_CARRIES,
    DEFAULT_MIN_FILL,
    CarryPolicy,
)

__all__ = [
    "BUILTIN",
    "KNOBS",
    "MAY_CHANGE",
    "MAY_RAISE",
    "MUST_EQUAL",
    "PROCESSOR",
    "Knob",
    "LayoutKnobs",
    "Limits",
    "PackingConfig",
    "PackingKnobs",
    "SampleKnobs",
    "VisionConfig",
    "check_knobs_path",
    "knob",
    "knob_table",
]

OVERLONG_POLICIES = ("drop", "truncate", "error")
TRAIN_ON = ("all_assistant", "last_assistant", "assistant_messages", "last_assistant_message")
SPECIAL_TOKEN_TEXT = ("text", "skip")
HIGH_BIT_DEPTH = ("scale", "clip")
#: 50 megapixels: an 8K photo; decoding one costs ~150 MB of RGB in the loader worker.
DEFAULT_MAX_IMAGE_PIXELS = 50_000_000
#: Qwen2-VL's resize bounds (its image processor's defaults), the built-in layout's.
DEFAULT_MIN_PIXELS = 56 * 56
DEFAULT_MAX_PIXELS = 28 * 28 * 1280
#: Frames a video may be sampled to (Qwen's video processors' ``max_frames``).
DEFAULT_MAX_VIDEO_FRAMES = 768
#: Qwen2.5-VL's published ``vision_config.tokens_per_second`` (transformers' class default: 4).
DEFAULT_TOKENS_PER_SECOND = 2
#: The largest ``tokens_per_second`` taken (published Qwen2.5-VL: 2; transformers' default: 4).
MAX_TOKENS_PER_SECOND = 1000
#: What ``video_config`` may set: the video processors' own names (``initial_shift`` and a
#: ``size`` of height and width: InternVL's; ``max_duration``: GLM-4.1V's).
VIDEO_CONFIG_KEYS = (
    "do_sample_frames",
    "fps",
    "num_frames",
    "min_frames",
    "max_frames",
    "min_pixels",
    "max_pixels",
    "size",
    "cap_pixels_per_frame",
    "max_video_tokens",
    "initial_shift",
    "max_duration",
)
#: Seconds an audio clip may last (bounds the samples a worker decodes for one clip).
DEFAULT_MAX_AUDIO_SECONDS = 600.0
#: What ``audio_config`` may set: the feature extractor's own settings (Whisper's names).
AUDIO_CONFIG_KEYS = (
    "chunk_length",
    "hop_length",
    "n_fft",
    "feature_size",
    "do_normalize",
    "dither",
)
#: Samples a loader worker may skip before its first pack, then it stops with the reasons.
DEFAULT_MAX_SKIPS_WITHOUT_PACK = 1000

#: The layout paths: ``tokenizer=`` (the built-in ChatML + Qwen2-VL layout) or ``processor=``.
BUILTIN, PROCESSOR = "builtin", "processor"
PATHS = (BUILTIN, PROCESSOR)

#: Restore rules. ``MAY_RAISE`` only for an acceptance limit: a conversation a restore re-reads
#: from the buffer was accepted under the saved limit, so it is accepted, and encoded the same,
#: under a higher one; packs already emitted are unaffected (later ones may take conversations
#: the old limit refused). Lowering it could skip a re-read conversation: refused.
MUST_EQUAL, MAY_RAISE, MAY_CHANGE = "must equal", "may be raised", "may change"
RESTORE_RULES = (MUST_EQUAL, MAY_RAISE, MAY_CHANGE)


@dataclass(kw_only=True, slots=True, frozen=True)
class Knob:
    """One field's declaration, as :data:`KNOBS` lists it."""

    name: str
    section: str
    default: Any
    #: what the README's default column says (e.g. ``C // 2`` for a default derived from C)
    default_text: str
    #: whether it decides which conversations go where, or what tensors they carry
    decides: bool
    restore: str
    effect: str
    related: str
    paths: tuple[str, ...]
    #: what to use instead on a path the knob does not apply to
    instead: str
    #: the valid values of a knob that takes one of a few
    choices: tuple = ()

    @property
    def required(self) -> bool:
        return self.default is dataclasses.MISSING


def _knob(
    default: Any = dataclasses.MISSING,
    *,
    effect: str,
    decides: bool = True,
    restore: str | None = None,
    default_text: str | None = None,
    related: str = "",
    paths: tuple[str, ...] = PATHS,
    instead: str = "",
    choices: tuple = (),
) -> Any:
    restore = restore or (MUST_EQUAL if decides else MAY_CHANGE)
    assert restore in RESTORE_RULES and (decides or restore == MAY_CHANGE)
    meta = dict(
        effect=effect,
        decides=decides,
        restore=restore,
        default_text=default_text,
        related=related,
        paths=paths,
        instead=instead,
        choices=choices,
    )
    if default is dataclasses.MISSING:
        return field(metadata={"knob": meta})
    return field(default=default, metadata={"knob": meta})


# ---- validation helpers --------------------------------------------------------------------


def _integer(name: str, value: Any, *, minimum: int, optional: bool = False) -> None:
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise ValueError(f"{name} must be {what}{' or None' if optional else ''}, got {value!r}")


def _choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name}={value!r} is not valid; choose one of {', '.join(choices)}")


def _flag(name: str, value: Any, *, optional: bool = False) -> None:
    if not (isinstance(value, bool) or (optional and value is None)):
        allowed = "True, False or None" if optional else "True or False"
        raise ValueError(f"{name} must be {allowed}, got {value!r}")


# ---- the sections --------------------------------------------------------------------------


@dataclass(kw_only=True, slots=True, frozen=True)
class PackingKnobs:
    """Where conversations go: the pack width, padding, the algorithm, carry and balance."""

    max_input_seq_length: int = _knob(
        effect="pack width C; every pack is exactly C tokens",
        default_text="(required)",
        related="NeMo-RL `max_input_seq_length` / `max_total_sequence_length`",
    )
    pad_multiple: int = _knob(
        1,
        effect="each conversation padded to a multiple of this; C must be one too",
        related="NeMo-RL `make_sequence_length_divisible_by`; 2*CP (TP*CP with SP) under "
        "context parallelism",
    )
    algorithm: str = _knob(
        DEFAULT_ALGORITHM,
        choices=tuple(ALGORITHMS),
        effect="packing algorithm (table below)",
        related="NeMo-RL `sequence_packing.algorithm`",
    )
    max_per_pack: int | None = _knob(
        None,
        effect="at most this many conversations per pack",
        related="kernels with a cap on `cu_seqlens` length",
    )
    seed: int = _knob(
        0,
        effect="seed of `first_fit_shuffle` (mixed with each buffer's content) and of balanced "
        "emission",
        related="same on every rank",
    )
    delta: int = _knob(
        0,
        effect="extra packs pre-allocated by `balanced_greedy_knapsack` (upstream's default is 20)",
        related="NeMo-RL loader recipes",
    )
    carry: bool = _knob(
        False,
        effect="samples of under-full packs stay in the loader buffer for the next select",
        related="Energon `packing_buffer_size` (carry makes small ones enough)",
    )
    max_carries: int = _knob(
        DEFAULT_MAX_CARRIES,
        effect="with carry, a sample is carried at most this often: it leaves at most "
        "`max_carries + 1` selects late",
    )
    carry_min_fill: float = _knob(
        DEFAULT_MIN_FILL, effect="with carry, packs at least this full (fraction of C) always leave"
    )
    carry_budget: float = _knob(
        DEFAULT_BUDGET,
        effect="with carry, at most this fraction of the buffer stays behind per select",
    )
    balance_window: int = _knob(
        0,
        effect="pool of packs from which each step emits the one nearest to a cost target "
        "shared by all data-parallel ranks; 0 = off",
        related="DP size; 32-128, about 2x the DP size past 64 ranks",
    )
    unpacked: bool = _knob(
        False,
        decides=False,  # packs or rows follow packing_buffer_size, which a restore must keep
        effect="a loader built without `packing_buffer_size` yields ordinary padded batches "
        "(one conversation per row: trainer-side packing, a no-packing baseline); off, such a "
        "loader is refused when it is built, naming `packing_buffer_size`",
        related="Energon `packing_buffer_size` (must be unset when on)",
    )

    def __post_init__(self) -> None:
        capacity = self.max_input_seq_length
        _integer("max_input_seq_length", capacity, minimum=1)
        _integer("pad_multiple", self.pad_multiple, minimum=1)
        if capacity % self.pad_multiple:
            raise ValueError(
                f"max_input_seq_length={capacity} is not a multiple of pad_multiple="
                f"{self.pad_multiple}: every padded conversation and the pack must align. Use "
                f"max_input_seq_length={capacity - capacity % self.pad_multiple} or a "
                f"pad_multiple that divides it (with context parallelism CP: a multiple of 2*CP)"
            )
        check_algorithm(self.algorithm)
        _integer("max_per_pack", self.max_per_pack, minimum=1, optional=True)
        for name in ("seed", "delta"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise ValueError(f"{name} must be an integer, got {value!r}")
        if self.delta and self.algorithm != "balanced_greedy_knapsack":
            raise ValueError(
                f"delta={self.delta} only applies to algorithm='balanced_greedy_knapsack', "
                f"not {self.algorithm!r}"
            )
        _flag("carry", self.carry)
        _flag("unpacked", self.unpacked)
        _integer("balance_window", self.balance_window, minimum=0)
        self.policy()  # validates the carry knobs even while carry is off

    def policy(self) -> CarryPolicy:
        return CarryPolicy(
            max_carries=self.max_carries, min_fill=self.carry_min_fill, budget=self.carry_budget
        )


#: What a restore compares of each shard (``shard_check``).
SHARD_CHECKS = ("strict", "size")


@dataclass(kw_only=True, slots=True, frozen=True)
class SampleKnobs:
    """Which conversations are accepted (limits checked before any tokenizing or decoding),
    what happens to the rest, and when a loader that accepts nothing stops."""

    overlong: str = _knob(
        "drop",
        choices=OVERLONG_POLICIES,
        effect="longer than C after padding: `drop` (counted), `truncate` (text after the last "
        "image, >= 1 trained token kept, else dropped), `error` (stop, naming the sample)",
        related="NeMo-RL truncation",
    )
    special_token_text: str = _knob(
        "text",
        choices=SPECIAL_TOKEN_TEXT,
        effect="text that spells a special token is tokenized as plain text (`text`) or the "
        "conversation is skipped (`skip`)",
    )
    max_text_chars: int | None = _knob(
        None,
        restore=MAY_RAISE,
        default_text="32 * C",
        effect="characters of text a conversation may hold, checked before tokenizing "
        "(`text_too_long`)",
    )
    max_turns: int | None = _knob(
        None,
        restore=MAY_RAISE,
        default_text="C // 2",
        effect="messages a conversation may hold (`too_many_turns`)",
    )
    max_images: int | None = _knob(
        None,
        restore=MAY_RAISE,
        default_text="C // 4",
        effect="images a conversation may hold (`too_many_images`)",
    )
    max_image_pixels: int = _knob(
        DEFAULT_MAX_IMAGE_PIXELS,
        restore=MAY_RAISE,
        default_text="50,000,000",
        effect="reject threshold: pixels (width * height, from the header, before any decode) "
        "an image or a video frame may have, else it is skipped (`image_too_large`, "
        "`video_too_large`); not the resize target (`max_pixels`)",
        related="worker memory",
    )
    max_video_frames: int = _knob(
        DEFAULT_MAX_VIDEO_FRAMES,
        restore=MAY_RAISE,
        effect="reject threshold: frames a video's sampling may take (worked out from its "
        "header, before any decode), else it is skipped (`video_too_large`); bounds a worker's "
        "decode memory",
        related="Qwen `max_frames` (the sampling cap: `video_config`)",
    )
    max_video_tokens: int | None = _knob(
        None,
        restore=MAY_RAISE,
        default_text="None (any)",
        effect="reject threshold: video-pad tokens one video may expand to (from its header), "
        "else it is skipped (`video_too_large`)",
        related="Qwen3-VL `max_video_tokens`",
    )
    max_audio_seconds: float = _knob(
        DEFAULT_MAX_AUDIO_SECONDS,
        restore=MAY_RAISE,
        effect="reject threshold: seconds an audio clip may last (from its header where exact, "
        "else its decode, which stops there), else it is skipped (`audio_too_long`); bounds a "
        "worker's decode memory. A family's own maximum (Qwen2.5-Omni: its feature extractor's "
        "`chunk_length`, 300 s) also skips, never cuts",
        related="Qwen2.5-Omni `chunk_length`",
    )
    max_skips_without_pack: int | None = _knob(
        DEFAULT_MAX_SKIPS_WITHOUT_PACK,
        decides=False,
        default_text="1,000",
        effect="a loader worker that skips this many samples before its first pack stops with "
        "the skip reasons and counts (never a silent hang); None = never",
    )

    shard_check: str = _knob(
        "strict",
        decides=False,
        choices=SHARD_CHECKS,
        effect="what a restore compares of each shard with the checkpoint before resuming (a "
        "change raises `ShardChangedError`): `strict` size, mtime and sample count; `size` "
        "size and count (a dataset copied without its mtimes, e.g. staged to local disk)",
        related="`cp -p` / `rsync -a` keep mtimes",
    )

    def __post_init__(self) -> None:
        _choice("overlong", self.overlong, OVERLONG_POLICIES)
        _choice("shard_check", self.shard_check, SHARD_CHECKS)
        _choice("special_token_text", self.special_token_text, SPECIAL_TOKEN_TEXT)
        for name in ("max_text_chars", "max_turns", "max_images", "max_skips_without_pack"):
            _integer(name, getattr(self, name), minimum=1, optional=True)
        _integer("max_image_pixels", self.max_image_pixels, minimum=1)
        _integer("max_video_frames", self.max_video_frames, minimum=1)
        _integer("max_video_tokens", self.max_video_tokens, minimum=1, optional=True)
        seconds = self.max_audio_seconds
        if isinstance(seconds, bool) or not isinstance(seconds, numbers.Real) or not seconds > 0:
            raise ValueError(f"max_audio_seconds must be a number > 0, got {seconds!r}")


_BUILTIN_RESIZE = (
    "with processor= its image processor decides the resize: set it there, e.g. "
    "processor.image_processor.{name} = ... (or size={{'shortest_edge': ..., 'longest_edge': "
    "...}}), or in the processor directory's preprocessor_config.json; max_image_pixels (the "
    "reject threshold) applies on both paths"
)


@dataclass(kw_only=True, slots=True, frozen=True)
class LayoutKnobs:
    """What the layout emits for an accepted conversation: targets, positions, pixels."""

    train_on: str = _knob(
        "all_assistant",
        choices=TRAIN_ON,
        effect="loss on every assistant reply (and its end-of-turn token), `last_assistant` "
        "only, `assistant_messages`: each whole rendered assistant message, role header and "
        "trailing newline included, or `last_assistant_message` (the last one only)",
        related="`assistant_messages` = NeMo-RL's producer, `last_assistant_message` = its "
        "`only_unmask_final`",
    )
    mrope: bool | None = _knob(
        None,
        default_text="None (auto)",
        effect="3-row Qwen2-VL position ids (`[3, B, C]`) instead of 1-row; None: off on the "
        "built-in layout, the processor family's own with processor= (an explicit value the "
        "family contradicts raises)",
        related="Qwen2-VL / Qwen2.5-VL / Qwen3-VL models",
    )
    min_pixels: int | None = _knob(
        None,
        default_text=f"None ({DEFAULT_MIN_PIXELS})",
        effect="resize target: images upscaled to at least this many pixels (built-in layout only)",
        related="Qwen2-VL `min_pixels`",
        paths=(BUILTIN,),
        instead=_BUILTIN_RESIZE.format(name="min_pixels"),
    )
    max_pixels: int | None = _knob(
        None,
        default_text=f"None ({DEFAULT_MAX_PIXELS})",
        effect="resize target: images downscaled to at most this many pixels (built-in layout "
        "only); not the reject threshold (`max_image_pixels`)",
        related="Qwen2-VL `max_pixels`",
        paths=(BUILTIN,),
        instead=_BUILTIN_RESIZE.format(name="max_pixels"),
    )
    high_bit_depth: str = _knob(
        "scale",
        choices=HIGH_BIT_DEPTH,
        effect="16-bit and float images: range mapped onto 0..255 (`scale`) or saturated as "
        "PIL / transformers do (`clip`)",
    )
    chat_template_kwargs: dict | None = _knob(  # noqa: RUF009 (a field(), default None)
        None,
        effect="keyword arguments for the processor's `apply_chat_template` (processor path only)",
        related="e.g. Qwen2-VL `add_vision_id`",
        paths=(PROCESSOR,),
        instead="the built-in layout (tokenizer=) has no chat template; pass processor= to use "
        "the model's own",
    )

    video_config: dict | None = _knob(  # noqa: RUF009 (a field(), default None)
        None,
        effect="the video processor's own settings, as its `video_preprocessor_config.json` "
        "holds them (`fps`, `num_frames`, `min_frames`, `max_frames`, `min_pixels`, "
        "`max_pixels`, ...), over the processor's (processor=) or Qwen2-VL's with `fps=2.0` "
        "(built-in layout)",
        related="`video_preprocessor_config.json`; qwen-vl-utils samples at fps 2",
    )
    audio_config: dict | None = _knob(  # noqa: RUF009 (a field(), default None)
        None,
        effect="the audio feature extractor's own settings, as its `preprocessor_config.json` "
        "holds them (`chunk_length`, `hop_length`, `n_fft`, `feature_size`, `do_normalize`, "
        "`dither`), over the processor's; the clips' token counts follow them. "
        "`load_audio_from_video: True` (or `use_audio_in_video`): each video's own audio "
        "track interleaved with its frames, as the Omni processors do",
        related="`preprocessor_config.json` (WhisperFeatureExtractor)",
        paths=(PROCESSOR,),
        instead="the built-in layout takes no audio; pass processor= of a family whose "
        "processor takes audio (qwen2_5_omni, qwen3_omni)",
    )
    tokens_per_second: float = _knob(
        DEFAULT_TOKENS_PER_SECOND,
        effect="Qwen2.5-VL's `vision_config.tokens_per_second`: the temporal position step of "
        "a video patch is this times `second_per_grid_ts` (processor path, Qwen2.5-VL only)",
        related="the model's config.json",
        paths=(PROCESSOR,),
        instead="the built-in layout is Qwen2-VL's, whose video positions have no time scale",
    )
    model_type: str | None = _knob(
        None,
        decides=False,
        default_text="None (the processor's config.json)",
        effect="the model the packs are for (its config.json `model_type`): decides whether it "
        "is packed exactly where a processor class serves several models (`Qwen3VLProcessor`: "
        "Qwen3-VL and Qwen3.5) and refuses models whose layers carry state; None: read from "
        "the processor's directory",
        related="`load_processor(DIR)` reads it from DIR/config.json",
    )
    allow_stateful_layers: bool = _knob(
        False,
        decides=False,
        effect="accept a model with linear-attention / Mamba / short-convolution layers "
        "(Qwen3.5, Nemotron-H, LFM2): exact only where its kernels get the conversations' "
        "boundaries (`to_hf(..., allow_stateful_layers=True)` on a GPU); refused otherwise",
        related="flash-linear-attention, mamba-ssm kernels",
    )

    def __post_init__(self) -> None:
        _choice("train_on", self.train_on, TRAIN_ON)
        _flag("mrope", self.mrope, optional=True)
        for name in ("min_pixels", "max_pixels"):
            _integer(name, getattr(self, name), minimum=1, optional=True)
        _choice("high_bit_depth", self.high_bit_depth, HIGH_BIT_DEPTH)
        kwargs = self.chat_template_kwargs
        if kwargs is not None and (
            not isinstance(kwargs, Mapping) or not all(isinstance(k, str) for k in kwargs)
        ):
            raise ValueError(f"chat_template_kwargs must be a dict of str keys, got {kwargs!r}")
        _check_video_config(self.video_config)
        _check_audio_config(self.audio_config)
        tps = self.tokens_per_second
        if (
            isinstance(tps, bool)
            or not isinstance(tps, numbers.Real)
            or not 0 < tps <= MAX_TOKENS_PER_SECOND
        ):
            raise ValueError(
                f"tokens_per_second must be a number > 0 and <= {MAX_TOKENS_PER_SECOND} (your "
                f"model's vision_config.tokens_per_second), got {tps!r}"
            )
        if self.model_type is not None and (
            not isinstance(self.model_type, str) or not self.model_type
        ):
            raise ValueError(
                f"model_type must be a config.json model_type string (e.g. 'qwen3_vl') or None, "
                f"got {self.model_type!r}"
            )
        _flag("allow_stateful_layers", self.allow_stateful_layers)
        _ = self.vision  # validates min_pixels <= max_pixels

    @property
    def vision(self) -> VisionConfig:
        return VisionConfig(
            min_pixels=DEFAULT_MIN_PIXELS if self.min_pixels is None else self.min_pixels,
            max_pixels=DEFAULT_MAX_PIXELS if self.max_pixels is None else self.max_pixels,
        )


#: The Omni processors' switches for a video's own audio track (``audio_config`` takes them).
AUDIO_IN_VIDEO_KEYS = ("use_audio_in_video", "load_audio_from_video")


def audio_in_video(config: Any) -> bool:
    """Whether ``audio_config`` asks for each video's own audio track, interleaved with its
    frames (either of the processors' names for the switch)."""
    found = getattr(config, "audio_config", None) or {}
    return any(bool(found.get(key)) for key in AUDIO_IN_VIDEO_KEYS)


def _check_video_config(config: Any) -> None:
    """``video_config``: a dict of the Qwen video processors' settings, each of its type."""
    if config is None:
        return
    for key in AUDIO_IN_VIDEO_KEYS:
        if isinstance(config, Mapping) and key in config:
            raise ValueError(
                f"video_config[{key!r}]: a video's own audio track is an audio setting; set "
                f"audio_config={{'load_audio_from_video': {config[key]!r}}} instead"
            )
    if not isinstance(config, Mapping) or set(config) - set(VIDEO_CONFIG_KEYS):
        raise ValueError(
            f"video_config must be a dict with keys among {', '.join(VIDEO_CONFIG_KEYS)}; got "
            f"{config!r}"
        )
    for name in ("do_sample_frames", "cap_pixels_per_frame"):
        if name in config:
            _flag(f"video_config[{name!r}]", config[name])
    for name in ("num_frames", "min_frames", "max_frames", "min_pixels", "max_pixels"):
        if name in config:
            _integer(f"video_config[{name!r}]", config[name], minimum=1, optional=True)
    if "max_video_tokens" in config:
        _integer("video_config['max_video_tokens']", config["max_video_tokens"], minimum=1)
    fps = config.get("fps")
    if fps is not None and (
        isinstance(fps, bool) or not isinstance(fps, numbers.Real) or not 0 < fps < 1e4
    ):
        raise ValueError(f"video_config['fps'] must be a number > 0 or None, got {fps!r}")
    most = config.get("max_duration", 1)
    if isinstance(most, bool) or not isinstance(most, numbers.Real) or not 0 < most < 1e7:
        raise ValueError(
            f"video_config['max_duration'] must be a number of seconds > 0 (GLM-4.1V's "
            f"sampling), got {most!r}"
        )
    shift = config.get("initial_shift", 0)
    if not isinstance(shift, bool) and (
        not isinstance(shift, numbers.Real) or not 0 <= shift < 1e6
    ):
        raise ValueError(
            f"video_config['initial_shift'] must be True, False or a number of frames >= 0 "
            f"(InternVL's sampling), got {shift!r}"
        )
    size = config.get("size")
    if size is not None and not (
        isinstance(size, Mapping)
        and (set(size) <= {"shortest_edge", "longest_edge"} or set(size) == {"height", "width"})
        and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in size.values())
    ):
        raise ValueError(
            f"video_config['size'] must be {{'shortest_edge': int, 'longest_edge': int}} (pixel "
            f"bounds; Qwen) or {{'height': int, 'width': int}} (each frame's size; InternVL), "
            f"got {size!r}"
        )
    low = config.get("min_pixels") or (size or {}).get("shortest_edge")
    high = config.get("max_pixels") or (size or {}).get("longest_edge")
    if low and high and low > high:
        raise ValueError(f"video_config: min_pixels {low} exceeds max_pixels {high}")


def _check_audio_config(config: Any) -> None:
    """``audio_config``: a dict of the Whisper feature extractor's settings, each of its type."""
    if config is None:
        return
    if isinstance(config, Mapping):
        for key in AUDIO_IN_VIDEO_KEYS:
            if key in config:
                _flag(f"audio_config[{key!r}]", config[key])
        config = {k: v for k, v in config.items() if k not in AUDIO_IN_VIDEO_KEYS}
    if not isinstance(config, Mapping) or set(config) - set(AUDIO_CONFIG_KEYS):
        raise ValueError(
            f"audio_config must be a dict with keys among {', '.join(AUDIO_CONFIG_KEYS)}; got "
            f"{config!r}"
        )
    for name in ("chunk_length", "hop_length", "n_fft", "feature_size"):
        if name in config:
            _integer(f"audio_config[{name!r}]", config[name], minimum=1)
    if "do_normalize" in config:
        _flag("audio_config['do_normalize']", config["do_normalize"])
    dither = config.get("dither", 0.0)
    if isinstance(dither, bool) or not isinstance(dither, numbers.Real) or dither != 0:
        # dithering adds random noise: features would differ from run to run
        raise ValueError(f"audio_config['dither'] must be 0.0 (deterministic), got {dither!r}")
    if config.get("n_fft", 400) < config.get("hop_length", 160):
        raise ValueError(f"audio_config: n_fft must be >= hop_length, got {dict(config)!r}")


#: section attribute of :class:`PackingConfig` -> its class
SECTIONS = {"packing": PackingKnobs, "samples": SampleKnobs, "layout": LayoutKnobs}


def _declared() -> tuple[Knob, ...]:
    knobs = []
    for section, klass in SECTIONS.items():
        for f in dataclasses.fields(klass):
            meta = dict(f.metadata["knob"])
            default_text = meta.pop("default_text") or _text(f.default)
            knobs.append(
                Knob(
                    name=f.name,
                    section=section,
                    default=f.default,
                    default_text=default_text,
                    **meta,
                )
            )
    return tuple(knobs)


def _text(value: Any) -> str:
    return f"`{value}`" if isinstance(value, str) else str(value)


# ---- the resolved values the encoders read -------------------------------------------------


@dataclass(kw_only=True, slots=True, frozen=True)
class Limits:
    """Work a conversation may cost before it is rejected, checked before any tokenizing
    (``max_*`` knobs, with the defaults derived from C filled in).

    Attributes:
        max_text_chars: Characters of text over all messages.
        max_turns: Messages.
        max_images: Images referenced (and listed).
    """

    max_text_chars: int
    max_turns: int
    max_images: int


@dataclass(kw_only=True, slots=True, frozen=True)
class VisionConfig:
    """Qwen2-VL's image processor knobs (its names and defaults): the built-in layout's.

    Attributes:
        min_pixels: Images are upscaled to at least this many pixels.
        max_pixels: ... and downscaled to at most this many (a resize target, not a limit).
        patch_size: Side of a vision patch in pixels.
        merge_size: Patches merged per side into one LLM token (2x2 -> 1).
        temporal_patch_size: A still image is repeated this many times in time.
    """

    min_pixels: int = DEFAULT_MIN_PIXELS
    max_pixels: int = DEFAULT_MAX_PIXELS
    patch_size: int = 14
    merge_size: int = 2
    temporal_patch_size: int = 2

    def __post_init__(self) -> None:
        for name in ("min_pixels", "max_pixels", "patch_size", "merge_size", "temporal_patch_size"):
            _integer(name, getattr(self, name), minimum=1)
        if self.min_pixels > self.max_pixels:
            raise ValueError(
                f"min_pixels ({self.min_pixels}) must not exceed max_pixels ({self.max_pixels})"
            )

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size

    @property
    def patch_dim(self) -> int:
        """Values per patch row of ``pixel_values``: 3 * T * P * P (1176 for Qwen2-VL)."""
        return 3 * self.temporal_patch_size * self.patch_size * self.patch_size


# ---- the config ----------------------------------------------------------------------------


@dataclass(init=False, frozen=True)  # not slots: 3.11 then raises TypeError on setattr
class PackingConfig:
    """Every packing knob, validated, in three sections (flat names in, flat names out).

    ``PackingConfig(max_input_seq_length=8192, carry=True)`` builds it; ``config.carry`` reads
    ``config.packing.carry``. :data:`KNOBS` lists every knob with its declaration (the README's
    configuration table is :func:`knob_table`).
    """

    packing: PackingKnobs
    samples: SampleKnobs
    layout: LayoutKnobs

    def __init__(self, **knobs: Any):
        unknown = sorted(set(knobs) - set(_BY_NAME))
        if unknown:
            raise ValueError(
                f"unknown packing option(s) {', '.join(map(repr, unknown))}; valid options: "
                f"{', '.join(sorted(_BY_NAME))}"
            )
        if "max_input_seq_length" not in knobs:
            raise ValueError("max_input_seq_length (the pack width C in tokens) is required")
        for section, klass in SECTIONS.items():
            names = [f.name for f in dataclasses.fields(klass)]
            object.__setattr__(self, section, klass(**{n: knobs[n] for n in names if n in knobs}))

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> PackingConfig:
        """Builds a config from a flat mapping (e.g. a YAML section); unknown keys raise."""
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        """Every knob by its flat name (what :meth:`from_dict` takes back)."""
        return {knob.name: getattr(self, knob.name) for knob in KNOBS}

    def replace(self, **changes: Any) -> PackingConfig:
        return PackingConfig(**{**self.to_dict(), **changes})

    @property
    def limits(self) -> Limits:
        """The work a conversation may cost before it is rejected (defaults derived from C)."""
        capacity, samples = self.packing.max_input_seq_length, self.samples
        return Limits(
            max_text_chars=samples.max_text_chars or 32 * capacity,
            max_turns=samples.max_turns or max(1, capacity // 2),
            max_images=samples.max_images or max(1, capacity // 4),
        )

    @property
    def vision(self) -> VisionConfig:
        """The built-in layout's image processor (``min_pixels`` / ``max_pixels`` resolved)."""
        return self.layout.vision

    @property
    def carry_policy(self) -> CarryPolicy | None:
        """The carry policy, or None when carry is off (Energon's behaviour)."""
        return self.packing.policy() if self.packing.carry else None

    def check_path(self, path: str) -> None:
        """Raises ``ValueError`` for a knob set (not None / its default) that does not apply
        to ``path`` (:data:`BUILTIN` or :data:`PROCESSOR`), naming what to use instead."""
        check_knobs_path({k.name: getattr(self, k.name) for k in KNOBS}, path)

    def settings(self) -> dict[str, Any]:
        """The pack-deciding knobs a checkpoint must be restored with, as their effective
        values (defaults derived from C and resolved resize bounds filled in)."""
        resolved = {**dataclasses.asdict(self.limits)}
        vision = self.vision
        resolved.update(min_pixels=vision.min_pixels, max_pixels=vision.max_pixels)
        return {k.name: resolved.get(k.name, getattr(self, k.name)) for k in KNOBS if k.decides}


def _flat(name: str, section: str) -> property:
    return property(
        lambda self: getattr(getattr(self, section), name),
        doc=_BY_NAME[name].effect,
    )


KNOBS: tuple[Knob, ...] = _declared()
_BY_NAME = {knob.name: knob for knob in KNOBS}
for _k in KNOBS:
    setattr(PackingConfig, _k.name, _flat(_k.name, _k.section))
del _k


def knob(name: str) -> Knob:
    """The declaration of knob ``name``."""
    return _BY_NAME[name]


def check_knobs_path(knobs: Mapping[str, Any], path: str) -> None:
    """:meth:`PackingConfig.check_path` on flat knobs before they are validated, so a knob
    that does not apply to ``path`` is named first (not a conflict it has with another)."""
    _choice("path", path, PATHS)
    for knob in KNOBS:
        value = knobs.get(knob.name)
        if path not in knob.paths and value is not None and value != knob.default:
            where = "tokenizer=" if path == BUILTIN else "processor="
            raise ValueError(f"{knob.name}={value!r} does not apply with {where}: {knob.instead}")


def knob_table() -> str:
    """The README's configuration table, from the declarations (a test compares them)."""
    rows = [
        "| knob | section | default | decides packs | on restore | effect | related setting |",
        "|---|---|---|---|---|---|---|",
    ]
    for k in KNOBS:
        rows.append(
            f"| `{k.name}` | {k.section} | {k.default_text} | {'yes' if k.decides else 'no'} | "
            f"{k.restore} | {k.effect} | {k.related} |"
        )
    return "\n".join(rows)
