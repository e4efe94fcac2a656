"""The Pixtral-processor families, built offline as :mod:`.families` builds the others: Mistral 3
(``Mistral3ForConditionalGeneration``: Mistral Small 3.x over a Mistral text model, Ministral 3
over a Ministral 3 one) and Pixtral (pixtral-12b: ``LlavaForConditionalGeneration`` over a
Pixtral vision tower), each through transformers' own ``PixtralProcessor`` and its
``PixtralImageProcessor``.

Both need torchvision: transformers 5.24's ``PixtralProcessor`` is declared
``@requires(backends=("torchvision", "torch"))`` and its module imports the torchvision image
processor, so nothing here builds without it (:func:`torchvision_missing` says why; the tests
marked ``torchvision`` skip with it, and run on the ``torchvision`` CI stack: .ci/stacks.txt).
Reached through :func:`energon_packing.testing.families.build`.
"""

from __future__ import annotations

from typing import Any

from energon_packing.testing.families import _built, _tiny_text, make_tokenizer

__all__ = ["MISTRAL3_TEMPLATE", "PIXTRAL_FAMILIES", "tiny_config", "torchvision_missing"]

#: What this module builds: Mistral 3 over a Mistral text model, over a Ministral 3 text model
#: (its attention temperature grows with the position), and Pixtral-12B (a LLaVA model).
PIXTRAL_FAMILIES = ("mistral3", "ministral3", "pixtral")

#: mistralai/Mistral-Small-3.1-24B-Instruct-2503's chat template: BOS, the system prompt in
#: ``[SYSTEM_PROMPT]`` (a default one where the first message is no system message), each user
#: turn in ``[INST]...[/INST]`` with each image as ``[IMG]``, each reply followed by EOS, no
#: generation prompt. Written here following that format: the default prompt is one fixed
#: sentence (the checkpoint's names today's date), and an assistant turn's parts are rendered
#: in order as a user turn's are (the checkpoint's renders only its first text part).
MISTRAL3_TEMPLATE = (
    "{{- bos_token }}"
    "{%- if messages[0]['role'] == 'system' %}"
    "{%- if messages[0]['content'] is string %}"
    "{%- set system_message = messages[0]['content'] %}"
    "{%- else %}{%- set system_message = messages[0]['content'][0]['text'] %}{%- endif %}"
    "{%- set loop_messages = messages[1:] %}"
    "{%- else %}"
    "{%- set system_message = 'You are Mistral Small 3, a Large Language Model.' %}"
    "{%- set loop_messages = messages %}"
    "{%- endif %}"
    "{{- '[SYSTEM_PROMPT]' + system_message + '[/SYSTEM_PROMPT]' }}"
    "{%- for message in loop_messages %}"
    "{%- if message['content'] is string %}{%- set blocks = [{'type': 'text', 'text': "
    "message['content']}] %}{%- else %}{%- set blocks = message['content'] %}{%- endif %}"
    "{%- if message['role'] == 'user' %}{{- '[INST]' }}"
    "{%- elif message['role'] == 'system' %}{{- '[SYSTEM_PROMPT]' }}"
    "{%- elif message['role'] != 'assistant' %}"
    "{{- raise_exception('Only user, system and assistant roles are supported!') }}"
    "{%- endif %}"
    "{%- for block in blocks %}"
    "{%- if block['type'] == 'text' %}{{- block['text'] }}"
    "{%- elif block['type'] in ['image', 'image_url'] %}{{- '[IMG]' }}"
    "{%- else %}"
    "{{- raise_exception('Only text and image blocks are supported in message content!') }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if message['role'] == 'user' %}{{- '[/INST]' }}"
    "{%- elif message['role'] == 'system' %}{{- '[/SYSTEM_PROMPT]' }}"
    "{%- else %}{{- eos_token }}{%- endif %}"
    "{%- endfor %}"
)

_SPECIALS = [
    "[INST]",
    "[/INST]",
    "[SYSTEM_PROMPT]",
    "[/SYSTEM_PROMPT]",
    "[IMG]",
    "[IMG_BREAK]",
    "[IMG_END]",
]


