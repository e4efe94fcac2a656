"""How data and errors appear in messages and log lines: cut short, never flooding a log.

Every message that quotes a sample's text, key or an exception uses these (one limit, one
shape), so a run's log stays small whatever the data holds.
"""

from __future__ import annotations

from typing import Any

__all__ = ["LIMIT", "Skip", "cut", "describe", "quote"]

#: Characters of a quoted value, key or error detail in a message or log line.
LIMIT = 300


class Skip(Exception):
    """A sample that is skipped: ``reason`` (a skip-report key, ``stats.REASONS``), ``detail``
    (what, with numbers) and, for an over-long one, its ``cost`` in tokens. The one type every
    skip travels as, from reading a shard to emitting a pack."""

    def __init__(self, reason: str, detail: str, *, cost: int | None = None):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
        self.cost = cost

    def __reduce__(self) -> tuple:  # pickled across loader workers with its fields
        return (_skip, (self.reason, self.detail, self.cost))


def _skip(reason: str, detail: str, cost: int | None) -> Skip:
    return Skip(reason, detail, cost=cost)


def cut(text: str, limit: int = LIMIT) -> str:
    """``text``, or its first ``limit`` characters and how long it was."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} chars)"


def quote(value: Any, limit: int = LIMIT) -> str:
    """``repr(value)`` cut to about ``limit`` characters (huge strings are never repr'd whole)."""
    text = str(value)
    shown = repr(value) if len(text) <= 4 * limit else repr(text[: 4 * limit])
    return shown if len(shown) <= limit else f"{shown[:limit]}... ({len(text):,} chars)"


def describe(error: BaseException, limit: int = LIMIT) -> str:
    """``"TypeName: message"`` of an exception, the message cut to ``limit`` characters."""
    return f"{type(error).__name__}: {cut(str(error).strip(), limit)}"
