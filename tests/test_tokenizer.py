"""ChatTokenizer over every accepted form: bundled, path, tokenizers object, HF tokenizer/processor."""

from __future__ import annotations

import pickle
import shutil
import types

import pytest
from tokenizers import Tokenizer

from energon_packing.encoding.tokenizer import BUNDLED_TOKENIZER, SPECIAL_TOKENS, ChatTokenizer

TEXT = "Weigh the flour instead of measuring it by the cup. Ünïcödé too."


def test_bundled_tokenizer_has_the_chat_and_vision_tokens():
    tokenizer = ChatTokenizer("bundled")
    ids = [tokenizer.id_of(token) for token in SPECIAL_TOKENS]
    assert len(set(ids)) == len(SPECIAL_TOKENS)
    assert tokenizer.special.pad == tokenizer.id_of("<|endoftext|>")
    assert tokenizer.decode(tokenizer.encode(TEXT)) == TEXT  # byte-level: any text round-trips
    assert pickle.loads(pickle.dumps(tokenizer)).encode(TEXT) == tokenizer.encode(TEXT)


def test_paths_and_objects_encode_alike(tmp_path):
    shutil.copy(BUNDLED_TOKENIZER, tmp_path / "tokenizer.json")
    reference = ChatTokenizer("bundled").encode(TEXT)
    for source in (
        tmp_path / "tokenizer.json",
        tmp_path,
        str(tmp_path),
        Tokenizer.from_file(str(BUNDLED_TOKENIZER)),
    ):
        tokenizer = ChatTokenizer(source)
        assert tokenizer.encode(TEXT) == reference
        assert tokenizer.special == ChatTokenizer("bundled").special


def test_hugging_face_tokenizer_and_processor():
    transformers = pytest.importorskip("transformers")
    hf = transformers.PreTrainedTokenizerFast(tokenizer_file=str(BUNDLED_TOKENIZER))
    reference = ChatTokenizer("bundled")
    for source in (hf, types.SimpleNamespace(tokenizer=hf)):  # a processor wraps its tokenizer
        tokenizer = ChatTokenizer(source)
        assert tokenizer.encode(TEXT) == reference.encode(TEXT)
        assert tokenizer.special == reference.special


def test_errors_say_what_is_missing(tmp_path):
    with pytest.raises(ValueError, match="does not exist \\(no downloads are made\\)"):
        ChatTokenizer(tmp_path / "nope")
    bare = Tokenizer.from_file(str(BUNDLED_TOKENIZER))
    vocab = {t: i for t, i in bare.get_vocab().items() if t != "<|image_pad|>"}
    from tokenizers import models

    stripped = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<|endoftext|>"))
    with pytest.raises(ValueError, match="has no token '<\\|image_pad\\|>'.*Qwen2-VL"):
        ChatTokenizer(stripped)
    with pytest.raises(TypeError, match="tokenizer must be 'bundled', a path"):
        ChatTokenizer(42)


def test_a_tokenizer_is_required_and_the_bundled_one_is_named():
    """No silent default: the demo tokenizer is chosen by name, and the error says what it is."""
    from energon_packing import PackingTaskEncoder

    with pytest.raises(
        ValueError, match="tokenizer is required.*'bundled' is the 1,634-token demo"
    ):
        PackingTaskEncoder(max_input_seq_length=64)
    te = PackingTaskEncoder(max_input_seq_length=64, tokenizer="bundled")
    assert te.tokenizer.name == "bundled" and te.tokenizer.vocab_size == 1634


def test_fingerprints_name_the_tokenizer_and_the_builtin_layout(tmp_path):
    """The same tokenizer by any route has one fingerprint; another tokenizer, other vision
    settings or mRoPE give another (what a restore compares)."""
    from energon_packing.encoding.builtin import BuiltinChat
    from energon_packing.encoding.vision import VisionConfig

    shutil.copy(BUNDLED_TOKENIZER, tmp_path / "tokenizer.json")
    bundled = ChatTokenizer("bundled").fingerprint
    assert len(bundled) == 16
    assert ChatTokenizer(tmp_path / "tokenizer.json").fingerprint == bundled
    assert ChatTokenizer(Tokenizer.from_file(str(BUNDLED_TOKENIZER))).fingerprint == bundled
    assert pickle.loads(pickle.dumps(ChatTokenizer("bundled"))).fingerprint == bundled
    other = Tokenizer.from_file(str(BUNDLED_TOKENIZER))
    other.add_special_tokens(["<|extra|>"])
    assert ChatTokenizer(other).fingerprint != bundled

    def chat(**knobs):
        knobs.setdefault("mrope", False)
        return BuiltinChat(ChatTokenizer("bundled"), **knobs).fingerprint

    plain = chat(vision=VisionConfig())
    assert chat(vision=VisionConfig()) == plain
    assert chat(vision=VisionConfig(max_pixels=112 * 112)) != plain
    assert chat(vision=VisionConfig(), mrope=True) != plain
