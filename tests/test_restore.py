"""Restoring a loader's state: every pack-deciding knob is checked, by its own declaration.

The cases are derived from :data:`energon_packing.config.KNOBS` (a knob added later is covered
without editing this file): each knob marked "decides packs" gets a changed value from its type
(its rule "may be raised": a lower one), the loader is restored with it, and the error must
name the knob and both values.
"""

from __future__ import annotations

import dataclasses
import itertools

import pytest
from helpers import SAMPLE_DATA, loader_batches, require_processor_media

from energon_packing import PackingTaskEncoder, RestoreMismatchError
from energon_packing.config import BUILTIN, KNOBS, MAY_RAISE

pytestmark = pytest.mark.energon

BUFFER = 8
#: every knob at a value whose neighbours are valid too (delta needs its algorithm)
BASE = dict(tokenizer="bundled", max_input_seq_length=1024, carry=True)
CONTEXT = {"delta": {"algorithm": "balanced_greedy_knapsack"}}


def settings(te) -> dict:
    """What the loader saves (effective values: derived defaults filled in)."""
    from megatron.energon import WorkerConfig

    config = WorkerConfig(rank=0, world_size=1, num_workers=0)
    return te.restore_settings(packing_buffer_size=BUFFER, worker_config=config)


def changed_value(knob, value):
    """Another valid value of ``knob`` than ``value``, from its type and declaration."""
    if knob.choices:
        return next(c for c in knob.choices if c != value)
    if knob.restore == MAY_RAISE:  # lowering may refuse a conversation waiting in the buffer
        return 3 if value is None else value - 1  # None: no limit (max_video_tokens)
    if knob.name == "video_config":
        return {"fps": 1.0}
    if isinstance(value, bool):
        return not value
    if value is None:  # an optional int such as max_per_pack
        return 3
    if isinstance(value, float):
        return value / 2
    if knob.name == "pad_multiple":
        return value * 2  # still divides C
    return value * 2 if value else 1


def _loader(te, **kwargs):
    return loader_batches(SAMPLE_DATA, te, buffer=BUFFER, savable=True, **kwargs)


def _saved(knobs: dict):
    loader = _loader(PackingTaskEncoder(**knobs))
    batches = iter(loader)
    next(batches), next(batches)
    return loader.save_state_rank(), batches


@pytest.fixture(scope="module")
def saved_states():
    """knob context -> (base knobs, state saved after 2 batches)."""
    states = {}
    for context in [{}, *CONTEXT.values()]:
        knobs = {**BASE, **context}
        states[tuple(sorted(context.items()))] = (knobs, _saved(knobs)[0])
    return states


DECIDING = [k for k in KNOBS if k.decides and BUILTIN in k.paths]


@pytest.mark.parametrize("knob", DECIDING, ids=lambda k: k.name)
def test_a_changed_pack_deciding_knob_refuses_the_restore(knob, saved_states):
    context = CONTEXT.get(knob.name, {})
    knobs, state = saved_states[tuple(sorted(context.items()))]
    old = settings(PackingTaskEncoder(**knobs))[knob.name]
    new = changed_value(knob, old)
    restored = _loader(PackingTaskEncoder(**{**knobs, knob.name: new}))
    with pytest.raises(RestoreMismatchError, match=rf"saved with {knob.name}={old!r},") as info:
        restored.restore_state_rank(state)
    assert f"this loader has {knob.name}={new!r}" in str(info.value)
    assert knob.restore in str(info.value)


def test_the_cases_cover_every_declared_pack_deciding_knob():
    """Only chat_template_kwargs, tokens_per_second and audio_config (processor path) are
    left to the processor tests."""
    left = {k.name for k in KNOBS if k.decides} - {k.name for k in DECIDING}
    assert left == {"chat_template_kwargs", "tokens_per_second", "audio_config"}
    assert len(DECIDING) >= 20


def test_a_lowered_limit_is_refused_before_energon_rereads_the_buffer(saved_states):
    """max_turns=1 refuses every waiting conversation: without the check Energon's restore
    would stop at the first one with "Unexpected skip sample ... during restoration"."""
    knobs, state = saved_states[()]
    restored = _loader(PackingTaskEncoder(**{**knobs, "max_turns": 1}))
    with pytest.raises(RestoreMismatchError, match="max_turns=512,.*max_turns=1: .*or higher"):
        restored.restore_state_rank(state)


