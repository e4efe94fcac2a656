"""What users' multimodal SFT records look like, turned into our conversation document.

One record in, one document out (``{"messages": [...], "images": [...], "videos": [...]}``
plus the media to store beside it), or :class:`Skip` with a report reason. The shapes
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
we do not pack is reported, never dropped from a record that is then packed without it:
ms-swift's grounding ``objects`` and their ``<ref-object>`` / ``<bbox>`` tags, tool turns
(``unsupported_field``), media behind a URL (``remote_media``), OpenAI's ``input_audio`` /
``audio_url`` parts (``unsupported_media``: write the clip to a file and name it).
Audio clips (ms-swift's / LLaMA-Factory's ``audios`` with ``<audio>`` tags, ``{"type": "audio",
"audio": path}`` parts) are carried as images are; unplaced clips lead the first user turn after
its videos and images. ``<video>`` (``<audio>``) in a record that lists no video (audio) is
text: an HTML question.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from energon_packing.errors import Skip
from energon_packing.incoming.turns import (
    TURN_KEYS,
    listed,
    pairs,
    read_turns,
    turn_key,
    with_system,
)

__all__ = [
    "FORMATS",
    "NEEDS",
    "REPORT_REASONS",
    "Converted",
    "detect_format",
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
    "missing_audio",
    "remote_media",
    "unsupported_media",
    "unsupported_field",
    "empty_conversation",
    "malformed_record",
)

IMAGE, VIDEO, AUDIO = "<image>", "<video>", "<audio>"

KINDS = ("image", "video", "audio")
_PLACEHOLDERS = {"image": IMAGE, "video": VIDEO, "audio": AUDIO}
#: a part name's stem per kind (``img0.jpg``, ``vid0.mp4``, ``aud0.wav``)
_STEMS = {"image": "img", "video": "vid", "audio": "aud"}

#: ms-swift's grounding tags, filled from its ``objects`` field.
_GROUNDING = re.compile(r"<ref-object>|<bbox>")


@dataclass(kw_only=True, slots=True)
class Converted:
    """A record as our document and the parts to store beside it (part name -> bytes)."""

    document: dict
    parts: dict[str, bytes] = field(default_factory=dict)
    id: Any = None


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
    raise Skip("malformed_record", f"{_has(record)}; auto reads {NEEDS['auto']}")


def _has(record: Any) -> str:
    """What a rejected record holds: its keys (the report row lists them too)."""
    if not isinstance(record, dict):
        return f"a record is {type(record).__name__}, not an object"
    return f"the record has keys {', '.join(map(repr, record)) or 'none'}"


class _Media:
    """Collects a record's images, videos and audio clips as parts, in order of first use."""

    def __init__(self, load: Callable[[Any, str], tuple[bytes, str]]):
        self.load = load
        self.parts: dict[str, bytes] = {}
        self.names: dict[str, list[str]] = {kind: [] for kind in KINDS}

    def add(self, source: Any, kind: str) -> str:
        data, suffix = self.load(source, kind)
        names = self.names[kind]
        name = f"{_STEMS[kind]}{len(names)}{suffix}"
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
        raise Skip(
            "malformed_record",
            f"more {self.kind} references than the {len(self.items)} {self.kind}(s) listed",
        )

    def at(self, index: Any) -> Any:
        if not isinstance(index, int) or not 0 <= index < len(self.items):
            raise Skip(
                "malformed_record",
                f"an {self.kind} part's index {index!r} is not one of the {len(self.items)} "
                f"listed {self.kind}(s)",
            )
        self.used[index] = True
        return self.items[index]

    def left(self) -> int:
        return self.used.count(False)


def _pattern(queue: dict[str, _Listed]) -> re.Pattern:
    """The placeholders of a record: ``<image>`` always (one without an image is an error, as
    in the loader), ``<video>`` / ``<audio>`` only where videos / clips are listed (else text)."""
    kinds = [IMAGE] + [_PLACEHOLDERS[k] for k in ("video", "audio") if queue[k].items]
    return re.compile("(" + "|".join(map(re.escape, kinds)) + ")")


def _split(text: str, queue: dict[str, _Listed], media: _Media) -> list[dict] | str:
    """A text with placeholders -> parts (media parts in place), or the text itself."""
    pattern = _pattern(queue)
    if not pattern.search(text):
        return text
    parts: list[dict] = []
    for piece in pattern.split(text):
        kind = next((k for k, tag in _PLACEHOLDERS.items() if piece == tag), None)
        if kind is not None:
            if not queue[kind].left():
                raise Skip(
                    "malformed_record", f"more {piece} placeholders than {kind}s in the record"
                )
            parts.append({"type": kind, kind: media.add(queue[kind].next(), kind)})
        elif piece:
            parts.append({"type": "text", "text": piece})
    return parts


