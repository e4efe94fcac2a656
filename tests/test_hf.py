"""Loader packs through a Hugging Face model's own forward: ``model(**to_hf(batch, model=model))``.

The proof runs the real Energon loader over generated shards with each family's own processor
(:mod:`energon_packing.testing.families`), passes every pack through :func:`to_hf` and the
family's tiny random-init model as it is (no mask built by the test), and compares each
conversation's logits with the processor's output for that conversation alone; the model's
mean loss times its label count equals the sum of the per-conversation losses. The input forms
that came before (3-row positions, the default ``use_cache``, Gemma 3 without its mask mapping)
give other logits, so the proof can fail. Flash-attention-2 cannot run on CPU: its boundaries
are checked against ``transformers``' own derivation, and its whole integration
(``_flash_attention_forward``) runs with a reference varlen kernel in place of the CUDA one.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from helpers import conversation_sample, decode_image, loader_batches, make_dataset

from energon_packing import PackContractError, PackingTaskEncoder
from energon_packing.encoding import hf_compat
from energon_packing.hf import IGNORE_INDEX, HFInputs, gemma3_mask_mapping, text_positions, to_hf
from energon_packing.hf.masks import MaskMapping
from energon_packing.schema import BOOKKEEPING_KEYS, Source, collate, empty_batch, layout
from energon_packing.testing.synth import conversations
from energon_packing.trainer import check_model_inputs

transformers = pytest.importorskip("transformers")

from test_families import _processor_call, images_in_order  # noqa: E402

from energon_packing.testing.families import FAMILIES, build  # noqa: E402

CAPACITY = 1024
CONVERSATIONS = list(conversations(8, seed=5))
BY_KEY = {c.key: c for c in CONVERSATIONS}
#: the default suite runs these; the rest of the matrix is slow
FAST = {("qwen2_vl", "sdpa")}


# ---- the mapping itself, on hand-made packs -----------------------------------------------------


def _batch(mrope: bool = False, packs: int = 1) -> dict:
    """The contract's worked example: A = 5 tokens, B = 10 (B at half weight), pad 4, width 36."""

    def source(key, n, first, weight):
        positions = np.tile(np.arange(n) + 100, (3, 1)) if mrope else None
        mask = np.r_[np.zeros(2), np.full(n - 2, weight)].astype(np.float32)
        return Source(
            key=key, input_ids=np.arange(first, first + n), token_mask=mask, positions=positions
        )

    pack = layout(
        [source("A", 5, 10, 1.0), source("B", 10, 20, 0.5)], width=36, pad_multiple=4, pad_id=0
    )
    return collate([pack] * packs)


def test_the_mapping_of_the_worked_example():
    batch = _batch()
    kw = to_hf(batch)
    assert isinstance(kw, HFInputs)
    assert sorted(kw) == ["input_ids", "labels", "position_ids", "use_cache"]
    assert kw["use_cache"] is False and "attention_mask" not in kw
    assert not BOOKKEEPING_KEYS & set(kw)
    check_model_inputs(kw)
    assert kw["input_ids"].shape == (1, 36) and torch.equal(kw["input_ids"], batch["input_ids"])
    ignore = [IGNORE_INDEX]
    assert kw["labels"].tolist() == [
        ignore * 2 + [12, 13, 14] + ignore * 5 + list(range(22, 30)) + ignore * 18
    ]
    assert kw["position_ids"].tolist() == [list(range(8)) + list(range(28))]
    assert torch.equal(kw.loss_weights, batch["token_mask"])
    assert kw.loss_weights[0, 10].item() == 0.5  # what labels cannot carry
    assert kw.source_ids == ["A", "B"]
    assert kw.cu_seqlens.tolist() == [0, 5, 15] and kw.cu_seqlens_padded.tolist() == [0, 8, 36]
    assert sorted(dict(**kw)) == sorted(kw)  # splats as keyword arguments, attributes stay out


def test_mrope_positions_get_the_text_row_first():
    batch = _batch(mrope=True)
    kw = to_hf(batch)
    assert kw["position_ids"].shape == (4, 1, 36)
    assert kw["position_ids"][0, 0].tolist() == list(range(8)) + list(range(28))
    assert torch.equal(kw["position_ids"][1:], batch["position_ids"])
    assert text_positions(torch.tensor([0, 8, 36])).tolist() == kw["position_ids"][0, 0].tolist()


