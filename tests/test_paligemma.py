"""PaliGemma and PaliGemma 2 (issue 33 item 3): a prefix-LM family. Its processor ships no
chat template; it takes the prompt as ``text`` and the answer as ``suffix``, and its model
reads the prompt (images, ``<bos>``, text, newline: ``token_type_ids`` 0) both ways and the
answer causally (:mod:`energon_packing.encoding.prefix_lm`).

Through the real Energon loader, conversations made as users make PaliGemma data (one user
turn with its images, one answer): ids and token types equal the processor's own
``text``/``suffix`` call on each conversation alone, pixels equal, and per-source logits of a
pack through ``to_hf`` equal each conversation alone (its own default positions, from 1), for
a Gemma (PaliGemma) and a Gemma 2 text model (PaliGemma 2: sliding layers whose window is
shorter than a prompt, soft-capping). Conversations PaliGemma cannot take (several turns, a
system turn, no image) are skipped ``template_error``, naming why. On the releases whose own
forward lets a pack's prompt blocks see each other (5.9-5.23), the family is refused, and the
leak is measured.
"""

from __future__ import annotations

import copy

import pytest
from helpers import decode_image, loader_batches, make_dataset

from energon_packing import PackingTaskEncoder
from energon_packing.schema import is_empty
from energon_packing.testing.synth import Conversation, conversations

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

CAPACITY = 512


def _one_turn(conversation: Conversation) -> Conversation:
    """The conversation as PaliGemma data: its first user turn (with all its images) and the
    answer to it; no system turn."""
    document = copy.deepcopy(conversation.document)
    messages = [m for m in document["messages"] if m["role"] != "system"][:2]
    return Conversation(
        key=conversation.key,
        document={**document, "messages": messages},
        images=conversation.images,
    )


SOURCE = list(conversations(24, seed=3))
ONE_TURN = [_one_turn(c) for c in SOURCE if c.images]
#: as they come: several turns, system turns, text only (skipped, named)
OTHERS = [
    c
    for c in SOURCE
    if (not c.images or len(c.document["messages"]) != 2) and len(str(c.document)) < 4000
][:6]
OTHERS = [Conversation(key=f"x{c.key}", document=c.document, images=c.images) for c in OTHERS]
BY_KEY = {c.key: c for c in ONE_TURN}


@pytest.fixture(scope="module")
def paligemma_dataset(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("paligemma"), [*ONE_TURN, *OTHERS], per_shard=12)


def _reference(processor, conversation: Conversation) -> dict:
    """The processor's own call: all images as ``<image>`` first, the user turn's text parts
    as the prompt, the answer as the suffix."""
    from test_families import hf_messages, images_in_order

    user, answer = hf_messages(conversation.document)
    prompt = "".join(p["text"] for p in user["content"] if p["type"] == "text")
    (text,) = [p["text"] for p in answer["content"] if p["type"] == "text"]
    pictures = [decode_image(d) for d in images_in_order(conversation)]
    return processor(
        text="<image>" * len(pictures) + prompt,
        images=pictures,
        suffix=text,
        return_tensors="pt",
    )


def _leaks() -> str | None:
    from energon_packing.encoding import hf_compat

    return hf_compat.broken_forward("paligemma")


