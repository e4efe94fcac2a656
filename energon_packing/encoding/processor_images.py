"""The image side of a Hugging Face processor, apart from its text side.

What a processor's own ``__call__`` does with images, without tokenizing anything: each image
placeholder's expansion (``replace_image_token``, from the family's size rule at encode time or
from the image processor's real outputs at pack time), the image processor run with the
processor's own image keyword arguments, the model inputs it keeps, and the token-aligned
fields it derives from the ids (``mm_token_type_ids``). Also what the chat template writes
around a placeholder, so that a whole image is known and never trained. No torch.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from energon_packing.encoding import hf_compat
from energon_packing.encoding.chat import Skip, brief, decode_once
from energon_packing.encoding.families import Family
from energon_packing.media.images import decode

__all__ = ["ImageSide", "ProcessorMismatchError"]


class ProcessorMismatchError(ValueError):
    """The image processor's real outputs expand an image otherwise than its size rule."""


class ImageSide:
    """A processor's image work for one family.

    Args:
        processor: A processor of ``family``.
        family: Its :class:`~energon_packing.encoding.families.Family`.
        render: Renders messages with the chat template (text only).
    """

    def __init__(self, processor: Any, family: Family, render: Callable[[list[dict]], str]):
        # transformers' public expansion where the processor has it, else the family's rule of
        # the release's own __call__ (older releases; refused where the family has none)
        self.public = hf_compat.processor_media_api(processor)
        if not self.public:
            hf_compat.require_processor_media(processor, family=family)
        self.processor = processor
        self.family = family
        # what the processor's own __call__ passes its image processor, and keeps of it
        self.images_kwargs = hf_compat.merged_images_kwargs(processor)
        if family.image_kwargs is not None:  # what its __call__ adds (Pixtral's patch step)
            self.images_kwargs.update(family.image_kwargs(processor))
        unused = set(getattr(processor, "unused_input_names", None) or ())
        names = processor.image_processor.model_input_names
        if not hasattr(processor, "unused_input_names"):  # older releases: the processor's own list
            declared = set(getattr(processor, "model_input_names", None) or names)
            unused = {n for n in names if n not in declared}  # Gemma 3's num_crops
        self.fields = tuple(n for n in names if n not in unused)
        returns_types = hf_compat.returns_mm_token_types(processor, field=family.token_types)
        self.token_types = family.token_types if returns_types else None
        self._per_token_types = _per_token_types(processor)
        # the token the text carries per image (an older Gemma 3's: its begin-of-image token)
        self.placeholder = getattr(processor, "image_token" if self.public else family.placeholder)
        self.markup = _markup(render, self.placeholder)
        video_token = getattr(processor, "video_token", None)
        self.video_markup = _markup(render, video_token, kind="video") if video_token else None
        audio_token = getattr(processor, "audio_token", None) if family.audio else None
        self.audio_markup = _markup(render, audio_token, kind="audio") if audio_token else None
        ids = slot_ids(processor, family)
        self._slot_ids = np.asarray(ids, dtype=np.int64)
        self._slot_tokens = processor.tokenizer.convert_ids_to_tokens(ids)

    def replacements(self, sizes: Sequence[Any], inputs: dict | None = None) -> list[str]:
        """Each image's expansion by the processor's own ``replace_image_token``: from the
        family's size rule on ``(height, width)`` sizes, or from the image processor's real
        ``inputs``."""
        if inputs is None:
            inputs = self.family.replacement_inputs(self.processor, [list(sizes)])
        if not self.public:
            return [self.family.expansion(self.processor, inputs, i) for i in range(len(sizes))]
        return [self.processor.replace_image_token(inputs, i) for i in range(len(sizes))]

    def expand(
        self,
        text: str,
        sizes: list[tuple[int, int]],
        videos: Sequence[str] = (),
        audios: Sequence[str] = (),
    ) -> tuple[str, list, list, list[str]]:
        """``text`` with each image placeholder expanded from ``(height, width)`` sizes alone,
        each video placeholder by ``videos`` and each audio placeholder by ``audios`` (their
        expansions, from headers); ``shifts``: ``(end of the placeholder in text, characters
        it gained)`` per medium; ``spans``: each one's characters in the expanded text, markup
        included; ``kinds``: each one's kind (``"image"``, ``"video"``, ``"audio"``)."""
        images = self.replacements(sizes) if sizes else []
        if self.public:
            # audio_replacements only where there is audio: older releases lack the keyword
            extra = {"audio_replacements": list(audios)} if audios else {}
            (expanded,), (offsets,) = self.processor.get_text_with_replacements(
                [text], images_replacements=images, videos_replacements=list(videos), **extra
            )
        else:
            expanded, offsets = self._replaced(text, images, list(videos), list(audios))
        kinds = ("image", "video", "audio")
        found = [sum(o.get("type", "image") == k for o in offsets) for k in kinds]
        if found != [len(sizes), len(videos), len(audios)]:
            raise Skip(
                "placeholder_mismatch",
                f"the rendered text holds {found[0]} image, {found[1]} video and {found[2]} "
                f"audio placeholder(s) for {len(sizes)} image(s), {len(videos)} video(s) and "
                f"{len(audios)} audio clip(s)",
            )
        markups = {"video": self.video_markup, "audio": self.audio_markup}
        shifts, spans = [], []
        for o in offsets:
            markup = markups.get(o.get("type"), self.markup)
            before, after = markup or ("", "")
            (start, end), (new_start, new_end) = o["span"], o["new_span"]
            shifts.append((end, (new_end - new_start) - (end - start)))
            lead = len(before) if text[max(0, start - len(before)) : start] == before else 0
            trail = len(after) if text[end : end + len(after)] == after else 0
            spans.append((new_start - lead, new_end + trail))
        return expanded, shifts, spans, [o.get("type", "image") for o in offsets]

    def _replaced(
        self, text: str, images: list[str], videos: list[str], audios: list[str]
    ) -> tuple[str, list]:
        """What ``get_text_with_replacements`` gives, where the processor has none (before
        5.10, and the Omni families and Gemma 3n before 5.19): the i-th image (video, audio)
        placeholder in ``text`` replaced by ``images[i]`` (``videos[i]``, ``audios[i]``), in
        order, with the same offsets. The older ``__call__`` replaces each kind in order of
        appearance too, or (Gemma 3n) every placeholder of a kind by one same sequence, so the
        text is the same (Qwen3-VL's video takes the template's markup around it:
        ``Family.video_takes_markup``)."""
        groups = []
        if images:
            groups.append(f"(?P<image>{re.escape(self.placeholder)})")
        if videos:
            token = re.escape(self.processor.video_token)
            if self.family.video_takes_markup:
                start = getattr(self.processor, "vision_start_token", "<|vision_start|>")
                end = getattr(self.processor, "vision_end_token", "<|vision_end|>")
                token = f"{re.escape(start)}{token}{re.escape(end)}|{token}"
            groups.append(f"(?P<video>{token})")
        if audios:
            groups.append(f"(?P<audio>{re.escape(self.processor.audio_token)})")
        if not groups:
            return text, []
        queues = {"image": iter(images), "video": iter(videos), "audio": iter(audios)}
        pieces, offsets, last, gained = [], [], 0, 0
        for found in re.finditer("|".join(groups), text):
            start, end = found.span()
            replacement = next(queues[found.lastgroup], None)
            if replacement is None:  # more placeholders than media: found by the caller
                replacement = found.group()
            pieces += [text[last:start], replacement]
            new_start = start + gained
            offsets.append(
                {
                    "type": found.lastgroup,
                    "span": (start, end),
                    "new_span": (new_start, new_start + len(replacement)),
                }
            )
            gained += len(replacement) - (end - start)
            last = end
        return "".join([*pieces, text[last:]]), offsets

    def media(
        self, *, key: str, images: Sequence[bytes], input_ids: Any, config: Any, other: int = 0
    ) -> dict:
        """The image processor's model inputs for one conversation's images (decoded here),
        checked: its real outputs must expand each image as the size rule does, and the ids
        (encoded from the headers' sizes) must hold as many image tokens as they expand to
        (``other``: the image tokens the conversation's videos hold: InternVL's frames).

        Raises:
            Skip: an image does not decode (a data skip).
            ProcessorMismatchError: the real outputs expand an image otherwise.
        """
        if not images:
            return {}
        decoded = self._decode(images, config)
        processed = self.processor.image_processor([decoded], **self.images_kwargs)
        return self._checked(key, decoded, processed, input_ids, other)

    def media_of_pack(
        self, items: Sequence[tuple[str, Sequence[bytes], Any, int]], *, config: Any
    ) -> list[dict | Exception]:
        """:meth:`media` of each ``(key, images, input_ids, other)`` of one pack, or the
        exception that conversation (it alone) fails with. Where the family's image processor
        takes each image alone (``Family.image_rows``) the pack's images go through ONE call,
        whose outputs are split per conversation into views of one array per field (the pack
        layout joins them back without a copy): the same values as one call per conversation,
        at a fraction of the per-call cost. ``other``: the image tokens the conversation's
        videos hold (InternVL's frames)."""
        if self.family.image_rows is None:
            return [self._one(*item, config) for item in items]
        results: list[dict | Exception] = [{} for _ in items]
        decoded: dict[int, list] = {}
        for n, (_, images, _, _) in enumerate(items):
            if images:
                try:
                    decoded[n] = self._decode(images, config)
                except Exception as e:  # Skip: a data skip; it alone
                    results[n] = e
        if not decoded:
            return results
        flat = [image for n in decoded for image in decoded[n]]
        try:
            processed = self.processor.image_processor([flat], **self.images_kwargs)
            rows = self.family.image_rows(processed)
            split = all(
                len(per_image) == len(flat) and sum(per_image) == len(processed[name])
                for name, per_image in rows.items()
            ) and all(name in rows for name in self.fields if name in processed)
        except Exception:  # an image the processor refuses: found below, one call each
            split = False
        if not split:
            for n in decoded:
                results[n] = self._one(*items[n], config)
            return results
        cursor = dict.fromkeys(rows, 0)
        image = 0
        for n, pictures in decoded.items():
            part = {}
            for name, per_image in rows.items():
                length = sum(per_image[image : image + len(pictures)])
                part[name] = processed[name][cursor[name] : cursor[name] + length]
                cursor[name] += length
            image += len(pictures)
            key, _, ids, other = items[n]
            try:
                results[n] = self._checked(key, pictures, part, ids, other)
            except Exception as e:  # ProcessorMismatchError: it alone
                results[n] = e
        return results

    def _one(
        self, key: str, images: Sequence[bytes], ids: Any, other: int, config: Any
    ) -> dict | Exception:
        try:
            return self.media(key=key, images=images, input_ids=ids, config=config, other=other)
        except Exception as e:
            return e

    def _decode(self, images: Sequence[bytes], config: Any) -> list:
        budget = getattr(config, "max_image_pixels", None)
        high_bit_depth = getattr(config, "high_bit_depth", None) or "scale"
        alpha_on_white = hf_compat.alpha_on_white()
        return decode_once(
            lambda d: decode(
                d, max_pixels=budget, high_bit_depth=high_bit_depth, alpha_on_white=alpha_on_white
            ),
            images,
        )

    def slots_in(self, text: str) -> int:
        """The tokens the model fills with vision features that ``text`` holds."""
        return sum(text.count(t) for t in self._slot_tokens)

    def _checked(
        self, key: str, decoded: list, processed: Any, input_ids: Any, other: int = 0
    ) -> dict:
        """The model inputs the processor keeps of ``processed``, once they are checked
        (``other``: the ids' image tokens that are not these images': InternVL's frames)."""
        sizes = [(image.height, image.width) for image in decoded]
        real = self.replacements(decoded, processed)
        predicted = self.replacements(sizes)
        slots = sum(self.slots_in(r) for r in real)
        ids = np.asarray(input_ids)
        if len(self._slot_ids) == 1:
            held = int(np.count_nonzero(ids == self._slot_ids[0]))
        else:
            held = int(np.count_nonzero(np.isin(ids, self._slot_ids)))
        held -= other
        if real != predicted or slots != held:
            raise ProcessorMismatchError(
                f"{self.family.name} ({type(self.processor).__name__}): sample {brief(key)} "
                f"with image (height, width) {sizes}: the image processor expands them to "
                f"{[len(r) for r in real]} characters ({slots} image tokens), the size rule "
                f"to {[len(r) for r in predicted]}, the encoded ids hold {held} image tokens; "
                f"energon_packing.encoding.families disagrees with the processor"
            )
        return {n: _array(processed[n]) for n in self.fields if n in processed}

    def token_fields_of_pack(self, ids: Sequence[np.ndarray]) -> list[dict[str, np.ndarray]]:
        """:meth:`token_fields` of each conversation of a pack. Where the processor's
        ``create_mm_token_type_ids`` is transformers' own token-by-token rule (``ProcessorMixin``'s:
        a type per id, whatever its neighbours), one call on the pack's ids joined, split back
        into views; otherwise one call per conversation. The family's other token fields
        (``Family.token_fields``: ERNIE's ``moe_mm_token_type_ids``) per conversation."""
        fields = self._token_types_of_pack(ids)
        for name, method, older in self.family.token_fields:
            make = getattr(self.processor, method, None)
            if make is None and older is not None:  # a release before the method
                make = functools.partial(older, self.processor)
            if make is None:
                raise hf_compat.TransformersCompatError(
                    f"{type(self.processor).__name__} has no {method} on transformers "
                    f"{hf_compat.dotted(hf_compat.transformers_version())} and energon_packing "
                    f"knows no rule of this release for its {name}: upgrade transformers"
                )
            for own, one in zip(fields, ids):
                (row,) = make([np.asarray(one).tolist()])
                own[name] = np.asarray(row, dtype=np.int64)
        return fields

    def _token_types_of_pack(self, ids: Sequence[np.ndarray]) -> list[dict[str, np.ndarray]]:
        if self.token_types is None or not ids:
            return [{} for _ in ids]
        if not self._per_token_types or len(ids) == 1:
            rows = self.processor.create_mm_token_type_ids([np.asarray(i).tolist() for i in ids])
            return [{self.token_types: np.asarray(r, dtype=np.int64)} for r in rows]
        joined = np.concatenate([np.asarray(i) for i in ids]).tolist()
        (types,) = self.processor.create_mm_token_type_ids([joined])
        types = np.asarray(types, dtype=np.int64)
        ends = np.cumsum([len(i) for i in ids])
        return [{self.token_types: part} for part in np.split(types, ends[:-1])]


