from __future__ import annotations

import os

import pytest

# Energon's first buffer fill shows a tqdm bar; keep test output readable.
os.environ.setdefault("TQDM_DISABLE", "1")

# pytest-xdist runs N workers; torch's default of one intra-op thread per core in each of them
# oversubscribes the machine N times over. One share of the cores per worker (inherited by the
# CLI and gloo subprocesses the tests start): the default suite on 2 cores went 6m46s -> 4m52s.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    _share = (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, _share)))

    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


@pytest.fixture(autouse=True)
def _no_leftover_loader_workers():
    yield
    from helpers import stop_workers

    stop_workers()


@pytest.fixture(scope="session")
def synth_dataset(tmp_path_factory):
    """120 generated conversations (0-3 images, both content styles) in 3 shards, prepared."""
    from helpers import make_dataset

    from energon_packing.testing.synth import conversations

    return make_dataset(tmp_path_factory.mktemp("synth"), conversations(120, seed=7), per_shard=40)


@pytest.fixture(scope="session")
def tokenizer():
    from energon_packing.encoding.tokenizer import ChatTokenizer

    return ChatTokenizer("bundled")


def pytest_collection_modifyitems(config, items):
    """A test of a ``family`` whose processor the installed transformers lacks (or cannot
    import without torchvision) skips, naming why. ``processor_media`` tests need a family's
    placeholder expansion; on a release without one (for the test's ``family`` parameter, else
    Qwen2-VL) they skip, naming what it lacks (docs/compatibility.md). ``torchvision`` tests
    skip, naming it, where torchvision does not import (Gemma 3n's: timm, which imports it)."""
    from helpers import family_unavailable_reason, processor_media_skip_reason, torchvision_missing

    for item in items:
        missing = item.get_closest_marker("torchvision") and torchvision_missing(
            item.module.__name__
        )
        if missing:
            item.add_marker(pytest.mark.skip(reason=missing))
            continue
        params = getattr(item, "callspec", None)
        family = params.params.get("family") if params else None
        # a family whose processor this release lacks (or cannot import): every test of it
        unavailable = family_unavailable_reason(family) if isinstance(family, str) else None
        if unavailable:
            item.add_marker(pytest.mark.skip(reason=unavailable))
            continue
        if not item.get_closest_marker("processor_media"):
            continue
        reason = processor_media_skip_reason(family if isinstance(family, str) else "qwen2_vl")
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))
