"""Why a convert converted nothing, or too little, in one line: the reasons, the first
rejected record's keys next to what the format reads, and the ``--format`` / ``--columns``
that would read it when another reader does (tried on the records' shapes, no media read)."""

from __future__ import annotations

from typing import Any

from energon_packing.errors import Skip
from energon_packing.incoming.columns import COLUMNS
from energon_packing.incoming.media import VIDEO_EXTENSIONS, suffix_of
from energon_packing.incoming.records import FORMATS, NEEDS
from energon_packing.incoming.reshape import How, read_record
from energon_packing.incoming.sources import Broken

__all__ = ["TRIED", "why"]

#: Rejected records kept to try the other readers on (:func:`why`).
TRIED = 20
#: A single-turn record's prompt and answer under other names (VQA's question / answer, R1-style
#: problem / solution, prompt / completion, ...): tried as ``--columns query=...,response=...``.
PROMPT_KEYS = ("question", "prompt", "problem", "human", "user", "instruction")
ANSWER_KEYS = ("answer", "response", "completion", "solution", "gpt", "assistant", "output")


def why(result: Any, rejected: list, how: How, min_converted: float) -> str:
    """One line: what was converted of what was read, the reasons, the first rejected record's
    keys next to what the format reads, and the ``--format`` / ``--columns`` that read the
    rejected records when another reader does."""
    reasons = ", ".join(
        f"{r} {n:,}" for r, n in sorted(result.reported.items(), key=lambda x: -x[1])
    )
    line = f"converted {result.converted:,} of {result.read:,} records read"
    if result.converted:
        line += f", less than --min-converted {min_converted:g} of them"
    line += f" ({reasons or 'no record in the source'})"
    if rejected:
        file, index, record, error = rejected[0]
        if isinstance(record, dict):
            has = f"has keys {', '.join(map(repr, record)) or 'none'}"
        elif isinstance(record, Broken):
            has = "does not read"
        else:
            has = f"is {type(record).__name__}, not an object"
        line += f"; the first rejected, {file} index {index}, {has}"
        if not error.detail.startswith("the record has keys"):
            line += f" ({error.reason}: {_short(error.detail)})"
        if error.reason == "malformed_record" and isinstance(record, dict):
            line += f"; --format {how.format} reads {NEEDS[how.format]}"
            if how.columns:
                line += f" with --columns {_columns_flag(how.columns)}"
            line += f"; {_suggest(rejected, how)}"
    return line


def _short(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _columns_flag(columns: dict[str, str]) -> str:
    return ",".join(f"{name}={key}" for name, key in columns.items())


def _stub(source: Any, kind: str, *, record_id: Any = None) -> tuple[bytes, str]:
    """A media loader that reads nothing: tries a reader on a record's shape alone."""
    return b"", ".mp4" if kind == "video" else ".jpg"


def _suggest(rejected: list, how: How) -> str:
    """The ``--format`` / ``--columns`` that read the most of ``rejected`` (shape only, no
    media read), when that beats the ones used."""
    records = [record for _, _, record, _ in rejected if isinstance(record, dict)]
    if not records:
        return "no other --format reads a record that is not an object"

    def reads(candidate: How) -> int:
        count = 0
        for record in records:
            try:
                read_record(record, candidate, _stub)
                count += 1
            except Skip:
                pass
        return count

    guessed = {**how.columns, **_guess_columns(records[0])}
    candidates = [
        How(format=fmt, columns=cols, tags=how.tags)
        for cols in ([how.columns, guessed] if guessed != how.columns else [how.columns])
        for fmt in ("auto", *FORMATS)
    ]
    now = reads(how)
    best, count = max(((c, reads(c)) for c in candidates), key=lambda pair: pair[1])
    if count <= now:
        return "no other --format or --columns reads them"
    flags = [f"--format {best.format}"] if best.format != how.format else []
    if best.columns != how.columns:
        flags.append(f"--columns {_columns_flag(best.columns)}")
    flags = " ".join(flags)
    return f"{flags} reads {count} of the first {len(records)} rejected"


def _guess_columns(record: dict) -> dict[str, str]:
    """The columns a record's unknown keys look like: a list of turns, a list of media."""
    guessed: dict[str, str] = {}
    for key, value in record.items():
        if key in COLUMNS or key in ("image", "video", "conversations", "conversation"):
            continue
        items = value if isinstance(value, list) else [value]
        if items and all(
            isinstance(t, dict) and ({"from", "role", "human"} & set(t)) for t in items
        ):
            guessed.setdefault("messages", key)
        elif items and all(_looks_like_media(m) for m in items):
            kind = (
                "videos"
                if any(
                    str(m).lower().endswith(tuple(f".{e}" for e in VIDEO_EXTENSIONS)) for m in items
                )
                else "images"
            )
            guessed.setdefault(kind, key)
    prompt = _first_text(record, PROMPT_KEYS)
    answer = _first_text(record, ANSWER_KEYS)
    if prompt and answer and prompt != answer:
        for name, key in (("query", prompt), ("response", answer)):
            if key != name:  # a key already under its own name needs no mapping
                guessed.setdefault(name, key)
        for name, key in (("images", "image"), ("videos", "video")):
            if key in record and name not in record:  # the pair readers read only the plural
                guessed.setdefault(name, key)
    return guessed


def _first_text(record: dict, names: tuple[str, ...]) -> str | None:
    """The first of ``names`` (any case) whose value in ``record`` is a string."""
    lowered = {key.lower(): key for key in record}
    for name in names:
        key = lowered.get(name)
        if key is not None and isinstance(record[key], str):
            return key
    return None


def _looks_like_media(value: Any) -> bool:
    if isinstance(value, dict):
        return "bytes" in value or "path" in value
    return isinstance(value, str) and bool(suffix_of(value)) and "\n" not in value
