"""The Energon task encoder: conversations in, full-width packs out.

Energon's hooks, thin; the work is in :mod:`energon_packing.encoding`,
:mod:`energon_packing.packing` and :func:`energon_packing.schema.layout`::

    read -> encode_sample (tokens + image sizes from headers, no pixels)
         -> select_samples_to_pack (packing.select_packs over the buffer)
         -> pack_selected_samples (decode this pack's images, lay the row out C wide)
         -> batch (schema.collate: B packs, normally 1)

Use::

    te = PackingTaskEncoder(max_input_seq_length=8192, tokenizer=hf_tokenizer, pad_multiple=8)
    ds = get_train_dataset(path, worker_config=wc, batch_size=1, packing_buffer_size=256,
                           task_encoder=te, shuffle_buffer_size=None, max_samples_per_sequence=None)
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
from megatron.energon import Cooker, TaskEncoder, WorkerConfig, stateless
from megatron.energon.errors import FatalSampleError, SkipSample  # 7.3.x: the one Energon catches

from energon_packing.config import BUILTIN, KNOBS, PROCESSOR, PackingConfig, check_knobs_path
from energon_packing.encoding import hf_compat, make_chat
from energon_packing.encoding.chat import OverlongError, Skip
from energon_packing.encoding.costs import TILES_FROM_TOKENS, cost_model_for, grids_from_tokens
from energon_packing.errors import describe, quote
from energon_packing.loader.energon import (
    SOURCE_DATASET,
    CarryPackingDataset,
    PackingGuard,
    check_energon,
    guard_field_maps,
    keep_no_tar_members,
    make_tolerant,
    name_unprepared_datasets,
    postencoder,
    shard_fingerprint,
    tag_datasets,
    without_postencode,
)
from energon_packing.loader.samples import (
    ConversationSample,
    EncodedConversation,
    PackedSample,
    cook_conversation,
)
from energon_packing.packing.algorithms import round_up, select_packs
from energon_packing.packing.balance import PackCost, StepCostModel
from energon_packing.packing.carry import Selection
from energon_packing.packing.company import Company
from energon_packing.schema import (
    PACKING_BUFFER_FIX,
    PACKING_METRICS,
    PACKING_SKIPPED,
    RESTORE_KEY,
    Pack,
    Source,
    collate,
    empty_batch,
    layout,
)
from energon_packing.stats import PackingStats

__all__ = ["MAX_CONSECUTIVE_ERRORS", "PackingError", "PackingTaskEncoder"]

logger = logging.getLogger("energon_packing")


#: Unexpected errors in a row (a bug, not bad data) after which the loader stops.
MAX_CONSECUTIVE_ERRORS = 100
#: Restore rule of each knob, from its declaration (loader settings: must equal).
RESTORE_RULES = {knob.name: knob.restore for knob in KNOBS}


class PackingError(FatalSampleError):
    """Stops the loader (Energon does not swallow it): a sample the configuration forbids."""


class _Losses:
    """The dataset's samples lost below the loader (``prepare --allow-losses`` lists them in
    ``.nv-meta/``), owed to the skip report until :meth:`flush` (see ``PackingGuard``)."""

    def __init__(self, entries: list[tuple[str, str, str]], stats_of: Any):
        self.entries = entries
        self.stats_of = stats_of  # the task encoder: its ``stats`` may be replaced
        self.owed = False

    def flush(self) -> None:
        if self.owed:
            self.owed = False
            for key, reason, detail in self.entries:
                self.stats_of.stats.skip(key, reason, detail)


def _dataset_losses(datasets: Any, names: dict[str, str]) -> list[tuple[str, str, str]]:
    """Every loss listed in the prepared datasets' ``.nv-meta/`` (each path once), its key
    named ``<dataset>/<key>`` in a blend (``names``: path -> dataset name)."""
    from energon_packing.incoming.shards import load_losses  # only when a dataset is built

    paths = {str(p): None for d in datasets or () if (p := getattr(d.dataset, "path", None))}
    return [
        (f"{names[path]}/{key}" if path in names else key, reason, detail)
        for path in paths
        for key, reason, detail in load_losses(Path(path))
    ]


class PackingTaskEncoder(TaskEncoder[ConversationSample, EncodedConversation, PackedSample, dict]):
    """Packs multimodal conversations inside the Energon loader.

    Conversations are laid out either by the built-in ChatML + Qwen2-VL layout over
    ``tokenizer`` (no transformers needed) or by a model family's own Hugging Face ``processor``
    (its chat template, image tokens and pixels; :mod:`energon_packing.encoding.processor`).

    Args:
        tokenizer: For the built-in layout: a Hugging Face tokenizer or processor, a
            ``tokenizers.Tokenizer`` or a local path (never downloads); ``"bundled"`` is the
            package's 1,634-token demo tokenizer (sample data, tests).
        processor: Instead of ``tokenizer``: a ``transformers`` processor of a supported family
            (or a tokenizer with a chat template, for text-only models), or a local directory
            holding one.
        **knobs: Every :class:`~energon_packing.config.PackingConfig` knob by its flat name
            (``max_input_seq_length`` is required; :data:`~energon_packing.config.KNOBS` and
            the README's configuration table list them). A knob that does not apply to the
            chosen path (``min_pixels`` with ``processor=``, ``chat_template_kwargs`` with
            ``tokenizer=``) raises, naming what to use instead.
    """

    #: Images stay compressed until their pack is emitted: no Energon-side decoding.
    decoder = None
    #: For crude datasets (``__class__: CrudeWebdataset`` in the dataset yaml).
    cookers = (Cooker(cook_conversation),)

    def __init__(self, *, tokenizer: Any = None, processor: Any = None, **knobs: Any):
        check_energon()
        name_unprepared_datasets()
        keep_no_tar_members()
        # the path check runs on the flat knobs before they are validated, so a knob that does
        # not apply to this path is named before any conflict it has with another
        check_knobs_path(knobs, BUILTIN if processor is None else PROCESSOR)
        self.config = PackingConfig.from_dict(knobs)
        self.chat = make_chat(tokenizer=tokenizer, processor=processor, config=self.config)
        vision = self.config.vision
        #: what balanced emission and the pack accounting price a pack with: the model's own
        #: sizes where its config is found (``energon_packing.encoding.costs``); assign another
        #: :class:`StepCostModel` before the loader is built to override it
        self.cost_model: StepCostModel = cost_model_for(
            processor if processor is not None else tokenizer,
            model_type=self.config.model_type,
            patch_size=vision.patch_size,
            merge_size=vision.merge_size,
        )
        #: the built-in layout's tokenizer (None on a processor path)
        self.tokenizer = self.chat.tokenizer if processor is None else None
        self.stats = PackingStats()
        self._buffer_size: int | None = None  # set by build_batch
        self._errors_in_a_row = 0
        self._landed = 0  # conversations this worker put into a pack or a row
        self._cheapest_overlong: int | None = None  # cost of the shortest over-long one
        #: the train datasets' losses (prepare --allow-losses), owed to the skip report
        self._loss_reports: list[_Losses] = []
        self._pending_losses: _Losses | None = None  # set while build_train_datasets runs
        #: the shards' fingerprint, saved with the state (set while build_*_datasets runs)
        self._pending_shards: Any = None

    @classmethod
    def from_config(
        cls, config: PackingConfig | dict, *, tokenizer: Any = None, processor: Any = None
    ) -> PackingTaskEncoder:
        values = config.to_dict() if isinstance(config, PackingConfig) else dict(config)
        return cls(tokenizer=tokenizer, processor=processor, **values)

    @property
    def pad_id(self) -> int:
        """The id of padding tokens (between conversations and in the tail)."""
        return self.chat.pad_id

    @property
    def image_token_id(self) -> int | None:
        """The id the model replaces with vision features (None for text-only models)."""
        return self.chat.image_token_id

    @property
    def mrope(self) -> bool:
        """Whether ``position_ids`` are 3-row mRoPE (``[3, B, C]``)."""
        return self.chat.mrope is not None

    # ---- Energon hooks ------------------------------------------------------------------

    @stateless
    def encode_sample(self, sample: ConversationSample) -> EncodedConversation:
        subflavors = sample.__subflavors__ or {}
        dataset = subflavors.get(SOURCE_DATASET)  # in a blend: ids name their dataset
        key = sample.__key__ if dataset is None else f"{dataset}/{sample.__key__}"
        self.stats.read += 1
        try:
            if sample.problem:
                problem = sample.problem  # (reason, detail); release 0.3 sample loaders: a str
                if isinstance(problem, str):
                    problem = problem.partition(": ")[::2]
                raise Skip(*problem)
            encoding = self.chat.encode(
                key=key,
                messages=sample.messages,
                image_names=sample.image_names,
                images=sample.images,
                video_names=sample.video_names,
                videos=sample.videos,
                audio_names=getattr(sample, "audio_names", ()),
                audios=getattr(sample, "audios", None),
                loss_weight=sample.loss_weight * float(subflavors.get("loss_weight", 1.0)),
                config=self.config,
            )
        except Skip as e:
            self._skip(key, e.reason, e.detail, cost=e.cost)
            raise SkipSample() from None
        except OverlongError as e:
            raise PackingError(str(e)) from None
        except Exception as e:  # a bug or data no check foresaw: count it, never dump per sample
            self._unexpected([key], "encode_error", e)
            raise SkipSample() from None
        self._errors_in_a_row = 0
        if encoding.truncated:
            self.stats.truncated += 1
            self.stats.truncated_tokens += encoding.truncated
        return EncodedConversation.derive_from(
            sample,
            __key__=key,
            input_ids=np.asarray(encoding.input_ids, dtype=np.int64),
            token_mask=np.asarray(encoding.token_mask, dtype=np.float32),
            images=[sample.images[sample.image_names[i]] for i in encoding.image_order],
            videos=[sample.videos[sample.video_names[i]] for i in encoding.video_order],
            video_plans=encoding.video_plans,
            audios=[
                sample.audios[sample.audio_names[i]] for i in getattr(encoding, "audio_order", ())
            ],
            grids=self._grids(encoding),
            audio_frames=(
                list(getattr(encoding, "audio_frames", ())) if self.cost_model.audio else []
            ),
            length=encoding.length,
            cost=round_up(encoding.length, self.config.pad_multiple),
            company=self._company(encoding),
            prefix_length=getattr(encoding, "prefix_length", None),
        )

    def _company(self, encoding: Any) -> Company:
        """Whom a conversation may share its pack with: where the family's model hears the
        rest of a call beside its clips (``AudioRule.alone``), a conversation with clips only
        with conversations without media, which fill the rest of its pack."""
        if not self.chat.clips_alone:
            return Company.ANY
        if getattr(encoding, "audio_order", ()):
            return Company.APART
        if encoding.image_order or encoding.video_order:
            return Company.ANY
        return Company.PLAIN

    def _grids(self, encoding: Any) -> list:
        """Each image's and video's grid, from headers: the built-in layout's image grids, a
        processor's as its image tokens imply them (:func:`grids_from_tokens`), the videos'
        from their plans. Empty where the model's vision encoder is not priced."""
        tower = self.cost_model.vision
        if tower is None:
            return []
        images = getattr(encoding, "grids", None)  # the built-in layout's
        tiled = getattr(encoding, "tiles", None)  # anyres: the tower's tiles, from sizes
        if images is None and tiled and tower.tile_size:
            images = [(1, tower.tile_size, tower.tile_size)] * sum(tiled)
        # InternVL's frames are image tiles: their runs of image tokens are theirs to price
        tiles = [p for p in encoding.video_plans if p.style.frames_as_tiles]
        if images is None and (encoding.image_order or tiles) and self.image_token_id is not None:
            images = grids_from_tokens(
                encoding.input_ids,
                token_id=self.image_token_id,
                merge_size=tower.spatial_merge_size,
                tile_tokens=tower.tile_tokens,
                row_break=self.chat.row_break_id,
            )
        videos = [tuple(p.grid) for p in encoding.video_plans if not p.style.frames_as_tiles]
        return [*(tuple(g) for g in images or ()), *videos]

    def select_samples_to_pack(self, samples: list[EncodedConversation]) -> list:
        """Groups the buffer with :func:`energon_packing.packing.select_packs`; every sample
        comes back (Energon silently drops what select does not return). Energon's own stage
        calls it when carry and balancing are off; otherwise :meth:`select_with_carry` runs in
        :class:`~energon_packing.loader.energon.CarryPackingDataset`."""
        return [[samples[i] for i in g] for g in self._select(samples, None, False).packs]

    def select_with_carry(
        self, samples: list[EncodedConversation], counts: list[int], final: bool
    ) -> Selection:
        """The carry stage's select: the same algorithm and code path as ``pack_stream``."""
        return self._select(samples, counts if self.config.carry else None, final)

    def _select(self, samples: list, counts: list[int] | None, final: bool) -> Selection:
        config = self.config
        carry = config.carry_policy if counts is not None else None
        try:
            selection = select_packs(
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
                company=[s.company for s in samples] if self.chat.clips_alone else None,
            )
        except Exception:  # a bug must not cost a whole buffer: one pack per sample instead
            logger.exception("select failed; emitting %d single packs", len(samples))
            return Selection(packs=[[i] for i in range(len(samples))])
        if carry is not None:
            emitted = [counts[i] for group in selection.packs for i in group]
            self.stats.add_carry(carried=len(selection.carried), emitted_counts=emitted)
        return selection

    def pack_cost(self, samples: list[EncodedConversation]) -> int:
        """Training FLOPs of a group as a pack (:attr:`cost_model`: decoder, vision and audio
        encoders), for balanced emission."""
        return self.cost_model.pack_flops(
            [s.length for s in samples],
            capacity=self.config.max_input_seq_length,
            grids=[g for s in samples for g in getattr(s, "grids", ())],
            audio_frames=[n for s in samples for n in getattr(s, "audio_frames", ())],
        )

    def emitted_cost(self, pack: Pack) -> PackCost:
        """A laid-out pack's modelled cost by component, from its own ``cu_seqlens`` and media
        grids (``image_grid_thw``, ``video_grid_thw``; Llama 4's and InternVL's tiles, which
        they carry none of, as their image tokens imply them: ``costs.TILES_FROM_TOKENS``)."""
        bounds = pack.cu_seqlens.tolist()
        grids = [
            row
            for name in ("image_grid_thw", "video_grid_thw")
            if name in pack.media
            for row in np.asarray(pack.media[name]).reshape(-1, 3).tolist()
        ]
        tower = self.cost_model.vision
        if tower is not None and self.chat.family_name in TILES_FROM_TOKENS:
            grids += grids_from_tokens(
                pack.input_ids,
                token_id=self.image_token_id,
                merge_size=tower.spatial_merge_size,
                tile_tokens=tower.tile_tokens,
                row_break=self.chat.row_break_id,
            )
        if tower is not None and tower.tile_size and "image_sizes" in pack.media:
            grids += self._anyres_grids(pack.media, tower.tile_size)
        mask = pack.media.get("feature_attention_mask")  # a clip's mel frames: its mask's
        frames = (
            np.asarray(mask).reshape(-1, np.shape(mask)[-1]).sum(-1) if mask is not None else ()
        )
        return self.cost_model.pack_cost(
            [b - a for a, b in zip(bounds, bounds[1:])],
            capacity=pack.width,
            grids=grids,
            audio_frames=[int(n) for n in frames],
        )

    def _anyres_grids(self, media: dict, side: int) -> list:
        """A pack's anyres images (LLaVA-NeXT, LLaVA-OneVision) as the tiles the tower runs
        over, from its ``image_sizes`` per conversation (``batch_num_images``; without it each
        image alone, as the models read it); none for the other families."""
        sizes = [tuple(s) for s in np.asarray(media["image_sizes"]).reshape(-1, 2).tolist()]
        counts = media.get("batch_num_images")
        counts = np.asarray(counts).tolist() if counts is not None else [1] * len(sizes)
        texts, first = [], 0
        for n in counts:
            texts.append(sizes[first : first + n])
            first += n
        return [(1, side, side)] * sum(self.chat.image_tiles(texts))

    def build_train_datasets(self, **kwargs: Any) -> Any:
        """Energon's pipeline, with every shard reader made tolerant of corrupt bytes and the
        losses ``prepare --allow-losses`` listed owed to the skip report."""
        guard_field_maps(kwargs.get("datasets"))
        names = tag_datasets(kwargs.get("datasets"))
        self._pending_losses = _Losses(_dataset_losses(kwargs.get("datasets"), names), self)
        self._pending_shards = shard_fingerprint(kwargs.get("datasets"))
        try:
            dataset = super().build_train_datasets(**kwargs)
        finally:
            self._pending_losses = self._pending_shards = None
        make_tolerant(dataset)
        return dataset

    def build_val_datasets(self, **kwargs: Any) -> Any:
        """As :meth:`build_train_datasets`; the losses list covers the train split (only the
        train loader reports it)."""
        guard_field_maps(kwargs.get("datasets"))
        tag_datasets(kwargs.get("datasets"))
        self._pending_shards = shard_fingerprint(kwargs.get("datasets"))
        try:
            dataset = super().build_val_datasets(**kwargs)
        finally:
            self._pending_shards = None
        make_tolerant(dataset)
        return dataset

    def restore_settings(self, *, packing_buffer_size: int | None, worker_config: Any) -> dict:
        """What a checkpoint must be restored with: the pack-deciding knobs (effective values),
        the chat layout's fingerprint (processor, chat template, special ids) and the loader
        settings packs depend on."""
        return {
            **self.config.settings(),
            "mrope": self.mrope,  # the effective one (None: the family's own)
            "chat_fingerprint": self.chat.fingerprint,
            # the effective video rule (processor settings and video_config); not in the
            # fingerprint, which stays as older releases saved it
            "video_rule": repr(self.chat.videos.rule) if self.chat.videos is not None else None,
            # the transformers rules that change ids, pixels, positions or masks by release
            "transformers": hf_compat.pack_rules(),
            "packing_buffer_size": packing_buffer_size,
            "num_workers": worker_config.num_workers,
            "world_size": worker_config.world_size,
            "rank": worker_config.rank,
        }

    def build_batch(
        self,
        dataset: Any,
        *,
        batch_size: int | None,
        batch_drop_last: bool = False,
        packing_buffer_size: int | None = None,
        worker_config: Any,
    ) -> Any:
        """Energon's packing stage, or ours when carry or balanced emission is on; then the
        guard that ends each worker's stream with its leftover skips and checks restores."""
        self._buffer_size = packing_buffer_size
        config = self.config
        if batch_size is not None:
            check_packing_buffer(packing_buffer_size, unpacked=config.unpacked)
        settings = self.restore_settings(
            packing_buffer_size=packing_buffer_size, worker_config=worker_config
        )
        own_stage = packing_buffer_size is not None and (config.carry or config.balance_window)
        if own_stage:
            post = postencoder(self)  # Energon's PackingDataset runs it before each pack
            dataset = CarryPackingDataset(
                dataset,
                packing_buffer_size,
                selector=self.select_with_carry,
                final_packer=self.pack_selected_samples,
                pack_cost=self.pack_cost,
                balance_window=config.balance_window,
                balance_seed=config.seed,
                sample_encoder=post,
                sample_encoder_stateless=post is None or getattr(post, "__stateless__", False),
                worker_config=worker_config,
            )
            packing_buffer_size = None
        with without_postencode(self) if own_stage else contextlib.nullcontext():
            batches = super().build_batch(
                dataset,
                batch_size=batch_size,
                batch_drop_last=batch_drop_last,
                packing_buffer_size=packing_buffer_size,
                worker_config=worker_config,
            )
        losses = self._pending_losses if batch_size is not None else None
        if losses is not None:
            self._loss_reports.append(losses)
        return PackingGuard(
            batches,
            settings=settings,
            rules=RESTORE_RULES,
            tail=self._tail if batch_size is not None else None,
            losses=losses,
            shards=self._pending_shards,
            shard_check=self.config.shard_check,
            worker_config=worker_config,
        )

    @stateless
    def pack_selected_samples(self, samples: list[EncodedConversation]) -> PackedSample:
        """Decodes this pack's images (only now) and lays the conversations out C wide.

        Each conversation is decoded and checked on its own: one that fails costs only itself
        (skipped with its reason), never its pack-mates.
        """
        sources = self._sources(samples)
        config = self.config
        try:
            pack = layout(
                sources,
                width=config.max_input_seq_length,
                pad_multiple=config.pad_multiple,
                pad_id=self.pad_id,
            )
            pack.check(pad_multiple=config.pad_multiple)
        except Exception as e:  # a bug: report every member rather than let Energon drop them
            self._unexpected([source.key for source in sources], "pack_error", e)
            raise SkipSample() from None
        self._errors_in_a_row = 0
        self._landed += len(sources)
        self.stats.add_pack(
            sources=len(sources),
            real_tokens=pack.real_tokens,
            capacity=pack.width,
            cost=self.emitted_cost(pack),
        )
        return PackedSample(
            __key__="+".join(pack.source_ids),
            __restore_key__=(),
            __subflavors__=samples[0].__subflavors__,
            __sources__=tuple(src for s in samples for src in (s.__sources__ or ())),
            pack=pack,
        )

    @stateless
    def batch(self, samples: list[PackedSample | EncodedConversation]) -> dict:
        """The contract's batch dict (:func:`energon_packing.schema.collate`) plus this worker's
        accounting.

        Without a packing buffer (``packing_buffer_size=None``) Energon hands over encoded
        conversations; they become an ordinary padded batch instead (``[B, S]`` rows, real
        ``input_lengths``, no boundary keys): what trainer-side packing and a no-packing
        baseline consume.
        """
        if isinstance(samples[0], PackedSample):
            batch = collate([s.pack for s in samples])
        else:
            batch = collate(self._rows(samples), prepacked=False)
        return self._account(batch)

    def _account(self, batch: dict) -> dict:
        """This worker's counters and the skips since its previous batch, into ``batch``."""
        batch[RESTORE_KEY] = ()
        active = WorkerConfig.active_worker_config
        self.stats.worker = active.rank_worker_id() if active is not None else 0
        for losses in self._loss_reports:  # owed only by global worker 0 of rank 0, once a pass
            losses.flush()
        batch[PACKING_METRICS] = self.stats.metrics()
        batch[PACKING_SKIPPED] = self.stats.drain()
        return batch

    # ---- helpers --------------------------------------------------------------------------

    def _sources(self, samples: list[EncodedConversation]) -> list[Source]:
        """The samples that survive, in order, each with its decoded images and videos,
        checked and ready for :func:`layout`; one that fails (a medium does not decode, or the
        conversation fails at pack time) is skipped with its reason, it alone, never its
        pack-mates. None left is Energon's skip. The chat layout takes the whole pack at once
        (one image-processor call where a processor's family allows)."""
        items = [
            {
                "key": s.__key__,
                "input_ids": s.input_ids,
                "token_mask": s.token_mask,
                "images": s.images,
                "videos": s.videos,
                "video_plans": s.video_plans,
                "audios": getattr(s, "audios", []),
                "prefix_length": getattr(s, "prefix_length", None),
            }
            for s in samples
        ]
        outcomes = self.chat.sources(items=items, config=self.config)
        sources = []
        for sample, outcome in zip(samples, outcomes, strict=True):
            if not isinstance(outcome, Exception):
                sources.append(outcome)
            elif isinstance(outcome, Skip):
                self._skip(sample.__key__, outcome.reason, outcome.detail, cost=outcome.cost)
            else:  # a bug (or a processor that disagrees with its size rule)
                self._unexpected([sample.__key__], "source_error", outcome)
        if not sources:
            raise SkipSample()
        return sources

    def _tail(self) -> dict | None:
        """The accounting-only batch that ends a worker's stream when skips are left that no
        batch carried (e.g. every remaining sample was over-long)."""
        if not self.stats.events:
            return None
        config = self.config
        empty = empty_batch(config.max_input_seq_length, mrope=self.mrope)
        return self._account({**empty, **{name: [] for name in self.chat.empty_media(config)}})

    def _rows(self, samples: list[EncodedConversation]) -> list[Pack]:
        """One padded row per conversation, all as wide as the longest (rounded up)."""
        sources = self._sources(samples)
        multiple = self.config.pad_multiple
        self._landed += len(sources)
        width = round_up(max(len(s.input_ids) for s in sources), multiple)
        return [
            layout([s], width=width, pad_multiple=multiple, pad_id=self.pad_id) for s in sources
        ]

    def _unexpected(self, keys: list[str], reason: str, error: Exception) -> None:
        """Skips ``keys`` under ``reason`` and counts ONE unexpected error (a failed pack is one
        failure, however many members it had; data skips are never counted)."""
        detail = describe(error)
        self._errors_in_a_row += 1
        if self._errors_in_a_row >= MAX_CONSECUTIVE_ERRORS:
            for key in keys:
                self.stats.skip(key, reason, detail)
            raise PackingError(
                f"{self._errors_in_a_row} unexpected errors in a row (last {quote(keys[-1])}: "
                f"{detail}); this looks like a bug or a broken dataset, not bad samples"
            ) from error
        for key in keys:
            self._skip(key, reason, detail)

    def _skip(self, key: str, reason: str, detail: str, *, cost: int | None = None) -> None:
        """Counts a skip; stops the worker if it has skipped ``max_skips_without_pack``
        samples and put none into a pack (a loader that would otherwise loop forever)."""
        self.stats.skip(key, reason, detail)
        if reason == "overlong" and cost is not None:
            self._cheapest_overlong = min(cost, self._cheapest_overlong or cost)
        limit = self.config.max_skips_without_pack
        skipped = sum(self.stats.skipped.values())
        if limit is not None and not self._landed and skipped >= limit:
            raise PackingError(self._nothing_packed(skipped))

    def _nothing_packed(self, skipped: int) -> str:
        config = self.config
        capacity = config.max_input_seq_length
        reasons = ", ".join(f"{r} {n:,}" for r, n in Counter(self.stats.skipped).most_common())
        worker = f"worker {self.stats.worker}" if self.stats.worker else "this loader worker"
        text = (
            f"{worker} skipped {skipped:,} samples and packed none (max_skips_without_pack="
            f"{config.max_skips_without_pack}); skip reasons: {reasons}. max_input_seq_length="
            f"{capacity}"
        )
        if self._cheapest_overlong is not None:
            text += (
                f"; the shortest over-long conversation costs {self._cheapest_overlong:,} "
                f"tokens: raise max_input_seq_length to at least {self._cheapest_overlong} "
                f"(or overlong='truncate')"
            )
        return text + ". Fix the data or the knobs, or set max_skips_without_pack=None"


def check_packing_buffer(packing_buffer_size: int | None, *, unpacked: bool) -> None:
    """Packing cannot be silently off: a batched loader needs a packing buffer, unless the
    ``unpacked`` knob asks for ordinary padded batches (then it must have none)."""
    if packing_buffer_size is None and not unpacked:
        raise ValueError(
            f"PackingTaskEncoder: this loader was built without packing_buffer_size, so Energon "
            f"would hand over single conversations and nothing would be packed. "
            f"{PACKING_BUFFER_FIX}, or PackingTaskEncoder(unpacked=True) for ordinary padded "
            f"batches"
        )
    if packing_buffer_size is not None and unpacked:
        raise ValueError(
            f"PackingTaskEncoder(unpacked=True) asks for padded batches, but the loader was "
            f"built with packing_buffer_size={packing_buffer_size}: drop one of the two"
        )


def _signature() -> inspect.Signature:
    """``PackingTaskEncoder(*, tokenizer, processor, <every knob>)``, from the declarations."""
    keyword = inspect.Parameter.KEYWORD_ONLY
    params = [
        inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD),
        inspect.Parameter("tokenizer", keyword, default=None),
        inspect.Parameter("processor", keyword, default=None),
    ]
    for knob in KNOBS:
        default = inspect.Parameter.empty if knob.required else knob.default
        params.append(inspect.Parameter(knob.name, keyword, default=default))
    return inspect.Signature(params)


PackingTaskEncoder.__init__.__signature__ = _signature()