def test_rows_and_wrong_uses_are_clear_errors():
    two = _batch(packs=2)
    with pytest.raises(ValueError, match=r"holds 2 packs .*pass row=0\.\.1"):
        to_hf(two)
    assert torch.equal(to_hf(two, row=1)["input_ids"], two["input_ids"][1:])
    with pytest.raises(ValueError, match="out of range"):
        to_hf(two, row=2)
    with pytest.raises(ValueError, match="holds no pack"):
        to_hf(empty_batch(36))
    unpacked = {k: v for k, v in _batch().items() if not k.startswith("cu_seqlens")}
    with pytest.raises(PackContractError, match="to_hf takes loader packs.*packing_buffer_size"):
        to_hf(unpacked)
    gemma = {**_batch(), "token_type_ids": torch.zeros((1, 36), dtype=torch.int64)}
    with pytest.raises(ValueError, match="token_type_ids .*Gemma 3.*pass model= or config="):
        to_hf(gemma)
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=16, num_attention_heads=2)
    with pytest.raises(PackContractError, match="3-row mRoPE positions, but 'llama'"):
        to_hf(_batch(mrope=True), config=config)
    with pytest.raises(ValueError, match="not both"):
        to_hf(_batch(), model=object(), config=config)


def test_flash_attention_boundaries_are_what_transformers_derives():
    """``cu_seq_lens_q/k`` and ``max_length_q/k`` equal ``transformers``' own derivation from the
    text positions (what its flash path computes when they are absent): the padded boundaries."""
    from transformers.modeling_flash_attention_utils import prepare_fa_kwargs_from_position_ids

    for mrope in (False, True):
        kw = to_hf(_batch(mrope=mrope), attn_implementation="flash_attention_2")
        text = kw["position_ids"][0] if mrope else kw["position_ids"]
        (cu_q, cu_k), (max_q, max_k) = prepare_fa_kwargs_from_position_ids(text)
        assert kw["cu_seq_lens_q"].dtype == torch.int32 == cu_q.dtype
        assert kw["cu_seq_lens_q"].tolist() == cu_q.tolist() == [0, 8, 36]
        assert kw["cu_seq_lens_k"].tolist() == cu_k.tolist()
        assert kw["max_length_q"] == kw["max_length_k"] == int(max_q) == int(max_k) == 28
    assert "cu_seq_lens_q" not in to_hf(_batch(), attn_implementation="sdpa")


#: transformers 5.18 stopped passing a VLM forward's keyword arguments into its vision tower


def gemma3_masks_of_installed_transformers(config, token_types: list[int], positions) -> dict:
    """The mask mapping the installed ``Gemma3Model.forward`` builds for one row, by the
    release's own helper: ``create_masks_for_vision_model`` (5.13+); ``create_causal_mask`` and
    ``create_sliding_window_causal_mask`` with ``block_sequence_ids`` (5.10-5.12);
    ``create_causal_mask_mapping`` with ``token_type_ids`` (before 5.10)."""
    import transformers.models.gemma3.modeling_gemma3 as gemma3

    types = torch.tensor([token_types])
    common = dict(
        config=config,
        inputs_embeds=torch.zeros(1, types.shape[1], config.hidden_size),
        attention_mask=None,
        position_ids=positions[None],
    )
    if hasattr(gemma3, "create_masks_for_vision_model"):
        blocks = gemma3.get_block_sequence_ids_for_mask(types)
        return gemma3.create_masks_for_vision_model(**common, cache=None, block_sequence_ids=blocks)
    if hasattr(gemma3, "get_block_sequence_ids_for_mask"):
        blocks = gemma3.get_block_sequence_ids_for_mask(types)
        kwargs = dict(**common, past_key_values=None, block_sequence_ids=blocks)
        return {
            "full_attention": gemma3.create_causal_mask(**kwargs),
            "sliding_attention": gemma3.create_sliding_window_causal_mask(**kwargs),
        }
    return gemma3.create_causal_mask_mapping(
        **common, past_key_values=None, token_type_ids=types, is_first_iteration=True
    )


