"""Every use of Megatron-Energon internals, in one module, checked at construction.

Two things Energon does not offer publicly:

* **carry and balanced emission.** Energon's ``PackingDataset`` clears its reading buffer
  before every select, so samples of under-full packs cannot wait for better partners (and
  whatever select does not return is lost). :class:`CarryPackingDataset` is a
  ``PackingDataset`` whose loop is the pure :class:`~energon_packing.packing.stream.PackingLoop`,
  run over Energon's own savable buffers: carried samples and the loop's counters are saved
  and restored by Energon's checkpointing like any buffered sample, and restore keys keep
  ``PackingDataset``'s layout, so ``loader.restore_sample`` works unchanged.
* **corrupt shards.** A sample whose tar bytes cannot be read (a truncated or overwritten
  shard, a shard deleted after ``energon prepare``) raises out of Energon's reader and ends the
  epoch. :func:`make_tolerant` wraps every shard reader: such a sample comes back marked
  ``__corrupt__``, the sample loader turns it into a ``corrupt_shard`` skip, reading goes on.

:func:`check_energon` verifies that every internal used here exists in the installed release
and raises :class:`EnergonCompatibilityError` naming the release and the missing name; the
task encoder calls it when it is constructed, so a rename upstream is a clear error, never a
silent no-op.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import tarfile
import warnings
from collections.abc import Callable, Iterator, Mapping
from functools import lru_cache
from importlib.metadata import version
from typing import Any, Protocol

from megatron.energon import TaskEncoder
from megatron.energon.errors import FatalSampleError
from megatron.energon.flavors.base_dataset import (
    SavableDataset,
    add_sample_restore_key,
    set_sample_restore_key,
)
from megatron.energon.flavors.webdataset.base_webdataset import BaseWebdatasetFactory
from megatron.energon.flavors.webdataset.itar import ITarFile
from megatron.energon.flavors.webdataset.itar_reader import ITarReader
from megatron.energon.flavors.webdataset.sample_loader import WebdatasetSampleLoaderDataset
from megatron.energon.state import FlexState
from megatron.energon.task_encoder import loader as _dataset_loader
from megatron.energon.worker import WorkerConfig
from megatron.energon.wrappers import PackingDataset
from megatron.energon.wrappers.base import BaseWrapperDataset, get_sample_restore_key
from megatron.energon.wrappers.buffer import SavableSampleBuffer

from energon_packing.config import MAY_CHANGE, MAY_RAISE, MUST_EQUAL
from energon_packing.errors import describe
from energon_packing.packing.stream import LoopState, PackingLoop, Selector

__all__ = [
    "ENERGON_VERSION",
    "SUPPORTED_ENERGON",
    "EnergonCompatibilityError",
    "RestoreMismatchError",
    "ShardChangedError",
    "check_energon",
]

logger = logging.getLogger("energon_packing")

ENERGON_VERSION = version("megatron-energon")
#: The releases the loader tests pass on (``.ci/run`` runs them on both ends of the range).
SUPPORTED_ENERGON = ">=7.3.2,<7.5"

#: (owner, attribute, what uses it): every Energon internal this module touches.
_INTERNALS: tuple[tuple[type, str, str], ...] = (
    (PackingDataset, "_reading_buffer", "the carry stage's reading buffer"),
    (PackingDataset, "_pre_packing_buffer", "the carry stage's pending packs"),
    (PackingDataset, "_pre_packing_sample_index", "the carry stage's select index"),
    (PackingDataset, "_final_packing_sample_index", "the carry stage's pack index"),
    (PackingDataset, "_sample_encoder_sample_index", "the carry stage's checkpoint"),
    (PackingDataset, "_pre_packing_lengths", "the carry stage's checkpoint"),
    (PackingDataset, "_sample_encoder_failure_handler", "the carry stage's postencode_sample"),
    (PackingDataset, "_final_pack_failure_handler", "the carry stage's error handling"),
    (PackingDataset, "_savable_fields", "the carry stage's checkpoint"),
    (PackingDataset, "reset_state_own", "the carry stage's state"),
    (SavableDataset, "_function_config", "the carry stage's config()"),
    (SavableSampleBuffer, "worker_start", "the carry stage's buffers"),
    (SavableSampleBuffer, "len_worker", "the carry stage's buffers"),
    (SavableSampleBuffer, "flush", "the carry stage's buffers"),
    (SavableSampleBuffer, "extend", "the carry stage's buffers"),
    (SavableSampleBuffer, "buffer", "the carry stage's buffers"),
    (WebdatasetSampleLoaderDataset, "join_readers", "the corrupt-shard tolerance"),
    (ITarReader, "tar_filenames", "corrupt-shard keys"),
    (ITarReader, "_get_itar_sample_pointer", "corrupt-shard keys"),
    (BaseWrapperDataset, "datasets", "the packing guard"),
    (BaseWrapperDataset, "restore_state", "the packing guard's restore check"),
    (_dataset_loader, "load_dataset", "naming the fix for an unprepared dataset folder"),
    (ITarFile, "next", "reading shards at a constant cost per sample"),
    (BaseWebdatasetFactory, "shards", "the shards' fingerprint a checkpoint holds"),
)


class EnergonCompatibilityError(RuntimeError):
    """The installed Energon release lacks an internal this package needs."""


def _has(owner: type, name: str) -> bool:
    return hasattr(owner, name) or any(
        name in getattr(klass, "__annotations__", {}) for klass in owner.__mro__
    )


@lru_cache(maxsize=1)
def check_energon() -> None:
    """Raises :class:`EnergonCompatibilityError` naming the release and the first missing
    internal, unless every internal this module uses exists."""
    for owner, name, purpose in _INTERNALS:
        if not _has(owner, name):
            raise EnergonCompatibilityError(
                f"megatron-energon {ENERGON_VERSION}: {owner.__name__}.{name} (used for "
                f"{purpose}) does not exist in this release; energon_packing supports "
                f"megatron-energon{SUPPORTED_ENERGON}. Install a supported release."
            )
    missing = [f for f in PackingDataset._savable_fields if not _has(PackingDataset, f)]
    if missing:
        raise EnergonCompatibilityError(
            f"megatron-energon {ENERGON_VERSION}: PackingDataset saves {missing}, which it does "
            f"not declare; energon_packing supports megatron-energon{SUPPORTED_ENERGON}"
        )


# ---- carry and balanced emission -------------------------------------------------------------


class _EnergonBuffer:
    """:class:`~energon_packing.packing.stream.Buffer` over Energon's ``SavableSampleBuffer``
    (which keeps each sample's restore key beside it)."""

    def __init__(self, inner: SavableSampleBuffer):
        self.inner = inner

    def __len__(self) -> int:
        return self.inner.len_worker()

    def append(self, sample: Any) -> None:
        self.inner.append(sample)

    def take_all(self) -> tuple[list, list]:
        samples, keys = self.inner.flush()
        return samples, list(keys)

    def put(self, samples: list, keys: list) -> None:
        self.inner.extend(samples, keys)

    def take(self, start: int, count: int) -> list:
        taken = self.inner.buffer[start : start + count]
        del self.inner[start : start + count]
        return taken


class CarryPackingDataset(PackingDataset):
    """``PackingDataset`` with carry and (optionally) rank-balanced emission.

    It saves every field ``PackingDataset`` saves (``_pre_packing_lengths`` is the loop's
    ``pending``) plus the loop's counters, and runs a ``sample_encoder`` (the task encoder's
    ``postencode_sample``) on each member of a pack before ``final_packer``, as
    ``PackingDataset`` does, with its restore keys.

    Args:
        dataset: The encoded samples.
        buffer_size: The reading buffer (plus, without balancing, the pending packs) never
            exceeds this many samples.
        selector: Groups the buffer and names the samples to carry (the task encoder's
            ``select_with_carry``, i.e. ``packing.select_packs``).
        final_packer: ``pack_selected_samples``.
        pack_cost: Attention cost of a group, for balanced emission.
        balance_window: Pool of selected packs to choose from (0: emit in selection order).
        balance_seed: Seed of the shared target sequence (the same on every rank).
        sample_encoder: Run on each member of a pack before ``final_packer``.
        sample_encoder_stateless: Whether ``sample_encoder`` is ``@stateless`` (restorable).
    """

    _savable_fields = (*PackingDataset._savable_fields, "_loop_state")

    def __init__(
        self,
        dataset: SavableDataset,
        buffer_size: int,
        *,
        selector: Selector,
        final_packer: Callable,
        pack_cost: Callable[[list], int],
        balance_window: int = 0,
        balance_seed: int = 0,
        sample_encoder: Callable | None = None,
        sample_encoder_stateless: bool = False,
        worker_config: WorkerConfig,
        final_packer_failure_tolerance: int = 100,
        sample_encoder_failure_tolerance: int = 100,
    ):
        check_energon()
        self.selector = selector
        self.loop = PackingLoop(
            buffer_size=buffer_size,
            select=self._select,
            pack_cost=pack_cost,
            balance_window=balance_window,
            balance_seed=balance_seed,
        )
        super().__init__(
            dataset,
            buffer_size,
            pre_packer=selector,
            final_packer=final_packer,
            final_packer_stateless=True,
            final_packer_failure_tolerance=final_packer_failure_tolerance,
            sample_encoder=sample_encoder,
            sample_encoder_stateless=sample_encoder_stateless,
            sample_encoder_failure_tolerance=sample_encoder_failure_tolerance,
            worker_config=worker_config,
        )

    def reset_state_own(self) -> None:
        self.state = LoopState()
        super().reset_state_own()

    def restore_state(self, state: Any) -> None:
        if state is not None and "_pre_packing_lengths" not in state:  # saved by release 0.2
            loop = state["_loop_state"]
            state = FlexState({**state, "_pre_packing_lengths": list(loop["pending"])})
            state.setdefault("_sample_encoder_sample_index", 0)
        if state is not None and state.get("_loop_state"):
            state = FlexState({**state, "_loop_state": self._in_flops(dict(state["_loop_state"]))})
        super().restore_state(state)

    def _in_flops(self, loop: dict) -> dict:
        """Balance costs saved by release 0.3 were sums of squared lengths; this release prices
        packs in FLOPs (``pack_cost``), an affine map of that sum at a fixed C. A saved cost
        below an empty pack's price is an old one: it is mapped, so targets and pools agree."""
        from types import SimpleNamespace

        empty = self.loop.pack_cost([])
        per_square = self.loop.pack_cost([SimpleNamespace(length=1)]) - empty
        for name in ("history", "pool_costs"):
            values = loop.get(name) or []
            loop[name] = [empty + per_square * v if v < empty else v for v in values]
        return loop

    @property
    def _pre_packing_lengths(self) -> list[int]:
        """``PackingDataset``'s sizes of the pending groups: the loop's ``pending``."""
        return self.state.pending

    @_pre_packing_lengths.setter
    def _pre_packing_lengths(self, value: list[int]) -> None:
        self.state.pending = list(value)

    @property
    def _loop_state(self) -> dict:
        """The loop's counters as plain builtins, which is what Energon saves as they are."""
        return dataclasses.asdict(self.state)

    @_loop_state.setter
    def _loop_state(self, value: dict) -> None:
        self.state = LoopState(**value)

    def _select(self, samples: list, counts: list, final: bool) -> Any:
        with self._pre_packing_sample_index.ctx():
            return self.selector(samples, counts, final)

    def __iter__(self) -> Iterator[Any]:
        reading = _EnergonBuffer(self._reading_buffer)
        pending = _EnergonBuffer(self._pre_packing_buffer)
        self._reading_buffer.worker_start()
        self._pre_packing_buffer.worker_start()
        for members in self.loop.run(iter(self.dataset), reading, pending, self.state):
            members = self._encode(members)
            if not members:
                continue
            member_keys = tuple(get_sample_restore_key(s) for s in members)
            with self._final_pack_failure_handler.handle_errors(members):
                with self._final_packing_sample_index.ctx() as pack_index:
                    packed = self.final_packer(members)
                yield set_sample_restore_key(packed, pack_index, *member_keys, src=self)

    def _encode(self, members: list) -> list:
        """``sample_encoder`` on each member, as ``PackingDataset`` runs it (a skipped member
        leaves the pack; the index goes into the restore key so a restore re-runs it)."""
        if self.sample_encoder is None:
            return members
        encoded = []
        for sample in members:
            with self._sample_encoder_failure_handler.handle_errors(sample):
                with self._sample_encoder_sample_index.ctx() as index:
                    result = self.sample_encoder(sample)
                self._sample_encoder_failure_handler.reset()
                encoded.append(add_sample_restore_key(result, index, src=self))
        return encoded

    def config(self) -> dict[str, Any]:
        return {
            **super().config(),
            "carry_select": self._function_config(self.selector),
            "balance_window": self.loop.balance_window,
            "balance_seed": self.loop.balance_seed,
        }


# ---- the end of a worker's stream, and restores ----------------------------------------------


class RestoreMismatchError(ValueError):
    """A checkpoint restored into settings that change what is packed."""


def compare_settings(
    saved: Mapping[str, Any], current: Mapping[str, Any], rules: Mapping[str, str] | None = None
) -> None:
    """Raises :class:`RestoreMismatchError` naming the first setting whose change its rule
    (``rules[name]``, :data:`~energon_packing.config.MUST_EQUAL` when absent) forbids; a
    setting the checkpoint does not hold (an older release saved it) is not compared. A
    setting that maps ``"release"`` and rules (``hf_compat.pack_rules``) compares the rules
    alone: the first that differs is named, with both releases."""
    rules = rules or {}
    for name, value in current.items():
        if name not in saved:
            continue
        old, rule = saved[name], rules.get(name, MUST_EQUAL)
        if isinstance(value, Mapping) and "release" in value and isinstance(old, Mapping):
            _compare_release_rules(name, old, value)
            continue
        if rule == MAY_CHANGE or old == value:
            continue
        # a limit of None (max_video_tokens) is no limit: the highest
        if rule == MAY_RAISE and (value is None or (old is not None and value >= old)):
            continue
        fix = f"{name}={old!r}" + (" or higher" if rule == MAY_RAISE else "")
        raise RestoreMismatchError(
            f"the checkpoint was saved with {name}={old!r}, this loader has {name}={value!r}: "
            f"it decides the packs ({name} {rule} on restore), so the run would go on with other "
            f"packs than it started with, or a conversation waiting in the restored buffer "
            f"would now be refused. Restore with {fix}, or start without restoring"
        )


def _compare_release_rules(name: str, old: Mapping[str, Any], new: Mapping[str, Any]) -> None:
    """Raises :class:`RestoreMismatchError` naming the first rule (of a library's release,
    e.g. transformers) in force on one side and not on the other; a rule one side does not
    know is not compared."""
    for rule, in_force in new.items():
        if rule == "release" or rule not in old or old[rule] == in_force:
            continue
        was, now = old.get("release"), new.get("release")
        raise RestoreMismatchError(
            f"the checkpoint was saved under {name} release {was} (rule {rule}: "
            f"{'in force' if old[rule] else 'not in force'}), this loader runs release {now} "
            f"({'in force' if in_force else 'not in force'}): the rule changes the packs' ids, "
            f"pixels, positions or masks, so the run would go on with other packs than it "
            f"started with. Restore under release {was} (or one with the same rules), or start "
            f"without restoring"
        )


class ShardChangedError(RestoreMismatchError):
    """A shard the checkpoint's loader read is gone or differs (size, mtime, samples in the
    index) from what it was when that loader was built: Energon would resume at the old byte
    offsets and lose or misread conversations without a word."""


#: A shard as the loader saw it when it was built: [size, mtime_ns, samples in the index]
#: (size and mtime -1: the file was missing).
Fingerprint = list[list[int]]


def shard_fingerprint(datasets: Any) -> tuple[list[str], Fingerprint]:
    """Every shard the loader reads (each dataset of a blend once, in order): its path, and its
    :data:`Fingerprint`. One ``stat`` per shard, no read."""
    import os

    paths: list[str] = []
    prints: Fingerprint = []
    seen: set[str] = set()
    unreadable: list[str] = []
    for loaded in datasets or ():
        factory = getattr(loaded, "dataset", loaded)
        for entry in getattr(factory, "shards", None) or ():
            for shard in entry if isinstance(entry, tuple) else (entry,):  # joined datasets
                path = str(shard.path)
                if path in seen:
                    continue
                seen.add(path)
                try:
                    stat = os.stat(path)
                    size, mtime = stat.st_size, stat.st_mtime_ns
                except OSError:
                    size = mtime = -1
                    unreadable.append(path)
                paths.append(path)
                prints.append([size, mtime, int(shard.count)])
    if unreadable:
        logger.warning(
            "%d of %d shards cannot be stat'ed (e.g. %s: missing, or remote storage): a restore "
            "of this loader's state cannot tell whether they changed",
            len(unreadable),
            len(paths),
            unreadable[0],
        )
    return paths, prints


def compare_shards(
    saved: Fingerprint, paths: list[str], current: Fingerprint, *, check: str = "strict"
) -> None:
    """Raises :class:`ShardChangedError` naming the first shard whose fingerprint differs from
    the checkpoint's, what changed and the fix. ``check``: ``"strict"`` compares size, mtime
    and sample count, ``"size"`` size and count (the ``shard_check`` knob). There is no "off":
    Energon's replay over a changed shard fails or, with workers, loses conversations."""
    import datetime

    restart = (
        "or start this loader without restore_state_rank (the epoch starts over; after "
        "rewriting shards run `energon-packing prepare` first)"
    )
    if len(saved) != len(current):
        raise ShardChangedError(
            f"the checkpoint's loader read {len(saved)} shards, the dataset now has "
            f"{len(current)}: it was re-prepared since. Restore the dataset as it was, {restart}"
        )
    for path, (size, mtime, count), now in zip(paths, saved, current, strict=True):
        if [size, mtime, count] == now or (check == "size" and [size, count] == now[::2]):
            continue
        if size < 0 and count == now[2]:  # not stat-able when saved: the count is all we know
            continue
        fix = "Put the shard back as it was"
        if now[0] < 0:
            what = "is missing"
        elif now[2] != count:
            what = f"holds {now[2]} samples in the index where it held {count}"
        elif now[0] != size:
            what = f"is {now[0]:,} bytes where it was {size:,}"
        else:
            when = datetime.datetime.fromtimestamp(mtime / 1e9, datetime.UTC)
            what = f"was modified (same size; mtime {when:%Y-%m-%d %H:%M:%S} UTC in the checkpoint)"
            fix += (
                f" (if only its mtime changed, a copy without -p: `touch -d "
                f"@{mtime // 10**9}.{mtime % 10**9:09d} {path}`, or shard_check='size' for a "
                f"dataset staged without its mtimes)"
            )
        raise ShardChangedError(
            f"{path} {what} since the checkpoint was saved: resuming would read the old byte "
            f"offsets and lose or misread conversations. {fix}, {restart}"
        )


def saved_num_workers(state: Any) -> int:
    """``num_workers`` of the loader a ``save_state_rank()`` state came from (its shape says:
    one plain state without workers, one checkpoint per worker otherwise)."""
    states = list(state.worker_states)
    return 0 if len(states) == 1 and isinstance(states[0], FlexState) else len(states)


class LossReport(Protocol):
    """Samples lost below the loader (``prepare --allow-losses``) that the skip report owes:
    ``owed`` until :meth:`flush` records them in the worker's accounting."""

    owed: bool

    def flush(self) -> None: ...


class PackingGuard(BaseWrapperDataset):
    """The task encoder's batches, as Energon iterates them, with three additions.

    * Its saved state holds the packing settings and the shards' fingerprint; restoring into
      settings that change the packs raises :class:`RestoreMismatchError`, and restoring after
      a shard changed :class:`ShardChangedError`, before anything inside is restored, so
      before Energon re-reads a buffered sample (``SavableSampleBuffer`` re-reads at
      ``worker_start``).
    * Global worker 0 of rank 0 reports the dataset's losses (``losses``) in its first batch,
      once per pass; whether it has is saved, so a restore never reports them twice.
    * At the end of a worker's stream, one more batch if skips are left that no batch carried
      (``tail()``: an accounting-only batch of zero rows), so every skip reaches the trainer.
    """

    _savable_fields = ("_settings", "_losses_reported", "_shards")

    def __init__(
        self,
        dataset: SavableDataset,
        *,
        settings: dict,
        rules: Mapping[str, str] | None = None,
        tail: Callable[[], Any] | None,
        losses: LossReport | None = None,
        shards: tuple[list[str], Fingerprint] | None = None,
        shard_check: str = "strict",
        worker_config: WorkerConfig,
    ):
        super().__init__(dataset, worker_config=worker_config)
        self.settings = dict(settings)
        self.rules = dict(rules or {})
        self.tail = tail
        self.losses = losses
        self.shard_paths, self.shards = shards or ([], None)
        self.shard_check = shard_check
        self.reset_state_own()

    def reset_state_own(self) -> None:
        self._settings = dict(self.settings)
        self._losses_reported = False
        self._shards = self.shards

    def restore_state(self, state: Any) -> None:
        if state is not None and "_settings" in state:
            compare_settings(dict(state["_settings"]), self.settings, self.rules)
        saved = state.get("_shards") if state is not None else None
        if saved is not None and self.shards is not None:
            compare_shards(saved, self.shard_paths, self.shards, check=self.shard_check)
        if state is not None and "_shards" not in state:  # saved by release 0.3
            state = FlexState({**state, "_shards": self.shards})
        if state is not None and "_losses_reported" not in state:  # saved by release 0.2
            state = FlexState({**state, "_losses_reported": False})
        super().restore_state(state)

    def len_worker(self, worker_idx: int | None = None) -> int:
        return self.dataset.len_worker(worker_idx)

    def _reports_losses(self) -> bool:
        config = self.worker_config
        return self.losses is not None and config.rank == 0 and config.rank_worker_id() == 0

    def __iter__(self) -> Iterator[Any]:
        losses = self.losses if self._reports_losses() else None
        if losses is not None:
            losses.owed = not self._losses_reported
        try:
            for batch in self.dataset:
                if losses is not None:
                    self._losses_reported = not losses.owed
                yield batch
        except FatalSampleError as error:
            ours = _our_error(error)
            if ours is None:
                raise
            # Energon re-wraps a fatal error of ours with a dump of the sample: the user reads
            # our one line (what failed, the numbers, the knob) instead
            raise ours.with_traceback(None) from None
        if losses is not None and losses.owed:  # no batch of this worker carried them
            losses.flush()
            self._losses_reported = True
        extra = self.tail() if self.tail is not None else None
        if extra is not None:
            yield extra
        self._losses_reported = False  # the next pass is another epoch

    def config(self) -> dict[str, Any]:
        return {"type": type(self).__qualname__, "dataset": self.dataset.config(), **self.settings}


# Energon's loaders always ask for pin_memory; on a machine without an accelerator torch warns
# about it once per loader, which every user of a CPU box reads first. Only that message.
warnings.filterwarnings(
    "ignore", message=".*'pin_memory' argument is set as true but no accelerator is found.*"
)


#: The subflavor that names a sample's dataset when the loader blends several (a metadataset):
#: its source ids and skips read ``<dataset>/<key>``.
SOURCE_DATASET = "energon_packing_dataset"


def tag_datasets(datasets: Any) -> dict[str, str]:
    """Names each dataset of a blend (its folder's name; ``#2``, ``#3``... for the next entries
    with the same name, in the metadataset's order) and sets the name as the
    :data:`SOURCE_DATASET` subflavor every sample of it carries. Returns path -> first name.
    One dataset: nothing is named (source ids stay bare keys)."""
    entries = list(datasets or ())
    if len(entries) < 2:
        return {}
    seen: dict[str, int] = {}
    first: dict[str, str] = {}
    for entry in entries:
        factory = entry.dataset
        path = str(getattr(factory, "path", ""))
        base = path.rstrip("/").rsplit("/", 1)[-1] or "dataset"
        seen[base] = seen.get(base, 0) + 1
        name = base if seen[base] == 1 else f"{base}#{seen[base]}"
        factory.subflavors = {**(factory.subflavors or {}), SOURCE_DATASET: name}
        first.setdefault(path, name)
    return first


def keep_no_tar_members() -> None:
    """Energon's ``ITarFile`` is a ``tarfile.TarFile`` kept open per shard; ``TarFile.next``
    appends every header it reads to ``members``, which Energon (reading by byte offset) never
    consults. The list grows by one ``TarInfo`` per part read for as long as the shard stays
    open: at 100k conversations the loader held ~50 MiB of them and each of Energon's
    ``gc.collect`` calls (every 10 samples of a per-sample read) walked them all, 1.97 ms per
    conversation where a constant 0.26 ms is the cost. Emptying the list after each header
    keeps both flat (docs/energon-upstream.md has the upstream fix). Idempotent."""

    def make(original: Callable) -> Callable:
        def next(self: ITarFile) -> Any:
            info = original(self)
            self.members.clear()  # Energon reads by offset; nothing looks a member up by name
            return info

        return next

    _patch_once(ITarFile, "next", make)


def _patch_once(owner: Any, name: str, make: Callable[[Callable], Callable]) -> None:
    """Replaces ``owner.name`` by ``make(original)``, once (a second call finds the mark)."""
    original = getattr(owner, name)
    if getattr(original, "__energon_packing__", False):
        return
    patched = make(original)
    patched.__energon_packing__ = True
    setattr(owner, name, patched)


class DatasetNotPreparedError(ValueError):
    """``get_*_dataset`` on a folder that ``energon prepare`` never saw (Energon's own error
    says only "Invalid dataset")."""


def name_unprepared_datasets() -> None:
    """Wraps the ``load_dataset`` Energon's ``get_train_dataset`` / ``get_val_dataset`` call so
    an unprepared folder is a :class:`DatasetNotPreparedError` naming the fix (a subclass of the
    ``ValueError`` Energon raises). Idempotent; everything else passes through unchanged."""

    def make(original: Callable) -> Callable:
        def load_dataset(path: Any, **kwargs: Any) -> Any:
            try:
                return original(path, **kwargs)
            except ValueError as error:
                if not str(error).startswith("Invalid dataset at") or isinstance(path, dict):
                    raise
                from pathlib import Path

                from energon_packing.incoming.shards import enclosing_dataset, shard_paths

                folder = Path(str(path))
                above = enclosing_dataset(folder)
                if above is not None:
                    fix = f"it is a folder inside the prepared dataset {above}: pass {above}"
                elif folder.is_dir() and shard_paths(folder):
                    fix = f"run `energon-packing prepare {folder}` (it writes .nv-meta/)"
                else:
                    fix = "pass a folder `energon-packing prepare` made, or a metadataset .yaml"
                raise DatasetNotPreparedError(
                    f"{folder} is not a prepared Energon dataset (no .nv-meta/): {fix}"
                ) from None

        return load_dataset

    _patch_once(_dataset_loader, "load_dataset", make)


def _our_error(error: BaseException) -> BaseException | None:
    """The error of this package that ``error`` (Energon's wrapper) was raised while handling."""
    seen = error.__context__
    while seen is not None:
        if type(seen).__module__.startswith("energon_packing."):
            return seen
        seen = seen.__context__
    return None


@contextlib.contextmanager
def without_postencode(task_encoder: TaskEncoder) -> Iterator[None]:
    """While active, Energon's ``build_batch`` sees ``postencode_sample`` as not overridden
    (it decides by the bound method's function), so it does not map it over the packs again
    after the carry stage has run it on each member."""
    task_encoder.postencode_sample = TaskEncoder.postencode_sample.__get__(task_encoder)
    try:
        yield
    finally:
        del task_encoder.postencode_sample


def postencoder(task_encoder: TaskEncoder) -> Callable | None:
    """The task encoder's ``postencode_sample`` if a subclass overrides it (what Energon's
    ``build_batch`` hands its ``PackingDataset`` as ``sample_encoder``), else None."""
    method = task_encoder.postencode_sample
    own = getattr(method, "__func__", None)
    return None if own is TaskEncoder.postencode_sample else method


# ---- corrupt shards --------------------------------------------------------------------------

#: What Energon's tar reader raises for unreadable bytes (ValueError: "Unexpected end of tar
#: file", "Inconsistent sample base name"; OSError: missing or unreadable shard files;
#: MemoryError / OverflowError: a tar header whose size field claims 2**60 bytes).
READ_ERRORS = (tarfile.TarError, EOFError, OSError, ValueError, MemoryError, OverflowError)


class TolerantReader:
    """An Energon ``ITarReader`` whose unreadable samples come back marked ``__corrupt__``."""

    def __init__(self, reader: Any):
        self.reader = reader

    def __getitem__(self, index: int) -> Any:
        try:
            return self.reader[index]
        except READ_ERRORS as e:
            shard = self._shard(index)
            return {
                "__key__": self._key_in_tar(index) or f"{shard}#{index}",
                "__shard__": shard,
                "__restore_key__": ("Webdataset", index),
                "__sources__": (),
                "__corrupt__": f"{shard}: {describe(e)}",
            }

    def _key_in_tar(self, index: int) -> str | None:
        """The sample's key, read from its first tar header (as WebDataset cuts it: the
        member's name up to the first dot of its file name), when the shard still holds that
        header; None when it does not (deleted, cut before it, unreadable)."""
        try:
            pointer = self.reader._get_itar_sample_pointer(index)
            shard = self.reader.base_path / str(self.reader.tar_filenames[pointer.tar_file_id])
            with shard.open("rb") as f:
                f.seek(pointer.byte_offset)
                with tarfile.open(fileobj=f, mode="r:") as tar:
                    member = tar.next()
        except Exception:  # whatever is broken here: the dataset-wide index names it instead
            return None
        if member is None or not member.name:
            return None
        folder, _, name = member.name.rpartition("/")
        key = name.split(".", 1)[0]
        return f"{folder}/{key}" if folder and key else key or None

    def _shard(self, index: int) -> str:
        try:
            return str(
                self.reader.tar_filenames[self.reader._get_itar_sample_pointer(index).tar_file_id]
            )
        except Exception:  # the index itself may be what is broken
            return "unknown-shard"

    def __len__(self) -> int:
        return len(self.reader)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.reader, name)


