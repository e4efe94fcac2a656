"""Conversation -> tokens and loss mask: exact outputs on tiny inputs, the overlong policies."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from energon_packing.config import PackingConfig
from energon_packing.encoding.builtin import encode
from energon_packing.encoding.chat import OverlongError, Skip


def png(width=56, height=56):
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (200, 30, 30)).save(buffer, format="PNG")
    return buffer.getvalue()


def run(tokenizer, messages, *, names=(), images=None, weight=1.0, **knobs):
    knobs.setdefault("max_input_seq_length", 4096)
    return encode(
        key="k",
        messages=messages,
        image_names=list(names),
        images=images if images is not None else {n: png() for n in names},
        loss_weight=weight,
        tokenizer=tokenizer,
        config=PackingConfig(**knobs),
    )


def test_exact_tokens_and_mask(tokenizer):
    t, s = tokenizer, tokenizer.special
    enc = run(
        tokenizer,
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "<image>\nWhat is red?"},
            {"role": "assistant", "content": "The square."},
        ],
        names=["img0.png"],
    )
    # a 56x56 image: grid (1, 4, 4) -> 16 patches -> 4 image-pad tokens
    system = [s.im_start, *t.encode("system\n"), *t.encode("Be brief."), s.im_end, *t.encode("\n")]
    user = [
        s.im_start,
        *t.encode("user\n"),
        s.vision_start,
        *[s.image_pad] * 4,
        s.vision_end,
        *t.encode("\nWhat is red?"),
        s.im_end,
        *t.encode("\n"),
    ]
    head = [s.im_start, *t.encode("assistant\n")]
    answer = [*t.encode("The square."), s.im_end]
    assert enc.input_ids == system + user + head + answer + t.encode("\n")
    trained = [0.0] * (len(system) + len(user) + len(head)) + [1.0] * len(answer) + [0.0]
    assert enc.token_mask == trained
    assert enc.grids == [(1, 4, 4)] and enc.image_order == [0]


def test_both_content_styles_encode_identically(tokenizer):
    llava = [
        {"role": "user", "content": "<image>\n<image>\nCompare them."},
        {"role": "assistant", "content": "Both are red."},
    ]
    hf = [
        {
            "role": "user",
            "content": [
                {"type": "image", "image": "a.png"},
                {"type": "text", "text": "\n"},
                {"type": "image", "image": "b.png"},
                {"type": "text", "text": "\nCompare them."},
            ],
        },
        {"role": "assistant", "content": [{"type": "text", "text": "Both are red."}]},
    ]
    images = {"a.png": png(56, 56), "b.png": png(112, 56)}
    a = run(tokenizer, llava, names=["a.png", "b.png"], images=images)
    b = run(tokenizer, hf, names=["a.png", "b.png"], images=images)
    assert a.input_ids == b.input_ids and a.token_mask == b.token_mask
    assert a.grids == [(1, 4, 4), (1, 4, 8)]


def test_named_parts_may_reorder_images(tokenizer):
    messages = [
        {
            "role": "user",
            "content": [{"type": "image", "image": "b.png"}, {"type": "image", "image": "a.png"}],
        },
        {"role": "assistant", "content": "ok"},
    ]
    enc = run(
        tokenizer,
        messages,
        names=["a.png", "b.png"],
        images={"a.png": png(56, 56), "b.png": png(112, 56)},
    )
    assert enc.image_order == [1, 0] and enc.grids == [(1, 4, 8), (1, 4, 4)]


def test_train_on_last_assistant_and_loss_weight(tokenizer):
    messages = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": "Bye"},
        {"role": "assistant", "content": "Goodbye"},
    ]
    every = run(tokenizer, messages, weight=0.5)
    last = run(tokenizer, messages, weight=0.5, train_on="last_assistant")
    assert every.input_ids == last.input_ids
    hello = len(tokenizer.encode("Hello")) + 1  # + <|im_end|>
    goodbye = len(tokenizer.encode("Goodbye")) + 1
    assert sum(w > 0 for w in every.token_mask) == hello + goodbye
    assert sum(w > 0 for w in last.token_mask) == goodbye
    assert set(every.token_mask) == {0.0, 0.5}


@pytest.mark.parametrize(
    "messages, names, images, reason",
    [
        ([], [], {}, "empty_conversation"),
        ([{"role": "robot", "content": "x"}], [], {}, "unknown_role"),
        ([{"role": "user", "content": "x"}], [], {}, "no_assistant_turn"),
        (
            [{"role": "user", "content": "x"}, {"role": "assistant", "content": "  "}],
            [],
            {},
            "empty_assistant",
        ),
        ([{"role": "user"}], [], {}, "malformed_message"),
        ([{"role": "user", "content": 3}], [], {}, "malformed_message"),
        ([{"role": "user", "content": [{"type": "input_audio"}]}], [], {}, "unsupported_media"),
        ([{"role": "user", "content": [{"type": "audio"}]}], [], {}, "placeholder_mismatch"),
        ([{"role": "user", "content": [{"type": "table"}]}], [], {}, "malformed_message"),
        (
            [{"role": "user", "content": "<image><image>"}, {"role": "assistant", "content": "a"}],
            ["a.png"],
            None,
            "placeholder_mismatch",
        ),
        (
            [{"role": "user", "content": "no image here"}, {"role": "assistant", "content": "a"}],
            ["a.png"],
            None,
            "placeholder_mismatch",
        ),
        (
            [{"role": "user", "content": "<image>"}, {"role": "assistant", "content": "a"}],
            ["a.png"],
            {},
            "missing_image",
        ),
        (
            [
                {"role": "user", "content": [{"type": "image", "image": "zz.png"}]},
                {"role": "assistant", "content": "a"},
            ],
            ["a.png"],
            None,
            "missing_image",
        ),
        (  # listed twice, shown once (tests/test_media_twice.py: shown twice is packed)
            [{"role": "user", "content": "<image>"}, {"role": "assistant", "content": "a"}],
            ["a.png", "a.png"],
            None,
            "placeholder_mismatch",
        ),
        (
            [{"role": "user", "content": "<image>"}, {"role": "assistant", "content": "a"}],
            ["a.png"],
            {"a.png": b""},
            "corrupt_image",
        ),
    ],
)
def test_skips_name_a_reason(tokenizer, messages, names, images, reason):
    with pytest.raises(Skip) as info:
        run(tokenizer, messages, names=names, images=images)
    assert info.value.reason == reason


LONG = [
    {"role": "user", "content": "<image>\nDescribe it."},
    {"role": "assistant", "content": "A red square. " * 40},
]


def test_overlong_drop_truncate_error(tokenizer):
    full = run(tokenizer, LONG, names=["a.png"])
    capacity = 64
    assert full.length > capacity
    with pytest.raises(Skip) as info:
        run(tokenizer, LONG, names=["a.png"], max_input_seq_length=capacity)
    assert (
        info.value.reason == "overlong"
        and f"> max_input_seq_length={capacity}" in info.value.detail
    )
    with pytest.raises(OverlongError, match=r"sample 'k': \d+ tokens .*overlong='truncate'"):
        run(tokenizer, LONG, names=["a.png"], max_input_seq_length=capacity, overlong="error")
    cut = run(tokenizer, LONG, names=["a.png"], max_input_seq_length=capacity, overlong="truncate")
    assert cut.input_ids == full.input_ids[:capacity]
    assert cut.truncated == full.length - capacity
    assert cut.input_ids.count(tokenizer.special.image_pad) == 4  # images are never cut
    assert any(w > 0 for w in cut.token_mask)


def test_truncate_never_cuts_an_image(tokenizer):
    big = {"a.png": png(224, 224)}  # 8x8 merged = 64 image tokens
    with pytest.raises(Skip) as info:
        run(
            tokenizer,
            LONG,
            names=["a.png"],
            images=big,
            max_input_seq_length=48,
            overlong="truncate",
        )
    assert info.value.reason == "overlong_media"


def test_truncate_keeps_a_trained_token_or_drops(tokenizer):
    messages = [
        {"role": "user", "content": "word " * 80},
        {"role": "assistant", "content": "answer"},
    ]
    with pytest.raises(Skip) as info:
        run(tokenizer, messages, max_input_seq_length=32, overlong="truncate")
    assert info.value.reason == "overlong_no_trained_token"
