"""Record what the real Qwen2-VL / Qwen2.5-VL / Qwen3-VL *processors* make of conversations
with videos: chat template, video + image processing, placeholder expansion, tokenization,
and the model's own multimodal RoPE positions (``get_rope_index``).

``processor_reference.json`` is the token-for-token ground truth for a torch-only (no
torchvision) implementation of these processors. It was made ONCE, in the reference venv
that ``make_reference.py`` describes (not the project venv, which has no torchvision)::

    cd /work/main
    PYTHONPATH=/work/main /work/refvenv/bin/python tests/data/video/make_processor_reference.py

with Python 3.11.7, torch 2.14.1 (CPU), torchvision 0.29.1, transformers 5.24.0,
tokenizers 0.23.3, jinja2 3.1.6, PyAV 18.1.0 (FFmpeg 8.1.2), numpy 2.4.6, pillow 13.0.0
(all written into the JSON, "environment"). ``energon_packing`` is imported from the checkout
through ``PYTHONPATH`` (not installed into that venv). Running it twice wrote identical files.

The processors (no hub download): ``energon_packing.testing.families.build(family)`` gives
the project's offline processor (bundled byte-level BPE + Qwen special tokens, the family's
chat template from ``energon_packing.testing.templates``, ``Qwen2VLImageProcessorPil`` at
small image sizes) but built without a video processor (the project venv has no
torchvision). Here the family's real processor class is built again from the same
tokenizer, image processor and chat template, with the real video processor attached:

* ``qwen2_vl``: ``Qwen2VLProcessor`` + ``Qwen2VLVideoProcessor()``;
* ``qwen2_5_vl``: ``Qwen2_5_VLProcessor`` + ``Qwen2VLVideoProcessor()`` (transformers maps
  qwen2_5_vl's video processor to that class); it adds ``second_per_grid_ts``;
* ``qwen3_vl``: ``Qwen3VLProcessor`` + ``Qwen3VLVideoProcessor()`` (a ``<t seconds>`` stamp
  and a vision_start/vision_end pair per temporal patch).

The call, per family and conversation (see "conversations" in the JSON)::

    processor.apply_chat_template(messages, tokenize=True, return_dict=True,
                                  return_tensors="pt", processor_kwargs=KWARGS[family])

with ``KWARGS`` = ``{"do_sample_frames": True, "fps": 2.0}`` for qwen2_vl / qwen2_5_vl
(their class defaults fps=None, num_frames=None cannot sample: TypeError, see
reference.json "notes") and ``{"do_sample_frames": True}`` for qwen3_vl (class default
fps=2). Videos are given as local file paths (``{"type": "video", "video": path}``), the
image as a PIL image (``{"type": "image", "image": pil}``). The same result is checked to
come out of the other path: ``text = apply_chat_template(messages, tokenize=False)`` then
``processor(text=[text], images=[...], videos=[...], return_tensors="pt", **KWARGS)``
("paths_agree").

Video decoding: in transformers 5.24 ``BaseVideoProcessor.fetch_videos`` only tries
torchcodec, then torchvision's removed ``read_video`` (ImportError here), so it is replaced
on the video processor instance by ``make_reference.Recorder``: the same
``load_video(path, backend="pyav", sample_indices_fn=...)`` call with the processor's own
``sample_frames``. Only .mp4/.mov clips are used (the pyav loader fails on .mkv/.webm files,
see reference.json). Each video's slice of ``pixel_values_videos`` is checked equal (sha256)
to reference.json's ``file_call`` for that clip and family.

Recorded per family and conversation: the rendered template text (before expansion), the
expanded text decoded back from the ids (``tokenizer.decode(input_ids)``, all families),
``input_ids`` and ``mm_token_type_ids`` in full, ``video_grid_thw``, ``image_grid_thw``,
``second_per_grid_ts`` (2.5), sha256 + shape of ``pixel_values_videos`` and
``pixel_values`` (float32, C order; also per video), for Qwen3-VL the timestamp strings and
their token ids, and ``position_ids`` (3 x n) + ``rope_deltas`` from the family's model:
``build(family)``'s tiny ``*ForConditionalGeneration`` (its config: spatial_merge_size 2,
vision ``tokens_per_second`` left at the class default, 4 for Qwen2.5-VL), calling
``model.model.get_rope_index(input_ids, mm_token_type_ids, image_grid_thw, video_grid_thw,
[second_per_grid_ts,] attention_mask)``. The same positions are checked to come out of the
unbound method on a faked ``self`` (tests/test_video.py ``models_positions``). For
qwen2_5_vl, "position_ids_tokens_per_second_25" (fake self, tokens_per_second=25) is recorded
too: there the temporal ids of a video run past its spatial extent, and the text after it
still resumes at start + max(h, w) // merge (so positions overlap; asserted for every group).

Note (also in the JSON, "notes"): 5.24's ``Qwen3VLProcessor`` expands only ``<|video_pad|>``,
so the template's ``<|vision_start|>``/``<|vision_end|>`` around a video remain and wrap the
per-patch ``<T seconds><|vision_start|>...<|vision_end|>`` groups (older 4.x code replaced the
whole triple). This file records 5.24 as it is.

The image: a 40x30 RGB PNG made here, ``np.random.default_rng(0).integers(0, 256, (30, 40,
3), dtype=np.uint8)``, saved as PNG in memory with PIL and reopened ("image" in the JSON:
sha256 of the pixels and of the PNG bytes).
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import os
import platform
import re
import sys
import warnings
from types import SimpleNamespace

import av
import jinja2
import numpy as np
import PIL
import tokenizers
import torch
import torchvision
import transformers
from PIL import Image
from transformers import Qwen2VLVideoProcessor, Qwen3VLVideoProcessor
from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLModel
from transformers.models.qwen2_5_vl.processing_qwen2_5_vl import Qwen2_5_VLProcessor
from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLModel
from transformers.models.qwen2_vl.processing_qwen2_vl import Qwen2VLProcessor
from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLModel
from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from make_reference import Recorder, dumps, jsonable, sha  # noqa: E402  (same folder)

from energon_packing.encoding.tokenizer import BUNDLED_TOKENIZER  # noqa: E402
from energon_packing.testing.families import build  # noqa: E402

OUT = os.path.join(HERE, "processor_reference.json")
REFERENCE = os.path.join(HERE, "reference.json")

# family -> (processor class, video processor class, model class, processor kwargs)
FAMILIES = {
    "qwen2_vl": (
        Qwen2VLProcessor,
        Qwen2VLVideoProcessor,
        Qwen2VLModel,
        {"do_sample_frames": True, "fps": 2.0},
    ),
    "qwen2_5_vl": (
        Qwen2_5_VLProcessor,
        Qwen2VLVideoProcessor,
        Qwen2_5_VLModel,
        {"do_sample_frames": True, "fps": 2.0},
    ),
    "qwen3_vl": (Qwen3VLProcessor, Qwen3VLVideoProcessor, Qwen3VLModel, {"do_sample_frames": True}),
}
SPECIALS = ("<|vision_start|>", "<|vision_end|>", "<|video_pad|>", "<|image_pad|>")
IMAGE_SEED, IMAGE_SHAPE = 0, (30, 40, 3)

NOTES = {
    "qwen3_vl_video_expansion": "transformers 5.24's Qwen3VLProcessor.replace_video_token "
    "replaces only <|video_pad|> (ProcessorMixin.get_text_with_replacements) with "
    "'<T seconds><|vision_start|>' + pads + '<|vision_end|>' per temporal patch, so the "
    "template's own <|vision_start|> ... <|vision_end|> around the video stay: nested, 2 more "
    "text tokens per video. Older Qwen3VLProcessor code (transformers 4.x) replaced the whole "
    "'<|vision_start|><|video_pad|><|vision_end|>' when present.",
    "text_resumes_at": "after each image / video (Qwen3-VL: each temporal patch), get_rope_index "
    "continues text at the group's start + max(h, w) // spatial_merge_size, not at the largest "
    "position inside it + 1; see vision_groups (max_inside vs next_position), and "
    "qwen2_5_vl's *_tokens_per_second_25 where temporal ids pass the spatial extent.",
    "second_per_grid_ts": "a float32 tensor in the processor output (0.46 reads "
    "0.46000000834465027 here; reference.json keeps the float64 value)",
    "timestamp_tokens": "how many ids a '<T seconds>' string takes depends on the tokenizer "
    "(here the project's bundled BPE: timestamp_token_ids)",
}

VIDEO, IMAGE, TEXT = "video", "image", "text"
#: name -> list of (role, content); content: a string, or parts (kind, value); a video's value
#: is a clip of this folder, an image's value is ignored (the generated image)
CONVERSATIONS = {
    "video_then_text": [
        ("user", [(VIDEO, "h264_48x36_10fps_2s.mp4"), (TEXT, "What happens?")]),
        ("assistant", "A gradient moves."),
    ],
    "text_video_text": [
        (
            "user",
            [
                (TEXT, "Watch this clip: "),
                (VIDEO, "h264_portrait_90x160_15fps_4s.mp4"),
                (TEXT, " Which way does the bar move?"),
            ],
        ),
        ("assistant", "It moves down."),
    ],
    "two_videos_mp4_mov": [
        ("user", [(VIDEO, "h264_100x60_25fps_23f.mp4"), (TEXT, "Describe the first clip.")]),
        ("assistant", "A short colour ramp."),
        ("user", [(TEXT, "And this one?"), (VIDEO, "h264_120x80_30fps_1s.mov")]),
        ("assistant", "One second of a moving square."),
    ],
    "image_and_video": [
        (
            "user",
            [
                (IMAGE, None),
                (TEXT, "Here is a picture, then a clip."),
                (VIDEO, "h264_224x160_30fps_1.5s.mp4"),
                (TEXT, "Do they match?"),
            ],
        ),
        ("assistant", "No, they do not."),
    ],
}


def make_image() -> tuple[Image.Image, dict]:
    pixels = np.random.default_rng(IMAGE_SEED).integers(0, 256, IMAGE_SHAPE, dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(buffer, format="PNG")
    png = buffer.getvalue()
    image = Image.open(io.BytesIO(png))
    image.load()
    assert np.array_equal(np.asarray(image), pixels)
    info = {
        "recipe": f"np.random.default_rng({IMAGE_SEED}).integers(0, 256, {IMAGE_SHAPE}, "
        "dtype=np.uint8) -> PIL RGB -> PNG (in memory) -> Image.open",
        "size_wh": [image.width, image.height],
        "mode": image.mode,
        "pixels_sha256": sha(pixels),
        "png_sha256": hashlib.sha256(png).hexdigest(),
    }
    return image, info


def messages_of(spec, image) -> list[dict]:
    """A fresh transformers conversation (apply_chat_template rewrites its contents)."""
    messages = []
    for role, content in spec:
        if isinstance(content, str):
            messages.append({"role": role, "content": content})
            continue
        parts = []
        for kind, value in content:
            if kind == VIDEO:
                parts.append({"type": "video", "video": os.path.join(HERE, value)})
            elif kind == IMAGE:
                parts.append({"type": "image", "image": image})
            else:
                parts.append({"type": "text", "text": value})
        messages.append({"role": role, "content": parts})
    return messages


def spec_jsonable(spec) -> list:
    return [
        {
            "role": role,
            "content": content
            if isinstance(content, str)
            else [
                {"type": kind, kind: value if kind != IMAGE else "<generated image>"}
                for kind, value in content
            ],
        }
        for role, content in spec
    ]


def processor_of(family: str):
    proc_cls, vp_cls, _, _ = FAMILIES[family]
    base, model, _ = build(family)
    assert base.video_processor is None  # built image-only, for the project venv
    processor = proc_cls(
        image_processor=base.image_processor,
        tokenizer=base.tokenizer,
        video_processor=vp_cls(),
        chat_template=base.chat_template,
    )
    Recorder(processor.video_processor)  # fetch_videos -> load_video(backend="pyav")
    return processor, model


def tensor_info(t: torch.Tensor) -> dict:
    assert t.dtype == torch.float32, t.dtype
    return {"dtype": "float32", "shape": list(t.shape), "sha256": sha(t)}


def fake_positions(family: str, tokens_per_second: int, inputs: dict) -> torch.Tensor:
    """tests/test_video.py ``models_positions``: the unbound method on a faked ``self``."""
    cls = FAMILIES[family][2]
    vision = SimpleNamespace(spatial_merge_size=2, tokens_per_second=tokens_per_second)
    fake = SimpleNamespace(config=SimpleNamespace(vision_config=vision))
    fake.get_vision_position_ids = functools.partial(cls.get_vision_position_ids, fake)
    positions, _ = cls.get_rope_index(fake, **{k: clone(v) for k, v in inputs.items()})
    return positions


def clone(v):
    return v.clone() if isinstance(v, torch.Tensor) else v


def resumes(ids: list[int], types: list[int], positions: np.ndarray, grids: dict, merge: int):
    """Per vision group (a run of one non-text type): its first text-or-vision position, the
    largest position inside it, max(h, w) // merge of its grid, and the position of the next
    token. Qwen3-VL's per-video grids are split per temporal patch, as its get_rope_index
    does."""
    out = []
    iters = {k: iter(v) for k, v in grids.items()}
    i = 0
    while i < len(types):
        if types[i] == 0:
            i += 1
            continue
        j = i
        while j < len(types) and types[j] == types[i]:
            j += 1
        t, h, w = next(iters[types[i]])
        block = positions[:, i:j]
        out.append(
            {
                "type": "image" if types[i] == 1 else "video",
                "tokens": [i, j],
                "grid_thw": [t, h, w],
                "start": int(positions[:, i].min()),
                "max_inside": int(block.max()),
                "spatial_extent": max(h, w) // merge,
                "next_position": int(positions[0, j]) if j < len(types) else None,
            }
        )
        # the model resumes text at start + max(h, w) // merge, whatever the temporal ids reach
        assert j == len(types) or out[-1]["next_position"] == out[-1]["start"] + max(h, w) // merge
        i = j
    return out


def run(family: str, processor, model, name: str, image, reference: dict) -> dict:
    kwargs = FAMILIES[family][3]
    spec = CONVERSATIONS[name]
    tokenizer = processor.tokenizer
    out = processor.apply_chat_template(
        messages_of(spec, image),
        tokenize=True,
        return_dict=True,
        return_tensors="pt",
        processor_kwargs=dict(kwargs),
    )
    # the other path: render, then call the processor on text + media
    rendered = processor.apply_chat_template(messages_of(spec, image), tokenize=False)
    clips = [v for _, c in spec if not isinstance(c, str) for k, v in c if k == VIDEO]
    n_images = sum(1 for _, c in spec if not isinstance(c, str) for k, _ in c if k == IMAGE)
    again = processor(
        text=[rendered],
        images=[image] * n_images or None,
        videos=[os.path.join(HERE, c) for c in clips],
        return_tensors="pt",
        **kwargs,
    )
    assert sorted(out.keys()) == sorted(again.keys()), (out.keys(), again.keys())
    for key in out:
        assert torch.equal(out[key], again[key]), (family, name, key)

    ids = out["input_ids"][0].tolist()
    assert out["attention_mask"].bool().all()
    types = out["mm_token_type_ids"][0].tolist() if "mm_token_type_ids" in out else None
    video_grid = out["video_grid_thw"].tolist()
    image_grid = out["image_grid_thw"].tolist() if "image_grid_thw" in out else []
    special = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIALS}
    merge = processor.video_processor.merge_size
    n_video = ids.count(special["<|video_pad|>"])
    n_image = ids.count(special["<|image_pad|>"])
    assert n_video == sum(t * h * w for t, h, w in video_grid) // merge**2
    assert n_image == sum(t * h * w for t, h, w in image_grid) // merge**2

    # each video's rows of pixel_values_videos against reference.json (same clip, family)
    pixels = out["pixel_values_videos"]
    per_video, row = [], 0
    for clip, (t, h, w) in zip(clips, video_grid, strict=True):
        part = pixels[row : row + t * h * w]
        row += t * h * w
        expected = reference["clips"][clip][family]["file_call"]
        assert expected["video_grid_thw"] == [t, h, w], (clip, family)
        assert expected["pixel_values_videos"]["sha256"] == sha(part), (clip, family)
        per_video.append({"clip": clip, "grid_thw": [t, h, w], **tensor_info(part)})
    assert row == pixels.shape[0]

    expanded = tokenizer.decode(ids)
    record = {
        "rendered_text": rendered,
        "expanded_text": expanded,
        "n_ids": len(ids),
        "n_video_tokens": n_video,
        "n_image_tokens": n_image,
        "input_ids": ids,
        "mm_token_type_ids": types,
        "video_grid_thw": video_grid,
        "image_grid_thw": image_grid or None,
        "pixel_values_videos": tensor_info(pixels),
        "pixel_values_videos_per_video": per_video,
        "pixel_values": tensor_info(out["pixel_values"]) if "pixel_values" in out else None,
        "paths_agree": True,
        "output_keys": sorted(out.keys()),
    }
    if "second_per_grid_ts" in out:
        record["second_per_grid_ts"] = [float(x) for x in out["second_per_grid_ts"]]
    if family == "qwen3_vl":
        stamps = re.findall(r"<\d+\.\d seconds>", expanded)
        assert len(stamps) == sum(t for t, _, _ in video_grid)
        record["timestamp_strings"] = stamps
        record["timestamp_token_ids"] = [
            tokenizer(s, add_special_tokens=False)["input_ids"] for s in stamps
        ]

    # positions: the model's own get_rope_index
    inputs = {
        "input_ids": out["input_ids"],
        "mm_token_type_ids": out["mm_token_type_ids"],
        "image_grid_thw": out.get("image_grid_thw"),
        "video_grid_thw": out["video_grid_thw"],
    }
    if family == "qwen2_5_vl":
        inputs["second_per_grid_ts"] = out["second_per_grid_ts"]
    real, deltas = model.model.get_rope_index(
        **{k: clone(v) for k, v in inputs.items()}, attention_mask=out["attention_mask"]
    )
    tokens_per_second = getattr(model.config.vision_config, "tokens_per_second", None)
    assert torch.equal(fake_positions(family, tokens_per_second, inputs), real)
    positions = real[:, 0].numpy()
    record["position_ids"] = positions.tolist()
    record["rope_deltas"] = int(deltas[0, 0])
    grids = {1: image_grid, 2: video_grid}
    if family == "qwen3_vl":  # get_rope_index splits each video into per-patch grids
        grids[2] = [[1, h, w] for t, h, w in video_grid for _ in range(t)]
    record["vision_groups"] = resumes(ids, types, positions, grids, merge)
    if family == "qwen2_5_vl":
        fast = fake_positions(family, 25, inputs)[:, 0].numpy()
        record["position_ids_tokens_per_second_25"] = fast.tolist()
        record["vision_groups_tokens_per_second_25"] = resumes(ids, types, fast, grids, merge)
    return record


def family_info(family: str, processor, model) -> dict:
    proc_cls, vp_cls, model_cls, kwargs = FAMILIES[family]
    tokenizer = processor.tokenizer
    vision = model.config.vision_config
    return {
        "processor": proc_cls.__name__,
        "video_processor": vp_cls.__name__,
        "image_processor": type(processor.image_processor).__name__,
        "image_processor_config": jsonable(processor.image_processor.to_dict()),
        "model": model_cls.__name__,
        "processor_kwargs": kwargs,
        "special_token_ids": {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIALS},
        "eos": [tokenizer.eos_token, tokenizer.eos_token_id],
        "vocab_size": len(tokenizer),
        "chat_template_sha256": hashlib.sha256(processor.chat_template.encode()).hexdigest(),
        "model_config": {
            "spatial_merge_size": vision.spatial_merge_size,
            "tokens_per_second": getattr(vision, "tokens_per_second", None),
            "temporal_patch_size": vision.temporal_patch_size,
            "patch_size": vision.patch_size,
            "image_token_id": model.config.image_token_id,
            "video_token_id": model.config.video_token_id,
            "vision_start_token_id": model.config.vision_start_token_id,
        },
    }


def main() -> None:
    warnings.simplefilter("ignore")
    transformers.logging.set_verbosity_error()
    with open(REFERENCE) as f:
        reference = json.load(f)
    image, image_info = make_image()
    with open(BUNDLED_TOKENIZER, "rb") as f:
        tokenizer_sha = hashlib.sha256(f.read()).hexdigest()
    ref = {
        "environment": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "torchvision": torchvision.__version__,
            "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__,
            "jinja2": jinja2.__version__,
            "av": av.__version__,
            "ffmpeg": str(av.ffmpeg_version_info),
            "numpy": np.__version__,
            "pillow": PIL.__version__,
            "device": "cpu",
        },
        "call": "processor.apply_chat_template(messages, tokenize=True, return_dict=True, "
        'return_tensors="pt", processor_kwargs=families[f]["processor_kwargs"]), with '
        'video_processor.fetch_videos -> load_video(path, backend="pyav"); equal to '
        "processor(text=[apply_chat_template(messages, tokenize=False)], images=..., "
        "videos=[paths], **processor_kwargs)",
        "notes": NOTES,
        "bundled_tokenizer_sha256": tokenizer_sha,
        "image": image_info,
        "conversations": {n: spec_jsonable(s) for n, s in CONVERSATIONS.items()},
        "families": {},
        "results": {},
    }
    for family in FAMILIES:
        processor, model = processor_of(family)
        ref["families"][family] = family_info(family, processor, model)
        ref["results"][family] = {
            name: run(family, processor, model, name, image, reference) for name in CONVERSATIONS
        }
        print(family, flush=True)
    with open(OUT, "w") as f:
        f.write(dumps(ref) + "\n")
    print(f"wrote {OUT}", file=sys.stderr)


if __name__ == "__main__":
    main()
