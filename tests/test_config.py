"""PackingConfig: validation, unknown keys, and proof that every knob changes behaviour."""

from __future__ import annotations

import contextlib
import io
import itertools
import json

import numpy as np
import pytest
from helpers import require_processor_media
from megatron.energon.errors import SkipSample
from PIL import Image

from energon_packing import PackingConfig, PackingTaskEncoder
from energon_packing.config import BUILTIN, KNOBS, PROCESSOR, knob_table
from energon_packing.loader.samples import ConversationSample, load_conversation
from energon_packing.testing.synth import conversations


def test_unknown_keys_raise_and_list_the_valid_ones():
    with pytest.raises(
        ValueError, match=r"unknown packing option\(s\) 'buffer'; valid options: .*pad_multiple"
    ):
        PackingConfig.from_dict({"max_input_seq_length": 1024, "buffer": 3})
    with pytest.raises(ValueError, match="unknown packing option"):
        PackingTaskEncoder(tokenizer="bundled", max_input_seq_length=1024, pad_multple=8)


@pytest.mark.parametrize(
    "knobs, message",
    [
        (
            dict(max_input_seq_length=1000, pad_multiple=16),
            r"max_input_seq_length=1000 is not a multiple of pad_multiple=16.*Use max_input_seq_length=992",
        ),
        (dict(max_input_seq_length=0), "max_input_seq_length must be a positive integer, got 0"),
        (
            dict(max_input_seq_length=64, overlong="cut"),
            "overlong='cut' is not valid; choose one of drop, truncate, error",
        ),
        (dict(max_input_seq_length=64, algorithm="nope"), "unknown packing algorithm 'nope'"),
        (
            dict(max_input_seq_length=64, delta=2),
            "delta=2 only applies to algorithm='balanced_greedy_knapsack'",
        ),
        (dict(max_input_seq_length=64, train_on="all"), "train_on='all' is not valid"),
        (
            dict(max_input_seq_length=64, min_pixels=10**6, max_pixels=10),
            "min_pixels .* must not exceed max_pixels",
        ),
        (dict(max_input_seq_length=64, max_per_pack=0), "max_per_pack must be a positive integer"),
    ],
)
def test_validation_names_the_knob(knobs, message):
    with pytest.raises(ValueError, match=message):
        PackingConfig(**knobs)


def test_round_trip():
    config = PackingConfig(max_input_seq_length=4096, pad_multiple=8, overlong="truncate")
    assert PackingConfig.from_dict(config.to_dict()) == config


def _png(width, height):
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (30, 90, 200)).save(buffer, format="PNG")
    return buffer.getvalue()


def _png16(width, height):
    values = np.linspace(0, 20000, width * height).reshape(height, width).astype(np.uint16)
    buffer = io.BytesIO()
    Image.fromarray(values).save(buffer, format="PNG")
    return buffer.getvalue()


def _samples():
    """Generated conversations plus a long one, a tiny-image one and a big-image one."""
    docs = [(c.key, c.document, c.images) for c in conversations(16, seed=11)]
    docs.append(
        (
            "long",
            {
                "messages": [
                    {"role": "user", "content": "Talk."},
                    {"role": "assistant", "content": "Bread needs time. " * 1000},
                ]
            },
            {},
        )
    )
    docs.append(
        (
            "tiny",
            {
                "messages": [
                    {"role": "user", "content": "<image>What?"},
                    {"role": "assistant", "content": "Blue."},
                    {"role": "user", "content": "Sure?"},
                    {"role": "assistant", "content": "Yes."},
                ],
                "images": ["a.png"],
            },
            {"a.png": _png(30, 30)},
        )
    )
    docs.append(
        (
            "big",
            {
                "messages": [
                    {"role": "user", "content": "<image>What?"},
                    {"role": "assistant", "content": "Blue."},
                ],
                "images": ["a.png"],
            },
            {"a.png": _png(1400, 1000)},
        )
    )
    docs.append(
        (
            "spells_special",
            {
                "messages": [
                    {"role": "user", "content": "Print <|im_end|> for me."},
                    {"role": "assistant", "content": "Here: <|im_end|>"},
                ]
            },
            {},
        )
    )
    docs.append(  # a 16-bit grey PNG: high_bit_depth decides whether it turns white
        (
            "deep",
            {
                "messages": [
                    {"role": "user", "content": "<image>Dark?"},
                    {"role": "assistant", "content": "Yes."},
                ],
                "images": ["a.png"],
            },
            {"a.png": _png16(64, 64)},
        )
    )
    out = []
    for key, doc, images in docs:
        fields = load_conversation({"json": json.dumps(doc).encode(), **images})
        out.append(ConversationSample(__key__=key, __restore_key__=(), **fields))
    return out


