"""Llama 4 built offline, as :mod:`.families` builds the others: transformers' own
``Llama4Processor`` (its ``Llama4ImageProcessor`` and the bundled BPE with Llama 4's image and
tile tokens) and a tiny random-init ``Llama4ForConditionalGeneration``.

Its image processor exists only as a torchvision backend (transformers 5.5-5.25), so the
processor does not build without torchvision; the tests marked ``torchvision`` run it on the
``torchvision`` CI stack (.ci/stacks.txt). The model builds anywhere (:func:`tiny_config`).
Reached through :func:`energon_packing.testing.families.build`.
"""

from __future__ import annotations

from typing import Any

from energon_packing.testing.families import _built, make_tokenizer

__all__ = ["LLAMA4_TEMPLATE", "llama4", "tiny_config"]

#: meta-llama/Llama-4-Scout-17B-16E-Instruct's chat format: ``<|begin_of_text|>``, then each
#: turn as ``<|header_start|>role<|header_end|>`` and a blank line, its parts in order (an
#: image as ``<|image|>``), ``<|eot|>``; the generation prompt opens an assistant header.
#: Written here following that format.
LLAMA4_TEMPLATE = (
    "{{- '<|begin_of_text|>' }}"
    "{%- for message in messages %}"
    "{{- '<|header_start|>' + message['role'] + '<|header_end|>\\n\\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] }}"
    "{%- else %}{%- for part in message['content'] %}"
    "{%- if part['type'] == 'text' %}{{- part['text'] }}"
    "{%- elif part['type'] == 'image' %}{{- '<|image|>' }}"
    "{%- endif %}{%- endfor %}{%- endif %}"
    "{{- '<|eot|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|header_start|>assistant<|header_end|>\\n\\n' }}"
    "{%- endif %}"
)

_SPECIALS = [
    "<|begin_of_text|>",
    "<|header_start|>",
    "<|header_end|>",
    "<|eot|>",
    "<|finetune_right_pad_id|>",
    "<|image_start|>",
    "<|image_end|>",
    "<|image|>",
    "<|patch|>",
    "<|tile_x_separator|>",
    "<|tile_y_separator|>",
]


def llama4(model: bool, *, max_patches: int = 4) -> tuple[Any, Any, dict]:
    """The processor (336 px tiles as published, at most ``max_patches`` of them, 14 px
    patches, pixel shuffle 0.5: 144 ``<|patch|>`` a tile), and a model of :func:`tiny_config`
    whose vision tower reads those tiles."""
    import transformers

    tokenizer = make_tokenizer(
        extra=_SPECIALS,
        named={"image_token": "<|image|>"},
        bos="<|begin_of_text|>",
        eos="<|eot|>",
        pad="<|finetune_right_pad_id|>",
    )
    processor = transformers.Llama4Processor(
        image_processor=transformers.Llama4ImageProcessor(max_patches=max_patches),
        tokenizer=tokenizer,
        patch_size=14,
        pixel_shuffle_ratio=0.5,
        chat_template=LLAMA4_TEMPLATE,
    )
    config = tiny_config(
        vocab_size=len(tokenizer),
        image_token_index=tokenizer.convert_tokens_to_ids("<|patch|>"),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    info = {"family": "llama4", "built": "llama4"}
    return _built(processor, config, transformers.Llama4ForConditionalGeneration, model, info)


def tiny_config(
    *, image_token_index: int, vocab_size: int, vision: dict | None = None, **text: Any
) -> Any:
    """A ``Llama4Config`` of four 32-wide text layers (two experts, one routed a token, as
    Scout's MoE; the fourth without rotary embeddings, with attention temperature tuning),
    chunks and ``floor_scale`` of 8,192 as published (``text`` overrides them), and a one-layer
    32-wide vision tower of 336 px tiles and 14 px patches (``vision`` overrides it); eager
    attention. Needs no torchvision."""
    import transformers

    config = transformers.Llama4Config(
        text_config={
            "vocab_size": vocab_size,
            "hidden_size": 32,
            "intermediate_size": 64,
            "intermediate_size_mlp": 64,
            "num_hidden_layers": 4,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 8,
            "num_local_experts": 2,
            "num_experts_per_tok": 1,
            "interleave_moe_layer_step": 1,
            "attention_chunk_size": 8192,
            "floor_scale": 8192,
            "attn_temperature_tuning": True,
            "max_position_embeddings": 16384,
            **text,
        },
        vision_config={
            "hidden_size": 32,
            "num_hidden_layers": 1,
            "num_attention_heads": 4,
            "intermediate_size": 128,  # the pixel-shuffled width: 32 / 0.5**2
            "image_size": 336,
            "patch_size": 14,
            "vision_output_dim": 32,
            "projector_input_dim": 32,
            "projector_output_dim": 32,
            "pixel_shuffle_ratio": 0.5,
            **(vision or {}),
        },
        image_token_index=image_token_index,
    )
    config._attn_implementation = "eager"
    return config
