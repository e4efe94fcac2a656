"""The one source of truth for every packing knob: a validated dataclass.

``PackingTaskEncoder(**knobs)`` and ``PackingConfig.from_dict(yaml_dict)`` both land here;
unknown keys raise, and every error names the knob and the value that fixes it.
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from energon_packing.encoding.chat import Limits
from energon_packing.encoding.vision import DEFAULT_MAX_PIXELS, DEFAULT_MIN_PIXELS, VisionConfig
from energon_packing.packing.algorithms import check_algorithm
from energon_packing.packing.carry import (
    DEFAULT_BUDGET,
    DEFAULT_MAX_CARRIES,
    DEFAULT_MIN_FILL,
    CarryPolicy,
)

__all__ = [
    "DEFAULT_MAX_IMAGE_PIXELS",
    "HIGH_BIT_DEPTH",
    "OVERLONG_POLICIES",
    "SPECIAL_TOKEN_TEXT",
    "TRAIN_ON",
    "PackingConfig",
]

OVERLONG_POLICIES = ("drop", "truncate", "error")
TRAIN_ON = ("all_assistant", "last_assistant", "assistant_messages", "last_assistant_message")

SPECIAL_TOKEN_TEXT = ("text", "skip")
HIGH_BIT_DEPTH = ("scale", "clip")
#: 50 megapixels: an 8K photo; decoding one costs ~150 MB of RGB in the loader worker.
DEFAULT_MAX_IMAGE_PIXELS = 50_000_000


@dataclass(kw_only=True, slots=True, frozen=True)
class PackingConfig:
    """Packing knobs.

    Attributes:
        max_input_seq_length: Pack width C in tokens; every pack is exactly this wide.
        pad_multiple: Each conversation is padded to a multiple of this (C must be one too).
            With context parallelism CP use a multiple of 2*CP (of TP*CP with sequence
            parallelism), so every padded segment splits evenly across CP ranks.
        algorithm: Packing algorithm, one of ``energon_packing.packing.ALGORITHMS``.
        max_per_pack: At most this many conversations per pack (None: no limit).
        seed: Seed of ``first_fit_shuffle`` (mixed with each buffer's content).
        delta: Extra packs pre-allocated by ``balanced_greedy_knapsack``.
        overlong: Conversations longer than C after padding: ``"drop"`` (skip, counted),
            ``"truncate"`` (cut text after the last image, keep >= 1 trained token, else drop)
            or ``"error"`` (stop with a message naming the sample).
        train_on: ``"all_assistant"`` turns (each reply and its end-of-turn token), only the
            ``"last_assistant"`` turn, ``"assistant_messages"``: every assistant message as
            rendered, role header and trailing newline included (what NeMo-RL's producer
            trains), or ``"last_assistant_message"`` (the last one only: NeMo-RL's
            ``only_unmask_final``).
        mrope: Emit Qwen2-VL 3-row (t, h, w) ``position_ids`` instead of 1-row.
        min_pixels: Images are upscaled to at least this many pixels (Qwen2-VL's knob).
        max_pixels: Images are downscaled to at most this many pixels.
        carry: Keep the samples of under-full packs in the loader's buffer for the next select
            (Energon empties it every round); packs near the lower bound from small buffers.
        max_carries: With carry, a sample is carried at most this many times, so it leaves at
            most ``max_carries + 1`` selects (``(max_carries + 1) * buffer`` samples) late.
        carry_min_fill: With carry, packs at least this full (fraction of C) always leave.
        carry_budget: With carry, at most this fraction of the buffer stays behind per round.
        balance_window: Keep a pool of this many selected packs and emit, at each step, the
            one nearest to a target cost quantile that every rank derives from ``seed``, so
            data-parallel ranks get packs of similar attention cost at each step; 0 = off.
            The pool sits beside the packing buffer (its samples stay compressed): larger
            pools balance better (see benchmarks/carry_loader.py) and cost memory.
        special_token_text: Conversation text that spells a special token (``"<|im_end|>"``
            in a reply): ``"text"`` tokenizes it as plain text (only the chat layout inserts
            special ids), ``"skip"`` skips the conversation (reason ``special_token_text``).
        max_text_chars: Characters of text a conversation may hold; checked before any
            tokenizing (None: 32 * C, more than any conversation that fits C tokens holds).
        max_turns: Messages a conversation may hold (None: C // 2).
        max_images: Images a conversation may hold (None: C // 4; Qwen2-VL's smallest image
            takes 4 tokens).
        max_image_pixels: Pixels (width * height, read from the header) an image may have
            before it is skipped as ``image_too_large``, before anything is decoded.
        high_bit_depth: 16-bit and float images: ``"scale"`` maps their range onto 0..255;
            ``"clip"`` saturates them as PIL's ``convert("RGB")`` and transformers' image
            processors do (16-bit PNGs turn white, float TIFFs black).
        chat_template_kwargs: Keyword arguments for the processor's ``apply_chat_template``
            (e.g. ``{"add_vision_id": True}`` for Qwen2-VL); processor path only.
    """

    max_input_seq_length: int
    pad_multiple: int = 1
    algorithm: str = "subset_fill"
    max_per_pack: int | None = None
    seed: int = 0
    delta: int = 0
    overlong: str = "drop"
    train_on: str = "all_assistant"
    mrope: bool = False
    min_pixels: int = DEFAULT_MIN_PIXELS
    max_pixels: int = DEFAULT_MAX_PIXELS
    carry: bool = False
    max_carries: int = DEFAULT_MAX_CARRIES
    carry_min_fill: float = DEFAULT_MIN_FILL
    carry_budget: float = DEFAULT_BUDGET
    balance_window: int = 0
    special_token_text: str = "text"
    max_text_chars: int | None = None
    max_turns: int | None = None
    max_images: int | None = None
    max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS
    high_bit_depth: str = "scale"
    chat_template_kwargs: dict | None = None

    def __post_init__(self) -> None:
        capacity = self.max_input_seq_length
        _positive_int("max_input_seq_length", capacity)
        _positive_int("pad_multiple", self.pad_multiple)
        if capacity % self.pad_multiple:
            raise ValueError(
                f"max_input_seq_length={capacity} is not a multiple of pad_multiple="
                f"{self.pad_multiple}: every padded conversation and the pack must align. Use "
                f"max_input_seq_length={capacity - capacity % self.pad_multiple} or a "
                f"pad_multiple that divides it (with context parallelism CP: a multiple of 2*CP)"
            )
        check_algorithm(self.algorithm)
        if self.max_per_pack is not None:
            _positive_int("max_per_pack", self.max_per_pack)
        for name in ("seed", "delta"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise ValueError(f"{name} must be an integer, got {value!r}")
        if self.delta and self.algorithm != "balanced_greedy_knapsack":
            raise ValueError(
                f"delta={self.delta} only applies to algorithm='balanced_greedy_knapsack', "
                f"not {self.algorithm!r}"
            )
        _choice("overlong", self.overlong, OVERLONG_POLICIES)
        _choice("train_on", self.train_on, TRAIN_ON)
        for name in ("mrope", "carry"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if (
            isinstance(self.balance_window, bool)
            or not isinstance(self.balance_window, int)
            or (self.balance_window < 0)
        ):
            raise ValueError(f"balance_window must be an integer >= 0, got {self.balance_window!r}")
        _choice("special_token_text", self.special_token_text, SPECIAL_TOKEN_TEXT)
        _choice("high_bit_depth", self.high_bit_depth, HIGH_BIT_DEPTH)
        for name in ("max_text_chars", "max_turns", "max_images"):
            if getattr(self, name) is not None:
                _positive_int(name, getattr(self, name))
        _positive_int("max_image_pixels", self.max_image_pixels)
        kwargs = self.chat_template_kwargs
        if kwargs is not None and (
            not isinstance(kwargs, Mapping) or not all(isinstance(k, str) for k in kwargs)
        ):
            raise ValueError(f"chat_template_kwargs must be a dict of str keys, got {kwargs!r}")
        _ = self.vision  # validates min_pixels / max_pixels
        self._policy()  # validates the carry knobs even while carry is off

    @property
    def limits(self) -> Limits:
        """The work a conversation may cost before it is rejected (defaults derived from C)."""
        capacity = self.max_input_seq_length
        return Limits(
            max_text_chars=self.max_text_chars or 32 * capacity,
            max_turns=self.max_turns or max(1, capacity // 2),
            max_images=self.max_images or max(1, capacity // 4),
        )

    @property
    def vision(self) -> VisionConfig:
        return VisionConfig(min_pixels=self.min_pixels, max_pixels=self.max_pixels)

    def _policy(self) -> CarryPolicy:
        return CarryPolicy(
            max_carries=self.max_carries, min_fill=self.carry_min_fill, budget=self.carry_budget
        )

    @property
    def carry_policy(self) -> CarryPolicy | None:
        """The carry policy, or None when carry is off (Energon's behaviour)."""
        return self._policy() if self.carry else None

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> PackingConfig:
        """Builds a config from a mapping (e.g. a YAML section); unknown keys raise."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(
                f"unknown packing option(s) {', '.join(map(repr, unknown))}; valid options: "
                f"{', '.join(sorted(known))}"
            )
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name}={value!r} is not valid; choose one of {', '.join(choices)}")
