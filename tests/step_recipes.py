"""The README's training recipes, one optimizer step each, and the unpacked reference they must
equal (issue 22). Used in-process by ``tests/test_step.py`` and by its gloo ranks (``run``).

Reference: every conversation of the step's packs (all ranks), run alone through the model
without any pack (TinyVLM: plain causal attention over the conversation's own tokens; the Hugging
Face model: its own forward, which computes its own mRoPE positions), its per-token cross-entropy
written out here (``log_softmax``, gathered), times the token's loss weight, summed over the
global batch and divided by ONE global denominator (the sum of the weights, or their count).
"""

from __future__ import annotations

import copy
import itertools
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
METADATASET = REPO / "configs" / "metadataset.yaml"  # sample_data 3 : 1 (the 1 at loss_weight 0.5)
CAPACITY = 2048
PAD = 4
LR = 1e-3
TOKEN_FIELDS = ("mm_token_type_ids",)


# ---- data and models ----------------------------------------------------------------------------


def encoder(kind: str):
    from energon_packing import PackingTaskEncoder

    if kind == "tiny":
        return PackingTaskEncoder(
            tokenizer="bundled", max_input_seq_length=CAPACITY, pad_multiple=PAD, mrope=True
        )
    from energon_packing.testing.families import build

    processor = build("qwen2_vl", model=False)[0]
    return PackingTaskEncoder(processor=processor, max_input_seq_length=CAPACITY, pad_multiple=PAD)


def loader_packs(te, count: int) -> list[dict]:
    """The first ``count`` packs of the real loader over the bundled metadataset."""
    from megatron.energon import WorkerConfig, get_loader, get_train_dataset

    from energon_packing.schema import is_empty

    dataset = get_train_dataset(
        METADATASET,
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0),
        batch_size=1,
        packing_buffer_size=32,
        task_encoder=te,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
    )
    packs = (b for b in get_loader(dataset) if not is_empty(b))
    return list(itertools.islice(packs, count))


def model(kind: str, te=None):
    """A float64 tiny model, the same weights in every process."""
    if kind == "tiny":
        from energon_packing.testing.model import TinyConfig, TinyVLM

        config = TinyConfig(vocab_size=te.tokenizer.vocab_size, layers=1, mrope_section=(2, 3, 3))
        return TinyVLM(config, seed=0, dtype=torch.float64).train()
    from energon_packing.testing.families import build

    return build("qwen2_vl")[1].double().train()


# ---- the reference ------------------------------------------------------------------------------


