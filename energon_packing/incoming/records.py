"""What users' multimodal SFT records look like, turned into our conversation document.

One record in, one document out (``{"messages": [...], "images": [...], "videos": [...]}``
plus the media to store beside it), or :class:`RecordError` with a report reason. The shapes
read (``--format auto`` picks one per record; the explicit formats read the same shapes, each
from the keys in :data:`NEEDS`):

* turns under ``conversations``, ``messages`` or ``conversation``, each turn written as
  LLaVA / ShareGPT / InternVL write it (``{"from": "human"|"gpt"|"system", "value"}``), as
  OpenAI / ms-swift / LLaMA-Factory / Mantis / qwen-vl-utils / TRL write it (``{"role",
  "content": str | [parts]}``, parts ``text``, ``image`` (a path, a URL, a ``{"bytes",
  "path"}`` entry, or TRL's ``{"index": k}`` into ``images``), ``image_url``, ``video``), or as
  ms-swift's pairs (``{"human", "assistant"}``); media listed under ``image`` / ``images`` and
  ``video`` / ``videos``; a ``system`` string;
* ms-swift's query-response rows (``query``, ``response``, ``history`` of ``[q, r]`` pairs,
  ``system``) and LLaMA-Factory's alpaca rows (``instruction``, ``input``, ``output``,
  ``history``, ``system``);
* the_cauldron's ``images`` + ``texts`` (``[{"user", "assistant"}]``; every image in the first
  user turn).

Content is carried, never invented: no system prompt is added, ``human`` -> ``user``, ``gpt`` ->
``assistant``, each image stays in the turn that names it (``<image>`` placeholders become image
parts in place; a record with images but no placeholder gets them at the start of its first
user turn, where LLaVA's own preprocessing puts them), image bytes are copied as they are. What
we do not pack is reported, never dropped from a record that is then packed without it: audio
(``unsupported_media``), ms-swift's grounding ``objects`` and their ``<ref-object>`` /
``<bbox>`` tags, tool turns (``unsupported_field``), media behind a URL (``remote_media``).
``<video>`` (``<audio>``) in a record that lists no video (audio) is text: an HTML question.
"""

from __future__ import annotations

import base64
import io
import json
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from energon_packing.encoding.chat import SPEAKER_ROLES

__all__ = [
    "COLUMNS",
    "FORMATS",
    "NEEDS",
    "REPORT_REASONS",
    "Converted",
    "RecordError",
    "detect_format",
    "map_columns",
    "parse_columns",
    "to_document",
]

FORMATS = ("llava", "sharegpt", "messages", "hf", "swift", "alpaca")
#: What each format reads (a rejected record's report names it next to the keys it has).
_TURNS = "turns under 'conversations' / 'messages' / 'conversation'"
NEEDS = {
    "llava": f"{_TURNS}, media under 'image(s)' / 'video(s)'",
    "sharegpt": f"{_TURNS}, media under 'images' / 'videos'",
    "messages": f"{_TURNS}, media under 'images' / 'videos' or in content parts",
    "hf": f"{_TURNS}, or 'texts' + 'images' (the_cauldron)",
    "swift": f"{_TURNS}, or 'query' + 'response' (+ 'history', 'system')",
    "alpaca": "'instruction' + 'output' (+ 'input', 'history', 'system')",
    "auto": f"{_TURNS}, 'query' + 'response', 'instruction' + 'output', or 'texts' + 'images'",
}
REPORT_REASONS = (
    "missing_image",
    "unreadable_image",
    "missing_video",
    "unreadable_video",
    "remote_media",
    "unsupported_media",
    "unsupported_field",
    "empty_conversation",
    "malformed_record",
)
IMAGE, VIDEO, AUDIO = "<image>", "<video>", "<audio>"
_PLACEHOLDERS = {"image": IMAGE, "video": VIDEO}
#: Tool turns (LLaMA-Factory's function_call / observation, ms-swift's tool_call / tool): not
#: packed yet, reported ``unsupported_field``.
_TOOL_ROLES = ("function_call", "observation", "tool", "tool_call", "tool_response", "function")
#: Where a record's turns are, in the order looked for.
_TURN_KEYS = ("messages", "conversations", "conversation")
#: ms-swift's grounding tags, filled from its ``objects`` field.
_GROUNDING = re.compile(r"<ref-object>|<bbox>")
#: The names ``columns`` may map a record's keys to (``image`` / ``video`` read as the plural).
COLUMNS = (
    "messages", "images", "videos", "audios", "system", "query", "response", "history",
    "instruction", "input", "output", "objects", "texts", "id",
)  # fmt: skip
#: LLaMA-Factory's ``tags`` (dataset_info.json): how its turns spell roles and text.
_TAGS = (
    "role_tag", "content_tag", "user_tag", "assistant_tag", "system_tag", "observation_tag",
    "function_tag",
)  # fmt: skip