def _queues(listed_media: dict[str, list]) -> dict[str, _Listed]:
    return {kind: _Listed(listed_media.get(kind, []), kind) for kind in KINDS}


#: the order unplaced media lead the first user turn in
_LEAD = ("video", "image", "audio")


def _turns(turns: list[tuple[str, str]], listed_media: dict[str, list], media: _Media) -> list:
    """Role/text turns with their placeholders resolved; unplaced media go first in the first
    user turn (LLaVA's rule), in the order listed."""
    queue = _queues(listed_media)
    pattern = _pattern(queue)
    counts = {
        kind: sum(pattern.findall(text).count(_PLACEHOLDERS[kind]) for _, text in turns)
        for kind in queue
    }
    lead = {kind: [] if counts[kind] else queue[kind].items for kind in queue}
    for kind in queue:
        if counts[kind] and counts[kind] != len(queue[kind].items):
            raise Skip(
                "malformed_record",
                f"{counts[kind]} <{kind}> placeholder(s) for {len(queue[kind].items)} {kind}(s)",
            )
    messages = []
    for role, text in turns:
        content: Any = _split(text, queue, media)
        if role == "user" and any(lead.values()):
            first = [
                {"type": kind, kind: media.add(source, kind)}
                for kind in _LEAD
                for source in lead[kind]
            ]
            lead = {kind: [] for kind in KINDS}
            text_parts = (
                [{"type": "text", "text": content}] if isinstance(content, str) else content
            )
            content = first + [p for p in text_parts if p.get("text") != ""]
        messages.append({"role": role, "content": content})
    if any(lead.values()):
        raise Skip("malformed_record", "media but no user turn to put them in")
    return messages


def _media_list(record: dict, *names: str) -> list:
    """The record's media under ``names`` (a path, a list of them); empty strings are none."""
    out = []
    for name in names:
        out += [m for m in listed(record.get(name), name) if m not in ("", None)]
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
        raise Skip("malformed_record", f"content is {type(content).__name__}")
    out: list[dict] = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text":
            pieces = _split(str(part.get("text", "")), queue, media)
            out += [{"type": "text", "text": pieces}] if isinstance(pieces, str) else pieces
        elif kind in ("image", "image_url", "video", "audio"):
            media_kind = "image" if kind == "image_url" else kind
            source = _part_source(part, kind)
            if (
                source is None and part.get("index") is not None
            ):  # TRL: {"type": "image", "index": k}
                source = queue[media_kind].at(part["index"])
            elif source is None:  # {"type": "image"} alone: the next listed image
                if not queue[media_kind].left():
                    raise Skip("malformed_record", f"an {media_kind} part names none")
                source = queue[media_kind].next()
            out.append({"type": media_kind, media_kind: media.add(source, media_kind)})
        else:
            raise Skip("malformed_record", f"content part of type {kind!r}")
    return out


def _references(contents: list) -> int:
    """How many media references (placeholders, media parts) the contents make."""
    count = 0
    for content in contents:
        parts = content if isinstance(content, list) else [{"type": "text", "text": content}]
        for part in parts:
            if not isinstance(part, dict):
                continue
            if part.get("type") in ("image", "image_url", "video", "audio"):
                count += 1
            elif isinstance(part.get("text"), str):
                count += sum(part["text"].count(tag) for tag in _PLACEHOLDERS.values())
    return count


def _conversation(turns: list[tuple[str, Any]], listed_media: dict[str, list], media: _Media):
    """Turns of string or parts content -> our messages, every listed medium placed once."""
    if all(isinstance(content, str) for _, content in turns):
        return _turns(turns, listed_media, media)
    if not _references([content for _, content in turns]):
        return _unreferenced(turns, listed_media, media)
    queue = _queues(listed_media)
    out = [{"role": role, "content": _content(content, queue, media)} for role, content in turns]
    for kind, refs in queue.items():
        if refs.left():
            raise Skip("malformed_record", f"{refs.left()} listed {kind}(s) no message refers to")
    return out


