"""The few things encoding needs from a tokenizer, over whatever the user has.

Accepted: ``"bundled"`` (a 1,634-token byte-level BPE, ``assets/tokenizer.json``, trained by
``tools/train_tokenizer.py`` on the text :mod:`energon_packing.testing.synth` generates: for the
demo, the sample data and the tests, not for training a real model), a ``tokenizers.Tokenizer``,
any Hugging Face tokenizer or processor object (a processor's ``.tokenizer`` is used), or a local
path (a ``tokenizer.json`` file or a directory holding one; with ``transformers`` installed a
directory is loaded by ``AutoTokenizer`` with ``local_files_only=True``). Nothing is ever
downloaded.

Special tokens carry Qwen2-VL's names by default (ChatML plus the vision tokens).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
VISION_START = "<|vision_start|>"
VISION_END = "<|vision_end|>"
IMAGE_PAD = "<|image_pad|>"
SPECIAL_TOKENS = (PAD_TOKEN, IM_START, IM_END, VISION_START, VISION_END, IMAGE_PAD)
#: Needed only for conversations with videos (a tokenizer without it takes none).
VIDEO_PAD = "<|video_pad|>"

#: ``tokenizer="bundled"``: the demo / test tokenizer shipped with the package.
BUNDLED = "bundled"
BUNDLED_TOKENIZER = Path(__file__).resolve().parents[1] / "assets" / "tokenizer.json"

__all__ = ["BUNDLED", "SPECIAL_TOKENS", "ChatTokenizer", "SpecialIds"]


@dataclass(kw_only=True, slots=True, frozen=True)
class SpecialIds:
    pad: int
    im_start: int
    im_end: int
    vision_start: int
    vision_end: int
    image_pad: int
    #: None when the tokenizer has no ``<|video_pad|>``: its conversations take no videos
    video_pad: int | None = None


class ChatTokenizer:
    """Text to ids without added special tokens, plus the ids of the chat and vision tokens.

    Conversation text is text: :meth:`encode` never returns a special token's id, whatever the
    text spells (``"<|im_end|>"`` in a reply is seven plain tokens, not an end of turn); only the
    chat layout inserts special ids. :meth:`find_special` tells whether a text spells one.

    Args:
        tokenizer: See the module docstring.
        pad_token: Token used for padding when the tokenizer declares no pad token.
    """

    def __init__(self, tokenizer: Any, *, pad_token: str = PAD_TOKEN):
        self.name, self._inner = _resolve(tokenizer)
        self._is_hf = not _is_tokenizers_object(self._inner)
        self._setup_text()
        self._fixed: dict[str, tuple[int, ...]] = {}
        pad = getattr(self._inner, "pad_token_id", None) if self._is_hf else None
        self.special = SpecialIds(
            pad=pad if isinstance(pad, int) else self.id_of(pad_token),
            im_start=self.id_of(IM_START),
            im_end=self.id_of(IM_END),
            vision_start=self.id_of(VISION_START),
            vision_end=self.id_of(VISION_END),
            image_pad=self.id_of(IMAGE_PAD),
            video_pad=self._find(VIDEO_PAD),
        )

    def __repr__(self) -> str:
        return f"ChatTokenizer({self.name})"

    @property
    def fingerprint(self) -> str:
        """A digest of the tokenizer itself (its serialized model, vocabulary, added tokens and
        normalization), equal across processes for equal tokenizers; computed once."""
        found = getattr(self, "_fingerprint", None)
        if found is None:
            inner = self._inner
            backend = getattr(inner, "backend_tokenizer", None) if self._is_hf else inner
            if backend is not None:
                blob = backend.to_str()
            else:  # a slow Hugging Face tokenizer: its vocabulary and class
                vocab = sorted(inner.get_vocab().items())
                blob = json.dumps([type(inner).__name__, vocab], ensure_ascii=False)
            found = self._fingerprint = hashlib.sha256(blob.encode()).hexdigest()[:16]
        return found

    @property
    def vocab_size(self) -> int:
        if self._is_hf:
            return len(self._inner)
        return self._inner.get_vocab_size()

    def _setup_text(self) -> None:
        """The special tokens' strings and ids, and an encoder that spells them as text."""
        if self._is_hf:
            added = self._inner.added_tokens_decoder
            self._text = self._inner
        else:
            added = self._inner.get_added_tokens_decoder()
            from tokenizers import Tokenizer

            self._text = Tokenizer.from_str(self._inner.to_str())  # the user's object untouched
            self._text.encode_special_tokens = True
        specials = [token.content for token in added.values() if token.special]
        ordered = sorted(specials, key=len, reverse=True)  # longest first: no prefix wins early
        self._special_re = re.compile("|".join(map(re.escape, ordered))) if ordered else None

    def encode(self, text: str) -> list[int]:
        """Ids of ``text`` as plain text: special tokens it spells are split, never matched."""
        if not text:
            return []
        if self._is_hf:
            ids = self._text.encode(text, add_special_tokens=False, split_special_tokens=True)
        else:
            ids = self._text.encode(text, add_special_tokens=False).ids
        return list(ids)

    def encode_fixed(self, text: str) -> tuple[int, ...]:
        """:meth:`encode` of a string the chat layout repeats in every conversation (role
        headers, the newline after a turn), tokenized once."""
        ids = self._fixed.get(text)
        if ids is None:
            ids = self._fixed[text] = tuple(self.encode(text))
        return ids

    def find_special(self, text: str) -> str | None:
        """The first special token ``text`` spells, or None."""
        found = self._special_re.search(text) if self._special_re is not None else None
        return found.group() if found else None

    def decode(self, ids: list[int]) -> str:
        if self._is_hf:
            return self._inner.decode(ids)
        return self._inner.decode(ids, skip_special_tokens=False)

    def _find(self, token: str) -> int | None:
        if self._is_hf:
            return self._inner.get_vocab().get(token)
        return self._inner.token_to_id(token)

    def id_of(self, token: str) -> int:
        found = self._find(token)
        if found is None:
            raise ValueError(
                f"tokenizer {self.name} has no token {token!r}; the chat template needs "
                f"{', '.join(SPECIAL_TOKENS[1:])} (Qwen2-VL's names): add them as special tokens "
                f"or pass a Qwen2-VL tokenizer"
            )
        return found

    def __getstate__(self) -> dict:
        return {
            "name": self.name,
            "inner": self._inner,
            "is_hf": self._is_hf,
            "special": self.special,
        }

    def __setstate__(self, state: dict) -> None:
        self.name, self._inner = state["name"], state["inner"]
        self._is_hf, self.special = state["is_hf"], state["special"]
        self._setup_text()


