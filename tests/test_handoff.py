"""The worker handoff (issue 34 item 3): inside a DataLoader worker ``collate`` lays a batch's
tensors out in shared memory, the small ones as views of one buffer per dtype, so a batch
crosses to the main process as a few storages; the batch is the main process's collate value
for value, and ``torch.save`` / ``torch.load`` of it works (every view has its storage's dtype).
"""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from helpers import loader_batches, source
from torch.multiprocessing import reductions
from torch.utils.data import DataLoader, IterableDataset

from energon_packing import PackingTaskEncoder
from energon_packing.encoding.positions import MRope
from energon_packing.schema import OWN_STORAGE_BYTES, collate, layout

SAMPLE_DATA = __import__("pathlib").Path(__file__).resolve().parents[1] / "sample_data"


def packs(*, big: bool = False, mrope: bool = True):
    """Two packs with every kind of field: mRoPE positions, image and video media (one pack
    without videos), a token field on one pack only; ``big``: pixels of >= 1 MiB."""
    spec = MRope(vision_start_id=3, image_pad_id=5) if mrope else None
    a = layout(
        [source("a", [1, 3, 5, 4, 9], [0, 0, 0, 0, 1], grids=[(1, 2, 2)], mrope=spec)],
        width=8,
        pad_multiple=1,
        pad_id=0,
    )
    rows = OWN_STORAGE_BYTES // (3 * 4) + 1 if big else 4
    a.media["pixel_values"] = np.arange(rows * 3, dtype=np.float32).reshape(rows, 3)
    a.token_fields["mm_token_type_ids"] = np.array([0, 0, 1, 0, 0, 0, 0, 0], dtype=np.int64)
    b = layout([source("b", [7, 8], [0, 1], mrope=spec)], width=8, pad_multiple=1, pad_id=0)
    b.video_source_index = np.array([0], dtype=np.int64)
    b.media["video_grid_thw"] = np.array([[2, 2, 2]], dtype=np.int64)
    b.media["pixel_values_videos"] = np.full((2, 6), 0.5, dtype=np.float32)
    return [a, b]


def tensors(batch: dict) -> dict[tuple[str, int | None], torch.Tensor]:
    """Every tensor of a batch by (key, row or None)."""
    out = {}
    for key, value in batch.items():
        if isinstance(value, torch.Tensor):
            out[key, None] = value
        elif isinstance(value, list):
            out.update({(key, i): v for i, v in enumerate(value) if isinstance(v, torch.Tensor)})
    return out


def assert_same_batch(got: dict, want: dict) -> None:
    """Same keys, the same non-tensor values, every tensor of the same dtype, shape and
    values, contiguous."""
    assert set(got) == set(want)
    got_t, want_t = tensors(got), tensors(want)
    assert set(got_t) == set(want_t)
    for place, w in want_t.items():
        g = got_t[place]
        assert (g.dtype, g.shape, g.is_contiguous()) == (w.dtype, w.shape, True), place
        assert torch.equal(g, w), place
    for key, value in want.items():
        if not isinstance(value, torch.Tensor | list) or key == "source_ids":
            assert got[key] == value, key


def storages(batch: dict) -> dict[int, torch.dtype]:
    """The distinct non-empty storages of a batch's tensors, each with its views' dtype (one
    dtype per storage, or the assertion fails)."""
    seen: dict[int, torch.dtype] = {}
    for place, t in tensors(batch).items():
        if t.numel():
            ptr = t.untyped_storage().data_ptr()
            assert seen.setdefault(ptr, t.dtype) == t.dtype, place
    return seen


@pytest.fixture
def in_a_worker(monkeypatch):
    """``collate`` as a DataLoader worker runs it."""
    monkeypatch.setattr(torch.utils.data, "get_worker_info", lambda: object())


@pytest.mark.parametrize("prepacked", [True, False])
@pytest.mark.parametrize("mrope", [True, False])
def test_a_workers_batch_is_the_main_batch_in_one_shared_buffer_per_dtype(
    prepacked, mrope, monkeypatch
):
    """Value for value the main process's collate (dtype, shape, contiguous); every non-empty
    tensor in shared memory, the small ones in one storage per dtype: 4 storages (int64,
    float32, int32, bool) where the main process has one per tensor."""
    main = collate(packs(mrope=mrope), prepacked=prepacked)
    monkeypatch.setattr(torch.utils.data, "get_worker_info", lambda: object())
    worker = collate(packs(mrope=mrope), prepacked=prepacked)
    assert_same_batch(worker, main)
    assert all(t.is_shared() for t in tensors(worker).values() if t.numel())
    kinds = {torch.int64, torch.float32, torch.int32, torch.bool}
    assert sorted(map(str, storages(worker).values())) == sorted(map(str, kinds))
    assert len(storages(main)) > len(kinds)
    assert not any(t.is_shared() for t in tensors(main).values())