def make_tolerant(dataset: Any) -> int:
    """Wraps the shard readers of every webdataset loader inside ``dataset``; returns how many
    readers are tolerant now. Raises :class:`EnergonCompatibilityError` if it finds none (the
    dataset's structure is not what this release of the package knows)."""
    wrapped = _wrap(dataset, set())
    if not wrapped:
        raise EnergonCompatibilityError(
            f"megatron-energon {ENERGON_VERSION}: found no WebdatasetSampleLoaderDataset with "
            f"shard readers inside {type(dataset).__name__}; corrupt shards would end the epoch. "
            f"energon_packing supports megatron-energon{SUPPORTED_ENERGON}"
        )
    return wrapped


def _wrap(dataset: Any, seen: set[int]) -> int:
    if id(dataset) in seen:
        return 0
    seen.add(id(dataset))
    if isinstance(dataset, WebdatasetSampleLoaderDataset):
        dataset.join_readers = [
            r if isinstance(r, TolerantReader) else TolerantReader(r) for r in dataset.join_readers
        ]
        return len(dataset.join_readers)
    wrapped = 0
    for value in vars(dataset).values():
        children = value if isinstance(value, (list, tuple)) else (value,)
        for child in children:
            if isinstance(child, tuple):  # BlendDataset keeps (dataset, weight) pairs
                child = child[0] if child else None
            if isinstance(child, SavableDataset):
                wrapped += _wrap(child, seen)
    return wrapped


