"""Prefix-LM families (PaliGemma): a conversation is one prefix its model reads both ways and
one suffix it reads causally, told apart by ``token_type_ids`` (0 prefix, 1 suffix). No torch.

PaliGemma's processor has no chat template: its ``__call__`` takes the prompt as ``text`` and
the answer as ``suffix`` and writes::

    <image> x image_seq_length per image | <bos> prompt \\n | answer <eos>
    '------------- token_type_ids 0 (the prefix) ---------'  '--- 1 ---'

tokenizing the prefix and the suffix apart (a ``text_pair``). :data:`PALIGEMMA_TEMPLATE`
renders a conversation (one user turn with its images, then its answer) to the same text,
so the chat path locates the assistant turn as it does for every family; the encoding then
tokenizes the two parts apart too and records where the suffix starts
(``prefix_length``), from which :func:`suffix_types` gives the token types at pack time.

In a pack, the padding behind a conversation carries token type 1
(:attr:`energon_packing.schema.Source.token_fill`): as 0 it would join that conversation's
prefix block (its prompt would attend to the pads).
"""

from __future__ import annotations

import numpy as np

__all__ = ["PALIGEMMA_TEMPLATE", "PREFIX_TYPES", "suffix_types"]

#: The token field that tells prefix from suffix.
PREFIX_TYPES = "token_type_ids"

_ONE_TURN = (
    "PaliGemma takes one user turn (its prompt and images: the prefix) and at most one "
    "assistant turn (the suffix), as its processor takes a text and a suffix"
)

#: PaliGemma's layout as a chat template (its processor ships none): the user turn's images
#: first (the processor puts ``<bos>`` after the last ``<image>``), its text parts joined, a
#: newline; the assistant turn's text and ``<eos>``. A conversation without an image fails
#: (the processor either refuses it or drops ``<bos>`` and the newline, by release), as does
#: any other turn structure.
PALIGEMMA_TEMPLATE = (
    "{%- if messages | length > 2 or messages[0]['role'] != 'user' or (messages | length == 2 "
    "and messages[1]['role'] != 'assistant') %}"
    "{{- raise_exception('" + _ONE_TURN + "') }}{%- endif %}"
    "{%- set prompt = messages[0]['content'] %}"
    "{%- if prompt is string or not (prompt | selectattr('type', 'equalto', 'image') | list) %}"
    "{{- raise_exception('PaliGemma needs an image in the user turn (its processor takes no "
    "text-only prompt alike across releases: some raise, later ones drop the bos token and "
    "the newline)') }}{%- endif %}"
    "{%- for part in prompt %}{%- if part['type'] == 'image' %}{{- '<image>' }}{%- endif %}"
    "{%- endfor %}"
    "{{- bos_token }}"
    "{%- for part in prompt %}{%- if part['type'] == 'text' %}{{- part['text'] }}{%- endif %}"
    "{%- endfor %}"
    "{{- '\\n' }}"
    "{%- if messages | length == 2 %}{%- set answer = messages[1]['content'] %}"
    "{%- if answer is string %}{{- answer }}{%- else %}{%- for part in answer %}"
    "{%- if part['type'] == 'text' %}{{- part['text'] }}{%- else %}"
    "{{- raise_exception('PaliGemma takes media in the user turn only') }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{{- eos_token }}{%- endif %}"
)


def suffix_types(length: int, *, prefix_length: int) -> np.ndarray:
    """``token_type_ids`` of a conversation of ``length`` tokens whose suffix starts at token
    ``prefix_length``: 0 before it, 1 from it on (its processor's ``text_pair`` types)."""
    return (np.arange(length) >= prefix_length).astype(np.int64)
