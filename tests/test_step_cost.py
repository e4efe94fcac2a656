"""The whole model's step cost (issue 34 item 1): the vision encoder priced from a pack's own
grids and the model's config, counted here by hand; the sizes read from configs; balanced
emission over an image-heavy mix at 32 ranks within the issue's targets."""

from __future__ import annotations

import copy
import io

import numpy as np
import pytest

from energon_packing.encoding.costs import (
    cost_model_for,
    grids_from_tokens,
    step_cost_model,
    vision_tower,
)
from energon_packing.packing.balance import StepCostModel, VisionTower
from energon_packing.testing.configs import QWEN2_5_VL_7B, QWEN2_VL_7B
from energon_packing.testing.ranks import simulate_ranks, split_ranks

# ---- the vision encoder, counted by hand -----------------------------------------------------


def test_a_qwen2_vl_encoder_costs_what_its_grids_count_by_hand():
    """Qwen2-VL: plain MLP (fc1/fc2), every layer full attention within each temporal slice."""
    tower = VisionTower(
        depth=2,
        hidden_size=8,
        intermediate_size=32,
        out_hidden_size=16,
        patch_size=14,
        temporal_patch_size=2,
        spatial_merge_size=2,
    )
    model = StepCostModel(hidden_size=4, num_layers=1, vision=tower)
    image, video = (1, 4, 6), (3, 2, 4)  # 24 patches in 1 slice; 24 patches in 3 slices of 8
    # image: patch embedding 2 * 24 patches * (3 channels * 2 frames * 14 * 14) * 8
    embed = 2 * 24 * (3 * 2 * 14 * 14) * 8  # 451,584
    # per layer: 2 * 24 * (QKV + output 4*8*8 + fc1, fc2 2*8*32), two layers
    linear = 2 * (2 * 24 * (4 * 8 * 8 + 2 * 8 * 32))  # 73,728
    # per layer: QK^T and PV, 2*S*S*d each, over one sequence of 24 patches
    attention = 2 * (4 * 8 * 24 * 24)  # 36,864
    # merger: 24/4 = 6 tokens through Linear(32, 32) and Linear(32, 16)
    merger = 2 * 6 * (32 * 32 + 32 * 16)  # 18,432
    image_forward = embed + linear + attention + merger
    assert image_forward == 580_608
    # video: as the image but attention over 3 slices of 2*4 = 8 patches
    video_forward = embed + linear + 2 * (4 * 8 * 3 * 8 * 8) + merger
    assert tower.grid_flops(image) == image_forward
    assert tower.grid_flops(video) == video_forward
    cost = model.pack_cost([40, 30], capacity=80, grids=[image, video])
    assert cost.vision == 3 * (image_forward + video_forward)  # trained: forward + backward
    assert cost.total == model.pack_flops([40, 30], capacity=80, grids=[image, video])
    frozen = StepCostModel(hidden_size=4, num_layers=1, vision=tower, train_vision=False)
    assert frozen.vision_flops([image]) == image_forward