def _per_token_types(processor: Any) -> bool:
    """Whether ``create_mm_token_type_ids`` is ``ProcessorMixin``'s own (a modality per id,
    read from ``image_token_ids`` and friends): then a pack's ids may go through one call."""
    mixin = hf_compat.mixin_token_types()
    mine = getattr(type(processor), "create_mm_token_type_ids", None)
    return mine is not None and mine is mixin


def _markup(
    render: Callable[[list[dict]], str], image_token: str, *, kind: str = "image"
) -> tuple[str, str]:
    """What the chat template writes before and after an image (``kind="video"``: a video)
    placeholder (e.g. ``<|vision_start|>`` and ``<|vision_end|>``), from a probe message
    rendered with and without one; ``("", "")`` where the two renders do not tell."""
    text = [{"type": "text", "text": "A"}, {"type": "text", "text": "B"}]
    try:
        plain = render([{"role": "user", "content": text}])
        pictured = render([{"role": "user", "content": [text[0], {"type": kind}, text[1]]}])
    except Exception:  # a template that wants more than one user message
        return "", ""
    shorter = min(len(plain), len(pictured))
    head = 0
    while head < shorter and plain[head] == pictured[head]:
        head += 1
    tail = 0
    while tail < shorter - head and plain[-1 - tail] == pictured[-1 - tail]:
        tail += 1
    markup = pictured[head : len(pictured) - tail]
    if markup.count(image_token) != 1:
        return "", ""
    before, after = markup.split(image_token)
    return before, after