def test_gemma3_masks_are_transformers_own_per_conversation():
    """The mapping of a pack is, block by block, what ``transformers`` builds for each
    conversation alone (image blocks bidirectional, sliding window), and nothing across
    conversations; ``transformers``' own mask for the packed row is not."""
    config = transformers.Gemma3TextConfig(
        vocab_size=32,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        sliding_window=3,
        layer_types=["sliding_attention", "full_attention"],
    )
    config._attn_implementation = "eager"
    conversations_types = [[0, 1, 1, 1, 1, 0, 0], [0, 0, 1, 1, 0, 0]]  # 1: image tokens

    def own(token_types: list[int], positions: torch.Tensor) -> dict:
        return gemma3_masks_of_installed_transformers(config, token_types, positions)

    cu_padded = torch.tensor([0, 8, 16])
    token_types = torch.zeros(1, 16, dtype=torch.int64)
    token_types[0, 0:7] = torch.tensor(conversations_types[0])
    token_types[0, 8:14] = torch.tensor(conversations_types[1])
    ours = gemma3_mask_mapping(
        cu_seqlens_padded=cu_padded,
        token_type_ids=token_types,
        sliding_window=3,
        dtype=torch.float32,
    )
    theirs_packed = own(token_types[0].tolist(), text_positions(cu_padded))
    for name in ("full_attention", "sliding_attention"):
        mask = ours[name][0, 0]
        assert mask.shape == (16, 16) and mask.dtype == torch.float32
        assert (mask[8:, :8] != 0).all() and (mask[:8, 8:] != 0).all()  # nothing across
        for start, types in zip((0, 8), conversations_types):
            n = len(types)
            alone = own(types, torch.arange(n))[name][0, 0]
            assert torch.equal(mask[start : start + n, start : start + n], alone), name
    differs = theirs_packed["sliding_attention"][0, 0] != ours["sliding_attention"][0, 0]
    # 5.13+: inside the second conversation transformers' packed-row mask is not its own (it
    # reads the first one's blocks); before 5.13 it is, on this row
    assert differs[8:14, 8:14].any() == hf_compat.gemma3_window_cuts_blocks()


