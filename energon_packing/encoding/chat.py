"""A conversation document -> turns of text and media references (format-agnostic).

Both content styles are read: a string with ``<image>`` / ``<video>`` / ``<audio>``
placeholders (LLaVA and ms-swift style) or a list of ``{"type": "text", "text": ...}``,
``{"type": "image", "image": name}``, ``{"type": "video", "video": name}`` and
``{"type": "audio", "audio": name}`` parts (Hugging Face style). Images are resolved against the
document's ``images`` list, videos against its ``videos`` list, audio clips against ``audios``
(``<video>`` and ``<audio>`` are text in a document that lists none of that kind). Every problem is a :class:`Skip`
with a skip-report reason. Also :class:`ChatLayout`, what both layouts (built-in and processor)
offer the task encoder. Pure: no Energon, no torch.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from energon_packing.config import Limits
from energon_packing.errors import Skip, quote
from energon_packing.media.audio import AUDIO_SUFFIXES, AudioLength, may_be_audio
from energon_packing.media.audio import length as audio_length
from energon_packing.media.images import VIDEO_SUFFIXES, may_be_image, may_be_video, probe
from energon_packing.packing.algorithms import round_up

if TYPE_CHECKING:
    from energon_packing.config import PackingConfig

__all__ = [
    "AUDIO",
    "AUDIO_PLACEHOLDER",
    "IMAGE",
    "IMAGE_PLACEHOLDER",
    "MAX_LOSS_WEIGHT",
    "MIN_LOSS_WEIGHT",
    "ROLES",
    "SPEAKER_ROLES",
    "VIDEO",
    "VIDEO_PLACEHOLDER",
    "WHOLE_MESSAGES",
    "ChatLayout",
    "Conversation",
    "ImageRefs",
    "Limits",
    "Media",
    "MediaRefs",
    "OverlongError",
    "Skip",
    "Turn",
    "VideoCosting",
    "audio_lengths",
    "brief",
    "check_loss_weight",
    "decode_once",
    "fit_to_capacity",
    "image_sizes",
    "parse_turns",
    "read_conversation",
    "trained_turns",
    "video_plans",
]

ROLES = ("system", "user", "assistant")
#: LLaVA / ShareGPT speakers -> roles: the loader reads a document's LLaVA turns and
#: ``energon-packing convert`` its records with this one mapping.
SPEAKER_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "system": "system",
}
IMAGE, VIDEO, AUDIO = "image", "video", "audio"
IMAGE_PLACEHOLDER = "<image>"
VIDEO_PLACEHOLDER = "<video>"
AUDIO_PLACEHOLDER = "<audio>"
PLACEHOLDERS = {IMAGE: IMAGE_PLACEHOLDER, VIDEO: VIDEO_PLACEHOLDER, AUDIO: AUDIO_PLACEHOLDER}


@dataclass(kw_only=True, slots=True, frozen=True)
class Media:
    """A media piece of a turn: the ``index``-th entry of the document's ``images`` or
    ``videos`` list (``kind``)."""

    kind: str
    index: int


#: ``(role, pieces)``: a piece is text or a :class:`Media` reference.
Turn = tuple[str, list["str | Media"]]


#: UTF-16 surrogates cannot be encoded; JSON's "\ud800" escapes produce them in Python strings.
_SURROGATE = re.compile("[\ud800-\udfff]")
#: Characters of a value quoted in a message or a log line.
BRIEF = 120
#: ``train_on`` values that train whole rendered messages (role header, trailing newline too).
WHOLE_MESSAGES = ("assistant_messages", "last_assistant_message")
#: The largest loss weight a sample (times its subflavor's) may carry.
MAX_LOSS_WEIGHT = 1000.0
#: The smallest: float32's (and bf16's) smallest normal number; below it a weight is 0 in bf16.
MIN_LOSS_WEIGHT = float(np.finfo(np.float32).tiny)


def brief(value: Any, limit: int = BRIEF) -> str:
    """:func:`energon_packing.errors.quote` at the shorter limit of a skip detail."""
    return quote(value, limit)


class OverlongError(ValueError):
    """``overlong="error"``: a conversation does not fit the pack width."""


class MediaRefs:
    """Resolves one kind's references (placeholders in order, or parts by name) against the
    document's list of that kind (``images`` or ``videos``)."""

    def __init__(
        self,
        names: Sequence[str],
        *,
        kind: str = IMAGE,
        max_count: int | None = None,
        knob: str = "max_images",
    ):
        self.kind = kind
        if max_count is not None and len(names) > max_count:
            raise Skip(
                f"too_many_{kind}s", f"{len(names)} {kind}s listed, more than {knob}={max_count}"
            )
        self.names = list(names)
        #: name -> its entries in the list (a medium shown twice may be listed twice)
        self.index: dict[str, list[int]] = {}
        for i, name in enumerate(self.names):
            self.index.setdefault(name, []).append(i)
        self.used = [False] * len(self.names)
        self.order: list[int] = []
        self._next = 0
        self._limit = (max_count, knob)

    def take(self, name: str | None) -> Media:
        kind = self.kind
        if name is None:
            while self._next < len(self.names) and self.used[self._next]:
                self._next += 1
            if self._next == len(self.names):
                raise Skip(
                    "placeholder_mismatch",
                    f"more {kind} references than the {len(self.names)} {kind}(s) in '{kind}s'",
                )
            i = self._next
        else:
            if name not in self.index:
                raise Skip(
                    f"missing_{kind}", f"{kind} part {brief(name)} is not in the '{kind}s' list"
                )
            entries = self.index[name]
            # shown again: the processor encodes a medium once per reference, so this one
            # stands here too (its entry not yet taken, else its first)
            i = next((j for j in entries if not self.used[j]), entries[0])
        limit, knob = self._limit
        if limit is not None and len(self.order) >= limit:  # a medium shown again counts too
            raise Skip(
                f"too_many_{kind}s", f"more than {knob}={limit} {kind}s shown (a repeat counts)"
            )
        self.used[i] = True
        self.order.append(i)
        return Media(kind=kind, index=i)

    def check_all_used(self) -> None:
        unused = [n for n, u in zip(self.names, self.used) if not u]
        if unused:
            placeholder = PLACEHOLDERS[self.kind]
            raise Skip(
                "placeholder_mismatch",
                f"{len(self.names)} {self.kind}(s) listed but {len(unused)} never referenced "
                f"({brief(', '.join(map(str, unused)))}); add a {placeholder} or a "
                f"{self.kind} part",
            )


