"""Any Hugging Face VLM through its own processor: chat template, image tokens, pixels.

A conversation is rendered by the processor's chat template and tokenized exactly as
``processor.apply_chat_template(messages, tokenize=True)`` would (the processor's own
``replace_image_token`` expands each image placeholder, ``replace_video_token`` each video's),
but at encode time from the image and video *headers* alone: the family's size rule (:mod:`.families`) feeds the processor's own expansion,
so the predicted length is the real one and no pixel is decoded while a conversation waits in
the buffer. Text is tokenized once, there. At pack time only the image side runs: the image
processor on the decoded images (one call for a whole pack where the family's image processor
takes each image alone, as Qwen's does: the same values, a fraction of the per-call cost), whose
outputs must give each conversation's expansion (a mismatch is an error naming the family, the
image sizes and both expansions, and costs that conversation alone)::

    messages --template--> text --expand from sizes--> ids, loss mask     (encode: no pixels)
    decoded images --image processor--> pixel_values, ... (== predicted expansion)  (pack time)

Loss mask, for any template: message prefixes are rendered and diffed, so an assistant turn's
span is ``render(messages[:k+1]) - render(messages[:k], add_generation_prompt=True)``::

    <|im_start|>user\\nWhat is red?<|im_end|>\\n<|im_start|>assistant\\nThe circle.<|im_end|>\\n
                                                                    ^^^^^^^^^^^^^^^^^^^^^^^^
    train_on="all_assistant": the reply and its end-of-turn marker (trailing newline excluded)

``train_on="assistant_messages"`` trains the whole rendered message instead
(``render(messages[:k+1]) - render(messages[:k])``: role header and trailing newline too).
An image's tokens never train, wherever it sits: its expansion and the markup the template
writes around its placeholder (found once by rendering a probe message with and without an
image, e.g. ``<|vision_start|>...<|vision_end|>``) are masked out of every span.

Text that spells a special token (or the processor's image placeholder) gets a zero-width space
after its first character before rendering, so the tokenizer reads it as text (the rule of
:mod:`.tokenizer`); equality with the processor's own output holds for every text that spells
none. No torch: the image processor is asked for numpy arrays.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from energon_packing.encoding import av_interleave, hf_compat
from energon_packing.encoding.chat import (
    WHOLE_MESSAGES,
    Skip,
    Turn,
    VideoCosting,
    audio_lengths,
    decode_once,
    fit_to_capacity,
    image_sizes,
    read_conversation,
    video_plans,
)
from energon_packing.encoding.families import audio_families, family_of, refusal
from energon_packing.encoding.models import info_of
from energon_packing.encoding.positions import MRope, mrope_positions
from energon_packing.encoding.prefix_lm import PREFIX_TYPES, suffix_types
from energon_packing.encoding.processor_audio import AudioSide
from energon_packing.encoding.processor_images import (
    ImageSide,
    ProcessorMismatchError,
    slot_ids,
)
from energon_packing.encoding.rendering import (
    backend_encoder,
    compiled_renderer,
    span_mask,
    tokenize,
)
from energon_packing.encoding.video_tiles import placed, tiles_in_order
from energon_packing.errors import describe
from energon_packing.schema import Source

if TYPE_CHECKING:
    from energon_packing.config import PackingConfig

__all__ = ["ProcessorChat", "ProcessorEncoding", "ProcessorMismatchError"]

logger = logging.getLogger(__name__)

#: Inserted after the first character of a special token spelled in conversation text.
ESCAPE = "\u200b"
#: Qwen2.5-VL's published ``vision_config.tokens_per_second`` (transformers' class default is 4).
TOKENS_PER_SECOND = 2


@dataclass(kw_only=True, slots=True)
class ProcessorEncoding:
    """One conversation, encoded through a processor (no pixels)."""

    input_ids: list[int]
    token_mask: list[float]
    image_order: list[int] = field(default_factory=list)
    video_order: list[int] = field(default_factory=list)
    #: each video's plan from its header, in the same order
    video_plans: list = field(default_factory=list)
    audio_order: list[int] = field(default_factory=list)
    #: each audio clip's mel frames (the audio encoder's cost), in the order the clips go to
    #: the feature extractor: the clips and the videos' own tracks as the text shows them
    audio_frames: list[int] = field(default_factory=list)
    truncated: int = 0
    #: a prefix-LM family's prefix, in tokens (its suffix's first token; None: not prefix-LM)
    prefix_length: int | None = None
    #: each image's tiles through the vision tower, where its tokens do not tell them
    #: (``Family.tiles``: anyres); empty otherwise
    tiles: list[int] = field(default_factory=list)

    @property
    def length(self) -> int:
        return len(self.input_ids)


class ProcessorChat:
    """Conversations through a Hugging Face processor (or, text only, a tokenizer).

    Args:
        processor: A ``transformers`` processor of a family in
            :data:`~energon_packing.encoding.families.FAMILIES`, or a tokenizer with a chat
            template (text-only conversations).
        chat_template_kwargs: Keyword arguments for ``apply_chat_template``.

    Raises:
        ValueError: no chat template, a slow tokenizer, or an unknown processor family.
    """

    def __init__(
        self,
        processor: Any,
        *,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        tokens_per_second: float = TOKENS_PER_SECOND,
    ):
        self.processor = processor
        #: attached by the task encoder for a family that takes videos (``Family.videos``)
        self.videos: VideoCosting | None = None
        self.tokenizer = getattr(processor, "tokenizer", None) or processor
        self.has_images = getattr(processor, "image_processor", None) is not None
        self.kwargs = dict(chat_template_kwargs or {})
        self.name = type(processor).__name__
        self.family = family_of(processor) if self.has_images else None
        if self.has_images and self.family is None:
            model = info_of(processor)
            raise ValueError(refusal(self.name, model.model_type if model else None))
        if not self._template():
            raise ValueError(
                f"{self.name} has no chat template: pass a processor or tokenizer whose "
                f"chat_template is set (processor.chat_template = '...'), or use tokenizer= for "
                f"the built-in ChatML layout"
            )
        if not getattr(self.tokenizer, "is_fast", False):
            raise ValueError(
                f"{self.name}'s tokenizer is not a fast tokenizer: the loss mask needs its "
                f"offset mapping"
            )
        broken = hf_compat.broken_forward(self.family.name if self.family else None)
        if broken:
            raise ValueError(f"{self.name}: model family {self.family.name!r}: {broken}")
        self.family_name = self.family.name if self.family else "text"
        self.image_token = getattr(processor, "image_token", None) if self.has_images else None
        self.image_token_id = None  # the id the model replaces with vision features
        if self.image_token:
            self.image_token_id = slot_ids(processor, self.family)[0]
        #: the token that parts an image's rows of tokens (Pixtral's ``[IMG_BREAK]``), which
        #: the step-cost model reads an image's grid by; None: no such token
        breaks = getattr(processor, "image_break_token", None) if self.image_token else None
        self.row_break_id = self.tokenizer.convert_tokens_to_ids(breaks) if breaks else None
        pad = self.tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else (self.tokenizer.eos_token_id or 0)
        self.video_style = self.family.videos if self.family else None
        self.video_token = getattr(processor, "video_token", None) if self.video_style else None
        #: what decides how videos are sampled and sized: the video processor, or the settings
        #: of one that could not be built (no torchvision: ``load_processor``)
        self.video_settings = getattr(processor, "video_processor", None) or getattr(
            processor, "video_settings", None
        )
        self.video_token_id = (
            self.tokenizer.convert_tokens_to_ids(self.video_token) if self.video_token else None
        )
        #: the family's audio work (None: audio clips are skipped ``unsupported_audio``)
        self.audio: AudioSide | None = None
        self.clips_alone = False
        if self.family is not None and self.family.audio is not None:
            self.audio = AudioSide(processor, self.family.audio)
            self.clips_alone = self.family.audio.alone
            mixing = hf_compat.omni_audio_mixing(self.family.name)
            if mixing:  # the other trainers' paths never see the model: said once, here
                logger.warning(
                    "%s: a pack's clips from several conversations would hear each other's "
                    "there; to_hf refuses such packs, and any other forward of them is not "
                    "exact; %s",
                    *mixing,
                )
        self.mrope = None
        if self.family is not None and self.family.mrope:
            self.mrope = MRope(
                vision_start_id=self.tokenizer.convert_tokens_to_ids(self.family.vision_start),
                image_pad_id=self.image_token_id,
                merge_size=processor.image_processor.merge_size,
                video_pad_id=self.video_token_id,
                tokens_per_second=tokens_per_second if self.family_name == "qwen2_5_vl" else None,
                position_id_per_seconds=self._position_id_per_seconds(),
                **self._track_spec(),
            )
        #: whether each video's own audio track is interleaved with its frames
        #: (``audio_config['load_audio_from_video']``: :meth:`interleave_tracks`)
        self.audio_in_video = False
        protected = {t.content for t in self.tokenizer.added_tokens_decoder.values() if t.special}
        protected |= {
            getattr(processor, name, None) or ""
            for name in (
                "image_token",
                "boi_token",
                "video_token",
                "audio_token",
                "start_image_token",  # InternVL's <img> / </img>: they delimit its tiles
                "end_image_token",
            )
        }
        ordered = sorted((t for t in protected if len(t) > 1), key=len, reverse=True)
        self._protected = re.compile("|".join(map(re.escape, ordered))) if ordered else None
        self.images = ImageSide(processor, self.family, self.render) if self.has_images else None
        variables = {**self.tokenizer.special_tokens_map, **self.kwargs}
        fast = compiled_renderer(self._template(), variables, self.render, self.has_images)
        self._prefix_render = fast or self.render
        self._encode_text = backend_encoder(self.tokenizer) or self._tokenize
        self._fingerprint: str | None = None

    def __repr__(self) -> str:
        return f"ProcessorChat({self.name}, family={self.family_name})"

    def _template(self) -> Any:
        """The processor's chat template, else its tokenizer's, else its family's layout
        (``Family.template``: PaliGemma's processor ships none). A prefix-LM family's layout
        always: its processor's ``text`` / ``suffix`` call is the layout, whatever template a
        processor or tokenizer carries besides."""
        if self.family is not None and self.family.prefix_lm:
            return self.family.template
        return (
            getattr(self.processor, "chat_template", None)
            or getattr(self.tokenizer, "chat_template", None)
            or (self.family.template if self.family else None)
        )

    @property
    def fingerprint(self) -> str:
        """A short digest of everything of the processor that decides ids, masks and pixels:
        family and class, chat template and its kwargs, the image processor's and the
        processor's settings, the tokenizer's size, added and special tokens. Equal across
        processes for equal processors."""
        if self._fingerprint is None:
            tokenizer = self.tokenizer
            settings = {}
            if self.has_images:
                settings = {
                    k: v
                    for k, v in self.processor.to_dict().items()
                    if k not in ("tokenizer", "video_processor", "chat_template")
                }
            parts = {
                "family": self.family_name,
                "class": self.name,
                "template": self._template(),
                "kwargs": self.kwargs,
                "settings": settings,
                "vocab": len(tokenizer),
                "added": sorted((i, t.content) for i, t in tokenizer.added_tokens_decoder.items()),
                "special": sorted(tokenizer.all_special_ids),
                "pad": self.pad_id,
            }
            if self.audio is not None:  # the rule that decides an audio clip's tokens
                parts["audio"] = self.audio.fingerprint
            if self.audio_in_video:  # and how a video's own track interleaves with it
                parts["audio_in_video"] = [
                    self.family.audio.interleave,
                    hf_compat.omni_track_timing(self.processor),
                    self.mrope.seconds_per_chunk,
                ]
            blob = json.dumps(parts, sort_keys=True, default=str)
            self._fingerprint = hashlib.sha256(blob.encode()).hexdigest()[:16]
        return self._fingerprint

    # ---- encode time: no pixels ---------------------------------------------------------------

    def find_special(self, text: str) -> str | None:
        found = self._protected.search(text) if self._protected is not None else None
        return found.group() if found else None

    def escape(self, text: str) -> str:
        """``text`` with every special token it spells broken by :data:`ESCAPE`."""
        if self._protected is None:
            return text
        return self._protected.sub(lambda m: m.group()[0] + ESCAPE + m.group()[1:], text)

    def messages(self, turns: Sequence[Turn]) -> list[dict]:
        """Parsed turns as the processor's message format (content as a list of parts)."""
        return [
            {
                "role": role,
                "content": [
                    {"type": "text", "text": self.escape(piece)}
                    if isinstance(piece, str)
                    else {"type": piece.kind}
                    for piece in pieces
                ],
            }
            for role, pieces in turns
        ]

    def render(self, messages: list[dict], **kwargs: Any) -> str:
        template_owner = self.processor if self.has_images else self.tokenizer
        family_layout = self.family is not None and self.family.prefix_lm
        if family_layout or not getattr(template_owner, "chat_template", None):
            kwargs = {"chat_template": self._template(), **kwargs}
        return template_owner.apply_chat_template(
            messages, tokenize=False, **{**self.kwargs, **kwargs}
        )

    def add_special_tokens(self, text: str) -> bool:
        """As ``apply_chat_template(tokenize=True)`` decides: no second BOS."""
        bos = self.tokenizer.bos_token
        return not (bos is not None and text.startswith(bos))

    def encode(
        self,
        *,
        key: str,
        messages: Sequence[Any],
        image_names: Sequence[str],
        images: Mapping[str, bytes],
        loss_weight: float,
        config: PackingConfig,
        video_names: Sequence[str] = (),
        videos: Mapping[str, bytes] | None = None,
        audio_names: Sequence[str] = (),
        audios: Mapping[str, bytes] | None = None,
    ) -> ProcessorEncoding:
        """Encodes one conversation, or raises :class:`Skip` / :class:`OverlongError`."""
        c = read_conversation(
            messages=messages,
            image_names=image_names,
            video_names=video_names,
            audio_names=audio_names,
            loss_weight=loss_weight,
            config=config,
            find_special=self.find_special,
        )
        weight, refs, turns, trained = c.weight, c.refs, c.turns, c.trained
        if refs.order and not self.has_images:
            raise Skip(
                "unsupported_image",
                f"{self.name} is a tokenizer: a conversation with images needs a processor",
            )
        sizes = [
            (height, width)
            for width, height in image_sizes(
                refs,
                image_names=image_names,
                images=images,
                max_pixels=getattr(config, "max_image_pixels", None),
            )
        ]
        as_images = self.video_style is not None and self.video_style.frames_as_images
        if refs.order and c.videos.order and as_images:
            raise Skip(
                "unsupported_video",
                f"{self.family_name} ({self.name}): a conversation with both images and videos; "
                f"the model's forward fills both through one <|image|> mask and refuses such "
                f"a call (get_placeholder_mask), so no conversation alone trains it; split it "
                f"into one with the images and one with the videos",
            )
        plans = video_plans(
            c.videos,
            video_names=video_names,
            videos=videos or {},
            side=self.videos if self.video_token else None,
            layout=f"{self.family_name} ({self.name})",
        )
        clips = audio_lengths(
            c.audios,
            audio_names=audio_names,
            audios=audios or {},
            takes_audio=None if self.audio is not None else self._no_audio(),
            max_seconds=config.max_audio_seconds,
        )
        samples = [clip.samples for clip in clips]
        frames = self.audio.frames(samples) if clips else []
        standalone: Sequence[int] = range(len(frames))
        if self.audio_in_video and plans:
            plans, frames, standalone = self._with_tracks(
                c, plans, samples, video_names=video_names, videos=videos or {}, config=config
            )
        heard = [self.audio.expansion_of(frames[i]) for i in standalone]
        expansions = [self._video_expansion(plan) for plan in plans]

        chat = self.messages(turns)
        try:
            text, spans = self._spans(chat, trained, config.train_on)
        except Skip:
            raise
        except Exception as e:  # the template's own checks (roles must alternate, ...)
            raise Skip("template_error", describe(e)) from None
        cut = None
        if self.family is not None and self.family.prefix_lm:  # where the suffix starts
            head = self._prefix_render(chat[:1])
            if not text.startswith(head):
                raise Skip(
                    "template_error",
                    f"{self.family_name}: the prompt's rendering is not a prefix of the "
                    f"conversation's, so its answer cannot be located",
                )
            cut = len(head)
        try:
            ids, offsets, shifts, media, prefix, kinds = self._expand(
                text, sizes, expansions, heard, cut=cut
            )
        except Skip:  # a rule of the family's size rule (aspect ratio): data
            raise
        except Exception as e:  # the family's size rule refuses the image otherwise
            raise Skip(
                "unsupported_image",
                f"{self.family_name} cannot take image(s) of (height, width) {sizes}: "
                f"{describe(e)}",
            ) from None
        if plans and self.video_style.frames_as_tiles:  # where its frames join the images'
            plans = placed(plans, kinds)
        mask = span_mask(offsets, shifts, spans, weight)
        for first, end in media:  # media are context, never trained (assistant turns too)
            mask[first:end] = [0.0] * (end - first)
        if mask:
            mask[0] = 0.0  # no source predicts across a pack boundary
        encoding = ProcessorEncoding(
            input_ids=ids,
            token_mask=mask,
            prefix_length=prefix,
            tiles=self.image_tiles([sizes]) if sizes else [],
            image_order=refs.order,
            video_order=c.videos.order,
            video_plans=plans,
            audio_order=c.audios.order,
            audio_frames=frames,
        )
        media_end = media[-1][1] if media else 0
        return fit_to_capacity(encoding, key=key, media_end=lambda: media_end, config=config)

    def image_tiles(self, sizes: list[list[tuple[int, int]]]) -> list[int]:
        """The tiles the vision tower runs over for each image of ``sizes`` (``(height,
        width)`` per text), where the family's tokens do not tell them (``Family.tiles``);
        empty for the other families."""
        if self.family is None or self.family.tiles is None:
            return []
        return self.family.tiles(self.processor, sizes)

    def _spans(
        self, chat: list[dict], trained: set[int], train_on: str
    ) -> tuple[str, list[tuple[int, int]]]:
        """The rendered text and the character spans of its trained assistant turns, from
        prefix renders."""
        whole = train_on in WHOLE_MESSAGES
        ks = sorted(trained)
        ends = [k for k in ks if k + 1 < len(chat)]  # render(chat[:k+1]); the last is the text
        starts = [k for k in ks if k]  # render(chat[:k]); none before the first message
        prefix = self._prefix_render
        text = self.render(chat)  # the template as the processor applies it
        throughs = [prefix(chat[: k + 1]) for k in ends]
        befores = [prefix(chat[:k], add_generation_prompt=not whole) for k in starts]
        through_of, before_of = dict(zip(ends, throughs)), dict(zip(starts, befores))
        spans = []
        for k in ks:
            before, through = before_of.get(k, ""), through_of.get(k, text)
            if not through.startswith(before) or not text.startswith(through):
                raise Skip(
                    "template_error",
                    f"the chat template is not prefix-stable at messages[{k}] (rendering a "
                    f"prefix of the conversation does not give a prefix of its rendering), so "
                    f"the assistant turn cannot be located",
                )
            start, end = len(before), len(through)
            if not whole:
                while end > start and text[end - 1].isspace():
                    end -= 1
            spans.append((start, end))
        return text, spans

    def _position_id_per_seconds(self) -> float | None:
        """The Omni thinkers' ``position_id_per_seconds`` (None for other families): the model
        directory's config.json (``load_processor``), else the installed thinker config's."""
        if self.family_name not in hf_compat.OMNI_THINKER_CONFIGS:
            return None
        found = getattr(self.processor, "model_position_id_per_seconds", None)
        return float(found) if found else hf_compat.omni_position_id_per_seconds(self.family_name)

    def interleave_tracks(self) -> None:
        """Interleave each video's own audio track with its frames from now on
        (``audio_config['load_audio_from_video']``; the build checks the family's rule)."""
        self.audio_in_video = True
        self._fingerprint = None  # the switch joins it

    def _track_spec(self) -> dict[str, Any]:
        """The :class:`MRope` fields of a family whose processor interleaves a video's own
        audio track (its audio-start token, its rule, the thinker's ``seconds_per_chunk``)."""
        rule = self.family.audio if self.family is not None else None
        if rule is None or rule.interleave is None:
            return {}
        found = getattr(self.processor, "model_seconds_per_chunk", None)
        return {
            "audio_start_id": self.tokenizer.convert_tokens_to_ids(self.processor.audio_bos_token),
            "interleave": rule.interleave,
            "seconds_per_chunk": (
                float(found) if found else hf_compat.omni_seconds_per_chunk(self.family_name)
            ),
        }

    def _with_tracks(
        self,
        c: Any,
        plans: list,
        samples: Sequence[int],
        *,
        video_names: Sequence[str],
        videos: Mapping[str, bytes],
        config: PackingConfig,
    ) -> tuple[list, list[int], list[int]]:
        """The plans with each video's own audio track (its samples and tokens), the mel
        frames of every clip in the order they go to the feature extractor (the clips and the
        tracks as the text shows them: the processor's audio slots), and which of those slots
        are clips of their own."""
        from dataclasses import replace

        from energon_packing.encoding.chat import brief
        from energon_packing.media.audio import track_length

        tracks = []
        for i in c.videos.order:
            name = video_names[i]
            try:
                track = track_length(videos[name], max_seconds=config.max_audio_seconds)
            except Skip as e:
                raise Skip(e.reason, f"video {brief(name)}'s {e.detail}") from None
            tracks.append(track.samples)
        kinds = [
            piece.kind
            for _, pieces in c.turns
            for piece in pieces
            if not isinstance(piece, str) and piece.kind in ("video", "audio")
        ]
        of_clip, of_track = iter(samples), iter(tracks)
        slots = [next(of_clip) if kind == "audio" else next(of_track) for kind in kinds]
        standalone = [i for i, kind in enumerate(kinds) if kind == "audio"]
        frames = self.audio.frames(slots)
        tracked = [f for f, kind in zip(frames, kinds) if kind == "video"]
        plans = [
            replace(
                plan,
                audio_samples=n,
                audio_tokens=self.audio.rule.tokens(f, self.processor),
            )
            for plan, n, f in zip(plans, tracks, tracked, strict=True)
        ]
        return plans, frames, standalone

    def _video_expansion(self, plan: Any) -> str:
        """What the processor puts in place of a video's one video token: its frames, or its
        frames interleaved with its own audio track (:mod:`.av_interleave`)."""
        if plan.style.frames_as_tiles:  # InternVL: a frame is an image tile
            return plan.expansion(
                video_token=self.processor.image_token,
                vision_start=self.processor.start_image_token,
                vision_end=self.processor.end_image_token,
            )
        if plan.style.frames_as_images:  # GLM: a temporal patch is an image
            return plan.expansion(
                video_token=self.processor.image_token,
                vision_start=self.family.vision_start,
                vision_end="<|end_of_image|>",
            )
        if plan.audio_tokens is None:
            return plan.expansion(
                video_token=self.video_token,
                vision_start="<|vision_start|>",
                vision_end="<|vision_end|>",
            )
        per_second, per_chunk = hf_compat.omni_track_timing(self.processor)
        return av_interleave.track_expansion(
            kind=self.family.audio.interleave,
            grid=plan.grid,
            merge_size=plan.merge_size,
            second_per_grid=plan.second_per_grid,
            audio_tokens=plan.audio_tokens,
            per_second=per_second,
            seconds_per_chunk=per_chunk,
            video_token=self.video_token,
            audio_token=self.audio.token,
            audio_bos=self.processor.audio_bos_token,
            audio_eos=self.processor.audio_eos_token,
        )

    def _clips(self, item: Mapping[str, Any], plans: Sequence[Any]) -> list[bytes]:
        """A conversation's clips in the order they go to the feature extractor: its own clips
        and its videos' tracks (the video's bytes: its audio stream) as the ids show them (an
        audio start right after a vision start opens a video's track)."""
        tracked = [
            data
            for data, plan in zip(item.get("videos") or [], plans)
            if plan.audio_tokens is not None
        ]
        if not tracked:
            return list(item.get("audios") or [])
        ids = np.asarray(item["input_ids"])
        starts = np.flatnonzero(ids == self.mrope.audio_start_id)
        in_video = [bool(at and ids[at - 1] == self.mrope.vision_start_id) for at in starts]
        of_clip, of_track = iter(item.get("audios") or []), iter(tracked)
        return [next(of_track) if video else next(of_clip) for video in in_video]

    def _no_audio(self) -> str:
        """Why this layout takes no audio (the ``unsupported_audio`` detail)."""
        return (
            f"{self.family_name} ({self.name}) takes no audio; the families whose processors "
            f"take audio: {', '.join(audio_families())}"
        )

    def _expand(
        self,
        text: str,
        sizes: list[tuple[int, int]],
        videos: Sequence[str] = (),
        audios: Sequence[str] = (),
        *,
        cut: int | None = None,
    ) -> tuple[list, list, list, list, int | None, list[str]]:
        """Token ids and offsets of ``text`` with every image placeholder expanded from sizes
        alone and every video placeholder by its expansion; ``shifts``: ``(end of the
        placeholder in text, characters it gained)`` per medium; ``media``: ``[first, end)``
        token range of each (expansion and markup). ``cut``: where a prefix-LM family's suffix
        starts in ``text``; the two parts are tokenized apart, as its processor's ``text`` and
        ``text_pair`` (``prefix_length``: the prefix's tokens; None without ``cut``);
        ``kinds``: each medium's kind, in the text's order."""
        if sizes or videos or audios:
            expanded, shifts, spans, kinds = self.images.expand(text, sizes, videos, audios)
        else:
            expanded, shifts, spans, kinds = text, [], [], []
        prefix_length = None
        if cut is None:
            ids, offsets = self._encode_text(expanded, self.add_special_tokens(text))
        else:
            cut += sum(gained for end, gained in shifts if end <= cut)
            ids, offsets = self._encode_text(expanded[:cut], self.add_special_tokens(text))
            suffix_ids, suffix_offsets = self._encode_text(expanded[cut:], False)
            prefix_length = len(ids)
            ids = [*ids, *suffix_ids]
            offsets = [*offsets, *((start + cut, end + cut) for start, end in suffix_offsets)]
        starts = [s for s, _ in offsets]
        ends = [e for _, e in offsets]
        media = [
            (bisect.bisect_right(ends, start), bisect.bisect_left(starts, end))
            for start, end in spans
        ]
        return list(ids), offsets, shifts, media, prefix_length, kinds

    def _tokenize(self, text: str, add_special_tokens: bool) -> tuple[list, list]:
        return tokenize(self.tokenizer, text, add_special_tokens)

    # ---- pack time: pixels only ---------------------------------------------------------------

    def empty_media(self, config: PackingConfig) -> dict[str, np.ndarray]:
        """A processor gives no image fields for text-only conversations; neither does a pack."""
        return {}

    def source(self, *, config: PackingConfig, **item: Any) -> Source:
        """:meth:`sources` of one conversation (``key``, ``input_ids``, ``token_mask``,
        ``images``, ``videos``; a prefix-LM family's ``prefix_length``); raises what it alone
        fails with."""
        (found,) = self.sources(items=[item], config=config)
        if isinstance(found, Exception):
            raise found
        return found

    def sources(
        self, *, items: Sequence[Mapping[str, Any]], config: PackingConfig
    ) -> list[Source | Exception]:
        """One conversation with its model inputs per item of one pack, ready for the pack
        layout, or the exception that conversation alone fails with: the ids are the encoded
        ones (text is not tokenized again); only the image processor runs on the decoded
        images (one call for the whole pack where the family allows:
        :meth:`~.processor_images.ImageSide.media_of_pack`), the videos are decoded and
        processed (:class:`~.chat.VideoCosting`), plus the token fields the processor derives
        from the ids.

        Failures: :class:`Skip` when an image or video does not decode (a data skip);
        :class:`ProcessorMismatchError` when the real outputs expand a medium otherwise than
        predicted.
        """
        plans: list[list] = [[] for _ in items]
        failed: dict[int, Exception] = {}
        for n, item in enumerate(items):
            if item.get("videos"):
                try:
                    if self.video_style.frames_as_images and item.get("images"):
                        raise Skip(
                            "unsupported_video",
                            f"{self.family_name} ({self.name}): sample {item['key']!r} holds "
                            f"images and videos, which the model refuses in one call "
                            f"(get_placeholder_mask)",
                        )
                    plans[n] = self._plans(item)
                except Exception as e:  # Skip or a mismatch: it alone
                    failed[n] = e
        if self.images is None:
            media: list = [{} for _ in items]
        else:
            media = self.images.media_of_pack(
                [
                    (i["key"], () if n in failed else i["images"], i["input_ids"], frames)
                    for n, (i, frames) in enumerate(zip(items, map(self._frame_slots, plans)))
                ],
                config=config,
            )
        media = [failed.get(n, found) for n, found in enumerate(media)]
        for n, item in enumerate(items):
            if item.get("videos") and not isinstance(media[n], Exception):
                try:
                    media[n] = {**media[n], **self._videos(item, plans[n])}
                    if self.video_style.frames_as_tiles:
                        media[n] = self._tiles_in_order(item, media[n], plans[n])
                except Exception as e:  # Skip or a mismatch: it alone
                    media[n] = e
            if isinstance(media[n], Exception):
                continue
            try:  # the conversation's clips in a call of their own (AudioRule.padding)
                clips = self._clips(item, plans[n])
                if clips:
                    heard = self.audio.features(
                        key=item["key"],
                        clips=clips,
                        input_ids=item["input_ids"],
                        max_seconds=config.max_audio_seconds,
                    )
                    media[n] = {**media[n], **heard}
            except Exception as e:  # Skip or a mismatch: it alone
                media[n] = e
        tokens: list[dict] = [{} for _ in items]
        if self.images is not None:
            kept = [n for n, found in enumerate(media) if not isinstance(found, Exception)]
            per_kept = self.images.token_fields_of_pack([items[n]["input_ids"] for n in kept])
            for n, fields in zip(kept, per_kept):
                tokens[n] = fields
            if self.video_style is not None and self.video_style.frames_as_images:
                tokens = [self._typed_as_images(fields) for fields in tokens]
        out: list[Source | Exception] = []
        for item, found, fields, videos in zip(items, media, tokens, plans):
            if isinstance(found, Exception):
                out.append(found)
                continue
            try:
                out.append(self._source(item, found, fields, videos))
            except Exception as e:
                out.append(e)
        return out

    def _typed_as_images(self, fields: dict) -> dict:
        """GLM: the processor types a video's tokens 2 (``mm_token_type_ids``); a pack gives
        its frames as images, so they are typed 1, as its ``image_grid_thw`` lists them (the
        model's own positions, from these types and grids, then read the pack right)."""
        name = self.family.token_types
        if name not in fields:
            return fields
        types = np.asarray(fields[name])
        return {**fields, name: np.where(types == 2, 1, types).astype(types.dtype)}

    def _plans(self, item: Mapping[str, Any]) -> list:
        """The plans of one conversation's videos: made at encode time, else now."""
        if self.audio_in_video and not item.get("video_plans"):
            raise ProcessorMismatchError(
                f"{self.family_name} ({self.name}): sample {item['key']!r}: its videos come "
                f"without the plans encode() made, and with audio_config"
                f"['load_audio_from_video'] those carry each video's track (its length, its "
                f"tokens' place in the ids); pass the encoding's video_plans"
            )
        return list(item.get("video_plans") or [self.videos.plan(data) for data in item["videos"]])

    def _frame_slots(self, plans: Sequence[Any]) -> int:
        """The tokens the model fills with vision features that these videos' frames hold
        where they are image tiles (InternVL); 0 for the other families."""
        if not plans or not self.video_style.frames_as_tiles:
            return 0
        return sum(self.images.slots_in(self._video_expansion(plan)) for plan in plans)

    def _videos(self, item: Mapping[str, Any], plans: list) -> dict:
        """The model inputs of one conversation's videos, decoded now; the ids must hold as
        many video tokens as the plans expand to (InternVL's frames: :meth:`_tiles_in_order`)."""
        key = item["key"]
        clips = decode_once(self.videos.media, item["videos"], plans)
        merged = {name: np.concatenate([c[name] for c in clips]) for name in clips[0]}
        if self.video_style.frames_as_tiles:
            return merged
        if self.video_style.frames_as_images:
            return self._frames_as_images(key, item["input_ids"], merged, plans)
        held = int(np.count_nonzero(np.asarray(item["input_ids"]) == self.video_token_id))
        need = sum(plan.tokens for plan in plans)
        if held != need:
            raise ProcessorMismatchError(
                f"{self.family_name} ({self.name}): sample {key!r}: the encoded ids hold {held} "
                f"video tokens, its {len(plans)} video(s) expand to {need}"
            )
        return merged

    def _frames_as_images(self, key: str, input_ids: Any, merged: dict, plans: list) -> dict:
        """GLM (``VideoStyle.frames_as_images``): a conversation's videos as the images the
        model reads them as: their pixel rows in ``pixel_values``, a ``(1, h, w)`` grid per
        temporal patch in ``image_grid_thw`` (``get_video_features`` splits a video's grid
        so); the ids must hold as many image tokens as the patches expand to."""
        held = int(np.count_nonzero(np.asarray(input_ids) == self.image_token_id))
        need = sum(plan.tokens for plan in plans)
        if held != need:
            raise ProcessorMismatchError(
                f"{self.family_name} ({self.name}): sample {key!r}: the encoded ids hold {held} "
                f"image tokens, its {len(plans)} video(s) expand to {need}"
            )
        grids = merged["video_grid_thw"]
        patches = [(1, h, w) for t, h, w in grids.tolist() for _ in range(t)]
        return {
            "pixel_values": merged["pixel_values_videos"],
            "image_grid_thw": np.asarray(patches, dtype=grids.dtype),
        }

    def _tiles_in_order(self, item: Mapping[str, Any], media: dict, plans: list) -> dict:
        """InternVL: :func:`.video_tiles.tiles_in_order` of one conversation."""
        try:
            return tiles_in_order(
                media,
                plans,
                images=len(item["images"]),
                input_ids=item["input_ids"],
                processor=self.processor,
            )
        except ValueError as e:
            raise ProcessorMismatchError(
                f"{self.family_name} ({self.name}): sample {item['key']!r}: {e}"
            ) from None

    def _source(self, item: Mapping[str, Any], media: dict, tokens: dict, videos: list) -> Source:
        input_ids = item["input_ids"]
        positions = None
        if self.mrope is not None:
            grids = media.get("image_grid_thw", np.zeros((0, 3), dtype=np.int64))
            as_images = self.video_style is not None and self.video_style.frames_as_images
            positions = mrope_positions(  # GLM's frames: among the image grids
                input_ids,
                [tuple(g) for g in grids.tolist()],
                self.mrope,
                videos=() if as_images else videos,
            )
        fill = {}
        if self.family is not None and self.family.prefix_lm:  # its token types
            prefix = item.get("prefix_length")
            if prefix is None:
                raise ValueError(
                    f"{self.family_name} ({self.name}): sample {item['key']!r} comes without the "
                    f"prefix_length encode() gave it (where its answer starts: its "
                    f"token_type_ids); pass the encoding's prefix_length"
                )
            tokens = {**tokens, PREFIX_TYPES: suffix_types(len(input_ids), prefix_length=prefix)}
            fill = {PREFIX_TYPES: 1}  # its pads typed as its answer: none joins its prompt
        return Source(
            key=item["key"],
            input_ids=input_ids,
            token_mask=item["token_mask"],
            positions=positions,
            media=media,
            token_fields=tokens,
            token_fill=fill,
            images=len(item["images"]),
            videos=len(videos),
        )