@pytest.mark.energon
@pytest.mark.parametrize("built", ["paligemma", "paligemma2"])
def test_paligemma_through_its_processor_and_the_loader(paligemma_dataset, built):
    from energon_packing.hf import to_hf
    from energon_packing.testing import hf
    from energon_packing.testing.families import build

    if _leaks():
        pytest.skip(
            f"refused here: {_leaks()} (test_the_releases_whose_own_forward_leaks_are_refused)"
        )
    processor, model, _ = build(built)
    model.double()
    te = PackingTaskEncoder(max_input_seq_length=CAPACITY, processor=processor, pad_multiple=8)
    assert te.chat.family_name == "paligemma"
    sources = shared = padded = 0
    worst = 0.0
    for batch in loader_batches(paligemma_dataset, te, buffer=8):
        if is_empty(batch):  # a batch that carries skips only
            continue
        inputs = to_hf(batch, model=model)
        kw = {k: v for k, v in inputs.items() if k not in ("use_cache",)}
        assert "attention_mask" not in kw
        logits = hf.run(model, kw)
        cu, cu_padded = inputs.cu_seqlens.tolist(), inputs.cu_seqlens_padded.tolist()
        shared += len(inputs.source_ids) > 1
        pixels = []
        for k, key in enumerate(inputs.source_ids):
            reference = _reference(processor, BY_KEY[key])
            start, n = cu_padded[k], cu[k + 1] - cu[k]
            padded += cu_padded[k + 1] - start > n
            for name in ("input_ids", "token_type_ids"):
                got = kw[name][0, start : start + n]
                assert torch.equal(got, reference[name][0]), f"{built} {key}: {name}"
            # the pads after it are typed as its answer (as 0 they would join its prompt block)
            assert bool((kw["token_type_ids"][0, start + n : cu_padded[k + 1]] == 1).all())
            assert torch.equal(kw["position_ids"][0, start : start + n], torch.arange(1, n + 1))
            pixels.append(reference["pixel_values"])
            alone = {
                f: reference[f] for f in ("input_ids", "token_type_ids", "pixel_values", "labels")
            }
            alone["pixel_values"] = alone["pixel_values"].double()
            worst = max(
                worst, float((logits[start : start + n] - hf.run(model, alone)).abs().max())
            )
            sources += 1
        assert torch.equal(kw["pixel_values"].float(), torch.cat(pixels))
    assert sources == len(ONE_TURN), (sources, len(ONE_TURN), dict(te.stats.skipped))
    assert shared >= 1 and padded >= 1, (shared, padded)
    assert set(te.stats.skipped) == {"template_error"}
    assert te.stats.skipped["template_error"] == len(OTHERS)
    assert worst <= 1e-10, f"{built}: per-source logits differ by {worst:.2e}"


@pytest.mark.parametrize("built", ["paligemma", "paligemma2"])
def test_the_releases_whose_own_forward_leaks_are_refused(built):
    """The model's own padding-free path on two conversations end to end (positions from 1
    each, token types, no mask): exact where the family is accepted, off where it is refused
    (5.9-5.23: every prompt token in one block, and the block overlay ORed in after the
    packed-sequence mask), and there the task encoder and ``to_hf`` refuse it in one line."""
    from energon_packing.schema import Source, collate, layout
    from energon_packing.testing import hf
    from energon_packing.testing.families import build

    processor, model, _ = build(built)
    model.double()
    first, second = (_reference(processor, c) for c in ONE_TURN[:2])
    row = {
        name: torch.cat([first[name], second[name]], 1)
        for name in ("input_ids", "token_type_ids", "labels")
    }
    row["pixel_values"] = torch.cat([first["pixel_values"], second["pixel_values"]]).double()
    lengths = [first["input_ids"].shape[1], second["input_ids"].shape[1]]
    row["position_ids"] = torch.cat([torch.arange(1, n + 1) for n in lengths])[None]
    packed = hf.run(model, row)[lengths[0] :]
    alone = hf.run(model, {**second, "pixel_values": second["pixel_values"].double()})
    off = float((packed - alone).abs().max())
    leaks = _leaks()
    if not leaks:
        assert off <= 1e-10, f"{built}: the second conversation differs by {off:.2e}"
        PackingTaskEncoder(max_input_seq_length=CAPACITY, processor=processor)
        return
    assert off > 1e-3, f"{built}: refused here, yet its own packed path is exact ({off:.2e})"
    with pytest.raises(ValueError) as raised:
        PackingTaskEncoder(max_input_seq_length=CAPACITY, processor=processor)
    assert "prompt block" in str(raised.value) and "\n" not in str(raised.value)
    pack = layout(
        [
            Source(
                key="A",
                input_ids=first["input_ids"][0].numpy(),
                token_mask=first["token_type_ids"][0].float().numpy(),
            )
        ],
        width=CAPACITY,
        pad_multiple=8,
        pad_id=0,
    )
    with pytest.raises(ValueError, match="to_hf: model type 'paligemma': on transformers"):
        from energon_packing.hf import to_hf

        to_hf(collate([pack]), model=model)