def test_a_qwen2_5_vl_encoder_counts_its_windows_by_hand():
    """Qwen2.5-VL: gated MLP, windows of 4x4 merged tokens in all layers but the full ones."""
    tower = VisionTower(
        depth=4,
        hidden_size=8,
        intermediate_size=12,
        gated_mlp=True,
        out_hidden_size=16,
        window_size=4,  # 112 px / 14 px / merge 2
        full_attention_layers=(3,),
    )
    grid = (2, 12, 20)  # 2 slices of 12 x 20 patches = 6 x 10 merged tokens; 480 patches
    # windows of a slice: rows of 4 and 2 merged tokens, columns of 4, 4 and 2; a window of
    # r x c merged tokens holds r*c*4 patches
    windows = [4 * 4 * 4, 4 * 4 * 4, 4 * 2 * 4, 2 * 4 * 4, 2 * 4 * 4, 2 * 2 * 4]
    assert sum(windows) == 240  # every patch of the slice in one window
    window_squares = 2 * sum(n * n for n in windows)  # two slices: 2 * 11,520
    full_squares = 2 * 240 * 240  # two slices of 240 patches
    embed = 2 * 480 * (3 * 2 * 14 * 14) * 8
    linear = 4 * (2 * 480 * (4 * 8 * 8 + 3 * 8 * 12))  # gate, up, down: 3 matrices
    attention = 4 * 8 * (1 * full_squares + 3 * window_squares)  # 1 full layer, 3 windowed
    merger = 2 * (480 // 4) * (32 * 32 + 32 * 16)
    assert tower.grid_flops(grid) == embed + linear + attention + merger == 17_387_520


FIELDS = dict(
    depth=2,
    hidden_size=8,
    intermediate_size=8,
    out_hidden_size=8,
    window_size=4,
    full_attention_layers=(1,),
)


def test_windows_are_the_ones_transformers_attends_within():
    """The sum of squared window lengths equals the one of transformers' own window index
    (``cu_window_seqlens``) for grids whose sides are and are not multiples of a window."""
    torch = pytest.importorskip("torch")
    vision_utils = pytest.importorskip("transformers.vision_utils")
    tower = VisionTower(**FIELDS)
    for grid in [(1, 8, 8), (1, 12, 20), (2, 6, 30), (3, 34, 18), (1, 2, 2)]:
        _, cu = vision_utils.get_vision_window_index(
            torch.tensor([grid]), spatial_merge_size=2, window_size=112, patch_size=14
        )
        lengths = torch.diff(cu.to(torch.int64))  # empty padding windows: 0, squared 0
        assert tower.window_squares(grid) == int((lengths**2).sum()), grid
    assert VisionTower(**{**FIELDS, "window_size": 0}).window_squares((1, 8, 8)) == 0


# ---- sizes from configs ------------------------------------------------------------------------


def test_the_sizes_come_from_the_published_configs():
    qwen2 = step_cost_model(QWEN2_VL_7B)
    assert (qwen2.hidden_size, qwen2.num_layers, qwen2.ffn_hidden_size) == (3584, 28, 18944)
    assert (qwen2.attention_size, qwen2.kv_size, qwen2.vocab_size) == (3584, 512, 152064)
    tower = qwen2.vision
    assert (tower.depth, tower.hidden_size, tower.intermediate_size) == (32, 1280, 5120)
    assert (tower.out_hidden_size, tower.gated_mlp, tower.window_size) == (3584, False, 0)
    # the numbers: an LLM image token (4 patches) ~5 GFLOPs forward, a decoder
    # token ~14 GFLOPs
    assert 5.0e9 < tower.grid_flops((1, 2, 2)) < 5.3e9
    assert 13.9e9 < qwen2.linear_flops(1) / 3 < 14.3e9
    qwen25 = step_cost_model(QWEN2_5_VL_7B).vision
    assert (qwen25.hidden_size, qwen25.intermediate_size, qwen25.gated_mlp) == (1280, 3420, True)
    assert (qwen25.window_size, qwen25.full_attention_layers) == (4, (7, 15, 23, 31))
    assert qwen25.windowed_layers == 28


@pytest.mark.parametrize(
    "family", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen2_5_omni", "qwen3_omni"]
)
def test_transformers_configs_are_read_as_the_model_builds_itself(family):
    """A ``transformers`` config object: the tower's depth, width and MLP width are those of
    the modules the model builds (counted from its parameters); the Omni thinkers' too."""
    pytest.importorskip("transformers")
    from energon_packing.testing.families import build

    _, model, _ = build(family)
    cost = step_cost_model(model.config)
    visual = getattr(model, "visual", None) or model.model.visual  # the Omni thinkers: own
    blocks = visual.blocks
    tower = cost.vision
    assert tower.depth == len(blocks)
    mlp = [m for m in blocks[0].mlp.modules() if type(m).__name__ == "Linear"]
    assert tower.hidden_size == mlp[0].in_features
    assert tower.intermediate_size == mlp[0].out_features
    assert tower.gated_mlp == (len(mlp) == 3)
    mergers = 1 + len(getattr(visual, "deepstack_merger_list", ()))
    assert tower.mergers == mergers
    text = model.config.get_text_config()
    assert (cost.hidden_size, cost.num_layers) == (text.hidden_size, text.num_hidden_layers)
    assert cost.source  # read, not the defaults


@pytest.mark.parametrize("name", ["Qwen2_5OmniConfig", "Qwen3OmniMoeConfig"])
def test_an_omni_config_is_priced_by_its_thinker(name):
    """An Omni model's ``config.json`` nests its text and vision configs in ``thinker_config``
    (beside the talker): they are read there, not replaced by the 7B defaults."""
    transformers = pytest.importorskip("transformers")

    config = getattr(transformers, name)()
    thinker = config.thinker_config
    cost = step_cost_model(config.to_dict())
    text, vision = thinker.text_config, thinker.vision_config
    assert (cost.hidden_size, cost.num_layers) == (text.hidden_size, text.num_hidden_layers)
    experts = getattr(text, "num_experts_per_tok", None)
    mlp = experts * text.moe_intermediate_size if experts else text.intermediate_size
    assert cost.ffn_hidden_size == mlp
    assert cost.vision.depth == vision.depth and cost.vision.patch_size == vision.patch_size
    assert cost.vision.intermediate_size == vision.intermediate_size
    assert cost.vision.out_hidden_size == vision.out_hidden_size
    assert (
        cost.source
        and step_cost_model(thinker.to_dict()).describe().split(" (")[0]
        == (cost.describe().split(" (")[0])
    )


def test_a_model_directory_decides_the_sizes_and_nothing_named_keeps_the_defaults(tmp_path):
    import json

    (tmp_path / "config.json").write_text(json.dumps(QWEN2_5_VL_7B))
    found = cost_model_for(str(tmp_path))
    assert found.known and found.hidden_size == 3584 and found.vision.gated_mlp
    unknown = cost_model_for("bundled")
    assert not unknown.known and unknown.hidden_size == 4096  # said so in its description
    assert "defaults: no model named" in unknown.describe()
    with pytest.raises(ValueError, match="no decoder size"):
        step_cost_model({"model_type": "x", "vision_config": {}})
    assert vision_tower({"model_type": "gemma3", "vision_config": {"hidden_size": 8}}) is None


def test_image_tokens_imply_a_grid_of_the_same_patches():
    ids = [5, 7, 7, 7, 7, 7, 7, 9, 8, 7, 7, 7, 7, 9, 7]
    assert grids_from_tokens(ids, token_id=7, merge_size=2) == [(1, 4, 6), (1, 4, 4), (1, 2, 2)]


# ---- through the task encoder ------------------------------------------------------------------


def _png(width: int, height: int) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (width % 256, 40, 90)).save(buffer, format="PNG")
    return buffer.getvalue()


