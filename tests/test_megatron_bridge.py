"""Megatron-Bridge reads our packs through its own functions (``energon_packing.megatron_bridge``).

Bridge is not a dependency; ``.ci/run`` installs the 0.3.1 wheel without its dependencies
(``pip install --no-deps megatron-bridge==0.3.1``), and these tests skip without it. Importing
Bridge's package runs ``megatron/bridge/__init__.py``, which imports its model bridges, PEFT and
Transformer Engine (absent on CPU: it fails after ~18 s), so each test loads only the wheel's
module files it needs, by path; each of them imports torch and megatron.core alone. Where a
function sits in a module that imports more (``gpt_step``, ``vlm_step``), the test compiles that
one function from the wheel's file.

What is proven against the wheel's own code (0.3.1):

* ``get_packed_seq_params`` on ``step="sft"`` equals the shim's ``boundary="real"``
  ``PackedSeqParams`` field for field, on loader packs and on generated ones, after the batch
  went through ``gpt_step.get_batch_from_iterator`` (its key filter); our raw
  ``cu_seqlens_padded`` gives it empty boundaries (the failure the adapter exists for);
* ``masked_next_token_loss`` on our ``loss_mask`` gives the shim's loss;
* the VLM step's visual-inputs container normalises our media as ours does; its Qwen3-VL mRoPE
  rule (``modelling_qwen3_vl/utils.get_rope_index``) and transformers' Qwen2.5-VL rule (which
  Bridge's Qwen2.5-VL model binds) give the loader's positions on every real token of the
  conversations at the boundaries ``step="vlm"`` declares;
* 0.3.1's VLM step cannot take a pack: its ``pack_batch_sequences`` makes one sequence of a row.

The newer VLM step's batch format (``cu_seqlens_q/kv``, ``*_padded``, ``max_seqlen_q/kv``;
Bridge commit ``BRIDGE_COMMIT``) is not in any wheel for Python 3.11; it is pinned here by
names, shapes and semantics against the shim, and was run through that commit's own
``get_batch``, ``get_packed_seq_params`` and Qwen2.5-VL / Qwen3-VL position code once, outside
the suite (issue 18's note has the numbers).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import itertools
import logging
import sys
import types
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import SAMPLE_DATA, loader_batches
from hypothesis import given, settings
from hypothesis import strategies as st

from energon_packing import PackingTaskEncoder
from energon_packing.megatron_bridge import (
    BRIDGE_COMMIT,
    IGNORE_INDEX,
    VisualInputs,
    to_megatron_bridge,
    visual_inputs_class,
)
from energon_packing.schema import Source, collate, layout, pack_from_batch
from energon_packing.trainer import prepacked_microbatches, token_loss

CAPACITY = 1024
SFT_KEYS = {
    "tokens",
    "labels",
    "loss_mask",
    "position_ids",
    "cu_seqlens",
    "cu_seqlens_argmin",
    "cu_seqlens_unpadded",
    "cu_seqlens_unpadded_argmin",
    "max_seqlen",
}


# ---- the wheel's own modules, loaded without Bridge's package __init__ ---------------------------
def _bridge_root() -> Path | None:
    try:
        spec = importlib.util.find_spec("megatron.bridge")
    except ImportError:
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


BRIDGE = _bridge_root()
needs_bridge = pytest.mark.skipif(
    BRIDGE is None,
    reason="megatron-bridge is not installed (pip install --no-deps megatron-bridge==0.3.1)",
)


def bridge_module(relative: str):
    """One module of the installed wheel, by file, under a private name (no package import)."""
    name = "_bridge_wheel_" + relative.removesuffix(".py").replace("/", "_")
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, BRIDGE / relative)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up while being built
        spec.loader.exec_module(module)
    return sys.modules[name]


def bridge_function(relative: str, name: str):
    """One function of a wheel module whose imports do not load on CPU, compiled from the
    wheel's file (only torch, typing names and a logger in its globals)."""
    path = BRIDGE / relative
    tree = ast.parse(path.read_text())
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    scope = {"torch": torch, "Iterable": Iterable, "logger": logging.getLogger(name)}
    exec(compile(ast.Module(body=[node], type_ignores=[]), str(path), "exec"), scope)
    return scope[name]


def get_packed_seq_params(batch):
    return bridge_module("training/utils/packed_seq_utils.py").get_packed_seq_params(batch)


