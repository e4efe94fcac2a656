"""The four length mixes the benchmarks measure on (LLaVA-like VLM, chat, long tail, bimodal),
generated from seeds.

Lengths are token counts after padding to ``pad_multiple`` (8 here), clipped to ``[8, C]``.
"""

from __future__ import annotations

import numpy as np

MIXES = ("vlm", "chat", "longtail", "bimodal")
PAD_MULTIPLE = 8
IMAGE_TOKENS = 576


def _lognormal(rng: np.random.Generator, median: float, sigma: float, n: int) -> np.ndarray:
    return rng.lognormal(np.log(median), sigma, n)


def _mixture(rng: np.random.Generator, n: int, parts: list[tuple[float, np.ndarray]]) -> np.ndarray:
    """Picks each sample from one component, by weight."""
    weights = np.array([w for w, _ in parts])
    choice = rng.choice(len(parts), size=n, p=weights / weights.sum())
    out = np.empty(n)
    for k, (_, values) in enumerate(parts):
        out[choice == k] = values[choice == k]
    return out


def generate(mix: str, n: int, capacity: int, *, seed: int) -> list[int]:
    """``n`` lengths of ``mix``, reproducible from ``seed``."""
    rng = np.random.default_rng([seed, MIXES.index(mix)])
    if mix == "vlm":
        # LLaVA-1.5-665K-like: 94 % one image (576 tokens) + text, 6 % text-only chat.
        text = _mixture(
            rng,
            n,
            [
                (0.40, _lognormal(rng, 45, 0.6, n)),
                (0.35, _lognormal(rng, 120, 0.8, n)),
                (0.25, _lognormal(rng, 330, 0.9, n)),
            ],
        )
        raw = _mixture(rng, n, [(0.94, IMAGE_TOKENS + text), (0.06, _lognormal(rng, 650, 1.0, n))])
    elif mix == "chat":
        # UltraChat-like (mean ~1,470) and ShareGPT-like (median 550, sigma 1.1).
        raw = _mixture(
            rng,
            n,
            [(0.6, _lognormal(rng, 1230, 0.6, n)), (0.4, _lognormal(rng, 550, 1.1, n))],
        )
    elif mix == "longtail":
        raw = _lognormal(rng, 256, 1.4, n)
    elif mix == "bimodal":
        raw = _mixture(
            rng,
            n,
            [(0.8, _lognormal(rng, 120, 0.7, n)), (0.2, _lognormal(rng, 2800, 0.5, n))],
        )
    else:
        raise ValueError(f"unknown mix {mix!r}; valid choices: {', '.join(MIXES)}")
    padded = np.ceil(np.clip(raw, 8, capacity) / PAD_MULTIPLE) * PAD_MULTIPLE
    return [int(v) for v in np.minimum(padded, capacity)]


# ---- conversations with media: (length, grids) ------------------------------------------------

#: The media mixes: image-heavy (LLaVA-OneVision-like: most conversations hold 1-4 images at
#: their own resolution), video (LLaVA-Video-like clips at 2 fps beside image and text ones) and
#: text (the long-tail lengths, no media).
MEDIA_MIXES = ("images", "video", "text")
PATCH, MERGE = 14, 2
#: Qwen2-VL's image processor as commonly configured (qwen-vl-utils): 4..1280 tokens per image
MIN_PIXELS, MAX_PIXELS = 4 * 28 * 28, 1280 * 28 * 28
#: frames per video token row: temporal_patch_size
TEMPORAL = 2


