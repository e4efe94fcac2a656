"""Prepare a WebDataset folder for Energon with our sample type: index + ``.nv-meta`` yamls.

The documented manual route is two steps::

    energon prepare PATH --non-interactive --skip-dataset-yaml \\
        --split-parts 'train:shards/.*' --split-parts 'val:shards/.*'
    cp configs/dataset.yaml PATH/.nv-meta/dataset.yaml          # and dataset_crude.yaml

:func:`prepare_dataset` (CLI: ``energon-packing prepare PATH``) does both.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["CRUDE_DATASET_YAML", "DATASET_YAML", "prepare_dataset", "write_yamls"]

#: ``.nv-meta/dataset.yaml``: our sample type and loader (``energon info/lint/preview`` work).
DATASET_YAML = """\
# energon_packing: one conversation per sample; images stay compressed bytes until packing.
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


def prepare_dataset(
    path: Path | str,
    *,
    split_parts: Sequence[str] = ("train:.*\\.tar$",),
    num_workers: int = 1,
) -> list[Path]:
    """Runs ``energon prepare`` (index, splits) and writes our dataset yamls.

    Args:
        path: Folder holding the ``.tar`` shards (any depth).
        split_parts: ``split:regex`` patterns over shard paths (relative to ``path``); patterns
            may overlap.
        num_workers: Indexing processes.
    """
    from megatron.energon.cli.main import main as energon_cli

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
        except Exception as e:  # click's usage errors, Energon's own
            code = f"{type(e).__name__}: {e}"
    if code not in (0, None):
        raise RuntimeError(f"energon prepare {path} failed ({code}):\n{output.getvalue()}")
    return write_yamls(path)
