"""Packs of video conversations through the tiny Qwen models: packed equals alone (issue 23).

``tests/test_video_packs.py`` proves a pack's per-source ids, token types, video/image pixels,
grids and mRoPE positions are the real processors' for each conversation alone. Here the same
pack (the 4 conversations of ``tests/data/video/processor_reference.json``: three with videos
only, one with an image and a video) goes the trainer's way, ``collate`` then
``prepacked_microbatches``, into the family's tiny random-init model with a block-causal mask
over its sources (:mod:`energon_packing.testing.hf`); each source's logits must equal the same
model's own forward on that conversation's inputs alone, sliced out of the pack by
``cu_seqlens`` and ``video_source_index`` / ``image_source_index``. The alone forward gets no
``position_ids``: the model computes its own mRoPE with its own ``get_rope_index``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_video_packs import PROCESSED, sample

from energon_packing import PackingTaskEncoder
from energon_packing.schema import collate
from energon_packing.trainer import prepacked_microbatches

transformers = pytest.importorskip("transformers")

from energon_packing.testing import hf  # noqa: E402
from energon_packing.testing.families import build  # noqa: E402

FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")
NAMES = list(PROCESSED["conversations"])
PAD_MULTIPLE = 8
CAPACITY = 2048  # Qwen2-VL's four conversations take 1924 tokens


def videos_in(name: str) -> list[str]:
    """The conversation's video file names, in the order they appear."""
    return [
        part["video"]
        for message in PROCESSED["conversations"][name]
        if isinstance(message["content"], list)
        for part in message["content"]
        if part["type"] == "video"
    ]


def rows_of(grids: torch.Tensor, owners: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the pixel rows (patches) that belong to source ``k``'s videos or images."""
    sizes = grids.prod(dim=1)
    ends = torch.cumsum(sizes, 0)
    return torch.cat(
        [torch.arange(int(e - s), int(e)) for s, e, o in zip(sizes, ends, owners) if o == k]
        or [torch.zeros(0, dtype=torch.long)]
    )


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.processor_media
def test_a_video_pack_gives_each_conversations_own_logits(family):
    """Per-source logits of a pack of video conversations (and the image+video one) are the
    model's logits for each conversation alone (max abs diff <= 1e-5, float32)."""
    processor, model, info = build(family)
    knobs = {}
    if family == "qwen2_5_vl":  # the model's own rate, so the pack's temporal positions match
        knobs["tokens_per_second"] = model.config.vision_config.tokens_per_second
    te = PackingTaskEncoder(
        processor=processor,
        max_input_seq_length=CAPACITY,
        pad_multiple=PAD_MULTIPLE,
        video_config=PROCESSED["families"][family]["processor_kwargs"],
        **knobs,
    )
    pack = te.pack_selected_samples([te.encode_sample(sample(name)) for name in NAMES]).pack
    assert pack.source_ids == NAMES and not te.stats.skipped
    batch = collate([pack])
    (mb,) = prepacked_microbatches(batch, pad_multiple=PAD_MULTIPLE)
    inputs = mb.model_inputs
    logits = hf.run(model, hf.packed_kwargs(inputs, mb.cu_seqlens_padded, info))

    video_owner = batch["video_source_index"][0]
    image_owner = batch["image_source_index"][0]
    video_grids, image_grids = inputs["video_grid_thw"], inputs["image_grid_thw"]
    video_pad = model.config.video_token_id
    merge = model.config.vision_config.spatial_merge_size
    ids = inputs["input_ids"][0]
    # a video's tokens sit in its own source: the portrait clip is the 2nd conversation's
    portrait = NAMES.index("text_video_text")
    (one,) = torch.nonzero(video_owner == portrait).flatten().tolist()
    start = int(mb.cu_seqlens_padded[portrait])
    stop = start + int(mb.cu_seqlens[portrait + 1] - mb.cu_seqlens[portrait])
    assert int((ids[start:stop] == video_pad).sum()) == int(video_grids[one].prod()) // merge**2
    assert int((ids == video_pad).sum()) == int(video_grids.prod(dim=1).sum()) // merge**2

    worst = 0.0
    for k, name in enumerate(NAMES):
        start = int(mb.cu_seqlens_padded[k])
        stop = start + int(mb.cu_seqlens[k + 1] - mb.cu_seqlens[k])
        mine = video_owner == k
        assert int(mine.sum()) == len(videos_in(name)), name
        assert int((ids[start:stop] == video_pad).sum()) == (
            int(video_grids[mine].prod(dim=1).sum()) // merge**2
        ), f"{family} {name}: video tokens outside their source"
        alone = {
            "input_ids": ids[None, start:stop],
            "mm_token_type_ids": inputs["mm_token_type_ids"][:, start:stop],
            "pixel_values_videos": inputs["pixel_values_videos"][
                rows_of(video_grids, video_owner, k)
            ],
            "video_grid_thw": video_grids[mine],
        }
        if family == "qwen2_5_vl":
            alone["second_per_grid_ts"] = inputs["second_per_grid_ts"][mine]
        if (image_owner == k).any():
            alone["pixel_values"] = inputs["pixel_values"][rows_of(image_grids, image_owner, k)]
            alone["image_grid_thw"] = image_grids[image_owner == k]
        alone_logits = hf.run(model, alone)  # no position_ids: the model's own get_rope_index
        assert alone_logits.shape[0] == stop - start
        worst = max(worst, float((logits[start:stop] - alone_logits).abs().max()))
    assert sum(1 for k in range(len(NAMES)) if (image_owner == k).any()) == 1
    print(f"{family}: max |packed - alone| logit difference {worst:.2e}")
    assert np.isfinite(worst) and worst <= 1e-5, f"{family}: per-source logits differ by {worst}"
