"""A model is packed for what it is, not for its processor's class, and a model whose layers carry
state along the row is refused, naming the layer type (loader side and ``to_hf``).

Qwen3.5 ships Qwen3-VL's processor: its ids and positions are Qwen3-VL's, but 3 of 4 of its text
layers are Gated DeltaNet. The test that shows why it is refused packs it anyway and measures
every conversation after a pack's first differing from itself alone.
"""

from __future__ import annotations

import json

import pytest
import torch
from helpers import loader_batches, make_dataset

from energon_packing import PackingTaskEncoder
from energon_packing.encoding.models import (
    ModelInfo,
    StatefulLayersError,
    model_info,
    model_info_for_type,
    read_model_info,
)
from energon_packing.testing.synth import conversations

pytest.importorskip("transformers")

from energon_packing.hf import to_hf
from energon_packing.testing import hf
from energon_packing.testing.families import build, make_tokenizer, save_published

#: model types whose text layers carry state (each names its layer kind in the refusal)
LINEAR = ("linear_attention", "mamba")  # transformers < 5.2x names Mamba layers "mamba"
STATEFUL_TYPES = {
    "qwen3_5": LINEAR,
    "qwen3_5_moe": LINEAR,
    "qwen3_next": LINEAR,
    "minicpmv4_6": LINEAR,
    "nemotron_h": LINEAR,
    "mamba": LINEAR,
    "mamba2": LINEAR,
    "falcon_mamba": LINEAR,
    "jamba": LINEAR,
    "bamba": LINEAR,
    "granitemoehybrid": LINEAR,
    "recurrent_gemma": ("linear_attention", "recurrent"),
    "zamba2": LINEAR,
    "falcon_h1": ("hybrid",),
    "lfm2": ("conv",),
    "lfm2_vl": ("conv",),
    "rwkv": ("recurrent",),
}
#: model types of the families packed exactly, and plain decoders
SEPARATE_TYPES = (
    "qwen2_vl",
    "qwen2_5_vl",
    "qwen3_vl",
    "qwen3_vl_moe",
    "gemma3",
    "idefics3",
    "smolvlm",
    "llava_onevision",
    "llama",
    "qwen2",
)


def _known(model_type: str) -> None:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    if model_type not in CONFIG_MAPPING_NAMES:
        pytest.skip(f"this transformers has no model type {model_type!r}")


@pytest.mark.parametrize("model_type", sorted(STATEFUL_TYPES))
def test_every_stateful_model_type_is_found_by_its_layers(model_type):
    _known(model_type)
    info = model_info_for_type(model_type)
    kinds = STATEFUL_TYPES[model_type]
    assert set(kinds) & set(info.stateful_layers), info
    with pytest.raises(StatefulLayersError, match=f"{model_type}.*({'|'.join(kinds)})"):
        PackingTaskEncoder(tokenizer="bundled", max_input_seq_length=64, model_type=model_type)


@pytest.mark.parametrize("model_type", SEPARATE_TYPES)
def test_attention_models_have_no_stateful_layers(model_type):
    _known(model_type)
    assert model_info_for_type(model_type).stateful_layers == {}


def test_layer_lists_under_every_name_transformers_used():
    """``layer_types``, ``layers_block_type``, Nemotron-H's pattern string, legacy names."""
    assert (
        model_info({"model_type": "x", "layer_types": ["full_attention"] * 2}).stateful_layers == {}
    )
    assert model_info(
        {"model_type": "x", "text_config": {"layers_block_type": ["mamba", "attention"]}}
    ).stateful_layers == {"mamba": 1}
    assert model_info(
        {"model_type": "nemotron_h", "hybrid_override_pattern": "M-M*-E"}
    ).stateful_layers == {"mamba": 2}
    info = model_info({"model_type": "x", "layer_types": ["full_attention", "new_kind"]})
    assert info.stateful_layers == {"new_kind": 1}  # unknown kinds are refused, not guessed
    assert "not known to keep conversations apart" in info.describe_stateful()
    assert model_info({"model_type": "mamba", "num_hidden_layers": 3}).layer_types == ("mamba",) * 3