def test_gemma4_masks_are_transformers_own_per_conversation():
    """Gemma 4: per conversation, the installed release's own masks (full layers causal,
    sliding layers ``window AND (causal OR image block)`` from 5.13, ``(causal AND window) OR
    image block`` before), nothing across conversations; a model whose
    ``use_bidirectional_attention`` is not ``"vision"`` gets causal masks, one whose is ``"all"``
    is refused in one line, and a release of another rule is refused."""
    gemma4 = pytest.importorskip("transformers.models.gemma4.modeling_gemma4")
    rule = hf_compat.gemma4_mask_rule()
    config = transformers.Gemma4TextConfig(
        vocab_size=32,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        global_head_dim=8,
        sliding_window=3,
        layer_types=["sliding_attention", "full_attention"],
        use_bidirectional_attention="vision",
        hidden_size_per_layer_input=0,
    )
    config._attn_implementation = "eager"
    conversations_types = [[0, 1, 1, 1, 1, 0, 0], [0, 0, 1, 1, 0, 0]]

    def own(types: list[int]) -> dict:
        types = torch.tensor([types])
        if rule == "causal_mapping":  # 5.5-5.8
            return gemma4.create_causal_mask_mapping(
                config,
                inputs_embeds=torch.zeros(1, types.shape[1], config.hidden_size),
                attention_mask=None,
                past_key_values=None,
                position_ids=torch.arange(types.shape[1])[None],
                mm_token_type_ids=types,
            )
        return gemma4.create_masks_for_vision_model(
            config=config,
            inputs_embeds=torch.zeros(1, types.shape[1], config.hidden_size),
            attention_mask=None,
            cache=None,
            position_ids=torch.arange(types.shape[1])[None],
            block_sequence_ids=gemma4.get_block_sequence_ids_for_mask(types, device="cpu"),
        )

    cu_padded = torch.tensor([0, 8, 16])
    token_types = torch.zeros(1, 16, dtype=torch.int64)
    token_types[0, 0:7] = torch.tensor(conversations_types[0])
    token_types[0, 8:14] = torch.tensor(conversations_types[1])
    ours = gemma3_mask_mapping(
        cu_seqlens_padded=cu_padded,
        token_type_ids=token_types,
        sliding_window=3,
        dtype=torch.float32,
        block_layers=("sliding_attention",),
        window_cuts_blocks=None,  # the installed release's
    )
    full = transformers.Gemma4Config(text_config=config.to_dict())
    if rule is None:
        with pytest.raises(ValueError, match=r"Gemma 4 opens its image blocks on the full"):
            to_hf(
                {**_batch(), "mm_token_type_ids": torch.zeros((1, 36), dtype=torch.int64)},
                config=full,
            )
        return
    for name in ("full_attention", "sliding_attention"):
        mask = ours[name][0, 0]
        assert (mask[8:, :8] != 0).all() and (mask[:8, 8:] != 0).all()
        for start, types in zip((0, 8), conversations_types):
            n = len(types)
            alone = own(types)[name]  # eager: additive float32
            assert torch.equal(mask[start : start + n, start : start + n], alone[0, 0]), name
    # the image block is bidirectional on the sliding layer only
    assert ours["sliding_attention"][0, 0, 1, 2] == 0 and ours["full_attention"][0, 0, 1, 2] != 0
    # the two rules differ here: the 4-token block is wider than the window of 3
    assert (ours["sliding_attention"][0, 0, 4, 1] == 0) == (rule == "causal_mapping")

    kw = to_hf(
        {**_batch(), "mm_token_type_ids": torch.zeros((1, 36), dtype=torch.int64)}, config=full
    )
    causal = gemma3_mask_mapping(
        cu_seqlens_padded=kw.cu_seqlens_padded,
        token_type_ids=torch.zeros(36, dtype=torch.int64),
        sliding_window=3,
        dtype=torch.float32,
        block_layers=(),
        window_cuts_blocks=True,
    )
    assert all(torch.equal(kw["attention_mask"][k], causal[k]) for k in causal)
    full.text_config.use_bidirectional_attention = "all"
    with pytest.raises(
        ValueError, match=r"^to_hf: 'gemma4' with use_bidirectional_attention='all'"
    ):
        to_hf(_batch(), config=full)
    full.text_config.use_bidirectional_attention = "vision"
    full._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match="Gemma 4 does not run flash attention"):
        to_hf(_batch(), config=full)


@pytest.mark.parametrize("family", ["gemma3", "gemma4"])
@pytest.mark.processor_media
def test_a_gemma_models_own_loss_over_a_pack_is_the_mean_over_its_labels(family):
    """``model(**to_hf(batch, model=model)).loss`` with the mask mapping: the mean cross-entropy
    over the pack's labels, on every release (Gemma's forward before 5.13 crops the mask as a
    2-D padding mask for its loss, which a plain dict cannot be: ``MaskMapping``)."""
    processor, model, _ = build(family)
    te = PackingTaskEncoder(max_input_seq_length=CAPACITY, processor=processor, pad_multiple=8)
    encoded = [
        te.encode_sample(conversation_sample(c.key, c.document, c.images))
        for c in CONVERSATIONS[:4]
    ]
    batch = collate([te.pack_selected_samples(encoded).pack])
    kw = to_hf(batch, model=model)
    assert isinstance(kw["attention_mask"], MaskMapping)
    with torch.no_grad():
        out = model(**kw)
    labels = kw["labels"][0, 1:]
    by_hand = torch.nn.functional.cross_entropy(
        out.logits[0, :-1].float(), labels, ignore_index=IGNORE_INDEX
    )
    assert int((labels != IGNORE_INDEX).sum()) > 10 and len(kw.source_ids) == 4
    assert float(out.loss) == pytest.approx(float(by_hand), rel=1e-6)


# ---- loader packs through each family's own forward ---------------------------------------------


@pytest.fixture(scope="module")
def hf_dataset(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("hf"), CONVERSATIONS, per_shard=8)


@functools.lru_cache(maxsize=2)
def _family(family: str, dataset) -> tuple:
    """``(processor, model, loader batches)`` of a family, shared by the tests of a run."""
    processor, model, _ = build(family)
    te = PackingTaskEncoder(max_input_seq_length=CAPACITY, processor=processor, pad_multiple=8)
    return processor, model, list(loader_batches(dataset, te, buffer=8))


