"""Kimi-K2.5 built offline, as :mod:`.families` builds the others: transformers' own
``Kimi_K25Processor`` (its ``Kimi_K25ImageProcessor`` and the bundled BPE with Kimi's turn and
media tokens) and a tiny random-init ``Kimi_K25ForConditionalGeneration`` (a DeepSeek-V3 text
model: latent attention, routed experts).

The family exists since transformers 5.13 and its image processor only as a torchvision
backend, so the processor does not build without torchvision; the tests marked
``torchvision`` run it on the ``torchvision`` CI stack (.ci/stacks.txt). Reached through
:func:`energon_packing.testing.families.build`.
"""

from __future__ import annotations

from typing import Any

from energon_packing.testing.families import _built, make_tokenizer

__all__ = ["KIMI_K25_TEMPLATE", "kimi_k25", "tiny_config"]

#: moonshotai/Kimi-K2.5's chat format: each turn as ``<|im_user|>user<|im_middle|>`` (the
#: role's own token, the role, ``<|im_middle|>``), its parts in order (an image as
#: ``<|media_begin|>image<|media_content|><|media_pad|><|media_end|>``), ``<|im_end|>``; the
#: generation prompt opens an assistant turn. Written here following that format.
KIMI_K25_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message['role'] == 'user' %}{{- '<|im_user|>' }}"
    "{%- elif message['role'] == 'assistant' %}{{- '<|im_assistant|>' }}"
    "{%- else %}{{- '<|im_system|>' }}{%- endif %}"
    "{{- message['role'] + '<|im_middle|>' }}"
    "{%- if message['content'] is string %}{{- message['content'] }}"
    "{%- else %}{%- for part in message['content'] %}"
    "{%- if part['type'] == 'text' %}{{- part['text'] }}"
    "{%- elif part['type'] == 'image' %}"
    "{{- '<|media_begin|>image<|media_content|><|media_pad|><|media_end|>' }}"
    "{%- endif %}{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_assistant|>assistant<|im_middle|>' }}{%- endif %}"
)

_SPECIALS = [
    "<|im_user|>",
    "<|im_assistant|>",
    "<|im_system|>",
    "<|im_middle|>",
    "<|im_end|>",
    "<|media_begin|>",
    "<|media_content|>",
    "<|media_end|>",
    "<|media_pad|>",
    "<|kimi_k25_video_placeholder|>",
    "[EOS]",
]


def kimi_k25(model: bool, *, max_patches: int = 256, max_side: int = 24) -> tuple[Any, Any, dict]:
    """The processor (14 px patches merged 2 x 2 as published; at most ``max_patches``
    patches and ``max_side`` a side, small enough that both bounds scale test images), and a
    model of two 64-wide DeepSeek-V3 text layers (the second routes each token to two of
    four experts) under a one-layer 32-wide vision tower."""
    import transformers

    tokenizer = make_tokenizer(extra=_SPECIALS, eos="<|im_end|>", pad="[EOS]")
    processor = transformers.Kimi_K25Processor(
        image_processor=transformers.Kimi_K25ImageProcessor(
            max_patches=max_patches, size={"max_height": max_side, "max_width": max_side}
        ),
        tokenizer=tokenizer,
        video_processor=transformers.Kimi_K25VideoProcessor(),  # required; videos not laid out
        chat_template=KIMI_K25_TEMPLATE,
    )
    media = {t: tokenizer.convert_tokens_to_ids(t) for t in _SPECIALS}
    config = tiny_config(
        vocab_size=len(tokenizer),
        image_token_id=media["<|media_pad|>"],
        video_token_id=media["<|kimi_k25_video_placeholder|>"],
        vision_start_token_id=media["<|media_begin|>"],
        vision_end_token_id=media["<|media_end|>"],
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    info = {"family": "kimi_k25", "built": "kimi_k25"}
    return _built(processor, config, transformers.Kimi_K25ForConditionalGeneration, model, info)


def tiny_config(
    *, vocab_size: int, pad_token_id: int = 0, eos_token_id: int | None = None, **ids: int
) -> Any:
    """A ``Kimi_K25Config`` of two 64-wide DeepSeek-V3 text layers (the second routes each
    token to two of four experts, beside a shared one) under a one-layer 32-wide vision tower
    of 14 px patches merged 2 x 2; ``ids``: its image, video and vision start / end token ids.
    Eager attention. Needs no torchvision."""
    import transformers

    config = transformers.Kimi_K25Config(
        text_config={
            "model_type": "deepseek_v3",
            "vocab_size": vocab_size,
            "hidden_size": 64,
            "intermediate_size": 128,
            "moe_intermediate_size": 32,
            "num_hidden_layers": 2,
            "first_k_dense_replace": 1,
            "n_routed_experts": 4,
            "num_experts_per_tok": 2,
            "n_shared_experts": 1,
            "n_group": 1,
            "topk_group": 1,
            "num_attention_heads": 4,
            "num_key_value_heads": 4,
            "q_lora_rank": 32,
            "kv_lora_rank": 16,
            "qk_rope_head_dim": 8,
            "qk_nope_head_dim": 8,
            "v_head_dim": 16,
            "pad_token_id": pad_token_id,
            "eos_token_id": eos_token_id,
            "bos_token_id": None,
        },
        vision_config={
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "patch_size": 14,
            "pos_emb_height": 16,
            "pos_emb_width": 16,
        },
        projection_hidden_size=32,
        tie_word_embeddings=False,
        **ids,
    )
    config._attn_implementation = "eager"
    return config
