"""Everything that touches Megatron-Energon: the task encoder (thin hooks), the sample types and
their loader, the carry stage and corrupt-shard tolerance (the only Energon internals, in
:mod:`.energon`), and one finite loader pass. Data coming in (convert, the shard check,
``prepare``) is :mod:`energon_packing.incoming`."""

from energon_packing.loader.energon import EnergonCompatibilityError, check_energon
from energon_packing.loader.samples import ConversationSample, EncodedConversation, PackedSample
from energon_packing.loader.task_encoder import PackingError, PackingTaskEncoder

__all__ = [
    "ConversationSample",
    "EncodedConversation",
    "EnergonCompatibilityError",
    "PackedSample",
    "PackingError",
    "PackingTaskEncoder",
    "check_energon",
]
