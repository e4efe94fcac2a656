"""A conversation document -> turns of text and image references (format-agnostic).

Both content styles are read: a string with ``<image>`` placeholders (LLaVA style) or a list of
``{"type": "text", "text": ...}`` / ``{"type": "image", "image": name}`` parts (Hugging Face
style). Images are resolved against the document's ``images`` list. Every problem is a
:class:`Skip` with a skip-report reason. Pure: no Energon, no torch.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from energon_packing.config import Limits
from energon_packing.encoding.images import may_be_image, probe
from energon_packing.errors import Skip, quote
from energon_packing.packing.algorithms import round_up

if TYPE_CHECKING:
    from energon_packing.config import PackingConfig

__all__ = [
    "IMAGE_PLACEHOLDER",
    "MAX_LOSS_WEIGHT",
    "MIN_LOSS_WEIGHT",
    "ROLES",
    "WHOLE_MESSAGES",
    "Conversation",
    "ImageRefs",
    "Limits",
    "OverlongError",
    "Skip",
    "Turn",
    "brief",
    "check_loss_weight",
    "fit_to_capacity",
    "image_sizes",
    "parse_turns",
    "read_conversation",
    "trained_turns",
]

ROLES = ("system", "user", "assistant")
IMAGE_PLACEHOLDER = "<image>"

#: ``(role, pieces)``: a piece is text, or the index of an image in the document's list.
Turn = tuple[str, list[str | int]]


#: UTF-16 surrogates cannot be encoded; JSON's "\ud800" escapes produce them in Python strings.
_SURROGATE = re.compile("[\ud800-\udfff]")
#: Characters of a value quoted in a message or a log line.
BRIEF = 120
#: ``train_on`` values that train whole rendered messages (role header, trailing newline too).
WHOLE_MESSAGES = ("assistant_messages", "last_assistant_message")
#: The largest loss weight a sample (times its subflavor's) may carry.
MAX_LOSS_WEIGHT = 1000.0
#: The smallest: float32's (and bf16's) smallest normal number; below it a weight is 0 in bf16.
MIN_LOSS_WEIGHT = float(np.finfo(np.float32).tiny)


def brief(value: Any, limit: int = BRIEF) -> str:
    """:func:`energon_packing.errors.quote` at the shorter limit of a skip detail."""
    return quote(value, limit)


class OverlongError(ValueError):
    """``overlong="error"``: a conversation does not fit the pack width."""


class ImageRefs:
    """Resolves image references (``<image>`` placeholders in order, or parts by name)."""

    def __init__(self, names: Sequence[str], *, max_images: int | None = None):
        if max_images is not None and len(names) > max_images:
            raise Skip(
                "too_many_images",
                f"{len(names)} images listed, more than max_images={max_images}",
            )
        self.names = list(names)
        self.index: dict[str, int] = {}
        for i, name in enumerate(self.names):
            if name in self.index:
                raise Skip("duplicate_image", f"image {brief(name)} is listed twice in 'images'")
            self.index[name] = i
        self.used = [False] * len(self.names)
        self.order: list[int] = []
        self._next = 0

    def take(self, name: str | None) -> int:
        if name is None:
            while self._next < len(self.names) and self.used[self._next]:
                self._next += 1
            if self._next == len(self.names):
                raise Skip(
                    "placeholder_mismatch",
                    f"more image references than the {len(self.names)} image(s) in 'images'",
                )
            i = self._next
        else:
            if name not in self.index:
                raise Skip("missing_image", f"image part {brief(name)} is not in the 'images' list")
            i = self.index[name]
            if self.used[i]:
                raise Skip("duplicate_image", f"image {brief(name)} is referenced twice")
        self.used[i] = True
        self.order.append(i)
        return i

    def check_all_used(self) -> None:
        unused = [n for n, u in zip(self.names, self.used) if not u]
        if unused:
            raise Skip(
                "placeholder_mismatch",
                f"{len(self.names)} image(s) listed but {len(unused)} never referenced "
                f"({brief(', '.join(map(str, unused)))}); add an {IMAGE_PLACEHOLDER} or an "
                f"image part",
            )


def parse_turns(
    messages: Sequence[Any], images: ImageRefs, *, limits: Limits | None = None
) -> list[Turn]:
    """Messages -> ``[(role, pieces)]`` where a piece is text or an image index.

    With ``limits``, the turn count is checked before anything is read and the text length as it
    is read, so a hostile conversation costs at most ``limits`` of work before its rejection.
    """
    if not messages:
        raise Skip("empty_conversation", "'messages' is empty")
    if limits is not None and len(messages) > limits.max_turns:
        raise Skip(
            "too_many_turns", f"{len(messages):,} messages, more than max_turns={limits.max_turns}"
        )
    budget = limits.max_text_chars if limits is not None else None
    chars = 0
    turns = []
    for m, message in enumerate(messages):
        if not isinstance(message, dict) or "role" not in message or "content" not in message:
            raise Skip("malformed_message", f"messages[{m}] needs 'role' and 'content'")
        role, content = message["role"], message["content"]
        if not isinstance(role, str) or role not in ROLES:
            raise Skip(
                "unknown_role", f"messages[{m}] has role {brief(role)}; valid: {', '.join(ROLES)}"
            )
        pieces: list[str | int] = []
        if isinstance(content, str):
            chars = _count(chars + len(content), budget, m)  # before split copies anything
            texts = content.split(IMAGE_PLACEHOLDER)
            for k, text in enumerate(texts):
                if k:
                    pieces.append(images.take(None))
                if text:  # "<image>\nWhat?" is [image, "\nWhat?"], as a parts list writes it
                    pieces.append(_text(text, m))
        elif isinstance(content, list):
            for p, part in enumerate(content):
                kind = part.get("type") if isinstance(part, dict) else None
                if kind == "text" and isinstance(part.get("text"), str):
                    chars = _count(chars + len(part["text"]), budget, m)
                    pieces.append(_text(part["text"], m))
                elif kind == "image" and isinstance(part.get("image", ""), str):
                    pieces.append(images.take(part.get("image")))
                else:
                    raise Skip(
                        "malformed_message",
                        f"messages[{m}].content[{p}] must be {{'type': 'text', 'text': str}} or "
                        f"{{'type': 'image', 'image': name}}",
                    )
        else:
            raise Skip("malformed_message", f"messages[{m}].content is {type(content).__name__}")
        turns.append((role, pieces))
    images.check_all_used()
    return turns


def _count(chars: int, budget: int | None, m: int) -> int:
    if budget is not None and chars > budget:
        raise Skip(
            "text_too_long",
            f"more than max_text_chars={budget:,} characters of text by messages[{m}]; raise "
            f"max_text_chars if such conversations fit the pack",
        )
    return chars


def _text(text: str, m: int) -> str:
    bad = _SURROGATE.search(text)
    if bad:
        raise Skip(
            "invalid_text",
            f"messages[{m}] holds a lone UTF-16 surrogate ({bad.group()!a}) at character "
            f"{bad.start()}, which no tokenizer can encode",
        )
    return text


def check_loss_weight(weight: Any) -> float:
    """``weight`` as a float that is finite, > 0 and <= :data:`MAX_LOSS_WEIGHT` also in
    float32 (``token_mask``'s dtype) and a normal float32 (a subnormal such as 1e-45 is 0 in
    bf16), else :class:`Skip` ``bad_loss_weight``."""
    try:
        value = float(weight)
        with np.errstate(over="ignore", under="ignore"):
            narrow = float(np.float32(value))
        ok = not isinstance(weight, bool) and MIN_LOSS_WEIGHT <= narrow <= MAX_LOSS_WEIGHT
    except (TypeError, ValueError, OverflowError):
        ok = False
    if not ok:
        raise Skip(
            "bad_loss_weight",
            f"loss_weight {brief(weight)} must be a number >= {MIN_LOSS_WEIGHT:.3g} (the "
            f"smallest normal float32; smaller ones are 0 in bf16) and <= {MAX_LOSS_WEIGHT:g} "
            f"(also as float32: tiny values round to 0, huge ones to inf)",
        )
    return value


def trained_turns(roles: Sequence[str], train_on: str) -> set[int]:
    """Indices of the turns whose tokens train: every assistant turn, or only the last."""
    trained = [t for t, role in enumerate(roles) if role == "assistant"]
    if not trained:
        raise Skip("no_assistant_turn", "no message has role 'assistant', nothing to train on")
    return set(trained[-1:] if train_on.startswith("last_") else trained)


@dataclass(kw_only=True, slots=True)
class Conversation:
    """A document's checked turns: what every chat layout starts from."""

    weight: float
    refs: ImageRefs
    turns: list[Turn]
    #: indices into ``turns`` whose tokens train (``train_on``)
    trained: set[int]