def _unreferenced(turns: list, listed_media: dict[str, list], media: _Media) -> list[dict]:
    """Parts content with no media reference: listed media lead the first user turn."""
    lead = [(kind, m) for kind in _LEAD for m in listed_media.get(kind, [])]
    empty = _queues({})
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
        raise Skip("malformed_record", "media but no user turn to put them in")
    return out


def _cauldron(record: dict, media: _Media) -> list[dict]:
    turns = []
    for i, pair in enumerate(listed(record.get("texts"), "texts")):
        if not isinstance(pair, dict) or not all(
            isinstance(pair.get(k), str) for k in ("user", "assistant")
        ):
            raise Skip("malformed_record", f"texts[{i}] needs 'user' and 'assistant' strings")
        turns += [("user", pair["user"]), ("assistant", pair["assistant"])]
    if not turns:
        raise Skip("empty_conversation", "'texts' is empty: no turn to train on")
    # no placeholders (the_cauldron writes none): every image leads the first user turn
    return _turns(turns, {"image": listed(record.get("images"), "images")}, media)


def _texts(record: dict) -> Iterator[str]:
    """Every text of a record's turns, pairs and history (the tags in them are checked)."""
    for key in (*TURN_KEYS, "texts", "history"):
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
    for key in TURN_KEYS:
        for turn in record.get(key) if isinstance(record.get(key), list) else ():
            content = turn.get("content") if isinstance(turn, dict) else None
            if isinstance(content, list):
                yield from (p for p in content if isinstance(p, dict))


def _refuse_unsupported(record: dict) -> None:
    """Inline audio and grounding: reported, never packed without them (a model trained to
    answer a clip it never hears, or to write tags filled from a field it never saw)."""
    inline = sorted({p.get("type") for p in _parts(record)} & {"input_audio", "audio_url"})
    if inline:
        raise Skip(
            "unsupported_media",
            f"the record carries {' and '.join(inline)} parts: convert reads audio from files "
            "(an 'audios' list or {'type': 'audio', 'audio': PATH} parts); write each clip to "
            "a file under --media-root and name it there",
        )
    objects = record.get("objects")
    tags = sorted({t for text in _texts(record) for t in _GROUNDING.findall(text)})
    if objects or tags:
        what = (
            "'objects'" + (f" and {', '.join(tags)}" if tags else "")
            if objects
            else ", ".join(tags)
        )
        raise Skip(
            "unsupported_field",
            f"the record carries {what} (ms-swift grounding: the tags are filled from "
            "'objects'): not packed, the tags would be trained as literal text",
        )


def to_document(record: Any, fmt: str, load: Callable[[Any, str], tuple[bytes, str]]) -> Converted:
    """One record -> :class:`Converted`; ``load(source, kind)`` returns a media source's bytes
    and its part suffix (or raises :class:`Skip`). ``fmt``: one of :data:`FORMATS`."""
    if not isinstance(record, dict):
        raise Skip("malformed_record", f"a record is {type(record).__name__}, not an object")
    if fmt not in FORMATS:
        raise ValueError(f"format={fmt!r}; choose one of {', '.join(FORMATS)} or auto")
    _refuse_unsupported(record)
    media = _Media(load)
    listed_media = {
        "image": _media_list(record, "image", "images"),
        "video": _media_list(record, "video", "videos"),
        "audio": _media_list(record, "audio", "audios"),
    }
    key = turn_key(record)
    if fmt == "hf" and "texts" in record and key is None:
        messages = _cauldron(record, media)
    elif key is not None and fmt != "alpaca":
        turns = with_system(record, read_turns(record.get(key), key=key))
        messages = _conversation(turns, listed_media, media)
    elif fmt in ("swift", "alpaca") and (
        ("query" in record or "response" in record)
        if fmt == "swift"
        else ("instruction" in record or "output" in record)
    ):
        prompt, answer = ("query", "response") if fmt == "swift" else ("instruction", "output")
        messages = _turns(pairs(record, prompt, answer), listed_media, media)
    else:
        raise Skip("malformed_record", f"{_has(record)}; --format {fmt} reads {NEEDS[fmt]}")
    if not messages:
        raise Skip("empty_conversation", "no turns")
    document: dict[str, Any] = {"messages": messages}
    for kind, key in (("image", "images"), ("video", "videos"), ("audio", "audios")):
        if media.names[kind]:
            document[key] = media.names[kind]
    for name in ("loss_weight",):
        if name in record:
            document[name] = record[name]
    return Converted(document=document, parts=media.parts, id=record.get("id"))