def test_the_layer_reader_and_the_cost_reader_find_the_decoder_by_one_rule():
    """``text_config`` is the one reader of where a config nests its decoder: the layer types
    are read from a stub ``text_config`` (it names the decoder), the step cost's sizes from
    the first nested config that holds them, else the top level."""
    from energon_packing.encoding.costs import step_cost_model
    from energon_packing.encoding.models import text_config

    sizes = {"hidden_size": 64, "num_hidden_layers": 3}
    stub = {"model_type": "llama", "layer_types": ["full_attention"]}
    config = {"model_type": "x", **sizes, "text_config": stub, "llm_config": {"hidden_size": 32}}
    assert text_config(config) is stub
    assert text_config(config, holding="hidden_size") is config["llm_config"]
    assert text_config({"text_config": {}, "llm_config": stub}) is stub
    flat = {"model_type": "x", **sizes, "text_config": stub}
    assert text_config(flat, holding="hidden_size") is flat
    assert model_info(flat).layer_types == ("full_attention",)
    model = step_cost_model(flat)
    assert (model.hidden_size, model.num_layers) == (64, 3)
    nested = step_cost_model({"model_type": "x", "text_config": {**stub, **sizes}})
    assert (nested.hidden_size, nested.num_layers) == (64, 3)


@pytest.mark.processor_media
@pytest.mark.parametrize("family", ["qwen3_vl"])
def test_qwen3_5_is_refused_at_build_naming_its_layers(family):
    _known("qwen3_5")
    processor = build("qwen3_5", model=False)[0]
    assert type(processor).__name__ == "Qwen3VLProcessor"  # Qwen3-VL's own class
    with pytest.raises(
        StatefulLayersError,
        match=r"'qwen3_5' .*1 of 2 layers are linear_attention.*allow_stateful_layers=True",
    ):
        PackingTaskEncoder(max_input_seq_length=1024, processor=processor)
    for knobs in ({"allow_stateful_layers": True}, {"unpacked": True}):  # unpacked: one per row
        te = PackingTaskEncoder(max_input_seq_length=1024, processor=processor, **knobs)
        assert te.chat.family_name == "qwen3_vl"


@pytest.mark.processor_media
@pytest.mark.parametrize("family", ["qwen3_vl"])
def test_a_processor_class_that_serves_several_models_needs_the_model(family):
    processor = build("qwen3_vl", model=False)[0]
    del processor.model_info  # an in-memory processor that names no model
    with pytest.raises(ValueError, match=r"Qwen3VLProcessor serves several models.*qwen3_5"):
        PackingTaskEncoder(max_input_seq_length=1024, processor=processor)
    te = PackingTaskEncoder(max_input_seq_length=1024, processor=processor, model_type="qwen3_vl")
    assert te.chat.family_name == "qwen3_vl"
    with pytest.raises(StatefulLayersError, match="qwen3_5"):
        PackingTaskEncoder(max_input_seq_length=1024, processor=processor, model_type="qwen3_5")
    # a class that serves one model needs none
    single = build("qwen2_vl", model=False)[0]
    del single.model_info
    assert PackingTaskEncoder(max_input_seq_length=1024, processor=single).chat.family_name


@pytest.mark.processor_media
@pytest.mark.parametrize("family", ["gemma3"])
def test_a_model_of_another_family_is_refused_by_its_type(family):
    processor = build("gemma3", model=False)[0]
    processor.model_info = ModelInfo(model_type="t5gemma2", source="its config.json")
    with pytest.raises(ValueError, match=r"'t5gemma2' .*Gemma3Processor.*gemma3 family"):
        PackingTaskEncoder(max_input_seq_length=1024, processor=processor)
    with pytest.raises(ValueError, match=r"model_type='gemma3', but .* says .*'t5gemma2'"):
        PackingTaskEncoder(max_input_seq_length=1024, processor=processor, model_type="gemma3")


