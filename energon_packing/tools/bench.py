"""Tokens per second next to the convergence curves: the tiny model trained three ways.

The same conversations, in the same groups, step after step:

* (a) **loader packs**: each step is one loader pack (C wide), through the shim;
* (b) **trainer packs**: the same pack's conversations as an ordinary padded batch, packed
  by the shim's trainer-side path (as wide as they need);
* (c) **padded batches**: the same conversations as padded rows, no packing.

Each path starts from the same seeded model and optimizer and sees the same conversations at
every step, so the per-token logits are the same (the shim's equivalence) and so are the
losses, step for step, up to float rounding; what differs is how many tokens the model runs
over, and so the time. A pack's attention runs source by source (a varlen kernel's cost: the
sum over sources of L_i^2), a padded batch's row by row (B x S^2): :func:`forward_flops`
counts both from the calls the model makes (:func:`~energon_packing.testing.model.attention_calls`),
so the FLOPs predict the speed-up that the clock then measures.

Timing: inputs are prepared before the clock starts; the three paths take their steps in turn
(step 1 of each, then step 2, ...) so a busy machine slows them alike; the first ``warmup``
steps of each are trained but not timed; a path's speed is its median step time.
"""

from __future__ import annotations

import itertools
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from energon_packing.schema import is_empty
from energon_packing.testing.model import TinyConfig, TinyVLM, attention_calls
from energon_packing.trainer import (
    Microbatch,
    pack_microbatches,
    padded_microbatch,
    prepacked_microbatches,
    step_loss,
)

__all__ = ["PATHS", "Curve", "Flops", "forward_flops", "plot", "prepare", "report", "train"]

PATHS = ("loader packs", "trainer packs", "padded batches")


@dataclass(kw_only=True, slots=True)
class Flops:
    """Forward matmul FLOPs (2·m·n·k per product, as ``torch.utils.flop_counter`` counts);
    a training step costs about 3x these (backward: two products per forward one)."""

    attention: int = 0  # QK^T and AV over the query-key pairs each kernel call holds
    linear: int = 0  # qkv, out, MLP and head, over every computed token
    vision: int = 0  # patch embedding and merger (the same images on every path)

    @property
    def total(self) -> int:
        return self.attention + self.linear + self.vision

    def __add__(self, other: Flops) -> Flops:
        return Flops(
            attention=self.attention + other.attention,
            linear=self.linear + other.linear,
            vision=self.vision + other.vision,
        )


def linear_flops_per_token(config: TinyConfig) -> int:
    """Forward FLOPs of the token-wise products (qkv, out, MLP per layer; the head)."""
    h = config.hidden
    per_layer = 2 * h * 3 * h + 2 * h * h + 2 * 2 * h * config.mlp
    return config.layers * per_layer + 2 * h * config.vocab_size


def forward_flops(mb: Microbatch, config: TinyConfig) -> Flops:
    """The FLOPs of ``model(**mb.model_inputs)``: attention from the (queries, keys) of every
    kernel call the model makes for these inputs (one per source of a pack, one per padded row),
    4·hidden per query-key pair and layer; linear from the computed (not real) tokens."""
    inputs = mb.model_inputs
    rows, width = inputs["input_ids"].shape
    pairs = sum(
        q * k for q, k in attention_calls(inputs["packed_seq_params"], rows=rows, tokens=width)
    )
    patches = len(inputs["pixel_values"]) if inputs.get("pixel_values") is not None else 0
    merged_in = config.vision_hidden * config.merge_size**2
    merger = 2 * merged_in * config.hidden + 2 * config.hidden * config.hidden
    return Flops(
        attention=4 * config.hidden * config.layers * pairs,
        linear=rows * width * linear_flops_per_token(config),
        vision=patches * 2 * config.patch_dim * config.vision_hidden
        + patches // config.merge_size**2 * merger,
    )