def test_a_large_tensor_gets_a_storage_of_its_own(in_a_worker):
    """Pixels of >= OWN_STORAGE_BYTES are not laid out with the small float32 tensors (a
    consumer keeping token_mask does not keep the pixels alive); values unchanged; the pack's
    own array is not touched."""
    ps = packs(big=True)
    pixels = ps[0].media["pixel_values"]
    before = pixels.copy()
    batch = collate(ps)
    big = batch["pixel_values"][0]
    assert big.is_shared() and big.untyped_storage().nbytes() == pixels.nbytes
    assert big.untyped_storage().data_ptr() != batch["token_mask"].untyped_storage().data_ptr()
    assert torch.equal(big, torch.from_numpy(before)) and np.array_equal(pixels, before)
    assert len(storages(batch)) == 5  # int64, float32, int32, bool + the pixels


def test_a_workers_batch_survives_torch_save_and_load(in_a_worker):
    """torch.save refuses views of one storage as different dtypes; one buffer per dtype
    saves, and loads (weights_only) as the same batch."""
    batch = collate(packs())
    buffer = io.BytesIO()
    torch.save(batch, buffer)
    buffer.seek(0)
    assert_same_batch(torch.load(buffer, weights_only=True), batch)
    one = io.BytesIO()
    torch.save(batch["token_mask"], one)  # a single view saves as well
    one.seek(0)
    assert torch.equal(torch.load(one, weights_only=True), batch["token_mask"])


class Collated(IterableDataset):
    """``count`` batches collated in each DataLoader worker."""

    def __init__(self, count: int, *, big: bool = False):
        self.count, self.big = count, big

    def __iter__(self):
        for _ in range(self.count):
            yield collate(packs(big=self.big))


def test_two_workers_hand_over_one_storage_per_dtype(monkeypatch):
    """Through a real 2-worker DataLoader: each batch arrives as 4 shared-memory storages (4
    file descriptors; a per-tensor collate passes one per tensor), equals the main process's collate,
    and saves and loads with torch.save / torch.load."""
    received = []
    rebuild = reductions.rebuild_storage_fd

    def counted(*args):
        received.append(1)
        return rebuild(*args)

    batches = iter(DataLoader(Collated(3), batch_size=None, num_workers=2))
    # patched once the workers are forked: a worker pickles the rebuild function by name
    monkeypatch.setattr(reductions, "rebuild_storage_fd", counted)
    batches = list(batches)
    assert len(batches) == 6 and len(received) == 6 * 4
    want = collate(packs())
    for batch in batches:
        assert_same_batch(batch, want)
        assert len(storages(batch)) == 4
        buffer = io.BytesIO()
        torch.save(batch, buffer)
        buffer.seek(0)
        assert_same_batch(torch.load(buffer, weights_only=True), want)


def test_a_loader_batch_from_two_workers_saves_and_loads():
    """The real Energon loader with 2 workers over the bundled sample data: every batch's
    tensors are in shared memory, one storage per dtype (pixels of >= 1 MiB on their own),
    and torch.save / torch.load (weights_only) give the batch back."""
    te = PackingTaskEncoder(tokenizer="bundled", max_input_seq_length=4096)
    seen = 0
    for batch in loader_batches(SAMPLE_DATA, te, buffer=8, workers=2):
        if not len(batch["source_ids"]):
            continue
        found = storages(batch)
        big = sum(
            t.numel() * t.element_size() >= OWN_STORAGE_BYTES for t in tensors(batch).values()
        )
        assert len(found) == len(set(found.values())) + big
        buffer = io.BytesIO()
        torch.save(batch, buffer)
        buffer.seek(0)
        assert_same_batch(torch.load(buffer, weights_only=True), batch)
        seen += 1
        if seen == 4:
            break
    assert seen == 4
