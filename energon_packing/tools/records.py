"""What users' multimodal SFT records look like, turned into our conversation document.

One record in, one document out (``{"messages": [...], "images": [...], "videos": [...]}``
plus the media to store beside it), or :class:`RecordError` with a report reason:

* ``llava`` / ``sharegpt``: ``{"conversations": [{"from": "human"|"gpt"|"system", "value":
  "<image>\\n..."}], "image": path | [paths], "images": [...], "video": path | [paths]}``;
* ``messages``: ``{"messages": [{"role", "content": str | [parts]}], "images": [...]}`` with
  OpenAI-style parts (``text``, ``image_url`` with a path or a ``data:`` URI, ``image``);
* ``hf``: a Hugging Face dataset row: the_cauldron's ``images`` + ``texts`` (``[{"user",
  "assistant"}]``; every image in the first user turn), or ``messages`` / ``conversations``
  beside an ``images`` column of ``{"bytes", "path"}`` entries.

Content is carried, never invented: no system prompt is added, ``human`` -> ``user``, ``gpt`` ->
``assistant``, each image stays in the turn that names it (``<image>`` placeholders become image
parts in place; a record with images but no placeholder gets them at the start of its first
user turn, where LLaVA's own preprocessing puts them), image bytes are copied as they are.
"""

from __future__ import annotations

import base64
import io
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from energon_packing.loader.samples import SPEAKER_ROLES

__all__ = [
    "FORMATS",
    "REPORT_REASONS",
    "Converted",
    "RecordError",
    "detect_format",
    "to_document",
]

FORMATS = ("llava", "sharegpt", "hf", "messages")
REPORT_REASONS = (
    "missing_image",
    "unreadable_image",
    "missing_video",
    "unreadable_video",
    "malformed_record",
)
IMAGE, VIDEO = "<image>", "<video>"
_PLACEHOLDER = re.compile(r"(<image>|<video>)")


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


def detect_format(record: Any) -> str:
    """The format a record is written in (what ``--format auto`` picks, record by record)."""
    if isinstance(record, dict):
        if "texts" in record and "images" in record:
            return "hf"
        if isinstance(record.get("conversations"), list):
            return "llava"
        if isinstance(record.get("messages"), list):
            return "messages"
    raise RecordError(
        "malformed_record",
        "neither 'conversations' (LLaVA / ShareGPT), 'messages' nor the_cauldron's "
        "'images' + 'texts'",
    )


class _Media:
    """Collects a record's images and videos as parts, in order of first use."""

    def __init__(self, load: Callable[[Any], tuple[bytes, str]]):
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


def _listed(value: Any, what: str) -> list:
    if value is None:
        return []
    if isinstance(value, (str, dict, bytes)):
        return [value]
    if isinstance(value, list):
        return value
    raise RecordError("malformed_record", f"'{what}' is {type(value).__name__}, not a list")


def _split(text: str, queue: dict[str, list], media: _Media) -> list[dict] | str:
    """A text with placeholders -> parts (image/video parts in place), or the text itself."""
    if not _PLACEHOLDER.search(text):
        return text
    parts: list[dict] = []
    for piece in _PLACEHOLDER.split(text):
        if piece in (IMAGE, VIDEO):
            kind = "image" if piece == IMAGE else "video"
            if not queue[kind]:
                raise RecordError(
                    "malformed_record", f"more {piece} placeholders than {kind}s in the record"
                )
            parts.append({"type": kind, kind: media.add(queue[kind].pop(0), kind)})
        elif piece:
            parts.append({"type": "text", "text": piece})
    return parts


def _turns(turns: list[tuple[str, str]], images: list, videos: list, media: _Media) -> list[dict]:
    """Role/text turns with their placeholders resolved; unplaced media go first in the first
    user turn (LLaVA's rule), in the order listed."""
    queue = {"image": list(images), "video": list(videos)}
    counts = {kind: sum(text.count(f"<{kind}>") for _, text in turns) for kind in queue}
    lead = {kind: [] if counts[kind] else queue[kind] for kind in queue}
    for kind in queue:
        if counts[kind] and counts[kind] != len(queue[kind]):
            raise RecordError(
                "malformed_record",
                f"{counts[kind]} <{kind}> placeholder(s) for {len(queue[kind])} {kind}(s)",
            )
        if not counts[kind]:
            queue[kind] = []
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


def _from_value(record: dict, key: str = "conversations") -> list[tuple[str, str]]:
    """``from``/``value`` turns (LLaVA, ShareGPT; ``role``/``content`` strings are read too)."""
    turns = []
    for i, turn in enumerate(_listed(record.get(key), key)):
        if not isinstance(turn, dict):
            raise RecordError("malformed_record", f"turn {i} is {type(turn).__name__}")
        speaker = turn.get("from", turn.get("role"))
        text = turn.get("value", turn.get("content"))
        if not isinstance(text, str):
            raise RecordError("malformed_record", f"turn {i} has no string 'value'")
        role = SPEAKER_ROLES.get(speaker)
        if role is None:
            raise RecordError(
                "malformed_record", f"turn {i}: 'from' is {speaker!r}, not human, gpt or system"
            )
        turns.append((role, text))
    if "system" in record and isinstance(record["system"], str):
        turns.insert(0, ("system", record["system"]))
    return turns


def _media_list(record: dict, *names: str) -> list:
    """The record's media under ``names`` (a path, a list of them); empty strings are none."""
    out = []
    for name in names:
        out += [m for m in _listed(record.get(name), name) if m not in ("", None)]
    return out


def _llava(record: dict, media: _Media) -> dict:
    images = _media_list(record, "image", "images")
    videos = _media_list(record, "video", "videos")
    return {"messages": _turns(_from_value(record), images, videos, media)}