def through_gpt_step(out: dict, monkeypatch):
    """Bridge's packed SFT step on our batch: its ``get_batch_from_iterator`` (first and last
    pipeline stage; ``.cuda()`` a no-op on CPU), then the dict its ``_forward_step_common``
    builds for ``get_packed_seq_params``."""
    monkeypatch.setattr(torch.Tensor, "cuda", lambda self, non_blocking=False: self)
    step = bridge_function("training/gpt_step.py", "get_batch_from_iterator")
    got = step(iter([out]), is_first_pp_stage=True, is_last_pp_stage=True)
    keys = ("cu_seqlens", "cu_seqlens_argmin", "max_seqlen", "cu_seqlens_unpadded")
    packed = {key: got[key] for key in (*keys, "cu_seqlens_unpadded_argmin")}
    return got, get_packed_seq_params(packed)


def assert_same_params(bridge, shim) -> None:
    """Field for field; Bridge 0.3.1 passes ``max_seqlen`` as a 0-d tensor, the shim an int.
    Megatron-Core 0.16.1 has no ``pad_between_seqs`` / ``total_tokens``; where a newer one has
    them, Bridge 0.3.1 never sets them (its step recomputes ``total_tokens`` for hybrids)."""
    for field in dataclasses.fields(bridge):
        if field.name in ("pad_between_seqs", "total_tokens"):
            continue
        ours, theirs = getattr(shim, field.name), getattr(bridge, field.name)
        if isinstance(theirs, torch.Tensor) and theirs.ndim:
            assert theirs.dtype == ours.dtype == torch.int32, field.name
            assert torch.equal(theirs, ours), (field.name, theirs, ours)
        elif isinstance(theirs, torch.Tensor):
            assert int(theirs) == ours, field.name
        else:
            assert theirs == ours, field.name


# ---- packs ------------------------------------------------------------------------------------
def design_note_batch():
    a = Source(key="A", input_ids=[11, 12, 13, 14, 15], token_mask=[0, 0, 1, 1, 1])
    b = Source(key="B", input_ids=list(range(21, 31)), token_mask=[0] * 4 + [0.5] * 6)
    return collate([layout([a, b], width=36, pad_multiple=4, pad_id=0)])


@pytest.fixture(scope="module")
def text_packs():
    te = PackingTaskEncoder(max_input_seq_length=CAPACITY, tokenizer="bundled", pad_multiple=8)
    return list(itertools.islice(loader_batches(SAMPLE_DATA, te, buffer=16), 4))


@pytest.fixture(scope="module")
def mrope_packs():
    te = PackingTaskEncoder(
        max_input_seq_length=CAPACITY, tokenizer="bundled", pad_multiple=8, mrope=True
    )
    ones = list(itertools.islice(loader_batches(SAMPLE_DATA, te, buffer=16), 6))
    # two packs a batch, as the loader's batch_size=2 collates them
    twos = [collate([pack_from_batch(b, 0) for b in pair]) for pair in (ones[:2], ones[2:4])]
    return te, ones + twos


