"""NeMo-RL drop-in: its consumer takes our packs as they come, its config switches them on.

* :func:`to_nemo_rl`: a loader batch as NeMo-RL's data path takes it, and the rest (extras);
* :class:`NemoRLTaskEncoder`: a task encoder NeMo-RL's Energon loader constructs as it
  constructs its own, with NeMo-RL's batches;
* :data:`PLUGIN_FILE`: the file for NeMo-RL's ``task_encoder.python_file`` plug-in
  (``object: EnergonPackingSFTTaskEncoder``), and :func:`register` for its registry.

Imports without NeMo-RL; uses NeMo-RL's own classes (``BatchedDataDict``, ``PackedTensor``)
when importable.
"""

from __future__ import annotations

from pathlib import Path

from energon_packing.nemo_rl.batch import (
    NEMO_RL_MICRO_BATCH_INDICES,
    NEMO_RL_MICRO_BATCH_LENGTHS,
    to_nemo_rl,
)
from energon_packing.nemo_rl.task_encoder import NemoRLTaskEncoder

__all__ = [
    "NEMO_RL_MICRO_BATCH_INDICES",
    "NEMO_RL_MICRO_BATCH_LENGTHS",
    "PLUGIN_FILE",
    "REGISTRY_KEY",
    "NemoRLTaskEncoder",
    "register",
    "to_nemo_rl",
]

#: ``data.energon.task_encoder.python_file`` for NeMo-RL (absolute, as its registry requires).
PLUGIN_FILE = str(Path(__file__).resolve().parent / "plugin.py")
#: The key :func:`register` adds to NeMo-RL's task-encoder registry.
REGISTRY_KEY = "energon_packing"


def register() -> None:
    """Adds ``task_encoder: {name: energon_packing}`` to NeMo-RL's task-encoder registry (for
    configs that select task encoders by registry key). Idempotent."""
    from nemo_rl.data.energon.multimodal.registry import TASK_ENCODER_REGISTRY

    from energon_packing import __version__

    try:
        TASK_ENCODER_REGISTRY.identity(REGISTRY_KEY)
    except ValueError:
        TASK_ENCODER_REGISTRY.register(
            REGISTRY_KEY,
            import_path="energon_packing.nemo_rl.plugin:EnergonPackingSFTTaskEncoder",
            version=__version__,
        )
