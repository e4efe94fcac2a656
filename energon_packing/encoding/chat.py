"""A conversation document -> turns of text and image references (format-agnostic).

Both content styles are read: a string with ``<image>`` placeholders (LLaVA style) or a list of
``{"type": "text", "text": ...}`` / ``{"type": "image", "image": name}`` parts (Hugging Face
style). Images are resolved against the document's ``images`` list. Every problem is a
:class:`Skip` with a skip-report reason. Pure: no Energon, no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = [
    "IMAGE_PLACEHOLDER",
    "ROLES",
    "ImageRefs",
    "OverlongError",
    "Skip",
    "Turn",
    "parse_turns",
]

ROLES = ("system", "user", "assistant")
IMAGE_PLACEHOLDER = "<image>"

#: ``(role, pieces)``: a piece is text, or the index of an image in the document's list.
Turn = tuple[str, list[str | int]]


class Skip(Exception):
    """A conversation that is skipped, counted under ``reason`` (a skip-report key)."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class OverlongError(ValueError):
    """``overlong="error"``: a conversation does not fit the pack width."""


class ImageRefs:
    """Resolves image references (``<image>`` placeholders in order, or parts by name)."""

    def __init__(self, names: Sequence[str]):
        self.names = list(names)
        self.index: dict[str, int] = {}
        for i, name in enumerate(self.names):
            if name in self.index:
                raise Skip("duplicate_image", f"image {name!r} is listed twice in 'images'")
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
                raise Skip("missing_image", f"image part {name!r} is not in the 'images' list")
            i = self.index[name]
            if self.used[i]:
                raise Skip("duplicate_image", f"image {name!r} is referenced twice")
        self.used[i] = True
        self.order.append(i)
        return i

    def check_all_used(self) -> None:
        unused = [n for n, u in zip(self.names, self.used) if not u]
        if unused:
            raise Skip(
                "placeholder_mismatch",
                f"{len(self.names)} image(s) listed but {len(unused)} never referenced "
                f"({', '.join(map(repr, unused))}); add an {IMAGE_PLACEHOLDER} or an image part",
            )


def parse_turns(messages: Sequence[Any], images: ImageRefs) -> list[Turn]:
    """Messages -> ``[(role, pieces)]`` where a piece is text or an image index."""
    if not messages:
        raise Skip("empty_conversation", "'messages' is empty")
    turns = []
    for m, message in enumerate(messages):
        if not isinstance(message, dict) or "role" not in message or "content" not in message:
            raise Skip("malformed_message", f"messages[{m}] needs 'role' and 'content'")
        role, content = message["role"], message["content"]
        if role not in ROLES:
            raise Skip(
                "unknown_role", f"messages[{m}] has role {role!r}; valid: {', '.join(ROLES)}"
            )
        pieces: list[str | int] = []
        if isinstance(content, str):
            texts = content.split(IMAGE_PLACEHOLDER)
            for k, text in enumerate(texts):
                if k:
                    pieces.append(images.take(None))
                pieces.append(text)
        elif isinstance(content, list):
            for p, part in enumerate(content):
                kind = part.get("type") if isinstance(part, dict) else None
                if kind == "text" and isinstance(part.get("text"), str):
                    pieces.append(part["text"])
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