# ---- field maps ----------------------------------------------------------------------------


def guard_field_maps(datasets: Any) -> int:
    """Makes a ``dataset.yaml`` ``field_map`` that names a part the samples lack an error,
    where Energon would skip every sample alike as an error of its own (0 packs, 0 skips).

    For every sample type, the first sample of the first shard is read when the loader is
    built: a part it lacks raises :class:`~.samples.FieldMapError` naming the part, the field,
    the key and the yaml. A :class:`~.samples.ConversationSample` map is also checked on every
    sample read (naming the key). Returns how many factories were checked.

    Energon keeps the parsed map only in the closure of the sample loader it builds from it
    (``DefaultGenericWebdatasetFactory.__init__``: ``inner_sample_loader`` over ``fields``);
    a release that builds it otherwise leaves the factory as it is (the guard is a better
    message, never a behaviour change).
    """
    from megatron.energon.flavors.webdataset.default_generic_webdataset import (
        DefaultGenericWebdatasetFactory,
    )

    from energon_packing.loader.samples import ConversationSample, guard_field_map

    guarded = 0
    for loaded in datasets or ():
        factory = getattr(loaded, "dataset", None)
        if not isinstance(factory, DefaultGenericWebdatasetFactory):
            continue
        outer = factory._sample_loader
        fields = _field_map(outer)
        if fields is None:  # a sample_loader, not a field_map: nothing to guard
            continue
        conversation = issubclass(factory.__sample_type__, ConversationSample)
        _check_first_sample(factory, fields, conversation=conversation)
        guarded += 1
        if conversation and not getattr(outer, "_energon_packing_guarded", False):
            loader = guard_field_map(outer, fields)
            loader._energon_packing_guarded = True
            factory._sample_loader = loader
    return guarded


