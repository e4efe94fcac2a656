"""Prepare a WebDataset folder for Energon with our sample type: index + ``.nv-meta`` yamls.

The documented manual route is two steps::

    energon prepare PATH --non-interactive --skip-dataset-yaml \\
        --split-parts 'train:shards/.*' --split-parts 'val:shards/.*'
    cp configs/dataset.yaml PATH/.nv-meta/dataset.yaml          # and dataset_crude.yaml

:func:`prepare_dataset` (CLI: ``energon-packing prepare PATH``) does both, after reading every
shard's headers (:mod:`energon_packing.incoming.shards`): a dataset where conversations would
vanish below the loader, uncounted, is refused unless ``allow_losses=True`` (``--allow-losses``);
then shards cut mid-member are cut back to their whole samples and the lost conversations are
written to ``.nv-meta/energon_packing_losses.json``, which the loader's skip report carries.
What the loader counts itself (a sample without ``.json``, a lying member's own sample) is
reported by ``energon-packing check`` but is no reason to refuse. Keys repeated apart are
always refused: Energon's index cannot hold them.
"""

from __future__ import annotations

import contextlib
import io
import logging
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from energon_packing.errors import describe
from energon_packing.incoming.shards import (
    LOSSES_FILE,
    Scan,
    cut_losses,
    cut_shard_back,
    scan_dataset,
    shard_paths,
    write_losses,
)

__all__ = [
    "CRUDE_DATASET_YAML",
    "DATASET_YAML",
    "ShardLossError",
    "SplitPatternError",
    "prepare_dataset",
    "write_yamls",
]

logger = logging.getLogger("energon_packing")

#: ``.nv-meta/dataset.yaml``: our sample type and loader (``energon info/lint/preview`` work).
DATASET_YAML = """\
# energon_packing: one conversation per sample; images stay compressed bytes until packing.
# part_filter reads <key>.json and every part that may be an image (any name but text, tensor,
# audio, video and archive suffixes: formats are recognised by content). A field_map cannot
# build a ConversationSample (it maps one part per field; the images are all image parts).
sample_type:
  __module__: energon_packing.loader.samples
  __class__: ConversationSample
sample_loader:
  __module__: energon_packing.loader.samples
  __function__: conversation_loader
part_filter:
  __module__: energon_packing.loader.samples
  __function__: conversation_parts
"""

#: ``.nv-meta/dataset_crude.yaml``: Energon's preferred 7.x route; PackingTaskEncoder cooks it.
#: Select it with ``dataset_config="dataset_crude.yaml"`` (``energon info`` cannot read crude
#: datasets in 7.4.1; use dataset.yaml for inspection).
CRUDE_DATASET_YAML = """\
# energon_packing, crude route: PackingTaskEncoder.cookers turns each raw sample into a
# ConversationSample with the same loader as dataset.yaml.
__module__: megatron.energon
__class__: CrudeWebdataset
subflavors:
  source: crude
"""

YAMLS = {"dataset.yaml": DATASET_YAML, "dataset_crude.yaml": CRUDE_DATASET_YAML}


def write_yamls(path: Path | str) -> list[Path]:
    """Writes our yaml files into ``PATH/.nv-meta/`` (which ``energon prepare`` created)."""
    meta = Path(path) / ".nv-meta"
    if not meta.is_dir():
        raise FileNotFoundError(f"{meta} does not exist: run `energon prepare {path}` first")
    written = []
    for name, text in YAMLS.items():
        (meta / name).write_text(text)
        written.append(meta / name)
    return written


class SplitPatternError(ValueError):
    """A ``split_parts`` entry that is malformed or matches no shard."""


class ShardLossError(ValueError):
    """The shards hold conversations Energon would drop uncounted (``scan`` says which)."""

    def __init__(self, message: str, scan: Scan) -> None:
        super().__init__(message)
        self.scan = scan


def check_split_parts(split_parts: Sequence[str], shards: Sequence[str]) -> None:
    """Every ``split:regex`` must match a shard as Energon matches it (brace-expanded,
    ``re.match`` on the path relative to the dataset folder)."""
    import braceexpand

    for entry in split_parts:
        split, colon, pattern = entry.partition(":")
        if not colon or not split or not pattern:
            raise SplitPatternError(f"split part {entry!r} is not 'split:regex'")
        try:
            patterns = [re.compile(p) for p in braceexpand.braceexpand(pattern)]
        except re.error as e:
            raise SplitPatternError(
                f"split part {entry!r}: {pattern!r} is no regex ({e})"
            ) from None
        if not any(p.match(shard) for p in patterns for shard in shards):
            seen = ", ".join(shards[:5]) + (
                f", ... ({len(shards)} in all)" if len(shards) > 5 else ""
            )
            raise SplitPatternError(
                f"split part {entry!r}: the pattern {pattern!r} matches no shard (shards seen, "
                f"relative to the dataset folder: {seen}); it is matched from the start of "
                f"the path, e.g. '{split}:{_example(shards)}'"
            )


def _example(shards: Sequence[str]) -> str:
    folder = shards[0].rpartition("/")[0] if shards else ""
    return f"{re.escape(folder)}/.*" if folder else ".*\\.tar$"


