"""The file NeMo-RL's Energon loader loads as a task encoder (its ``python_file`` plug-in).

NeMo-RL's registry (#4108-era ``data.energon.task_encoder``) takes a task encoder from a Python
file: ``{python_file: <this file's absolute path>, object: EnergonPackingSFTTaskEncoder,
options: {...}}``; it must be a subclass of NeMo-RL's ``BaseSFTTaskEncoder`` that declares its
model families. This module builds that class, so it imports NeMo-RL: import
:class:`energon_packing.nemo_rl.NemoRLTaskEncoder` where NeMo-RL is not installed.

``python -c "import energon_packing.nemo_rl as n; print(n.PLUGIN_FILE)"`` prints the path.
"""

from __future__ import annotations

from nemo_rl.data.energon.multimodal.model_families import (
    ALL_MODEL_FAMILIES,
    supports_model_families,
)
from nemo_rl.data.energon.multimodal.task_encoders.base import BaseSFTTaskEncoder

from energon_packing.nemo_rl.task_encoder import NemoRLTaskEncoder

__all__ = ["EnergonPackingSFTTaskEncoder"]


@supports_model_families(ALL_MODEL_FAMILIES)
class EnergonPackingSFTTaskEncoder(NemoRLTaskEncoder, BaseSFTTaskEncoder):
    """:class:`~energon_packing.nemo_rl.NemoRLTaskEncoder` as NeMo-RL's registry wants it."""