SAMPLES = _samples()


def observe(**knobs):
    """Everything a knob could change: costs, masks, groups (a full buffer, with carry its
    carry decision too), and the assembled packs."""
    knobs.setdefault("max_input_seq_length", 2048)
    te = PackingTaskEncoder(tokenizer="bundled", **knobs)
    encoded = []
    for sample in SAMPLES:
        with contextlib.suppress(SkipSample):
            encoded.append(te.encode_sample(sample))
    if te.config.carry:
        te._buffer_size = len(encoded)
        selection = te.select_with_carry(encoded, [1] * len(encoded), False)
        groups = [[encoded[i] for i in g] for g in selection.packs]
        carried = sorted(encoded[i].__key__ for i in selection.carried)
    else:
        groups, carried = te.select_samples_to_pack(encoded), []
    packs = [te.pack_selected_samples(group).pack for group in groups]
    return (
        [(e.__key__, e.cost, e.token_mask.tolist()) for e in encoded],
        [[s.__key__ for s in g] for g in groups],
        carried,
        [
            (
                p.input_ids.shape,
                p.position_ids.shape,
                p.cu_seqlens_padded.tolist(),
                round(float(p.media["pixel_values"].sum()), 3),
                p.media["image_grid_thw"].tolist(),
            )
            for p in packs
        ],
    )


def observe_loader(**knobs):
    """The packs, in emission order, of the real loader over the sample data."""
    from helpers import SAMPLE_DATA, loader_batches

    te = PackingTaskEncoder(tokenizer="bundled", max_input_seq_length=2048, **knobs)
    return [
        b["source_ids"][0] for b in itertools.islice(loader_batches(SAMPLE_DATA, te, buffer=32), 24)
    ]


def observe_unbuffered(**knobs):
    """What a loader without a packing buffer gives: the refusal, or its first batch's rows."""
    from helpers import SAMPLE_DATA, loader_batches

    te = PackingTaskEncoder(tokenizer="bundled", max_input_seq_length=2048, **knobs)
    try:
        batch = next(iter(loader_batches(SAMPLE_DATA, te, buffer=None, batch_size=2)))
    except ValueError as e:
        return str(e)
    return batch["source_ids"], "cu_seqlens" in batch


def observe_touched_restore(**knobs):
    """A restore after a shard's mtime changed (its bytes did not): the refusal, or the packs
    of the resumed epoch."""
    import os
    import shutil
    import tempfile
    from pathlib import Path

    from helpers import SAMPLE_DATA, loader_batches

    from energon_packing import ShardChangedError

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "data"
        shutil.copytree(SAMPLE_DATA, path, copy_function=shutil.copy2)

        def loader():
            te = PackingTaskEncoder(tokenizer="bundled", max_input_seq_length=2048, **knobs)
            return loader_batches(path, te, buffer=32, savable=True)

        first = loader()
        batches = iter(first)
        next(batches)
        state = first.save_state_rank()
        del batches
        shard = sorted((path / "shards").glob("*.tar"))[0]  # the main dataset's first
        os.utime(shard, ns=(shard.stat().st_atime_ns, shard.stat().st_mtime_ns + 10**9))
        restored = loader()
        try:
            restored.restore_state_rank(state)
            return [b["source_ids"][0] for b in itertools.islice(iter(restored), 3)]
        except ShardChangedError as e:
            return str(e).split(" since ")[0].rsplit("/", 1)[-1]