@dataclass(kw_only=True, slots=True)
class Curve:
    name: str
    losses: list[float] = field(default_factory=list)
    step_seconds: list[float] = field(default_factory=list)
    step_real_tokens: list[int] = field(default_factory=list)
    warmup: int = 0  # leading steps trained but not timed
    real_tokens: int = 0
    computed_tokens: int = 0
    flops: Flops = field(default_factory=Flops)

    @property
    def elapsed(self) -> list[float]:
        """Seconds since the first step, after each step (for the loss-vs-time plot)."""
        return list(itertools.accumulate(self.step_seconds))

    @property
    def median_step_seconds(self) -> float:
        timed = self.step_seconds[self.warmup :]
        return statistics.median(timed) if timed else 0.0

    @property
    def tokens_per_second(self) -> float:
        """Real tokens of an average timed step over the median timed step time."""
        timed = self.step_real_tokens[self.warmup :]
        median = self.median_step_seconds
        return statistics.fmean(timed) / median if median else 0.0

    def flops_per_real_token(self) -> Flops:
        n = max(self.real_tokens, 1)
        f = self.flops
        return Flops(attention=f.attention // n, linear=f.linear // n, vision=f.vision // n)


def _computed(mb: Microbatch) -> int:
    return int(mb.model_inputs["input_ids"].numel())


def prepare(
    path: Path | str, task_encoder: Any, *, steps: int, buffer: int
) -> tuple[list[list[Microbatch]], list[list[Microbatch]], list[list[Microbatch]]]:
    """Microbatches of every step for the three paths, over the same conversation groups."""
    from energon_packing.loader.loading import epoch

    stream = epoch(path, task_encoder, packing_buffer_size=buffer)
    packs = list(itertools.islice((b for b in stream if not is_empty(b)), steps))  # no empties
    wanted = {key for batch in packs for key in batch["source_ids"][0]}
    encoded = {}  # the packs' conversations, encoded alone (stop once all are seen)
    for sample in epoch(path, task_encoder, packing_buffer_size=None, batch_size=None):
        if sample.__key__ in wanted:
            encoded[sample.__key__] = sample
            if len(encoded) == len(wanted):
                break
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


def _step(model, optimizer, step: list[Microbatch]) -> float:
    """One optimizer step, normalised over all of its microbatches (:func:`step_loss`)."""
    normalise = step_loss(step)
    total = 0.0
    for mb in step:
        loss = normalise.of(model(**mb.model_inputs), mb)
        loss.backward()
        total += loss.item()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return total


def train(
    paths: dict[str, list[list[Microbatch]]],
    *,
    config: TinyConfig,
    seed: int,
    lr: float,
    warmup: int = 2,
) -> list[Curve]:
    """Trains a fresh TinyVLM (same seed, same optimizer) on each path's steps, the paths
    taking their steps in turn; the first ``warmup`` steps of each are not timed (at least
    one step is)."""
    runs = []
    for name, steps in paths.items():
        model = TinyVLM(config, seed=seed)
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
        curve = Curve(name=name, warmup=max(0, min(warmup, len(steps) - 1)))
        for step in steps:
            curve.step_real_tokens.append(sum(mb.real_tokens for mb in step))
            curve.real_tokens += curve.step_real_tokens[-1]
            curve.computed_tokens += sum(_computed(mb) for mb in step)
            for mb in step:
                curve.flops = curve.flops + forward_flops(mb, config)
        runs.append((curve, model, optimizer, steps))
    for index in range(max(len(steps) for *_, steps in runs)):
        for curve, model, optimizer, steps in runs:
            if index < len(steps):
                start = time.perf_counter()
                curve.losses.append(_step(model, optimizer, steps[index]))
                curve.step_seconds.append(time.perf_counter() - start)
    return [curve for curve, *_ in runs]


def _si(value: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if value >= scale:
            return f"{value / scale:.2f}{unit}"
    return f"{value:.0f}"


def report(curves: list[Curve], *, config: TinyConfig, baseline: str = PATHS[-1]) -> str:
    """The FLOPs table: per real token, by kind, with the speed-up over ``baseline`` that the
    FLOPs predict and the one the clock measured."""
    base = next(c for c in curves if c.name == baseline)
    lines = [
        f"forward FLOPs per real token (matmuls; a training step ~3x): linear "
        f"{_si(linear_flops_per_token(config))} per computed token, attention "
        f"{_si(4 * config.hidden * config.layers)} per query-key pair a kernel call holds",
        f"{'path':<17}{'attention':>11}{'linear':>9}{'vision':>9}{'total':>9}"
        f"{'median step':>13}{'speed-up vs ' + baseline:>34}",
        f"{'':<17}{'':>11}{'':>9}{'':>9}{'':>9}{'':>13}{'predicted':>21}{'measured':>13}",
    ]
    for curve in curves:
        f = curve.flops_per_real_token()
        predicted = base.flops.total / curve.flops.total
        measured = curve.tokens_per_second / base.tokens_per_second
        lines.append(
            f"{curve.name:<17}{_si(f.attention):>11}{_si(f.linear):>9}{_si(f.vision):>9}"
            f"{_si(f.total):>9}{curve.median_step_seconds:>11.3f} s{predicted:>20.2f}x"
            f"{measured:>12.2f}x"
        )
    return "\n".join(lines)


def plot(curves: list[Curve], path: Path | str) -> Path:
    """Loss vs step and loss vs time, side by side; the legend gives each path's tokens/s."""
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
        ax.legend(fontsize=8)
    fig.suptitle(
        "TinyVLM on the same conversations: loader packs vs trainer packs vs padding "
        "(tok/s: real tokens per median step time)",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
