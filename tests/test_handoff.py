"""The worker handoff (issue 34 item 3): inside a DataLoader worker ``collate`` gives a
:class:`WorkerBatch`, whose tensors under ``OWN_STORAGE_BYTES`` cross to the main process inline
(bytes in the pickle, no shared memory, no file descriptor) and the larger ones in shared memory,
a storage each (a pool segment the worker reuses only once the main process lets go of it, else
torch's); the main process gets a plain dict, the main process's collate value for value, and
``torch.save`` / ``torch.load`` of it works.
"""

from __future__ import annotations

import copy
import gc
import io
import os
import pickle
from multiprocessing.reduction import ForkingPickler

import numpy as np
import pytest
import torch
from helpers import loader_batches, source
from torch.multiprocessing import reductions
from torch.utils.data import DataLoader, IterableDataset

from energon_packing import PackingTaskEncoder, shm_pool
from energon_packing.encoding.positions import MRope
from energon_packing.handoff import OWN_STORAGE_BYTES, WorkerBatch, shared, to_tensor
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


@pytest.fixture
def fresh_pool(monkeypatch):
    """A worker's pool of its own for this test (the segments die with it)."""
    pool = shm_pool.Pool()
    monkeypatch.setattr(shm_pool, "_pool", pool)
    return pool


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


@pytest.mark.parametrize("pooled", [True, False])
def test_a_large_tensor_gets_a_storage_of_its_own(pooled, in_a_worker, fresh_pool, monkeypatch):
    """Pixels of >= OWN_STORAGE_BYTES are not laid out with the small float32 tensors (a
    consumer keeping token_mask does not keep the pixels alive): they are copied into a pool
    segment, or (``pooled=False``: no pool, as where memfds do not exist) into torch's shared
    memory; values unchanged; the pack's own array is not touched."""
    if not pooled:
        monkeypatch.setattr(shm_pool, "pool", lambda: None)
    ps = packs(big=True)
    pixels = ps[0].media["pixel_values"]
    before = pixels.copy()
    batch = collate(ps)
    big = batch["pixel_values"][0]
    if pooled:
        assert fresh_pool.segment_of(big) is fresh_pool.segments[0]
        assert not any(t.is_shared() for t in tensors(batch).values())
    else:
        assert big.is_shared() and big.untyped_storage().nbytes() == pixels.nbytes
        assert [t for t in tensors(batch).values() if t.is_shared()] == [big]
    assert big.untyped_storage().data_ptr() != batch["token_mask"].untyped_storage().data_ptr()
    assert torch.equal(big, torch.from_numpy(before)) and np.array_equal(pixels, before)
    assert big.data_ptr() != pixels.__array_interface__["data"][0]
    got = handed_over(batch)
    assert torch.equal(got["pixel_values"][0], big)


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


def test_a_workers_pack_lays_its_large_media_out_in_shared_memory(monkeypatch, fresh_pool):
    """In a worker, pixels that several sources join to >= OWN_STORAGE_BYTES are written into a
    pool segment when the pack is laid out, and the batch hands that very memory over (no
    second copy); the values, dtype and shape are the main process's. With every segment
    taken, a pack gets torch's fresh shared memory instead. Small media, and any pack outside a
    worker, stay in private memory."""
    main = layout(big_sources(), width=16, pad_multiple=1, pad_id=0)
    assert not isinstance(main.media["pixel_values"].base, torch.Tensor)
    monkeypatch.setattr(torch.utils.data, "get_worker_info", lambda: object())
    pack = layout(big_sources(), width=16, pad_multiple=1, pad_id=0)
    pixels = pack.media["pixel_values"]
    assert pixels.dtype == np.float64 and pixels.shape == main.media["pixel_values"].shape
    assert np.array_equal(pixels, main.media["pixel_values"])
    [segment] = fresh_pool.segments
    batch = collate([pack])
    handed = batch["pixel_values"][0]
    assert handed.data_ptr() == pixels.__array_interface__["data"][0]  # not copied again
    assert fresh_pool.segment_of(handed) is segment
    assert_same_batch(handed_over(batch), main_batch(main))
    small = layout(big_sources()[2:], width=16, pad_multiple=1, pad_id=0)
    assert not isinstance(small.media["pixel_values"].base, torch.Tensor)
    held = [layout(big_sources(), width=16, pad_multiple=1, pad_id=0) for _ in range(8)]
    assert len(fresh_pool.segments) == shm_pool.SEGMENTS  # all taken: torch's path
    last = held[-1].media["pixel_values"]
    assert isinstance(last.base, torch.Tensor) and last.base.is_shared()
    assert np.array_equal(last, main.media["pixel_values"])
    del held[0]
    gc.collect()  # a segment is free again: torch's shared pixels still cross as they are
    assert any(s.free() for s in fresh_pool.segments)
    assert collate([held[-1]])["pixel_values"][0].data_ptr() == last.__array_interface__["data"][0]


