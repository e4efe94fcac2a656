"""A record as read -> :class:`~energon_packing.incoming.records.Converted`: its columns
mapped, the spellings the readers do not take rewritten (LLaVA-Video's ``<image>`` for its
video, transformers' and OpenAI's video parts), caption records refused, then the format's
reader (:func:`~energon_packing.incoming.records.to_document`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Any

from energon_packing.errors import Skip
from energon_packing.incoming.columns import map_columns
from energon_packing.incoming.media import of
from energon_packing.incoming.records import IMAGE, VIDEO, Converted, detect_format, to_document
from energon_packing.incoming.sources import Broken

__all__ = ["How", "read_record"]


@dataclass(kw_only=True, slots=True)
class How:
    """How records are read: the format and the column mapping (and LLaMA-Factory's tags)."""

    format: str
    columns: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)


def read_record(record: Any, how: How, load: Any) -> Converted:
    """One record as read -> :class:`Converted`, or :class:`~energon_packing.errors.Skip` (its report)."""
    if isinstance(record, Broken):
        raise Skip("malformed_record", record.detail)
    record = map_columns(record, how.columns, how.tags)
    _refuse_captions(record)
    as_video = _with_video_placeholders(record)
    rewritten = as_video is not record
    record_id = record.get("id") if isinstance(record, dict) else None
    record = _with_video_parts(as_video)
    try:
        fmt = detect_format(record) if how.format == "auto" else how.format
        return to_document(record, fmt, partial(load, record_id=record_id))
    except Skip as e:
        if not rewritten or e.reason != "malformed_record":
            raise
        note = "; its <image> placeholders stand for its video (a LLaVA-Video record)"
        raise Skip(e.reason, f"{e.detail}{of(record_id)}{note}") from None


def _text_key(turn: Any) -> str | None:
    """The key of a ``from``/``value`` turn's text (``value``, else ``content``)."""
    if not isinstance(turn, dict):
        return None
    return next((k for k in ("value", "content") if isinstance(turn.get(k), str)), None)


def _present(record: dict, *names: str) -> bool:
    """Whether ``record`` lists media under any of ``names`` (empty strings are none)."""
    for name in names:
        value = record.get(name)
        if any(v not in (None, "") for v in (value if isinstance(value, list) else [value])):
            return True
    return False


def _with_video_placeholders(record: Any) -> Any:
    """A LLaVA-Video record (a ``video``, no ``image``) whose turns write ``<image>`` and never
    ``<video>``: the same record with ``<video>`` there, since LLaVA-NeXT's trainer reads the
    video in ``<image>``'s place; any other record as it is."""
    if not isinstance(record, dict) or not isinstance(record.get("conversations"), list):
        return record
    if _present(record, "image", "images") or not _present(record, "video", "videos"):
        return record
    turns = record["conversations"]
    texts = [turn[key] for turn in turns if (key := _text_key(turn))]
    if any(VIDEO in text for text in texts) or not any(IMAGE in text for text in texts):
        return record
    return {**record, "conversations": [_image_is_video(turn) for turn in turns]}


def _image_is_video(turn: Any) -> Any:
    key = _text_key(turn)
    return {**turn, key: turn[key].replace(IMAGE, VIDEO)} if key else turn


def _with_video_parts(record: Any) -> Any:
    """Messages whose video parts name their file as transformers' chat templates write it
    (``{"type": "video", "path" | "url": ...}``) or OpenAI-style (``{"type": "video_url",
    "video_url": {"url": ...}}``): the same with ``{"type": "video", "video": ...}``."""
    if not isinstance(record, dict):
        return record
    out = dict(record)
    for key in ("messages", "conversations", "conversation"):
        if isinstance(record.get(key), list):
            out[key] = [_message_parts(message) for message in record[key]]
    return out


def _message_parts(message: Any) -> Any:
    if not isinstance(message, dict) or not isinstance(message.get("content"), list):
        return message
    return {**message, "content": [_video_part(part) for part in message["content"]]}


def _video_part(part: Any) -> Any:
    if not isinstance(part, dict):
        return part
    if part.get("type") == "video_url":
        source = part.get("video_url")
        return {"type": "video", "video": source.get("url") if isinstance(source, dict) else source}
    if part.get("type") == "video" and part.get("video") is None:
        source = next((part[k] for k in ("path", "url") if isinstance(part.get(k), str)), None)
        return {**part, "video": source} if source is not None else part
    return part


def _refuse_captions(record: Any) -> None:
    """ShareGPT4Video's caption records (``sharegpt4video_40k.jsonl``) hold no conversation:
    reported with the way out (convert writes no prompt of its own)."""
    if (
        isinstance(record, dict)
        and isinstance(record.get("captions"), list)
        and not any(key in record for key in ("conversations", "messages", "texts"))
    ):
        raise Skip(
            "malformed_record",
            f"a caption record ({len(record['captions'])} captions of video "
            f"{record.get('video_id', record.get('video_path'))!r}), not a conversation: "
            "convert invents no prompt; convert the SFT file (LLaVA records with 'video' and "
            "<video>) or write each caption as a user/assistant pair",
        )