def refusal(scan: Scan, *, allow_losses: bool) -> str | None:
    """Why :func:`prepare_dataset` must stop on this scan, or None."""
    if scan.repeated_apart:
        first = scan.repeated_apart[0]
        return (
            f"{len(scan.repeated_apart)} key(s) repeated apart, e.g. {first.key!r} in "
            f"{first.shard} at {first.offset:,} ({first.detail}); Energon's index holds each "
            f"key once: rename them in the shards (or `energon prepare --fix-duplicates`, "
            f"which needs numba)"
        )
    if scan.empty:
        names = ", ".join(s.shard for s in scan.empty[:3])
        return (
            f"{len(scan.empty)} shard(s) without one whole sample ({names}): Energon's prepare "
            f"fails on them ('Shard ... has no samples'); remove them or fix their members"
        )
    if allow_losses or not (scan.losses or scan.cut):
        return None
    counts = {}
    for finding in scan.losses:
        counts[finding.reason] = counts.get(finding.reason, 0) + 1
    first = scan.losses[0] if scan.losses else None
    text = f"{len(scan.losses)} conversation(s) would vanish below the loader, uncounted ("
    text += ", ".join(f"{reason}: {n}" for reason, n in sorted(counts.items())) + ")"
    if first is not None:
        text += f", e.g. {first.key!r} in {first.shard} at {first.offset:,}: {first.detail}"
    if scan.cut:
        cut = scan.cut[0]
        text += (
            f"; {len(scan.cut)} shard(s) cut mid-member, e.g. {cut.shard} in {cut.cut_member} "
            f"(whole samples end at {cut.cut_at:,})"
        )
    return text


def _failed_in_preview(output: str) -> bool:
    """Energon's prepare ends by printing the documents of the first two samples of the first
    shard, and raises when one is malformed JSON (a lying member's, say): by then the index and
    the splits are written, and with --skip-dataset-yaml nothing else follows."""
    lines = [line for line in output.splitlines() if line.strip()]
    return bool(lines) and lines[-1].startswith("Json content of sample ")


def prepare_dataset(
    path: Path | str,
    *,
    split_parts: Sequence[str] = ("train:.*\\.tar$",),
    num_workers: int = 1,
    allow_losses: bool = False,
) -> list[Path]:
    """Scans the shards, runs ``energon prepare`` (index, splits), writes our dataset yamls and
    the losses file.

    Args:
        path: Folder holding the ``.tar`` shards (any depth).
        split_parts: ``split:regex`` patterns over shard paths (relative to ``path``); patterns
            may overlap; each must match a shard.
        num_workers: Indexing processes.
        allow_losses: Go on when conversations would vanish below the loader: cut shards back
            to their whole samples and list the lost conversations in
            ``.nv-meta/energon_packing_losses.json`` (the loader reports them).

    Raises:
        SplitPatternError: A ``split_parts`` entry matches no shard.
        ShardLossError: Conversations would be lost (and not ``allow_losses``), keys repeat
            apart, or a shard holds no whole sample.
    """
    from megatron.energon.cli.main import main as energon_cli

    shards = shard_paths(path)
    if not shards:
        raise FileNotFoundError(f"{path} holds no .tar shards (searched **/*.tar, **/*.tgz)")
    check_split_parts(split_parts, shards)
    scan = scan_dataset(path, shards=shards)
    why = refusal(scan, allow_losses=allow_losses)
    if why is not None:
        raise ShardLossError(f"{path}: {why}", scan)
    earlier = cut_losses(path)  # shards an earlier prepare cut back now look whole
    for shard in scan.cut:
        cut_shard_back(path, shard, scan.findings)
    if scan.losses:
        first = scan.losses[0]
        logger.warning(
            "%s: %d conversation(s) lost in the shards go to the skip report (%s), e.g. %r in "
            "%s at %s: %s",
            path, len(scan.losses), LOSSES_FILE, first.key, first.shard, first.offset,
            first.detail,
        )  # fmt: skip

    args = [
        "prepare",
        str(path),
        "--non-interactive",
        "--skip-dataset-yaml",
        "--force-overwrite",
        "--no-progress",
        "--num-workers",
        str(num_workers),
    ]  # no --media-metadata-*: we read image sizes ourselves, and it fails whole shards that
    #    hold one corrupt image ("has no samples")
    for part in split_parts:
        args += ["--split-parts", part]
    output = io.StringIO()  # Energon's own CLI, in this process (a subprocess costs ~1.5 s)
    code: Any = 0
    with contextlib.redirect_stdout(output), contextlib.redirect_stderr(output):
        try:
            energon_cli.main(args=args, standalone_mode=False)
        except SystemExit as e:
            code = e.code
        except ValueError as e:
            if not _failed_in_preview(output.getvalue()):
                code = describe(e)
        except Exception as e:  # click's usage errors, Energon's own
            code = describe(e)
    if code not in (0, None):
        raise RuntimeError(f"energon prepare {path} failed ({code}):\n{output.getvalue()}")
    found = sorted([*earlier, *scan.findings], key=lambda f: (f.shard, f.offset))
    losses = write_losses(path, found, shards=len(scan.shards))
    return [*write_yamls(path), losses]
