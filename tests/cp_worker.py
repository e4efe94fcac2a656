"""Child process of the context-parallel equivalence test (gloo, loopback, 2 ranks)."""

from __future__ import annotations

import torch


def run(rank: int, world_size: int, init_method: str, inputs_path: str, out_path: str) -> None:
    import torch.distributed as dist

    from energon_packing.testing.model import TinyConfig, TinyVLM
    from energon_packing.trainer import cp_indices, prepacked_microbatches

    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world_size)
    try:
        payload = torch.load(inputs_path, weights_only=False)
        model = TinyVLM(
            TinyConfig(**payload["config"]), seed=payload["seed"], dtype=torch.float64
        ).eval()
        results = []
        with torch.no_grad():
            for batch in payload["batches"]:
                (mb,) = prepacked_microbatches(
                    batch,
                    cp_size=world_size,
                    cp_rank=rank,
                    pad_multiple=payload["pad_multiple"],
                    cp_group=dist.group.WORLD,
                    image_token_id=payload["image_token_id"],
                )
                logits = model(**mb.model_inputs)[0]
                keep = cp_indices(mb.cu_seqlens_padded, world_size, rank)
                results.append((keep, logits))
        torch.save(results, f"{out_path}.{rank}")
    finally:
        dist.barrier()  # no rank closes its sockets while a peer still reads the last collective
        dist.destroy_process_group()
