"""The Energon sample types and the sample loader that ``dataset.yaml`` points at.

A shard sample is ``<key>.json`` = ``{"messages": [...], "images": ["img0.jpg", ...],
"videos": ["clip.mp4", ...], "audios": ["speech.wav", ...]}`` plus image parts
``<key>.img0.jpg``, ``<key>.photo (1).png``, ``<key>.图片.webp``, video parts ``<key>.clip.mp4``
(``.mp4 .m4v .mkv .webm .mov .avi``) and audio parts ``<key>.speech.wav``
(``.wav .flac .mp3 .ogg .opus .m4a``), videos and audio kept compressed until their pack is
emitted. WebDataset and
Energon split a member's name at the first dot of its file name: the key is what comes before
(so a key's file name holds no dot), the part name all after (so it holds no ``/``); any other
character is fine. Images are recognised by content, whatever their extension
(:func:`~energon_packing.media.images.may_be_image`). The loader is total: it never raises on
bad data (Energon would print a traceback and a sample dump per failure); it records
``problem`` and the task encoder skips the sample with that reason, counted and reported.

``.nv-meta/dataset.yaml``::

    sample_type: {__module__: energon_packing.loader.samples, __class__: ConversationSample}
    sample_loader: {__module__: energon_packing.loader.samples, __function__: conversation_loader}
    part_filter: {__module__: energon_packing.loader.samples, __function__: conversation_parts}

A ``field_map`` instead (Energon's other route) cannot build a :class:`ConversationSample` (it
maps one part per field; the images are every image part), and a part it names that the shard
lacks fails every sample: :func:`check_field_map` makes that a :class:`FieldMapError`, raised
when the loader is built (from the first sample of the first shard) for any sample type.
"""

from __future__ import annotations

import dataclasses
import json
import re
import unicodedata
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from megatron.energon import Sample, basic_sample_keys, edataclass, stateless
from megatron.energon.errors import FatalSampleError

from energon_packing.encoding.chat import Skip, brief, check_loss_weight
from energon_packing.errors import cut, describe
from energon_packing.incoming.turns import read_turns
from energon_packing.media.audio import may_be_audio
from energon_packing.media.images import may_be_image, may_be_video
from energon_packing.schema import Pack

__all__ = [
    "ConversationSample",
    "EncodedConversation",
    "FieldMapError",
    "PackedSample",
    "check_field_map",
    "conversation_loader",
    "conversation_parts",
    "cook_conversation",
    "field_parts",
    "guard_field_map",
    "load_conversation",
]

#: A ``.json`` part larger than this is skipped (``too_large``) before it is decoded: no sample
#: may cost a worker more memory than this to reject.
MAX_DOCUMENT_BYTES = 16 << 20


@edataclass
class ConversationSample(Sample):
    """One conversation as read from the shard; images stay compressed bytes.

    Attributes:
        messages: ``[{"role": ..., "content": str | list of parts}]``.
        image_names: The document's ``images`` list, in order.
        images: Raw bytes of every image part present in the shard sample, by part name.
        loss_weight: The document's optional ``loss_weight`` (default 1.0).
        problem: ``(reason, detail)`` when the sample could not be read; the task encoder skips
            it under that reason.
        video_names: The document's ``videos`` list, in order.
        videos: Raw bytes of every video part present, by part name.
        audio_names: The document's ``audios`` list, in order.
        audios: Raw bytes of every audio part present, by part name.
    """

    messages: list
    image_names: list
    images: dict
    loss_weight: float = 1.0
    problem: tuple[str, str] | None = None
    video_names: list = dataclasses.field(default_factory=list)
    videos: dict = dataclasses.field(default_factory=dict)
    audio_names: list = dataclasses.field(default_factory=list)
    audios: dict = dataclasses.field(default_factory=dict)