def smart_grid(height: float, width: float, *, max_pixels: int = MAX_PIXELS) -> tuple[int, int]:
    """Qwen2-VL's ``smart_resize`` of an image of this size, as a grid ``(h, w)`` in patches."""
    factor = PATCH * MERGE
    h = max(factor, round(height / factor) * factor)
    w = max(factor, round(width / factor) * factor)
    if h * w > max_pixels:
        beta = np.sqrt(height * width / max_pixels)
        h = max(factor, int(np.floor(height / beta / factor)) * factor)
        w = max(factor, int(np.floor(width / beta / factor)) * factor)
    elif h * w < MIN_PIXELS:
        beta = np.sqrt(MIN_PIXELS / (height * width))
        h = int(np.ceil(height * beta / factor)) * factor
        w = int(np.ceil(width * beta / factor)) * factor
    return h // PATCH, w // PATCH


def _image_grids(rng: np.random.Generator, count: int) -> list[tuple[int, int, int]]:
    grids = []
    for _ in range(count):
        side = float(np.clip(rng.lognormal(np.log(700), 0.6), 64, 4096))
        aspect = float(np.exp(rng.normal(0, 0.35)))
        h, w = smart_grid(side / np.sqrt(aspect), side * np.sqrt(aspect))
        grids.append((1, h, w))
    return grids


def _video_grid(rng: np.random.Generator, budget: int) -> tuple[int, int, int] | None:
    """A clip sampled at 2 fps (<= 768 frames), its frames shrunk so it fits ``budget``
    tokens (qwen-vl-utils' total-pixel rule), or None when not even 4 frames fit."""
    seconds = float(np.clip(rng.lognormal(np.log(40), 0.9), 2, 600))
    frames = min(768, max(TEMPORAL, int(seconds * 2) // TEMPORAL * TEMPORAL))
    height = float(rng.choice([360, 480, 720, 1080]))
    width = height * float(rng.choice([4 / 3, 16 / 9]))
    per_frame = min(768 * 28 * 28, 2 * budget * 28 * 28 // max(frames, 1))
    while frames > TEMPORAL and per_frame < MIN_PIXELS:
        frames -= TEMPORAL
        per_frame = min(768 * 28 * 28, 2 * budget * 28 * 28 // frames)
    if per_frame < MIN_PIXELS:
        return None
    h, w = smart_grid(height, width, max_pixels=per_frame)
    grid = (frames // TEMPORAL, h, w)
    return grid if grid[0] * h * w // MERGE**2 <= budget else None


def _tokens(grid: tuple[int, int, int]) -> int:
    t, h, w = grid
    return t * h * w // MERGE**2 + 2  # the pads and <|vision_start|> <|vision_end|>


def conversations(
    mix: str, n: int, capacity: int, *, seed: int
) -> list[tuple[int, tuple[tuple[int, int, int], ...]]]:
    """``n`` conversations of ``mix`` as ``(length, grids)``: padded token length (<= C) and
    each image's / video's grid ``(t, h, w)`` in patches. Media are dropped from a
    conversation until it fits C (what a dataset curated for C holds)."""
    if mix == "text":
        return [(length, ()) for length in generate("longtail", n, capacity, seed=seed)]
    if mix not in MEDIA_MIXES:
        raise ValueError(f"unknown mix {mix!r}; valid choices: {', '.join(MEDIA_MIXES)}")
    rng = np.random.default_rng([seed, 100 + MEDIA_MIXES.index(mix)])
    out = []
    for _ in range(n):
        text = int(np.clip(rng.lognormal(np.log(160), 1.0), 16, capacity // 4))
        grids: list[tuple[int, int, int]] = []
        if mix == "video" and rng.random() < 0.7:
            grid = _video_grid(rng, int(rng.uniform(0.1, 0.9) * capacity) - text)
            grids = [grid] if grid else []
        else:
            count = int(rng.choice([0, 1, 1, 1, 1, 2, 2, 3, 4, 6]))
            grids = _image_grids(rng, count)
        while grids and text + sum(_tokens(g) for g in grids) > capacity:
            grids.pop()
        length = text + sum(_tokens(g) for g in grids)
        padded = min(capacity, -(-length // PAD_MULTIPLE) * PAD_MULTIPLE)
        out.append((padded, tuple(grids)))
    return out