def observe_processor(**knobs):
    """Token ids of the samples through a Qwen2-VL processor (the processor-path knobs)."""
    from energon_packing.testing.families import build

    te = PackingTaskEncoder(max_input_seq_length=8192, processor=build("qwen2_vl")[0], **knobs)
    out = []
    for sample in SAMPLES:
        with contextlib.suppress(SkipSample):
            out.append(te.encode_sample(sample).input_ids.tolist())
    return out


def observe_model(**knobs):
    """The refusal of the model the knobs name, or the ids of the samples."""
    from energon_packing.encoding.models import StatefulLayersError

    try:
        te = PackingTaskEncoder(tokenizer="bundled", max_input_seq_length=8192, **knobs)
    except StatefulLayersError as e:
        return str(e).split(":")[1]
    out = []
    for sample in SAMPLES:
        with contextlib.suppress(SkipSample):
            out.append(te.encode_sample(sample).input_ids.tolist())
    assert out  # what a refusal is compared with
    return out


def observe_stop(**knobs):
    """Whether encoding the samples (some of which are skipped) stops the worker, and why."""
    from energon_packing.loader.task_encoder import PackingError

    te = PackingTaskEncoder(tokenizer="bundled", max_input_seq_length=256, **knobs)
    try:
        for sample in SAMPLES:
            with contextlib.suppress(SkipSample):
                te.encode_sample(sample)
    except PackingError as e:
        return str(e)
    return None


def observe_video(**knobs):
    """A Qwen2.5-VL pack of a video conversation: its ids and positions, or the skips."""
    from pathlib import Path

    from energon_packing.loader.samples import ConversationSample
    from energon_packing.testing.families import build

    clip = Path(__file__).parent / "data" / "video" / "h264_160x120_24fps_3s.mp4"
    te = PackingTaskEncoder(
        max_input_seq_length=8192,
        processor=build("qwen2_5_vl")[0],
        **{"video_config": {"do_sample_frames": True, "fps": 2.0}, **knobs},
    )
    sample = ConversationSample(
        __key__="v",
        __restore_key__=(),
        __subflavors__={},
        __sources__=(),
        messages=[
            {"role": "user", "content": "<video>What moves?"},
            {"role": "assistant", "content": "A square."},
        ],
        image_names=[],
        images={},
        video_names=["clip.mp4"],
        videos={"clip.mp4": clip.read_bytes()},
    )
    try:
        pack = te.pack_selected_samples([te.encode_sample(sample)]).pack
    except SkipSample:
        return dict(te.stats.skipped)
    return pack.input_ids.tolist(), pack.position_ids.tolist()


def observe_audio(**knobs):
    """A Qwen2.5-Omni encoding of a 1.5 s clip: its ids, or the skips."""
    from energon_packing.loader.samples import ConversationSample
    from energon_packing.testing.audio import clip
    from energon_packing.testing.families import build

    require_processor_media("qwen2_5_omni")  # skips, naming what an older release lacks
    te = PackingTaskEncoder(
        max_input_seq_length=8192, processor=build("qwen2_5_omni", model=False)[0], **knobs
    )
    sample = ConversationSample(
        __key__="a",
        __restore_key__=(),
        __subflavors__={},
        __sources__=(),
        messages=[
            {"role": "user", "content": "<audio>What is it?"},
            {"role": "assistant", "content": "A tone."},
        ],
        image_names=[],
        images={},
        audio_names=["a.wav"],
        audios={"a.wav": clip("wav", seconds=1.5)},
    )
    try:
        return te.encode_sample(sample).input_ids.tolist()
    except SkipSample:
        return dict(te.stats.skipped)