def _part_source(part: dict, kind: str) -> Any:
    """The media a content part names: a path or URL, a ``{"url"}`` object, a Hugging Face
    ``{"bytes", "path"}`` entry (kept whole), or None (the next listed one)."""
    source = part.get("image_url") if kind == "image_url" else part.get(kind)
    if isinstance(source, dict) and "bytes" not in source:
        source = source.get("url", source.get("path"))
    return source


def _content(content: Any, queue: dict[str, list], media: _Media) -> Any:
    """One message's content -> ours: ``<image>`` placeholders in strings and text parts take
    the next listed image; image parts name theirs, or take the next listed one."""
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
            if source is None:  # {"type": "image"} alone: the next listed image
                if not queue[media_kind]:
                    raise RecordError("malformed_record", f"an {media_kind} part names none")
                source = queue[media_kind].pop(0)
            out.append({"type": media_kind, media_kind: media.add(source, media_kind)})
        else:
            raise RecordError("malformed_record", f"content part of type {kind!r}")
    return out


def _references(messages: list) -> int:
    """How many media references (placeholders, media parts) the messages make."""
    count = 0
    for message in messages:
        content = message.get("content")
        parts = content if isinstance(content, list) else [{"type": "text", "text": content}]
        for part in parts:
            if not isinstance(part, dict):
                continue
            if part.get("type") in ("image", "image_url", "video"):
                count += 1
            elif isinstance(part.get("text"), str):
                count += len(_PLACEHOLDER.findall(part["text"]))
    return count


def _messages(record: dict, media: _Media) -> dict:
    images = _media_list(record, "images")
    videos = _media_list(record, "videos")
    key = "messages" if "messages" in record else "conversations"
    messages = _listed(record.get(key), key)
    if any(isinstance(m, dict) and "from" in m for m in messages):
        return {"messages": _turns(_from_value(record, key), images, videos, media)}
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in SPEAKER_ROLES:
            raise RecordError("malformed_record", f"message {i} has no valid 'role'")
    if not _references(messages):  # listed media, no reference: they lead the first user turn
        if all(isinstance(m.get("content"), str) for m in messages):
            turns = [(SPEAKER_ROLES[m["role"]], m["content"]) for m in messages]
            return {"messages": _turns(turns, images, videos, media)}
        return {"messages": _unreferenced(messages, images, videos, media)}
    queue = {"image": list(images), "video": list(videos)}
    out = [
        {"role": SPEAKER_ROLES[m["role"]], "content": _content(m.get("content"), queue, media)}
        for m in messages
    ]
    for kind, left in queue.items():
        if left:
            raise RecordError(
                "malformed_record", f"{len(left)} listed {kind}(s) no message refers to"
            )
    return {"messages": out}


def _unreferenced(messages: list, images: list, videos: list, media: _Media) -> list[dict]:
    """Parts content with no media reference: listed media lead the first user turn."""
    lead = [("video", v) for v in videos] + [("image", i) for i in images]
    out = []
    for message in messages:
        content = _content(message.get("content"), {"image": [], "video": []}, media)
        if message["role"] == "user" and lead:
            first = [{"type": kind, kind: media.add(source, kind)} for kind, source in lead]
            lead = []
            content = first + (
                [{"type": "text", "text": content}] if isinstance(content, str) else content
            )
        out.append({"role": SPEAKER_ROLES[message["role"]], "content": content})
    if lead:
        raise RecordError("malformed_record", "media but no user turn to put them in")
    return out


def _cauldron(record: dict, media: _Media) -> dict:
    turns = []
    for i, pair in enumerate(_listed(record.get("texts"), "texts")):
        if not isinstance(pair, dict) or not all(
            isinstance(pair.get(k), str) for k in ("user", "assistant")
        ):
            raise RecordError(
                "malformed_record", f"texts[{i}] needs 'user' and 'assistant' strings"
            )
        turns += [("user", pair["user"]), ("assistant", pair["assistant"])]
    # no placeholders (the_cauldron writes none): every image leads the first user turn
    return {"messages": _turns(turns, _listed(record.get("images"), "images"), [], media)}


def to_document(record: Any, fmt: str, load: Callable[[Any, str], tuple[bytes, str]]) -> Converted:
    """One record -> :class:`Converted`; ``load(source, kind)`` returns a media source's bytes
    and its part suffix (or raises :class:`RecordError`)."""
    if not isinstance(record, dict):
        raise RecordError("malformed_record", f"a record is {type(record).__name__}, not an object")
    media = _Media(load)
    if fmt in ("llava", "sharegpt"):
        if not isinstance(record.get("conversations"), list):
            raise RecordError("malformed_record", "no 'conversations' list")
        document = _llava(record, media)
    elif fmt == "messages":
        if not isinstance(record.get("messages"), list):
            raise RecordError("malformed_record", "no 'messages' list")
        document = _messages(record, media)
    elif fmt == "hf":
        if "texts" in record:
            document = _cauldron(record, media)
        elif isinstance(record.get("messages", record.get("conversations")), list):
            document = _messages(record, media)
        else:
            raise RecordError(
                "malformed_record", "a row needs 'texts' or 'messages' beside 'images'"
            )
    else:
        raise ValueError(f"format={fmt!r}; choose one of {', '.join(FORMATS)} or auto")
    if not document["messages"]:
        raise RecordError("malformed_record", "no turns")
    if media.images:
        document["images"] = media.images
    if media.videos:
        document["videos"] = media.videos
    for key in ("loss_weight",):
        if key in record:
            document[key] = record[key]
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