def test_a_segment_is_reused_only_once_the_main_process_lets_go(fresh_pool, in_a_worker):
    """A segment is taken again only when the worker holds no view of it and every tensor the
    main process rebuilt from it (and every view of one) is gone; a larger tensor grows a free
    segment; the main process reads what the worker wrote."""
    first = fresh_pool.array((1000, 300), np.float32)
    first[:] = 1.5
    data = ForkingPickler.dumps(shared({"pixel_values": [to_tensor(first)]}))
    del first
    gc.collect()
    [segment] = fresh_pool.segments
    assert (segment.count(0), segment.count(8), segment.free()) == (1, 0, False)  # sent, not back
    got = pickle.loads(data)["pixel_values"][0]
    assert got.shape == (1000, 300) and float(got.sum()) == 1.5 * 300_000
    fresh_pool.array((10, 10), np.float32)  # dropped at once: its segment is free again
    gc.collect()
    assert len(fresh_pool.segments) == 2 and not segment.free()
    view = got[10:20]
    del got
    gc.collect()
    assert not segment.free()  # a view of the main's tensor still reads it
    del view
    gc.collect()
    assert segment.free() and (segment.count(0), segment.count(8)) == (1, 1)
    bigger = fresh_pool.array((3000, 300), np.float32)
    assert len(fresh_pool.segments) == 2 and fresh_pool.segment_of(torch.from_numpy(bigger))
    assert max(s.capacity for s in fresh_pool.segments) >= bigger.nbytes


def test_a_pool_keeps_within_its_budget(fresh_pool, monkeypatch):
    """Segments together hold at most BUDGET bytes: a tensor that would pass it gets none (and
    so torch's memory), nor does a free segment grow past it."""
    monkeypatch.setattr(shm_pool, "BUDGET", 3 << 20)
    held = fresh_pool.array((2 << 20,), np.uint8)
    assert held is not None and fresh_pool.array((2 << 20,), np.uint8) is None
    assert fresh_pool.array((1 << 20,), np.uint8) is not None  # 2 + 1 MiB fit
    gc.collect()
    del held
    gc.collect()
    assert fresh_pool.array((3 << 20,), np.uint8) is None  # growing 2 -> 3 MiB would pass it
    assert [s.capacity for s in fresh_pool.segments] == [2 << 20, 1 << 20]


def test_a_segment_still_being_let_go_is_not_grown(fresh_pool):
    """A free segment whose mapping another thread still exports (its last view's teardown)
    is not closed to grow it: the tensor gets torch's memory, the segment stays usable."""
    fresh_pool.array((1 << 20,), np.uint8)
    gc.collect()
    [segment] = fresh_pool.segments
    export = memoryview(segment.map)  # as a dying view's buffer, not yet released
    assert segment.free() and fresh_pool.array((2 << 20,), np.uint8) is None
    export.release()
    assert fresh_pool.array((2 << 20,), np.uint8) is not None and segment.capacity == 2 << 20


