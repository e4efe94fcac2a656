"""Any Hugging Face VLM through its own processor: chat template, image tokens, pixels.

A conversation is rendered by the processor's chat template and tokenized exactly as
``processor.apply_chat_template(messages, tokenize=True)`` would (the processor's own
``replace_image_token`` expands each image placeholder), but at encode time from the image
*headers* alone: the family's own size rule (Qwen's ``smart_resize``, Idefics3's tiling,
LLaVA-OneVision's anyres grid, Gemma 3's fixed sequence) feeds the processor's own expansion, so
the predicted length is the real one and no pixel is decoded while a conversation waits in the
buffer. At pack time the processor runs on the decoded images; its ids must equal the
prediction (a mismatch is an error naming the family, the image sizes and both lengths), and
every model input it returns is carried into the pack::

    messages --template--> text --expand from sizes--> ids, loss mask     (encode: no pixels)
    text + decoded images --processor--> ids (== predicted), pixel_values, ...   (pack time)

Loss mask, for any template: message prefixes are rendered and diffed, so an assistant turn's
span is ``render(messages[:k+1]) - render(messages[:k], add_generation_prompt=True)``::

    <|im_start|>user\\nWhat is red?<|im_end|>\\n<|im_start|>assistant\\nThe circle.<|im_end|>\\n
                                                                    ^^^^^^^^^^^^^^^^^^^^^^^^
    train_on="all_assistant": the reply and its end-of-turn marker (trailing newline excluded)

``train_on="assistant_messages"`` trains the whole rendered message instead
(``render(messages[:k+1]) - render(messages[:k])``: role header and trailing newline too).

Text that spells a special token (or the processor's image placeholder) gets a zero-width space
after its first character before rendering, so the tokenizer reads it as text (the rule of
:mod:`.tokenizer`); equality with the processor's own output holds for every text that spells
none. No torch: the processor is asked for numpy arrays.
"""

from __future__ import annotations

import bisect
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from energon_packing.encoding.chat import (
    WHOLE_MESSAGES,
    Skip,
    Turn,
    brief,
    fit_to_capacity,
    image_sizes,
    read_conversation,
)
from energon_packing.encoding.images import decode
from energon_packing.encoding.positions import MRope, mrope_positions
from energon_packing.schema import Source

if TYPE_CHECKING:
    from energon_packing.config import PackingConfig

__all__ = [
    "ESCAPE",
    "FAMILIES",
    "Family",
    "ProcessorChat",
    "ProcessorEncoding",
    "ProcessorMismatchError",
    "load_processor",
]

#: Inserted after the first character of a special token spelled in conversation text.
ESCAPE = "\u200b"


class ProcessorMismatchError(ValueError):
    """The processor's real token ids differ from the ones predicted from image sizes."""


class _Shape:
    """Stands in for a processed tile where a processor only reads its ``shape``."""

    def __init__(self, shape: tuple[int, ...]):
        self.shape = shape


