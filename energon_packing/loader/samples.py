"""The Energon sample types and the sample loader that ``dataset.yaml`` points at.

A shard sample is ``<key>.json`` = ``{"messages": [...], "images": ["img0.jpg", ...]}`` plus
image parts ``<key>.img0.jpg`` / ``.png``. The loader is total: it never raises on bad data
(Energon would print a traceback and a sample dump per failure); it records ``problem`` and the
task encoder skips the sample with that reason, counted and reported.

``.nv-meta/dataset.yaml``::

    sample_type: {__module__: energon_packing.loader.samples, __class__: ConversationSample}
    sample_loader: {__module__: energon_packing.loader.samples, __function__: conversation_loader}
    part_filter: {__module__: energon_packing.loader.samples, __function__: conversation_parts}
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from typing import Any

import numpy as np
from megatron.energon import Sample, basic_sample_keys, edataclass, stateless

from energon_packing.schema import Pack

__all__ = [
    "ConversationSample",
    "EncodedConversation",
    "PackedSample",
    "conversation_loader",
    "conversation_parts",
    "cook_conversation",
    "load_conversation",
]

IMAGE_PART = re.compile(r"^[A-Za-z0-9_-]+\.(jpg|jpeg|png)$", re.IGNORECASE)


@edataclass
class ConversationSample(Sample):
    """One conversation as read from the shard; images stay compressed bytes.

    Attributes:
        messages: ``[{"role": ..., "content": str | list of parts}]``.
        image_names: The document's ``images`` list, in order.
        images: Raw bytes of every image part present in the shard sample, by part name.
        loss_weight: The document's optional ``loss_weight`` (default 1.0).
        problem: ``"reason: detail"`` when the sample could not be read; the task encoder skips
            it under that reason.
    """

    messages: list
    image_names: list
    images: dict
    loss_weight: float = 1.0
    problem: str | None = None


@edataclass
class EncodedConversation(Sample):
    """A conversation after encoding: what waits in the packing buffer.

    Holds token ids and masks (small) and the images' compressed bytes; pixels are decoded only
    when the pack that holds this conversation is emitted.
    """

    input_ids: np.ndarray  # int64 [length]
    token_mask: np.ndarray  # float32 [length]
    images: list  # compressed bytes, in order of appearance
    image_grids: list  # (t, h, w) per image
    length: int  # real tokens
    cost: int  # length padded to pad_multiple: what the packer packs


@edataclass
class PackedSample(Sample):
    """One pack as it leaves ``pack_selected_samples``: the schema's :class:`Pack` plus
    Energon's keys (``__restore_key__`` lets ``loader.restore_sample`` rebuild it)."""

    pack: Pack


def _problem(reason: str, detail: str) -> dict[str, Any]:
    return {"messages": [], "image_names": [], "images": {}, "problem": f"{reason}: {detail}"}


def load_conversation(raw: dict[str, Any]) -> dict[str, Any]:
    """Shard sample (raw bytes by part name) -> ``ConversationSample`` fields; never raises."""
    if raw.get("__corrupt__"):  # marked by energon_packing.tolerant: the tar bytes were unreadable
        return _problem("corrupt_shard", raw["__corrupt__"])
    images = {name: data for name, data in raw.items() if IMAGE_PART.match(name)}
    data = raw.get("json")
    if data is None:
        return _problem("missing_json", "the sample has no .json part")
    if isinstance(data, (bytes, bytearray)):
        try:
            data = bytes(data).decode("utf-8")
        except UnicodeDecodeError as e:
            return _problem(
                "non_utf8", f"the .json part is not UTF-8 ({e.reason} at byte {e.start})"
            )
    if isinstance(data, str):
        try:
            data = json.loads(data)
        except json.JSONDecodeError as e:
            return _problem("malformed_json", f"{e.msg} at line {e.lineno} column {e.colno}")
    if not isinstance(data, dict):
        return _problem("malformed_json", f"top level is {type(data).__name__}, not an object")
    messages = data.get("messages")
    if messages is None:
        return _problem("missing_messages", "the document has no 'messages' list")
    if not isinstance(messages, list):
        return _problem("missing_messages", f"'messages' is {type(messages).__name__}, not a list")
    names = data.get("images", [])
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        return _problem("malformed_json", "'images' must be a list of part names")
    weight = data.get("loss_weight", 1.0)
    if (
        isinstance(weight, bool)
        or not isinstance(weight, (int, float))
        or not (math.isfinite(weight) and weight >= 0)
    ):
        return _problem(
            "malformed_json", f"'loss_weight' must be a finite number >= 0, got {weight!r}"
        )
    return {
        "messages": messages,
        "image_names": names,
        "images": images,
        "loss_weight": float(weight),
    }


def is_conversation_part(part: str) -> bool:
    """The parts the loader reads: the JSON document and image files."""
    return part == "json" or bool(IMAGE_PART.match(part))


def conversation_loader() -> Callable[[dict[str, Any]], dict[str, Any]]:
    """Zero-argument factory for ``dataset.yaml`` (Energon calls ``{__function__: ...}``)."""
    return load_conversation


def conversation_parts() -> Callable[[str], bool]:
    """Zero-argument factory for ``dataset.yaml``'s ``part_filter``."""
    return is_conversation_part


@stateless
def cook_conversation(sample: dict) -> ConversationSample:
    """Cooker for the crude-dataset route (``CrudeWebdataset`` + ``Cooker``), same loader."""
    return ConversationSample(**basic_sample_keys(sample), **load_conversation(sample))