def test_another_chat_layout_is_refused(saved_states, monkeypatch):
    """The layout's fingerprint (tokenizer or processor, chat template, special ids) is a
    setting like the knobs: another one refuses the restore."""
    knobs, state = saved_states[()]
    te = PackingTaskEncoder(**knobs)
    before = getattr(te.chat, "fingerprint", None)
    monkeypatch.setattr(type(te.chat), "fingerprint", "another-layout", raising=False)
    restored = _loader(PackingTaskEncoder(**knobs))
    with pytest.raises(RestoreMismatchError, match=f"chat_fingerprint={before!r},"):
        restored.restore_state_rank(state)


def test_a_restore_under_other_transformers_rules_is_refused(saved_states, monkeypatch):
    """The transformers rules that change ids, pixels, positions or masks by release
    (``hf_compat.PACK_RULES``) are part of what a checkpoint holds: restored under a release
    where one of them differs, the loader refuses, naming the rule and both releases; under
    another release with the same rules (a patch release), it restores."""
    from energon_packing.encoding import hf_compat

    knobs, state = saved_states[()]
    saved = hf_compat.pack_rules()
    installed = hf_compat.transformers_version()
    other = (5, 5, 4) if installed is None or installed >= (5, 6, 0) else (5, 24, 0)
    differing = next(
        rule
        for rule in hf_compat.PACK_RULES
        if hf_compat.rule_in_force(rule, other) != hf_compat.rule_in_force(rule, installed)
    )
    monkeypatch.setattr(hf_compat, "transformers_version", lambda: other)
    restored = _loader(PackingTaskEncoder(**knobs))
    with pytest.raises(RestoreMismatchError) as info:
        restored.restore_state_rank(state)
    message = str(info.value)
    assert "\n" not in message
    assert f"rule {differing} (since " in message
    assert f"release {saved['release']} " in message
    assert f"release {'.'.join(map(str, other))} " in message
    if installed is not None:  # the same rules under another patch release: restored
        patch = (*installed[:2], installed[2] + 1)
        monkeypatch.setattr(hf_compat, "transformers_version", lambda: patch)
        _loader(PackingTaskEncoder(**knobs)).restore_state_rank(state)


def _keys(batches) -> tuple[list, list]:
    packed, skipped = [], []
    for batch in batches:
        packed += [key for keys in batch["source_ids"] for key in keys]
        skipped += [tuple(event) for event in batch["packing_skipped"]]
    return packed, skipped


def test_raising_a_limit_that_binds_nothing_restores_to_the_same_packs():
    """max_turns 9 -> 64 (no conversation has more than 9 messages): the restored loader goes
    on exactly as the saved one would have."""
    knobs = {**BASE, "max_turns": 9}
    state, rest = _saved(knobs)
    expected = [b["source_ids"] for b in itertools.islice(rest, 3)]
    restored = _loader(PackingTaskEncoder(**{**knobs, "max_turns": 64}))
    restored.restore_state_rank(state)
    assert [b["source_ids"] for b in itertools.islice(restored, 3)] == expected


@pytest.mark.slow  # a whole epoch: ~10 s
def test_raising_a_binding_limit_restores_and_loses_nothing():
    """max_turns 4 -> 64 mid-epoch: the restore takes the conversations waiting in the buffer
    as they were, later reads accept what the old limit refused, and every conversation of
    the epoch lands once: packed before the save, skipped before it, or packed after."""
    knobs = {**BASE, "carry": False, "max_turns": 4}
    loader = _loader(PackingTaskEncoder(**knobs))
    before = _keys(itertools.islice(loader, 2))
    state = loader.save_state_rank()
    raised = PackingTaskEncoder(**{**knobs, "max_turns": 64, "max_skips_without_pack": 5})
    restored = _loader(raised)
    restored.restore_state_rank(state)
    after, skipped_after = _keys(restored)
    assert ("sample000300", "too_many_turns") in before[1]  # the old limit refused some
    assert all(reason != "too_many_turns" for _, reason in skipped_after)  # the new one none
    everything = before[0] + after + [key for key, _ in before[1] + skipped_after]
    assert sorted(everything) == [f"sample{i:06d}" for i in range(400)]


@pytest.mark.slow
def test_chat_template_kwargs_refuses_the_restore_on_the_processor_path():
    from energon_packing.testing.families import build

    processor = build("qwen2_vl")[0]
    knobs = dict(processor=processor, max_input_seq_length=8192)
    loader = _loader(PackingTaskEncoder(**knobs))
    next(iter(loader))
    state = loader.save_state_rank()
    changed = PackingTaskEncoder(**knobs, chat_template_kwargs={"add_vision_id": True})
    with pytest.raises(RestoreMismatchError, match="chat_template_kwargs=None,"):
        _loader(changed).restore_state_rank(state)