class ImageRefs(MediaRefs):
    """:class:`MediaRefs` of the document's ``images``."""

    def __init__(self, names: Sequence[str], *, max_images: int | None = None):
        super().__init__(names, kind=IMAGE, max_count=max_images)


def parse_turns(
    messages: Sequence[Any],
    images: MediaRefs,
    *,
    videos: MediaRefs | None = None,
    audios: MediaRefs | None = None,
    limits: Limits | None = None,
) -> list[Turn]:
    """Messages -> ``[(role, pieces)]`` where a piece is text or a :class:`Media` reference.

    With ``limits``, the turn count is checked before anything is read and the text length as it
    is read, so a hostile conversation costs at most ``limits`` of work before its rejection.
    """
    if not messages:
        raise Skip("empty_conversation", "'messages' is empty")
    if limits is not None and len(messages) > limits.max_turns:
        raise Skip(
            "too_many_turns", f"{len(messages):,} messages, more than max_turns={limits.max_turns}"
        )
    budget = limits.max_text_chars if limits is not None else None
    videos = videos if videos is not None else MediaRefs([], kind=VIDEO)
    audios = audios if audios is not None else MediaRefs([], kind=AUDIO)
    refs = {IMAGE: images, VIDEO: videos, AUDIO: audios}
    # "<video>" / "<audio>" in a document without that kind is text (an HTML question)
    placeholders = {
        PLACEHOLDERS[kind]: found for kind, found in refs.items() if kind == IMAGE or found.names
    }
    split = re.compile("(" + "|".join(map(re.escape, placeholders)) + ")").split
    chars = 0
    turns = []
    for m, message in enumerate(messages):
        if not isinstance(message, dict) or "role" not in message or "content" not in message:
            raise Skip("malformed_message", f"messages[{m}] needs 'role' and 'content'")
        role, content = message["role"], message["content"]
        if not isinstance(role, str) or role not in ROLES:
            raise Skip(
                "unknown_role", f"messages[{m}] has role {brief(role)}; valid: {', '.join(ROLES)}"
            )
        pieces: list[str | Media] = []
        if isinstance(content, str):
            chars = _count(chars + len(content), budget, m)  # before split copies anything
            for text in split(content):
                if text in placeholders:
                    pieces.append(placeholders[text].take(None))
                elif text:  # "<image>\nWhat?" is [image, "\nWhat?"], as a parts list writes it
                    pieces.append(_text(text, m))
        elif isinstance(content, list):
            for p, part in enumerate(content):
                kind = part.get("type") if isinstance(part, dict) else None
                if kind == "text" and isinstance(part.get("text"), str):
                    chars = _count(chars + len(part["text"]), budget, m)
                    pieces.append(_text(part["text"], m))
                elif kind in refs and isinstance(part.get(kind, ""), str):
                    pieces.append(refs[kind].take(part.get(kind)))
                elif kind in ("input_audio", "audio_url"):
                    raise Skip(
                        "unsupported_media",
                        f"messages[{m}].content[{p}] is an {kind} part (inline or remote audio):"
                        f" name the clip's shard part instead, {{'type': 'audio', 'audio': "
                        f"name}}, listed in 'audios'",
                    )
                else:
                    raise Skip(
                        "malformed_message",
                        f"messages[{m}].content[{p}] must be {{'type': 'text', 'text': str}}, "
                        f"{{'type': 'image', 'image': name}}, {{'type': 'video', 'video': "
                        f"name}} or {{'type': 'audio', 'audio': name}}",
                    )
        else:
            raise Skip("malformed_message", f"messages[{m}].content is {type(content).__name__}")
        turns.append((role, pieces))
    images.check_all_used()
    videos.check_all_used()
    audios.check_all_used()
    return turns