def ce(logits: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """sum_t w_t * -log softmax(logits_t)[target_t], in the logits' dtype."""
    logp = torch.log_softmax(logits, dim=-1).gather(-1, targets[:, None])[:, 0]
    return -(logp * weights.to(logits.dtype)).sum()


def conversations(batch: dict):
    """Each conversation of each pack: (ids, positions, weights, pixel_values, grids, the
    processor's token fields such as ``mm_token_type_ids``)."""
    for row in range(batch["input_ids"].shape[0]):
        padded = batch["cu_seqlens_padded"][row].tolist()
        real = batch["cu_seqlens"][row].tolist()
        if "image_grid_thw" in batch:
            grids, owner = batch["image_grid_thw"][row], batch["image_source_index"][row]
        else:  # a processor's text-only pack carries no image fields
            grids, owner = torch.zeros(0, 3, dtype=torch.int64), torch.zeros(0, dtype=torch.int64)
        patches = torch.cat([torch.zeros(1, dtype=torch.int64), grids.prod(-1).cumsum(0)])
        for k in range(len(real) - 1):
            start, n = padded[k], real[k + 1] - real[k]
            mine = (owner == k).nonzero().flatten().tolist()
            pixels = [batch["pixel_values"][row][patches[i] : patches[i + 1]] for i in mine]
            yield (
                batch["input_ids"][row, start : start + n],
                batch["position_ids"][..., row, start : start + n],
                batch["token_mask"][row, start : start + n],
                torch.cat(pixels) if pixels else None,
                grids[mine],
                {
                    name: batch[name][row : row + 1, start : start + n]
                    for name in TOKEN_FIELDS
                    if name in batch
                },
            )


def alone_loss(kind: str, net, batch: dict, image_token_id: int) -> torch.Tensor:
    """Sum of the weighted token losses of every conversation of ``batch``, each run alone."""
    total = 0.0
    for ids, positions, weights, pixels, grids, fields in conversations(batch):
        if kind == "tiny":
            image = ids == image_token_id
            vision = torch.where(image, torch.cumsum(image, 0) - 1, -1)
            logits = net(
                ids[None],
                positions.unsqueeze(-2),
                pixel_values=pixels,
                image_grid_thw=grids,
                vision_token_index=vision[None],
            )[0]
        else:
            extra = {} if pixels is None else {"pixel_values": pixels, "image_grid_thw": grids}
            logits = net(input_ids=ids[None], use_cache=False, **extra, **fields).logits[0]
        total = total + ce(logits[:-1], ids[1:], weights[1:])
    return total


def denominator(packs: list[dict], kind: str = "loss_weights") -> float:
    weights = torch.cat([b["token_mask"].flatten() for b in packs]).to(torch.float64)
    return float(weights.sum()) if kind == "loss_weights" else float((weights != 0).sum())


def reference_step(kind, net, steps_packs, image_token_id, denominator_kind="loss_weights"):
    """Gradients of the unpacked reference for one step (all ranks' packs)."""
    every = [b for packs in steps_packs for b in packs]
    d = denominator(every, denominator_kind)
    for batch in every:
        (alone_loss(kind, net, batch, image_token_id) / d).backward()


# ---- the recipes (as the README writes them) ----------------------------------------------------


def shim_step(net, packs, *, image_token_id, group=None, grad_reduction="mean", **options):
    from energon_packing.trainer import prepacked_microbatches, step_loss

    mbs = [
        mb
        for batch in packs
        for mb in prepacked_microbatches(batch, pad_multiple=PAD, image_token_id=image_token_id)
    ]
    normalise = step_loss(mbs, group=group, grad_reduction=grad_reduction, **options)
    for i, mb in enumerate(mbs):
        with _no_sync(net, last=i == len(mbs) - 1):
            normalise.of(net(**mb.model_inputs), mb).backward()


def hf_step(net, packs, *, image_token_id=None, group=None, grad_reduction="mean", **options):
    from energon_packing.hf import to_hf
    from energon_packing.trainer import step_loss

    inputs = [to_hf(batch, model=_inner(net)) for batch in packs]
    normalise = step_loss(inputs, group=group, grad_reduction=grad_reduction, **options)
    for i, one in enumerate(inputs):
        with _no_sync(net, last=i == len(inputs) - 1):
            normalise.of(net(**one).logits, one).backward()


RECIPES = {"shim": shim_step, "hf": hf_step}


def _inner(net):
    return getattr(net, "module", net)


def _no_sync(net, *, last: bool):
    import contextlib

    no_sync = getattr(net, "no_sync", None)
    return contextlib.nullcontext() if last or no_sync is None else no_sync()


def _grad(p: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(p) if p.grad is None else p.grad.detach().clone()


def adamw(net):
    return torch.optim.AdamW(net.parameters(), lr=LR, weight_decay=0.0)  # as TrainingArguments


def train(step_fn, net, steps, **kwargs) -> tuple[dict, dict]:
    """Runs ``step_fn`` for each step with AdamW; returns the first step's gradients and the
    parameters after the last step."""
    optimizer = adamw(net)
    first = None
    for packs in steps:
        step_fn(net, packs, **kwargs)
        if first is None:
            first = {n: _grad(p) for n, p in _inner(net).named_parameters()}
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)
    return first, {n: p.detach().clone() for n, p in _inner(net).named_parameters()}


def reference(kind, net, steps, image_token_id, denominator_kind="loss_weights"):
    """``train`` for the unpacked reference; ``steps[s]`` = every rank's packs of step s."""
    net = copy.deepcopy(net)

    def step(net, per_rank):
        reference_step(kind, net, per_rank, image_token_id, denominator_kind)

    return train(step, net, steps)


def worst(got: dict, want: dict) -> float:
    """Max over tensors of max|got - want| / max|want| (tensors that are all 0 compare
    absolutely)."""
    out = 0.0
    for name, value in want.items():
        scale = float(value.abs().max()) or 1.0
        out = max(out, float((got[name] - value).abs().max()) / scale)
    return out


# ---- one data-parallel rank ---------------------------------------------------------------------


def run(rank: int, world_size: int, init_method: str, inputs_path: str, out_path: str) -> None:
    """One gloo rank: the recipe over this rank's packs of each step, gradients averaged by a
    real DistributedDataParallel ("mean") or summed by an all-reduce ("sum")."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world_size)
    try:
        payload = torch.load(inputs_path, weights_only=False)
        kind, recipe = payload["kind"], payload["recipe"]
        te = encoder(kind) if kind == "tiny" else None
        net = model(kind, te)
        reduction = payload["grad_reduction"]
        steps = [per_rank[rank] for per_rank in payload["steps"]]
        step_fn = RECIPES[recipe]
        if reduction == "mean":
            net = DistributedDataParallel(net, find_unused_parameters=True)
        else:
            inner = step_fn

            def step_fn(net, packs, **kwargs):  # Megatron-style: gradients summed over ranks
                inner(net, packs, **kwargs)
                for p in net.parameters():
                    if p.grad is None:  # unused this step (a text-only step's vision tower)
                        p.grad = torch.zeros_like(p)
                    dist.all_reduce(p.grad)

        first, last = train(
            step_fn,
            net,
            steps,
            image_token_id=payload["image_token_id"],
            group=dist.group.WORLD,
            grad_reduction=reduction,
        )
        torch.save({"first": first, "last": last}, f"{out_path}.{rank}")
    finally:
        dist.barrier()  # no rank closes its sockets while a peer still reads the last collective
        dist.destroy_process_group()


def trainer_run(rank: int, world_size: int, init_method: str, inputs_path: str, out_path: str):
    """One process of ``transformers``' own ``Trainer`` (``PackedTrainer``), launched as torchrun
    would (its environment variables), over this rank's packs of every step."""
    import os
    import tempfile

    import torch.distributed as dist

    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT="29500",  # unused: the group below already exists when accelerate looks
    )
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world_size)
    try:
        from transformers import TrainerCallback, TrainingArguments

        from energon_packing.hf import HFPacks, PackedTrainer

        payload = torch.load(inputs_path, weights_only=False)
        net = model("qwen2_vl")
        batches = [batch for per_rank in payload["steps"] for batch in per_rank[rank]]
        grads = {}

        class FirstGradients(TrainerCallback):
            def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
                if not grads:
                    grads.update({n: _grad(p) for n, p in _inner(model).named_parameters()})

        with tempfile.TemporaryDirectory() as tmp:
            args = TrainingArguments(
                output_dir=tmp,
                max_steps=len(payload["steps"]),
                gradient_accumulation_steps=len(payload["steps"][0][rank]),
                per_device_train_batch_size=1,
                learning_rate=LR,
                weight_decay=0.0,
                lr_scheduler_type="constant",
                max_grad_norm=0.0,
                optim="adamw_torch",
                use_cpu=True,
                report_to=[],
                save_strategy="no",
                logging_steps=1,
                ddp_backend="gloo",
                ddp_find_unused_parameters=True,
                disable_tqdm=True,
            )
            trainer = PackedTrainer(
                model=net,
                args=args,
                train_dataset=HFPacks(batches, model=net),
                callbacks=[FirstGradients()],
            )
            trainer.train()
            logged = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
        last = {n: p.detach().clone() for n, p in _inner(trainer.model).named_parameters()}
        torch.save({"first": grads, "last": last, "losses": logged}, f"{out_path}.{rank}")
    finally:
        dist.barrier()
        dist.destroy_process_group()
