"""Child processes of the data-parallel tests (gloo on loopback)."""

from __future__ import annotations

import json
import os
import traceback


def epoch(rank: int, world_size: int, init_method: str, path: str, out: str) -> None:
    """One epoch through the real loader and the shim, one process per data-parallel rank."""
    os.environ.setdefault("TQDM_DISABLE", "1")
    import torch.distributed as dist
    from megatron.energon import WorkerConfig, get_loader, get_train_dataset

    from energon_packing import PackingTaskEncoder
    from energon_packing.trainer import (
        FILLER_KEY,
        align_ranks,
        check_microbatches,
        prepacked_microbatches,
    )

    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world_size)
    try:
        te = PackingTaskEncoder(
            tokenizer="bundled", max_input_seq_length=2048, pad_multiple=4, carry=True
        )
        worker_config = WorkerConfig.default_worker_config(
            num_workers=0
        )  # rank from the process group
        dataset = get_train_dataset(
            path,
            worker_config=worker_config,
            batch_size=1,
            packing_buffer_size=16,
            task_encoder=te,
            shuffle_buffer_size=None,
            max_samples_per_sequence=None,
            repeat=False,
        )
        steps, keys, skipped = [], [], []
        for batch in align_ranks(
            get_loader(dataset), capacity=2048, pad_id=te.tokenizer.special.pad
        ):
            skipped += [key for key, _ in batch.get("packing_skipped", ())]
            mbs = prepacked_microbatches(batch, pad_multiple=4)
            check_microbatches(mbs)
            steps.append([list(mb.model_inputs["input_ids"].shape) for mb in mbs])
            keys += [k for mb in mbs for k in mb.source_ids if k != FILLER_KEY]
        result = {
            "rank": worker_config.rank,
            "world_size": worker_config.world_size,
            "steps": steps,
            "keys": keys,
            "skipped": skipped + [k for k, _ in te.stats.drain()],
        }
    finally:
        dist.barrier()  # no rank closes its sockets while a peer still reads the last collective
        dist.destroy_process_group()
    with open(f"{out}.{rank}", "w") as f:
        json.dump(result, f)


def mismatch(rank: int, world_size: int, init_method: str, out: str) -> None:
    """Rank 1 brings two microbatches to a step where rank 0 brings one."""
    import torch.distributed as dist
    from test_trainer import design_note_pack

    from energon_packing.schema import PackContractError
    from energon_packing.trainer import check_microbatches, prepacked_microbatches

    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world_size)
    try:
        mbs = prepacked_microbatches(design_note_pack()) * (1 + rank)
        try:
            check_microbatches(mbs)
            outcome = "no error"
        except PackContractError as e:
            outcome = str(e)
        except Exception:
            outcome = traceback.format_exc()
    finally:
        dist.barrier()  # no rank closes its sockets while a peer still reads the last collective
        dist.destroy_process_group()
    with open(f"{out}.{rank}", "w") as f:
        f.write(outcome)


def aligned(rank: int, world_size: int, init_method: str, out: str) -> None:
    """Rank r brings r mRoPE packs (rank 0 none at all, only a skip): ``align_ranks`` without
    ``capacity`` learns the fillers' width and layout from the others."""
    import numpy as np
    import torch.distributed as dist

    from energon_packing.schema import Source, collate, layout
    from energon_packing.trainer import FILLER_KEY, align_ranks

    def pack(i):
        source = Source(
            key=f"r{rank}-{i}",
            input_ids=[7] * 5,
            token_mask=[1.0] * 5,
            positions=np.tile(np.arange(5), (3, 1)),
        )
        return collate([layout([source], width=24, pad_multiple=1, pad_id=0)])

    accounting = {**pack(0), "packing_skipped": [(f"lost-{rank}", "malformed_json")]}
    empty = {k: v[:0] if hasattr(v, "shape") else [] for k, v in accounting.items()}
    empty["packing_skipped"] = accounting["packing_skipped"]
    batches = [empty, *(pack(i) for i in range(rank))]
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world_size)
    try:
        steps = [
            (
                batch["source_ids"][0][0] if batch["source_ids"] else None,
                list(batch["input_ids"].shape),
                list(batch["position_ids"].shape),
                [key for key, _ in batch.get("packing_skipped", ())],
            )
            for batch in align_ranks(batches)
        ]
    finally:
        dist.barrier()
        dist.destroy_process_group()
    with open(f"{out}.{rank}", "w") as f:
        json.dump({"steps": steps, "filler": FILLER_KEY}, f)


def aligned_rows(rank: int, world_size: int, init_method: str, out: str, rows: list) -> None:
    """Rank r brings loader batches of ``rows[r]`` packs each (a list per rank)."""
    import torch.distributed as dist

    from energon_packing.schema import PackContractError, Source, collate, layout
    from energon_packing.trainer import align_ranks

    def batch(n):
        source = Source(key=f"r{rank}", input_ids=[7] * 5, token_mask=[1.0] * 5)
        return collate([layout([source], width=16, pad_multiple=1, pad_id=0)] * n)

    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world_size)
    try:
        try:
            outcome = [b["source_ids"] for b in align_ranks([batch(n) for n in rows[rank]])]
        except PackContractError as e:
            outcome = str(e)
    finally:
        dist.barrier()
        dist.destroy_process_group()
    with open(f"{out}.{rank}", "w") as f:
        json.dump(outcome, f)