def _field_map(loader: Any) -> dict | None:
    """The parsed ``field_map`` a factory's sample loader was built from, None if it has none
    (a ``sample_loader``, or another Energon release)."""
    import inspect

    if not inspect.isfunction(loader):
        return None
    if getattr(loader, "_energon_packing_guarded", False):  # ours: the map is in its closure
        loader = inspect.getclosurevars(loader).nonlocals.get("load")
        if not inspect.isfunction(loader):
            return None
    inner = inspect.getclosurevars(loader).nonlocals.get("inner_sample_loader")
    fields = (
        inspect.getclosurevars(inner).nonlocals.get("fields") if inspect.isfunction(inner) else None
    )
    return fields if isinstance(fields, dict) else None


def _check_first_sample(factory: Any, fields: dict, *, conversation: bool) -> None:
    """:func:`~.samples.check_field_map` on the parts of the first sample of the factory's
    first shard (headers only). An unreadable or empty shard is left to the loader."""
    from energon_packing.incoming.tar_walk import first_sample
    from energon_packing.loader.samples import check_field_map

    if not factory.shards:
        return
    shard = factory.shards[0]
    try:
        found = first_sample(str(shard.path))
    except (OSError, tarfile.TarError, EOFError, ValueError):  # the tolerant reader reports it
        return
    if found is None:
        return
    key, parts = found
    check_field_map(
        {"__key__": key, **dict.fromkeys(parts)},
        fields,
        config=_field_map_config(factory.path, fields),
        conversation=conversation,
        filtered=False,
    )


def _field_map_config(folder: Any, fields: dict) -> str:
    """The path of the ``.nv-meta`` yaml whose ``field_map`` is ``fields`` (Energon does not
    keep the name); ``<folder>/.nv-meta/<dataset config>`` when none or several match."""
    from pathlib import Path

    import yaml

    from energon_packing.loader.samples import field_parts

    meta = f"{folder}/.nv-meta"
    want = {name: field_parts(spec) for name, spec in fields.items()}
    matches = []
    try:  # a local folder (a remote one's name stays generic)
        candidates = sorted(Path(meta).glob("*.yaml"))
    except OSError:
        candidates = []
    for candidate in candidates:
        try:
            loaded = yaml.safe_load(candidate.read_text())
        except Exception:  # not ours to judge here: Energon loaded the one it uses
            continue
        field_map = loaded.get("field_map") if isinstance(loaded, dict) else None
        if isinstance(field_map, dict) and want == {
            name: field_parts(str(spec)) for name, spec in field_map.items()
        }:
            matches.append(str(candidate))
    return matches[0] if len(matches) == 1 else f"{meta}/<dataset config>"