@pytest.mark.processor_media
@pytest.mark.parametrize("family", ["qwen3_vl"])
def test_the_model_directory_decides(family, tmp_path):
    """A published directory: its config.json names the model the processor class does not."""
    processor = build("qwen3_vl", model=False)[0]
    save_published(processor, tmp_path)
    assert read_model_info(tmp_path).model_type == "qwen3_vl"
    assert PackingTaskEncoder(max_input_seq_length=1024, processor=str(tmp_path)).chat.family
    for model_type, layers, accepted in (
        ("qwen3_vl_moe", ["full_attention"] * 2, True),
        ("qwen3_5", ["linear_attention", "full_attention"], False),
    ):
        text = {"layer_types": layers, "num_hidden_layers": len(layers)}
        config = {"model_type": model_type, "text_config": text}
        (tmp_path / "config.json").write_text(json.dumps(config))
        if accepted:
            te = PackingTaskEncoder(max_input_seq_length=1024, processor=str(tmp_path))
            assert te.chat.family_name == "qwen3_vl"
        else:
            with pytest.raises(StatefulLayersError, match=str(tmp_path / "config.json")):
                PackingTaskEncoder(max_input_seq_length=1024, processor=str(tmp_path))


def test_a_hybrid_text_model_is_refused_on_both_text_paths(tmp_path):
    tokenizer = make_tokenizer(
        extra=["<|im_start|>", "<|im_end|>"], eos="<|im_end|>", pad="<|im_end|>"
    )
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    tokenizer.save_pretrained(str(tmp_path))
    layers = ["linear_attention", "linear_attention", "linear_attention", "full_attention"]
    config = {"model_type": "qwen3_next", "layer_types": layers, "num_hidden_layers": 4}
    (tmp_path / "config.json").write_text(json.dumps(config))
    for path in ({"processor": str(tmp_path)}, {"tokenizer": str(tmp_path)}):
        with pytest.raises(StatefulLayersError, match=r"'qwen3_next' .*3 of 4 layers"):
            PackingTaskEncoder(max_input_seq_length=256, **path)


@pytest.fixture(scope="module")
def qwen3_5_batches(tmp_path_factory):
    """The loader's packs of 8 conversations for Qwen3.5 (accepted by the opt-in)."""
    _known("qwen3_5")
    processor, model, _ = build("qwen3_5")
    convs = list(conversations(8, seed=11))
    root = make_dataset(tmp_path_factory.mktemp("qwen3_5"), convs, per_shard=8)
    te = PackingTaskEncoder(
        max_input_seq_length=2048, processor=processor, pad_multiple=8, allow_stateful_layers=True
    )
    return model, list(loader_batches(root, te, buffer=8)), {c.key: c for c in convs}


@pytest.mark.energon
@pytest.mark.processor_media
@pytest.mark.parametrize("family", ["qwen3_vl"])
def test_to_hf_refuses_a_stateful_model(family, qwen3_5_batches):
    model, batches, _ = qwen3_5_batches
    with pytest.raises(StatefulLayersError, match=r"to_hf: model type 'qwen3_5'.*linear_attention"):
        to_hf(batches[0], model=model)
    with pytest.raises(StatefulLayersError, match="is on cpu: the CPU fallbacks"):
        to_hf(batches[0], model=model, allow_stateful_layers=True)
    with pytest.raises(StatefulLayersError, match="qwen3_5"):
        to_hf(batches[0], config=model.config)


