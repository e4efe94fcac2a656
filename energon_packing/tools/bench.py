"""Tokens per second next to the convergence curves: the tiny model trained three ways.

The same conversations, in the same groups, step after step:

* (a) **loader packs**: each step is one loader pack (C wide), through the shim;
* (b) **trainer packs**: the same pack's conversations as an ordinary padded batch, packed
  by the shim's trainer-side path (as wide as they need);
* (c) **padded batches**: the same conversations as padded rows, no packing.

Each path starts from the same seeded model and optimizer and sees the same conversations at
every step, so the per-token logits are the same (the shim's equivalence) and so are the
losses, step for step, up to float rounding; what differs is how many tokens the model runs
over, and so the time. Inputs are prepared before the clock starts: only the training steps
are timed.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from energon_packing.testing.model import TinyConfig, TinyVLM
from energon_packing.trainer import (
    Microbatch,
    pack_microbatches,
    padded_microbatch,
    prepacked_microbatches,
    token_loss,
)

__all__ = ["PATHS", "Curve", "plot", "prepare", "train"]

PATHS = ("loader packs", "trainer packs", "padded batches")


@dataclass(kw_only=True, slots=True)
class Curve:
    name: str
    losses: list[float] = field(default_factory=list)
    elapsed: list[float] = field(default_factory=list)  # seconds since the first step, per step
    real_tokens: int = 0
    computed_tokens: int = 0

    @property
    def tokens_per_second(self) -> float:
        return self.real_tokens / self.elapsed[-1] if self.elapsed else 0.0


def _computed(mb: Microbatch) -> int:
    return int(mb.model_inputs["input_ids"].numel())


def prepare(
    path: Path | str, task_encoder: Any, *, steps: int, buffer: int
) -> tuple[list[list[Microbatch]], list[list[Microbatch]], list[list[Microbatch]]]:
    """Microbatches of every step for the three paths, over the same conversation groups."""
    from energon_packing.loader.loading import epoch

    packs = list(itertools.islice(epoch(path, task_encoder, packing_buffer_size=buffer), steps))
    unpacked = epoch(path, task_encoder, packing_buffer_size=None, batch_size=None)
    encoded = {s.__key__: s for s in unpacked}
    image = task_encoder.tokenizer.special.image_pad
    capacity, multiple = task_encoder.config.max_input_seq_length, task_encoder.config.pad_multiple
    loader, trainer, padded = [], [], []
    for batch in packs:
        loader.append(prepacked_microbatches(batch, image_token_id=image, pad_multiple=multiple))
        rows = task_encoder.batch([encoded[key] for key in batch["source_ids"][0]])
        trainer.append(
            pack_microbatches(
                rows,
                image_token_id=image,
                token_budget=capacity,
                pad_multiple=multiple,
                pad_id=task_encoder.tokenizer.special.pad,
            )
        )
        padded.append([padded_microbatch(rows, image_token_id=image)])
    return loader, trainer, padded


def train(
    name: str,
    steps: list[list[Microbatch]],
    *,
    config: TinyConfig,
    seed: int,
    lr: float,
) -> Curve:
    """Trains a fresh TinyVLM on ``steps``; the loss of a step is its token losses over its
    valid tokens (the global count: every microbatch of the step). One untimed forward and
    backward on a throwaway copy first, so no path pays the process's warm-up."""
    spare = TinyVLM(config, seed=seed)
    loss_sum, _ = token_loss(spare(**steps[0][0].model_inputs), steps[0][0])
    loss_sum.backward()
    model = TinyVLM(config, seed=seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    curve = Curve(name=name)
    start = time.perf_counter()
    for step in steps:
        valid = sum(mb.valid_tokens for mb in step)
        total = 0.0
        for mb in step:
            loss_sum, _ = token_loss(model(**mb.model_inputs), mb)
            (loss_sum / valid).backward()
            total += loss_sum.item() / valid
            curve.computed_tokens += _computed(mb)
            curve.real_tokens += mb.real_tokens
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        curve.losses.append(total)
        curve.elapsed.append(time.perf_counter() - start)
    return curve


def plot(curves: list[Curve], path: Path | str) -> Path:
    """Loss vs step and loss vs time, side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    fig, (by_step, by_time) = plt.subplots(1, 2, figsize=(11, 4), dpi=110)
    for curve, style in zip(curves, ("-", "--", ":")):
        label = f"{curve.name} ({curve.tokens_per_second:,.0f} tok/s)"
        by_step.plot(range(1, len(curve.losses) + 1), curve.losses, style, label=label)
        by_time.plot(curve.elapsed, curve.losses, style, label=label)
    by_step.set_xlabel("step")
    by_step.xaxis.get_major_locator().set_params(integer=True)
    by_time.set_xlabel("seconds (training steps only)")
    for ax in (by_step, by_time):
        ax.set_ylabel("token loss")
        ax.grid(alpha=0.3)
    by_step.legend(fontsize=8)
    fig.suptitle(
        "TinyVLM on the same conversations: loader packs vs trainer packs vs padding", fontsize=10
    )
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
