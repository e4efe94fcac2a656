"""A video's own audio track, interleaved with its frames (the Omni processors'
``load_audio_from_video``, formerly ``use_audio_in_video``): the block's tokens as the processor
writes them and its positions as the thinker's ``get_rope_index`` computes them.

The processor puts, in place of the video's one video token (the chat template's
``vision_bos`` / ``vision_eos`` stay around it)::

    audio_bos  V V V V  A A A  V V V V  A A A  ...  audio_eos
               chunk 0 video | audio   chunk 1 ...

Two rules, one per family (:attr:`~energon_packing.media.audio_rules.AudioRule.interleave`):

* ``"chunks"`` (Qwen2.5-Omni): the video's tokens and the track's tokens are cut into chunks
  of ``int(position_id_per_seconds * seconds_per_chunk)`` time units (a video token's time:
  its temporal patch times ``video_second_per_grid`` times ``position_id_per_seconds``; an
  audio token's: its index), and chunk j of the video comes before chunk j of the audio.
* ``"tokens"`` (Qwen3-Omni): the two are merged token by token by time, a video token first
  on a tie.

The processor orders by its own ``position_id_per_seconds`` / ``seconds_per_chunk`` (its call's
kwargs), the model's positions follow its config's, in the model's own order: where the two
differ (Qwen3-Omni: processor 13, thinker config 25) the model's positions are what the model
computes for the processor's ids, and a pack holds exactly those. No torch.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["INTERLEAVES", "block_positions", "chunks", "order", "track_expansion"]

#: the interleave rules (``AudioRule.interleave``)
INTERLEAVES = ("chunks", "tokens")


def chunks(values: Sequence[float] | np.ndarray, per_chunk: int) -> list[tuple[int, int]]:
    """``[start, end)`` of each chunk of ascending ``values``, as the Omni processors' and
    thinkers' ``get_chunked_index`` cut them: a new chunk starts at the first value at or past
    the next multiple of ``per_chunk``, one multiple per value (a value that jumps several
    multiples ends a chunk at each of the values after it, one token each)."""
    values = np.asarray(values)
    out, start, current, scan = [], 0, 1, 0
    while True:  # the values rise: the next boundary is the first value past the threshold
        at = max(scan, int(np.searchsorted(values, current * per_chunk, side="left")))
        if at >= len(values):
            break
        out.append((start, at))
        start, current, scan = at, current + 1, at + 1
    out.append((start, len(values)))
    return out


def _video_times(grid: tuple[int, int, int], merge_size: int, temporal: np.ndarray) -> np.ndarray:
    """Each of a video's tokens' time (its temporal patch's ``temporal`` value), raster order."""
    _, h, w = grid
    return np.repeat(np.asarray(temporal), (h // merge_size) * (w // merge_size))


def order(
    kind: str, video_times: np.ndarray, audio_tokens: int, *, per_chunk: int | None = None
) -> list[tuple[bool, int, int]]:
    """The block's runs in token order: ``(is_video, start, end)`` over the video's tokens
    (``is_video``) or the track's, by the interleave rule ``kind`` (:data:`INTERLEAVES`;
    ``per_chunk`` for ``"chunks"``)."""
    audio_times = np.arange(audio_tokens)
    if kind == "chunks":
        video_chunks = chunks(video_times, per_chunk)
        audio_chunks = chunks(audio_times, per_chunk)
        runs = []
        for j in range(max(len(video_chunks), len(audio_chunks))):
            if j < len(video_chunks):
                runs.append((True, *video_chunks[j]))
            if j < len(audio_chunks):
                runs.append((False, *audio_chunks[j]))
        return [r for r in runs if r[2] > r[1]]
    if kind != "tokens":
        raise ValueError(f"no interleave rule {kind!r}; known: {', '.join(INTERLEAVES)}")
    # merged by time, a video token first on a tie: video token v precedes every audio token
    # a with time(v) <= a, so it goes after the first ceil(time(v)) audio tokens
    before = np.minimum(np.ceil(np.asarray(video_times, dtype=np.float64)), audio_tokens)
    runs, v, a = [], 0, 0
    n = len(video_times)
    while v < n or a < audio_tokens:
        if v < n and before[v] <= a:
            end = int(np.searchsorted(before, a, side="right"))
            runs.append((True, v, end))
            v = end
        else:
            end = int(before[v]) if v < n else audio_tokens
            runs.append((False, a, end))
            a = end
    return runs


def track_expansion(
    *,
    kind: str,
    grid: tuple[int, int, int],
    merge_size: int,
    second_per_grid: float,
    audio_tokens: int,
    per_second: float,
    seconds_per_chunk: float,
    video_token: str,
    audio_token: str,
    audio_bos: str,
    audio_eos: str,
) -> str:
    """What the processor writes in place of a video's one video token when its track is
    interleaved (``replace_video_with_audio_token``; before 5.25 the same text through
    ``replace_multimodal_special_tokens``), by its own ``per_second`` / ``seconds_per_chunk``:
    the times in float64, as the processor's numpy computes them."""
    temporal = np.arange(grid[0]) * float(second_per_grid) * per_second
    times = _video_times(grid, merge_size, temporal)
    per_chunk = int(per_second * seconds_per_chunk)
    pieces = [audio_bos]
    for is_video, start, end in order(kind, times, audio_tokens, per_chunk=per_chunk):
        pieces.append((video_token if is_video else audio_token) * (end - start))
    pieces.append(audio_eos)
    return "".join(pieces)


def block_positions(
    *,
    kind: str,
    grid: tuple[int, int, int],
    merge_size: int,
    temporal: np.ndarray,
    audio_tokens: int,
    start: int,
    per_chunk: int | None = None,
) -> tuple[np.ndarray, int]:
    """``[3, 4 + video tokens + audio_tokens]`` positions of a block (``vision_bos audio_bos
    ... audio_eos vision_eos``) that begins at position ``start``, as the thinker's
    ``get_rope_index`` gives them with ``use_audio_in_video=True``, and the position the text
    after it resumes at.

    ``temporal``: the model's temporal offset of each temporal patch
    (:meth:`~energon_packing.media.video_plan.VideoPlan.time_aligned` at the thinker config's
    ``position_id_per_seconds``); ``per_chunk``: ``int(position_id_per_seconds *
    seconds_per_chunk)`` of the thinker config (``"chunks"``). The two markers before open at
    ``start`` (Qwen2.5-Omni: both there; Qwen3-Omni: one after the other); the block's tokens
    get the model's positions in the model's own order, and the two markers after stand at the
    largest position of the last piece it placed + 1 (Qwen2.5-Omni: both; Qwen3-Omni: one
    after the other), where the text after them resumes.
    """
    t, h, w = grid
    gh, gw = h // merge_size, w // merge_size
    opening = 1 if kind == "chunks" else 2
    base = start + opening
    video = np.empty((3, t * gh * gw), dtype=np.int64)
    video[0] = base + np.repeat(np.asarray(temporal, dtype=np.int64), gh * gw)
    video[1] = base + np.tile(np.repeat(np.arange(gh), gw), t)
    video[2] = base + np.tile(np.arange(gw), t * gh)
    audio = base + np.broadcast_to(np.arange(audio_tokens), (3, audio_tokens))
    runs = order(kind, video[0] - base, audio_tokens, per_chunk=per_chunk)
    # the model appends the runs piece by piece (Qwen3-Omni one token at a time while both
    # kinds remain, then the rest of one kind whole: the last run); its last piece's largest
    # position + 1 is where the markers after the block stand
    pieces = [(video if is_video else audio)[:, s:e] for is_video, s, e in runs]
    resume = int(pieces[-1].max()) + 1
    if kind == "chunks":
        head = np.full((3, 2), start, dtype=np.int64)
        tail = np.full((3, 2), resume, dtype=np.int64)
        after = resume + 1
    else:
        head = np.broadcast_to(start + np.arange(2), (3, 2))
        tail = np.broadcast_to(resume + np.arange(2), (3, 2))
        after = resume + 2
    return np.concatenate([head, *pieces, tail], axis=1), after