def _pictured(key: str, width: int, height: int):
    from helpers import conversation_sample

    document = {
        "messages": [
            {"role": "user", "content": "<image>What is it?"},
            {"role": "assistant", "content": "A picture."},
        ],
        "images": ["img.png"],
    }
    return conversation_sample(key, document, {"img.png": _png(width, height)})


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl"])
@pytest.mark.processor_media
def test_a_packs_encoder_cost_is_its_grids_counted_by_hand(family):
    """Through a family's processor: the pack's ``image_grid_thw`` is what the images' sizes
    give, its modelled vision cost is those grids' FLOPs by hand, and balanced emission
    (selection time, from the image tokens) prices the same patches."""
    pytest.importorskip("transformers")
    from energon_packing import PackingTaskEncoder
    from energon_packing.testing.families import build

    processor, model, _ = build(family)
    te = PackingTaskEncoder(processor=processor, max_input_seq_length=512)
    te.cost_model = step_cost_model(model.config)
    encoded = [te.encode_sample(_pictured("a", 56, 84)), te.encode_sample(_pictured("b", 112, 56))]
    pack = te.pack_selected_samples(encoded).pack
    assert pack.media["image_grid_thw"].tolist() == [[1, 6, 4], [1, 4, 8]]  # (t, h, w) patches
    d, m = 32, 2  # both tiny towers: width 32, merge 2 (testing.families)
    if family == "qwen2_vl":  # 1 layer, MLP 64 wide (mlp_ratio 2), merger out 64, all full
        per_patch = 2 * (3 * 2 * 14 * 14) * d + 1 * 2 * (4 * d * d + 2 * d * 64)
        merger = 2 * (d * m * m * d * m * m + d * m * m * 64)  # per merged token
        attention = 1 * 4 * d * (24 * 24 + 32 * 32)
    else:  # 2 layers, gated MLP 64 wide, out 64; layer 0 in windows of 56/14/2 = 2 merged
        per_patch = 2 * (3 * 2 * 14 * 14) * d + 2 * 2 * (4 * d * d + 3 * d * 64)
        merger = 2 * (d * m * m * d * m * m + d * m * m * 64)
        # image a: 3 x 2 merged -> windows 2x2 and 1x2 merged = 16 and 8 patches;
        # image b: 2 x 4 merged -> windows 2x2, 2x2 = 16 and 16 patches
        windowed = 16**2 + 8**2 + 16**2 + 16**2
        attention = 4 * d * (24 * 24 + 32 * 32) + 4 * d * windowed
    hand = 3 * (per_patch * (24 + 32) + merger * (6 + 8) + attention)
    assert te.emitted_cost(pack).vision == hand
    selected = te.pack_cost(encoded) - te.cost_model.pack_flops(
        [s.length for s in encoded], capacity=512
    )
    if family == "qwen2_vl":  # no windows: the tokens tell the cost exactly
        assert selected == hand
    else:  # windows from a near-square guess of each image's shape: within 1 % of the tower
        assert abs(selected - hand) < 0.01 * hand
    metrics = te.stats.metrics()
    assert metrics["packing/cost/vision_tflops"] == pytest.approx(hand / 1e12)
    assert metrics["packing/cost/vision_share_max"] == pytest.approx(
        hand / te.emitted_cost(pack).total
    )


@pytest.mark.parametrize(
    "family", ["gemma3", "paligemma", "llava", "aya_vision", "idefics3", "smolvlm", "ovis2"]
)
@pytest.mark.processor_media
def test_a_fixed_square_tower_prices_each_image_at_selection_as_at_emission(family):
    """Through the family's processor and the real pack layout: each image is one square
    through the tower (Idefics3: each of its tiles and its global image, ``pixel_values``'
    real crops), 3 x its forward (backward included), at selection (from the encoded ids) as
    at emission (from the laid-out pack's ids)."""
    pytest.importorskip("transformers")
    from energon_packing import PackingTaskEncoder
    from energon_packing.encoding import hf_compat
    from energon_packing.testing.families import build

    if hf_compat.broken_forward(family):  # PaliGemma on 5.9-5.23: refused (test_paligemma)
        pytest.skip(f"refused here: {hf_compat.broken_forward(family)}")
    processor, model, _ = build(family)
    config = copy.deepcopy(model.config)
    config.vision_config.vision_use_head = False  # as published checkpoints run SigLIP
    te = PackingTaskEncoder(processor=processor, max_input_seq_length=2048)
    te.cost_model = step_cost_model(config)
    tower = te.cost_model.vision
    encoded = [te.encode_sample(_pictured(k, 40 + 8 * n, 30)) for n, k in enumerate("abc")]
    pack = te.pack_selected_samples(encoded).pack
    side = tower.tile_size
    squares = 3
    if family in ("aya_vision", "ovis2"):  # its crops and whole images, a tile each
        squares = len(pack.media["pixel_values"])
        assert squares > 3
    if family in ("idefics3", "smolvlm"):  # its crops: the pixel_values not padding
        pixels = np.asarray(pack.media["pixel_values"])
        squares = int((np.abs(pixels).reshape(*pixels.shape[:2], -1).sum(-1) > 0).sum())
        assert squares > 3
    hand = 3 * squares * tower.grid_flops((1, side, side))
    assert te.emitted_cost(pack).vision == hand
    lengths = [s.length for s in encoded]
    assert te.pack_cost(encoded) - te.cost_model.pack_flops(lengths, capacity=2048) == hand


# ---- the audio encoder ------------------------------------------------------------------------


def _audio_encoder(model):
    return next(m for m in model.modules() if type(m).__name__.endswith("AudioEncoder"))


