"""The video families' processors with their real video processors (torchvision).

:func:`energon_packing.testing.families.build` builds the Qwen2-VL, Qwen2.5-VL, Qwen3-VL,
Qwen2.5-Omni, Qwen3-Omni, InternVL and GLM processors without a video processor (transformers'
video processor classes need torchvision). Where torchvision imports,
:func:`with_video_processor` builds the family's processor class as ``from_pretrained`` builds
it: the same image processor, feature extractor, tokenizer and chat template, and the video
processor class transformers' auto table gives the family (``Qwen2VLVideoProcessor``;
Qwen3-VL's ``Qwen3VLVideoProcessor``; ``InternVLVideoProcessor``; GLM's own) from a checkpoint's video
processor settings.

One accommodation: transformers 5.24's ``BaseVideoProcessor.fetch_videos`` decodes with
torchcodec, else torchvision's removed video API, and takes no backend. The video processor
built here decodes a path with transformers' own ``load_video(path, backend="pyav")`` and its
own ``sample_frames`` (the call ``fetch_videos`` makes, with the pyav backend), as the recorded
references of ``tests/data/video`` were made; for GLM (:data:`PER_INDEX`) a frame per sampled
index, as torchcodec returns them.
"""

from __future__ import annotations

from typing import Any

__all__ = ["PER_INDEX", "VIDEO_FAMILIES", "with_video_processor"]

#: family -> (processor class, video processor class), transformers' names
VIDEO_FAMILIES: dict[str, tuple[str, str]] = {
    "qwen2_vl": ("Qwen2VLProcessor", "Qwen2VLVideoProcessor"),
    "qwen2_5_vl": ("Qwen2_5_VLProcessor", "Qwen2VLVideoProcessor"),
    "qwen3_vl": ("Qwen3VLProcessor", "Qwen3VLVideoProcessor"),
    "qwen2_5_omni": ("Qwen2_5OmniProcessor", "Qwen2VLVideoProcessor"),
    "qwen3_omni": ("Qwen3OmniMoeProcessor", "Qwen2VLVideoProcessor"),
    "internvl": ("InternVLProcessor", "InternVLVideoProcessor"),
    "glm4v": ("Glm4vProcessor", "Glm4vVideoProcessor"),
    "glm46v": ("Glm46VProcessor", "Glm46VVideoProcessor"),
}


#: families whose sampling repeats a frame on purpose (GLM's: its last, to an even count) for
#: a decoder that returns a frame per sampled index, as torchcodec (transformers' default) does;
#: transformers' pyav loader returns each frame once
PER_INDEX = ("glm4v", "glm46v")


def _decoding_with_pyav(cls: type, *, per_index: bool = False) -> type:
    """``cls`` whose ``fetch_videos`` is transformers' own, decoding with PyAV (``per_index``:
    a frame per sampled index, repeats included, as torchcodec gives them)."""
    from transformers.video_utils import load_video

    def fetch_videos(self, video_url_or_urls, sample_indices_fn=None):
        if isinstance(video_url_or_urls, list):
            return list(
                zip(
                    *[
                        self.fetch_videos(x, sample_indices_fn=sample_indices_fn)
                        for x in video_url_or_urls
                    ]
                )
            )
        frames, metadata = load_video(
            video_url_or_urls, backend="pyav", sample_indices_fn=sample_indices_fn
        )
        if per_index and metadata.frames_indices is not None:
            indices = [int(i) for i in metadata.frames_indices]
            rank = {index: n for n, index in enumerate(sorted(set(indices)))}
            frames = frames[[rank[i] for i in indices]]
        return frames, metadata

    return type(cls.__name__, (cls,), {"fetch_videos": fetch_videos, "__module__": __name__})


def with_video_processor(family: str, processor: Any, settings: dict | None = None) -> Any:
    """``processor`` (built by :func:`~energon_packing.testing.families.build`) rebuilt with
    the family's real video processor, made from the processor's ``video_settings`` (Qwen3-Omni's
    published patch and normalisation) under ``settings`` (a checkpoint's
    ``video_preprocessor_config.json``), over the class defaults. Needs torchvision."""
    import transformers

    if family not in VIDEO_FAMILIES:
        raise KeyError(f"no video processor for {family!r}; families: {', '.join(VIDEO_FAMILIES)}")
    processor_name, video_name = VIDEO_FAMILIES[family]
    settings = {**(getattr(processor, "video_settings", None) or {}), **(settings or {})}
    video_processor = _decoding_with_pyav(
        getattr(transformers, video_name), per_index=family in PER_INDEX
    )(**settings)
    parts = dict(
        image_processor=processor.image_processor,
        video_processor=video_processor,
        tokenizer=processor.tokenizer,
        chat_template=processor.chat_template,
    )
    if getattr(processor, "feature_extractor", None) is not None:
        parts["feature_extractor"] = processor.feature_extractor
    if hasattr(processor, "image_seq_length"):  # InternVL's tokens per tile
        parts["image_seq_length"] = processor.image_seq_length
    built = getattr(transformers, processor_name)(**parts)
    built.model_info = getattr(processor, "model_info", None)
    return built
