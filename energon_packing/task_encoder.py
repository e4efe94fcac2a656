"""The Energon task encoder: conversations in, full-width packs out.

Energon's hooks, thin; the work is in :mod:`encoding`, :mod:`algorithms` and :mod:`assemble`::

    read -> encode_sample (tokens + image sizes from headers, no pixels)
         -> select_samples_to_pack (energon_packing.algorithms.select_packs over the buffer)
         -> pack_selected_samples (decode this pack's images, assemble one C-wide row)
         -> batch (the contract's dict: B packs, normally 1)

Use::

    te = PackingTaskEncoder(max_input_seq_length=8192, pad_multiple=8)
    ds = get_train_dataset(path, worker_config=wc, batch_size=1, packing_buffer_size=256,
                           task_encoder=te, shuffle_buffer_size=None, max_samples_per_sequence=None)
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch
from megatron.energon import (
    Cooker,
    Sample,
    SkipSample,
    TaskEncoder,
    WorkerConfig,
    stateless,
)
from megatron.energon.edataclass import edataclass
from megatron.energon.errors import FatalSampleError

from energon_packing import algorithms
from energon_packing.assemble import MRope, SourceTokens, assemble
from energon_packing.balance import attention_cost
from energon_packing.carry import Selection
from energon_packing.config import PackingConfig
from energon_packing.contract import round_up
from energon_packing.encoding import OverlongError, Skip, encode
from energon_packing.samples import (
    ConversationSample,
    EncodedConversation,
    cook_conversation,
)
from energon_packing.stage import CarryPackingDataset, native_pushback
from energon_packing.stats import PackingStats
from energon_packing.tokenizer import ChatTokenizer
from energon_packing.tolerant import make_tolerant
from energon_packing.vision import ImageError, patchify

logger = logging.getLogger("energon_packing")


#: Unexpected errors in a row (a bug, not bad data) after which the loader stops.
MAX_CONSECUTIVE_ERRORS = 100


class PackingError(FatalSampleError):
    """Stops the loader (Energon does not swallow it): a sample the configuration forbids."""


@edataclass
class PackedSample(Sample):
    """One pack: the per-row fields of the pack contract, as tensors."""

    input_ids: torch.Tensor  # int64 [C]
    token_mask: torch.Tensor  # float32 [C]
    position_ids: torch.Tensor  # int64 [C] or [3, C]
    padding_mask: torch.Tensor  # bool [C]
    cu_seqlens: torch.Tensor  # int32 [n+1]
    cu_seqlens_padded: torch.Tensor  # int32 [n+1]
    source_ids: list
    pixel_values: torch.Tensor  # float32 [patches, patch_dim]
    image_grid_thw: torch.Tensor  # int64 [n_images, 3]
    image_source_index: torch.Tensor  # int64 [n_images]


class PackingTaskEncoder(TaskEncoder[ConversationSample, EncodedConversation, list, dict]):
    """Packs multimodal conversations inside the Energon loader.

    Args:
        max_input_seq_length: Pack width C; every pack is exactly C tokens wide.
        tokenizer: ``None`` (the bundled tokenizer), a local path, a ``tokenizers.Tokenizer``
            or a Hugging Face tokenizer / processor. Never downloads.
        pad_multiple: Each conversation is padded to a multiple of this.
        algorithm: Packing algorithm (``energon_packing.algorithms.ALGORITHMS``).
        overlong: ``"drop"``, ``"truncate"`` or ``"error"`` for conversations longer than C.
        max_per_pack: At most this many conversations per pack.
        **options: Any other :class:`~energon_packing.config.PackingConfig` knob.
    """

    #: Images stay compressed until their pack is emitted: no Energon-side decoding.
    decoder = None
    #: For crude datasets (``__class__: CrudeWebdataset`` in the dataset yaml).
    cookers = (Cooker(cook_conversation),)

    def __init__(
        self,
        *,
        max_input_seq_length: int,
        tokenizer: Any = None,
        pad_multiple: int = 1,
        algorithm: str = algorithms.DEFAULT_ALGORITHM,
        overlong: str = "drop",
        max_per_pack: int | None = None,
        **options: Any,
    ):
        self.config = PackingConfig.from_dict(
            dict(
                max_input_seq_length=max_input_seq_length,
                pad_multiple=pad_multiple,
                algorithm=algorithm,
                overlong=overlong,
                max_per_pack=max_per_pack,
                **options,
            )
        )
        self.tokenizer = ChatTokenizer(tokenizer)
        self.stats = PackingStats()
        self._buffer_size: int | None = None  # set by build_batch
        self._errors_in_a_row = 0
        self._native_counts: dict = {}  # carry counts on Energon's native pushback route
        special = self.tokenizer.special
        self._mrope = (
            MRope(vision_start_id=special.vision_start, image_pad_id=special.image_pad)
            if self.config.mrope
            else None
        )

    @classmethod
    def from_config(
        cls, config: PackingConfig | dict, *, tokenizer: Any = None
    ) -> PackingTaskEncoder:
        values = config.to_dict() if isinstance(config, PackingConfig) else dict(config)
        return cls(tokenizer=tokenizer, **values)

    # ---- Energon hooks ------------------------------------------------------------------

    @stateless
    def encode_sample(self, sample: ConversationSample) -> EncodedConversation:
        key = sample.__key__
        self.stats.read += 1
        try:
            if sample.problem:
                reason, _, detail = sample.problem.partition(": ")
                raise Skip(reason, detail)
            subflavors = sample.__subflavors__ or {}
            encoding = encode(
                key=key,
                messages=sample.messages,
                image_names=sample.image_names,
                images=sample.images,
                loss_weight=sample.loss_weight * float(subflavors.get("loss_weight", 1.0)),
                tokenizer=self.tokenizer,
                config=self.config,
            )
        except Skip as e:
            self.stats.skip(key, e.reason, e.detail)
            raise SkipSample() from None
        except OverlongError as e:
            raise PackingError(str(e)) from None
        except Exception as e:  # a bug or data no check foresaw: count it, never dump per sample
            self._unexpected(key, "encode_error", e)
            raise SkipSample() from None
        self._errors_in_a_row = 0
        if encoding.truncated:
            self.stats.truncated += 1
            self.stats.truncated_tokens += encoding.truncated
        multiple = self.config.pad_multiple
        return EncodedConversation.derive_from(
            sample,
            input_ids=np.asarray(encoding.input_ids, dtype=np.int64),
            token_mask=np.asarray(encoding.token_mask, dtype=np.float32),
            images=[sample.images[sample.image_names[i]] for i in encoding.image_order],
            image_grids=encoding.grids,
            length=encoding.length,
            cost=round_up(encoding.length, multiple),
        )

    def select_samples_to_pack(self, samples: list[EncodedConversation]) -> Any:
        """Groups the buffer with :func:`energon_packing.algorithms.select_packs`; every sample
        comes back (Energon silently drops what select does not return).

        This is Energon's own stage (carry off). With carry on, this hook serves only an Energon
        that supports pushback natively; otherwise :meth:`select_with_carry` runs in
        :class:`~energon_packing.stage.CarryPackingDataset`.
        """
        output = native_pushback() if self.config.carry else None
        if output is None:
            return [[samples[i] for i in g] for g in self._select(samples, None, False).packs]
        keys = [repr(s.__restore_key__) for s in samples]
        counts = [self._native_counts.pop(k, 0) for k in keys]
        final = self._buffer_size is None or len(samples) < self._buffer_size
        selection = self._select(samples, counts, final)
        for i in selection.carried:
            self._native_counts[keys[i]] = counts[i] + 1
        return output(
            packs=[[samples[i] for i in g] for g in selection.packs],
            pushback=[samples[i] for i in selection.carried],
        )

    def select_with_carry(
        self, samples: list[EncodedConversation], counts: list[int], final: bool
    ) -> Selection:
        """The carry stage's select: same algorithm, same code path as ``pack_stream``."""
        return self._select(samples, counts, final)

    def _select(self, samples: list, counts: list[int] | None, final: bool) -> Selection:
        config = self.config
        carry = config.carry_policy if counts is not None else None
        try:
            selection = algorithms.select_packs(
                [s.cost for s in samples],
                config.max_input_seq_length,
                algorithm=config.algorithm,
                max_per_pack=config.max_per_pack,
                seed=config.seed,
                delta=config.delta,
                carry=carry,
                carry_counts=counts,
                buffer_size=self._buffer_size,
                final=final,
            )
        except Exception:  # a bug must not cost a whole buffer: one pack per sample instead
            logger.exception("select failed; emitting %d single packs", len(samples))
            return Selection(packs=[[i] for i in range(len(samples))])
        if carry is not None:
            emitted = [counts[i] for group in selection.packs for i in group]
            self.stats.add_carry(carried=len(selection.carried), emitted_counts=emitted)
        return selection

    def pack_cost(self, samples: list[EncodedConversation]) -> int:
        """Attention cost of a group (sum of squared lengths), for balanced emission."""
        return attention_cost([s.length for s in samples])

    def build_train_datasets(self, **kwargs: Any) -> Any:
        """Energon's pipeline, with every shard reader made tolerant (:mod:`.tolerant`)."""
        dataset = super().build_train_datasets(**kwargs)
        make_tolerant(dataset)
        return dataset

    def build_val_datasets(self, **kwargs: Any) -> Any:
        dataset = super().build_val_datasets(**kwargs)
        make_tolerant(dataset)
        return dataset

    def build_batch(
        self,
        dataset: Any,
        *,
        batch_size: int | None,
        batch_drop_last: bool = False,
        packing_buffer_size: int | None = None,
        worker_config: Any,
    ) -> Any:
        """Energon's packing stage, or ours when carry or balanced emission is on."""
        self._buffer_size = packing_buffer_size
        config = self.config
        own_stage = config.balance_window or (config.carry and native_pushback() is None)
        if packing_buffer_size is None or not own_stage:
            return super().build_batch(
                dataset,
                batch_size=batch_size,
                batch_drop_last=batch_drop_last,
                packing_buffer_size=packing_buffer_size,
                worker_config=worker_config,
            )
        stage = CarryPackingDataset(
            dataset,
            packing_buffer_size,
            selector=self.select_with_carry,
            final_packer=self.pack_selected_samples,
            pack_cost=self.pack_cost,
            balance_window=config.balance_window,
            balance_seed=config.seed,
            worker_config=worker_config,
        )
        return super().build_batch(
            stage,
            batch_size=batch_size,
            batch_drop_last=batch_drop_last,
            packing_buffer_size=None,
            worker_config=worker_config,
        )

    @stateless
    def pack_selected_samples(self, samples: list[EncodedConversation]) -> PackedSample:
        """Decodes this pack's images (only now) and lays the conversations out C wide."""
        config, vision = self.config, self.config.vision
        sources, blocks = [], []
        for sample in samples:
            try:
                decoded = self.decode_images(sample)
            except ImageError as e:
                self.stats.skip(sample.__key__, e.reason, str(e))
                continue
            sources.append(
                SourceTokens(
                    key=sample.__key__,
                    input_ids=sample.input_ids,
                    token_mask=sample.token_mask,
                    grids=[grid for _, grid in decoded],
                )
            )
            blocks.extend(pixels for pixels, _ in decoded)
        if not sources:
            raise SkipSample()
        try:
            pack = assemble(
                sources,
                capacity=config.max_input_seq_length,
                pad_multiple=config.pad_multiple,
                pad_id=self.tokenizer.special.pad,
                mrope=self._mrope,
            )
        except Exception as e:  # report every member rather than let Energon drop the pack
            for source in sources:
                self._unexpected(source.key, "pack_error", e)
            raise SkipSample() from None
        self.stats.add_pack(
            sources=len(sources), real_tokens=pack.real_tokens, capacity=pack.capacity
        )
        pixels = (
            np.concatenate(blocks) if blocks else np.zeros((0, vision.patch_dim), dtype=np.float32)
        )
        return PackedSample(
            __key__="+".join(pack.source_ids),
            __restore_key__=(),
            __subflavors__=samples[0].__subflavors__,
            __sources__=tuple(src for s in samples for src in (s.__sources__ or ())),
            input_ids=torch.from_numpy(pack.input_ids),
            token_mask=torch.from_numpy(pack.token_mask),
            position_ids=torch.from_numpy(pack.position_ids),
            padding_mask=torch.from_numpy(pack.padding_mask),
            cu_seqlens=torch.from_numpy(pack.cu_seqlens),
            cu_seqlens_padded=torch.from_numpy(pack.cu_seqlens_padded),
            source_ids=pack.source_ids,
            pixel_values=torch.from_numpy(pixels),
            image_grid_thw=torch.from_numpy(pack.image_grid_thw),
            image_source_index=torch.from_numpy(pack.image_source_index),
        )

    def _unexpected(self, key: str, reason: str, error: Exception) -> None:
        self.stats.skip(key, reason, f"{type(error).__name__}: {error}")
        self._errors_in_a_row += 1
        if self._errors_in_a_row >= MAX_CONSECUTIVE_ERRORS:
            raise PackingError(
                f"{self._errors_in_a_row} samples in a row failed unexpectedly (last {key!r}: "
                f"{type(error).__name__}: {error}); this looks like a bug or a broken dataset, "
                f"not bad samples"
            ) from error

    def _attach_accounting(self, batch: dict) -> dict:
        """Puts this worker's numbers and the skips since its last batch into the batch, so
        they reach the trainer process whatever ``num_workers`` is."""
        active = WorkerConfig.active_worker_config
        self.stats.worker = active.rank_worker_id() if active is not None else 0
        batch["packing_metrics"] = self.stats.metrics()
        batch["packing_skipped"] = self.stats.drain()
        return batch

    def decode_images(self, sample: EncodedConversation) -> list[tuple[np.ndarray, tuple]]:
        """``(pixel_values, grid)`` per image of a conversation, decoded now (override to serve
        precomputed pixels or features)."""
        return [patchify(data, self.config.vision) for data in sample.images]

    @stateless
    def batch(self, samples: list[PackedSample | EncodedConversation]) -> dict:
        """The contract's batch dict: ``[B, C]`` tensors plus one jagged entry per pack.

        Without a packing buffer (``packing_buffer_size=None``) Energon hands over encoded
        conversations; they become an ordinary padded batch instead (``[B, S]`` rows, real
        ``input_lengths``, no boundary keys): what trainer-side packing and a no-packing
        baseline consume.
        """
        if not isinstance(samples[0], PackedSample):
            return self._attach_accounting(self._batch_rows(samples))
        capacity = self.config.max_input_seq_length
        positions = torch.stack([p.position_ids for p in samples])
        if positions.ndim == 3:  # mRoPE: [B, 3, C] -> [3, B, C]
            positions = positions.permute(1, 0, 2).contiguous()
        return self._attach_accounting(
            {
                "input_ids": torch.stack([p.input_ids for p in samples]),
                "input_lengths": torch.full((len(samples),), capacity, dtype=torch.int32),
                "token_mask": torch.stack([p.token_mask for p in samples]),
                "sample_mask": torch.tensor(
                    [float(bool((p.token_mask > 0).any())) for p in samples], dtype=torch.float32
                ),
                "cu_seqlens": [p.cu_seqlens for p in samples],
                "cu_seqlens_padded": [p.cu_seqlens_padded for p in samples],
                "position_ids": positions,
                "padding_mask": torch.stack([p.padding_mask for p in samples]),
                "source_ids": [list(p.source_ids) for p in samples],
                "pixel_values": [p.pixel_values for p in samples],
                "image_grid_thw": [p.image_grid_thw for p in samples],
                "image_source_index": [p.image_source_index for p in samples],
                "__restore_key__": (),
            }
        )

    def _batch_rows(self, samples: list[EncodedConversation]) -> dict:
        config, multiple = self.config, self.config.pad_multiple
        kept, decoded = [], []
        for sample in samples:
            try:
                decoded.append(self.decode_images(sample))
                kept.append(sample)
            except ImageError as e:
                self.stats.skip(sample.__key__, e.reason, str(e))
        if not kept:
            raise SkipSample()
        width = round_up(max(s.length for s in kept), multiple)
        rows = [
            assemble(
                [
                    SourceTokens(
                        key=s.__key__,
                        input_ids=s.input_ids,
                        token_mask=s.token_mask,
                        grids=[grid for _, grid in images],
                    )
                ],
                capacity=width,
                pad_multiple=multiple,
                pad_id=self.tokenizer.special.pad,
                mrope=self._mrope,
            )
            for s, images in zip(kept, decoded)
        ]
        positions = torch.stack([torch.from_numpy(r.position_ids) for r in rows])
        if positions.ndim == 3:
            positions = positions.permute(1, 0, 2).contiguous()
        empty = np.zeros((0, config.vision.patch_dim), dtype=np.float32)
        return {
            "input_ids": torch.stack([torch.from_numpy(r.input_ids) for r in rows]),
            "input_lengths": torch.tensor([s.length for s in kept], dtype=torch.int32),
            "token_mask": torch.stack([torch.from_numpy(r.token_mask) for r in rows]),
            "sample_mask": torch.tensor(
                [float(bool((r.token_mask > 0).any())) for r in rows], dtype=torch.float32
            ),
            "position_ids": positions,
            "padding_mask": torch.stack([torch.from_numpy(r.padding_mask) for r in rows]),
            "source_ids": [[s.__key__] for s in kept],
            "pixel_values": [
                torch.from_numpy(np.concatenate([p for p, _ in images]) if images else empty)
                for images in decoded
            ],
            "image_grid_thw": [torch.from_numpy(r.image_grid_thw) for r in rows],
            "__restore_key__": (),
        }
