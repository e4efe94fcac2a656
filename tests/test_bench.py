"""The bench's numbers: attention runs per conversation, FLOPs counted as torch runs them.

On the design note's two conversations (A: 5 tokens with one 4x4-patch image, B: 10; pad
multiple 4; capacity 36) the loader pack attends over [8, 28], the trainer pack over [8, 12],
the padded batch over two rows of 10: the FLOPs the bench prints are a hand count of those, and
equal what ``torch.utils.flop_counter`` counts for the ops the model really dispatches.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

from energon_packing.schema import IMAGE_GRID_THW, PIXEL_VALUES, Source, collate, layout
from energon_packing.testing.model import TinyConfig, TinyVLM, _varlen_attention
from energon_packing.tools.bench import (
    PATHS,
    Curve,
    forward_flops,
    linear_flops_per_token,
    report,
    train,
)
from energon_packing.trainer import (
    make_packed_seq_params,
    pack_microbatches,
    padded_microbatch,
    prepacked_microbatches,
)

IMAGE = 7
CONFIG = TinyConfig(vocab_size=50, hidden=16, layers=2, heads=2, mlp=32, vision_hidden=8)
CPU_SDPA = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


def conversations() -> list[Source]:
    pixels = np.random.default_rng(0).standard_normal((16, CONFIG.patch_dim)).astype(np.float32)
    image = {PIXEL_VALUES: pixels, IMAGE_GRID_THW: np.array([[1, 4, 4]])}
    return [
        Source(key="A", input_ids=[3, IMAGE, IMAGE, IMAGE, IMAGE], token_mask=[1.0] * 5,
               media=image, images=1),
        Source(key="B", input_ids=list(range(20, 30)), token_mask=[1.0] * 10),
    ]  # fmt: skip


def three_paths():
    """The loader pack, the trainer pack and the padded batch of the two conversations."""
    a, b = conversations()
    (loader,) = prepacked_microbatches(
        collate([layout([a, b], width=36, pad_multiple=4, pad_id=0)]),
        image_token_id=IMAGE,
        pad_multiple=4,
    )
    rows = collate(
        [layout([s], width=10, pad_multiple=1, pad_id=0) for s in (a, b)], prepacked=False
    )
    (trainer,) = pack_microbatches(rows, token_budget=36, pad_multiple=4, image_token_id=IMAGE)
    return {
        "loader packs": loader,
        "trainer packs": trainer,
        "padded batches": padded_microbatch(rows, image_token_id=IMAGE),
    }


class AttentionCalls(TorchDispatchMode):
    """Records (queries, keys) of every attention kernel call torch dispatches."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func._overloadpacket == CPU_SDPA:
            q, k = args[0], args[1]
            self.calls.extend([(q.shape[2], k.shape[2])] * q.shape[0])
        return func(*args, **(kwargs or {}))


def test_flops_per_real_token_are_a_hand_count():
    paths = three_paths()
    assert [mb.real_tokens for mb in paths.values()] == [15, 15, 15]
    # per computed token: 2 layers x (qkv 2*16*48 + out 2*16*16 + MLP 2*2*16*32) + head 2*16*50
    assert linear_flops_per_token(CONFIG) == 2 * (1536 + 512 + 2048) + 1600 == 9792
    # attention: 4 * hidden * layers = 128 per query-key pair; vision: 16 patches x 2*1176*8,
    # 4 merged tokens x (2*32*16 + 2*16*16)
    vision = 16 * 2 * 1176 * 8 + 4 * (1024 + 512)
    hand = {
        "loader packs": (128 * (8 * 8 + 28 * 28), 36 * 9792, vision),
        "trainer packs": (128 * (8 * 8 + 12 * 12), 20 * 9792, vision),
        "padded batches": (128 * 2 * 10 * 10, 20 * 9792, vision),
    }
    curves = []
    for name, mb in paths.items():
        f = forward_flops(mb, CONFIG)
        assert (f.attention, f.linear, f.vision) == hand[name]
        # two steps, the first not timed; the padded path takes twice as long per step
        seconds = [5.0, 2.0] if name == "padded batches" else [5.0, 1.0]
        curves.append(
            Curve(name=name, warmup=1, step_seconds=seconds, step_real_tokens=[15, 15],
                  real_tokens=15, flops=f)
        )  # fmt: skip
    rows = {
        line[:17].strip(): line[17:].split() for line in report(curves, config=CONFIG).split("\n")
    }
    # per real token (15): attention, linear, vision, total, median step, predicted, measured
    assert rows["loader packs"] == [
        "7.24k",
        "23.50k",
        "20.48k",
        "51.22k",
        "1.000",
        "s",
        "0.69x",
        "2.00x",
    ]
    assert rows["trainer packs"] == [
        "1.77k",
        "13.06k",
        "20.48k",
        "35.31k",
        "1.000",
        "s",
        "1.00x",
        "2.00x",
    ]
    assert rows["padded batches"] == ["1.71k", "13.06k", "20.48k", "35.24k", "2.000", "s", "1.00x", "1.00x"]  # fmt: skip
    assert curves[0].tokens_per_second == 15.0 and curves[2].tokens_per_second == 7.5