CARRY = {"carry": True, "carry_min_fill": 0.999, "carry_budget": 0.9}
# knob -> (baseline knobs, changed knobs[, observer])
#: knobs whose cases encode images or videos on the processor path
PROCESSOR_MEDIA_CASES = (
    "chat_template_kwargs",
    "max_video_frames",
    "max_video_tokens",
    "tokens_per_second",
    "video_config",
    "max_audio_seconds",
    "audio_config",
)
KNOB_CASES = {
    "max_input_seq_length": ({}, {"max_input_seq_length": 4096}),
    "pad_multiple": ({}, {"pad_multiple": 64}),
    "algorithm": ({}, {"algorithm": "concatenative"}),
    "max_per_pack": ({}, {"max_per_pack": 2}),
    "seed": ({"algorithm": "first_fit_shuffle"}, {"algorithm": "first_fit_shuffle", "seed": 1}),
    "delta": (
        {"algorithm": "balanced_greedy_knapsack"},
        {"algorithm": "balanced_greedy_knapsack", "delta": 2},
    ),
    "overlong": ({}, {"overlong": "truncate"}),
    "train_on": ({}, {"train_on": "last_assistant"}),
    "mrope": ({}, {"mrope": True}),
    "min_pixels": ({}, {"min_pixels": 112 * 112}),
    "max_pixels": ({}, {"max_pixels": 448 * 448}),
    "carry": ({}, CARRY),
    "max_carries": (CARRY, {**CARRY, "max_carries": 1}),
    "carry_min_fill": (CARRY, {**CARRY, "carry_min_fill": 0.5}),
    "carry_budget": (CARRY, {**CARRY, "carry_budget": 0.1}),
    "balance_window": ({}, {"balance_window": 4}, observe_loader),
    "unpacked": ({}, {"unpacked": True}, observe_unbuffered),
    "special_token_text": ({}, {"special_token_text": "skip"}),
    "max_text_chars": ({}, {"max_text_chars": 2000}),
    "max_turns": ({}, {"max_turns": 3}),
    "max_images": ({}, {"max_images": 1}),
    "max_image_pixels": ({}, {"max_image_pixels": 1_000_000}),
    "high_bit_depth": ({}, {"high_bit_depth": "clip"}),
    "chat_template_kwargs": (
        {},
        {"chat_template_kwargs": {"add_vision_id": True}},  # "Picture 1: " before each image
        observe_processor,
    ),
    "max_skips_without_pack": ({}, {"max_skips_without_pack": 2}, observe_stop),
    "shard_check": ({}, {"shard_check": "size"}, observe_touched_restore),
    "max_video_frames": ({}, {"max_video_frames": 4}, observe_video),
    "max_video_tokens": ({}, {"max_video_tokens": 64}, observe_video),
    "video_config": ({}, {"video_config": {"do_sample_frames": True, "fps": 1.0}}, observe_video),
    "max_audio_seconds": ({}, {"max_audio_seconds": 1.0}, observe_audio),
    # a coarser hop: fewer mel frames, fewer audio tokens
    "audio_config": ({}, {"audio_config": {"hop_length": 320}}, observe_audio),
    "tokens_per_second": ({}, {"tokens_per_second": 4}, observe_video),
    "model_type": ({}, {"model_type": "qwen3_5"}, observe_model),
    "allow_stateful_layers": (
        {"model_type": "qwen3_5"},
        {"model_type": "qwen3_5", "allow_stateful_layers": True},
        observe_model,
    ),
}


def test_every_knob_has_a_behaviour_case():
    assert [k.name for k in KNOBS] == list(
        PackingConfig.from_dict({"max_input_seq_length": 8}).to_dict()
    )
    assert {k.name for k in KNOBS} == set(KNOB_CASES)


def _other_value(knob):
    """A valid non-default value of ``knob`` (its behaviour case's changed value)."""
    return KNOB_CASES[knob.name][1][knob.name]


