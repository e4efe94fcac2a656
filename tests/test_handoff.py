"""The worker handoff (issue 34 item 3): inside a DataLoader worker ``collate`` gives a
:class:`WorkerBatch`, whose tensors under ``OWN_STORAGE_BYTES`` cross to the main process inline
(bytes in the pickle, no shared memory, no file descriptor) and the larger ones in shared memory,
a storage each; the main process gets a plain dict, the main process's collate value for value,
and ``torch.save`` / ``torch.load`` of it works.
"""

from __future__ import annotations

import copy
import io
import pickle
from multiprocessing.reduction import ForkingPickler

import numpy as np
import pytest
import torch
from helpers import loader_batches, source
from torch.multiprocessing import reductions
from torch.utils.data import DataLoader, IterableDataset

from energon_packing import PackingTaskEncoder
from energon_packing.encoding.positions import MRope
from energon_packing.handoff import OWN_STORAGE_BYTES, WorkerBatch
from energon_packing.schema import collate, layout

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


@pytest.fixture
def in_a_worker(monkeypatch):
    """``collate`` as a DataLoader worker runs it."""
    monkeypatch.setattr(torch.utils.data, "get_worker_info", lambda: object())


def handed_over(batch):
    """``batch`` as the main process unpickles it from a worker's queue."""
    return pickle.loads(ForkingPickler.dumps(batch))


@pytest.mark.parametrize("prepacked", [True, False])
@pytest.mark.parametrize("mrope", [True, False])
def test_a_workers_batch_crosses_inline_as_the_main_batch(prepacked, mrope, monkeypatch):
    """Value for value the main process's collate (dtype, shape, contiguous), before and after
    the handoff; no small tensor goes to shared memory, so no storage is reduced (no file
    descriptor) and the main process gets a plain dict of writable tensors."""
    main = collate(packs(mrope=mrope), prepacked=prepacked)
    monkeypatch.setattr(torch.utils.data, "get_worker_info", lambda: object())
    worker = collate(packs(mrope=mrope), prepacked=prepacked)
    assert type(worker) is WorkerBatch
    assert_same_batch(worker, main)
    assert not any(t.is_shared() for t in tensors(worker).values())
    reduced = []
    monkeypatch.setattr(reductions, "reduce_storage", lambda *a: reduced.append(a))
    got = handed_over(worker)
    assert reduced == [] and type(got) is dict
    assert_same_batch(got, main)
    got["token_mask"][0, 0] = 7.0  # writable, and its own memory
    assert main["token_mask"][0, 0] != 7.0
    assert type(copy.copy(worker)) is WorkerBatch  # torch's default_convert copies it


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
    assert [t for t in tensors(batch).values() if t.is_shared()] == [big]
    got = handed_over(batch)
    assert got["pixel_values"][0].is_shared() and torch.equal(got["pixel_values"][0], big)


def big_sources():
    """Three sources whose pixels (of different dtypes and trailing widths: padded and promoted
    as a processor batch is) join to >= OWN_STORAGE_BYTES, none of them that large alone."""
    rows = OWN_STORAGE_BYTES // (3 * 4) // 2 + 1
    parts = [
        np.arange(rows * 3, dtype=np.float32).reshape(rows, 3),
        np.full((rows, 2), -1.5, dtype=np.float32),
        np.ones((5, 3), dtype=np.float64),
    ]
    out = []
    for i, pixels in enumerate(parts):
        s = source(f"s{i}", [1, 2, 3], [0, 1, 1])
        s.media["pixel_values"] = pixels
        out.append(s)
    return out


def test_a_workers_pack_lays_its_large_media_out_in_shared_memory(monkeypatch):
    """In a worker, pixels that several sources join to >= OWN_STORAGE_BYTES are written into
    shared memory when the pack is laid out, and the batch hands that very storage over (no
    second copy); the values, dtype and shape are the main process's. Small ones, and any pack
    outside a worker, stay in private memory."""
    main = layout(big_sources(), width=16, pad_multiple=1, pad_id=0)
    assert not isinstance(main.media["pixel_values"].base, torch.Tensor)
    monkeypatch.setattr(torch.utils.data, "get_worker_info", lambda: object())
    pack = layout(big_sources(), width=16, pad_multiple=1, pad_id=0)
    pixels = pack.media["pixel_values"]
    assert pixels.dtype == np.float64 and pixels.shape == main.media["pixel_values"].shape
    assert np.array_equal(pixels, main.media["pixel_values"])
    assert isinstance(pixels.base, torch.Tensor) and pixels.base.is_shared()  # torch's path taken
    batch = collate([pack])
    handed = batch["pixel_values"][0]
    assert handed.data_ptr() == pixels.__array_interface__["data"][0]  # not copied again
    assert handed.is_shared() and handed.untyped_storage().nbytes() == pixels.nbytes
    assert_same_batch(handed_over(batch), main_batch(main))
    small = layout(big_sources()[2:], width=16, pad_multiple=1, pad_id=0)
    assert not isinstance(small.media["pixel_values"].base, torch.Tensor)


def main_batch(pack):
    """The main process's batch of one pack."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.utils.data, "get_worker_info", lambda: None)
        return collate([pack])


def test_a_workers_batch_survives_torch_save_and_load(in_a_worker):
    """A worker's batch, and what the main process gets of it, save and load (weights_only) as
    the same batch."""
    batch = handed_over(collate(packs()))
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


@pytest.mark.parametrize("big", [False, True])
def test_two_workers_hand_over_only_large_tensors_in_shared_memory(big, monkeypatch):
    """Through a real 2-worker DataLoader: a batch of small tensors passes no file descriptor
    (a per-tensor handoff passes one per tensor), pixels of >= 1 MiB one; each batch equals the
    main process's collate and saves and loads with torch.save / torch.load."""
    received = []
    rebuild = reductions.rebuild_storage_fd

    def counted(*args):
        received.append(1)
        return rebuild(*args)

    batches = iter(DataLoader(Collated(3, big=big), batch_size=None, num_workers=2))
    # patched once the workers are forked: a worker pickles the rebuild function by name
    monkeypatch.setattr(reductions, "rebuild_storage_fd", counted)
    batches = list(batches)
    assert len(batches) == 6 and len(received) == (6 if big else 0)
    want = collate(packs(big=big))
    for batch in batches:
        assert type(batch) is dict
        assert_same_batch(batch, want)
        buffer = io.BytesIO()
        torch.save(batch, buffer)
        buffer.seek(0)
        assert_same_batch(torch.load(buffer, weights_only=True), want)


def test_a_loader_batch_from_two_workers_saves_and_loads():
    """The real Energon loader with 2 workers over the bundled sample data: a plain dict whose
    tensors are in shared memory only where they hold >= 1 MiB, and torch.save / torch.load
    (weights_only) give the batch back."""
    te = PackingTaskEncoder(tokenizer="bundled", max_input_seq_length=4096)
    seen = 0
    for batch in loader_batches(SAMPLE_DATA, te, buffer=8, workers=2):
        if not len(batch["source_ids"]):
            continue
        assert type(batch) is dict
        for place, t in tensors(batch).items():
            assert t.is_shared() == (t.numel() * t.element_size() >= OWN_STORAGE_BYTES), place
        buffer = io.BytesIO()
        torch.save(batch, buffer)
        buffer.seek(0)
        assert_same_batch(torch.load(buffer, weights_only=True), batch)
        seen += 1
        if seen == 4:
            break
    assert seen == 4
