"""Synthetic audio clips, encoded with PyAV's own encoders (nothing downloaded).

    data = clip("wav", seconds=1.5, rate=16000, channels=1, seed=0)

A clip is a few tones plus noise, so every mel bin and every resampler tap sees signal.
:data:`FORMATS` covers every suffix of :data:`energon_packing.encoding.audio.AUDIO_SUFFIXES`.
"""

from __future__ import annotations

import io

import numpy as np

__all__ = ["FORMATS", "clip"]

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
        f1, f2 = rng.uniform(100, 3000, size=2)
        wave = 0.3 * np.sin(2 * np.pi * f1 * t) + 0.2 * np.sin(2 * np.pi * f2 * t + c)
        waves.append(wave + 0.05 * rng.standard_normal(n))
    samples = np.clip(np.stack(waves), -1, 1).astype(np.float32)
    out = io.BytesIO()
    container = av.open(out, mode="w", format=container_format)
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