def _is_tokenizers_object(obj: Any) -> bool:
    return type(obj).__module__.split(".")[0] == "tokenizers"


def _resolve(tokenizer: Any) -> tuple[str, Any]:
    from tokenizers import Tokenizer

    if tokenizer is None:
        raise ValueError(
            "tokenizer is required: a Hugging Face tokenizer or processor, a tokenizers.Tokenizer "
            "or a local path (nothing is downloaded); tokenizer='bundled' is the 1,634-token demo "
            "tokenizer of the sample data and the tests"
        )
    if isinstance(tokenizer, str) and tokenizer == BUNDLED:
        return BUNDLED, Tokenizer.from_file(str(BUNDLED_TOKENIZER))
    if isinstance(tokenizer, (str, os.PathLike)):
        path = Path(tokenizer)
        if path.is_file():
            return str(path), Tokenizer.from_file(str(path))
        if not path.is_dir():
            raise ValueError(f"tokenizer path {str(path)!r} does not exist (no downloads are made)")
        try:
            from transformers import AutoTokenizer
        except ImportError:
            if not (path / "tokenizer.json").is_file():
                raise ValueError(
                    f"{path} has no tokenizer.json; install transformers to load other formats"
                ) from None
            return str(path), Tokenizer.from_file(str(path / "tokenizer.json"))
        return str(path), AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    inner = getattr(tokenizer, "tokenizer", None)  # a processor wraps its tokenizer
    if inner is not None and not _is_tokenizers_object(tokenizer):
        tokenizer = inner
    if _is_tokenizers_object(tokenizer) or hasattr(tokenizer, "get_vocab"):
        return type(tokenizer).__name__, tokenizer
    raise TypeError(
        f"tokenizer must be 'bundled', a path, a tokenizers.Tokenizer or a Hugging Face "
        f"tokenizer/processor, got {type(tokenizer).__name__}"
    )