@edataclass
class EncodedConversation(Sample):
    """A conversation after encoding: what waits in the packing buffer.

    Holds token ids and masks (small) and the images' compressed bytes; pixels are decoded only
    when the pack that holds this conversation is emitted.
    """

    input_ids: np.ndarray  # int64 [length]
    token_mask: np.ndarray  # float32 [length]
    images: list  # compressed bytes, in order of appearance
    length: int  # real tokens
    cost: int  # length padded to pad_multiple: what the packer packs
    videos: list = dataclasses.field(default_factory=list)  # compressed bytes, in order
    #: each video's plan from its header (frames, grid, tokens), so it is not read again
    video_plans: list = dataclasses.field(default_factory=list)
    #: each image's and video's grid ``(t, h, w)`` in patches, from headers (what balanced
    #: emission prices its vision encoder by)
    grids: list = dataclasses.field(default_factory=list)
    audios: list = dataclasses.field(default_factory=list)  # compressed bytes, in order
    #: each audio clip's mel frames (what balanced emission prices its audio encoder by;
    #: empty where no audio encoder is priced)
    audio_frames: list = dataclasses.field(default_factory=list)
    #: whom it may share its pack with (``packing.Company``: a Phi-4-multimodal conversation
    #: with clips only with conversations without media)
    company: int = 0
    #: a prefix-LM family's prefix, in tokens (PaliGemma: its suffix's first token, where its
    #: ``token_type_ids`` turn 1; None: not prefix-LM)
    prefix_length: int | None = None


@edataclass
class PackedSample(Sample):
    """One pack as it leaves ``pack_selected_samples``: the schema's :class:`Pack` plus
    Energon's keys (``__restore_key__`` lets ``loader.restore_sample`` rebuild it)."""

    pack: Pack


def _problem(reason: str, detail: str) -> dict[str, Any]:
    return {"messages": [], "image_names": [], "images": {}, "problem": (reason, detail)}


def load_conversation(raw: dict[str, Any]) -> dict[str, Any]:
    """Shard sample (raw bytes by part name) -> ``ConversationSample`` fields; never raises.

    Whatever goes wrong reading one sample (bad bytes, bad JSON, JSON nested past the
    recursion limit, numbers no float holds, a document over :data:`MAX_DOCUMENT_BYTES`) is a
    ``problem`` the task encoder reports as a skip with its reason: nothing fatal, nothing silent.
    """
    try:
        return _load(raw)
    except Skip as e:
        return _problem(e.reason, e.detail)
    except (RecursionError, MemoryError) as e:
        return _problem(
            "malformed_json", f"the document is too deep or too big ({type(e).__name__})"
        )
    except Exception as e:  # no sample may stop the reader
        return _problem("unreadable_sample", describe(e))


def _load(raw: dict[str, Any]) -> dict[str, Any]:
    if raw.get("__corrupt__"):  # marked by loader.energon: the tar bytes were unreadable
        raise Skip("corrupt_shard", cut(str(raw["__corrupt__"])))
    images = {
        name: data
        for name, data in raw.items()
        if not name.startswith("__") and isinstance(data, bytes) and may_be_image(name)
    }
    videos = {
        name: data
        for name, data in raw.items()
        if not name.startswith("__") and isinstance(data, bytes) and may_be_video(name)
    }
    audios = {
        name: data
        for name, data in raw.items()
        if not name.startswith("__") and isinstance(data, bytes) and may_be_audio(name)
    }
    data = raw.get("json")
    if data is None:
        raise Skip("missing_json", "the sample has no .json part")
    if len(data) > MAX_DOCUMENT_BYTES:
        raise Skip(
            "too_large",
            f"the .json part holds {len(data):,} bytes, more than {MAX_DOCUMENT_BYTES:,}; "
            f"it was not decoded",
        )
    if isinstance(data, (bytes, bytearray)):
        try:
            data = bytes(data).decode("utf-8")
        except UnicodeDecodeError as e:
            raise Skip(
                "non_utf8", f"the .json part is not UTF-8 ({e.reason} at byte {e.start})"
            ) from None
    if isinstance(data, str):
        try:
            data = json.loads(data)
        except json.JSONDecodeError as e:
            raise Skip("malformed_json", f"{e.msg} at line {e.lineno} column {e.colno}") from None
        except (ValueError, RecursionError) as e:  # e.g. an integer of over 4,300 digits
            raise Skip("malformed_json", describe(e)) from None
    if not isinstance(data, dict):
        raise Skip("malformed_json", f"top level is {type(data).__name__}, not an object")
    messages = data.get("messages")
    if messages is None and isinstance(data.get("conversations"), list):
        messages = _from_value(data["conversations"])
    if messages is None:
        raise Skip(
            "missing_messages",
            "the document has no 'messages' list (nor LLaVA 'conversations'); "
            "`energon-packing convert` turns LLaVA, ShareGPT, messages JSONL and Hugging Face "
            "datasets into this format",
        )
    if not isinstance(messages, list):
        raise Skip("missing_messages", f"'messages' is {type(messages).__name__}, not a list")
    _refuse_unpacked(data)
    names = _listed(data, messages, images, kind="image")
    video_names = _listed(data, messages, videos, kind="video")
    audio_names = _listed(data, messages, audios, kind="audio")
    return {
        "messages": messages,
        "image_names": names,
        "images": images,
        "loss_weight": check_loss_weight(data.get("loss_weight", 1.0)),
        "video_names": video_names,
        "videos": videos,
        "audio_names": audio_names,
        "audios": audios,
    }


