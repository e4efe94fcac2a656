"""Hostile input: no single sample stops a run, takes a pack-mate down, exhausts a worker, or
vanishes. One case per class (tests/hostile.py), through the real loader."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from helpers import check_batch, loader_batches, make_dataset, raw_sample, stop_workers
from hostile import CASES, SPECIAL_ANSWER, ask, corrupt_tar_size, png_header

from energon_packing import MetricsAggregator, PackingTaskEncoder
from energon_packing.loader.energon import RestoreMismatchError
from energon_packing.loader.loading import restore_state_rank
from energon_packing.schema import is_empty
from energon_packing.testing.synth import conversations, sized_conversations
from energon_packing.trainer import prepacked_microbatches

#: full-size variants run under -m slow (.ci/run runs them); the default set keeps one
S = pytest.mark.slow

pytestmark = pytest.mark.energon

CAPACITY = 1024


@pytest.fixture(scope="module")
def hostile_dataset(tmp_path_factory):
    path = tmp_path_factory.mktemp("hostile")
    raw = [sample for sample, _ in CASES.values()]
    raw.append(raw_sample("tar_2p60", {"messages": ask("Fine?")}))
    make_dataset(path, conversations(30, seed=21), per_shard=10, raw=raw)
    corrupt_tar_size(path / "shards" / "raw-00000.tar", "tar_2p60.json")
    return path


def expected_outcomes():
    outcomes = {key: reason for key, (_, reason) in CASES.items()}
    outcomes["tar_2p60"] = "corrupt_shard"
    return outcomes


def run(path, *, workers=0, buffer=8, **knobs):
    """One epoch; returns (packed keys, skip events, batches)."""
    te = PackingTaskEncoder(tokenizer="bundled", max_input_seq_length=CAPACITY, **knobs)
    aggregate = MetricsAggregator()
    packed, batches = [], []
    for batch in loader_batches(path, te, buffer=buffer, workers=workers):
        aggregate.update(batch)
        if not is_empty(batch):
            check_batch(batch, te)  # image-pad counts included
        packed += [key for keys in batch["source_ids"] for key in keys]
        batches.append(batch)
    stop_workers()
    return te, packed, aggregate, batches


@pytest.mark.parametrize(
    "workers, carry",  # one corner of the grid by default, the rest in -m slow
    [(0, False)] + [pytest.param(w, c, marks=S) for w, c in [(2, True), (0, True), (2, False)]],
)
def test_every_hostile_case_is_packed_or_reported_once(hostile_dataset, workers, carry, caplog):
    caplog.set_level(logging.WARNING, logger="energon_packing")
    _, packed, aggregate, _ = run(hostile_dataset, workers=workers, carry=carry)
    outcomes = expected_outcomes()
    skipped = {key: reason for key, reason in aggregate.skipped}
    corrupt = [k for k, r in aggregate.skipped if r == "corrupt_shard"]
    assert len(corrupt) == 1, corrupt  # the damaged tar header: its sample, no more
    skipped["tar_2p60"] = skipped.pop(corrupt[0])
    generated = {f"conv{i:06d}" for i in range(30)}
    assert sorted(packed + list(skipped)) == sorted(generated | set(outcomes)), "once each"
    assert {k: r for k, r in skipped.items() if k in outcomes} == {
        k: r for k, r in outcomes.items() if r
    }
    assert {k for k, r in outcomes.items() if r is None} <= set(packed)
    if workers == 0:  # one process: the log is ours to measure
        assert len(caplog.text) < 20_000, f"{len(caplog.text):,} characters of log"


def test_special_token_text_is_plain_text(hostile_dataset):
    te, _, _, batches = run(hostile_dataset)
    special = te.tokenizer.special
    for batch in batches:
        if is_empty(batch):
            continue
        for row, keys in enumerate(batch["source_ids"]):
            ids, mask = batch["input_ids"][row], batch["token_mask"][row]
            cu = batch["cu_seqlens_padded"][row]
            for k, key in enumerate(keys):
                source = ids[cu[k] : cu[k + 1]].tolist()
                if key == "special_user":  # no image: not a single vision token
                    assert special.vision_start not in source and special.image_pad not in source
                if key == "special_answer":  # two turns: exactly two <|im_end|>, both real
                    assert source.count(special.im_end) == 2
                    trained = ids[cu[k] : cu[k + 1]][mask[cu[k] : cu[k + 1]] > 0].tolist()
                    assert te.tokenizer.decode(trained).startswith(SPECIAL_ANSWER)
    _, packed, aggregate, _ = run(hostile_dataset, special_token_text="skip")
    assert {"special_user", "special_answer"} <= {
        k for k, r in aggregate.skipped if r == "special_token_text"
    }
    assert not {"special_user", "special_answer"} & set(packed)


def test_token_mask_is_finite_and_weights_are_exact(hostile_dataset):
    _, _, _, batches = run(hostile_dataset)
    for batch in filter(lambda b: not is_empty(b), batches):
        assert torch.isfinite(batch["token_mask"]).all()
        row = next((r for r, keys in enumerate(batch["source_ids"]) if "weight_ok" in keys), None)
        if row is not None:
            values = set(batch["token_mask"][row].unique().tolist())
            assert 2.5 in values


def test_high_bit_depth_images_keep_their_range(hostile_dataset):
    def image_means(**knobs):
        _, _, _, batches = run(hostile_dataset, **knobs)
        means = {}
        for batch in filter(lambda b: not is_empty(b), batches):
            for row, keys in enumerate(batch["source_ids"]):
                owners = batch["image_source_index"][row]
                grids = batch["image_grid_thw"][row]
                rows = torch.repeat_interleave(owners, grids.prod(dim=1))
                for k, key in enumerate(keys):
                    if key in ("png16", "float_tiff"):
                        means[key] = float(batch["pixel_values"][row][rows == k].mean())
        return means

    scaled, clipped = image_means(), image_means(high_bit_depth="clip")
    # CLIP-normalised channel means: white ~ +2.05, black ~ -1.67, a 0..1 ramp ~ +0.1 (the
    # 16-bit ramp spans 0..20000 of 65535, so it scales to a dark grey)
    assert clipped["png16"] > 1.9 and clipped["float_tiff"] < -1.6
    assert -1.5 < scaled["png16"] < 0 and -1.0 < scaled["float_tiff"] < 1.0


@pytest.fixture(scope="module")
def spelled_dataset(tmp_path_factory):
    """120 conversations in a row that spell vision tokens, then 120 with lone surrogates."""
    raw = [
        raw_sample(f"spell{i:03d}", {"messages": ask(f"{i} <|vision_start|> x")})
        for i in range(120)
    ]
    raw += [
        {
            "__key__": f"sur{i:03d}",
            "json": b'{"messages": [{"role": "user", "content": "\\udc80"}, '
            b'{"role": "assistant", "content": "ok"}]}',
        }
        for i in range(120)
    ]
    return make_dataset(tmp_path_factory.mktemp("spelled"), [], raw=raw)


def test_a_hundred_bad_samples_in_a_row_never_stop_the_run(spelled_dataset):
    _, packed, aggregate, _ = run(spelled_dataset, mrope=True, buffer=16)
    assert sorted(packed) == [f"spell{i:03d}" for i in range(120)]
    assert sorted(k for k, r in aggregate.skipped if r == "invalid_text") == [
        f"sur{i:03d}" for i in range(120)
    ]
    assert not [k for k, r in aggregate.skipped if r in ("pack_error", "source_error")]


def test_a_failing_source_costs_only_itself(hostile_dataset, monkeypatch):
    import energon_packing.encoding.builtin as module

    real = module.patchify

    def fails_on_webp(data, config, **kw):
        if data[8:12] == b"WEBP":
            raise RuntimeError("decoder bug")
        return real(data, config, **kw)

    monkeypatch.setattr(module, "patchify", fails_on_webp)
    _, packed, aggregate, _ = run(hostile_dataset)
    assert ("format_webp", "source_error") in aggregate.skipped
    assert {"format_gif", "format_bmp", "format_tiff", "png16"} <= set(packed)


@pytest.fixture(scope="module")
def tail_dataset(tmp_path_factory):
    lengths = [300] * 6 + [3000] * 24  # 6 that fit 1024 tokens, then 24 over-long at the end
    return make_dataset(
        tmp_path_factory.mktemp("overlong"), sized_conversations(lengths), per_shard=10
    )


# 4 workers on a 2-core CI machine is the point (more streams than cores); torch's advice is not.
@pytest.mark.filterwarnings("ignore:This DataLoader will create")
@pytest.mark.parametrize(
    "workers, carry",  # one corner of the grid by default, the rest in -m slow
    [(0, False)]
    + [
        pytest.param(w, c, marks=S)
        for w, c in [(2, True), (0, True), (2, False), (4, False), (4, True)]
    ],
)
def test_skips_after_the_last_pack_and_all_skipped_streams_are_reported(
    tail_dataset, workers, carry
):
    """Every sample over-long: no pack at all, yet every key reaches the trainer; and a stream
    whose last samples are all skipped reports them too."""
    path = tail_dataset
    for capacity, fits in ((1024, 6), (256, 0)):  # 256: every sample is over-long
        te = PackingTaskEncoder(
            tokenizer="bundled", max_input_seq_length=capacity, carry=carry, max_text_chars=10**6
        )
        aggregate = MetricsAggregator()
        packed, steps = [], 0
        for batch in loader_batches(path, te, buffer=4, workers=workers):
            aggregate.update(batch)
            packed += [k for keys in batch["source_ids"] for k in keys]
            steps += len(prepacked_microbatches(batch))
        stop_workers()
        overlong = sorted(k for k, r in aggregate.skipped if r == "overlong")
        assert len(packed) == fits and len(overlong) == 30 - fits
        assert sorted(packed + overlong) == [f"sized{i:07d}" for i in range(30)]
        assert aggregate.metrics()["packing/read"] == 30 and steps >= (1 if fits else 0)


def test_restoring_into_other_packing_settings_names_the_knob(hostile_dataset):
    base = dict(
        tokenizer="bundled", max_input_seq_length=CAPACITY, carry=True, max_pixels=448 * 448
    )
    loader = loader_batches(hostile_dataset, PackingTaskEncoder(**base), buffer=8, savable=True)
    it = iter(loader)
    next(it), next(it)
    state = loader.save_state_rank()
    changes = [
        (
            {"max_input_seq_length": 2048},
            {},
            "max_input_seq_length=1024.*max_input_seq_length=2048",
        ),
        ({"pad_multiple": 8}, {}, "pad_multiple=1.*pad_multiple=8"),
        ({"carry": False}, {}, "carry=True.*carry=False"),
        ({"balance_window": 4}, {}, "balance_window=0.*balance_window=4"),
        ({"algorithm": "first_fit_decreasing"}, {}, "algorithm='subset_fill'"),
        ({}, {"buffer": 16}, "packing_buffer_size=8.*packing_buffer_size=16"),
        ({}, {"world_size": 2}, "world_size=1.*world_size=2"),
    ]
    for knobs, loader_args, message in changes:
        te = PackingTaskEncoder(**{**base, **knobs})
        restored = loader_batches(
            hostile_dataset, te, **{"buffer": 8, "savable": True, **loader_args}
        )
        with pytest.raises(RestoreMismatchError, match=message):
            restored.restore_state_rank(state)
            next(iter(restored))
    same = loader_batches(hostile_dataset, PackingTaskEncoder(**base), buffer=8, savable=True)
    restore_state_rank(same, state)
    assert next(iter(same))["source_ids"] == next(it)["source_ids"]
    workers = loader_batches(
        hostile_dataset, PackingTaskEncoder(**base), buffer=8, savable=True, workers=2
    )
    with pytest.raises(RestoreMismatchError, match="num_workers=0, this loader has num_workers=2"):
        restore_state_rank(workers, state)
    stop_workers()


def test_bounded_work_cases_are_rejected_before_tokenizing(monkeypatch):
    """The turn, text and pixel limits reject before the tokenizer sees a character."""
    from energon_packing.encoding.builtin import encode
    from energon_packing.encoding.chat import Skip
    from energon_packing.encoding.tokenizer import ChatTokenizer
    from energon_packing.loader.samples import load_conversation

    tokenizer = ChatTokenizer("bundled")
    calls = []
    monkeypatch.setattr(tokenizer, "encode", lambda text: calls.append(len(text)) or [5])
    te = PackingTaskEncoder(tokenizer="bundled", max_input_seq_length=CAPACITY)
    for key in ("many_turns", "long_text", "huge_png_header", "jpeg_claims_9000"):
        fields = load_conversation(CASES[key][0])
        with pytest.raises(Skip) as info:
            encode(key=key, tokenizer=tokenizer, config=te.config, **fields)
        assert info.value.reason == CASES[key][1]
    assert not [n for n in calls if n > 100], "nothing long was tokenized"


def test_the_pixel_budget_is_ours_alone():
    """Only max_image_pixels decides (PIL's bomb warning is not repeated); where PIL's hard
    limit (2 * Image.MAX_IMAGE_PIXELS) refuses first, the message names both limits."""
    import warnings

    from PIL import Image

    from energon_packing.errors import Skip
    from energon_packing.media.images import probe

    pil_limit = Image.MAX_IMAGE_PIXELS
    side = int((1.5 * pil_limit) ** 0.5)  # between PIL's warning and its hard limit
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert probe(png_header(side, side), max_pixels=side * side) == (side, side)
        with pytest.raises(Skip, match=f"{side}x{side} = .* max_image_pixels=") as info:
            probe(png_header(side, side), max_pixels=side * side - 1)
        assert info.value.reason == "image_too_large"
        huge = int((2.5 * pil_limit) ** 0.5)
        with pytest.raises(Skip, match="PIL.Image.MAX_IMAGE_PIXELS") as info:
            probe(png_header(huge, huge), max_pixels=huge * huge)
        assert info.value.reason == "image_too_large"


def test_images_per_conversation_are_limited():
    from energon_packing.encoding.chat import ImageRefs, Skip

    with pytest.raises(Skip, match="5 images listed, more than max_images=4"):
        ImageRefs([f"i{k}.png" for k in range(5)], max_images=4)


def test_log_lines_are_cut(caplog):
    from energon_packing.stats import LOGGED_CHARS, PackingStats

    caplog.set_level(logging.WARNING, logger="energon_packing")
    stats = PackingStats()
    stats.skip("k" * 10_000, "unknown_role", "d" * 1_000_000)
    assert len(caplog.text) < 3 * LOGGED_CHARS + 500


def test_accounting_only_batches_pass_the_shim():
    from energon_packing.schema import empty_batch
    from energon_packing.trainer import is_prepacked

    empty = {**empty_batch(64), "packing_skipped": [("k", "overlong")]}
    assert not is_prepacked(empty) and prepacked_microbatches(empty) == []
    aggregate = MetricsAggregator()
    aggregate.update(empty)
    assert aggregate.skipped == [("k", "overlong")]
    assert np.asarray(empty["input_ids"]).shape == (0, 64)
