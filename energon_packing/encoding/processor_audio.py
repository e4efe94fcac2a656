"""The audio side of a Hugging Face Omni processor, apart from its text side.

What the processor's own ``_process_audio`` does, without tokenizing anything: each audio
placeholder's expansion (``replace_audio_token``'s count, from the clip's sample count alone at
encode time: :class:`~energon_packing.media.audio_rules.AudioRule`) and, at pack time, the
feature extractor's ``input_features`` and ``feature_attention_mask`` for one conversation's
clips (decoded then: :func:`energon_packing.media.audio.decode`), checked against the ids.
No torch here (the feature extractor may use it, as it does in the processor).
"""

from __future__ import annotations

import hashlib
import inspect
import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from energon_packing.encoding.chat import Skip
from energon_packing.media import audio
from energon_packing.media.audio_rules import AudioRule

__all__ = ["AudioSide"]


class AudioSide:
    """A processor's audio work for one family.

    Args:
        processor: An Omni processor (``feature_extractor``, ``audio_token``).
        rule: The family's :class:`~energon_packing.media.audio_rules.AudioRule`.
    """

    def __init__(self, processor: Any, rule: AudioRule):
        self.processor = processor
        self.rule = rule
        # Phi-4-multimodal names its feature extractor audio_processor
        self.extractor = getattr(processor, "feature_extractor", None) or getattr(
            processor, "audio_processor", None
        )
        for name in rule.needs:
            if not hasattr(self.extractor, name):
                raise ValueError(
                    f"{type(processor).__name__}'s feature extractor "
                    f"{type(self.extractor).__name__} has no {name!r}: energon_packing costs "
                    f"audio through the feature extractor of the family's rule ({rule.name}) only"
                )
        if self.extractor.sampling_rate != audio.RATE:
            raise ValueError(
                f"{type(self.extractor).__name__} takes {self.extractor.sampling_rate} Hz; "
                f"clips are decoded at {audio.RATE} Hz"
            )
        self.token = processor.audio_token
        self.token_id = processor.tokenizer.convert_tokens_to_ids(self.token)

    def configure(self, overrides: Mapping[str, Any]) -> None:
        """The feature extractor rebuilt with ``audio_config``'s settings over its own (a
        video's audio-track switch is not the feature extractor's: the chat layout takes it)."""
        from energon_packing.config import AUDIO_IN_VIDEO_KEYS

        overrides = {k: v for k, v in overrides.items() if k not in AUDIO_IN_VIDEO_KEYS}
        klass = type(self.extractor)
        accepted = set(inspect.signature(klass.__init__).parameters)
        settings = {k: v for k, v in self.extractor.to_dict().items() if k in accepted}
        self.extractor = klass(**{**settings, **overrides})

    @property
    def fingerprint(self) -> str:
        """The rule and the feature extractor's settings: what decides a clip's tokens."""
        settings = {
            k: v for k, v in self.extractor.to_dict().items() if k not in ("mel_filters", "window")
        }
        blob = json.dumps(
            {"rule": self.rule.name, "padding": self.rule.padding, "settings": settings},
            sort_keys=True,
            default=str,
        )
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def _check_family_maximum(self, samples: Sequence[int]) -> None:
        if self.rule.padding == "windows":  # Phi-4-multimodal: a frame is one whole window
            window = self.extractor.win_length
            for n in samples:
                if n < window:
                    raise Skip(
                        "audio_too_short",
                        f"a clip of {n} samples ({n / audio.RATE * 1000:,.1f} ms), shorter than "
                        f"the {window}-sample window of its feature extractor, which makes no "
                        f"frame of it (its model would get an empty clip): drop such clips",
                    )
            return
        if self.rule.padding == "max_length":
            most, knob = self.extractor.n_samples, "chunk_length"
        elif self.rule.max_samples is not None:
            most, knob = self.rule.max_samples, None
        else:
            return
        for n in samples:
            if n > most:
                raise Skip(
                    "audio_too_long",
                    f"a clip of {n / audio.RATE:,.2f} s, longer than the {most / audio.RATE:g} s "
                    f"its feature extractor takes ({knob or 'its max_length'}); the processor "
                    f"would cut it silently: cut such clips"
                    + (f", or raise audio_config['{knob}']" if knob else ""),
                )

    def frames(self, samples: Sequence[int]) -> list[int]:
        """Mel frames of each of one conversation's clips (``samples`` at 16 kHz), as the
        processor's call with that conversation's clips makes them (what the audio encoder
        reads: the step-cost model prices them)."""
        self._check_family_maximum(samples)
        return self.rule.frames(list(samples), self.extractor)

    def tokens(self, samples: Sequence[int]) -> list[int]:
        """Audio tokens of each of one conversation's clips (``samples`` at 16 kHz)."""
        return [self.rule.tokens(f, self.processor) for f in self.frames(samples)]

    def expansions(self, samples: Sequence[int]) -> list[str]:
        """Each clip's placeholder expansion, as ``replace_audio_token`` writes it."""
        return [self.expansion_of(f) for f in self.frames(samples)]

    def expansion_of(self, frames: int) -> str:
        """The placeholder expansion of a clip of ``frames`` mel frames."""
        tokens = self.rule.tokens(frames, self.processor)
        if self.rule.expansion is not None:
            return self.rule.expansion(self.processor, tokens)
        return self.token * tokens

    def features(
        self, *, key: str, clips: Sequence[bytes], input_ids: Any, max_seconds: float | None
    ) -> dict[str, np.ndarray]:
        """``input_features`` and their frame mask (the rule's ``mask``:
        ``feature_attention_mask``, Gemma 3n's ``input_features_mask``) of one conversation's
        clips (decoded now), from one feature-extractor call of their own; the ids must hold as
        many audio tokens as the features give.

        Raises:
            Skip: a clip does not decode.
            ProcessorMismatchError: the features give another token count than the ids hold.
        """
        from energon_packing.encoding.processor_images import ProcessorMismatchError

        waves = [audio.decode(data, max_seconds=max_seconds) for data in clips]
        samples = [len(w) for w in waves]
        self._check_family_maximum(samples)
        extractor = self.extractor
        out = extractor(
            waves,
            sampling_rate=audio.RATE,
            return_attention_mask=True,
            return_tensors="np",
            **self.rule.call_kwargs(samples, extractor),
        )
        if self.rule.mask == "feature_attention_mask":  # the thinkers' name for Whisper's mask
            mask = np.asarray(out["attention_mask"], dtype=np.int32)
        else:  # Gemma 3n's input_features_mask; Phi-4's audio_attention_mask (2 clips or more)
            found = out.get(self.rule.mask)
            mask = None if found is None else np.asarray(found, dtype=bool)
        features = np.asarray(out[self.rule.features], dtype=np.float32)
        if mask is not None:
            frames = mask.sum(-1).astype(int).tolist()
        else:  # one clip, no mask: its frames are the features'
            frames = [int(features.shape[1])] * len(waves)
        tokens = [self.rule.tokens(f, self.processor) for f in frames]
        sizes = None
        if self.rule.sizes is not None:
            sizes = np.asarray(out[self.rule.sizes], dtype=np.int64).reshape(-1)
        held = int(np.count_nonzero(np.asarray(input_ids) == self.token_id))
        if (
            held != sum(tokens)
            or frames != self.rule.frames(samples, extractor)
            or (sizes is not None and sizes.tolist() != tokens)
        ):
            raise ProcessorMismatchError(
                f"{self.rule.name}: sample {key!r}: the encoded ids hold {held} audio tokens, "
                f"its {len(waves)} clip(s) of {samples} samples give {frames} mel frames and "
                f"{sum(tokens)} tokens"
                + (
                    f" (the extractor's {self.rule.sizes}: {sizes.tolist()})"
                    if sizes is not None
                    else ""
                )
            )
        heard = {self.rule.features: features}
        if mask is not None:
            heard[self.rule.mask] = mask
        if sizes is not None:
            heard[self.rule.sizes] = sizes
        return heard
