"""NeMo-RL drop-in: batches, task encoder and configs against NeMo-RL's acceptance rules.

NeMo-RL is not a dependency, so its rules are written down here as facts, each with the source
it was read from (NVIDIA-NeMo/RL; "idx" = the file's id in the public code index, "7ea279a" =
the repository snapshot at that commit). The same output was also run through NeMo-RL's own
code (its BatchedDataDict, data plane, prepacked consumer at CP 1 and 2, producer, packers and
config models) outside this repository; the closing note of issue 12 has the numbers.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from pathlib import Path

import pytest
import torch
import yaml
from helpers import SAMPLE_DATA, loader_batches

from energon_packing import PackingTaskEncoder
from energon_packing.nemo_rl import (
    NEMO_RL_MICRO_BATCH_INDICES,
    NEMO_RL_MICRO_BATCH_LENGTHS,
    PLUGIN_FILE,
    NemoRLTaskEncoder,
    to_nemo_rl,
)

pytestmark = pytest.mark.energon

C = 2048
REPO = Path(__file__).resolve().parents[1]

# --- facts (each: what NeMo-RL does, and where it says so) -----------------------------------

#: Data plane, local_batch_to_tensordict (nemo_rl/data_plane/adapters/local.py, idx 68535266981):
#: every field's batch size (tensor shape[0]; len() of a PackedTensor or sequence) must equal
#: B, else "Local field ... has batch size N, expected B". The SFT worker removes only these
#: keys before it (nemo_rl/data/energon/sft_worker.py, idx 68784499075):
WORKER_STRIPS = {"source_ids", "sample_keys"}
#: get_and_validate_seqlen (nemo_rl/models/megatron/data.py, idx 70877067287): every tensor of
#: 2+ dims must have dim 1 == the sequence length, except these packed multimodal fields
#: (PACKED_MULTIMODAL_FIELDS, nemo_rl/data/multimodal_utils.py, idx 59028067940):
PACKED_MULTIMODAL_FIELDS = {
    "pixel_values",
    "pixel_values_videos",
    "image_grid_thw",
    "video_grid_thw",
    "second_per_grid_ts",
    "input_features",
    "feature_attention_mask",
    "video_second_per_grid",
    "imgs_sizes",
    "num_frames",
}
#: The prepacked producer's keys (prepare_packed_sft_batch, nemo_rl/data/energon/multimodal/
#: packing.py, idx 65949684674, lines 225-237): these plus PackedTensor media and
#: token_type_ids / mm_token_type_ids; input_lengths is the pack width; the boundaries are
#: PackedTensor(list_of_1d_int32, dim_to_pack=0) with the last padded entry = capacity.
PRODUCER_KEYS = {
    "input_ids",
    "input_lengths",
    "token_mask",
    "sample_mask",
    "cu_seqlens",
    "cu_seqlens_padded",
}
#: The prepacked consumer requires input_lengths and sample_mask (process_microbatch asserts
#: input_lengths; process_global_batch asserts sample_mask; data.py idx 70877067287).
CONSUMER_REQUIRES = {"input_ids", "input_lengths", "sample_mask", "token_mask", "cu_seqlens"}
#: The SFT worker's extra info names for the microbatch shapes (data_plane/schema.py, 7ea279a).
EXTRA_INFO = {"micro_batch_indices", "micro_batch_lengths"}


def batch_size(value) -> int:
    return int(value.shape[0]) if isinstance(value, torch.Tensor) else len(value)


@pytest.mark.parametrize("mrope", [False, True])
def test_to_nemo_rl_meets_nemo_rls_acceptance_rules(mrope):
    te = PackingTaskEncoder(
        max_input_seq_length=C, tokenizer="bundled", pad_multiple=8, mrope=mrope
    )
    seen_images = seen_text_only = 0
    for batch in itertools.islice(loader_batches(SAMPLE_DATA, te, buffer=32, batch_size=2), 12):
        data, extras = to_nemo_rl(batch)
        rows = batch["input_ids"].shape[0]
        assert set(data) >= CONSUMER_REQUIRES and set(data) >= PRODUCER_KEYS
        for key, value in data.items():  # the data plane's row-count rule
            if key not in WORKER_STRIPS:
                assert batch_size(value) == rows, key
            if (
                isinstance(value, torch.Tensor)
                and value.ndim >= 2
                and key not in PACKED_MULTIMODAL_FIELDS
            ):
                assert value.shape[1] == C, key  # get_and_validate_seqlen
        assert "position_ids" not in data  # [3, B, C] would fail both rules; NeMo-RL rebuilds it
        assert data["input_lengths"].tolist() == [C] * rows
        for cu, padded in zip(data["cu_seqlens"], data["cu_seqlens_padded"]):
            assert cu.dtype == padded.dtype == torch.int32 and cu.ndim == 1
            assert int(padded[-1]) == C  # the tail folded into the last source
        if any(len(g) for g in batch["image_grid_thw"]):
            seen_images += 1
            assert {"pixel_values", "image_grid_thw"} <= set(data)
            assert all(batch_size(data[k]) == rows for k in ("pixel_values", "image_grid_thw"))
        else:
            seen_text_only += 1
            assert "pixel_values" not in data  # no pixel key when no pack has an image
        for key in ("source_ids", "packing_metrics", "packing_skipped", *EXTRA_INFO):
            assert key in extras and key not in data
        assert extras[NEMO_RL_MICRO_BATCH_INDICES] == [[[i, i + 1] for i in range(rows)]]
        assert extras[NEMO_RL_MICRO_BATCH_LENGTHS] == [[C] * rows]
        if mrope:
            assert extras["position_ids"].shape == (3, rows, C)
    assert seen_images


def test_text_only_batches_have_no_pixel_keys(tmp_path):
    from helpers import make_dataset

    from energon_packing.testing.synth import sized_conversations

    path = make_dataset(tmp_path, sized_conversations([200] * 8), per_shard=8)
    te = PackingTaskEncoder(max_input_seq_length=C, tokenizer="bundled")
    (batch,) = list(loader_batches(path, te, buffer=8))
    data, _ = to_nemo_rl(batch)
    assert not {"pixel_values", "image_grid_thw"} & set(data)
    assert data, "a batch to train on"
    empty, accounting = to_nemo_rl({**batch, "input_ids": batch["input_ids"][:0]})
    assert empty is None and "packing_skipped" in accounting


class ModifiedFirstFitDecreasingPacker:
    """Stands in for NeMo-RL's packer object: the loader passes get_packer(name, capacity)
    (nemo_rl/data/energon/sft_dataloader.py, idx 71533911171); only its class name,
    bin_capacity and max_sequences_per_bin are read."""

    def __init__(self, bin_capacity, max_sequences_per_bin=None):
        self.bin_capacity = bin_capacity
        self.max_sequences_per_bin = max_sequences_per_bin


class Adapter:
    """Stands in for NeMo-RL's HFMultimodalSFTProcessorAdapter (generic_sft.py, idx
    71236918275): it holds the processor as ``.processor``."""

    def __init__(self, processor):
        self.processor = processor


@pytest.fixture(scope="module")
def processor():
    pytest.importorskip("transformers")
    from energon_packing.testing.families import build

    return build("qwen2_vl")[0]


@pytest.mark.processor_media
def test_the_task_encoder_takes_nemo_rls_constructor_arguments(processor):
    # NeMo-RL's loader calls encoder(adapter=, cooker_functions=, include_source_ids=, packer=,
    # tokenizer=, sequence_length_pad_multiple=, only_unmask_final=, **task_encoder.options)
    # (sft_dataloader._task_encoder, idx 71533911171)
    te = NemoRLTaskEncoder(
        adapter=Adapter(processor),
        cooker_functions=[],
        include_source_ids=True,
        packer=ModifiedFirstFitDecreasingPacker(4096, max_sequences_per_bin=16),
        tokenizer=processor.tokenizer,
        sequence_length_pad_multiple=8,
        only_unmask_final=False,
    )
    config = te.config
    assert (config.algorithm, config.max_input_seq_length, config.pad_multiple) == (
        "modified_first_fit_decreasing",
        4096,
        8,
    )
    assert config.max_per_pack == 16 and config.train_on == "assistant_messages"
    assert te.chat.family_name == "qwen2_vl" and te.include_source_ids
    final = NemoRLTaskEncoder(
        adapter=Adapter(processor),
        cooker_functions=[],
        include_source_ids=False,
        packer=ModifiedFirstFitDecreasingPacker(4096),
        tokenizer=processor.tokenizer,
        only_unmask_final=True,
        algorithm="subset_fill",  # task_encoder.options win over the packer
        carry=True,
    )
    assert final.config.train_on == "last_assistant_message"
    assert final.config.algorithm == "subset_fill" and final.config.carry
    with pytest.raises(ValueError, match="unknown packing option"):
        NemoRLTaskEncoder(
            adapter=Adapter(processor), packer=ModifiedFirstFitDecreasingPacker(64), nope=1
        )
    with pytest.raises(ValueError, match="loss_mask_mode='precomputed' is not supported"):
        NemoRLTaskEncoder(
            adapter=Adapter(processor),
            packer=ModifiedFirstFitDecreasingPacker(64),
            loss_mask_mode="precomputed",
        )


@pytest.mark.processor_media
def test_the_task_encoder_yields_nemo_rls_batches(processor):
    te = NemoRLTaskEncoder(
        adapter=Adapter(processor),
        cooker_functions=[],
        include_source_ids=True,
        packer=ModifiedFirstFitDecreasingPacker(C),
        tokenizer=processor.tokenizer,
        sequence_length_pad_multiple=8,
    )
    for batch in itertools.islice(loader_batches(SAMPLE_DATA, te, buffer=32), 4):
        # a Mapping, not a dict: Energon adds no __restore_key__ (the data plane refuses it)
        assert isinstance(batch, Mapping) and not isinstance(batch, dict)
        assert "__restore_key__" not in batch and "packing_metrics" not in batch
        assert set(batch) >= PRODUCER_KEYS and "source_ids" in batch
        assert "mm_token_type_ids" in batch  # Qwen's per-token field rides along
        assert "packing_metrics" in batch.extras and "position_ids" in batch.extras


def test_assistant_messages_train_what_nemo_rls_producer_trains():
    """NeMo-RL's producer trains each assistant message as rendered: for ChatML the chunk
    "<|im_start|>assistant\\n{content}<|im_end|>\\n" (get_formatted_message_log +
    add_loss_mask_to_message_log, nemo_rl/data/llm_message_utils.py, 7ea279a), with the first
    token of every source set to 0 and the mask times the loss multiplier (packing.py lines
    162-173, idx 65949684674)."""
    from energon_packing.encoding.builtin import encode
    from energon_packing.encoding.tokenizer import ChatTokenizer

    tokenizer = ChatTokenizer("bundled")
    messages = [
        {"role": "user", "content": "Red?"},
        {"role": "assistant", "content": "Yes."},
        {"role": "user", "content": "Blue?"},
        {"role": "assistant", "content": "No."},
    ]
    from energon_packing.config import PackingConfig

    def trained(train_on):
        encoding = encode(
            key="k",
            messages=messages,
            image_names=[],
            images={},
            loss_weight=2.0,
            tokenizer=tokenizer,
            config=PackingConfig(max_input_seq_length=256, train_on=train_on),
        )
        runs, current = [], []
        for token, weight in zip(encoding.input_ids, encoding.token_mask):
            if weight:
                assert weight == 2.0
                current.append(token)
            elif current:
                runs.append(tokenizer.decode(current))
                current = []
        return runs + ([tokenizer.decode(current)] if current else [])

    assert trained("assistant_messages") == [
        "<|im_start|>assistant\nYes.<|im_end|>\n",
        "<|im_start|>assistant\nNo.<|im_end|>\n",
    ]
    assert trained("last_assistant_message") == ["<|im_start|>assistant\nNo.<|im_end|>\n"]
    assert trained("all_assistant") == ["Yes.<|im_end|>", "No.<|im_end|>"]


def load_yaml(name: str) -> dict:
    text = (REPO / "configs" / name).read_text()
    return yaml.safe_load(text.replace("${oc.env:ENERGON_PACKING_PLUGIN}", PLUGIN_FILE))


#: EnergonLoaderConfig fields of the #4105 layout (nemo_rl/data/energon/config.py, idx
#: 58212734074 plus the #4105 review hunk "@@ -65,8 +65,26 @@"); model_family is required.
LOADER_FIELDS_4105 = {
    "model_family",
    "num_workers",
    "shuffle_buffer_size",
    "max_samples_per_sequence",
    "packing_buffer_size",
    "batch_grouping",
    "processor_adapter",
    "topology_mapper",
    "task_encoder",
    "cookers",
    "seed_offset",
    "prefetch_factor",
    "checkpoint_every_sec",
    "watchdog_timeout_seconds",
}
#: #4108 adds these (idx 71209057483).
LOADER_FIELDS_4108 = LOADER_FIELDS_4105 | {
    "nvdataset_cache_dir",
    "cache_pool_max_gbytes",
    "cache_pool_num_workers",
    "gc_collect_every_n_steps",
}
MODEL_FAMILIES = {"qwen", "nemotron"}  # docs/guides/sft.md, idx 70534287758
#: PackingAlgorithm values setup_sft_v2 accepts (nemo_rl/data/packing/algorithms.py, 7ea279a,
#: plus #4105's knapsack packers)
NEMO_RL_ALGORITHMS = {
    "concatenative",
    "first_fit_decreasing",
    "first_fit_shuffle",
    "modified_first_fit_decreasing",
    "greedy_knapsack",
    "balanced_greedy_knapsack",
}


def check_sftv2_gate(config: dict, *, packed: bool) -> None:
    """setup_sft_v2's Energon checks, #4105 era (nemo_rl/algorithms/sft_v2.py, idx
    71471675275), transcribed as assertions with NeMo-RL's messages."""
    data, policy, sft = config["data"], config["policy"], config["sft"]
    assert data["backend"] == "energon", "SFTv2 requires data.backend=energon."
    assert policy["megatron_cfg"]["enabled"], "SFTv2 supports only the Megatron policy backend."
    packing = policy["sequence_packing"]
    if packed:
        assert packing["enabled"] and packing.get("fuse_loss"), (
            "Energon packing requires sequence_packing enabled with fuse_loss."
        )
        assert packing["algorithm"] in NEMO_RL_ALGORITHMS, (
            "Energon SFT requires a supported packing algorithm."
        )
        assert not policy["dynamic_batching"]["enabled"], (
            "Energon packing does not support dynamic batching."
        )
    assert not (sft["val_period"] or sft["val_at_start"] or sft["val_at_end"]), (
        "SFTv2 has no validation loop."
    )
    assert data.get("validation") is None, "SFTv2 reads no validation source."
    assert config["checkpointing"]["metric_name"].startswith("train:")
    assert data["max_input_seq_length"] % policy["make_sequence_length_divisible_by"] == 0
    cp = policy["megatron_cfg"].get("context_parallel_size", 1)
    assert policy["make_sequence_length_divisible_by"] % (2 * cp if cp > 1 else 1) == 0


