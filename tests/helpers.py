"""Shared test helpers: build prepared datasets, run the real Energon loader."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from energon_packing.incoming.prepare import prepare_dataset
from energon_packing.loader.loading import epoch
from energon_packing.schema import is_empty
from energon_packing.testing.synth import Conversation, write_shards
from energon_packing.trainer import validate_prepacked

REPO = Path(__file__).resolve().parents[1]
SAMPLE_DATA = REPO / "sample_data"


def make_dataset(
    path: Path, items: Iterable[Conversation], *, per_shard: int = 40, raw: Iterable[dict] = ()
) -> Path:
    """Writes shards (plus ``raw`` hand-made samples: {"__key__", part: bytes}) and prepares."""
    items = list(items)
    write_shards(path / "shards", items, per_shard=per_shard)
    raw = list(raw)
    if raw:
        import webdataset as wds

        with wds.TarWriter(str(path / "shards" / "raw-00000.tar")) as writer:
            for sample in raw:
                writer.write(sample)
    prepare_dataset(path, split_parts=["train:shards/.*"])
    return path


def raw_sample(key: str, document, images: dict[str, bytes] | None = None) -> dict:
    """A shard sample from a document (dict, or str/bytes for malformed JSON)."""
    if isinstance(document, dict):
        document = json.dumps(document)
    if isinstance(document, str):
        document = document.encode()
    return {"__key__": key, "json": document, **(images or {})}


def decode_image(data: bytes, **options):
    """:func:`energon_packing.media.images.decode` as the encoding side calls it, with the
    installed transformers' alpha rule (:func:`energon_packing.encoding.hf_compat.alpha_on_white`):
    the pixels a processor is handed."""
    from energon_packing.encoding.hf_compat import alpha_on_white
    from energon_packing.media.images import decode

    return decode(data, alpha_on_white=alpha_on_white(), **options)


def conversation_sample(key: str, document, images: dict[str, bytes] | None = None):
    """The ``ConversationSample`` Energon would hand the task encoder for this shard sample."""
    from energon_packing.loader.samples import ConversationSample, load_conversation

    fields = load_conversation(raw_sample(key, document, images))
    return ConversationSample(__key__=key, __restore_key__=(), **fields)


def loader_batches(
    path: Path,
    task_encoder,
    *,
    buffer: int | None = 16,
    workers: int = 0,
    rank: int = 0,
    world_size: int = 1,
    batch_size: int = 1,
    dataset_config: str = "dataset.yaml",
    savable: bool = False,
):
    """The real Energon loader over one finite epoch of the train split."""
    return epoch(
        path,
        task_encoder,
        packing_buffer_size=buffer,
        batch_size=batch_size,
        num_workers=workers,
        rank=rank,
        world_size=world_size,
        dataset_config=dataset_config,
        savable=savable,
    )


def check_batch(batch: dict, task_encoder) -> None:
    """Every invariant of the pack contract, for every pack of a batch."""
    config = task_encoder.config
    capacity = config.max_input_seq_length
    assert batch["input_ids"].shape == (len(batch["source_ids"]), capacity)
    assert batch["input_lengths"].tolist() == [capacity] * len(batch["source_ids"])
    if is_empty(batch):  # accounting only: the skips of a pack none of whose members packed
        assert batch["source_ids"] == [] and batch["packing_skipped"]
        return
    validate_prepacked(
        batch,
        pad_multiple=config.pad_multiple,
        image_pad_id=task_encoder.tokenizer.special.image_pad,
    )
    for row in range(len(batch["source_ids"])):
        grids = batch["image_grid_thw"][row]
        assert batch["pixel_values"][row].shape == (int(grids.prod(dim=1).sum()), 1176)
        assert batch["sample_mask"][row].item() == float(bool((batch["token_mask"][row] > 0).any()))


def stop_workers() -> None:
    """Ends leftover loader worker processes at once: a finished or abandoned Energon loader
    with workers takes ~5 s per worker to tear itself down (its join times out)."""
    import multiprocessing

    for process in multiprocessing.active_children():
        process.terminate()
        process.join(timeout=5)


def source(key, input_ids, token_mask, *, grids=(), mrope=None):
    """A schema.Source for tests: image grids (Qwen2-VL) and, with an MRope spec, 3-row
    positions as the loader computes them."""
    import numpy as np

    from energon_packing.encoding.positions import mrope_positions
    from energon_packing.schema import IMAGE_GRID_THW, Source

    grids = [tuple(g) for g in grids]
    return Source(
        key=key,
        input_ids=input_ids,
        token_mask=token_mask,
        positions=mrope_positions(input_ids, grids, mrope) if mrope else None,
        media={IMAGE_GRID_THW: np.asarray(grids, dtype=np.int64).reshape(-1, 3)},
        images=len(grids),
    )


def spawn_ranks(fn, world_size, tmp_path, *args, timeout=240):
    """Runs ``fn(rank, world_size, init_method, *args)`` in ``world_size`` processes and waits
    at most ``timeout`` seconds: a dead or hung rank fails the test instead of hanging CI for
    gloo's 30-minute default. The ranks meet through a file store in ``tmp_path``, so no port
    is picked, released and handed on (a race with any other process on the machine)."""
    import time

    import pytest
    import torch.multiprocessing as mp

    init_method = f"file://{tmp_path / 'rendezvous'}"
    context = mp.start_processes(
        fn,
        args=(world_size, init_method, *args),
        nprocs=world_size,
        join=False,
        start_method="spawn",
    )
    deadline = time.monotonic() + timeout
    while not context.join(timeout=1):
        if time.monotonic() > deadline:
            alive = [rank for rank, p in enumerate(context.processes) if p.is_alive()]
            for process in context.processes:
                process.kill()
            pytest.fail(f"ranks {alive} of {world_size} still running after {timeout} s")


def _family_classes(found) -> tuple[list, str | None]:
    """The installed processor classes of a registry family, and why none is (None: some
    are): a family's later classes may not exist in an older release, or not import there
    (5.12's Gemma 4 image processor imports torchvision)."""
    import transformers

    present, why = [], []
    for name in found.classes:
        try:
            present.append(getattr(transformers, name))
        except (AttributeError, ImportError) as e:
            why.append(f"{name}: {str(e).splitlines()[0][:120]}")
    return (
        present,
        None if present else f"transformers {transformers.__version__}: {'; '.join(why)}",
    )


def family_unavailable_reason(family: str) -> str | None:
    """Why no processor of ``family`` (a registry family or model type) can be built on the
    installed transformers; None where one can (or the name is no registry family)."""
    from energon_packing.encoding import hf_compat
    from energon_packing.encoding.families import FAMILIES

    if hf_compat.transformers_version() is None:
        return None
    found = next((f for f in FAMILIES if family in (f.name, *f.model_types)), None)
    return None if found is None else _family_classes(found)[1]


def processor_media_skip_reason(family: str = "qwen2_vl") -> str | None:
    """Why the processor path with images cannot run for ``family`` on the installed
    transformers (None: it can), as the library refuses it
    (:func:`energon_packing.encoding.hf_compat.processor_media_refusal`): its processor has no
    public placeholder expansion and the family declares no rule of that release."""
    from energon_packing.encoding import hf_compat
    from energon_packing.encoding.families import FAMILIES

    if hf_compat.transformers_version() is None:
        return None

    found = next(f for f in FAMILIES if family in (f.name, *f.model_types))
    present, missing = _family_classes(found)
    if not present:
        return missing
    for cls in present:
        refusal = hf_compat.processor_media_refusal(cls, found)
        if refusal:
            return refusal
    return None


def torchvision_missing(module: str = "") -> str | None:
    """Why the tests marked ``torchvision`` of test ``module`` cannot run here (None: they can):
    Gemma 3n's need timm (which imports torchvision), the others torchvision."""
    if module.endswith("test_gemma3n"):
        from energon_packing.testing.families_gemma3n import timm_missing

        return timm_missing()
    from energon_packing.testing.families_pixtral import torchvision_missing

    return torchvision_missing()


def require_processor_media(family: str = "qwen2_vl") -> None:
    """Skips the calling test (naming the missing feature) where
    :func:`processor_media_skip_reason` says so."""
    import pytest

    reason = processor_media_skip_reason(family)
    if reason:
        pytest.skip(reason)


def callable_without_videos(processor):
    """``processor``, callable on images and audio where it has no video processor (the tiny
    Omni processors: no torchvision). Before 5.19 the Omni processors' own ``__call__`` reads
    ``video_processor.merge_size`` on every call, videos or not: a shallow copy whose video
    processor is a stand-in holding only that setting (the checkpoint's, ``video_settings``;
    it is read, and used only for videos, which a call through this copy must not pass)."""
    import copy
    from types import SimpleNamespace

    if getattr(processor, "video_processor", None) is not None:
        return processor
    settings = getattr(processor, "video_settings", None) or {}
    merge = settings.get("merge_size", processor.image_processor.merge_size)
    callable_copy = copy.copy(processor)
    callable_copy.video_processor = SimpleNamespace(merge_size=merge)
    return callable_copy


def clips_heard_together(family: str, documents, *, tracks: bool = False) -> bool:
    """Whether the installed release's audio encoder lets the clips of a pack of these
    conversations attend to each other: two or more carry ``audios`` (or, ``tracks``: videos
    whose own tracks are interleaved) and its encoder does not keep the clips of a call apart
    (Qwen3-Omni before :data:`~energon_packing.encoding.hf_compat.OMNI_AUDIO_WINDOWS_SINCE`).
    Their logits cannot equal each alone, and ``to_hf`` refuses such a pack."""
    from energon_packing.encoding import hf_compat

    hearing = sum(bool(d.get("audios") or (tracks and d.get("videos"))) for d in documents)
    return hearing > 1 and not hf_compat.omni_audio_clips_apart(family)


def assert_to_hf_refuses_clips_heard_together(batch, model) -> None:
    """``to_hf`` refuses a pack whose clips its release's audio encoder would mix."""
    import pytest

    from energon_packing.hf import to_hf

    with pytest.raises(ValueError, match=r"each would hear the others'; use transformers >= "):
        to_hf(batch, model=model)