def _count(chars: int, budget: int | None, m: int) -> int:
    if budget is not None and chars > budget:
        raise Skip(
            "text_too_long",
            f"more than max_text_chars={budget:,} characters of text by messages[{m}]; raise "
            f"max_text_chars if such conversations fit the pack",
        )
    return chars


def _text(text: str, m: int) -> str:
    bad = _SURROGATE.search(text)
    if bad:
        raise Skip(
            "invalid_text",
            f"messages[{m}] holds a lone UTF-16 surrogate ({bad.group()!a}) at character "
            f"{bad.start()}, which no tokenizer can encode",
        )
    return text


def check_loss_weight(weight: Any) -> float:
    """``weight`` as a float that is finite, > 0 and <= :data:`MAX_LOSS_WEIGHT` also in
    float32 (``token_mask``'s dtype) and a normal float32 (a subnormal such as 1e-45 is 0 in
    bf16), else :class:`Skip` ``bad_loss_weight``."""
    try:
        value = float(weight)
        with np.errstate(over="ignore", under="ignore"):
            narrow = float(np.float32(value))
        ok = not isinstance(weight, bool) and MIN_LOSS_WEIGHT <= narrow <= MAX_LOSS_WEIGHT
    except (TypeError, ValueError, OverflowError):
        ok = False
    if not ok:
        raise Skip(
            "bad_loss_weight",
            f"loss_weight {brief(weight)} must be a number >= {MIN_LOSS_WEIGHT:.3g} (the "
            f"smallest normal float32; smaller ones are 0 in bf16) and <= {MAX_LOSS_WEIGHT:g} "
            f"(also as float32: tiny values round to 0, huge ones to inf)",
        )
    return value


def trained_turns(roles: Sequence[str], train_on: str) -> set[int]:
    """Indices of the turns whose tokens train: every assistant turn, or only the last."""
    trained = [t for t, role in enumerate(roles) if role == "assistant"]
    if not trained:
        raise Skip("no_assistant_turn", "no message has role 'assistant', nothing to train on")
    return set(trained[-1:] if train_on.startswith("last_") else trained)


@dataclass(kw_only=True, slots=True)
class Conversation:
    """A document's checked turns: what every chat layout starts from."""

    weight: float
    refs: MediaRefs
    videos: MediaRefs
    turns: list[Turn]
    audios: MediaRefs
    #: indices into ``turns`` whose tokens train (``train_on``)
    trained: set[int]


def read_conversation(
    *,
    messages: Sequence[Any],
    image_names: Sequence[str],
    video_names: Sequence[str] = (),
    audio_names: Sequence[str] = (),
    loss_weight: Any,
    config: PackingConfig,
    find_special: Callable[[str], str | None],
) -> Conversation:
    """The checks every layout shares, bounded by ``config.limits``, before any tokenizing:
    loss weight, image references, turns, a trained turn with text, and (with
    ``special_token_text="skip"``) no text spelling a special token (``find_special``)."""
    weight = check_loss_weight(loss_weight)
    limits = config.limits  # built on each access
    refs = ImageRefs(image_names, max_images=limits.max_images)
    videos = MediaRefs(video_names, kind=VIDEO, max_count=limits.max_images)
    audios = MediaRefs(audio_names, kind=AUDIO, max_count=limits.max_images)
    turns = parse_turns(messages, refs, videos=videos, audios=audios, limits=limits)
    trained = trained_turns([role for role, _ in turns], config.train_on)
    if not any(isinstance(p, str) and p.strip() for t in trained for p in turns[t][1]):
        raise Skip("empty_assistant", "the trained assistant turn(s) hold no text")
    if config.special_token_text == "skip":
        for m, (_, pieces) in enumerate(turns):
            for piece in pieces:
                if isinstance(piece, str) and (found := find_special(piece)):
                    raise Skip(
                        "special_token_text",
                        f"messages[{m}] spells the special token {found!r} "
                        f"(special_token_text='skip'; 'text' tokenizes it as plain text)",
                    )
    return Conversation(
        weight=weight, refs=refs, videos=videos, audios=audios, turns=turns, trained=trained
    )