def test_audio_config_refuses_the_restore_on_an_audio_family():
    """The feature extractor's settings decide an audio clip's tokens: another
    ``audio_config`` (and the audio rule, in the processor's fingerprint) refuses the restore."""
    from energon_packing.testing.families import build

    require_processor_media("qwen2_5_omni")  # skips, naming what an older release lacks
    processor = build("qwen2_5_omni", model=False)[0]
    knobs = dict(processor=processor, max_input_seq_length=8192)
    loader = _loader(PackingTaskEncoder(**knobs))
    next(iter(loader))
    state = loader.save_state_rank()
    changed = PackingTaskEncoder(**knobs, audio_config={"hop_length": 320})
    with pytest.raises(RestoreMismatchError, match="audio_config=None,"):
        _loader(changed).restore_state_rank(state)


@pytest.mark.slow
def test_with_workers_the_refusal_comes_from_the_worker_before_any_reread():
    """With workers Energon restores inside each worker as it starts: the refusal is raised
    there, before the worker's buffers re-read a sample, and reaches the caller by name."""
    knobs = {**BASE, "max_turns": 9}
    loader = _loader(PackingTaskEncoder(**knobs), workers=2)
    batches = iter(loader)
    next(batches), next(batches), next(batches)
    state = loader.save_state_rank()
    del batches
    restored = _loader(PackingTaskEncoder(**{**knobs, "max_turns": 1}), workers=2)
    restored.restore_state_rank(state)
    with pytest.raises(RestoreMismatchError, match="max_turns=9,.*max_turns=1"):
        next(iter(restored))


def _old_units(node, empty, per_square):
    """The state as release 0.3 saved it: balance costs as sums of squared lengths."""
    if isinstance(node, dict):
        out = type(node)({k: _old_units(v, empty, per_square) for k, v in node.items()})
        loop = out.get("_loop_state")
        if isinstance(loop, dict):
            for name in ("history", "pool_costs"):
                loop[name] = [(v - empty) // per_square for v in loop[name]]
            _old_units.found += 1
        return out
    if isinstance(node, list | tuple):
        return type(node)(_old_units(v, empty, per_square) for v in node)
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        return dataclasses.replace(
            node,
            **{
                f.name: _old_units(getattr(node, f.name), empty, per_square)
                for f in dataclasses.fields(node)
                if f.init
            },
        )
    return node


def test_a_balanced_state_saved_in_attention_units_restores_to_the_same_packs():
    from types import SimpleNamespace

    knobs = {**BASE, "balance_window": 4}
    saved = _saved(knobs)[0]
    whole = _loader(PackingTaskEncoder(**knobs))
    expected = [b["source_ids"] for b in itertools.islice(iter(whole), 6)][2:]
    te = PackingTaskEncoder(**knobs)
    empty = te.pack_cost([])
    per_square = te.pack_cost([SimpleNamespace(length=1)]) - empty
    _old_units.found = 0
    state = _old_units(saved, empty, per_square)
    assert _old_units.found  # the loop's costs were rewritten
    restored = _loader(PackingTaskEncoder(**knobs))
    restored.restore_state_rank(state)
    assert [b["source_ids"] for b in itertools.islice(iter(restored), 4)] == expected


@pytest.mark.processor_media
def test_a_changed_video_rule_refuses_the_restore():
    """The effective video rule is saved beside the knobs: a processor whose own video
    settings differ (a directory's, not a knob) refuses the restore; a state an older release
    saved without the rule restores."""
    from energon_packing.loader.energon import compare_settings
    from energon_packing.loader.task_encoder import RESTORE_RULES
    from energon_packing.testing.families import build

    def saved_by(processor):
        te = PackingTaskEncoder(processor=processor, max_input_seq_length=1024)
        return settings(te)

    first = saved_by(build("qwen2_vl", model=False)[0])
    other = build("qwen2_vl", model=False)[0]
    other.video_settings = {"do_sample_frames": True, "fps": 1.0}
    changed = saved_by(other)
    assert first["chat_fingerprint"] == changed["chat_fingerprint"]
    with pytest.raises(
        RestoreMismatchError,
        match=r"saved with video_rule=.VideoRule\(family='qwen2_vl', sample=False",
    ):
        compare_settings(first, changed, RESTORE_RULES)
    older = {k: v for k, v in first.items() if k != "video_rule"}
    compare_settings(older, changed, RESTORE_RULES)
