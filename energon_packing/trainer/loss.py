"""The loss of an optimizer step: every pack of the step, on every data-parallel rank, one mean.

A step is G microbatches (one pack each) on each of W data-parallel ranks. Trained unpacked,
the same conversations give the reference::

    L = sum over the global batch of  w_t * CE_t   /   D
    D = sum of w_t            (denominator="loss_weights", the default: NeMo-RL's NLLLossFn)
      = count of w_t > 0      (denominator="tokens": the trained-token count)

``w_t`` is a token's loss weight (``token_mask``: 1 on trained tokens times the conversation's
``loss_weight``). A pack's own mean (its sum over its own count) weighs its tokens by how full
the pack is; accumulating such means, or dividing by one rank's count, is off by up to the
pack-count ratio (issue 22 measured 0.31-9.5 relative). So the denominator is the step's: all of
its microbatches, all ranks. Every weight is in the batch before the first forward, so
:func:`step_loss` computes it once (a local sum, one ``all_reduce`` over ``group``), and each
microbatch's backward takes ``loss_sum * scale / D``.

How the trainer combines the ranks' gradients sets ``scale`` (``grad_reduction``):

* ``"mean"``: DDP, FSDP, ``accelerate`` / the HF ``Trainer`` average over the W ranks, so the
  loss is multiplied by W (NeMo-RL's DTensor path does ``loss *= dp_size * cp_size``);
* ``"sum"``: the ranks' gradients are summed and nothing divides them afterwards (an
  ``all_reduce`` of your own). Megatron with ``calculate_per_token_loss=True`` is *not* this
  case: it divides by the token count its ``loss_func`` returns, so there the loss function
  returns ``(weighted_loss_sum, weight_sum)`` and ``step_loss`` is not used.

With context parallelism each CP rank holds a slice of every pack: pass the group that spans the
data- and context-parallel ranks (Megatron: ``get_data_parallel_group(with_context_parallel=
True)``) and ``cp_size``, so the weights add up to the whole packs, W is the number of ranks
averaged over, and packs and conversations (which every CP rank of a pack sees) count once.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from energon_packing.schema import SOURCE_IDS, TOKEN_MASK, PackContractError, is_empty
from energon_packing.trainer.ranks import FILLER_KEY, collective_device
from energon_packing.trainer.shim import Microbatch

__all__ = [
    "DEFAULT_DENOMINATOR",
    "DENOMINATORS",
    "GRAD_REDUCTIONS",
    "LOSS_WEIGHTS",
    "StepCounts",
    "StepLoss",
    "counts_of",
    "shifted_loss_sum",
    "step_loss",
    "token_loss",
    "weighted_loss_sum",
    "weights_of",
]

logger = logging.getLogger("energon_packing")

#: ``"loss_weights"``: D = the sum of the loss weights; ``"tokens"``: D = the trained tokens.
DENOMINATORS = ("loss_weights", "tokens")
#: What NeMo-RL's ``NLLLossFn`` divides by: ``global_valid_toks = sum(token_mask[:, 1:] *
#: sample_mask)``, all-reduced over data-parallel ranks; equal to "tokens" when every weight is 1.
DEFAULT_DENOMINATOR = "loss_weights"
GRAD_REDUCTIONS = ("mean", "sum")
#: The key of a pack's loss weights in a Hugging Face ``Trainer`` batch (:mod:`..hf.trainer`).
LOSS_WEIGHTS = "loss_weights"


@dataclass(kw_only=True, slots=True)
class StepCounts:
    """What a batch, a microbatch or a whole step holds.

    ``packs`` counts rows (filler packs included: they take a step's compute);
    ``conversations`` counts the conversations in them (fillers excluded); ``trained_tokens``
    the tokens with a non-zero loss weight; ``loss_weight`` the sum of the weights.
    Anything in a trainer that counts "samples" of a packed batch counts ``packs``.
    """

    packs: int = 0
    conversations: int = 0
    trained_tokens: int = 0
    loss_weight: float = 0.0

    def __add__(self, other: StepCounts) -> StepCounts:
        return StepCounts(
            packs=self.packs + other.packs,
            conversations=self.conversations + other.conversations,
            trained_tokens=self.trained_tokens + other.trained_tokens,
            loss_weight=self.loss_weight + other.loss_weight,
        )

    def denominator(self, kind: str) -> float:
        """The step's D under ``kind`` (one of :data:`DENOMINATORS`)."""
        check_denominator(kind)
        return self.loss_weight if kind == "loss_weights" else float(self.trained_tokens)


def check_denominator(kind: str) -> None:
    if kind not in DENOMINATORS:
        raise ValueError(
            f"denominator={kind!r} is not valid; choose one of {', '.join(DENOMINATORS)} "
            f"(default {DEFAULT_DENOMINATOR!r}, what NeMo-RL's NLLLossFn divides by)"
        )


def _not_a_step_item(item: Any) -> PackContractError:
    return PackContractError(
        f"{TOKEN_MASK}: cannot read loss weights from a {type(item).__name__}; pass the "
        f"step's Microbatch objects (prepacked_microbatches), to_hf(...) results, Hugging Face "
        f"Trainer batches (with {LOSS_WEIGHTS!r}), loader batches or weight tensors"
    )


def weights_of(item: Any) -> torch.Tensor:
    """The loss weights a microbatch trains with: a :class:`Microbatch`'s ``loss_mask``,
    ``to_hf``'s ``loss_weights`` attribute, a ``Trainer`` batch's ``"loss_weights"``, a loader
    batch's ``token_mask``, or a tensor as it is."""
    if isinstance(item, torch.Tensor):
        return item
    if isinstance(item, Microbatch):
        return item.loss_mask
    weights = getattr(item, LOSS_WEIGHTS, None)
    if isinstance(weights, torch.Tensor):
        return weights
    if isinstance(item, Mapping):
        for key in (LOSS_WEIGHTS, TOKEN_MASK):
            if key in item:
                return torch.as_tensor(item[key])
    raise _not_a_step_item(item)


def _packs(item: Any) -> list[list[str]] | None:
    """Per pack, its conversation keys (None for a bare tensor)."""
    if isinstance(item, Microbatch):
        return [list(item.source_ids)]
    ids = getattr(item, SOURCE_IDS, None)  # to_hf inputs: one pack, as an attribute
    if ids is None and isinstance(item, Mapping):
        ids = item.get(SOURCE_IDS)
    if ids is None:
        return None
    if ids and not isinstance(ids[0], str):  # a loader batch: one list per pack
        return [list(row) for row in ids]
    return [list(ids)]


def counts_of(item: Any) -> StepCounts:
    """:class:`StepCounts` of one batch or microbatch (see :func:`weights_of` for the forms);
    an accounting-only loader batch counts nothing."""
    if isinstance(item, Mapping) and is_empty(item):
        return StepCounts()
    weights = weights_of(item).detach()
    packs = _packs(item)
    rows = 1 if weights.ndim < 2 else int(weights.shape[0])
    return StepCounts(
        packs=rows if packs is None else len(packs),
        conversations=0 if packs is None else sum(k != FILLER_KEY for p in packs for k in p),
        trained_tokens=int((weights != 0).sum()),
        loss_weight=float(weights.to(torch.float64).sum()),
    )


def weighted_loss_sum(
    logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor
) -> torch.Tensor:
    """``sum_t w_t * CE(logits_t, labels_t)`` over the positions whose weight is not 0 (their
    labels may be anything there, ``-100`` included).

    ``logits [..., V]`` are aligned with ``labels [...]`` and ``weights [...]`` (shift first
    where the model does not). Computed in the logits' dtype, at least float32: a float64
    model's loss stays float64 (``transformers``' ``ForCausalLMLoss`` upcasts to float32, 1e-8
    off), bf16 logits are upcast as every trainer does.
    """
    dtype = torch.promote_types(logits.dtype, torch.float32)
    weights = weights.reshape(-1).to(logits.device)
    keep = weights != 0
    logits = logits.reshape(-1, logits.shape[-1])[keep]
    losses = torch.nn.functional.cross_entropy(
        logits.to(dtype), labels.reshape(-1).to(logits.device)[keep], reduction="none"
    )
    return (losses * weights[keep].to(dtype)).sum()


def shifted_loss_sum(
    logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor
) -> torch.Tensor:
    """:func:`weighted_loss_sum` for unshifted ``labels`` / ``weights`` (``to_hf`` inputs, a
    ``Trainer`` batch): position t predicts token t+1, as ``transformers`` shifts."""
    return weighted_loss_sum(logits[..., :-1, :], labels[..., 1:], weights[..., 1:])


def token_loss(logits: torch.Tensor, microbatch: Microbatch) -> tuple[torch.Tensor, int]:
    """``(sum of weighted token cross-entropies, trained tokens)`` of one shim microbatch.
    Divide the sum by the *step's* denominator (:func:`step_loss`), never by this count."""
    return weighted_loss_sum(
        logits, microbatch.labels, microbatch.loss_mask
    ), microbatch.valid_tokens


@dataclass(kw_only=True, slots=True)
class StepLoss:
    """One optimizer step's normalisation (from :func:`step_loss`); call it on each
    microbatch's loss sum, or use :meth:`of` with the microbatch's logits.

    Attributes:
        denominator: The step's global D (all microbatches, all ranks).
        scale: W under ``grad_reduction="mean"``, 1 under ``"sum"``.
        counts: The global :class:`StepCounts` of the step (for logging).
        local: This rank's :class:`StepCounts`.
    """

    denominator: float
    scale: float
    counts: StepCounts
    local: StepCounts

    def __call__(self, loss_sum: torch.Tensor) -> torch.Tensor:
        """``loss_sum * scale / denominator``: what this microbatch's backward takes. A step
        with nothing trained anywhere (D = 0, e.g. filler packs only) gives 0."""
        if self.denominator == 0:
            return loss_sum * 0.0
        return loss_sum * (self.scale / self.denominator)

    def of(self, logits: torch.Tensor, item: Any) -> torch.Tensor:
        """The normalised loss of one microbatch from its logits: a :class:`Microbatch`
        (logits aligned with its labels, as the shim's models return them) or ``to_hf`` inputs
        / a ``Trainer`` batch (unshifted ``labels``; position t predicts t+1, as ``transformers``
        shifts)."""
        if isinstance(item, Microbatch):
            return self(weighted_loss_sum(logits, item.labels, item.loss_mask))
        return self(shifted_loss_sum(logits, item["labels"], weights_of(item)))


def _world(group: Any) -> tuple[Any, int]:
    """The process group to reduce over and its size; no group: one rank."""
    import torch.distributed as dist

    if group is None:
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            logger.warning(
                "step_loss(group=None) normalises over this rank only, but %d ranks are "
                "running: pass the data-parallel process group (group=...) so every rank "
                "divides by the same global denominator",
                dist.get_world_size(),
            )
        return None, 1
    return group, dist.get_world_size(group)


def step_loss(
    items: Iterable[Any],
    *,
    denominator: str = DEFAULT_DENOMINATOR,
    grad_reduction: str = "mean",
    group: Any = None,
    cp_size: int = 1,
) -> StepLoss:
    """The normalisation of one optimizer step, from every microbatch this rank runs in it.

    Args:
        items: All of this rank's microbatches of the step, before the first forward:
            :class:`Microbatch` objects, ``to_hf`` inputs, ``Trainer`` batches, loader batches
            or weight tensors (:func:`weights_of`).
        denominator: ``"loss_weights"`` (default; NeMo-RL's) or ``"tokens"``.
        grad_reduction: ``"mean"`` if the trainer averages gradients over ranks (DDP, FSDP,
            ``accelerate``), ``"sum"`` if it sums them and divides by nothing afterwards.
        group: The data-parallel process group (spanning CP ranks too, with context
            parallelism); None: this rank alone, no collective.
        cp_size: Context-parallel ranks per pack in ``group``: each sees the whole
            ``source_ids``, so packs and conversations are divided by it.

    Every rank must call it once per step (one ``all_reduce`` of four numbers over ``group``).
    """
    check_denominator(denominator)
    if isinstance(cp_size, bool) or not isinstance(cp_size, int) or cp_size < 1:
        raise ValueError(f"cp_size={cp_size!r} must be an int >= 1")
    if grad_reduction not in GRAD_REDUCTIONS:
        raise ValueError(
            f"grad_reduction={grad_reduction!r} is not valid; choose 'mean' (DDP, FSDP, "
            f"accelerate average gradients over ranks) or 'sum' (gradients summed over ranks, "
            f"nothing divides them afterwards)"
        )
    local = StepCounts()
    for item in items:
        local = local + counts_of(item)
    group, world = _world(group)
    total = local
    if group is not None:
        import torch.distributed as dist

        # float64 carries every count exactly (< 2**53) and the weight sum at full precision
        vector = torch.tensor(
            [local.packs, local.conversations, local.trained_tokens, local.loss_weight],
            dtype=torch.float64,
            device=collective_device(group),
        )
        dist.all_reduce(vector, group=group)
        packs, conversations, tokens, weight = vector.tolist()
        total = StepCounts(
            packs=round(packs / cp_size),
            conversations=round(conversations / cp_size),
            trained_tokens=int(tokens),
            loss_weight=weight,
        )
    return StepLoss(
        denominator=total.denominator(denominator),
        scale=float(world) if grad_reduction == "mean" else 1.0,
        counts=total,
        local=local,
    )