def image_sizes(
    refs: ImageRefs,
    *,
    image_names: Sequence[str],
    images: Mapping[str, bytes],
    max_pixels: int | None,
) -> list[tuple[int, int]]:
    """``(width, height)`` of each referenced image in order of appearance, from its header
    (nothing decoded); a missing, unreadable or over-budget image is a :class:`Skip`."""
    sizes = []
    for i in refs.order:
        name = image_names[i]
        if name not in images:
            raise Skip(
                "missing_image", f"image {brief(name)} is listed but {_why_absent(name, images)}"
            )
        try:
            sizes.append(probe(images[name], max_pixels=max_pixels))
        except Skip as e:
            raise Skip(e.reason, f"image {brief(name)}: {e.detail}") from None
    return sizes


def audio_lengths(
    refs: MediaRefs,
    *,
    audio_names: Sequence[str],
    audios: Mapping[str, bytes],
    takes_audio: str | None,
    max_seconds: float | None,
) -> list[AudioLength]:
    """The length of each referenced clip in order of appearance (from its header where that
    is exact, else decoded: :func:`~energon_packing.media.audio.length`); ``takes_audio``:
    None where the layout takes audio, else why not (the ``unsupported_audio`` detail). A
    missing, unreadable or over-long clip is a :class:`Skip`."""
    lengths = []
    for i in refs.order:
        name = audio_names[i]
        if name not in audios:
            raise Skip(
                "missing_audio",
                f"audio {brief(name)} is listed but {_why_absent(name, audios, kind=AUDIO)}",
            )
        if takes_audio is not None:
            raise Skip("unsupported_audio", f"audio {brief(name)}: {takes_audio}")
        try:
            lengths.append(audio_length(audios[name], max_seconds=max_seconds))
        except Skip as e:
            raise Skip(e.reason, f"audio {brief(name)}: {e.detail}") from None
    return lengths


class VideoCosting(Protocol):
    """What a layout needs of videos (``energon_packing.media.video_side.VideoSide`` is one; the
    encoding room never imports it: torch and PyAV live there)."""

    def plan(self, data: bytes) -> Any:
        """The video's plan from its header (``grid``, ``tokens``, ``expansion(...)``,
        ``rope_grids()``, ``time_intervals(...)``); :class:`Skip` if it cannot be used."""

    def media(self, data: bytes, plan: Any = None) -> dict[str, np.ndarray]:
        """The video's model inputs, decoded now and checked against its plan (the one made
        at encode time; None: made again from the header)."""

    def check_time_aligned(self, position_id_per_seconds: float) -> None:
        """Raises ValueError where a time-aligned family's (the Omni thinkers') video
        positions under these settings cannot be packed."""


def video_plans(
    refs: MediaRefs,
    *,
    video_names: Sequence[str],
    videos: Mapping[str, bytes],
    side: VideoCosting | None,
    layout: str,
) -> list[Any]:
    """The plan of each referenced video in order of appearance, from its header (nothing
    decoded); a missing or unusable video is a :class:`Skip`."""
    plans = []
    for i in refs.order:
        name = video_names[i]
        if name not in videos:
            raise Skip(
                "missing_video",
                f"video {brief(name)} is listed but {_why_absent(name, videos, kind=VIDEO)}",
            )
        if side is None:
            raise Skip("unsupported_video", f"video {brief(name)}: {layout} takes no videos")
        try:
            plans.append(side.plan(videos[name]))
        except Skip as e:
            raise Skip(e.reason, f"video {brief(name)}: {e.detail}") from None
    return plans


def decode_once(decode: Callable[..., Any], media: Sequence[bytes], *more: Sequence[Any]) -> list:
    """``decode(data, *more_i)`` of each medium in order; a medium shown twice (the same
    bytes) is decoded once and stands where each reference does, as a processor given it
    twice lays it out."""
    done: dict[bytes, Any] = {}
    out = []
    for data, *rest in zip(media, *more):
        if data not in done:
            done[data] = decode(data, *rest)
        out.append(done[data])
    return out


