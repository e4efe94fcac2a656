"""Forward FLOPs of an audio encoder over one clip (:class:`AudioTower`), the third part of a
pack's modelled cost beside the decoder and the vision encoder
(:class:`~energon_packing.packing.balance.StepCostModel`)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["AudioTower"]


def _half(n: int) -> int:
    """Outputs of a kernel-3, stride-2, padding-1 convolution over ``n`` inputs."""
    return (n - 1) // 2 + 1


@dataclass(kw_only=True, slots=True, frozen=True)
class AudioTower:
    """Forward FLOPs of a Qwen Omni audio encoder (transformers 5.24's
    ``Qwen2_5OmniAudioEncoder``, ``Qwen3OmniMoeAudioEncoder``) over one clip of ``L`` mel
    frames.

    The clip is cut into chunks of ``chunk_frames`` frames (``2 * n_window``; the last one the
    rest), each ``c`` frames becoming ``t(c)`` encoder tokens, ``T = sum t(c)``. The stem runs
    over every chunk at the width ``W`` of the call's longest (the last one zero-padded):
    ``n`` chunks of ``W = min(chunk_frames, L)`` frames::

        stem, conv1d (Qwen2.5-Omni)   n*(2*W*3*mel*d + 2*t(W)*3*d*d)      t(c) = ceil(c/2)
        stem, conv2d (Qwen3-Omni)     n*(three 3x3 stride-2 convolutions 1 -> D -> D -> D over
                                      (mel, W), then a linear D*mel/8 -> d)  t(c) = ceil^3(c/2)
        per layer                     2*T*(4*d*d + 2*d*f) + 4*d*sum(S**2)
        head, Qwen2.5-Omni            stride-2 average pool, then d -> out over its outputs
        head, Qwen3-Omni              d -> d, then d -> out over T

    ``S`` are the attention windows: each chunk's tokens (Qwen2.5-Omni), or
    ``window_chunks`` full chunks' tokens, the clip's rest last (Qwen3-Omni's ``n_window_infer``).
    Exact (``tests/test_step_cost.py`` counts the encoders' own convolutions and matrix products
    with torch's ``FlopCounterMode``, and their windows with transformers' own ``cu_seqlens``)
    for a clip of a chunk or more, or alone in its call; a short clip beside a longer one is
    padded wider than counted. Norms and activations are left out.

    Args:
        depth: Encoder layers.
        hidden_size: Encoder width ``d`` (``d_model``).
        intermediate_size: MLP width ``f`` (``encoder_ffn_dim``).
        out_hidden_size: The projection's output (``output_dim``: the decoder's width).
        mel_bins: Mel bins of the features (``num_mel_bins``).
        chunk_frames: Frames of a chunk (``2 * n_window``).
        downsample_hidden_size: The conv2d stem's channels ``D`` (0: the conv1d stem).
        window_chunks: Chunks an attention window holds (``n_window_infer / chunk_frames``;
            1: each chunk its own).
    """

    depth: int
    hidden_size: int
    intermediate_size: int
    out_hidden_size: int
    mel_bins: int = 128
    chunk_frames: int = 200
    downsample_hidden_size: int = 0
    window_chunks: int = 1

    def __post_init__(self) -> None:
        for name in ("depth", "hidden_size", "intermediate_size", "out_hidden_size"):
            _positive(self, name)
        for name in ("mel_bins", "chunk_frames", "window_chunks"):
            _positive(self, name)
        value = self.downsample_hidden_size
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"downsample_hidden_size must be an integer >= 0, got {value!r}")

    def chunks(self, frames: int) -> list[int]:
        """The clip's chunk lengths in frames."""
        full, rest = divmod(int(frames), self.chunk_frames)
        return [self.chunk_frames] * full + ([rest] if rest else [])

    def chunk_tokens(self, frames: int) -> int:
        """Encoder tokens of a chunk of ``frames`` frames."""
        tokens = _half(frames)
        if self.downsample_hidden_size:
            tokens = _half(_half(tokens))
        return tokens

    def windows(self, frames: int) -> list[int]:
        """Tokens of each attention window of a clip of ``frames`` frames."""
        tokens = [self.chunk_tokens(c) for c in self.chunks(frames)]
        if self.window_chunks == 1:
            return tokens
        window = self.window_chunks * self.chunk_tokens(self.chunk_frames)
        full, rest = divmod(sum(tokens), window)
        return [window] * full + ([rest] if rest else [])

    def clip_flops(self, frames: int) -> int:
        """Forward FLOPs of one clip of ``frames`` mel frames."""
        frames = int(frames)
        if frames <= 0:
            return 0
        d, f, mel = self.hidden_size, self.intermediate_size, self.mel_bins
        chunks = self.chunks(frames)
        tokens = sum(self.chunk_tokens(c) for c in chunks)
        down = self.downsample_hidden_size
        width = min(self.chunk_frames, frames)  # every chunk padded to the longest
        if down:  # each 3x3 output reads 9 inputs of each input channel
            h1, w1 = _half(mel), _half(width)
            h2, w2 = _half(h1), _half(w1)
            h3, w3 = _half(h2), _half(w2)
            stem = 2 * 9 * down * (h1 * w1 + down * (h2 * w2 + h3 * w3))
            stem += 2 * w3 * (down * h3) * d  # conv_out, before the padding is dropped
            head = 2 * tokens * (d * d + d * self.out_hidden_size)
        else:
            stem = 2 * width * 3 * mel * d + 2 * _half(width) * 3 * d * d
            pooled = (_half(frames) - 2) // 2 + 1
            head = 2 * pooled * d * self.out_hidden_size
        stem *= len(chunks)
        linear = 2 * tokens * (4 * d * d + 2 * d * f)
        attention = 4 * d * sum(s * s for s in self.windows(frames))
        return stem + self.depth * (linear + attention) + head


def _positive(obj: object, name: str) -> None:
    value = getattr(obj, name)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