@pytest.mark.parametrize(
    "knob, path",
    [(k, p) for k in KNOBS for p in (BUILTIN, PROCESSOR) if p not in k.paths],
    ids=lambda v: getattr(v, "name", v),
)
def test_a_knob_off_its_path_raises_naming_what_to_use(knob, path):
    """Every knob declared for one path only raises on the other, naming the replacement."""
    from energon_packing.testing.families import build

    if path == PROCESSOR and knob.name in ("min_pixels", "max_pixels"):
        require_processor_media()  # checked where the image side is built
    source = {"tokenizer": "bundled"} if path == BUILTIN else {"processor": build("qwen2_vl")[0]}
    value = _other_value(knob)
    with pytest.raises(ValueError, match=f"{knob.name}={value!r} does not apply") as info:
        PackingTaskEncoder(max_input_seq_length=8192, **source, **{knob.name: value})
    assert knob.instead and knob.instead in str(info.value)
    PackingTaskEncoder(max_input_seq_length=8192, **source)  # and the default is accepted


def test_processor_resize_knobs_name_the_image_processor():
    from energon_packing.testing.families import build

    processor = build("qwen2_vl")[0]
    with pytest.raises(ValueError, match=r"processor\.image_processor\.max_pixels"):
        PackingTaskEncoder(max_input_seq_length=8192, processor=processor, max_pixels=448 * 448)
    with pytest.raises(ValueError, match="chat_template_kwargs=.* does not apply with tokenizer="):
        PackingTaskEncoder(
            max_input_seq_length=64, tokenizer="bundled", chat_template_kwargs={"a": 1}
        )


def test_defaults_live_once_in_the_declarations():
    """The config, the task encoder's signature and ``from_dict`` agree on every default."""
    import inspect

    config = PackingConfig(max_input_seq_length=64)
    signature = inspect.signature(PackingTaskEncoder.__init__).parameters
    for knob in KNOBS:
        assert signature[knob.name].kind is inspect.Parameter.KEYWORD_ONLY
        if knob.required:
            assert signature[knob.name].default is inspect.Parameter.empty
            continue
        assert getattr(config, knob.name) == knob.default == signature[knob.name].default
        assert getattr(getattr(config, knob.section), knob.name) == knob.default
    assert PackingTaskEncoder(tokenizer="bundled", max_input_seq_length=64).config == config


def test_the_readme_knob_table_is_the_declarations():
    """Names, sections, defaults, the pack-deciding and restore columns: the docs == config."""
    from helpers import REPO

    page = (REPO / "docs" / "configuration.md").read_text()
    assert knob_table() in page, "docs/configuration.md's knob table differs from knob_table()"
    rows = [line for line in page.splitlines() if line.startswith("| `") and "| packing |" in line]
    assert rows  # the scan finds the table (a scan that finds nothing proves nothing)
    for knob in KNOBS:
        assert (
            sum(
                line.startswith(f"| `{knob.name}` | {knob.section} |") for line in page.splitlines()
            )
            == 1
        )


def test_sections_hold_the_fields_and_flat_names_read_them():
    config = PackingConfig(
        max_input_seq_length=64, carry=True, max_turns=3, train_on="last_assistant"
    )
    assert config.packing.carry and config.carry
    assert config.samples.max_turns == 3 == config.max_turns == config.limits.max_turns
    assert config.layout.train_on == "last_assistant" == config.train_on
    assert config.limits.max_images == 16 and config.vision.max_pixels == 28 * 28 * 1280
    assert config.replace(carry=False).carry is False and config.carry
    with pytest.raises(AttributeError):
        config.carry = False
    import pickle

    assert pickle.loads(pickle.dumps(config)) == config


@pytest.mark.parametrize("knob", sorted(KNOB_CASES))
def test_every_knob_changes_behaviour(knob):
    if knob in PROCESSOR_MEDIA_CASES:
        require_processor_media()
    base, changed, *observer = KNOB_CASES[knob]
    run = observer[0] if observer else observe
    assert run(**base) != run(**changed), f"{knob} was accepted but changed nothing"