def _why_absent(name: str, images: Mapping[str, bytes], *, kind: str = IMAGE) -> str:
    if "/" in name:  # WebDataset's rule: the key is everything before the file name's first dot
        return "a part name cannot hold '/' (the tar member would belong to another key)"
    if kind == VIDEO and not may_be_video(name):
        return (
            f"only parts named *.{', *.'.join(sorted(VIDEO_SUFFIXES))} are read as videos "
            f"(VIDEO_SUFFIXES)"
        )
    if kind == VIDEO:
        return f"the shard sample has no such part (its video parts: {brief(sorted(images))})"
    if kind == AUDIO and not may_be_audio(name):
        return (
            f"only parts named *.{', *.'.join(sorted(AUDIO_SUFFIXES))} are read as audio "
            f"(AUDIO_SUFFIXES)"
        )
    if kind == AUDIO:
        return f"the shard sample has no such part (its audio parts: {brief(sorted(images))})"
    if not may_be_image(name):
        suffix = name.rpartition(".")[2]
        return (
            f"parts named *.{brief(suffix, 40)[1:-1]} are never read as images (NOT_IMAGE_SUFFIXES)"
        )
    return f"the shard sample has no such part (its image parts: {brief(sorted(images))})"


def fit_to_capacity(
    encoding: Any, *, key: str, media_end: Callable[[], int], config: PackingConfig
) -> Any:
    """Applies the ``overlong`` policy to an encoding (``input_ids``, ``token_mask``,
    ``truncated``); the packing cost is computed on the result. Truncation cuts in place and
    never cuts an image or a video: ``media_end()`` (asked only when cutting) is the token its
    media end at."""
    capacity, multiple = config.max_input_seq_length, config.pad_multiple
    length = len(encoding.input_ids)
    cost = round_up(length, multiple)
    if cost <= capacity:
        return encoding
    what = (
        f"{length} tokens ({cost} padded to pad_multiple={multiple}) > "
        f"max_input_seq_length={capacity}"
    )
    if config.overlong == "error":
        raise OverlongError(
            f"sample {brief(key)}: {what}. Set overlong='truncate' or 'drop', or raise "
            f"max_input_seq_length"
        )
    if config.overlong == "drop":
        raise Skip("overlong", what, cost=cost)
    if (end := media_end()) > capacity:
        raise Skip(
            "overlong_media",
            f"{what}; its images / videos / audio clips end at token {end} and are never cut",
        )
    if not any(w > 0 for w in encoding.token_mask[:capacity]):
        raise Skip(
            "overlong_no_trained_token", f"{what}; the first {capacity} tokens train nothing"
        )
    encoding.truncated = length - capacity
    del encoding.input_ids[capacity:]
    del encoding.token_mask[capacity:]
    return encoding


@runtime_checkable
class ChatLayout(Protocol):
    """What a chat layout offers the task encoder: the built-in one
    (:class:`~energon_packing.encoding.builtin.BuiltinChat`) and a processor's
    (:class:`~energon_packing.encoding.processor.ProcessorChat`) both are one.

    ``encode`` costs a conversation from its media headers (no pixel decoded) and
    ``sources`` turns a pack's conversations into :class:`~energon_packing.schema.Source`
    objects (decoding their media now), each or the exception it alone failed with.
    """

    family_name: str
    #: the layout's tokenizer (a ChatTokenizer on the built-in layout, the processor's on the
    #: processor path)
    tokenizer: Any
    pad_id: int
    image_token_id: int | None
    mrope: Any  # the MRope spec, or None for 1-row positions
    videos: VideoCosting | None
    #: a conversation with audio clips shares its pack only with text: the family's model
    #: mixes a call's clips with the rest of the call (``AudioRule.alone``: Phi-4-multimodal)
    clips_alone: bool
    #: the token that parts an image's rows (Pixtral's ``[IMG_BREAK]``), or None
    row_break_id: int | None

    @property
    def fingerprint(self) -> str: ...

    def image_tiles(self, sizes: list[list[tuple[int, int]]]) -> list[int]: ...

    def encode(self, *, config: PackingConfig, **fields: Any) -> Any: ...

    def sources(self, *, items: Sequence[Mapping[str, Any]], config: PackingConfig) -> list: ...

    def empty_media(self, config: PackingConfig) -> dict[str, np.ndarray]: ...
