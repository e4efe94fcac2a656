"""Text-side helpers of the processor path: fast prefix renders, the tokenizer's own backend
called directly, and the span loss mask.

Pure Python over a compiled chat template and tokenizer offsets; no torch, no numpy.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Callable
from typing import Any

from energon_packing.encoding import hf_compat

__all__ = ["backend_encoder", "compiled_renderer", "span_mask", "tokenize"]

logger = logging.getLogger(__name__)


class _Compiled:
    """A chat template compiled by transformers, called directly; pickles by its source."""

    def __init__(self, template: str, variables: dict):
        self.template, self.variables = template, variables
        self._compile()

    def _compile(self) -> None:
        self.compiled = hf_compat.compile_chat_template(self.template)

    def __getstate__(self) -> dict:
        return {"template": self.template, "variables": self.variables}

    def __setstate__(self, state: dict) -> None:
        self.template, self.variables = state["template"], state["variables"]
        self._compile()

    def __call__(self, messages: list[dict], add_generation_prompt: bool = False) -> str:
        return self.compiled.render(
            messages=messages,
            tools=None,
            documents=None,
            add_generation_prompt=add_generation_prompt,
            **self.variables,
        )


def compiled_renderer(
    template: Any, variables: dict, render: Callable[..., str], images: bool
) -> Callable[..., str] | None:
    """The compiled chat template called directly (what ``apply_chat_template`` calls, minus
    its per-call conversions: half the cost), where it renders a probe conversation exactly as
    ``render`` (the processor's ``apply_chat_template``) does; else None.

    Used for the prefix renders that locate assistant turns only: the conversation itself is
    always rendered by ``apply_chat_template``, and a prefix that differs from it fails the
    prefix check (a ``template_error`` skip), never silently.
    """
    if not isinstance(template, str):
        return None
    try:
        fast = _Compiled(template, variables)
    except Exception as e:  # another transformers release: apply_chat_template alone
        logger.debug("chat template: apply_chat_template alone (%s)", e)
        return None
    parts = [{"type": "text", "text": "A"}] + [{"type": "image"}] * images
    probe = [
        {"role": "user", "content": parts},
        {"role": "assistant", "content": [{"type": "text", "text": "B"}]},
    ]
    try:
        same = all(
            fast(m, add_generation_prompt=g) == render(m, add_generation_prompt=g)
            for m, g in ((probe, False), (probe[:1], True))
        )
    except Exception:
        return None
    return fast if same else None


def tokenize(tokenizer: Any, text: str, add_special_tokens: bool) -> tuple[list, list]:
    """``(ids, offsets)`` of a text by the tokenizer's own ``__call__``."""
    out = tokenizer(text, add_special_tokens=add_special_tokens, return_offsets_mapping=True)
    return list(out["input_ids"]), list(out["offset_mapping"])


class _BackendEncoder:
    """A ``TokenizersBackend``'s own ``encode_batch``, called as its ``__call__`` calls it."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer

    def slow(self, text: str, add_special_tokens: bool) -> tuple[list, list]:
        return tokenize(self.tokenizer, text, add_special_tokens)

    def __call__(self, text: str, add_special_tokens: bool) -> tuple[list, list]:
        tokenizer = self.tokenizer
        backend = tokenizer.backend_tokenizer
        if (
            backend.truncation is not None
            or backend.padding is not None
            or backend.encode_special_tokens != bool(tokenizer.split_special_tokens)
        ):  # state __call__ would reset first: let it
            return self.slow(text, add_special_tokens)
        (found,) = backend.encode_batch([text], add_special_tokens=add_special_tokens)
        return found.ids, found.offsets


def backend_encoder(tokenizer: Any) -> Callable[[str, bool], tuple[list, list]] | None:
    """``(ids, offsets)`` of a text from the ``tokenizers`` backend, exactly as the fast
    tokenizer's ``__call__`` gets them (its ``_encode_plus`` ends in ``encode_batch`` on the
    backend), minus the conversions into a ``BatchEncoding`` (a third of the call's time);
    None where the tokenizer is not the plain ``TokenizersBackend`` or the two disagree on a
    probe text.

    A call falls back to the tokenizer itself whenever the backend's state is not what
    ``__call__`` sets before encoding (truncation or padding enabled, ``split_special_tokens``
    switched): ``__call__`` resets that state; the direct call must not read past it.
    """
    try:
        backend = hf_compat.backend_class()
    except hf_compat.TransformersCompatError as e:  # the tokenizer alone
        logger.debug("tokenizer: its own __call__ (%s)", e)
        return None
    cls = type(tokenizer)
    if not isinstance(tokenizer, backend) or any(
        getattr(cls, name) is not getattr(backend, name) for name in hf_compat.BACKEND_METHODS
    ):
        return None
    encode = _BackendEncoder(tokenizer)
    special = "".join(str(t) for t in tokenizer.all_special_tokens)
    probe = f"A b\n\n  c{special}d \u00e9\u200b{special[:3]} "
    try:
        same = all(encode(probe, flag) == encode.slow(probe, flag) for flag in (False, True))
    except Exception:
        return None
    return encode if same else None


def span_mask(
    offsets: list[tuple[int, int]],
    shifts: list[tuple[int, int]],
    spans: list[tuple[int, int]],
    weight: float,
) -> list[float]:
    """Loss weight on every token overlapping a trained character span of the rendered text
    (spans moved past expanded image placeholders, as the processor moves them: ``shifts`` are
    ``(end of the placeholder, characters it gained)``); 0 elsewhere."""
    ends = [end for end, _ in shifts]
    gained = [0]
    for _, g in shifts:
        gained.append(gained[-1] + g)
    token_ends = [e for _, e in offsets]
    mask = [0.0] * len(offsets)
    for start, end in spans:
        start += gained[bisect.bisect_right(ends, start)]
        end += gained[bisect.bisect_right(ends, end - 1)]
        for i in range(bisect.bisect_right(token_ends, start), len(offsets)):
            token_start, token_end = offsets[i]
            if token_start >= end:
                break
            if token_end > start and token_end > token_start:
                mask[i] = weight
    return mask
