"""How each family's processor turns one conversation's audio clips into tokens and features
(:class:`AudioRule`), as data and small rules over the feature extractor's settings: the audio
counterpart of :mod:`.video_styles`. A family takes audio when its registry entry names a rule
(``Family.audio`` in :mod:`energon_packing.encoding.families`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["GEMMA3N_AUDIO", "PHI4_AUDIO", "QWEN2_5_OMNI_AUDIO", "QWEN3_OMNI_AUDIO", "AudioRule"]


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(kw_only=True, slots=True, frozen=True)
class AudioRule:
    """How a family's processor turns one conversation's clips (16 kHz samples) into audio
    tokens and features, as its ``_process_audio`` does (transformers 5.24).

    Attributes:
        name: The rule's name (the restore fingerprint holds it).
        padding: ``"max_length"``: the processor pads every clip to the feature extractor's
            maximum (Qwen2.5-Omni: 5 minutes) and cuts longer ones, so a clip's features do
            not depend on its neighbours; the pack holds them padded to the longest clip of
            the pack only (the model reads the masked frames alone), and a clip over the
            maximum is skipped (``audio_too_long``), never cut. ``"longest"``: the processor
            pads the clips of one call to the longest of them (Qwen3-Omni), and the longest
            clip's frame count and last frames differ from a padded one's: a conversation's
            clips go through one call of their own, never one call per pack. ``"multiple"``:
            as ``"longest"``, the longest rounded up to ``multiple`` samples, and a call cut at
            ``max_samples`` (Gemma 3n: 128 samples, 30 s; a longer clip is skipped
            ``audio_too_long``, where the processor would cut it silently).
        tokens: Audio tokens of a clip of ``frames`` mel frames (the processor's
            ``_get_feat_extract_output_lengths``; Gemma 3n: ``audio_seq_length``, whatever
            the clip), given the processor.
        expansion: A clip's placeholder expansion, given the processor and its tokens, as
            its ``replace_audio_token`` writes it (None: the audio token, that many times).
        mask: The name the model reads the features' frame mask under (Qwen's
            ``feature_attention_mask``; Gemma 3n's ``input_features_mask``, boolean).
        multiple: See ``"multiple"``.
        max_samples: See ``"multiple"``.
        interleave: How the processor interleaves a video's own audio track with its frames
            (``audio_config['load_audio_from_video']``): ``"chunks"`` (Qwen2.5-Omni) or
            ``"tokens"`` (Qwen3-Omni), :mod:`energon_packing.encoding.av_interleave`; None:
            the family's processor takes no video track.
        features: The name of the features the model reads (Phi-4-multimodal's
            ``audio_input_features``).
        sizes: A per-clip token count the model reads beside them (Phi-4-multimodal's
            ``audio_embed_sizes``; None: none).
        alone: A conversation with clips shares its pack only with conversations without
            media (``packing.Company``: they fill the rest of it): the model's audio encoder
            reads the padding of the call's longest clip, and its audio projection whether
            the call holds images (Phi-4-multimodal).
        ``"windows"`` padding (Phi-4-multimodal): the extractor's own defaults (a call padded
        to its longest clip), a clip's frames ``(samples - win_length) // hop + 1`` whatever its
        neighbours, the frame mask returned only for two clips or more.
    """

    name: str
    padding: str
    tokens: Callable[[int, Any], int]
    expansion: Callable[[Any, int], str] | None = None
    mask: str = "feature_attention_mask"
    multiple: int = 1
    max_samples: int | None = None
    interleave: str | None = None
    features: str = "input_features"
    sizes: str | None = None
    alone: bool = False

    def frames(self, samples: list[int], extractor: Any) -> list[int]:
        """Each clip's mel frames (the mask's sum) in a call with the conversation's clips
        (the mask is the samples' mask at every ``hop``-th sample, cut to the frames the STFT
        keeps of the padded length: Whisper's ``padded // hop``, Gemma 3n's
        ``(padded - frame_length - 1) // hop + 1``)."""
        hop = extractor.hop_length
        if self.padding == "windows":
            return [(n - extractor.win_length) // hop + 1 for n in samples]
        if self.padding == "longest":
            kept = max(samples) // hop
            return [min(_ceil_div(n, hop), kept) for n in samples]
        if self.padding == "multiple":
            padded = _ceil_div(max(samples), self.multiple) * self.multiple
            if self.max_samples is not None:
                padded = min(padded, self.max_samples)
            kept = (padded - extractor.frame_length - 1) // hop + 1
            return [min(_ceil_div(n, hop), kept) for n in samples]
        return [_ceil_div(n, hop) for n in samples]

    def call_kwargs(self, samples: list[int], extractor: Any) -> dict:
        """What the feature extractor is called with for one conversation's clips."""
        if self.padding == "longest":
            return {"padding": True, "truncation": False}
        if self.padding in ("multiple", "windows"):  # the extractor's defaults, as its processor
            return {}
        # every frame a clip's mask covers sees the same zeros as under the processor's
        # 5-minute pad, and the clip's max (the log-mel floor) counts an all-zero frame as it
        # does; frames past that are the pad's own values
        hop = extractor.hop_length
        width = _ceil_div(max(samples), hop) * hop + 2 * extractor.n_fft
        return {"padding": "max_length", "max_length": width, "truncation": True}

    @property
    def needs(self) -> tuple[str, ...]:
        """The feature extractor's attributes this rule reads."""
        own = {
            "max_length": ("n_fft", "n_samples"),
            "multiple": ("frame_length",),
            "windows": ("win_length", "audio_compression_rate", "audio_downsample_rate"),
        }
        return ("hop_length", "sampling_rate", *own.get(self.padding, ()))


def _qwen2_5_omni_tokens(frames: int, processor: Any) -> int:
    return ((frames - 1) // 2 + 1 - 2) // 2 + 1


def _qwen3_omni_tokens(frames: int, processor: Any) -> int:
    chunk = 2 * getattr(processor, "n_window", 50)
    left = (frames % chunk - 1) // 2 + 1
    return ((left - 1) // 2 + 1 - 1) // 2 + 1 + (frames // chunk) * 13


QWEN2_5_OMNI_AUDIO = AudioRule(
    name="qwen2_5_omni", padding="max_length", tokens=_qwen2_5_omni_tokens, interleave="chunks"
)
QWEN3_OMNI_AUDIO = AudioRule(
    name="qwen3_omni", padding="longest", tokens=_qwen3_omni_tokens, interleave="tokens"
)


def _gemma3n_audio_tokens(frames: int, processor: Any) -> int:
    return processor.audio_seq_length


def _gemma3n_audio_expansion(processor: Any, tokens: int) -> str:
    return processor.full_audio_sequence


#: Gemma 3n: ``audio_seq_length`` (188) tokens a clip, its encoder's output padded to them by
#: the model, ``\n\n<start_of_audio>`` before and ``<end_of_audio>\n\n`` after (its
#: ``full_audio_sequence``); the extractor's defaults (a call padded to its longest clip in
#: steps of 128 samples, cut at 30 s)
GEMMA3N_AUDIO = AudioRule(
    name="gemma3n",
    padding="multiple",
    tokens=_gemma3n_audio_tokens,
    expansion=_gemma3n_audio_expansion,
    mask="input_features_mask",
    multiple=128,
    max_samples=480_000,
)


def _phi4_audio_tokens(frames: int, processor: Any) -> int:
    extractor = processor.audio_processor
    compressed = _ceil_div(frames, extractor.audio_compression_rate)
    return _ceil_div(compressed, extractor.audio_downsample_rate)


#: Phi-4-multimodal: ``<|audio|>`` repeated ``ceil(frames / audio_compression_rate)`` times
#: (``audio_embed_sizes``), 25 ms windows every 10 ms; its model's audio encoder reads the
#: call's padding and its projection the call's images: a clip's conversation packs beside
#: text only
PHI4_AUDIO = AudioRule(
    name="phi4_multimodal",
    padding="windows",
    tokens=_phi4_audio_tokens,
    mask="audio_attention_mask",
    features="audio_input_features",
    sizes="audio_embed_sizes",
    alone=True,
)
