"""InternVL's videos: exact against its processor, through the real loader (issue 33 item 3).

InternVL lays a video out as frames that are image tiles: ``Frame{i}: <img>`` and
``image_seq_length`` context tokens a frame, one line each, and the frames' pixels join the
images' tiles in the model's one ``pixel_values``, in the text's order.

The reference is the real ``InternVLProcessor`` on each conversation alone: its chat template,
its ``__call__``'s expansion and its merging of image tiles and frames (each release's own
code: 5.5-5.12 write them in ``_insert_media_placeholders``, later ones in
``replace_video_token``). Its video processor (``InternVLVideoProcessor``) needs torchvision:
on every stack :class:`StandInVideoProcessor` takes its place (the package's frame rule over
the settings the call passes); where torchvision imports (the ``torchvision`` stack) the real
one does (decoding with transformers' own pyav loader), which proves the frames' sampling,
resize and normalisation bit-equal.

Per settings: each packed conversation's ids and ``pixel_values`` (image tiles and frames, in
order) equal the processor's on it alone, bit for bit; per-source logits of the pack equal the
tiny random-init InternVL's forward on each conversation alone (<= 1e-5).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import loader_batches, make_dataset
from test_video_omni import _in_order, _parts, _png, processor_alone

from energon_packing import PackingTaskEncoder
from energon_packing.trainer import prepacked_microbatches

transformers = pytest.importorskip("transformers")
pytest.importorskip("av")

from energon_packing.encoding.video_tiles import placed, tiles_in_order  # noqa: E402
from energon_packing.media import video, video_rules, video_styles  # noqa: E402
from energon_packing.testing import hf  # noqa: E402
from energon_packing.testing.families import build  # noqa: E402

pytestmark = pytest.mark.energon

DATA = Path(__file__).parent / "data" / "video"
#: (video_config): every frame (the class default); a fixed count; by fps; a count sampled
#: from the first frame on
SETTINGS = [
    None,
    {"do_sample_frames": True, "num_frames": 6},
    {"do_sample_frames": True, "fps": 4.0},
    {"do_sample_frames": True, "num_frames": 5, "initial_shift": False},
]


class StandInVideoProcessor:
    """``InternVLVideoProcessor`` as the processor calls it: its settings (a checkpoint's)
    under the call's ``videos_kwargs``; each video path decoded and processed by the package's
    frame rule; ``[videos, frames, 3, height, width]`` as the real one returns them."""

    model_input_names = ("pixel_values_videos",)

    def __init__(self, settings: dict | None = None):
        self.settings = dict(settings or {})

    def __call__(self, videos, **kwargs):
        from transformers.feature_extraction_utils import BatchFeature

        kwargs.pop("return_tensors", None)
        rule = video_rules.VideoRule.of(video_styles.INTERNVL, self.settings, overrides=kwargs)
        clips = []
        for path in videos:
            data = Path(path).read_bytes()
            plan = rule.plan(video.probe(data))
            clips.append(video.process_tiles(video.decode(data, plan.indices), rule))
        return BatchFeature({"pixel_values_videos": torch.stack(clips)})


def _conversations() -> list[tuple[str, dict, dict]]:
    """(key, document, parts): a video alone; images before, between and after a video; two
    videos (one clip twice: the processor stacks a call's videos, so their frame counts must
    agree); a video in a later turn; an image alone; text only."""
    small = (DATA / "h264_48x36_10fps_2s.mp4").read_bytes()
    short = (DATA / "h264_100x60_25fps_23f.mp4").read_bytes()
    mov = (DATA / "h264_120x80_30fps_1s.mov").read_bytes()
    wide, tall = _png(64, 24, 1), _png(20, 50, 2)
    user, assistant = "user", "assistant"

    def turn(role, *pieces):
        return {"role": role, "content": _parts(*pieces)}

    return [
        (
            "video_alone",
            {
                "messages": [
                    turn(user, ("video", "a.mp4"), "What happens?"),
                    turn(assistant, "A gradient moves."),
                ]
            },
            {"a.mp4": small},
        ),
        (
            "image_video_image",
            {
                "messages": [
                    turn(
                        user, ("image", "p.png"), "Compare", ("video", "b.mp4"), ("image", "q.png")
                    ),
                    turn(assistant, "The clip is brighter than both pictures."),
                ]
            },
            {"p.png": wide, "b.mp4": short, "q.png": tall},
        ),
        (
            "two_videos",
            {
                "messages": [
                    turn(user, ("video", "c.mov"), "and", ("video", "d.mov"), "Same?"),
                    turn(assistant, "Yes."),
                ]
            },
            {"c.mov": mov, "d.mov": mov},
        ),
        (
            "video_later",
            {
                "messages": [
                    turn(user, "Hello."),
                    turn(assistant, "Hi."),
                    turn(user, ("image", "r.png"), ("video", "e.mp4"), "Now?"),
                    turn(assistant, "Now it moves."),
                ]
            },
            {"r.png": tall, "e.mp4": small},
        ),
        (
            "image_alone",
            {"messages": [turn(user, ("image", "s.png"), "Colours?"), turn(assistant, "Noise.")]},
            {"s.png": wide},
        ),
        (
            "text_only",
            {"messages": [turn(user, "Two and two?"), turn(assistant, "Four.")]},
            {},
        ),
    ]


CONVERSATIONS = _conversations()
BY_KEY = {key: (document, parts) for key, document, parts in CONVERSATIONS}


def _reference(processor, key: str, tmp: Path) -> dict:
    """The processor's own output on conversation ``key`` alone."""
    document, parts = BY_KEY[key]
    return processor_alone(processor, document, parts, tmp)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    raw = [
        {"__key__": key, "json": json.dumps(document).encode(), **parts}
        for key, document, parts in CONVERSATIONS
    ]
    return make_dataset(tmp_path_factory.mktemp("internvl_video"), [], raw=raw)


def _reference_processor(real: bool, settings: dict | None):
    processor = build("internvl", model=False)[0]
    merged = {**processor.video_settings, **(settings or {})}
    if real:
        from energon_packing.testing.families_video import with_video_processor

        return with_video_processor("internvl", processor, merged)
    processor.video_processor = StandInVideoProcessor(merged)
    return processor


@pytest.mark.parametrize(
    "real", [False, pytest.param(True, marks=pytest.mark.torchvision)], ids=["stand-in", "real"]
)
@pytest.mark.parametrize("settings", SETTINGS, ids=[str(n) for n in range(len(SETTINGS))])
@pytest.mark.processor_media
def test_internvl_videos_through_the_loader_are_the_processors(dataset, tmp_path, settings, real):
    processor, model, info = build("internvl")
    te = PackingTaskEncoder(
        max_input_seq_length=4096, processor=processor, pad_multiple=8, video_config=settings
    )
    assert te.chat.video_style is video_styles.INTERNVL
    reference = _reference_processor(real, settings)
    seen, worst, frames, widest = [], 0.0, 0, 0
    for batch in loader_batches(dataset, te, buffer=8):
        (mb,) = prepacked_microbatches(batch, pad_multiple=8)
        widest = max(widest, len(mb.source_ids))
        inputs = mb.model_inputs
        logits = hf.run(model, hf.packed_kwargs(inputs, mb.cu_seqlens_padded, info))
        ids, pixels = inputs["input_ids"][0], inputs.get("pixel_values")
        opens = (ids == processor.start_image_token_id).nonzero().flatten()
        closes = (ids == processor.end_image_token_id).nonzero().flatten()
        tiles = torch.cumsum((closes - opens - 1) // processor.image_seq_length, 0)
        for k, key in enumerate(mb.source_ids):
            ref = _reference(reference, key, tmp_path)
            start, n = int(mb.cu_seqlens_padded[k]), int(mb.cu_seqlens[k + 1] - mb.cu_seqlens[k])
            assert torch.equal(ids[start : start + n], ref["input_ids"][0]), key
            mine = ((opens >= start) & (opens < start + n)).nonzero().flatten().tolist()
            if mine:  # its tiles: the rows of its <img> blocks, in order
                first = int(tiles[mine[0] - 1]) if mine[0] else 0
                got = pixels[first : int(tiles[mine[-1]])]
                assert got.dtype == ref["pixel_values"].dtype, key
                assert torch.equal(got, ref["pixel_values"]), key
                frames += len(mine) - len(_in_order(BY_KEY[key][0], "image"))
            else:
                assert "pixel_values" not in ref, key
            alone = hf.run(model, dict(ref))
            worst = max(worst, float((logits[start : start + n] - alone[:n]).abs().max()))
            seen.append(key)
    assert sorted(seen) == sorted(BY_KEY) and not te.stats.skipped
    assert frames > 0 and widest >= 3
    print(
        f"internvl {settings} ({'real' if real else 'stand-in'}): {frames} frames, "
        f"max |packed - alone| logit difference {worst:.2e}"
    )
    assert worst <= 1e-5, f"per-source logits differ by {worst:.2e}"


def test_a_frame_rule_samples_as_internvl_does():
    """InternVL's ``sample_frames``: ``arange(shift, total, total / count)``, the shift half a
    step unless set; by fps, ``int(frames / video fps * fps)`` frames; every frame without
    sampling; a count over the frames refused, naming both."""
    header = video.VideoHeader(frames=23, fps=25.0, width=100, height=60)

    def indices(**settings):
        return (
            video_rules.VideoRule.of(video_styles.INTERNVL, None, overrides=settings)
            .plan(header)
            .indices
        )

    assert indices() == tuple(range(23))
    assert indices(do_sample_frames=True, num_frames=4) == (2, 8, 14, 20)  # 23/4 = 5.75
    assert indices(do_sample_frames=True, num_frames=4, initial_shift=False) == (0, 5, 11, 17)
    assert indices(do_sample_frames=True, num_frames=4, initial_shift=1) == (1, 6, 12, 18)
    assert indices(do_sample_frames=True, fps=10.0) == (1, 3, 6, 8, 11, 14, 16, 19, 21)  # 9
    with pytest.raises(video.VideoError, match="23 frames cannot give 30 samples"):
        indices(do_sample_frames=True, num_frames=30)
    plan = video_rules.VideoRule.of(
        video_styles.INTERNVL, {"size": {"height": 448, "width": 448}}, tile_tokens=256
    ).plan(header)
    assert plan.grid == (23, 448, 448) and plan.tokens == 23 * 256
    assert plan.expansion(video_token="C", vision_start="<", vision_end=">").split("\n")[:2] == [
        f"Frame1: <{'C' * 256}>",
        f"Frame2: <{'C' * 256}>",
    ]


def test_internvl_video_settings_are_refused_where_they_mean_nothing():
    """A Qwen size (pixel bounds) or Qwen-only sampling caps for InternVL, a height and width
    or ``initial_shift`` for a Qwen family: refused, naming the family; a bad
    ``initial_shift`` at config time, one past the clip's last frame when it is planned (the
    processor's arange fails there)."""
    with pytest.raises(ValueError, match="resized to a height and width"):
        video_rules.VideoRule.of(video_styles.INTERNVL, {"size": {"shortest_edge": 3136}})
    with pytest.raises(ValueError, match="qwen2_vl's frames are sized by pixel bounds"):
        video_rules.VideoRule.of(
            video_styles.QWEN2_VL, None, overrides={"size": {"height": 28, "width": 28}}
        )
    with pytest.raises(ValueError, match="initial_shift'] is InternVL's sampling"):
        video_rules.VideoRule.of(video_styles.QWEN2_VL, None, overrides={"initial_shift": False})
    with pytest.raises(ValueError, match="initial_shift'] must be True, False or a number"):
        PackingTaskEncoder(max_input_seq_length=64, video_config={"initial_shift": -1})
    with pytest.raises(ValueError, match="do_center_crop=True is not supported"):
        video_rules.VideoRule.of(video_styles.INTERNVL, {"do_center_crop": True})
    video_rules.VideoRule.of(video_styles.QWEN2_VL, {"do_center_crop": True})  # Qwen ignores it
    with pytest.raises(ValueError, match=r"\['max_frames', 'max_pixels'\]: internvl's video pro"):
        video_rules.VideoRule.of(
            video_styles.INTERNVL, None, overrides={"max_frames": 2, "max_pixels": 10}
        )
    # a checkpoint's own (ignored) Qwen settings load, as the processor ignores them
    assert video_rules.VideoRule.of(video_styles.INTERNVL, {"max_frames": 2}).sample is False
    header = video.VideoHeader(frames=4, fps=30.0, width=64, height=64)
    shifted = {"do_sample_frames": True, "num_frames": 1}
    with pytest.raises(video.VideoError, match="4 frames: sampling starts at frame 7"):
        video_rules.VideoRule.of(
            video_styles.INTERNVL, None, overrides={**shifted, "initial_shift": 7}
        ).plan(header)
    with pytest.raises(video.VideoError, match="sampling starts at frame 4"):
        video_rules.VideoRule.of(
            video_styles.INTERNVL, None, overrides={**shifted, "initial_shift": 4}
        ).plan(header)


def test_tiles_join_in_the_texts_order_and_a_missing_order_is_refused():
    """:func:`tiles_in_order` on tiny ids: image (2 tiles), video (2 frames), image (1 tile)
    gives their rows in that order; a video plan without ``images_before`` beside images, and
    ids whose blocks do not hold the tiles, raise naming what is missing."""

    class Processor:
        start_image_token_id, end_image_token_id, image_seq_length = 1, 2, 1

    plan = video_rules.VideoRule.of(video_styles.INTERNVL, None, tile_tokens=1).plan(
        video.VideoHeader(frames=2, fps=1.0, width=8, height=8)
    )
    (where,) = placed([plan], ["image", "video", "image"])
    assert where.images_before == 1
    ids = [9, 1, 0, 0, 2, 9, 1, 0, 2, 1, 0, 2, 1, 0, 2]  # <img>xx</img> . frames . <img>x</img>
    media = {
        "pixel_values": np.arange(3.0)[:, None],  # image tiles 0, 1 | 2
        "pixel_values_videos": np.arange(10.0, 12.0)[:, None],  # frames 10, 11
    }
    out = tiles_in_order(media, [where], images=2, input_ids=ids, processor=Processor)
    assert out["pixel_values"][:, 0].tolist() == [0.0, 1.0, 10.0, 11.0, 2.0]
    assert "pixel_values_videos" not in out
    with pytest.raises(ValueError, match="without the video_plans encode"):
        tiles_in_order(media, [plan], images=2, input_ids=ids, processor=Processor)
    with pytest.raises(ValueError, match="image blocks"):
        tiles_in_order(media, [where], images=2, input_ids=ids[:-3], processor=Processor)


#: a published InternVL checkpoint's ``video_preprocessor_config.json`` (the -hf conversions'
#: fields; ImageNet normalisation, 448 px frames)
PUBLISHED = {
    "crop_size": None,
    "do_center_crop": None,
    "do_convert_rgb": True,
    "do_normalize": True,
    "do_rescale": True,
    "do_resize": True,
    "do_sample_frames": False,
    "fps": None,
    "image_mean": [0.485, 0.456, 0.406],
    "image_std": [0.229, 0.224, 0.225],
    "initial_shift": True,
    "num_frames": None,
    "processor_class": "InternVLProcessor",
    "resample": 3,
    "rescale_factor": 0.00392156862745098,
    "size": {"height": 448, "width": 448},
    "video_processor_type": "InternVLVideoProcessor",
}


def test_a_checkpoints_video_settings_are_read_from_its_directory(tmp_path):
    """A saved InternVL processor with a published ``video_preprocessor_config.json``: the
    packer's frame rule takes its size and normalisation, and ``video_config`` passes over
    them (here: sampling 3 frames)."""
    processor = build("internvl", model=False)[0]
    processor.save_pretrained(tmp_path)
    (tmp_path / "video_preprocessor_config.json").write_text(json.dumps(PUBLISHED))
    te = PackingTaskEncoder(max_input_seq_length=4096, processor=str(tmp_path))
    rule = te.chat.videos.rule
    assert (rule.frame_size, rule.mean, rule.sample) == ((448, 448), (0.485, 0.456, 0.406), False)
    assert rule.tile_tokens == processor.image_seq_length
    sampled = PackingTaskEncoder(
        max_input_seq_length=4096,
        processor=str(tmp_path),
        video_config={"do_sample_frames": True, "num_frames": 3},
    ).chat.videos
    plan = sampled.plan((DATA / "h264_48x36_10fps_2s.mp4").read_bytes())
    assert plan.indices == (3, 10, 16) and plan.grid == (3, 448, 448)  # 20 frames / 3


@pytest.mark.processor_media
def test_a_packs_tiles_and_frames_are_priced_by_hand():
    """Balanced emission prices InternVL's tower over every tile of a pack, its images' and
    its videos' frames alike, at selection (from the ids) as at emission: each tile of the
    tiny InternViT (1 layer, width 32, MLP 64, 4 x 4 patches of 7 px and a class token,
    pixel-shuffled 2 x 2 into a 128 -> 64 -> 64 projector) by hand, forward and backward."""
    from helpers import conversation_sample

    from energon_packing.encoding.costs import step_cost_model

    processor, model, _ = build("internvl")
    te = PackingTaskEncoder(
        processor=processor,
        max_input_seq_length=1024,
        video_config={"do_sample_frames": True, "num_frames": 3},
    )
    te.cost_model = step_cost_model(model.config)
    encoded = [
        te.encode_sample(conversation_sample(key, document, parts))
        for key, (document, parts) in BY_KEY.items()
        if key in ("image_video_image", "video_alone", "text_only")
    ]
    pack = te.pack_selected_samples(encoded).pack
    tiles = len(pack.media["pixel_values"])
    assert tiles == 8 + 3 + 3  # the images' crops and thumbnails, two videos of 3 frames
    d, f, patches, out = 32, 64, 16, 64
    per_tile = (
        2 * patches * 3 * 7 * 7 * d  # patch embedding
        + 2 * (patches + 1) * (4 * d * d + 2 * d * f)  # the layer's linear parts, class token
        + 4 * d * (patches + 1) ** 2  # its attention within the tile
        + 2 * (patches // 4) * (4 * d * out + out * out)  # the projector per token
    )
    hand = 3 * per_tile * tiles
    assert te.emitted_cost(pack).vision == hand
    lengths = [s.length for s in encoded]
    assert te.pack_cost(encoded) - te.cost_model.pack_flops(lengths, capacity=1024) == hand