class Laid(IterableDataset):
    """``count`` packs laid out in each worker, pixels of >= 1 MiB numbered by the pack."""

    def __init__(self, count: int):
        self.count = count

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        for i in range(self.count):
            sources = big_sources()
            for s in sources:
                s.media["pixel_values"] = s.media["pixel_values"] + 1000 * (2 * i + info.id)
            yield collate([layout(sources, width=16, pad_multiple=1, pad_id=0)])


def want_pixels(number: int) -> np.ndarray:
    sources = big_sources()
    for s in sources:
        s.media["pixel_values"] = s.media["pixel_values"] + 1000 * number
    return layout(sources, width=16, pad_multiple=1, pad_id=0).media["pixel_values"]


@pytest.mark.parametrize("hold", [False, True])
def test_two_workers_reuse_segments_without_touching_a_held_batch(hold, monkeypatch):
    """Through a real 2-worker DataLoader: each batch's pixels are the ones its worker laid out,
    read when the batch arrives and again after all arrived (``hold``: the main process keeps
    every batch, so no segment may be reused under it); a main process that drops each batch
    gets its pixels from a few segments, reused."""
    inodes = []
    rebuild = shm_pool.rebuild

    def counted(df, *args):
        fd = df.detach()
        inodes.append(os.fstat(fd).st_ino)
        return rebuild(type("Fd", (), {"detach": lambda self: fd})(), *args)

    batches = iter(DataLoader(Laid(8), batch_size=None, num_workers=2))
    monkeypatch.setattr(shm_pool, "rebuild", counted)  # unpickled by name, in this process
    kept = []
    for number, batch in enumerate(batches):
        assert np.array_equal(batch["pixel_values"][0].numpy(), want_pixels(number))
        if hold:
            kept.append(batch)
        del batch
        gc.collect()
    # held: each worker's SEGMENTS segments stay taken, its later packs get torch's memory
    assert len(inodes) == (2 * shm_pool.SEGMENTS if hold else 16)
    for number, batch in enumerate(kept):
        assert np.array_equal(batch["pixel_values"][0].numpy(), want_pixels(number)), number
    if not hold:
        assert len(set(inodes)) <= 2 * 3  # a few per worker, reused


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
    (a per-tensor handoff passes one per tensor), pixels of >= 1 MiB one (a pool segment's);
    each batch equals the
    main process's collate and saves and loads with torch.save / torch.load."""
    received = []

    def counting(module, name):
        rebuild = getattr(module, name)

        def counted(*args):
            received.append(name)
            return rebuild(*args)

        monkeypatch.setattr(module, name, counted)

    batches = iter(DataLoader(Collated(3, big=big), batch_size=None, num_workers=2))
    # patched once the workers are forked: a worker pickles the rebuild function by name
    counting(reductions, "rebuild_storage_fd")  # torch's shared memory
    counting(shm_pool, "rebuild")  # a pool segment
    batches = list(batches)
    assert len(batches) == 6 and received == (["rebuild"] * 6 if big else [])
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
    tensors under 1 MiB crossed inline (the larger ones in shared memory: torch's or a pool
    segment), and torch.save / torch.load (weights_only) give the batch back."""
    te = PackingTaskEncoder(tokenizer="bundled", max_input_seq_length=4096)
    seen = 0
    for batch in loader_batches(SAMPLE_DATA, te, buffer=8, workers=2):
        if not len(batch["source_ids"]):
            continue
        assert type(batch) is dict
        for place, t in tensors(batch).items():
            if t.numel() * t.element_size() < OWN_STORAGE_BYTES:
                assert not t.is_shared(), place  # crossed inline
        buffer = io.BytesIO()
        torch.save(batch, buffer)
        buffer.seek(0)
        assert_same_batch(torch.load(buffer, weights_only=True), batch)
        seen += 1
        if seen == 4:
            break
    assert seen == 4
