"""The one reader of a conversation's turns as users write them: LLaVA / ShareGPT /
InternVL's ``{"from", "value"}``, OpenAI's ``{"role", "content"}`` and ms-swift's ``{"human",
"assistant"}`` pairs, and ms-swift's / LLaMA-Factory's query-response rows. ``convert`` reads
records with it, the loader a shard document's LLaVA ``conversations``."""

from __future__ import annotations

from typing import Any

from energon_packing.encoding.chat import SPEAKER_ROLES
from energon_packing.errors import Skip

__all__ = ["TURN_KEYS", "listed", "pairs", "read_turns", "turn_key", "with_system"]

#: Tool turns (LLaMA-Factory's function_call / observation, ms-swift's tool_call / tool): not
#: packed yet, reported ``unsupported_field``.
_TOOL_ROLES = ("function_call", "observation", "tool", "tool_call", "tool_response", "function")

#: Where a record's turns are, in the order looked for.
TURN_KEYS = ("messages", "conversations", "conversation")


def turn_key(record: dict) -> str | None:
    """The key of a record's turns (the first of :data:`TURN_KEYS` present)."""
    return next((key for key in TURN_KEYS if key in record), None)


def listed(value: Any, what: str) -> list:
    """``value`` as a list: none is empty, one item is a list of it."""
    if value is None:
        return []
    if isinstance(value, (str, dict, bytes)):
        return [value]
    if isinstance(value, list):
        return value
    raise Skip("malformed_record", f"'{what}' is {type(value).__name__}, not a list")


def _role(speaker: Any, where: str, malformed: str) -> str:
    role = SPEAKER_ROLES.get(speaker) if isinstance(speaker, str) else None
    if role is not None:
        return role
    if speaker in _TOOL_ROLES:
        raise Skip(
            "unsupported_field",
            f"{where} is a {speaker!r} turn: tool calls are not packed yet; convert the "
            "records without them",
        )
    raise Skip(
        malformed,
        f"{where}: the speaker is {speaker!r}, not one of {', '.join(SPEAKER_ROLES)} "
        "(map yours with `energon-packing convert --dataset-info`'s tags)",
    )


def read_turns(
    value: Any, *, key: str, malformed: str = "malformed_record"
) -> list[tuple[str, Any]]:
    """The turns under a record's ``key`` as ``(role, content)``: each one ``from``/``value``,
    ``role``/``content`` or ms-swift's ``{"human", "assistant"}`` pair.

    Raises:
        Skip: ``malformed`` (``convert``'s ``malformed_record``, the loader's
            ``malformed_message``) for a turn of another shape, ``unsupported_field`` for a
            tool turn, ``empty_conversation`` for no turn.
    """
    if not isinstance(value, list):
        raise Skip(malformed, f"'{key}' is {type(value).__name__}, not a list")
    if not value:
        raise Skip("empty_conversation", f"'{key}' is empty: no turn to train on")
    turns: list[tuple[str, Any]] = []
    for i, turn in enumerate(value):
        where = f"{key}[{i}]"
        if not isinstance(turn, dict):
            raise Skip(malformed, f"{where} is {type(turn).__name__}")
        speaker = turn.get("from") if turn.get("from") is not None else turn.get("role")
        if speaker is not None:
            content = turn.get("value") if turn.get("value") is not None else turn.get("content")
            if not isinstance(content, (str, list)):
                raise Skip(
                    malformed,
                    f"{where} has no string 'value' / 'content' (keys {', '.join(turn)})",
                )
            turns.append((_role(speaker, where, malformed), content))
        elif "human" in turn or "assistant" in turn:  # ms-swift: {"human", "assistant"} pairs
            for speaker in ("human", "assistant"):
                if isinstance(turn.get(speaker), str):
                    turns.append((SPEAKER_ROLES[speaker], turn[speaker]))
        else:
            raise Skip(
                malformed,
                f"{where} has keys {', '.join(map(repr, turn))}, none of 'from' / 'role' / "
                "'human' (map them with `energon-packing convert --dataset-info`'s tags)",
            )
    return turns


def with_system(record: dict, turns: list) -> list:
    """``turns`` after the record's ``system`` string, unless they begin with a system turn."""
    if isinstance(record.get("system"), str) and record["system"] and turns[0][0] != "system":
        return [("system", record["system"]), *turns]
    return turns


def pairs(record: dict, prompt: str, answer: str) -> list[tuple[str, str]]:
    """ms-swift's query / response (LLaMA-Factory's alpaca: instruction + input / output) with
    the ``history`` of ``[q, r]`` pairs before them."""
    turns = []
    for i, pair in enumerate(listed(record.get("history"), "history")):
        if not (
            isinstance(pair, list) and len(pair) == 2 and all(isinstance(t, str) for t in pair)
        ):
            raise Skip("malformed_record", f"history[{i}] is not a [query, response] pair")
        turns += [("user", pair[0]), ("assistant", pair[1])]
    query, response = record.get(prompt), record.get(answer)
    if prompt == "instruction" and isinstance(record.get("input"), str) and record["input"]:
        query = f"{query}\n{record['input']}" if query else record["input"]
    if not isinstance(query, str) or not isinstance(response, str):
        raise Skip(
            "malformed_record",
            f"'{prompt}' and '{answer}' must be strings (they are {type(query).__name__} and "
            f"{type(response).__name__})",
        )
    return with_system(record, [*turns, ("user", query), ("assistant", response)])
