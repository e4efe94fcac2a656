"""A record's keys renamed to the ones the readers read: ``--columns`` (ours=theirs, or
ms-swift's JSON) and LLaMA-Factory's ``dataset_info.json`` (its ``formatting``, ``columns``
and ``tags``)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from energon_packing.incoming.turns import TURN_KEYS, turn_key

__all__ = ["COLUMNS", "from_dataset_info", "map_columns", "parse_columns"]

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
                for other in TURN_KEYS:
                    out.pop(other, None)
            out[name] = record[key]
    if tags and isinstance(out.get(turn_key(out)), list):
        out[turn_key(out)] = [_tagged(turn, tags) for turn in out[turn_key(out)]]
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


def from_dataset_info(
    info_path: Path, name: str | None, source: Path, format: str
) -> tuple[Path, str, dict[str, str], dict[str, str]]:
    """LLaMA-Factory's ``dataset_info.json`` entry ``name`` -> (the records' path, format,
    columns, tags)."""
    try:
        info = json.loads(info_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ValueError(f"--dataset-info {info_path} does not read as JSON ({e})") from None
    if not isinstance(info, dict):
        raise ValueError(f"--dataset-info {info_path} holds no object of datasets")
    if name not in info:
        raise ValueError(
            f"--dataset {name!r} is not in {info_path} (it lists {', '.join(sorted(info)[:20])})"
        )
    entry = info[name]
    if not isinstance(entry, dict):
        raise ValueError(f"{info_path}: entry {name!r} is not an object")
    if entry.get("ranking"):
        raise ValueError(
            f"{info_path}: {name!r} is preference data (ranking: true), not SFT conversations"
        )
    file_name = entry.get("file_name")
    if file_name is None:
        hub = next(
            (
                entry[k]
                for k in ("hf_hub_url", "ms_hub_url", "om_hub_url", "script_url")
                if k in entry
            ),
            None,
        )
        raise ValueError(
            f"{info_path}: {name!r} names no file_name"
            + (f" (it is {hub!r} on a hub: download it and pass its files)" if hub else "")
        )
    formatting = entry.get("formatting", "alpaca")  # LLaMA-Factory's default
    if formatting not in ("alpaca", "sharegpt"):
        raise ValueError(
            f"{info_path}: {name!r} has formatting {formatting!r}, not alpaca or sharegpt"
        )
    renames = {"prompt": "instruction", "query": "input", "response": "output"}
    columns = {}
    for ours, theirs in (entry.get("columns") or {}).items():
        if formatting == "alpaca":
            ours = renames.get(ours, ours)
        if ours in ("tools", "kto_tag", "chosen", "rejected"):
            continue  # not read: a record that fills them is refused by its shape
        columns[ours] = theirs
    tags = {k: v for k, v in (entry.get("tags") or {}).items() if isinstance(v, str)}
    if source.is_dir() and (source / file_name).exists():
        source = source / file_name
    if format == "auto":
        format = formatting
    return source, format, parse_columns(columns), tags
