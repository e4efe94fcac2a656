"""Synthetic audio clips, encoded with PyAV's own encoders (nothing downloaded), and
conversations about them.

    data = clip("wav", seconds=1.5, rate=16000, channels=1, seed=0)

A clip is a few tones plus noise, so every mel bin and every resampler tap sees signal.
:data:`FORMATS` covers every suffix of :data:`energon_packing.media.audio.AUDIO_SUFFIXES`.
"""

from __future__ import annotations

import io
import random
from collections.abc import Iterator

import numpy as np

from energon_packing.testing.synth import Conversation, conversation

__all__ = ["FORMATS", "audio_conversation", "audio_conversations", "clip", "tones"]

#: suffix -> (container format, codec, sample format)
FORMATS = {
    "wav": ("wav", "pcm_s16le", "s16"),
    "flac": ("flac", "flac", "s16"),
    "mp3": ("mp3", "libmp3lame", "fltp"),
    "ogg": ("ogg", "libopus", "flt"),
    "opus": ("opus", "libopus", "flt"),
    "m4a": ("ipod", "aac", "fltp"),
}


def clip(
    suffix: str, *, seconds: float, rate: int = 16000, channels: int = 1, seed: int = 0
) -> bytes:
    """A clip of ``seconds`` at ``rate`` Hz, ``channels`` channels, as ``suffix`` bytes."""
    import av

    container_format, codec, sample_format = FORMATS[suffix]
    if codec == "libopus":
        rate = 48000 if rate not in (8000, 12000, 16000, 24000, 48000) else rate
    n = round(seconds * rate)
    rng = np.random.default_rng(seed)
    t = np.arange(n) / rate
    waves = []
    for c in range(channels):
        f1, f2 = rng.uniform(100, 3000, size=2)  # tones(seed) for c == 0
        wave = 0.3 * np.sin(2 * np.pi * f1 * t) + 0.2 * np.sin(2 * np.pi * f2 * t + c)
        waves.append(wave + 0.05 * rng.standard_normal(n))
    samples = np.clip(np.stack(waves), -1, 1).astype(np.float32)
    out = io.BytesIO()
    # bitexact: no random Ogg stream serial, no encoder version tag: the same clip, the same bytes
    container = av.open(out, mode="w", format=container_format, options={"fflags": "+bitexact"})
    stream = container.add_stream(codec, rate=rate)
    stream.layout = "mono" if channels == 1 else "stereo"
    step = 1024
    for start in range(0, n, step):
        block = samples[:, start : start + step]
        if sample_format == "s16":
            data = (block * 32767).astype(np.int16).T.reshape(1, -1)
        elif sample_format == "flt":
            data = np.ascontiguousarray(block.T.reshape(1, -1))
        else:  # planar float
            data = np.ascontiguousarray(block)
        frame = av.AudioFrame.from_ndarray(data, format=sample_format, layout=stream.layout.name)
        frame.sample_rate = rate
        frame.pts = start
        for packet in stream.encode(frame):
            container.mux(packet)
    for packet in stream.encode(None):
        container.mux(packet)
    container.close()
    return out.getvalue()


def tones(seed: int) -> tuple[float, float]:
    """The two tone frequencies (Hz) of :func:`clip`'s first channel for ``seed``."""
    f1, f2 = np.random.default_rng(seed).uniform(100, 3000, size=2)
    return float(f1), float(f2)


def _heard(seed: int, seconds: float) -> str:
    low, high = sorted(round(f, -1) for f in tones(seed))
    return f"Two tones, near {low:.0f} Hz and {high:.0f} Hz, over a little noise, for about {seconds:.1f} seconds."


def audio_conversation(
    rng: random.Random, key: str, *, suffix: str = "flac", seconds: float = 2.0, clips: int = 1
) -> Conversation:
    """A conversation about ``clips`` synthetic clips (``speech.<suffix>``, ``speech1.<suffix>``,
    ...): what is heard in them (their true tones and length), both content styles
    (``<audio>`` strings with an ``audios`` list, and ``{"type": "audio"}`` parts), sometimes
    a follow-up question."""
    names = [f"speech{'' if i == 0 else i}.{suffix}" for i in range(clips)]
    seeds = [rng.randrange(1 << 30) for _ in names]
    lengths = [round(seconds * rng.uniform(0.6, 1.0), 2) for _ in names]
    audios = {n: clip(suffix, seconds=s, seed=z) for n, s, z in zip(names, lengths, seeds)}
    question = "What do you hear?" if clips == 1 else "Describe each clip in turn."
    answer = " ".join(
        (f"Clip {i + 1}: " if clips > 1 else "") + _heard(z, s)
        for i, (z, s) in enumerate(zip(seeds, lengths))
    )
    if rng.random() < 0.5:
        content: list[dict] | str = [{"type": "audio", "audio": n} for n in names]
        content.append({"type": "text", "text": question})
    else:
        content = "<audio>\n" * clips + question
    messages: list[dict] = [
        {"role": "user", "content": content},
        {"role": "assistant", "content": answer},
    ]
    if rng.random() < 0.4:
        messages.append({"role": "user", "content": "Is any of it speech?"})
        messages.append({"role": "assistant", "content": "No, only tones and noise."})
    return Conversation(
        key=key, document={"messages": messages, "audios": names}, images={}, audios=audios
    )


def audio_conversations(n: int, *, seed: int, prefix: str = "audio") -> Iterator[Conversation]:
    """``n`` conversations: every other one about 1-2 clips (the formats of :data:`FORMATS`
    in turn, 1-3 s), the others :func:`~energon_packing.testing.synth.conversation`'s mix
    of 0-2 images and text only."""
    rng = random.Random(seed)
    suffixes = list(FORMATS)
    for index in range(n):
        key = f"{prefix}{index:06d}"
        if index % 2:
            yield conversation(rng, key, max_images=2)
            continue
        suffix = suffixes[(index // 2) % len(suffixes)]
        # PCM is 32 KB a second: keep the bundled WAV short
        seconds = 1.0 if suffix == "wav" else rng.uniform(1.5, 3.0)
        yield audio_conversation(
            rng, key, suffix=suffix, seconds=seconds, clips=2 if index % 6 == 4 else 1
        )