def _alone(processor, model, key: str, token_mask: torch.Tensor):
    """The conversation through the processor alone: (logits [n, V], loss sum, label count)."""
    conversation = BY_KEY[key]
    reference = _processor_call(
        processor, conversation, [decode_image(d) for d in images_in_order(conversation)]
    )
    ids = reference["input_ids"]
    labels = torch.where(token_mask[None] > 0, ids, IGNORE_INDEX)
    with torch.no_grad():
        out = model(**reference, labels=labels, use_cache=False)
    count = int((labels != IGNORE_INDEX).sum())
    return out.logits[0], float(out.loss) * count if count else 0.0, count


def _old_form(kw: HFInputs, family: str) -> dict:
    """The pack as trainers passed it before: 3-row mRoPE positions; Gemma 3 without its mask
    mapping; the others without ``use_cache=False`` (a cache turns the packed path off)."""
    old = dict(kw)
    if kw["position_ids"].shape[0] == 4:
        old["position_ids"] = kw["position_ids"][1:]
    elif family in ("gemma3", "gemma4"):
        del old["attention_mask"]
    else:
        del old["use_cache"]
    return old


def _matrix():
    for family in FAMILIES:
        for impl in ("sdpa", "eager"):
            marks = () if (family, impl) in FAST else (pytest.mark.slow,)
            yield pytest.param(family, impl, marks=marks, id=f"{family}-{impl}")


@pytest.mark.energon
@pytest.mark.parametrize(("family", "impl"), list(_matrix()))
@pytest.mark.processor_media
def test_loader_packs_through_the_models_own_forward(hf_dataset, family, impl):
    """Every loader pack through ``to_hf`` and the model as it is: each conversation's logits
    equal it alone, the loss adds up, and the old input form is wrong."""
    processor, model, batches = _family(family, hf_dataset)
    model.set_attn_implementation(impl)
    worst = old_worst = 0.0
    pack_loss = alone_loss = 0.0
    pack_count = alone_count = sources = images = 0
    for batch in batches:
        kw = to_hf(batch, model=model)
        assert "attention_mask" not in kw or family in ("gemma3", "gemma4")
        with torch.no_grad():
            out = model(**kw)
            old = model(**_old_form(kw, family)).logits[0]
        count = int((kw["labels"] != IGNORE_INDEX).sum())
        pack_loss += float(out.loss) * count
        pack_count += count
        for k, key in enumerate(kw.source_ids):
            start = int(kw.cu_seqlens_padded[k])
            n = int(kw.cu_seqlens[k + 1] - kw.cu_seqlens[k])
            logits, loss, labels = _alone(
                processor, model, key, kw.loss_weights[0, start : start + n]
            )
            worst = max(worst, float((out.logits[0, start : start + n] - logits).abs().max()))
            old_worst = max(old_worst, float((old[start : start + n] - logits).abs().max()))
            alone_loss += loss
            alone_count += labels
            sources += 1
            images += len(images_in_order(BY_KEY[key]))
    assert sources == len(CONVERSATIONS) and images >= 4
    assert worst <= 1e-5, f"{family} {impl}: per-source logits differ by {worst:.2e}"
    # before 5.13 Gemma 3's and 4's own masks (from their token types, conversations found by
    # the restarting positions) keep the conversations apart as well (measured <= 4e-7)
    if family not in ("gemma3", "gemma4") or hf_compat.gemma3_window_cuts_blocks():
        assert old_worst > 1e-2, f"{family} {impl}: the old input form is not wrong ({old_worst})"
    assert pack_count == alone_count > 0
    assert pack_loss == pytest.approx(alone_loss, rel=1e-5)


# ---- flash-attention-2: transformers' own integration, a reference kernel ------------------------