def test_a_shipped_chat_template_does_not_replace_the_processors_layout():
    """A PaliGemma processor (or its tokenizer) that carries a chat template of its own, a
    Gemma-style one here: the layout is still the processor's ``text``/``suffix`` call (its
    images first, the prompt typed 0), and a system turn is still refused, naming why."""
    from helpers import conversation_sample

    from energon_packing.errors import Skip
    from energon_packing.testing.families import build

    if _leaks():
        pytest.skip(f"refused here: {_leaks()}")

    conversation = ONE_TURN[0]
    plain, _, _ = build("paligemma", model=False)
    shipped, _, _ = build("paligemma", model=False)
    gemma = (
        "{% for m in messages %}<start_of_turn>{{ m['role'] }}\n"
        "{% for p in m['content'] %}{% if p['type'] == 'image' %}<image>{% else %}"
        "{{ p['text'] }}{% endif %}{% endfor %}<end_of_turn>\n{% endfor %}"
    )
    shipped.chat_template = gemma
    shipped.tokenizer.chat_template = gemma
    encoded = []
    for processor in (plain, shipped):
        te = PackingTaskEncoder(max_input_seq_length=CAPACITY, processor=processor)
        sample = conversation_sample(conversation.key, conversation.document, conversation.images)
        encoded.append(te.encode_sample(sample))
    assert encoded[0].input_ids.tolist() == encoded[1].input_ids.tolist()
    assert encoded[0].prefix_length == encoded[1].prefix_length
    reference = _reference(plain, conversation)
    assert encoded[1].input_ids.tolist() == reference["input_ids"][0].tolist()
    assert encoded[1].prefix_length == int((reference["token_type_ids"][0] == 0).sum())
    system = {"role": "system", "content": "Be brief."}
    messages = [system, *conversation.document["messages"]]
    with pytest.raises(Skip, match="one user turn"):
        te.chat.encode(
            key="k",
            messages=messages,
            image_names=conversation.document["images"],
            images=conversation.images,
            loss_weight=1.0,
            config=te.config,
        )


def test_a_pack_without_the_answers_start_is_refused():
    """``sources`` given a PaliGemma conversation without its ``prefix_length`` (where its
    answer starts): an error naming it, never a pack whose prompt reads causally."""
    from energon_packing.testing.families import build

    if _leaks():
        pytest.skip(f"refused here: {_leaks()}")

    processor, _, _ = build("paligemma", model=False)
    te = PackingTaskEncoder(max_input_seq_length=CAPACITY, processor=processor)
    conversation = ONE_TURN[0]
    encoding = te.chat.encode(
        key=conversation.key,
        messages=conversation.document["messages"],
        image_names=conversation.document["images"],
        images=conversation.images,
        loss_weight=1.0,
        config=te.config,
    )
    item = {
        "key": conversation.key,
        "input_ids": encoding.input_ids,
        "token_mask": encoding.token_mask,
        "images": [
            conversation.images[conversation.document["images"][i]] for i in encoding.image_order
        ],
        "videos": [],
    }
    source = te.chat.source(config=te.config, **item, prefix_length=encoding.prefix_length)
    assert source.token_fields["token_type_ids"].tolist() == [0] * encoding.prefix_length + [1] * (
        len(encoding.input_ids) - encoding.prefix_length
    )
    with pytest.raises(ValueError, match="without the prefix_length"):
        te.chat.source(config=te.config, **item)
