"""The Hugging Face ``Trainer`` on loader packs, with the step's loss exact.

``Trainer`` counts ``labels != -100`` over its gradient-accumulation batches (gathered across
processes with ``average_tokens_across_devices``) and divides the model's float32 loss by it.
On packs that is right only while every loss weight is 1: fractional ``loss_weight`` cannot ride
in ``labels`` and is silently dropped (0.27 relative off in issue 22). :class:`PackedLossMixin`
replaces that count by :func:`~energon_packing.trainer.step_loss` over the step's packs and all
processes, and computes the weighted token loss itself, in the logits' dtype::

    from energon_packing.hf import HFPacks, PackedTrainer

    trainer = PackedTrainer(model=model, args=args, train_dataset=HFPacks(loader, model=model))
    trainer.train()  # args: max_steps, gradient_accumulation_steps = packs per rank per step

:class:`HFPacks` turns an Energon loader's batches into ``Trainer`` batches, one pack each
(``to_hf``'s keyword arguments plus ``"loss_weights"`` and ``"source_ids"``, which
:meth:`PackedLossMixin.compute_loss` takes out before the forward). The ``Trainer`` does not
re-shard it: each process's Energon loader already reads its own part of the data. Use the
mixin with a ``Trainer`` subclass that takes its batches from ``get_train_dataloader`` (TRL's
``SFTTrainer`` does not: it accepts only ``datasets`` datasets and tokenizes them itself).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from energon_packing.hf.inputs import to_hf
from energon_packing.schema import INPUT_IDS, PACKING_SKIPPED, SOURCE_IDS, is_empty
from energon_packing.trainer.loss import (
    DEFAULT_DENOMINATOR,
    LOSS_WEIGHTS,
    StepLoss,
    check_denominator,
    shifted_loss_sum,
    step_loss,
)

__all__ = ["HFPacks", "PackedLossMixin", "packed_trainer_class"]

logger = logging.getLogger("energon_packing")


class HFPacks:
    """An Energon loader's batches as ``Trainer`` batches: one pack per batch.

    Iterable (not a ``torch`` dataset; it has no length, so the ``Trainer`` needs ``max_steps``).
    Accounting-only batches are not steps; :attr:`skipped` counts every skip by reason. Give it
    a train loader that repeats (``get_train_dataset``'s default): a rank that runs out of packs
    before ``max_steps`` stops the job (the others would wait for it forever).

    Args:
        batches: The loader (or any iterable of loader batches).
        model, config, attn_implementation: As :func:`~energon_packing.hf.to_hf`.
    """

    def __init__(
        self,
        batches: Iterable[Any],
        *,
        model: Any = None,
        config: Any = None,
        attn_implementation: str | None = None,
    ):
        self.batches = batches
        self.options = dict(model=model, config=config, attn_implementation=attn_implementation)
        self.skipped: Counter = Counter()

    def __iter__(self) -> Iterator[dict]:
        for batch in self.batches:
            self.skipped.update(reason for _, reason in batch.get(PACKING_SKIPPED, ()))
            if is_empty(batch):
                continue
            for row in range(int(batch[INPUT_IDS].shape[0])):
                inputs = to_hf(batch, row=row, **self.options)
                yield {
                    **inputs,
                    LOSS_WEIGHTS: inputs.loss_weights,
                    SOURCE_IDS: list(inputs.source_ids),
                }


class PackedLossMixin:
    """``Trainer`` methods for loader packs: the step's global weighted mean as the loss.

    Put it before the ``Trainer`` class: ``class T(PackedLossMixin, Trainer)``. Class attribute
    :attr:`loss_denominator` picks the denominator (``"loss_weights"``, NeMo-RL's, by default;
    ``"tokens"``). The step is this process's ``gradient_accumulation_steps`` batches on every
    process; gradients are averaged over processes (DDP, FSDP), so the loss is scaled by their
    number, whatever ``average_tokens_across_devices`` says.
    """

    loss_denominator: str = DEFAULT_DENOMINATOR
    #: our loss is normalised over the whole accumulated step: ``training_step`` must not divide
    loss_is_scaled_for_ga = True
    _step: StepLoss | None = None

    _warned = False

    def get_train_dataloader(self) -> Any:
        """:class:`HFPacks` as they are (each process's loader reads its own data)."""
        if isinstance(self.train_dataset, HFPacks):
            config = getattr(self.train_dataset.batches, "worker_config", None)
            ranks = getattr(config, "world_size", self.args.world_size)
            if ranks != self.args.world_size:
                raise ValueError(
                    f"HFPacks: the Energon loader was built for {ranks} rank(s), but "
                    f"{self.args.world_size} processes train: every process would read the "
                    f"same data. Build it with WorkerConfig(rank=int(os.environ['RANK']), "
                    f"world_size=int(os.environ['WORLD_SIZE']), num_workers=...)"
                )
            return self.train_dataset
        return super().get_train_dataloader()

    def get_eval_dataloader(self, eval_dataset: Any = None) -> Any:
        """Refuses :class:`HFPacks`: ``Trainer``'s evaluation averages per-batch means (each
        pack's own), which is not the packs' mean."""
        if isinstance(eval_dataset if eval_dataset is not None else self.eval_dataset, HFPacks):
            raise ValueError(
                "PackedTrainer does not evaluate HFPacks (Trainer would average each pack's own "
                "mean); evaluate in your own loop: step_loss over all eval packs, then "
                "normalise.of(...) per pack"
            )
        return super().get_eval_dataloader(eval_dataset)

    def get_batch_samples(
        self, epoch_iterator: Iterator, num_batches: int, device: torch.device
    ) -> tuple[list, torch.Tensor | None]:
        """The step's batches and, once per step, its global denominator (one all-reduce)."""
        check_denominator(self.loss_denominator)
        batch_samples = []
        for _ in range(num_batches):
            try:
                batch_samples.append(next(epoch_iterator))
            except StopIteration:
                break
        group = None
        if self.args.world_size > 1:
            import torch.distributed as dist

            group = dist.group.WORLD
            if len(batch_samples) < num_batches and isinstance(self.train_dataset, HFPacks):
                raise RuntimeError(
                    f"HFPacks ran out of packs on rank {self.args.process_index} "
                    f"({len(batch_samples)} of {num_batches} for this step) while other ranks "
                    f"may go on: build the train loader with repeat=True (Energon's default)"
                )
            if not self.args.average_tokens_across_devices and not self._warned:
                self._warned = True
                logger.warning(
                    "average_tokens_across_devices=False: PackedLossMixin still divides by the "
                    "denominator over every process (the unpacked batch's mean)"
                )
        self._step = step_loss(
            batch_samples, denominator=self.loss_denominator, grad_reduction="mean", group=group
        )
        return batch_samples, torch.tensor(self._step.denominator, device=device)

    def compute_loss(
        self,
        model: Any,
        inputs: dict,
        return_outputs: bool = False,
        num_items_in_batch: Any = None,
    ) -> Any:
        """``sum w * CE / D * world`` in training; the batch's own weighted mean otherwise
        (evaluation)."""
        inputs = dict(inputs)
        labels = inputs.pop("labels")
        weights = inputs.pop(LOSS_WEIGHTS)
        inputs.pop(SOURCE_IDS, None)
        outputs = model(**inputs)
        logits = outputs["logits"] if isinstance(outputs, dict) else outputs[0]
        total = shifted_loss_sum(logits, labels, weights)
        if model.training and self._step is not None and num_items_in_batch is not None:
            loss = self._step(total)
        else:
            loss = total / weights[..., 1:].sum().clamp_min(torch.finfo(weights.dtype).tiny)
        return (loss, outputs) if return_outputs else loss


def packed_trainer_class(base: type | None = None) -> type:
    """``class PackedTrainer(PackedLossMixin, base)``; ``base`` defaults to ``transformers.
    Trainer`` (imported only here)."""
    if base is None:
        from transformers import Trainer as base
    return type(f"Packed{base.__name__}", (PackedLossMixin, base), {"__module__": __name__})