def torchvision_missing() -> str | None:
    """Why the processors of the families that need torchvision (the registry's ``needs``),
    and the real Qwen, InternVL and GLM video processors, cannot be built here (None: they can)."""
    try:
        import torchvision  # noqa: F401
    except ImportError as e:
        from energon_packing.encoding.families import FAMILIES

        named = ", ".join(f.name for f in FAMILIES if "torchvision" in f.needs)
        return (
            f"needs torchvision (the processors of {named}; the real Qwen, InternVL and GLM video processors), "
            f"which does not import here ({e}); the torchvision CI stack runs these "
            f"(.ci/stacks.txt)"
        )
    return None


def tiny_config(family: str, *, text: dict, image_token_id: int) -> Any:
    """The tiny model config of :func:`_pixtral_family` (no processor: it needs torchvision,
    the model does not): a Pixtral vision tower of 4 px patches (one layer, 32 wide) under
    ``text``; Pixtral-12B's a LLaVA model keeping each patch, Mistral 3's (and Ministral
    3's) merging 2x2 patches into one token."""
    import transformers

    vision = dict(
        model_type="pixtral",
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        image_size=64,
        patch_size=4,
    )
    if family == "pixtral":  # pixtral-12b: a LLaVA model over a Mistral text model
        return transformers.LlavaConfig(
            text_config=text,
            vision_config=vision,
            image_token_index=image_token_id,
            vision_feature_select_strategy="full",
            vision_feature_layer=-1,
            projector_hidden_act="gelu",
        )
    return transformers.Mistral3Config(
        text_config=text,
        vision_config=vision,
        image_token_index=image_token_id,
        spatial_merge_size=2,
        vision_feature_layer=-1,
    )


def _pixtral_family(family: str, model: bool) -> tuple[Any, Any, dict]:
    """A Pixtral vision tower of 4 px patches (one layer, 32 wide), images resized to at most
    64 px on their longest edge in steps of ``patch * spatial_merge_size`` px; Mistral 3 merges
    2x2 patches into one token (at most 8x8 tokens and 8 row breaks an image), Pixtral keeps
    each patch (at most 16x16 and 16)."""
    import transformers
    from transformers.models.pixtral.image_processing_pixtral import PixtralImageProcessor

    tokenizer = make_tokenizer(extra=_SPECIALS, bos="<s>", eos="</s>", pad="<pad>", add_bos=True)
    image_token_id = tokenizer.convert_tokens_to_ids("[IMG]")
    patch, merge = 4, 1 if family == "pixtral" else 2
    processor = transformers.PixtralProcessor(
        image_processor=PixtralImageProcessor(
            size={"longest_edge": 64}, patch_size={"height": patch, "width": patch}
        ),
        tokenizer=tokenizer,
        patch_size=patch,
        spatial_merge_size=merge,
        chat_template=MISTRAL3_TEMPLATE,
    )
    ids = dict(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    text = _tiny_text(tokenizer, model_type="mistral", head_dim=16, **ids)
    if family == "ministral3":  # Ministral 3: the query scaled by log(1 + pos // 16)
        text.update(
            model_type="ministral3",
            rope_parameters={
                "rope_type": "yarn",
                "rope_theta": 1000000.0,
                "factor": 16.0,
                "original_max_position_embeddings": 16,
                "max_position_embeddings": 256,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "mscale_all_dim": 1.0,
                "mscale": 1.0,
                "llama_4_scaling_beta": 0.1,
            },
            max_position_embeddings=256,
        )
    config = tiny_config(family, text=text, image_token_id=image_token_id)
    model_cls = (
        transformers.LlavaForConditionalGeneration
        if family == "pixtral"
        else transformers.Mistral3ForConditionalGeneration
    )
    info = {"family": "pixtral" if family == "pixtral" else "mistral3", "built": family}
    return _built(processor, config, model_cls, model, info)
