"""Restoring after a shard changed (issue 25 item 4): deleted, cut, rewritten or touched, while
the job ran or while it was down, with 0 and 2 workers, the restore refuses in one line that
names the shard and the fix; it never resumes with conversations in no pack and no skip."""

from __future__ import annotations

import os
import shutil

import pytest
from helpers import loader_batches, make_dataset, stop_workers

from energon_packing import PackingTaskEncoder, ShardChangedError
from energon_packing.testing.synth import conversations

pytestmark = pytest.mark.energon

S = pytest.mark.slow
KNOBS = dict(tokenizer="bundled", max_input_seq_length=2048, carry=True)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    return make_dataset(
        tmp_path_factory.mktemp("pristine"), conversations(90, seed=4), per_shard=30
    )


def delete(shard):
    shard.unlink()


def cut(shard):
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 10])


def rewrite(shard):
    """Other conversations under the same name (as a regenerated shard would be)."""
    from energon_packing.testing.synth import write_shards

    (written,) = write_shards(shard.parent / "new", conversations(30, seed=99), per_shard=30)
    shutil.move(written, shard)


def touch(shard):
    os.utime(shard, ns=(shard.stat().st_atime_ns, shard.stat().st_mtime_ns + 10**9))


CHANGES = {"deleted": delete, "cut": cut, "rewritten": rewrite, "touched": touch}
MESSAGES = {
    "deleted": "is missing",
    "cut": "is [0-9,]+ bytes where it was [0-9,]+",
    "rewritten": "(is [0-9,]+ bytes where it was [0-9,]+|was modified .*)",
    "touched": r"was modified \(same size; mtime .* UTC in the checkpoint\)",
}


def run(path, workers, change=None, *, midrun):
    """Reads 3 batches, saves, restores into a new loader; ``change`` hits shard 1 after the
    first loader was built (``midrun``: before the save) or after the save (the job down)."""
    shard = path / "shards" / "shard-00001.tar"
    loader = loader_batches(path, PackingTaskEncoder(**KNOBS), workers=workers, savable=True)
    batches = iter(loader)
    next(batches)
    if change and midrun:
        change(shard)
    next(batches), next(batches)
    state = loader.save_state_rank()
    del batches
    if change and not midrun:
        change(shard)

    def resume():  # without workers Energon restores at once, with workers as each one starts
        restored = loader_batches(path, PackingTaskEncoder(**KNOBS), workers=workers, savable=True)
        restored.restore_state_rank(state)
        return [k for batch in restored for row in batch["source_ids"] for k in row]

    return resume, shard


@pytest.mark.parametrize("midrun", [False, True], ids=["while down", "mid-run"])
@pytest.mark.parametrize("kind", list(CHANGES))
def test_a_changed_shard_refuses_the_restore_naming_it(pristine, tmp_path, kind, midrun):
    path = tmp_path / "data"
    shutil.copytree(pristine, path, symlinks=True, copy_function=shutil.copy2)
    resume, shard = run(path, 0, CHANGES[kind], midrun=midrun)
    with pytest.raises(ShardChangedError, match=f"{shard} {MESSAGES[kind]} since the checkpoint"):
        resume()


