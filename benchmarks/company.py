"""Packs of a speech mix for a family whose clips keep company only with text
(Phi-4-multimodal, ``AudioRule.alone``): the rule of release 0.5 (a conversation with clips
costed as the whole capacity, alone in its pack) against the company rule
(``energon_packing.packing.Company``: text conversations fill a clip conversation's pack),
side by side in one run, with the lower bound under the rule.

The mix (seeded): a share of conversations with one clip (2-30 s, Phi-4's 12.5 audio tokens a
second, plus a 40-400 token exchange), 20 % with images (576-2,304 image tokens plus text,
``ANY``), the rest text of the ``chat`` mix (UltraChat / ShareGPT lengths, ``PLAIN``). Default
algorithm, carry on, buffer 256.

    python benchmarks/company.py [--samples 20000] [--shares 0.1 0.3 0.6 0.9]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mixes import generate

from energon_packing.packing import Company, lower_bound, pack_stream

TOKENS_PER_SECOND = 12.5  # Phi-4-multimodal: 100 mel frames a second, compression rate 8
BUFFER = 256


def mix(n: int, share: float, capacity: int, seed: int) -> tuple[list[int], list[Company]]:
    rng = np.random.default_rng(seed)
    text = generate("chat", n, capacity, seed=seed)
    kinds = rng.choice(3, size=n, p=[share, 0.2 * (1 - share), 0.8 * (1 - share)])
    lengths, company = [], []
    for i, kind in enumerate(kinds):
        if kind == 0:
            seconds = rng.uniform(2, 30)
            length = int(np.ceil(seconds * TOKENS_PER_SECOND)) + int(rng.integers(40, 400))
            company.append(Company.APART)
        elif kind == 1:
            length = int(576 * rng.integers(1, 5)) + int(rng.integers(40, 400))
            company.append(Company.ANY)
        else:
            length = text[i]
            company.append(Company.PLAIN)
        lengths.append(min(capacity, -(-length // 8) * 8))
    return lengths, company


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=20_000)
    parser.add_argument("--shares", type=float, nargs="+", default=[0.1, 0.3, 0.6, 0.9])
    parser.add_argument("--capacities", type=int, nargs="+", default=[4096, 8192])
    args = parser.parse_args()
    print(f"{'C':>6} {'clips':>6} {'bound':>7} {'alone (0.5)':>12} {'company':>9} "
          f"{'alone vs bound':>15} {'company vs bound':>17}")  # fmt: skip
    for capacity in args.capacities:
        for share in args.shares:
            lengths, company = mix(args.samples, share, capacity, seed=0)
            bound = lower_bound(lengths, capacity, company=company)
            costed = [capacity if c is Company.APART else n for n, c in zip(lengths, company)]
            alone = sum(1 for _ in pack_stream(costed, capacity, buffer_size=BUFFER, carry=True))
            kept = sum(
                1
                for _ in pack_stream(
                    lengths, capacity, buffer_size=BUFFER, carry=True, company=company
                )
            )
            print(
                f"{capacity:>6} {share:>6.0%} {bound:>7,} {alone:>12,} {kept:>9,} "
                f"{100 * (alone / bound - 1):>+14.2f}% {100 * (kept / bound - 1):>+16.2f}%"
            )


if __name__ == "__main__":
    main()