def read_conversation(
    *,
    messages: Sequence[Any],
    image_names: Sequence[str],
    loss_weight: Any,
    config: PackingConfig,
    find_special: Callable[[str], str | None],
) -> Conversation:
    """The checks every layout shares, bounded by ``config.limits``, before any tokenizing:
    loss weight, image references, turns, a trained turn with text, and (with
    ``special_token_text="skip"``) no text spelling a special token (``find_special``)."""
    weight = check_loss_weight(loss_weight)
    limits = config.limits  # built on each access
    refs = ImageRefs(image_names, max_images=limits.max_images)
    turns = parse_turns(messages, refs, limits=limits)
    trained = trained_turns([role for role, _ in turns], config.train_on)
    if not any(isinstance(p, str) and p.strip() for t in trained for p in turns[t][1]):
        raise Skip("empty_assistant", "the trained assistant turn(s) hold no text")
    if config.special_token_text == "skip":
        for m, (_, pieces) in enumerate(turns):
            for piece in pieces:
                if isinstance(piece, str) and (found := find_special(piece)):
                    raise Skip(
                        "special_token_text",
                        f"messages[{m}] spells the special token {found!r} "
                        f"(special_token_text='skip'; 'text' tokenizes it as plain text)",
                    )
    return Conversation(weight=weight, refs=refs, turns=turns, trained=trained)


