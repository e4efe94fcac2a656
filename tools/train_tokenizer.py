"""Trains the bundled byte-level BPE tokenizer (energon_packing/assets/tokenizer.json).

    python tools/train_tokenizer.py

Text: every turn of 20,000 conversations from :mod:`energon_packing.testing.synth` (text we generate
and own). Special tokens: ChatML and the Qwen2-VL vision tokens, with Qwen2-VL's names, so
encoder code written against this tokenizer runs unchanged with a real Qwen2-VL tokenizer.
``<|video_pad|>`` is added after training, as the last id (1633): the id the Qwen processors
of :mod:`energon_packing.testing.families` gave it before the bundle held it.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

from energon_packing.encoding.tokenizer import SPECIAL_TOKENS, VIDEO_PAD
from energon_packing.testing.synth import corpus

VOCAB_SIZE = 4096
OUT = Path(__file__).resolve().parents[1] / "energon_packing" / "assets" / "tokenizer.json"


def main() -> None:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus(20000, seed=1234), trainer)
    tokenizer.add_special_tokens([AddedToken(VIDEO_PAD, special=True, normalized=False)])
    OUT.parent.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(OUT))
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes, vocab {tokenizer.get_vocab_size()})")


if __name__ == "__main__":
    main()