@pytest.mark.slow
@pytest.mark.energon
@pytest.mark.processor_media
@pytest.mark.parametrize("family", ["qwen3_vl"])
def test_why_qwen3_5_is_refused_packed_conversations_leak(family, qwen3_5_batches):
    """Packed anyway, in the form transformers' padding-free path takes (``to_hf`` without a
    model: restarting positions, no mask): the first conversation of a pack equals itself
    through the processor alone, later ones do not."""
    from helpers import decode_image
    from test_families import _processor_call, images_in_order

    model, batches, by_key = qwen3_5_batches
    processor = build("qwen3_5", model=False)[0]
    batch = next(b for b in batches if len(b["source_ids"][0]) >= 3)
    inputs = to_hf(batch)  # no model named: the batch's own (Qwen3-VL) form
    logits = hf.run(model, {k: v for k, v in inputs.items() if k != "use_cache"})
    diffs = []
    for k, key in enumerate(inputs.source_ids):
        images = [decode_image(d) for d in images_in_order(by_key[key])]
        reference = _processor_call(processor, by_key[key], images)
        start = int(inputs.cu_seqlens_padded[k])
        n = int(inputs.cu_seqlens[k + 1] - inputs.cu_seqlens[k])
        assert torch.equal(inputs["input_ids"][0, start : start + n], reference["input_ids"][0])
        alone = hf.run(model, dict(reference))
        diffs.append(float((logits[start : start + n] - alone[:n]).abs().max()))
    assert diffs[0] <= 1e-5, diffs
    # the Gated DeltaNet state and conv window of the previous conversations (measured: up to
    # 0.04 on this pack)
    assert max(diffs[1:]) > 1e-2, diffs


def test_the_docs_family_table_is_the_registry():
    from helpers import REPO

    from energon_packing.encoding.families import FAMILIES, family_table

    page = (REPO / "docs" / "models.md").read_text()
    assert family_table() in page, "docs/models.md's family table differs from family_table()"
    assert all(f"| {f.name} |" in page for f in FAMILIES)
    from energon_packing.encoding.families import refused_table

    assert refused_table() in page, "docs/models.md's refused table differs from refused_table()"


def test_a_family_we_do_not_pack_is_refused_by_its_model_type():
    """A processor class no family declares (SigLIP's: an image-text encoder, no language
    model) is refused in one line naming the model type its config.json names, with the
    reason where the registry records one, or the model types its class serves."""
    from transformers import SiglipProcessor
    from transformers.models.siglip.image_processing_pil_siglip import SiglipImageProcessorPil

    from energon_packing.encoding.families import REFUSED

    tokenizer = make_tokenizer(extra=["<image>"], bos="<bos>", eos="<eos>", pad="<pad>")
    processor = SiglipProcessor(
        image_processor=SiglipImageProcessorPil(size={"height": 28, "width": 28}),
        tokenizer=tokenizer,
    )
    processor.model_info = ModelInfo(model_type="siglip", source="its config.json")
    with pytest.raises(ValueError, match=r"^model type 'siglip' \(SiglipProcessor\) is not") as e:
        PackingTaskEncoder(max_input_seq_length=256, processor=processor)
    assert "\n" not in str(e.value) and "known: qwen2_vl" in str(e.value)
    processor.model_info = ModelInfo(model_type="pixtral", source="its config.json")
    with pytest.raises(ValueError, match="no language model") as raised:
        PackingTaskEncoder(max_input_seq_length=256, processor=processor)
    assert REFUSED["pixtral"] in str(raised.value)
    processor.model_info = None  # no config.json: the model types its class serves are named
    with pytest.raises(ValueError, match=r"^model type 'siglip' \(SiglipProcessor\)"):
        PackingTaskEncoder(max_input_seq_length=256, processor=processor)


@pytest.mark.parametrize("model_type", ["pixtral"])
def test_to_hf_refuses_a_model_type_we_do_not_pack_in_one_line(model_type):
    """A refused model type never gets a pack through to_hf (text-only packs included): one
    line naming it and why."""
    import numpy as np
    from transformers import AutoConfig

    from energon_packing.encoding.families import REFUSED
    from energon_packing.encoding.hf_compat import transformers_version
    from energon_packing.schema import Source, collate, layout

    try:
        config = AutoConfig.for_model(model_type)
    except ValueError as e:  # a model type newer than the installed release
        pytest.skip(f"transformers {transformers_version()}: no {model_type!r} config ({e})"[:200])
    pack = layout(
        [Source(key="A", input_ids=np.arange(5), token_mask=np.ones(5, dtype=np.float32))],
        width=8,
        pad_multiple=4,
        pad_id=0,
    )
    with pytest.raises(ValueError) as raised:
        to_hf(collate([pack]), config=config)
    message = str(raised.value)
    assert message == f"to_hf: model type {model_type!r} is not packed: {REFUSED[model_type]}"
    assert "\n" not in message