def slot_ids(processor: Any, family: Family | None) -> list[int]:
    """The ids of the tokens the model fills with vision features: the family's
    ``slot_token`` (Llama 4's ``<|patch|>``), else the processor's ``image_token_ids`` (Gemma
    3: not its placeholder), else its ``image_token_id`` (Aya Vision before it lists
    ``image_token_ids``: its ``<|IMG_PATCH|>``, not its ``<image>`` placeholder), else its
    image token."""
    if family is not None and family.slot_token:
        return [processor.tokenizer.convert_tokens_to_ids(family.slot_token)]
    ids = [i for i in getattr(processor, "image_token_ids", None) or [] if i is not None]
    if ids:
        return ids
    own = getattr(processor, "image_token_id", None)  # what older releases name the slot
    if isinstance(own, int) and not isinstance(own, bool):  # (Aya Vision's <|IMG_PATCH|>)
        return [own]
    return [processor.tokenizer.convert_tokens_to_ids(processor.image_token)]


def _array(value: Any) -> np.ndarray:
    """An output of the image processor as a numpy array; a torch tensor in bfloat16 (Llama 4's
    pixels, which numpy has no type for) widened to float32, which holds each value exactly."""
    if hasattr(value, "numpy") and str(getattr(value, "dtype", "")) == "torch.bfloat16":
        return value.float().numpy()
    return np.asarray(value)