def image_sizes(
    refs: ImageRefs,
    *,
    image_names: Sequence[str],
    images: Mapping[str, bytes],
    max_pixels: int | None,
) -> list[tuple[int, int]]:
    """``(width, height)`` of each referenced image in order of appearance, from its header
    (nothing decoded); a missing, unreadable or over-budget image is a :class:`Skip`."""
    sizes = []
    for i in refs.order:
        name = image_names[i]
        if name not in images:
            raise Skip(
                "missing_image", f"image {brief(name)} is listed but {_why_absent(name, images)}"
            )
        try:
            sizes.append(probe(images[name], max_pixels=max_pixels))
        except Skip as e:
            raise Skip(e.reason, f"image {brief(name)}: {e.detail}") from None
    return sizes


def _why_absent(name: str, images: Mapping[str, bytes]) -> str:
    if "/" in name:  # WebDataset's rule: the key is everything before the file name's first dot
        return "a part name cannot hold '/' (the tar member would belong to another key)"
    if not may_be_image(name):
        suffix = name.rpartition(".")[2]
        return (
            f"parts named *.{brief(suffix, 40)[1:-1]} are never read as images (NOT_IMAGE_SUFFIXES)"
        )
    return f"the shard sample has no such part (its image parts: {brief(sorted(images))})"


def fit_to_capacity(
    encoding: Any, *, key: str, media_end: Callable[[], int], config: PackingConfig
) -> Any:
    """Applies the ``overlong`` policy to an encoding (``input_ids``, ``token_mask``,
    ``truncated``); the packing cost is computed on the result. Truncation cuts in place and
    never cuts an image: ``media_end()`` (asked only when cutting) is the token its images end
    at."""
    capacity, multiple = config.max_input_seq_length, config.pad_multiple
    length = len(encoding.input_ids)
    cost = round_up(length, multiple)
    if cost <= capacity:
        return encoding
    what = (
        f"{length} tokens ({cost} padded to pad_multiple={multiple}) > "
        f"max_input_seq_length={capacity}"
    )
    if config.overlong == "error":
        raise OverlongError(
            f"sample {brief(key)}: {what}. Set overlong='truncate' or 'drop', or raise "
            f"max_input_seq_length"
        )
    if config.overlong == "drop":
        raise Skip("overlong", what, cost=cost)
    if (end := media_end()) > capacity:
        raise Skip(
            "overlong_media",
            f"{what}; its images end at token {end} and images are never cut",
        )
    if not any(w > 0 for w in encoding.token_mask[:capacity]):
        raise Skip(
            "overlong_no_trained_token", f"{what}; the first {capacity} tokens train nothing"
        )
    encoding.truncated = length - capacity
    del encoding.input_ids[capacity:]
    del encoding.token_mask[capacity:]
    return encoding