def _refuse_unpacked(data: dict) -> None:
    """ms-swift's grounding ``objects``: skipped, never packed as the text left without them
    (``<bbox>`` trained as text)."""
    if data.get("objects"):
        raise Skip(
            "unsupported_field",
            "the document carries ms-swift's grounding 'objects' (filling <ref-object> / "
            "<bbox>): not packed, the tags would train as literal text",
        )


def _from_value(turns: list) -> list:
    """LLaVA's ``[{"from": "human", "value": ...}]`` as ``messages``, read by convert's turn
    reader (:func:`energon_packing.incoming.turns.read_turns`: one reader of LLaVA turns)."""
    turns = read_turns(turns, key="conversations", malformed="malformed_message")
    return [{"role": role, "content": content} for role, content in turns]


def _listed(data: dict, messages: list, parts: dict[str, bytes], *, kind: str) -> list[str]:
    """The document's ``images`` (``videos``) list, or the one it implies (:func:`_implied`),
    each name aliased to its part up to Unicode normalization."""
    names = data.get(f"{kind}s")
    if names is None:
        names = _implied(messages, parts, data.get(kind), kind=kind)
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise Skip("malformed_json", f"'{kind}s' must be a list of part names")
    _alias_normalized(names, parts)
    return names


def _implied(messages: list, parts: dict[str, bytes], field: Any, *, kind: str) -> list[str]:
    """The ``images`` (``videos``) list a document without one implies: the parts of that
    kind its content names (in order), LLaVA's ``image`` (LLaVA-Video's ``video``) field, or
    the sample's only part of that kind when the content refers to one without naming it
    (one ``<image>`` / ``<video>``)."""
    named: list[str] = []
    unnamed = 0
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            unnamed += content.count(f"<{kind}>")
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and part.get("type") == kind:
                    name = part.get(kind)
                    if isinstance(name, str) and name not in named:
                        named.append(name)
                    elif name is None:
                        unnamed += 1
    if named:
        return named
    if isinstance(field, str) and field in parts:
        return [field]
    if unnamed == 1 and len(parts) == 1:
        return list(parts)
    return []


def _alias_normalized(names: list[str], images: dict[str, bytes]) -> None:
    """A listed name that matches a part only up to Unicode normalization (``é`` composed in
    the JSON, decomposed in a tar written on macOS) is the same image: alias it."""
    missing = [name for name in names if name not in images]
    if not missing:
        return
    by_form = {unicodedata.normalize("NFC", part): part for part in images}
    for name in missing:
        part = by_form.get(unicodedata.normalize("NFC", name))
        if part is not None:
            images[name] = images[part]