class RecordError(Exception):
    """A record that is reported, not converted: ``reason`` (one of :data:`REPORT_REASONS`)."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail = reason, detail


@dataclass(kw_only=True, slots=True)
class Converted:
    """A record as our document and the parts to store beside it (part name -> bytes)."""

    document: dict
    parts: dict[str, bytes] = field(default_factory=dict)
    id: Any = None


def parse_columns(spec: str | Mapping[str, str] | None) -> dict[str, str]:
    """``messages=conv,images=imgs`` (or that mapping), or ms-swift's JSON ``{"conv":
    "messages"}`` (the record's key first) -> ``{name: the record's key}``.

    Raises:
        ValueError: a name not in :data:`COLUMNS`, or a pair that is not ``name=key``.
    """
    if not spec:
        return {}
    if isinstance(spec, str) and spec.lstrip().startswith("{"):
        try:
            swift = json.loads(spec)
        except ValueError as e:
            raise ValueError(f"--columns {spec!r} is not JSON ({e})") from None
        pairs = {str(name): str(key) for key, name in swift.items()}
    elif isinstance(spec, str):
        pairs = {}
        for item in filter(None, (s.strip() for s in spec.split(","))):
            name, sep, key = item.partition("=")
            if not sep or not name.strip() or not key.strip():
                raise ValueError(f"--columns {item!r} is not NAME=KEY (e.g. messages=conv)")
            pairs[name.strip()] = key.strip()
    else:
        pairs = dict(spec)
    out = {}
    for name, key in pairs.items():
        name = {"image": "images", "video": "videos", "audio": "audios"}.get(name, name)
        name = "messages" if name in ("conversations", "conversation") else name
        if name not in COLUMNS:
            flipped = f" (did you mean {key}={name}? NAME=KEY: ours, then the record's)"
            raise ValueError(
                f"--columns names {name!r}, which is none of {', '.join(COLUMNS)}"
                + (flipped if key in COLUMNS else "")
            )
        out[name] = key
    return out


def map_columns(
    record: Any, columns: Mapping[str, str] | None = None, tags: Mapping[str, str] | None = None
) -> Any:
    """``record`` with its keys renamed as ``columns`` says (``{name: the record's key}``) and
    its turns' role and text keys and role values as LLaMA-Factory's ``tags`` say."""
    if not isinstance(record, dict) or not (columns or tags):
        return record
    out = dict(record)
    for name, key in (columns or {}).items():
        if key in record and key != name:
            out.pop(key, None)
            if name == "messages":  # the mapped turns, not another key's
                for other in _TURN_KEYS:
                    out.pop(other, None)
            out[name] = record[key]
    if tags and isinstance(out.get(_turn_key(out)), list):
        out[_turn_key(out)] = [_tagged(turn, tags) for turn in out[_turn_key(out)]]
    return out


def _tagged(turn: Any, tags: Mapping[str, str]) -> Any:
    if not isinstance(turn, dict):
        return turn
    role_tag, content_tag = tags.get("role_tag", "from"), tags.get("content_tag", "value")
    if role_tag not in turn:
        return turn
    speakers = {
        tags.get("user_tag", "human"): "user",
        tags.get("assistant_tag", "gpt"): "assistant",
        tags.get("system_tag", "system"): "system",
        tags.get("observation_tag", "observation"): "observation",
        tags.get("function_tag", "function_call"): "function_call",
    }
    speaker = turn[role_tag]
    rest = {k: v for k, v in turn.items() if k not in (role_tag, content_tag)}
    return {**rest, "role": speakers.get(speaker, speaker), "content": turn.get(content_tag)}


def _turn_key(record: dict) -> str | None:
    """The key of a record's turns (the first of :data:`_TURN_KEYS` present)."""
    return next((key for key in _TURN_KEYS if key in record), None)


def detect_format(record: Any) -> str:
    """The format a record is written in (what ``--format auto`` picks, record by record)."""
    if isinstance(record, dict):
        if "texts" in record and "images" in record:
            return "hf"
        if isinstance(record.get("conversations"), list):
            return "llava"
        if isinstance(record.get("messages"), list) or isinstance(record.get("conversation"), list):
            return "messages"
        if "query" in record and "response" in record:
            return "swift"
        if "instruction" in record and "output" in record:
            return "alpaca"
    raise RecordError("malformed_record", f"{_has(record)}; auto reads {NEEDS['auto']}")


def _has(record: Any) -> str:
    """What a rejected record holds: its keys (the report row lists them too)."""
    if not isinstance(record, dict):
        return f"a record is {type(record).__name__}, not an object"
    return f"the record has keys {', '.join(map(repr, record)) or 'none'}"


class _Media:
    """Collects a record's images and videos as parts, in order of first use."""

    def __init__(self, load: Callable[[Any, str], tuple[bytes, str]]):
        self.load = load
        self.parts: dict[str, bytes] = {}
        self.images: list[str] = []
        self.videos: list[str] = []

    def add(self, source: Any, kind: str) -> str:
        data, suffix = self.load(source, kind)
        names = self.images if kind == "image" else self.videos
        name = f"{'img' if kind == 'image' else 'vid'}{len(names)}{suffix}"
        names.append(name)
        self.parts[name] = data
        return name


class _Listed:
    """A record's listed media of one kind: taken in order, or by index (TRL's parts)."""

    def __init__(self, items: list, kind: str):
        self.items, self.kind = list(items), kind
        self.used = [False] * len(self.items)

    def next(self) -> Any:
        for i, used in enumerate(self.used):
            if not used:
                self.used[i] = True
                return self.items[i]
        raise RecordError(
            "malformed_record",
            f"more {self.kind} references than the {len(self.items)} {self.kind}(s) listed",
        )

    def at(self, index: Any) -> Any:
        if not isinstance(index, int) or not 0 <= index < len(self.items):
            raise RecordError(
                "malformed_record",
                f"an {self.kind} part's index {index!r} is not one of the {len(self.items)} "
                f"listed {self.kind}(s)",
            )
        self.used[index] = True
        return self.items[index]

    def left(self) -> int:
        return self.used.count(False)


def _listed(value: Any, what: str) -> list:
    if value is None:
        return []
    if isinstance(value, (str, dict, bytes)):
        return [value]
    if isinstance(value, list):
        return value
    raise RecordError("malformed_record", f"'{what}' is {type(value).__name__}, not a list")


def _pattern(queue: dict[str, _Listed]) -> re.Pattern:
    """The placeholders of a record: ``<image>`` always (one without an image is an error, as
    in the loader), ``<video>`` only where videos are listed (else it is text)."""
    kinds = [IMAGE] + ([VIDEO] if queue["video"].items else [])
    return re.compile("(" + "|".join(map(re.escape, kinds)) + ")")


def _split(text: str, queue: dict[str, _Listed], media: _Media) -> list[dict] | str:
    """A text with placeholders -> parts (image/video parts in place), or the text itself."""
    pattern = _pattern(queue)
    if not pattern.search(text):
        return text
    parts: list[dict] = []
    for piece in pattern.split(text):
        if piece in (IMAGE, VIDEO):
            kind = "image" if piece == IMAGE else "video"
            if not queue[kind].left():
                raise RecordError(
                    "malformed_record", f"more {piece} placeholders than {kind}s in the record"
                )
            parts.append({"type": kind, kind: media.add(queue[kind].next(), kind)})
        elif piece:
            parts.append({"type": "text", "text": piece})
    return parts


def _turns(turns: list[tuple[str, str]], images: list, videos: list, media: _Media) -> list[dict]:
    """Role/text turns with their placeholders resolved; unplaced media go first in the first
    user turn (LLaVA's rule), in the order listed."""
    queue = {"image": _Listed(images, "image"), "video": _Listed(videos, "video")}
    pattern = _pattern(queue)
    counts = {
        kind: sum(pattern.findall(text).count(_PLACEHOLDERS[kind]) for _, text in turns)
        for kind in queue
    }
    lead = {kind: [] if counts[kind] else queue[kind].items for kind in queue}
    for kind in queue:
        if counts[kind] and counts[kind] != len(queue[kind].items):
            raise RecordError(
                "malformed_record",
                f"{counts[kind]} <{kind}> placeholder(s) for {len(queue[kind].items)} {kind}(s)",
            )
    messages = []
    for role, text in turns:
        content: Any = _split(text, queue, media)
        if role == "user" and (lead["image"] or lead["video"]):
            first = [
                {"type": kind, kind: media.add(source, kind)}
                for kind in ("video", "image")
                for source in lead[kind]
            ]
            lead = {"image": [], "video": []}
            text_parts = (
                [{"type": "text", "text": content}] if isinstance(content, str) else content
            )
            content = first + [p for p in text_parts if p.get("text") != ""]
        messages.append({"role": role, "content": content})
    if lead["image"] or lead["video"]:
        raise RecordError("malformed_record", "media but no user turn to put them in")
    return messages


def _role(speaker: Any, i: int) -> str:
    role = SPEAKER_ROLES.get(speaker) if isinstance(speaker, str) else None
    if role is not None:
        return role
    if speaker in _TOOL_ROLES:
        raise RecordError(
            "unsupported_field",
            f"turn {i} is a {speaker!r} turn: tool calls are not packed yet; convert the "
            "records without them",
        )
    raise RecordError(
        "malformed_record",
        f"turn {i}: the speaker is {speaker!r}, not one of {', '.join(SPEAKER_ROLES)} (name "
        "yours with --dataset-info's tags)",
    )


def _turn_list(record: dict) -> tuple[str, list[tuple[str, Any]]]:
    """The record's turns as ``(role, content)``, and the key they are under. A turn is
    ``from``/``value``, ``role``/``content`` or ms-swift's ``{"human", "assistant"}`` pair."""
    key = _turn_key(record)
    value = record.get(key)
    if not isinstance(value, list):
        raise RecordError("malformed_record", f"'{key}' is {type(value).__name__}, not a list")
    if not value:
        raise RecordError("empty_conversation", f"'{key}' is empty: no turn to train on")
    turns: list[tuple[str, Any]] = []
    for i, turn in enumerate(value):
        if not isinstance(turn, dict):
            raise RecordError("malformed_record", f"turn {i} is {type(turn).__name__}")
        speaker = turn.get("from") if turn.get("from") is not None else turn.get("role")
        if speaker is not None:
            content = turn.get("value") if turn.get("value") is not None else turn.get("content")
            if not isinstance(content, (str, list)):
                raise RecordError(
                    "malformed_record",
                    f"turn {i} has no string 'value' / 'content' (keys {', '.join(turn)})",
                )
            turns.append((_role(speaker, i), content))
        elif "human" in turn or "assistant" in turn:  # ms-swift: {"human", "assistant"} pairs
            for speaker in ("human", "assistant"):
                if isinstance(turn.get(speaker), str):
                    turns.append((SPEAKER_ROLES[speaker], turn[speaker]))
        else:
            raise RecordError(
                "malformed_record",
                f"turn {i} has keys {', '.join(map(repr, turn))}, none of 'from' / 'role' / "
                "'human' (map them with --dataset-info's tags)",
            )
    return key, _with_system(record, turns)


def _with_system(record: dict, turns: list) -> list:
    if isinstance(record.get("system"), str) and record["system"] and turns[0][0] != "system":
        return [("system", record["system"]), *turns]
    return turns


def _pairs(record: dict, prompt: str, answer: str) -> list[tuple[str, str]]:
    """ms-swift's query / response (LLaMA-Factory's alpaca: instruction + input / output) with
    the ``history`` of ``[q, r]`` pairs before them."""
    turns = []
    for i, pair in enumerate(_listed(record.get("history"), "history")):
        if not (
            isinstance(pair, list) and len(pair) == 2 and all(isinstance(t, str) for t in pair)
        ):
            raise RecordError("malformed_record", f"history[{i}] is not a [query, response] pair")
        turns += [("user", pair[0]), ("assistant", pair[1])]
    query, response = record.get(prompt), record.get(answer)
    if prompt == "instruction" and isinstance(record.get("input"), str) and record["input"]:
        query = f"{query}\n{record['input']}" if query else record["input"]
    if not isinstance(query, str) or not isinstance(response, str):
        raise RecordError(
            "malformed_record",
            f"'{prompt}' and '{answer}' must be strings (they are {type(query).__name__} and "
            f"{type(response).__name__})",
        )
    return _with_system(record, [*turns, ("user", query), ("assistant", response)])


def _media_list(record: dict, *names: str) -> list:
    """The record's media under ``names`` (a path, a list of them); empty strings are none."""
    out = []
    for name in names:
        out += [m for m in _listed(record.get(name), name) if m not in ("", None)]
    return out


def _part_source(part: dict, kind: str) -> Any:
    """The media a content part names: a path or URL, a ``{"url"}`` object, a Hugging Face
    ``{"bytes", "path"}`` entry (kept whole), or None (the next listed one)."""
    source = part.get("image_url") if kind == "image_url" else part.get(kind)
    if isinstance(source, dict) and "bytes" not in source:
        source = source.get("url", source.get("path"))
    return source


def _content(content: Any, queue: dict[str, _Listed], media: _Media) -> Any:
    """One message's content -> ours: ``<image>`` placeholders in strings and text parts take
    the next listed image; image parts name theirs, take the listed one at their ``index``
    (TRL), or the next listed one."""
    if isinstance(content, str):
        return _split(content, queue, media)
    if not isinstance(content, list):
        raise RecordError("malformed_record", f"content is {type(content).__name__}")
    out: list[dict] = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text":
            pieces = _split(str(part.get("text", "")), queue, media)
            out += [{"type": "text", "text": pieces}] if isinstance(pieces, str) else pieces
        elif kind in ("image", "image_url", "video"):
            media_kind = "video" if kind == "video" else "image"
            source = _part_source(part, kind)
            if (
                source is None and part.get("index") is not None
            ):  # TRL: {"type": "image", "index": k}
                source = queue[media_kind].at(part["index"])
            elif source is None:  # {"type": "image"} alone: the next listed image
                if not queue[media_kind].left():
                    raise RecordError("malformed_record", f"an {media_kind} part names none")
                source = queue[media_kind].next()
            out.append({"type": media_kind, media_kind: media.add(source, media_kind)})
        else:
            raise RecordError("malformed_record", f"content part of type {kind!r}")
    return out


def _references(contents: list) -> int:
    """How many media references (placeholders, media parts) the contents make."""
    count = 0
    for content in contents:
        parts = content if isinstance(content, list) else [{"type": "text", "text": content}]
        for part in parts:
            if not isinstance(part, dict):
                continue
            if part.get("type") in ("image", "image_url", "video"):
                count += 1
            elif isinstance(part.get("text"), str):
                count += part["text"].count(IMAGE) + part["text"].count(VIDEO)
    return count


def _conversation(turns: list[tuple[str, Any]], images: list, videos: list, media: _Media):
    """Turns of string or parts content -> our messages, every listed medium placed once."""
    if all(isinstance(content, str) for _, content in turns):
        return _turns(turns, images, videos, media)
    if not _references([content for _, content in turns]):
        return _unreferenced(turns, images, videos, media)
    queue = {"image": _Listed(images, "image"), "video": _Listed(videos, "video")}
    out = [{"role": role, "content": _content(content, queue, media)} for role, content in turns]
    for kind, listed in queue.items():
        if listed.left():
            raise RecordError(
                "malformed_record", f"{listed.left()} listed {kind}(s) no message refers to"
            )
    return out


def _unreferenced(turns: list, images: list, videos: list, media: _Media) -> list[dict]:
    """Parts content with no media reference: listed media lead the first user turn."""
    lead = [("video", v) for v in videos] + [("image", i) for i in images]
    empty = {"image": _Listed([], "image"), "video": _Listed([], "video")}
    out = []
    for role, content in turns:
        content = _content(content, empty, media)
        if role == "user" and lead:
            first = [{"type": kind, kind: media.add(source, kind)} for kind, source in lead]
            lead = []
            content = first + (
                [{"type": "text", "text": content}] if isinstance(content, str) else content
            )
        out.append({"role": role, "content": content})
    if lead:
        raise RecordError("malformed_record", "media but no user turn to put them in")
    return out


def _cauldron(record: dict, media: _Media) -> list[dict]:
    turns = []
    for i, pair in enumerate(_listed(record.get("texts"), "texts")):
        if not isinstance(pair, dict) or not all(
            isinstance(pair.get(k), str) for k in ("user", "assistant")
        ):
            raise RecordError(
                "malformed_record", f"texts[{i}] needs 'user' and 'assistant' strings"
            )
        turns += [("user", pair["user"]), ("assistant", pair["assistant"])]
    if not turns:
        raise RecordError("empty_conversation", "'texts' is empty: no turn to train on")
    # no placeholders (the_cauldron writes none): every image leads the first user turn
    return _turns(turns, _listed(record.get("images"), "images"), [], media)


def _texts(record: dict) -> Iterator[str]:
    """Every text of a record's turns, pairs and history (the tags in them are checked)."""
    for key in (*_TURN_KEYS, "texts", "history"):
        items = record.get(key)
        for item in items if isinstance(items, list) else ():
            values = list(item.values()) if isinstance(item, dict) else item
            for value in values if isinstance(values, list) else ():
                if isinstance(value, str):
                    yield value
                elif isinstance(value, list):  # parts content
                    for part in value:
                        if isinstance(part, dict) and isinstance(part.get("text"), str):
                            yield part["text"]
    for key in ("query", "response", "instruction", "input", "output", "system"):
        if isinstance(record.get(key), str):
            yield record[key]


def _parts(record: dict) -> Iterator[dict]:
    for key in _TURN_KEYS:
        for turn in record.get(key) if isinstance(record.get(key), list) else ():
            content = turn.get("content") if isinstance(turn, dict) else None
            if isinstance(content, list):
                yield from (p for p in content if isinstance(p, dict))


def _refuse_unsupported(record: dict) -> None:
    """Audio and grounding: reported, never packed without them (a model trained to answer a
    clip it never hears, or to write tags filled from a field it never saw)."""
    audios = _media_list(record, "audios", "audio")
    kinds = [p.get("type") for p in _parts(record)]
    if audios or any(k in ("audio", "input_audio", "audio_url") for k in kinds):
        what = f"{len(audios)} audio(s) ({str(audios[0])[:80]!r}...)" if audios else "audio parts"
        raise RecordError(
            "unsupported_media",
            f"the record carries {what}: audio is not packed yet, and without it the answer "
            "would be trained on sound the model never hears; convert it once audio is supported",
        )
    objects = record.get("objects")
    tags = sorted({t for text in _texts(record) for t in _GROUNDING.findall(text)})
    if objects or tags:
        what = (
            "'objects'" + (f" and {', '.join(tags)}" if tags else "")
            if objects
            else ", ".join(tags)
        )
        raise RecordError(
            "unsupported_field",
            f"the record carries {what} (ms-swift grounding: the tags are filled from "
            "'objects'): not packed, the tags would be trained as literal text",
        )


def to_document(record: Any, fmt: str, load: Callable[[Any, str], tuple[bytes, str]]) -> Converted:
    """One record -> :class:`Converted`; ``load(source, kind)`` returns a media source's bytes
    and its part suffix (or raises :class:`RecordError`). ``fmt``: one of :data:`FORMATS`."""
    if not isinstance(record, dict):
        raise RecordError("malformed_record", f"a record is {type(record).__name__}, not an object")
    if fmt not in FORMATS:
        raise ValueError(f"format={fmt!r}; choose one of {', '.join(FORMATS)} or auto")
    _refuse_unsupported(record)
    media = _Media(load)
    images = _media_list(record, "image", "images")
    videos = _media_list(record, "video", "videos")
    key = _turn_key(record)
    if fmt == "hf" and "texts" in record and key is None:
        messages = _cauldron(record, media)
    elif key is not None and fmt != "alpaca":
        key, turns = _turn_list(record)
        messages = _conversation(turns, images, videos, media)
    elif fmt in ("swift", "alpaca") and (
        ("query" in record or "response" in record)
        if fmt == "swift"
        else ("instruction" in record or "output" in record)
    ):
        prompt, answer = ("query", "response") if fmt == "swift" else ("instruction", "output")
        messages = _turns(_pairs(record, prompt, answer), images, videos, media)
    else:
        raise RecordError("malformed_record", f"{_has(record)}; --format {fmt} reads {NEEDS[fmt]}")
    if not messages:
        raise RecordError("empty_conversation", "no turns")
    document: dict[str, Any] = {"messages": messages}
    if media.images:
        document["images"] = media.images
    if media.videos:
        document["videos"] = media.videos
    for name in ("loss_weight",):
        if name in record:
            document[name] = record[name]
    return Converted(document=document, parts=media.parts, id=record.get("id"))


def data_uri(source: str) -> bytes | None:
    """The bytes of a ``data:...;base64,`` URI, else None."""
    if not source.startswith("data:"):
        return None
    head, _, payload = source.partition(",")
    if ";base64" not in head:
        raise RecordError("unreadable_image", "a data: URI that is not base64")
    try:
        return base64.b64decode(payload, validate=True)
    except ValueError as e:
        raise RecordError("unreadable_image", f"a data: URI that does not decode ({e})") from None


#: The magic bytes of the formats most datasets hold: no Pillow open for them.
_MAGIC = ((b"\xff\xd8\xff", ".jpg"), (b"\x89PNG\r\n\x1a\n", ".png"), (b"GIF8", ".gif"))


def sniff_suffix(data: bytes, *, whole: bool = True) -> str | None:
    """The image format of ``data`` as a part suffix (``.jpg``), None if it is no image.
    JPEG, PNG, GIF and WebP by their signature; with ``whole`` (``data`` is the whole file),
    every other format Pillow opens, by Pillow."""
    for magic, suffix in _MAGIC:
        if data.startswith(magic):
            return suffix
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return ".webp"
    if not whole:
        return None
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as image:
            fmt = (image.format or "").lower()
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError):
        return None
    return {"jpeg": ".jpg", "tiff": ".tif"}.get(fmt, f".{fmt}" if fmt else ".bin")


def suffix_of(path: str) -> str:
    suffix = Path(path).suffix.lower()
    return suffix if re.fullmatch(r"\.[a-z0-9]{1,5}", suffix) else ""
