"""One finite, unshuffled pass of Energon's loader over a prepared dataset.

What the CLI, the reports, the bench, the benchmarks and the tests iterate: the train split in
read order, with the given packing buffer (``None``: no packing) and batch size (``None``:
encoded conversations one by one).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

__all__ = ["epoch", "restore_state_rank"]


def epoch(
    path: Path | str,
    task_encoder: Any,
    *,
    packing_buffer_size: int | None,
    batch_size: int | None = 1,
    num_workers: int = 0,
    rank: int = 0,
    world_size: int = 1,
    dataset_config: str = "dataset.yaml",
    savable: bool = False,
) -> Any:
    """An Energon loader over one epoch of ``path``'s train split (``get_savable_loader`` when
    ``savable``, for ``save_state_rank`` / ``restore_state_rank``); ``path`` is a prepared
    folder or a metadataset ``.yaml`` (blends must then be ``blend_epochized``)."""
    from megatron.energon import (
        WorkerConfig,
        get_loader,
        get_savable_loader,
        get_train_dataset,
    )

    dataset = get_train_dataset(
        path,
        worker_config=WorkerConfig(rank=rank, world_size=world_size, num_workers=num_workers),
        batch_size=batch_size,
        packing_buffer_size=packing_buffer_size,
        task_encoder=task_encoder,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        repeat=False,
        # a metadataset (.yaml) names its datasets' configs itself; Energon refuses this there
        **({"dataset_config": dataset_config} if Path(path).is_dir() else {}),
    )
    with warnings.catch_warnings():  # "pin_memory ... no accelerator is found" on CPU machines
        warnings.filterwarnings("ignore", message=".*pin_memory.*")
        return (get_savable_loader if savable else get_loader)(dataset)


def restore_state_rank(loader: Any, state: Any) -> None:
    """``loader.restore_state_rank(state)``, after checking that the checkpoint comes from a
    loader with the same ``num_workers`` (packing is per worker, so packs depend on it).

    Energon itself refuses a changed worker count with a bare ``AssertionError``; everything
    else that decides the packs (every knob :data:`~energon_packing.config.KNOBS` marks so, the
    chat layout's fingerprint, buffer size, world size) is checked by the loader's own restore,
    whichever way it is called, before any buffered sample is re-read.
    """
    from energon_packing.loader.energon import compare_settings, saved_num_workers

    if state is not None:
        compare_settings(
            {"num_workers": saved_num_workers(state)}, {"num_workers": loader.num_workers}
        )
    loader.restore_state_rank(state)