# both under -m slow (.ci/run): 12 s with workers, the default suite's time; the default suite
# keeps every refusal without workers
@pytest.mark.parametrize(
    "kind, midrun", [pytest.param("cut", False, marks=S), pytest.param("deleted", True, marks=S)]
)
def test_with_workers_the_refusal_reaches_the_caller(pristine, tmp_path, kind, midrun):
    """Energon restores inside each worker: the refusal comes from there, by name."""
    path = tmp_path / "data"
    shutil.copytree(pristine, path, copy_function=shutil.copy2)
    resume, shard = run(path, 2, CHANGES[kind], midrun=midrun)
    with pytest.raises(ShardChangedError, match=f"{shard} {MESSAGES[kind]}"):
        resume()


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=S)])
def test_unchanged_shards_resume_where_the_run_was(pristine, tmp_path, workers):
    """The control: nothing changed, so the restore resumes; the packs before the save and
    after the restore are the uninterrupted run's, in order."""
    path = tmp_path / "data"
    shutil.copytree(pristine, path, copy_function=shutil.copy2)

    def packs(loader):
        return [row for batch in loader for row in batch["source_ids"]]

    whole = packs(loader_batches(path, PackingTaskEncoder(**KNOBS), workers=workers))
    stop_workers()
    loader = loader_batches(path, PackingTaskEncoder(**KNOBS), workers=workers, savable=True)
    batches = iter(loader)
    seen = [row for _ in range(3) for row in next(batches)["source_ids"]]
    state = loader.save_state_rank()
    del batches
    stop_workers()
    restored = loader_batches(path, PackingTaskEncoder(**KNOBS), workers=workers, savable=True)
    restored.restore_state_rank(state)
    assert seen + packs(restored) == whole
    stop_workers()


def test_the_fingerprint_is_saved_per_shard(pristine):
    loader = loader_batches(pristine, PackingTaskEncoder(**KNOBS), savable=True)
    batches = iter(loader)
    next(batches)
    state = loader.save_state_rank()
    del batches
    text = repr(state)
    for shard in sorted((pristine / "shards").glob("*.tar")):
        stat = shard.stat()
        assert f"[{stat.st_size}, {stat.st_mtime_ns}, 30]" in text


def test_a_touched_shard_names_the_mtime_that_restores_it(pristine, tmp_path):
    """Running the message's ``touch`` puts the mtime back to the nanosecond: the restore then
    resumes."""
    import shlex
    import subprocess

    path = tmp_path / "data"
    shutil.copytree(pristine, path, copy_function=shutil.copy2)
    resume, _ = run(path, 0, touch, midrun=False)
    with pytest.raises(ShardChangedError, match=r"`(touch -d @\d+\.\d{9} \S+)`") as info:
        resume()
    command = str(info.value).split("`")[1]
    subprocess.run(shlex.split(command), check=True)
    assert resume()  # the rest of the epoch


@pytest.mark.parametrize("check, resumes", [("size", {"touched"}), ("strict", set())])
def test_shard_check_relaxes_what_a_restore_compares(pristine, tmp_path, check, resumes):
    """``shard_check='size'`` lets a shard copied without its mtime resume and still refuses
    a cut one."""
    for kind in ("touched", "cut"):
        path = tmp_path / kind
        shutil.copytree(pristine, path, copy_function=shutil.copy2)
        knobs = {**KNOBS, "shard_check": check}
        loader = loader_batches(path, PackingTaskEncoder(**knobs), savable=True)
        batches = iter(loader)
        next(batches)
        state = loader.save_state_rank()
        del batches
        CHANGES[kind](path / "shards" / "shard-00001.tar")
        restored = loader_batches(path, PackingTaskEncoder(**knobs), savable=True)
        if kind in resumes:
            restored.restore_state_rank(state)
            assert [row for batch in restored for row in batch["source_ids"]]
        else:
            with pytest.raises(ShardChangedError, match=MESSAGES[kind]):
                restored.restore_state_rank(state)
                next(iter(restored))


def test_a_shard_that_cannot_be_stated_is_named_in_a_warning(pristine, tmp_path, caplog):
    path = tmp_path / "data"
    shutil.copytree(pristine, path, copy_function=shutil.copy2)
    (path / "shards" / "shard-00002.tar").unlink()
    with caplog.at_level("WARNING", logger="energon_packing"):
        loader_batches(path, PackingTaskEncoder(**KNOBS), savable=True)
    assert "1 of 3 shards cannot be stat'ed (e.g. " in caplog.text
    assert "shard-00002.tar: missing, or remote storage)" in caplog.text