def _reference_flash(calls: list):
    """Dense and varlen attention with flash-attn's signatures (its local ``window_size`` too:
    Aya Vision's sliding layers), in float32 on CPU (exact, not fast); each varlen call records
    its boundaries."""

    def dense(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1)):
        repeat = q.shape[-2] // k.shape[-2]  # grouped-query heads, as the kernel does
        k, v = (x.repeat_interleave(repeat, dim=-2) for x in (k, v))
        mask = None
        if window_size[0] >= 0:  # flash-attn's local window: keys in [i - left, i + right]
            query = torch.arange(q.shape[1])[:, None]
            key = torch.arange(k.shape[1])[None, :]
            mask = (key >= query - window_size[0]) & (key <= query + window_size[1])
            if causal:
                mask &= key <= query
        out = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            attn_mask=mask,
            is_causal=causal and mask is None,
            scale=softmax_scale,
        )
        return out.transpose(1, 2)

    def varlen(
        q,
        k,
        v,
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q=None,
        max_seqlen_k=None,
        dropout_p=0.0,
        softmax_scale=None,
        causal=False,
        window_size=(-1, -1),
    ):
        assert torch.equal(cu_seqlens_q, cu_seqlens_k)
        bounds = cu_seqlens_q.tolist()
        calls.append((bounds, int(max_seqlen_q), causal))
        parts = [
            dense(
                q[None, a:b],
                k[None, a:b],
                v[None, a:b],
                softmax_scale=softmax_scale,
                causal=causal,
                window_size=window_size,
            )
            for a, b in zip(bounds, bounds[1:])
        ]
        return torch.cat(parts, dim=1)[0]

    return dense, varlen


@pytest.mark.energon
@pytest.mark.parametrize(
    "family",
    [
        "qwen2_vl",
        *(
            pytest.param(f, marks=pytest.mark.slow)
            for f in FAMILIES
            if f not in ("qwen2_vl", "gemma3", "gemma4")
        ),
    ],
)
@pytest.mark.processor_media
def test_flash_attention_2_through_transformers_own_integration(hf_dataset, family, monkeypatch):
    """``transformers``' flash-attention integration on CPU, the CUDA kernel replaced by the
    reference: every causal (decoder) call gets the pack's padded boundaries from ``to_hf``, and
    the logits equal sdpa's on the same pack. Gemma 3 refuses flash attention."""
    import transformers.modeling_flash_attention_utils as flash_utils

    if not hf_compat.vision_takes_own_kwargs():  # refused in one line, not run wrong
        _, model, batches = _family(family, hf_dataset)
        model.config._attn_implementation = "flash_attention_2"
        try:
            with pytest.raises(ValueError, match="collides with the tower's own"):
                for batch in batches:  # a pack without images passes: one with them refuses
                    to_hf(batch, model=model)
        finally:
            model.set_attn_implementation("sdpa")
        return

    calls: list = []
    dense, varlen = _reference_flash(calls)
    monkeypatch.setattr(
        flash_utils,
        "_lazy_imports",
        lambda *a, **k: (dense, varlen, None, flash_utils._pad_input, flash_utils._unpad_input),
    )
    monkeypatch.setattr(flash_utils, "_loaded_implementation", None)
    _, model, batches = _family(family, hf_dataset)
    try:
        worst, packs = _flash_run(model, batches, calls)
    finally:
        model.set_attn_implementation("sdpa")
    assert packs >= 2 and worst <= 1e-5, f"{family} flash: {worst:.2e}"
    gemma = transformers.Gemma3Config()
    gemma._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match="Gemma 3 does not run flash attention"):
        to_hf({**_batch(), "token_type_ids": torch.zeros((1, 36), dtype=torch.int64)}, config=gemma)


def _flash_run(model, batches, calls) -> tuple[float, int]:
    """Worst difference between each pack's flash-attention logits and its sdpa logits (which
    equal each conversation alone: the test above)."""
    worst, packs = 0.0, 0
    for batch in batches:
        model.set_attn_implementation("sdpa")
        with torch.no_grad():
            expected = model(**to_hf(batch, model=model)).logits
        model.config._attn_implementation = "flash_attention_2"  # reaches the sub-configs
        kw = to_hf(batch, model=model)
        assert kw["cu_seq_lens_q"].tolist() == kw.cu_seqlens_padded.tolist()
        calls.clear()
        with torch.no_grad():
            logits = model(**kw).logits
        decoder = {(tuple(b), m) for b, m, causal in calls if causal}
        longest = int(kw.cu_seqlens_padded.diff().max())
        assert decoder == {(tuple(kw.cu_seqlens_padded.tolist()), longest)}
        worst = max(worst, float((logits - expected).abs().max()))
        packs += 1
    return worst, packs