@pytest.mark.parametrize("name", PATHS)
def test_forward_flops_equal_what_torch_counts(name):
    """The bench's count against torch's own: FlopCounterMode over the model's forward, with
    the CPU attention kernel counted by torch's own SDPA formula (4*b*h*q*k*d)."""
    mb = three_paths()[name]
    model = TinyVLM(CONFIG, seed=0, dtype=torch.float64)
    counted = FlopCounterMode(
        display=False,
        custom_mapping={CPU_SDPA: lambda q, k, v, *_, **__: sdpa_flop_count(q, k, v)},
    )
    with counted, AttentionCalls() as calls, torch.no_grad():
        model(**mb.model_inputs)
    ours = forward_flops(mb, CONFIG)
    assert counted.get_total_flops() == ours.total
    assert counted.get_flop_counts()["Global"][CPU_SDPA] == ours.attention
    per_layer = {
        "loader packs": [(8, 8), (28, 28)],  # one call per conversation, never the row (36, 36)
        "trainer packs": [(12, 12), (8, 8)],  # the trainer's packer puts the longer first
        "padded batches": [(10, 10), (10, 10)],
    }[name]
    assert calls.calls == per_layer * CONFIG.layers


def dense_reference(q, k, v, starts, valid, extents):
    """The 4D-masked attention over the whole row: same source, causal, real keys only."""
    total = sum(extents)
    source = torch.repeat_interleave(torch.arange(len(extents)), torch.tensor(extents))
    real = torch.zeros(total, dtype=torch.bool)
    for start, n in zip(starts, valid):
        real[start : start + n] = True
    pos = torch.arange(total)
    allowed = (source[:, None] == source[None, :]) & (pos[None, :] <= pos[:, None]) & real
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=allowed)


@settings(max_examples=25, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 24), min_size=1, max_size=6),
    multiple=st.sampled_from([1, 4, 8]),
    boundary=st.sampled_from(["padded", "real"]),
    seed=st.integers(0, 2**16),
)
def test_per_conversation_attention_equals_the_masked_row(lengths, multiple, boundary, seed):
    padded = [-(-n // multiple) * multiple for n in lengths]
    padded[-1] += 5  # a tail folded into the last conversation, as in a loader pack
    starts = np.concatenate([[0], np.cumsum(padded)[:-1]]).tolist()
    params = make_packed_seq_params(
        torch.tensor(np.concatenate([[0], np.cumsum(lengths)])),
        torch.tensor(np.concatenate([[0], np.cumsum(padded)])),
        boundary=boundary,
    )
    generator = torch.Generator().manual_seed(seed)
    q, k, v = torch.randn(3, 1, 2, sum(padded), 8, dtype=torch.float64, generator=generator)
    with AttentionCalls() as calls:
        got = _varlen_attention(q, k, v, params)
    valid = lengths if boundary == "real" else padded
    expected = dense_reference(q, k, v, starts, valid, padded)
    torch.testing.assert_close(got, expected, atol=1e-12, rtol=0)
    assert calls.calls == list(zip(padded, valid))  # its cost: sum over conversations


def test_losses_agree_step_for_step_across_paths():
    paths = three_paths()
    steps = {name: [[mb]] * 3 for name, mb in paths.items()}
    curves = train(steps, config=CONFIG, seed=0, lr=1e-2, warmup=1)
    reference = curves[0].losses
    assert len(reference) == 3 and reference[0] > reference[-1]
    for curve in curves:
        assert curve.warmup == 1 and len(curve.step_seconds) == 3
        assert curve.real_tokens == 45
        assert curve.losses == pytest.approx(reference, abs=1e-5)
    assert [c.computed_tokens for c in curves] == [3 * 36, 3 * 20, 3 * 20]
