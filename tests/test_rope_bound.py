"""Rotary embeddings whose frequencies follow the row (``longrope``: Phi-3, Phi-3.5, Phi-4-mini,
Phi-4-multimodal; ``dynamic`` NTK): transformers picks them per forward from the row's largest
position, and in a pack that position is set by the widest padded extent (the tail pad runs on
from the last conversation), not by the conversation. So a pack is exact only as wide as the
model's bound (``original_max_position_embeddings``; dynamic: ``max_position_embeddings``):
wider, the task encoder and ``to_hf`` refuse it, naming ``max_input_seq_length``.

Shown with a tiny Phi-3 (longrope, bound 32) in float64 through transformers' own forward: a pack
32 wide gives each conversation its logits alone; the same conversations 64 wide are off.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from energon_packing import PackingTaskEncoder  # noqa: E402
from energon_packing.encoding.models import model_info  # noqa: E402
from energon_packing.hf import to_hf  # noqa: E402
from energon_packing.schema import Source, collate, layout  # noqa: E402
from energon_packing.testing.families import make_tokenizer  # noqa: E402

BOUND = 32
HEAD = 16


def _config(**rope):
    from transformers import Phi3Config

    return Phi3Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        pad_token_id=0,
        max_position_embeddings=256,
        original_max_position_embeddings=BOUND,
        rope_scaling=rope
        or {"type": "longrope", "short_factor": [1.0] * (HEAD // 2), "long_factor": [4.0] * 8},
    )


def test_the_bound_is_read_from_the_rope_parameters():
    longrope = model_info(_config())
    assert (longrope.rope_type, longrope.rope_bound) == ("longrope", BOUND)
    dynamic = {"model_type": "llama", "rope_scaling": {"type": "dynamic", "factor": 2.0}}
    assert model_info({**dynamic, "max_position_embeddings": 8192}).rope_bound == 8192
    static = {"model_type": "llama", "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}
    assert model_info({**static, "max_position_embeddings": 8192}).rope_bound is None
    per_layer = {  # Gemma 3's per-layer-type parameters: each is looked at
        "model_type": "gemma3_text",
        "max_position_embeddings": 4096,
        "rope_parameters": {
            "full_attention": {"rope_type": "dynamic", "factor": 2.0},
            "sliding_attention": {"rope_type": "default"},
        },
    }
    assert model_info(per_layer).rope_bound == 4096


def _pack(width: int):
    rng = np.random.default_rng(0)
    sources = [
        Source(key=k, input_ids=rng.integers(3, 60, n), token_mask=np.ones(n, dtype=np.float32))
        for k, n in (("A", 9), ("B", 11), ("C", 5))
    ]
    return collate([layout(sources, width=width, pad_multiple=4, pad_id=0)]), sources


def test_a_pack_is_exact_up_to_the_bound_and_refused_past_it():
    from transformers import Phi3ForCausalLM

    torch.manual_seed(0)
    config = _config()
    config._attn_implementation = "sdpa"
    model = Phi3ForCausalLM(config).double().eval()

    def run(inputs) -> torch.Tensor:
        with torch.no_grad():
            return model(**inputs).logits[0]

    worst = {}
    for width in (BOUND, 2 * BOUND):
        batch, sources = _pack(width)
        if width > BOUND:
            with pytest.raises(ValueError, match=rf"max_input_seq_length <= {BOUND}") as raised:
                to_hf(batch, config=config)
            assert "longrope" in str(raised.value) and "\n" not in str(raised.value)
            # what the refused pack would compute: to_hf's own inputs, built under the bound's
            # check switched off by giving the same positions by hand
            bounds = batch["cu_seqlens_padded"][0]
            starts = torch.repeat_interleave(bounds[:-1], bounds.diff())
            inputs = {
                "input_ids": batch["input_ids"][0][None],
                "position_ids": (torch.arange(width) - starts)[None],
            }
        else:
            inputs = {k: v for k, v in to_hf(batch, config=config).items() if k != "labels"}
        logits = run(inputs)
        cu = batch["cu_seqlens_padded"][0].tolist()
        worst[width] = max(
            float(
                (
                    logits[a : a + len(s.input_ids)]
                    - run({"input_ids": torch.tensor(s.input_ids)[None]})
                )
                .abs()
                .max()
            )
            for a, s in zip(cu, sources)
        )
    assert worst[BOUND] <= 1e-6, worst
    assert worst[2 * BOUND] > 1e-4, worst  # the tail's positions pass the bound: long factors


def test_the_task_encoder_refuses_a_capacity_past_the_bound(tmp_path):
    tokenizer = make_tokenizer(extra=["<|user|>", "<|end|>"], eos="<|end|>", pad="<|end|>")
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}<|end|>{% endfor %}"
    tokenizer.save_pretrained(str(tmp_path))
    _config().save_pretrained(str(tmp_path))
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "phi3"
    for path in ({"processor": str(tmp_path)}, {"tokenizer": str(tmp_path)}):
        with pytest.raises(ValueError, match=rf"'phi3' .*longrope.*<= {BOUND}, or train unpacked"):
            PackingTaskEncoder(max_input_seq_length=2 * BOUND, **path)
        PackingTaskEncoder(max_input_seq_length=BOUND, pad_multiple=4, **path)
        # one conversation a row: positions are each conversation's own
        PackingTaskEncoder(max_input_seq_length=2 * BOUND, unpacked=True, **path)
