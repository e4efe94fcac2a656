"""What a pack costs on its way from a loader worker to the main process (issue 34 item 3, a
profile): the same batches through a ``torch`` DataLoader with 0 and 2 workers, nothing else
done, so the difference is the handoff (pickling, shared-memory tensors, the queues).

Batches: one real loader batch of the bundled sample data (``PackingTaskEncoder(tokenizer=
"bundled", max_input_seq_length=4096)``; ``image``: with its ``pixel_values`` and grids,
``text``: the same without the image fields), each handed over as the contract has it
(``torch`` tensors), as numpy arrays (pickled inline, no shared memory), and reduced to one
tensor or to the metadata alone (``source_ids``, ``packing_metrics``, restore keys), and, as
the loader builds them (``collate``), by ``schema.collate`` of the batch's packs in the worker
(``image``/``text``: a ``WorkerBatch``, small tensors inline, pixels of >= 1 MiB in shared
memory). Every batch is a fresh copy (as a worker makes one per pack). Rounds are interleaved; per variant:
CPU seconds per 1,000 batches (main process + workers) with 0 and 2 workers, their difference
(the handoff) and its ratio. Usage: ``python benchmarks/handoff.py [--batches 1000]
[--rounds 3] [--only collate] [--sharing file_system]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch
from torch.utils.data import DataLoader, IterableDataset

sys.path.insert(0, str(Path(__file__).parent))
from _proc import children, cpu_seconds

ROOT = Path(__file__).resolve().parents[1]
IMAGE_FIELDS = ("pixel_values", "image_grid_thw", "image_source_index")


def loader_batch() -> dict:
    """The first batch the real loader gives for the bundled sample data."""
    from megatron.energon import WorkerConfig, get_loader, get_train_dataset

    from energon_packing import PackingTaskEncoder

    te = PackingTaskEncoder(max_input_seq_length=4096, tokenizer="bundled", carry=True)
    dataset = get_train_dataset(
        str(ROOT / "sample_data"),
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0),
        batch_size=1,
        packing_buffer_size=64,
        task_encoder=te,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
    )
    return next(iter(get_loader(dataset)))


def copy(value: object, *, numpy: bool) -> object:
    if isinstance(value, torch.Tensor):
        return value.numpy().copy() if numpy else value.clone()
    if isinstance(value, list):
        return [copy(v, numpy=numpy) for v in value]
    return value


class Batches(IterableDataset):
    """``count`` fresh copies of ``batch``; with ``packs``, each batch is built by
    ``schema.collate`` of them (what the loader's ``batch()`` does) plus ``batch``'s other
    keys."""

    def __init__(self, batch: dict, count: int, *, numpy: bool, packs: list | None = None):
        self.batch, self.count, self.numpy, self.packs = batch, count, numpy, packs

    def __iter__(self):
        from energon_packing.schema import collate

        info = torch.utils.data.get_worker_info()
        for _ in range(self.count // (info.num_workers if info else 1)):
            if self.packs is not None:
                batch = collate(self.packs)
                batch.update(self.batch)  # `|` would make a plain dict of a WorkerBatch
                yield batch
            else:
                yield {k: copy(v, numpy=self.numpy) for k, v in self.batch.items()}


def cpu_per_thousand(
    batch: dict, *, workers: int, numpy: bool, count: int, packs: list | None = None
) -> float:
    """CPU seconds (main + workers) per 1,000 batches, the workers' start-up excluded."""
    batches = Batches(batch, count, numpy=numpy, packs=packs)
    loader = DataLoader(batches, batch_size=None, num_workers=workers)
    it = iter(loader)
    next(it)  # workers started
    pids = children() if workers else []
    start = time.process_time() + sum(cpu_seconds(p) for p in pids)
    seen = 1
    for _ in it:
        seen += 1
        if seen == count - 2 * workers:  # before the workers exit
            break
    spent = time.process_time() + sum(cpu_seconds(p) for p in pids) - start
    del it
    return 1000 * spent / (seen - 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", default="", help="variants whose name holds this text")
    parser.add_argument(
        "--sharing",
        choices=torch.multiprocessing.get_all_sharing_strategies(),
        default=torch.multiprocessing.get_sharing_strategy(),
        help="torch's sharing strategy (file_system: no file descriptor passed per storage)",
    )
    args = parser.parse_args()
    torch.multiprocessing.set_sharing_strategy(args.sharing)
    warnings.filterwarnings("ignore")
    image = loader_batch()
    text = {k: v for k, v in image.items() if k not in IMAGE_FIELDS}
    tensors = [k for k, v in image.items() if isinstance(v, torch.Tensor | list)]
    from energon_packing.schema import pack_from_batch

    packs = [pack_from_batch(image, row) for row in range(len(image["input_ids"]))]
    text_packs = [
        dataclasses.replace(p, media={}, image_source_index=p.image_source_index[:0]) for p in packs
    ]
    extras = {k: v for k, v in image.items() if not isinstance(v, torch.Tensor | list)}
    variants = {
        "image, collate": (extras, False, packs),
        "text, collate": (extras, False, text_packs),
        "image, tensors": (image, False),
        "image, numpy": (image, True),
        "text, tensors": (text, False),
        "text, numpy": (text, True),
        "one tensor": ({"input_ids": image["input_ids"]}, False),
        "metadata only": (
            {k: v for k, v in image.items() if not isinstance(v, torch.Tensor | list)}
            | {"source_ids": image["source_ids"]},
            False,
        ),
    }
    variants = {name: v for name, v in variants.items() if args.only in name}
    measured: dict[tuple[str, int], list[float]] = {}
    for _ in range(args.rounds):
        for name, (batch, numpy, *packs) in variants.items():
            for workers in (0, 2):
                cpu = cpu_per_thousand(
                    batch,
                    workers=workers,
                    numpy=numpy,
                    count=args.batches,
                    packs=packs[0] if packs else None,
                )
                measured.setdefault((name, workers), []).append(cpu)
    print(f"batch fields: {', '.join(tensors)}")
    print(f"{'variant':<16}{'0 workers':>11}{'2 workers':>11}{'handoff':>9}{'ratio':>7}  (s/1k)")
    for name in variants:
        none, two = (statistics.median(measured[name, w]) for w in (0, 2))
        print(f"{name:<16}{none:>11.2f}{two:>11.2f}{two - none:>9.2f}{two / none:>7.1f}")


if __name__ == "__main__":
    main()