def is_conversation_part(part: str) -> bool:
    """The parts the loader reads: the JSON document, every part that may be an image (any
    name but text, tensor, audio, video and archive suffixes: content decides) and the video
    parts (:data:`~energon_packing.media.images.VIDEO_SUFFIXES`) and the audio parts
    (:data:`~energon_packing.media.audio.AUDIO_SUFFIXES`)."""
    return part == "json" or may_be_image(part) or may_be_video(part) or may_be_audio(part)


def conversation_loader() -> Callable[[dict[str, Any]], dict[str, Any]]:
    """Zero-argument factory for ``dataset.yaml`` (Energon calls ``{__function__: ...}``)."""
    return load_conversation


def conversation_parts() -> Callable[[str], bool]:
    """Zero-argument factory for ``dataset.yaml``'s ``part_filter``."""
    return is_conversation_part


class FieldMapError(FatalSampleError):
    """A ``dataset.yaml`` ``field_map`` names a part the samples lack: every sample would fail
    alike, so the first stops the loader (a :class:`FatalSampleError`: Energon re-raises it)."""


#: ``part[field][...]``: the part is the name before the first ``[`` (Energon's syntax).
_FIELD_PART = re.compile(r"^\s*([^\[\]]+?)\s*(?:\[|$)")


def check_field_map(
    sample: Mapping[str, Any],
    field_map: Mapping[str, Any],
    *,
    config: str = "dataset.yaml",
    conversation: bool = True,
    filtered: bool = True,
) -> None:
    """Raises :class:`FieldMapError` naming the field, the part, the key and ``config`` (the
    yaml) when no option (``a,b``: ``a`` else ``b``) of a ``field_map`` entry names a part
    ``sample`` holds.

    ``field_map`` as written in the yaml (``{"messages": "conv[messages]"}``) or as Energon
    parses it (``{"messages": [["conv", "messages"]]}``). ``conversation``: the yaml builds a
    :class:`ConversationSample` (the fix then names this package's own ``dataset.yaml``).
    ``filtered``: ``sample`` holds only the parts the map names (Energon's ``part_filter``
    dropped the rest before the sample loader).
    """
    parts = sorted(k for k in sample if not k.startswith("__"))
    for field, spec in field_map.items():
        options = field_parts(spec)
        if options and not any(part in sample for part in options):
            key = sample.get("__key__")
            fix = "name a part the shards hold"
            if conversation:
                fix += (
                    ", or use energon_packing's configs/dataset.yaml (sample_loader: "
                    "conversation_loader, part_filter: conversation_parts), which reads "
                    "<key>.json and its image parts"
                )
            raise FieldMapError(
                f"sample {brief(key)}: {config} field_map maps field {field!r} to part "
                f"{' or '.join(map(repr, options))}, which the sample does not have ("
                f"{'of the parts the field_map names, ' if filtered else ''}it holds "
                f"{brief(parts)}); every sample would fail alike: {fix}"
            )


def field_parts(spec: Any) -> list[str]:
    """The parts a ``field_map`` entry may read, in order: its options' names before any
    ``[``, from the yaml's string or Energon's parse (``[["part", "field"], ...]``)."""
    if isinstance(spec, str):
        return [m.group(1) for o in spec.split(",") if (m := _FIELD_PART.match(o))]
    return [str(option[0]) for option in spec if option]


def guard_field_map(
    load: Callable[[Any], Any], field_map: Mapping[str, str]
) -> Callable[[Any], Any]:
    """``load`` (a factory's field-map sample loader) with :func:`check_field_map` first."""

    def guarded(sample: Any) -> Any:
        check_field_map(sample, field_map)
        return load(sample)

    return guarded


@stateless
def cook_conversation(sample: dict) -> ConversationSample:
    """Cooker for the crude-dataset route (``CrudeWebdataset`` + ``Cooker``), same loader."""
    return ConversationSample(**basic_sample_keys(sample), **load_conversation(sample))
