"""Audio clips: how long they are (the cost) and their samples (the features), with PyAV.

A clip is mono float32 at 16 kHz, as transformers' default audio loader (torchcodec / FFmpeg)
gives it: PyAV's ``AudioResampler(format="flt", layout="mono", rate=16000)``, flushed at the end,
is the same FFmpeg resampler and downmix ((L+R)/sqrt 2 for stereo), sample for sample. No torch.

The cost of a clip is its sample count at 16 kHz (each family turns it into tokens by its own
rule). :func:`samples` reads it from the header where the header is exact (PCM WAV and FLAC at
16 kHz: the stream's frame count is the sample count); every other clip (MP3, Ogg Vorbis / Opus,
AAC in M4A, WAV or FLAC at another rate) is decoded once at encode time, since a lossy codec's
header duration is off by its priming / padding samples (Opus by 104, AAC by 256: a token on
some clips). Decoding a clip costs a few ms; the samples are dropped after counting and decoded
again only for the pack that is emitted.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

import numpy as np

from energon_packing.errors import Skip

__all__ = [
    "AUDIO_SUFFIXES",
    "RATE",
    "AudioLength",
    "decode",
    "length",
    "may_be_audio",
    "track_length",
]

#: Part-name suffixes read as audio clips (kept compressed while buffered).
AUDIO_SUFFIXES = frozenset(("wav", "flac", "mp3", "ogg", "opus", "m4a"))
#: The sampling rate every audio family's feature extractor takes.
RATE = 16000
#: Containers PyAV may open an audio part as (never an arbitrary demuxer on untrusted bytes).
DEMUXERS = "wav,flac,mp3,ogg,mov,mp4,m4a,3gp,3g2,mj2,matroska,webm"
#: Codecs whose header frame count is the sample count (no priming, no padding).
_EXACT_CODECS = frozenset(("flac",)) | {f"pcm_{k}" for k in ("s16le", "s24le", "s32le", "f32le")}


def may_be_audio(part: str) -> bool:
    """Whether a shard part is read as an audio clip: its name ends in one of
    :data:`AUDIO_SUFFIXES` (any case)."""
    return part.rpartition(".")[2].lower() in AUDIO_SUFFIXES


@dataclass(kw_only=True, slots=True, frozen=True)
class AudioLength:
    """A clip's length at :data:`RATE`, and where it was read from (``header`` or ``decode``)."""

    samples: int
    source: str

    @property
    def seconds(self) -> float:
        return self.samples / RATE


def _open(data: bytes) -> Any:
    try:
        import av
    except ImportError:  # pragma: no cover - av is a dependency of the audio extra
        raise Skip(
            "audio_unreadable", "PyAV is not installed (pip install 'energon-packing[video]')"
        ) from None
    try:
        container = av.open(io.BytesIO(data), options={"format_whitelist": DEMUXERS})
    except Exception as e:
        raise Skip("audio_unreadable", f"not an audio container PyAV reads ({e})") from None
    if not container.streams.audio:
        container.close()
        raise Skip("audio_no_stream", "the part holds no audio stream")
    return container


def _stream(container: Any) -> Any:
    """The audio stream transformers' loader reads: FFmpeg's best one (torchcodec's default,
    ``av_find_best_stream``: the default-disposition stream first), not simply the first."""
    return container.streams.best("audio") or container.streams.audio[0]


def _too_long(seconds: float, max_seconds: float | None) -> None:
    if max_seconds is not None and seconds > max_seconds:
        raise Skip(
            "audio_too_long",
            f"a clip of {seconds:,.2f} s, longer than max_audio_seconds={max_seconds:g}; raise "
            f"max_audio_seconds (the family's own maximum still applies) or cut such clips",
        )


def length(data: bytes, *, max_seconds: float | None = None) -> AudioLength:
    """The clip's sample count at 16 kHz: from the header where it is exact, else decoded.

    Raises:
        Skip: ``audio_unreadable``, ``audio_no_stream`` or ``audio_too_long``.
    """
    container = _open(data)
    try:
        stream = _stream(container)
        codec = stream.codec_context
        if (
            codec.name in _EXACT_CODECS
            and codec.sample_rate == RATE
            and stream.duration is not None
            and stream.time_base is not None
            and stream.time_base * RATE == 1
        ):
            # the header's word is checked against the time limit before anything decodes
            _too_long(stream.duration / RATE, max_seconds)
            return AudioLength(samples=int(stream.duration), source="header")
        if stream.duration is not None and stream.time_base is not None:
            _too_long(float(stream.duration * stream.time_base) - 1.0, max_seconds)
    finally:
        container.close()
    return AudioLength(samples=len(decode(data, max_seconds=max_seconds)), source="decode")


def track_length(data: bytes, *, max_seconds: float | None = None) -> AudioLength:
    """A video's own audio track's length, read as :func:`length` reads a clip (what a run
    with ``audio_config['load_audio_from_video']`` reads, and ``check --video-tracks``).

    Raises:
        Skip: as :func:`length`, its detail opening with ``own audio track:``; a silent video's
            names the switch that reads tracks.
    """
    try:
        return length(data, max_seconds=max_seconds)
    except Skip as e:
        why = e.detail
        if e.reason == "audio_no_stream":  # the others' details name their own fix
            why += (
                "; audio_config['load_audio_from_video'] interleaves every video's track, and "
                "the thinker's positions take no silent video beside them: leave the knob off "
                "for such data, or give the video a sound track"
            )
        raise Skip(e.reason, f"own audio track: {why}") from None


def decode(data: bytes, *, max_seconds: float | None = None) -> np.ndarray:
    """The clip as mono float32 samples at 16 kHz, as transformers' default loader gives it.

    Raises:
        Skip: ``audio_unreadable`` (a corrupt stream), ``audio_no_stream`` or ``audio_too_long``.
    """
    import av

    container = _open(data)
    limit = None if max_seconds is None else int(max_seconds * RATE) + 1
    parts: list[np.ndarray] = []
    held = 0
    try:
        resampler = av.AudioResampler(format="flt", layout="mono", rate=RATE)
        for frame in container.decode(_stream(container)):
            for out in resampler.resample(frame):
                parts.append(out.to_ndarray().reshape(-1))
                held += parts[-1].size
            if limit is not None and held > limit:
                _too_long(held / RATE, max_seconds)
        for out in resampler.resample(None):  # the resampler's tail
            parts.append(out.to_ndarray().reshape(-1))
    except Skip:
        raise
    except Exception as e:
        raise Skip("audio_unreadable", f"the audio stream does not decode ({e})") from None
    finally:
        container.close()
    samples = np.concatenate(parts).astype(np.float32, copy=False) if parts else np.zeros(0)
    if samples.size == 0:
        raise Skip("audio_no_stream", "the audio stream holds no samples")
    _too_long(samples.size / RATE, max_seconds)
    return samples.astype(np.float32, copy=False)
