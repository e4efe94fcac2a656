"""Phi-4-multimodal built offline, as :mod:`.families` builds the others: transformers' own
``Phi4MultimodalProcessor`` (its ``Phi4MultimodalImageProcessor``, ``Phi4MultimodalFeatureExtractor``
and the bundled BPE with its image and audio tokens) and a tiny random-init
``Phi4MultimodalForCausalLM``.

Its image processor exists only as a torchvision backend (transformers 5.5-5.25), so nothing
here builds without torchvision; the tests marked ``torchvision`` run it on the ``torchvision``
CI stack (.ci/stacks.txt). Reached through :func:`energon_packing.testing.families.build`.
"""

from __future__ import annotations

from typing import Any

from energon_packing.testing.families import _built, make_tokenizer

__all__ = ["PHI4_TEMPLATE", "phi4_multimodal", "tiny_config"]

#: microsoft/Phi-4-multimodal-instruct's chat format: ``<|role|>`` before each turn, ``<|end|>``
#: after it, an image part as ``<|image|>`` and an audio part as ``<|audio|>`` where it stands,
#: ``<|assistant|>`` as the generation prompt. Written here following that format (parts in
#: order, a string content as its text).
PHI4_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|' + message['role'] + '|>' }}"
    "{%- if message['content'] is string %}{{- message['content'] }}"
    "{%- else %}{%- for part in message['content'] %}"
    "{%- if part['type'] == 'text' %}{{- part['text'] }}"
    "{%- elif part['type'] == 'image' %}{{- '<|image|>' }}"
    "{%- elif part['type'] == 'audio' %}{{- '<|audio|>' }}"
    "{%- endif %}{%- endfor %}{%- endif %}"
    "{{- '<|end|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|assistant|>' }}{%- endif %}"
)

_SPECIALS = ["<|system|>", "<|user|>", "<|assistant|>", "<|end|>", "<|image|>", "<|audio|>"]


def phi4_multimodal(model: bool, *, dynamic_hd: int = 4) -> tuple[Any, Any, dict]:
    """The processor (images in 448 px crops, at most ``dynamic_hd`` of them, as published but
    for the crop cap), and a model of two 16-wide text layers, a two-layer 16-wide vision tower
    of the published 448 px crops and 14 px patches (the processor's token count assumes them),
    one conformer block."""
    import transformers

    tokenizer = make_tokenizer(
        extra=_SPECIALS,
        named={"image_token": "<|image|>", "audio_token": "<|audio|>"},
        eos="<|end|>",
        pad="<|end|>",
    )
    image_id = tokenizer.convert_tokens_to_ids("<|image|>")
    audio_id = tokenizer.convert_tokens_to_ids("<|audio|>")
    processor = transformers.Phi4MultimodalProcessor(
        image_processor=transformers.Phi4MultimodalImageProcessor(dynamic_hd=dynamic_hd),
        audio_processor=transformers.Phi4MultimodalFeatureExtractor(),
        tokenizer=tokenizer,
        chat_template=PHI4_TEMPLATE,
    )
    config = tiny_config(
        vocab_size=len(tokenizer),
        image_token_id=image_id,
        audio_token_id=audio_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        max_position_embeddings=8192,
    )
    info = {"family": "phi4_multimodal", "built": "phi4_multimodal"}
    return _built(processor, config, transformers.Phi4MultimodalForCausalLM, model, info)


def tiny_config(
    *, image_token_id: int, audio_token_id: int, vision: dict | None = None, **text: Any
) -> Any:
    """A ``Phi4MultimodalConfig`` of two 16-wide text layers (``text`` overrides them), a
    two-layer 16-wide vision tower of the published 448 px crops and 14 px patches (``vision``
    overrides it) and one 32-wide conformer block; eager attention. Needs no torchvision."""
    import transformers

    sizes = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2)
    config = transformers.Phi4MultimodalConfig(
        **{**sizes, "num_key_value_heads": 1, **text},
        vision_config={**sizes, "image_token_id": image_token_id, **(vision or {})},
        audio_config=dict(
            hidden_size=32,
            intermediate_size=64,
            num_blocks=1,
            num_attention_heads=2,
            ext_pw_out_channel=32,
            depthwise_separable_out_channel=32,
            nemo_conv_channels=32,
            audio_token_id=audio_token_id,
        ),
    )
    config._attn_implementation = "eager"
    return config
