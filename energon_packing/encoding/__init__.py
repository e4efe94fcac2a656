"""Conversations -> token ids, loss masks, image costs and positions (no Energon, no torch).

``chat`` reads a conversation document into turns; two layouts turn them into tokens:
``builtin`` (ChatML with Qwen2-VL vision tokens over any tokenizer, no transformers needed) and
``processor`` (a model family's own Hugging Face processor: its chat template, image tokens and
pixels; ``families`` holds each family's size rule, ``processor_loading`` builds a processor
from a directory). ``tokenizer`` adapts whatever tokenizer the user has; ``images`` reads image headers
and decodes within a pixel budget; ``vision`` is Qwen2-VL's image pipeline; ``positions``
computes 1-D or mRoPE positions of one conversation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from energon_packing.config import PackingConfig
    from energon_packing.encoding.chat import ChatLayout, VideoCosting
    from energon_packing.media.video_styles import VideoStyle

__all__ = ["BUILTIN_VIDEO_SETTINGS", "make_chat"]

#: The built-in layout's video settings: Qwen2-VL's video processor, sampling at 2 fps (the
#: qwen-vl-utils value; Qwen2-VL's own defaults would keep every frame).
BUILTIN_VIDEO_SETTINGS = {"do_sample_frames": True, "fps": 2.0}


def make_chat(
    *,
    tokenizer: Any = None,
    processor: Any = None,
    config: PackingConfig,
) -> ChatLayout:
    """The layout a task encoder uses: :class:`.builtin.BuiltinChat` over ``tokenizer``, or
    :class:`.processor.ProcessorChat` over ``processor`` (an object, or a local directory:
    :func:`.processor_loading.load_processor`, which builds the family's processor or raises).

    On a processor path the family decides mRoPE: ``mrope=True`` for a family without it, or an
    explicit ``mrope=False`` for one with it (Qwen2-VL, Qwen2.5-VL, Qwen3-VL), raises.

    A family that takes videos gets its video side (:class:`~energon_packing.media.video_side.
    VideoSide`, whose torch is imported only when a pack's videos are processed): the built-in
    layout follows Qwen2-VL's rules (:data:`BUILTIN_VIDEO_SETTINGS`), a processor its own video
    processor's settings; both under ``video_config`` and the video limits.
    """
    if processor is not None and tokenizer is not None:
        raise ValueError(
            "pass tokenizer= (the built-in ChatML + Qwen2-VL layout) or processor= (the model "
            "family's own chat template and image processing), not both"
        )
    mrope = getattr(config, "mrope", None)
    if processor is not None and (isinstance(processor, str) or hasattr(processor, "__fspath__")):
        from energon_packing.encoding.processor_loading import load_processor

        processor = load_processor(processor)
    info = _model(processor if processor is not None else tokenizer, config)
    if processor is None:
        from energon_packing.encoding.builtin import BuiltinChat
        from energon_packing.encoding.tokenizer import ChatTokenizer

        if getattr(config, "chat_template_kwargs", None):
            raise ValueError("chat_template_kwargs applies to processor=, not to tokenizer=")
        chat = BuiltinChat(
            ChatTokenizer(tokenizer), mrope=bool(mrope), vision=getattr(config, "vision", None)
        )
        vision = config.vision
        settings = {
            **BUILTIN_VIDEO_SETTINGS,
            "patch_size": vision.patch_size,
            "merge_size": vision.merge_size,
            "temporal_patch_size": vision.temporal_patch_size,
        }
        chat.videos = _video_side(chat.video_style, settings, config)
        return chat
    from energon_packing.config import audio_in_video, knob
    from energon_packing.encoding.families import check_model
    from energon_packing.encoding.processor import ProcessorChat

    tokens_per_second = getattr(config, "tokens_per_second", knob("tokens_per_second").default)
    chat = ProcessorChat(
        processor,
        chat_template_kwargs=config.chat_template_kwargs,
        tokens_per_second=tokens_per_second,
    )
    if chat.family is not None:
        check_model(chat.family, chat.name, info)
    if tokens_per_second != knob("tokens_per_second").default and (
        chat.family_name != "qwen2_5_vl"
    ):
        raise ValueError(
            f"tokens_per_second={tokens_per_second} applies to Qwen2.5-VL only, not to "
            f"{chat.family_name} ({chat.name}), whose video positions have no time scale"
        )
    model = getattr(processor, "model_tokens_per_second", None)  # its directory's config.json
    if chat.family_name == "qwen2_5_vl" and model is not None and model != tokens_per_second:
        raise ValueError(
            f"tokens_per_second={tokens_per_second}, but the model directory's config.json has "
            f"vision_config.tokens_per_second={model}: video positions would differ from the "
            f"model's; set tokens_per_second={model}"
        )
    audio_config = getattr(config, "audio_config", None)
    if audio_config:
        if chat.audio is None:
            from energon_packing.encoding.families import audio_families

            raise ValueError(
                f"audio_config applies to families whose processors take audio "
                f"({', '.join(audio_families())}), not to {chat.family_name} ({chat.name})"
            )
        chat.audio.configure(audio_config)
        if audio_in_video(config):
            if chat.audio.rule.interleave is None:
                from energon_packing.encoding.families import FAMILIES

                takes = [f.name for f in FAMILIES if f.audio and f.audio.interleave]
                raise ValueError(
                    f"audio_config['load_audio_from_video']: {chat.family_name} ({chat.name}) "
                    f"does not interleave a video's own audio track; the families whose "
                    f"processors do: {', '.join(takes)}"
                )
            chat.interleave_tracks()
    if chat.video_style is not None:
        chat.videos = _video_side(
            chat.video_style,
            chat.video_settings,
            config,
            tile_tokens=getattr(processor, "image_seq_length", 0),
        )
        per_second = chat.mrope.position_id_per_seconds if chat.mrope is not None else None
        if per_second is not None:  # the Omni thinkers: their time positions must be whole
            chat.videos.check_time_aligned(per_second)
    if mrope and chat.mrope is None:
        raise ValueError(
            f"mrope=True, but {chat.family_name} ({chat.name}) does not use mRoPE positions; on "
            f"a processor path the family decides: leave mrope unset"
        )
    if mrope is False and chat.mrope is not None:  # None is auto: False was asked for
        raise ValueError(
            f"mrope=False, but {chat.family_name} ({chat.name}) is an mRoPE family: its model "
            f"reads 3-row (t, h, w) position ids, and 1-row ones would give it wrong positions; "
            f"on a processor path the family decides: leave mrope unset"
        )
    return chat


def _video_side(
    style: VideoStyle, settings: Any, config: PackingConfig, *, tile_tokens: int = 0
) -> VideoCosting:
    """The layout's video side: the rule of video ``style`` (the family's) over ``settings`` (a video processor,
    its settings as a dict), under ``video_config`` and the video limits (``tile_tokens``:
    InternVL's context tokens per frame, its processor's ``image_seq_length``)."""
    from energon_packing.config import knob
    from energon_packing.encoding import hf_compat
    from energon_packing.media.video_rules import VideoRule
    from energon_packing.media.video_side import VideoSide

    def value(name: str) -> Any:  # a partial config (tests) takes the knob's default
        return getattr(config, name, knob(name).default)

    return VideoSide(
        VideoRule.of(
            style,
            settings,
            overrides=value("video_config"),
            reads_call_cap=hf_compat.video_cap_from_call(),
            tile_tokens=tile_tokens,
            one_frame_at_least=(
                style.sampling != "per_second" or hf_compat.glm_samples_one_frame_at_least()
            ),
        ),
        max_frames=value("max_video_frames"),
        max_tokens=value("max_video_tokens"),
        max_pixels=value("max_image_pixels"),
    )


def _model(source: Any, config: PackingConfig) -> Any:
    """The model the packs are for (:class:`.models.ModelInfo`, or None where nothing names
    it), its layers checked: ``model_type=`` first, else what the processor or tokenizer was
    saved with. Raises for layers that would mix packed conversations."""
    from energon_packing.encoding.models import (
        check_layers,
        check_rope,
        info_of,
        model_info_for_type,
    )

    model_type = getattr(config, "model_type", None)
    info = model_info_for_type(model_type) if model_type else None
    found = None if source is None else info_of(source)
    if info is not None and found is not None and found.model_type != model_type:
        raise ValueError(
            f"model_type={model_type!r}, but {found.source} says model_type "
            f"{found.model_type!r}; leave model_type unset, or pass the processor of that model"
        )
    info = found or info
    if info is not None and not getattr(config, "unpacked", False):  # one per row: exact
        allow = bool(getattr(config, "allow_stateful_layers", False))
        check_layers(info, allow_stateful_layers=allow, where="PackingTaskEncoder")
        width = getattr(config, "max_input_seq_length", None)
        if width is not None:
            check_rope(info, width=width, where="PackingTaskEncoder")
    return info