def _qwen_inputs(processor: Any, sizes: list[list[tuple[int, int]]]) -> dict:
    image_processor = processor.image_processor
    smart_resize = sys.modules[type(image_processor).__module__].smart_resize
    patch, merge = image_processor.patch_size, image_processor.merge_size
    grids = []
    for h, w in (s for per_text in sizes for s in per_text):
        rh, rw = smart_resize(
            h,
            w,
            factor=patch * merge,
            min_pixels=image_processor.size["shortest_edge"],
            max_pixels=image_processor.size["longest_edge"],
        )
        grids.append([1, rh // patch, rw // patch])
    return {"image_grid_thw": np.asarray(grids, dtype=np.int64).reshape(-1, 3)}


def _gemma3_inputs(processor: Any, sizes: list[list[tuple[int, int]]]) -> dict:
    if getattr(processor.image_processor, "do_pan_and_scan", False):
        raise ValueError("Gemma 3 with do_pan_and_scan=True is not supported (crops need pixels)")
    return {"num_crops": [0] * sum(len(s) for s in sizes)}


def _idefics3_inputs(processor: Any, sizes: list[list[tuple[int, int]]]) -> dict:
    image_processor = processor.image_processor
    rows, cols = [], []
    for per_text in sizes:
        counts = [image_processor.get_number_of_image_patches(h, w, {}) for h, w in per_text]
        rows.append([r for _, r, _ in counts])
        cols.append([c for _, _, c in counts])
    return {"rows": rows, "cols": cols}


def _llava_onevision_inputs(processor: Any, sizes: list[list[tuple[int, int]]]) -> dict:
    size = processor.image_processor.size
    side = (size["height"], size["width"]) if "height" in size else (size["shortest_edge"],) * 2
    return {
        "batch_num_images": [len(s) for s in sizes if s],
        "image_sizes": [list(s) for per_text in sizes for s in per_text],
        "pixel_values": [[_Shape((3, *side))]],
    }


@dataclass(kw_only=True, slots=True, frozen=True)
class Family:
    """What this package knows of a model family beyond its processor's public API.

    Attributes:
        name: The family key (README and error messages).
        classes: Processor class names that belong to it.
        replacement_inputs: The fields the processor's ``replace_image_token`` reads, derived
            from image ``(height, width)`` alone, as its image processor would derive them.
        mrope: Qwen's 3-row (t, h, w) positions (else 1-D, restarting per conversation).
        token_fields: Processor outputs aligned with the tokens (laid out like ``input_ids``).
    """

    name: str
    classes: tuple[str, ...]
    replacement_inputs: Callable[[Any, list[list[tuple[int, int]]]], dict]
    mrope: bool = False
    token_fields: tuple[str, ...] = ()


FAMILIES: tuple[Family, ...] = (
    Family(
        name="qwen2_vl",
        classes=("Qwen2VLProcessor",),
        replacement_inputs=_qwen_inputs,
        mrope=True,
        token_fields=("mm_token_type_ids",),
    ),
    Family(
        name="qwen2_5_vl",
        classes=("Qwen2_5_VLProcessor",),
        replacement_inputs=_qwen_inputs,
        mrope=True,
        token_fields=("mm_token_type_ids",),
    ),
    Family(
        name="qwen3_vl",
        classes=("Qwen3VLProcessor",),
        replacement_inputs=_qwen_inputs,
        mrope=True,
        token_fields=("mm_token_type_ids",),
    ),
    Family(
        name="gemma3",
        classes=("Gemma3Processor",),
        replacement_inputs=_gemma3_inputs,
        token_fields=("token_type_ids",),
    ),
    Family(name="idefics3", classes=("Idefics3Processor",), replacement_inputs=_idefics3_inputs),
    Family(name="smolvlm", classes=("SmolVLMProcessor",), replacement_inputs=_idefics3_inputs),
    Family(
        name="llava_onevision",
        classes=("LlavaOnevisionProcessor",),
        replacement_inputs=_llava_onevision_inputs,
    ),
)


def family_of(processor: Any) -> Family | None:
    """The :class:`Family` of a processor (by class name, subclasses included)."""
    names = {klass.__name__ for klass in type(processor).__mro__}
    return next((f for f in FAMILIES if names & set(f.classes)), None)


def load_processor(path: str | Path) -> Any:
    """A processor (or a tokenizer, for text-only models) from a local directory; never
    downloads."""
    from transformers import AutoProcessor, AutoTokenizer

    path = Path(path)
    if not path.is_dir():
        raise ValueError(f"processor path {str(path)!r} is not a directory (nothing is downloaded)")
    try:
        return AutoProcessor.from_pretrained(str(path), local_files_only=True)
    except Exception as processor_error:
        try:
            return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        except Exception:
            raise ValueError(
                f"{path} holds no loadable processor or tokenizer: {processor_error}"
            ) from processor_error


@dataclass(kw_only=True, slots=True)
class ProcessorEncoding:
    """One conversation, encoded through a processor (no pixels)."""

    input_ids: list[int]
    token_mask: list[float]
    text: str  # the rendered (escaped) template text the processor runs on at pack time
    image_order: list[int] = field(default_factory=list)
    truncated: int = 0

    @property
    def length(self) -> int:
        return len(self.input_ids)


class ProcessorChat:
    """Conversations through a Hugging Face processor (or, text only, a tokenizer).

    Args:
        processor: A ``transformers`` processor of a family in :data:`FAMILIES`, or a tokenizer
            with a chat template (text-only conversations).
        chat_template_kwargs: Keyword arguments for ``apply_chat_template``.

    Raises:
        ValueError: no chat template, a slow tokenizer, or an unknown processor family.
    """

    def __init__(self, processor: Any, *, chat_template_kwargs: Mapping[str, Any] | None = None):
        self.processor = processor
        self.tokenizer = getattr(processor, "tokenizer", None) or processor
        self.has_images = getattr(processor, "image_processor", None) is not None
        self.kwargs = dict(chat_template_kwargs or {})
        self.name = type(processor).__name__
        if not getattr(processor, "chat_template", None) and not getattr(
            self.tokenizer, "chat_template", None
        ):
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
        self.family = family_of(processor) if self.has_images else None
        if self.has_images and self.family is None:
            raise ValueError(
                f"{self.name} is not a processor family energon_packing can cost images for "
                f"(known: {', '.join(f.name for f in FAMILIES)}); pass its tokenizer for "
                f"text-only data"
            )
        self.family_name = self.family.name if self.family else "text"
        self.image_token = getattr(processor, "image_token", None) if self.has_images else None
        self.image_token_id = (
            self.tokenizer.convert_tokens_to_ids(self.image_token) if self.image_token else None
        )
        pad = self.tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else (self.tokenizer.eos_token_id or 0)
        self.mrope = None
        if self.family is not None and self.family.mrope:
            self.mrope = MRope(
                vision_start_id=self.tokenizer.convert_tokens_to_ids("<|vision_start|>"),
                image_pad_id=self.image_token_id,
                merge_size=processor.image_processor.merge_size,
            )
        protected = {t.content for t in self.tokenizer.added_tokens_decoder.values() if t.special}
        protected |= {
            getattr(processor, name, None) or ""
            for name in ("image_token", "boi_token", "video_token", "audio_token")
        }
        ordered = sorted((t for t in protected if len(t) > 1), key=len, reverse=True)
        self._protected = re.compile("|".join(map(re.escape, ordered))) if ordered else None

    def __repr__(self) -> str:
        return f"ProcessorChat({self.name}, family={self.family_name})"

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
                    else {"type": "image"}
                    for piece in pieces
                ],
            }
            for role, pieces in turns
        ]

    def render(self, messages: list[dict], **kwargs: Any) -> str:
        template_owner = self.processor if self.has_images else self.tokenizer
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
    ) -> ProcessorEncoding:
        """Encodes one conversation, or raises :class:`Skip` / :class:`OverlongError`."""
        c = read_conversation(
            messages=messages,
            image_names=image_names,
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
                refs, image_names=image_names, images=images, max_pixels=config.max_image_pixels
            )
        ]

        chat = self.messages(turns)
        try:
            text = self.render(chat)
            spans = self._spans(chat, text, trained, config.train_on)
        except Skip:
            raise
        except Exception as e:  # the template's own checks (roles must alternate, ...)
            raise Skip("template_error", f"{type(e).__name__}: {str(e)[:300]}") from None
        try:
            ids, offsets, shifts = self._expand(text, sizes)
        except Exception as e:  # the family's size rule refuses the image (aspect ratio, ...)
            raise Skip(
                "unsupported_image",
                f"{self.family_name} cannot take image(s) of (height, width) {sizes}: "
                f"{type(e).__name__}: {str(e)[:200]}",
            ) from None
        mask = self._mask(offsets, shifts, spans, weight)
        if mask:
            mask[0] = 0.0  # no source predicts across a pack boundary
        encoding = ProcessorEncoding(
            input_ids=ids, token_mask=mask, text=text, image_order=refs.order
        )
        return fit_to_capacity(encoding, key=key, media_end=self._media_end(ids), config=config)

    def _spans(
        self, chat: list[dict], text: str, trained: set[int], train_on: str
    ) -> list[tuple[int, int]]:
        """Character spans of the trained assistant turns in ``text`` (prefix renders)."""
        spans = []
        for k in sorted(trained):
            whole = train_on in WHOLE_MESSAGES
            before = self.render(chat[:k], add_generation_prompt=not whole) if k else ""
            through = self.render(chat[: k + 1])
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
        return spans

    def _expand(
        self, text: str, sizes: list[tuple[int, int]]
    ) -> tuple[list[int], list[tuple[int, int]], list[tuple[int, int]]]:
        """Token ids and offsets of ``text`` with every image placeholder expanded by the
        processor's own ``replace_image_token``, from sizes alone; ``shifts`` are
        ``(end of the placeholder in text, characters it gained)`` per image."""
        shifts = []
        expanded = text
        if sizes:
            inputs = self.family.replacement_inputs(self.processor, [sizes])
            replacements = [
                self.processor.replace_image_token(inputs, i) for i in range(len(sizes))
            ]
            (expanded,), (offsets,) = self.processor.get_text_with_replacements(
                [text], images_replacements=replacements
            )
            if len(offsets) != len(sizes):
                raise Skip(
                    "placeholder_mismatch",
                    f"the rendered text holds {len(offsets)} image placeholder(s) for "
                    f"{len(sizes)} image(s)",
                )
            for o in offsets:
                gained = (o["new_span"][1] - o["new_span"][0]) - (o["span"][1] - o["span"][0])
                shifts.append((o["span"][1], gained))
        encoded = self.tokenizer(
            expanded,
            add_special_tokens=self.add_special_tokens(text),
            return_offsets_mapping=True,
        )
        return list(encoded["input_ids"]), list(encoded["offset_mapping"]), shifts

    @staticmethod
    def _mask(
        offsets: list[tuple[int, int]],
        shifts: list[tuple[int, int]],
        spans: list[tuple[int, int]],
        weight: float,
    ) -> list[float]:
        """Loss weight on every token overlapping a trained span (spans moved past expanded
        placeholders, as the processor moves them)."""
        ends = [end for end, _ in shifts]
        gained = [0]
        for _, g in shifts:
            gained.append(gained[-1] + g)
        token_ends = [e for _, e in offsets]
        mask = [0.0] * len(offsets)
        for start, end in spans:
            start += gained[bisect.bisect_right(ends, start)]
            end += gained[bisect.bisect_right(ends, end - 1)]
            for i in range(bisect.bisect_right(token_ends, start), len(offsets)):
                token_start, token_end = offsets[i]
                if token_start >= end:
                    break
                if token_end > start and token_end > token_start:
                    mask[i] = weight
        return mask

    def _media_end(self, ids: list[int]) -> Callable[[], int]:
        """The token after the last image token, counted only when asked (when cutting)."""
        image = self.image_token_id
        return lambda: next((len(ids) - i for i, t in enumerate(reversed(ids)) if t == image), 0)

    # ---- pack time: pixels --------------------------------------------------------------------

    def model_inputs(
        self,
        *,
        key: str,
        text: str,
        images: Sequence[bytes],
        input_ids: np.ndarray,
        config: PackingConfig,
    ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], np.ndarray | None]:
        """Runs the processor on one conversation's decoded images.

        Returns ``(media, token_fields, positions)``: the processor's image-aligned outputs
        (batch dimension kept where the processor gives one per conversation), its
        token-aligned outputs cut to ``len(input_ids)``, and mRoPE positions for Qwen families.

        Raises:
            ImageError: an image does not decode (a data skip).
            ProcessorMismatchError: the processor's ids differ from the predicted ones.
        """
        decoded = [
            decode(data, max_pixels=config.max_image_pixels, high_bit_depth=config.high_bit_depth)
            for data in images
        ]
        call = dict(
            text=[text],
            add_special_tokens=self.add_special_tokens(text),
            return_tensors="np",
        )
        if decoded:
            call["images"] = [decoded]
        outputs = dict((self.processor if self.has_images else self.tokenizer)(**call))
        real = np.asarray(outputs.pop("input_ids")).reshape(-1)
        n = len(input_ids)
        if len(real) < n or not np.array_equal(real[:n], input_ids):
            sizes = [(image.height, image.width) for image in decoded]
            raise ProcessorMismatchError(
                f"{self.family_name} ({self.name}): sample {brief(key)} with image (height, "
                f"width) {sizes} has {len(real)} tokens from the processor, {n} predicted from "
                f"the image headers; the family's size rule in "
                f"energon_packing.encoding.processor disagrees with the processor"
            )
        outputs.pop("attention_mask", None)
        tokens = {}
        media = {}
        for name, value in outputs.items():
            value = np.asarray(value)
            if value.ndim == 2 and value.shape == (1, len(real)):
                tokens[name] = value[0, :n]
            else:
                media[name] = value
        positions = None
        if self.mrope is not None:
            grids = media.get("image_grid_thw", np.zeros((0, 3), dtype=np.int64))
            positions = mrope_positions(input_ids, [tuple(g) for g in grids.tolist()], self.mrope)
        return media, tokens, positions

    def empty_media(self, config: PackingConfig) -> dict[str, np.ndarray]:
        """A processor gives no image fields for text-only conversations; neither does a pack."""
        return {}

    def source(
        self,
        *,
        key: str,
        input_ids: np.ndarray,
        token_mask: np.ndarray,
        images: Sequence[bytes],
        text: str,
        config: PackingConfig,
    ) -> Source:
        """One conversation with the processor's model inputs, ready for the pack layout."""
        media, tokens, positions = self.model_inputs(
            key=key, text=text, images=images, input_ids=np.asarray(input_ids), config=config
        )
        return Source(
            key=key,
            input_ids=input_ids,
            token_mask=token_mask,
            positions=positions,
            media=media,
            token_fields=tokens,
            images=len(images),
        )