def _audio_helpers():
    """transformers' Omni modeling modules, where they expose the audio encoders' chunking and
    windows as functions of their own (5.12 and later; before, the encoders compute them inside
    their forward, with a dense attention mask the FLOP counter would count): else skip."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.qwen2_5_omni import modeling_qwen2_5_omni as q25
    from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe as q3

    names = ("get_audio_cu_seqlens", "chunk_and_pad_features")
    if not all(hasattr(m, n) for m in (q25, q3) for n in names):
        pytest.skip(
            f"transformers {transformers.__version__}: the Omni audio encoders' windows are "
            f"computed inside their forward (module-level cu_seqlens since 5.12)"
        )
    return q25, q3


@pytest.mark.parametrize("family", ["qwen2_5_omni", "qwen3_omni"])
def test_an_audio_encoder_costs_what_torch_counts_in_its_forward(family):
    """The Omni thinkers' audio encoders, run on clips of a part of a chunk to many chunks:
    their convolutions and matrix products as torch's ``FlopCounterMode`` counts them in the
    encoder's own forward equal :meth:`AudioTower.clip_flops` less its attention (which the
    counter does not see in the encoder's attention path), ``4 d sum(S**2)`` per layer."""
    _audio_helpers()
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from energon_packing.encoding.costs import audio_tower
    from energon_packing.testing.families import build

    _, model, _ = build(family)
    encoder = _audio_encoder(model)
    tower = audio_tower(model.config)
    assert tower is not None and tower.depth == len(encoder.layers)
    assert tower.hidden_size == encoder.layers[0].fc1.in_features
    assert tower.intermediate_size == encoder.layers[0].fc1.out_features
    for frames in (37, 100, 200, 1000, 1637):
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            encoder(
                input_features=torch.randn(tower.mel_bins, frames),
                feature_lens=torch.tensor([frames]),
                aftercnn_lens=torch.tensor([(frames - 1) // 2 + 1]),  # Qwen2.5-Omni's
            )
        attention = tower.depth * 4 * tower.hidden_size * sum(s * s for s in tower.windows(frames))
        assert counter.get_total_flops() == tower.clip_flops(frames) - attention, frames


def test_audio_windows_are_the_ones_transformers_attends_within():
    """The attention windows of a clip: transformers' own ``cu_seqlens`` (Qwen2.5-Omni: one a
    chunk; Qwen3-Omni: ``n_window_infer / 2 n_window`` chunks, at the published 800 / 50)."""
    q25, q3 = _audio_helpers()
    import torch

    from energon_packing.packing.audio_tower import AudioTower

    sizes = dict(depth=1, hidden_size=8, intermediate_size=8, out_hidden_size=8)
    qwen25 = AudioTower(**sizes, chunk_frames=200)
    qwen3 = AudioTower(**sizes, chunk_frames=100, downsample_hidden_size=4, window_chunks=8)
    for frames in (37, 100, 199, 200, 801, 1637, 3000, 12345):
        lens = torch.tensor([frames])
        cu = q25.get_audio_cu_seqlens(torch.tensor(qwen25.chunks(frames)))
        assert qwen25.windows(frames) == torch.diff(cu).tolist(), frames
        _, chunks = q3.chunk_and_pad_features(torch.zeros(128, frames), lens, 50)
        assert chunks.tolist() == qwen3.chunks(frames)
        cu = q3.get_audio_cu_seqlens(chunks, lens, 800, 50)
        assert qwen3.windows(frames) == torch.diff(cu).tolist(), frames


@pytest.mark.processor_media
def test_a_packs_audio_cost_is_its_clips_frames_priced():
    """Through Qwen2.5-Omni's processor: balanced emission prices a group by its clips' mel
    frames known at encode time (from their samples), and the emitted pack by its own
    ``feature_attention_mask``: the same frames, ``3 x clip_flops`` each; the stats sum it."""
    pytest.importorskip("transformers")
    from helpers import conversation_sample, require_processor_media

    require_processor_media("qwen2_5_omni")

    from energon_packing import PackingTaskEncoder
    from energon_packing.testing.audio import clip
    from energon_packing.testing.families import build

    processor, model, _ = build("qwen2_5_omni")
    te = PackingTaskEncoder(processor=processor, max_input_seq_length=1024)
    te.cost_model = step_cost_model(model.config)
    tower = te.cost_model.audio
    assert tower is not None
    seconds = {"a": 1.37, "b": 2.9}
    encoded = []
    for key, length in seconds.items():
        document = {
            "messages": [
                {"role": "user", "content": [{"type": "audio", "audio": "c.wav"}]},
                {"role": "assistant", "content": "A tone."},
            ],
            "audios": ["c.wav"],
        }
        parts = {"c.wav": clip("wav", seconds=length)}
        encoded.append(te.encode_sample(conversation_sample(key, document, parts)))
    frames = [-(-round(s * 16000) // 160) for s in seconds.values()]  # hop 160 at 16 kHz
    assert [s.audio_frames for s in encoded] == [[n] for n in frames]
    hand = 3 * sum(tower.clip_flops(n) for n in frames)
    lengths = [s.length for s in encoded]
    assert te.pack_cost(encoded) - te.cost_model.pack_flops(lengths, capacity=1024) == hand
    pack = te.pack_selected_samples(encoded).pack
    assert te.emitted_cost(pack).audio == hand
    assert te.stats.metrics()["packing/cost/audio_tflops"] == pytest.approx(hand / 1e12)


# ---- balance over an image-heavy mix ---------------------------------------------------------


def image_heavy(n: int, capacity: int, seed: int) -> list[tuple[int, tuple]]:
    """Small image-heavy mix: 0-4 images per conversation at their own resolution (Qwen2-VL's
    resize: 28-px multiples, at most 1280 tokens), text lognormal around 160 tokens."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        text = int(np.clip(rng.lognormal(np.log(160), 1.0), 16, capacity // 4))
        grids = []
        for _ in range(int(rng.choice([0, 1, 1, 1, 2, 2, 3, 4]))):
            side = float(np.clip(rng.lognormal(np.log(700), 0.6), 64, 4096))
            aspect = float(np.exp(rng.normal(0, 0.35)))
            h, w = side / np.sqrt(aspect), side * np.sqrt(aspect)
            scale = min(1.0, np.sqrt(1280 * 784 / (h * w)))
            grids.append((1, max(2, int(h * scale / 28)) * 2, max(2, int(w * scale / 28)) * 2))
        tokens = [t * h * w // 4 + 2 for t, h, w in grids]
        while grids and text + sum(tokens) > capacity:
            grids.pop()
            tokens.pop()
        out.append((min(capacity, -(-(text + sum(tokens)) // 8) * 8), tuple(grids)))
    return out


def test_32_ranks_balance_the_whole_model_on_an_image_heavy_mix():
    """Qwen2-VL-7B at C=4096 over 32 ranks: the whole model's step cost (vision encoder
    included) within mean 1.03 / p95 1.06 of max/mean; packs within +0.5 % of the bound; the
    vision spread itself narrows against emission in selection order."""
    capacity, world = 4096, 32
    model = step_cost_model(QWEN2_VL_7B)
    conversations = image_heavy(world * 120, capacity, seed=5)
    per_rank = split_ranks(conversations, world)
    steps = 2 * sum(n for n, _ in conversations) // capacity // world
    spreads = {}
    for window in (0, 64):
        run = simulate_ranks(
            per_rank,
            capacity=capacity,
            buffer_size=128,
            balance_window=window,
            steps=steps,
            cost_model=model,
        )
        assert run.counts == [steps] * world
        for part in ("total", "vision"):
            costs = run.step_costs(model, part=part)
            ratios = costs.max(axis=1) / costs.mean(axis=1)
            spreads[window, part] = (ratios.mean(), np.percentile(ratios, 95))
        assert sum(run.counts) <= 1.005 * run.bound()
    mean, p95 = spreads[64, "total"]
    assert mean <= 1.03 and p95 <= 1.06, spreads
    assert spreads[0, "total"][0] > 1.03  # the mix is one that needs balancing
    assert spreads[64, "vision"][0] - 1 < 0.5 * (spreads[0, "vision"][0] - 1), spreads


def test_stats_reports_each_packs_cost_by_component():
    """``energon-packing stats``'s cost line: the mean over packs of each component, whose
    vision part is the encoder over every grid once (the packs hold every conversation)."""
    from energon_packing.tools.report import Measured, format_pack_costs

    model = step_cost_model(QWEN2_VL_7B)
    grids = [[(1, 20, 30)], [], [(1, 40, 40), (4, 16, 16)], [(1, 8, 8)]]
    lengths = [200, 700, 900, 40]
    measured = Measured(
        keys=list("abcd"), costs=lengths, lengths=lengths, skipped={}, capacity=1024, grids=grids
    )
    line = format_pack_costs(measured, model, buffer=8)
    packs = 2  # 1,840 tokens in packs of 1,024
    vision = model.vision_flops([g for conversation in grids for g in conversation])
    assert f"vision {vision / packs / 1e12:,.1f} " in line
    assert f"decoder linear {model.linear_flops(1024) / 1e12:,.1f} " in line
    assert "Qwen2" not in line and "model_type='qwen2_vl'" in line
    assert "audio" not in line.split("; for ")[0]  # no audio encoder: no audio part


def test_stats_reports_the_audio_encoders_part_where_the_model_has_one():
    """An Omni model's cost line has an audio part: the encoder over every clip once."""
    pytest.importorskip("transformers")
    from transformers import Qwen2_5OmniConfig

    from energon_packing.tools.report import Measured, format_pack_costs

    model = step_cost_model(Qwen2_5OmniConfig().to_dict())
    frames = [[1370], [], [290, 4000], []]
    lengths = [400, 700, 900, 40]
    measured = Measured(
        keys=list("abcd"),
        costs=lengths,
        lengths=lengths,
        skipped={},
        capacity=1024,
        audio_frames=frames,
    )
    line = format_pack_costs(measured, model, buffer=8)
    audio = model.audio_flops([n for clips in frames for n in clips])
    packs = 3  # the 900 fits only beside the 40, and 700 + 400 > 1,024
    assert f"audio {audio / packs / 1e12:,.1f} " in line, line


@pytest.mark.parametrize(
    "family",
    [
        "kimi_k25",
        "llama4",
        "internvl",
        "gemma3",
        "paligemma",
        "llava",
        "aya_vision",
        "idefics3",
        "smolvlm",
        "mistral3",
        "pixtral",
        "ovis2",
    ],
)
def test_a_tower_read_by_its_own_rule_costs_what_torch_counts(family):
    """Kimi-K2.5's MoonViT, Llama 4's tile encoder and InternVL's InternViT (towers whose
    configs name their fields otherwise than Qwen-VL's), run on images of several grids or
    tiles: their matrix products and convolutions as torch's ``FlopCounterMode`` counts them
    in the encoder, its merger or pixel-shuffle MLP and the projector equal
    :meth:`VisionTower.grid_flops` of the grids their tokens imply, exactly (InternVL: an
    image's one run of tokens cut into its tiles; a video's frames a run each; Idefics3's
    SigLIP over each tile, pixel-shuffled). Gemma 3's,
    PaliGemma's and LLaVA's SigLIP over their fixed squares likewise, without SigLIP's pooling
    head (as published checkpoints run it: ``vision_use_head`` off)."""
    transformers = pytest.importorskip("transformers")
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from energon_packing.encoding import hf_compat

    if family == "kimi_k25":
        if not hasattr(transformers, "Kimi_K25Config"):
            pytest.skip(f"transformers {hf_compat.transformers_version()}: no Kimi-K2.5")
        from energon_packing.testing.families_kimi import tiny_config

        config = tiny_config(vocab_size=64, image_token_id=63)
        model = transformers.Kimi_K25ForConditionalGeneration(config).eval()
        cases = [(4, 6), (8, 8), (2, 14)]  # patches a side: the processor's grid

        def run(grid):
            h, w = grid
            pixels = torch.randn(h * w, 3, 14, 14)
            thw = torch.tensor([[1, h, w]])
            return model.model.get_image_features(pixels, thw), h * w // 4
    elif family == "internvl":
        from energon_packing.testing.families import build

        model = build("internvl")[1]
        model.set_attn_implementation("eager")  # attention as matmuls, which torch counts
        config = model.config
        cases = [1, 3, 5]  # tiles of 28 px: 4 x 4 patches of 7 px, 4 tokens each

        def run(tiles):  # the tower, the pixel shuffle and the projector
            pixels = torch.randn(tiles, 3, 28, 28)
            found = model.model.get_image_features(
                pixels, vision_feature_layer=-1, vision_feature_select_strategy="default"
            )
            return found, tiles * 4
    elif family == "ovis2":
        from energon_packing.testing.families import build

        model = build(family)[1]
        model.set_attn_implementation("eager")
        config = model.config
        cases = [1, 5]  # tiles of 28 px: 4 x 4 patches of 7 px, 16 visual tokens each

        def run(tiles):  # the ViT, its head, the softmax times the visual embedding table
            return model.model.get_image_features(torch.randn(tiles, 3, 28, 28)), tiles * 16
    elif family in ("idefics3", "smolvlm"):
        from energon_packing.testing.families import build

        model = build(family)[1]
        model.set_attn_implementation("eager")
        config = model.config
        cases = [1, 4]  # tiles of 32 px: 4 x 4 patches of 8 px, pixel-shuffled 2: 4 tokens

        def run(tiles):
            pixels = torch.randn(1, tiles, 3, 32, 32)
            return model.model.get_image_features(pixels), tiles * 4
    elif family in ("gemma3", "paligemma", "llava", "aya_vision"):
        from energon_packing.testing.families import build

        config = copy.deepcopy(build(family)[1].config)
        config.vision_config.vision_use_head = False
        torch.manual_seed(0)
        model = getattr(transformers, type(build(family)[1]).__name__)(config).eval()
        model.set_attn_implementation("eager")
        side = config.vision_config.image_size
        cases = [1, 2]  # images, each one square
        per_image = step_cost_model(config).vision.tile_tokens
        kwargs = {}
        if family in ("llava", "aya_vision"):
            kwargs = dict(
                vision_feature_layer=config.vision_feature_layer,
                vision_feature_select_strategy=config.vision_feature_select_strategy,
            )

        def run(images):
            pixels = torch.randn(images, 3, side, side)
            return model.model.get_image_features(pixels, **kwargs), images * per_image
    elif family in ("mistral3", "pixtral"):  # built from configs: the processor needs torchvision
        config = _pixtral_config(family)
        torch.manual_seed(0)
        model_cls = "Mistral3" if family == "mistral3" else "Llava"
        model = getattr(transformers, f"{model_cls}ForConditionalGeneration")(config).eval()
        model.set_attn_implementation("eager")
        merge = getattr(config, "spatial_merge_size", 1)
        cases = [(8, 12), (16, 4), (4, 4)]  # pixels / 4 px patches: one image a call (eager
        # attention computes a call's whole square, varlen kernels each image's)

        def run(size):
            h, w = size
            pixels = torch.randn(1, 3, 4 * h, 4 * w)
            found = model.model.get_image_features(
                pixels, image_sizes=torch.tensor([[4 * h, 4 * w]]), vision_feature_layer=-1
            )
            return found, (h // merge, w // merge)
    else:
        from energon_packing.testing.families_llama4 import tiny_config

        config = tiny_config(image_token_index=63, vocab_size=64, pad_token_id=0)
        model = transformers.Llama4ForConditionalGeneration(config).eval()
        cases = [1, 3]  # tiles: each 336 px, 24 x 24 patches, 144 tokens

        def run(tiles):  # the tower, then the projector (some releases apply it in forward)
            encoded = model.vision_model(torch.randn(tiles, 3, 336, 336)).last_hidden_state
            return model.multi_modal_projector(encoded), tiles * 144

    tower = step_cost_model(config).vision
    assert tower is not None, f"{family}: its tower is not priced"
    for case in cases:
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            _, tokens = run(case)
        ids = [7] + [63] * tokens if family == "kimi_k25" else []
        if family == "llama4":  # each tile its own run of <|patch|>, separators between
            for _ in range(case):
                ids += [63] * 144 + [5]
        if family == "internvl":  # an image's tiles one run, a frame a run: the same cost
            ids = [1] + [63] * tokens + [2] if case != 5 else [1, 63, 63, 63, 63, 2, 9] * 5
        if family in ("gemma3", "paligemma", "llava", "aya_vision"):  # a run an image / tile
            ids = ([1] + [63] * (tokens // case) + [2]) * case
        if family in ("idefics3", "smolvlm"):  # a run a tile, its row / column marker first
            ids = ([5] + [63] * 4) * case
        if family == "ovis2":  # a run a tile, <IMG_GRID> / <IMG_COL> / <IMG_ROW> between
            ids = [1, *([63] * 16 + [5]) * case, 2]
        if family in ("mistral3", "pixtral"):  # a run a row, [IMG_BREAK] (62) between, [IMG_END]
            rows, cols = tokens
            ids = [1, *([63] * cols + [62]) * rows, 9]
            ids[-2] = 61
        grids = grids_from_tokens(
            ids,
            token_id=63,
            merge_size=tower.spatial_merge_size,
            tile_tokens=tower.tile_tokens,
            row_break=62 if family in ("mistral3", "pixtral") else None,
        )
        modelled = sum(tower.grid_flops(g) for g in grids)
        assert counter.get_total_flops() == modelled, (family, case, grids)


def _pixtral_config(family: str):
    """The tiny Mistral 3 (Pixtral encoder, 2 x 2 patch merger) or Pixtral-12B (LLaVA over a
    Pixtral encoder) of ``testing.families``, built from its config alone."""
    from energon_packing.testing.families_pixtral import tiny_config

    text = dict(
        model_type="mistral",
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
    )
    return tiny_config(family, text=text, image_token_id=63)


def test_row_breaks_join_an_images_rows_into_one_grid():
    """Pixtral's layout: an image's rows of ``[IMG]`` (9), ``[IMG_BREAK]`` (7) between them and
    ``[IMG_END]`` (8) after: the runs one break parts are one image of rows x run length;
    another token between two runs (an end, text) parts images."""
    ids = [1, 9, 9, 9, 7, 9, 9, 9, 8, 2, 9, 9, 8, 9, 7, 9, 7, 9, 8]
    assert grids_from_tokens(ids, token_id=9, merge_size=2, row_break=7) == [
        (1, 4, 6),  # 2 rows of 3 tokens
        (1, 2, 4),  # 1 row of 2
        (1, 6, 2),  # 3 rows of 1
    ]
    assert grids_from_tokens([9, 7, 9], token_id=9, merge_size=1) == [(1, 1, 1), (1, 1, 1)]
    assert grids_from_tokens([1, 2], token_id=9, merge_size=1, row_break=7) == []
    # a tower of fixed tiles (another family's cost model) cuts the runs into its tiles
    assert (
        grids_from_tokens(ids, token_id=9, merge_size=1, row_break=7, tile_tokens=2)
        == [(1, 1, 2)] * 3 + [(1, 1, 1)] * 5
    )


@pytest.mark.torchvision
@pytest.mark.parametrize("family", ["mistral3", "pixtral"])
def test_a_pixtral_packs_images_are_priced_by_their_sizes(family):
    """Through Mistral 3's and Pixtral-12B's processor and the real pack layout: each image
    of its own size is priced as its ``image_sizes`` row's patches (merged 2 x 2 by Mistral 3),
    at selection (from the encoded ids) as at emission, 3 x the forward."""
    pytest.importorskip("transformers")
    from energon_packing import PackingTaskEncoder
    from energon_packing.testing.families import build

    processor, model, _ = build(family)
    te = PackingTaskEncoder(processor=processor, max_input_seq_length=2048)
    te.cost_model = step_cost_model(model.config)
    tower = te.cost_model.vision
    encoded = [
        te.encode_sample(_pictured(k, w, h))
        for k, (w, h) in zip("abc", [(40, 30), (64, 16), (12, 52)])
    ]
    pack = te.pack_selected_samples(encoded).pack
    sizes = np.asarray(pack.media["image_sizes"]).tolist()
    assert len(sizes) == 3 and len({tuple(s) for s in sizes}) == 3
    p = tower.patch_size
    hand = 3 * sum(tower.grid_flops((1, h // p, w // p)) for h, w in sizes)
    assert te.emitted_cost(pack).vision == hand
    lengths = [s.length for s in encoded]
    assert te.pack_cost(encoded) - te.cost_model.pack_flops(lengths, capacity=2048) == hand


def test_a_fixed_square_towers_config_is_read_as_its_model_reads_it():
    """PaliGemma's head is the top-level ``projection_dim`` (its config writes it over the
    vision config's); a size left out is the config class's default (SigLIP's 16 px patches,
    CLIP's 32, Idefics3's vision config's); a Gemma 3 whose square is smaller than its tokens is not priced; a SigLIP
    whose pooling head runs (``vision_use_head`` left out: on) is not priced."""
    siglip = {
        "model_type": "siglip_vision_model",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "intermediate_size": 128,
        "image_size": 224,
        "vision_use_head": False,
    }
    text = {"hidden_size": 96, "num_hidden_layers": 2}
    raw = {
        "model_type": "paligemma",
        "projection_dim": 96,
        "vision_config": {**siglip, "patch_size": 14, "projection_dim": 48},
        "text_config": text,
    }
    tower = step_cost_model(raw).vision
    assert tower.head == ((64, 96),) and tower.tile_size == 16
    unpatched = step_cost_model({**raw, "vision_config": siglip}).vision
    assert unpatched.patch_size == 16 and unpatched.tile_size == 14
    clip = {**siglip, "model_type": "clip_vision_model"}
    llava = {"model_type": "llava", "vision_config": clip, "text_config": text}
    assert step_cost_model(llava).vision.patch_size == 32
    assert step_cost_model(llava).vision.class_tokens == 1
    small = {"model_type": "gemma3", "vision_config": {**siglip, "image_size": 32}}
    assert step_cost_model({**small, "text_config": text}).vision is None  # 2 patches < 16
    headed = {k: v for k, v in siglip.items() if k != "vision_use_head"}
    assert step_cost_model({**raw, "vision_config": headed}).vision is None
    bare = {"model_type": "idefics3", "vision_config": {}, "text_config": text}
    tiles = step_cost_model(bare).vision  # Idefics3VisionConfig's: 224 px of 32, 12 x 1152
    assert (tiles.patch_size, tiles.tile_size, tiles.depth, tiles.hidden_size) == (32, 7, 12, 1152)


@pytest.mark.parametrize("family", ["llava_next", "llava_onevision"])
def test_an_anyres_tower_costs_what_torch_counts(family):
    """LLaVA-NeXT's and LLaVA-OneVision's encoder over an image's anyres tiles (its best-fit
    grid and the whole image, ``Family.tiles`` from its size), then the projector: torch's
    ``FlopCounterMode`` in their own ``get_image_features`` equals that many tiles'
    :meth:`VisionTower.grid_flops`, exactly, for images of three sizes."""
    transformers = pytest.importorskip("transformers")
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from energon_packing.encoding import image_rules
    from energon_packing.testing.families import build

    processor, built, _ = build(family)
    config = copy.deepcopy(built.config)
    config.vision_config.vision_use_head = False  # as published checkpoints run SigLIP
    torch.manual_seed(0)
    model = getattr(transformers, type(built).__name__)(config).eval()
    model.set_attn_implementation("eager")
    tower = step_cost_model(config).vision
    assert tower is not None and tower.tile_size
    side = config.vision_config.image_size
    rule = (
        image_rules.llava_next_tiles
        if family == "llava_next"
        else image_rules.llava_onevision_tiles
    )
    for size in [(40, 90), (60, 30), (28, 28)]:
        (tiles,) = rule(processor, [[size]])
        pixels = torch.randn(1, tiles, 3, side, side)
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            model.model.get_image_features(
                pixels,
                image_sizes=torch.tensor([size]),
                vision_feature_layer=config.vision_feature_layer,
                vision_feature_select_strategy=config.vision_feature_select_strategy,
            )
        modelled = tiles * tower.grid_flops((1, tower.tile_size, tower.tile_size))
        assert counter.get_total_flops() == modelled, (family, size, tiles)
    assert rule(processor, [[(40, 90)]]) != [1]  # a wide image takes more than the whole


@pytest.mark.parametrize("family", ["llava_next", "llava_onevision"])
@pytest.mark.processor_media
def test_anyres_packs_are_priced_by_their_tiles_at_selection_as_at_emission(family):
    """A pack of a one-image and a two-image conversation: each image's anyres tiles
    (LLaVA-OneVision: the two-image conversation's images one tile each, as its model reads
    ``batch_num_images``), priced from the sizes at selection and from the pack's
    ``image_sizes`` at emission, by hand; the tile counts are the image processor's own (its
    pixels' tiles that are not padding)."""
    from helpers import conversation_sample

    from energon_packing import PackingTaskEncoder
    from energon_packing.encoding import hf_compat
    from energon_packing.testing.families import build

    processor, model, _ = build(family)
    config = copy.deepcopy(model.config)
    config.vision_config.vision_use_head = False
    te = PackingTaskEncoder(processor=processor, max_input_seq_length=8192)
    te.cost_model = step_cost_model(config)
    tower = te.cost_model.vision

    def document(n):
        return {
            "messages": [
                {"role": "user", "content": "<image>" * n + "What?"},
                {"role": "assistant", "content": "A picture."},
            ],
            "images": [f"i{k}.png" for k in range(n)],
        }

    sizes = [(40, 90), (60, 30), (50, 50)]  # (height, width)
    images = {f"s{k}": _png(w, h) for k, (h, w) in enumerate(sizes)}
    encoded = [
        te.encode_sample(conversation_sample("one", document(1), {"i0.png": images["s0"]})),
        te.encode_sample(
            conversation_sample(
                "two", document(2), {"i0.png": images["s1"], "i1.png": images["s2"]}
            )
        ),
    ]
    pack = te.pack_selected_samples(encoded).pack
    image_processor = processor.image_processor
    tile = config.vision_config.image_size

    def anyres(h, w):
        pinpoints = image_processor.image_grid_pinpoints
        return hf_compat.anyres_tiles(h, w, grid_pinpoints=pinpoints, tile=tile)

    tiles = [anyres(*sizes[0])]
    tiles += [1, 1] if family == "llava_onevision" else [anyres(*s) for s in sizes[1:]]
    assert tiles[0] > 1
    # the rule against the image processor's own pixels: each image's tiles that are not
    # padding (OneVision's: the whole image alone for each of a multi-image conversation)
    pixels = np.asarray(pack.media["pixel_values"])
    made = (np.abs(pixels).reshape(*pixels.shape[:2], -1).sum(-1) > 0).sum(-1).tolist()
    assert made == tiles, (made, sizes)
    hand = 3 * sum(tiles) * tower.grid_flops((1, tower.tile_size, tower.tile_size))
    assert te.emitted_cost(pack).vision == hand
    lengths = [s.length for s in encoded]
    assert te.pack_cost(encoded) - te.cost_model.pack_flops(lengths, capacity=8192) == hand