def check_source(train: dict) -> None:
    # EnergonSourceConfig: path, split required (str); virtual_epoch_length > 0 to train
    assert isinstance(train["path"], str) and isinstance(train["split"], str)
    assert train["virtual_epoch_length"] > 0


def test_the_4105_config_passes_nemo_rls_models_and_gate():
    config = load_yaml("nemo_rl_sft.yaml")
    energon = config["data"]["energon"]
    assert set(energon) <= LOADER_FIELDS_4105 and energon["model_family"] in MODEL_FAMILIES
    assert isinstance(energon["packing_buffer_size"], int) and energon["packing_buffer_size"] >= 1
    assert "path" not in energon  # not a field: the source is data.train
    check_source(config["data"]["train"])
    check_sftv2_gate(config, packed=True)
    assert energon["task_encoder"]["name"] == "energon_packing"  # register()'s key
    from energon_packing.config import PackingConfig  # the options are knobs of ours

    options = energon["task_encoder"]["options"]
    PackingConfig.from_dict(
        {"max_input_seq_length": config["data"]["max_input_seq_length"], **options}
    )


def test_the_4108_config_passes_nemo_rls_models():
    config = load_yaml("nemo_rl_sft_4108.yaml")
    energon = config["data"]["energon"]
    assert set(energon) <= LOADER_FIELDS_4108 and energon["model_family"] in MODEL_FAMILIES
    assert energon["packing_buffer_size"] is None  # #4108 refuses any int
    encoder = energon["task_encoder"]
    # file-backed: python_file absolute and a .py, object named, not a registry name
    # (EnergonTaskEncoderConfig and registry.py, idx 71209057483 / 71326852925)
    assert "name" not in encoder and Path(encoder["python_file"]).is_absolute()
    assert encoder["python_file"].endswith(".py") and Path(encoder["python_file"]).is_file()
    assert encoder["object"] == "EnergonPackingSFTTaskEncoder"
    assert f"class {encoder['object']}(" in Path(encoder["python_file"]).read_text()
    packing = encoder["packing"]  # EnergonPackingConfig, extra="forbid" options
    assert set(packing) == {"name", "buffer_size", "options"} and packing["buffer_size"] >= 1
    assert set(packing["options"]) <= {
        "max_sequence_length",
        "sequence_length_pad_multiple",
        "balanced_knapsack_delta",
    }
    capacity = packing["options"]["max_sequence_length"]
    assert capacity == config["data"]["max_input_seq_length"]  # "Energon pack capacity must match"
    assert capacity % packing["options"]["sequence_length_pad_multiple"] == 0
    check_source(config["data"]["train"])
    from energon_packing.config import PackingConfig

    PackingConfig.from_dict({"max_input_seq_length": capacity, **encoder["options"]})


def test_the_plugin_needs_nemo_rl_and_says_so():
    import importlib

    try:
        importlib.import_module("nemo_rl")
    except ImportError:
        with pytest.raises(ImportError, match="nemo_rl"):
            importlib.import_module("energon_packing.nemo_rl.plugin")
    else:  # pragma: no cover - NeMo-RL installed
        plugin = importlib.import_module("energon_packing.nemo_rl.plugin")
        assert issubclass(plugin.EnergonPackingSFTTaskEncoder, NemoRLTaskEncoder)