@st.composite
def generated_batches(draw):
    multiple = draw(st.sampled_from([1, 2, 4, 8]))
    rows = draw(st.integers(1, 3))
    counts = [draw(st.integers(1, 5)) for _ in range(rows)]
    lengths = [[draw(st.integers(1, 40)) for _ in range(n)] for n in counts]
    need = max(sum(-(-n // multiple) * multiple for n in row) for row in lengths)
    width = need + multiple * draw(st.integers(0, 6))
    packs = []
    for r, row in enumerate(lengths):
        sources = [
            Source(
                key=f"r{r}s{k}",
                input_ids=draw(st.lists(st.integers(1, 99), min_size=n, max_size=n)),
                token_mask=draw(st.lists(st.sampled_from([0.0, 1.0]), min_size=n, max_size=n)),
            )
            for k, n in enumerate(row)
        ]
        packs.append(layout(sources, width=width, pad_multiple=multiple, pad_id=0))
    return collate(packs)


# ---- step="sft" -------------------------------------------------------------------------------
def test_sft_is_bridges_packed_dataset_layout_on_the_design_note_pack():
    out = to_megatron_bridge(design_note_batch(), step="sft")
    assert set(out) == SFT_KEYS
    assert out["cu_seqlens"].tolist() == [[0, 8, 36, -1]]
    assert out["cu_seqlens_unpadded"].tolist() == [[0, 5, 15, -1]]
    assert out["cu_seqlens"].dtype == out["cu_seqlens_unpadded"].dtype == torch.int32
    assert out["cu_seqlens_argmin"].tolist() == out["cu_seqlens_unpadded_argmin"].tolist() == [[3]]
    assert out["max_seqlen"].tolist() == [[28]] and out["max_seqlen"].dtype == torch.int32
    ids = [11, 12, 13, 14, 15, 0, 0, 0, *range(21, 31)] + [0] * 18
    assert out["tokens"].tolist() == [ids]
    assert out["labels"].tolist() == [ids[1:] + ids[:1]]  # token t+1 (the row wraps: weight 0)
    weights = [0, 1, 1, 1, 0, 0, 0, 0] + [0, 0, 0] + [0.5] * 6 + [0] * 19
    assert out["loss_mask"].tolist() == [weights] and out["loss_mask"].dtype == torch.float32
    assert out["position_ids"].tolist() == [[*range(8), *range(28)]]


@needs_bridge
def test_raw_cu_seqlens_padded_gives_bridge_empty_boundaries():
    """The failure the adapter exists for: Bridge trims at argmin, 0 without a -1 fill."""
    batch = design_note_batch()
    raw = {"cu_seqlens": batch["cu_seqlens_padded"][0][None], "max_seqlen": torch.tensor([[28]])}
    assert get_packed_seq_params(raw).cu_seqlens_q.numel() == 0
    out = to_megatron_bridge(batch, step="sft")
    assert get_packed_seq_params(out).cu_seqlens_q.tolist() == [0, 5, 15]


@needs_bridge
@pytest.mark.energon
def test_sft_through_bridges_step_equals_the_shims_real_mode(text_packs, monkeypatch):
    loss = bridge_module("training/losses.py").masked_next_token_loss
    torch.manual_seed(0)
    for batch in text_packs:
        out = to_megatron_bridge(batch, step="sft")
        got, params = through_gpt_step(out, monkeypatch)
        (mb,) = prepacked_microbatches(batch, boundary="real")
        assert len(mb.source_ids) >= 2  # several conversations: the boundaries matter
        assert_same_params(params, mb.model_inputs["packed_seq_params"])
        for key in ("tokens", "labels", "loss_mask", "position_ids"):
            assert got[key] is out[key]  # Bridge's key filter kept them
        assert torch.equal(got["labels"], mb.labels) and torch.equal(got["loss_mask"], mb.loss_mask)
        assert torch.equal(got["position_ids"], batch["position_ids"])
        logits = torch.randn(CAPACITY, 64, dtype=torch.float64)
        labels = got["labels"].clamp(max=63)  # any targets: the sums must agree, not the values
        mb.labels = labels
        losses = torch.nn.functional.cross_entropy(logits, labels[0], reduction="none")
        bridge_loss, tokens, _ = loss(got["loss_mask"], losses[None], check_for_nan_in_loss=False)
        ours, valid = token_loss(logits, mb)
        assert torch.allclose(bridge_loss.double(), ours, rtol=1e-6)  # Bridge sums in float32
        assert int(tokens) == valid


@needs_bridge
@settings(max_examples=25, deadline=None)
@given(batch=generated_batches())
def test_sft_rows_through_bridge_equal_the_shim_on_generated_packs(batch):
    out = to_megatron_bridge(batch, step="sft")
    for row, mb in enumerate(prepacked_microbatches(batch, boundary="real")):
        one = {key: value[row : row + 1] for key, value in out.items()}  # micro-batch size 1
        assert_same_params(get_packed_seq_params(one), mb.model_inputs["packed_seq_params"])
        assert torch.equal(one["labels"], mb.labels) and torch.equal(one["loss_mask"], mb.loss_mask)


# ---- step="vlm" -------------------------------------------------------------------------------
@pytest.mark.energon
def test_vlm_format_is_bridges_newer_vlm_step(mrope_packs):
    _, batches = mrope_packs
    for batch in batches:
        rows, width = batch["input_ids"].shape
        out = to_megatron_bridge(batch, step="vlm")
        mbs = prepacked_microbatches(batch, boundary="real")
        total = rows * width
        for key in ("input_ids", "labels", "loss_mask", "position_ids"):
            assert out[key].shape == (1, total), key
        assert out["total_tokens"] == total
        real = [mb.cu_seqlens for mb in mbs]
        offsets = np.cumsum([0] + [int(c[-1]) for c in real])
        expected = torch.cat([real[0][:1]] + [c[1:] + int(o) for c, o in zip(real, offsets)])
        padded = torch.cat(
            [mbs[0].cu_seqlens_padded[:1]]
            + [mb.cu_seqlens_padded[1:] + i * width for i, mb in enumerate(mbs)]
        )
        for key, value in (("cu_seqlens_q", expected), ("cu_seqlens_q_padded", padded)):
            for name in (key, key.replace("_q", "_kv")):
                assert out[name].dtype == torch.int32 and torch.equal(out[name], value), name
        for name in ("max_seqlen_q", "max_seqlen_kv"):  # tensors: the step moves them with .cpu()
            assert out[name].shape == () and out[name].dtype == torch.int32
            assert int(out[name]) == max(
                mb.model_inputs["packed_seq_params"].max_seqlen_q for mb in mbs
            )
        loss_mask = torch.cat([mb.loss_mask for mb in mbs], dim=1)
        labels = torch.cat([mb.labels for mb in mbs], dim=1)
        assert torch.equal(out["loss_mask"], loss_mask)
        assert torch.equal(out["labels"], labels.masked_fill(loss_mask == 0, IGNORE_INDEX))
        starts = torch.repeat_interleave(padded[:-1].long(), (padded[1:] - padded[:-1]).long())
        assert torch.equal(out["position_ids"][0], torch.arange(total) - starts)
        visual = out["visual_inputs"]
        assert type(visual) is visual_inputs_class()
        kwargs = visual.normalized_for_model()
        grids = torch.cat(batch["image_grid_thw"])
        assert torch.equal(kwargs["image_grid_thw"], grids)
        assert torch.equal(kwargs["pixel_values"], torch.cat(batch["pixel_values"]))
        assert all(v is None or isinstance(v, torch.Tensor) for v in vars(visual).values())


def test_vlm_without_images_and_padding_free_rows():
    """No media: every field None (nothing for the model); real == padded: no padded pair,
    as Bridge's in-batch packing emits it."""
    source = Source(key="A", input_ids=[1, 2, 3, 4], token_mask=[0, 1, 1, 1])
    out = to_megatron_bridge(
        collate([layout([source], width=4, pad_multiple=4, pad_id=0)]), step="vlm"
    )
    assert out["visual_inputs"].normalized_for_model() == {}
    assert out["cu_seqlens_q"].tolist() == [0, 4] and "cu_seqlens_q_padded" not in out
    assert out["labels"].tolist() == [[2, 3, 4, IGNORE_INDEX]]


@needs_bridge
@pytest.mark.energon
def test_visual_inputs_normalise_as_bridges_own_class(mrope_packs):
    wheel = bridge_module("training/utils/visual_inputs.py")
    theirs = {f.name for f in dataclasses.fields(wheel.Qwen2_5_VLVisualInputs)}
    assert theirs <= {f.name for f in dataclasses.fields(VisualInputs)}
    _, batches = mrope_packs
    for batch in batches:
        ours = to_megatron_bridge(batch, step="vlm")["visual_inputs"]
        bridge = wheel.Qwen2_5_VLVisualInputs(**{name: getattr(ours, name) for name in theirs})
        got, want = ours.normalized_for_model(), bridge.normalized_for_model()
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in got)
    batched = VisualInputs(
        pixel_values=torch.zeros(2, 3, 1, 4, 4), image_grid_thw=torch.ones(2, 3, 3)
    )
    same = wheel.Qwen2_5_VLVisualInputs(
        pixel_values=batched.pixel_values, image_grid_thw=batched.image_grid_thw
    )
    for key, value in same.normalized_for_model().items():
        assert torch.equal(batched.normalized_for_model()[key], value)


def test_visual_inputs_class_is_bridges_once_bridge_is_imported(monkeypatch):
    monkeypatch.delitem(sys.modules, "megatron.bridge", raising=False)
    assert visual_inputs_class() is VisualInputs

    @dataclasses.dataclass
    class GenericVisualInputs(VisualInputs):
        pass

    module = types.ModuleType("megatron.bridge.training.utils.visual_inputs")
    module.GenericVisualInputs = GenericVisualInputs
    monkeypatch.setitem(sys.modules, "megatron.bridge", types.ModuleType("megatron.bridge"))
    monkeypatch.setitem(sys.modules, module.__name__, module)
    assert visual_inputs_class() is GenericVisualInputs


def unpack_rows(out):
    """The conversations of a ``step="vlm"`` row as Bridge's Qwen-VL models cut them for their
    position rule (``unpack_mcore_thd_tensor_for_position_ids`` at ``BRIDGE_COMMIT``): from each
    padded start, the real length; a keep mask over the rest."""
    ids, real, padded = out["input_ids"][0], out["cu_seqlens_q"], out["cu_seqlens_q_padded"]
    lengths = (real[1:] - real[:-1]).tolist()
    starts = padded[:-1].tolist()
    rows = torch.zeros(len(lengths), max(lengths), dtype=ids.dtype)
    mask = torch.zeros(rows.shape, dtype=torch.bool)
    for i, (start, n) in enumerate(zip(starts, lengths)):
        rows[i, :n], mask[i, :n] = ids[start : start + n], True
    return rows, mask, starts, lengths


@needs_bridge
@pytest.mark.energon
def test_bridges_qwen_vl_position_rules_equal_the_loaders(mrope_packs):
    """Bridge's Qwen3-VL rule (its own ``get_rope_index``) and its Qwen2.5-VL rule
    (transformers' ``Qwen2_5_VLModel.get_rope_index``, which Bridge binds) on the conversations
    ``step="vlm"`` declares give the loader's mRoPE positions on every real token."""
    transformers_qwen = pytest.importorskip("transformers.models.qwen2_5_vl.modeling_qwen2_5_vl")
    qwen3 = bridge_module("models/qwen_vl/modelling_qwen3_vl/utils.py").get_rope_index
    model = types.SimpleNamespace(
        config=types.SimpleNamespace(
            vision_config=types.SimpleNamespace(spatial_merge_size=2, tokens_per_second=2)
        )
    )
    cls = transformers_qwen.Qwen2_5_VLModel
    model.get_vision_position_ids = types.MethodType(cls.get_vision_position_ids, model)
    qwen25 = types.MethodType(cls.get_rope_index, model)
    te, batches = mrope_packs
    special = te.tokenizer.special
    checked = off = 0
    for batch in batches:
        out = to_megatron_bridge(batch, step="vlm")
        grids = out["visual_inputs"].image_grid_thw
        rows, mask, starts, lengths = unpack_rows(out)
        ours = batch["position_ids"].reshape(3, -1)
        want = torch.zeros(3, *rows.shape, dtype=torch.int64)  # [3, conversations, length]
        for i, (start, n) in enumerate(zip(starts, lengths)):
            want[:, i, :n] = ours[:, start : start + n]
        keep = mask.expand(3, -1, -1)
        got3, _ = qwen3(
            2, special.image_pad, -1, special.vision_start, rows, grids, None, mask.long()
        )
        got25, _ = qwen25(rows, (rows == special.image_pad).int(), grids, None, attention_mask=mask)
        for got in (got3, got25):
            assert torch.equal(got[keep], want[keep])
        checked += int(mask.sum())
        # 0.3.1's Qwen2.5-VL model runs the rule over the whole row (no boundaries): off
        ids = out["input_ids"]
        whole, _ = qwen25(ids, (ids == special.image_pad).int(), grids, None)
        off = max(off, int((whole[:, 0] - ours).abs().max()))
    assert checked > 5000
    assert off > 100  # the positions of a row's later conversations run on


@needs_bridge
@pytest.mark.energon
def test_bridge_031_vlm_step_cannot_take_a_pack(mrope_packs):
    """0.3.1's VLM step ignores ``cu_seqlens`` and, with ``pack_sequences_in_batch``, cuts each
    row at its last non-pad token into ONE sequence: a pack's conversations would see each
    other. Its own ``pack_batch_sequences`` on a loader pack shows it."""
    repack = bridge_function("training/vlm_step.py", "pack_batch_sequences")
    _, batches = mrope_packs
    batch = batches[0]
    out = to_megatron_bridge(batch, step="sft")
    ids = out["tokens"]
    *_, cu_seqlens, _ = repack(
        ids, out["labels"], out["loss_mask"], None, out["position_ids"], pad_token_id=0
    )
    last = int((ids[0] != 0).nonzero().max()) + 1
    assert cu_seqlens.tolist() == [0, last]  # one sequence
    assert len(batch["source_ids"][0]) >= 2  # where the pack holds several conversations


def test_steps_and_empty_batches():
    with pytest.raises(ValueError, match="step='gpt' is not valid; choose one of sft, vlm"):
        to_megatron_bridge(design_note_batch(), step="gpt")
    from energon_packing.schema import empty_batch

    assert to_megatron_bridge(empty_batch(36), step="sft") is None
    assert len(BRIDGE_COMMIT) == 40
