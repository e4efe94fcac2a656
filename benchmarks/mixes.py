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
