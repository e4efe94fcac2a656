"""Record what the real Hugging Face Qwen video processors make of the clips of this folder.

``reference.json`` is the ground truth for a torch-only replica of these processors (the
project's venv has no torchvision, which the real video processor classes need). It was made
ONCE, outside the project venv, like this::

    python3.11 -m venv /work/refvenv
    /work/refvenv/bin/pip install torch==2.14.1 torchvision==0.29.1
    /work/refvenv/bin/pip install transformers==5.24.0 av pillow numpy
    .venv/bin/python tests/data/video/make_clips.py             # project venv: av 18.1.0
    /work/refvenv/bin/python tests/data/video/make_reference.py

with Python 3.11, torch 2.14.1 (run on CPU), torchvision 0.29.1, transformers 5.24.0,
PyAV 18.1.0 (FFmpeg 8.1.2), numpy 2.4.6; the exact versions are also written into
``reference.json`` ("environment"). Running it twice wrote identical files.

What is called, per clip and family (no hub download: each processor is built from its class
with its default arguments; see "families" in the JSON for the config values and call kwargs):

* ``qwen2_vl``: ``Qwen2VLVideoProcessor()``, the video processor that transformers maps
  both ``qwen2_vl`` and ``qwen2_5_vl`` to, called with ``fps=2.0``. Its defaults
  (``fps=None``, ``num_frames=None``) cannot sample: with ``do_sample_frames=True`` its
  ``sample_frames`` compares ``None > int`` (TypeError, recorded in "notes"); 2.0 is
  qwen-vl-utils' FPS, and the fps branch floors the count to a multiple of
  ``temporal_patch_size`` within [min_frames, max_frames].
* ``qwen2_5_vl``: the same, called through ``Qwen2_5_VLProcessor._process_videos`` (the code
  ``Qwen2_5_VLProcessor.__call__`` runs for videos), which adds ``second_per_grid_ts =
  temporal_patch_size / metadata.sampled_fps`` per video, where ``sampled_fps =
  len(frames_indices) / total_num_frames * fps`` (computed in that order, in float64).
* ``qwen2_5_vl_all_frames``: the class default ``do_sample_frames=False``: every frame
  (``load_video``'s ``default_sample_indices_fn`` with neither fps nor num_frames).
* ``qwen3_vl``: ``Qwen3VLVideoProcessor()`` (class defaults ``fps=2``, sampling on);
  ``Qwen3VLProcessor.replace_video_token`` (the prompt text with a ``<t seconds>`` stamp
  before each temporal patch) is recorded too: "patch_timestamps", "timestamp_strings".
* ``qwen3_vl_cap``: ``cap_pixels_per_frame=True`` (the qwen-vl-utils pixel cap; the
  default ``None`` means off, with a warning). On these small clips it changes nothing.

The call is ``video_processor(videos=[path], do_sample_frames=True, return_metadata=True,
return_tensors="pt", **variant_kwargs)``. In transformers 5.24 the video processor has no
argument that picks the decoder: ``BaseVideoProcessor.fetch_videos`` always asks for
torchcodec, else torchvision's ``read_video`` (removed in torchvision 0.26). With neither
(this venv) the stock call raises ImportError (recorded in "notes"), so ``fetch_videos`` is
replaced on the instance by the same call with ``backend="pyav"``: transformers' own
``load_video``/``read_video_pyav`` decodes, with the processor's ``sample_frames`` as the
``sample_indices_fn``, exactly as the stock path would with another backend.

``read_video_pyav`` takes the frame count from the container header
(``stream.frames``), which Matroska/WebM do not store (0): for those clips the file call fails
(recorded as "file_call": {"error": ...}), and "array_call" records the processor run on all
frames decoded by PyAV (``to_ndarray(format="rgb24")``, like ``read_video_pyav``) with
``video_metadata`` = {total_num_frames: decoded count, fps: stream.average_rate, width,
height, duration: count / fps}. For the other clips the same array call is made and checked
equal to the file call ("array_call_matches_file_call").

Hashes: ``sha256`` of the contiguous bytes of the tensor (C order); ``pixel_values_videos``
is float32. ``decoded_frames``: the uint8 RGB frames (T, H, W, 3) as the pyav loader
returned them, before any processing. ``resized_frames``: the output of the processor's
``resize`` (uint8, (1, T, 3, H', W'), torchvision ``resize`` BICUBIC with antialias on the
uint8 tensor), i.e. before rescale/normalize and patchify.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import platform
import sys
import warnings

import av
import numpy as np
import torch
import torchvision
import transformers
from transformers import Qwen2VLVideoProcessor, Qwen3VLVideoProcessor
from transformers.image_utils import SizeDict
from transformers.models.qwen2_5_vl.processing_qwen2_5_vl import Qwen2_5_VLProcessor
from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor
from transformers.video_utils import VideoMetadata, default_sample_indices_fn, load_video

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "reference.json")
CLIPS = (
    "h264_48x36_10fps_2s.mp4",
    "h264_160x120_24fps_3s.mp4",
    "h264_224x160_30fps_1.5s.mp4",
    "h264_100x60_25fps_23f.mp4",
    "h264_portrait_90x160_15fps_4s.mp4",
    "vp9_128x96_20fps_2.5s.webm",
    "h264_64x64_12fps_5s.mkv",
    "h264_120x80_30fps_1s.mov",
)
# family -> (video processor class, extra call kwargs, processor class whose video code runs)
# Qwen2VLVideoProcessor's defaults (fps=None, num_frames=None) cannot sample: with
# do_sample_frames=True its sample_frames compares None > int (TypeError, see "notes"); its
# class default is do_sample_frames=False, which decodes every frame. So the Qwen2 families
# sample at fps=2.0 (qwen-vl-utils' FPS), and "*_all_frames" records the class default.
FAMILIES = {
    "qwen2_vl": (Qwen2VLVideoProcessor, {"fps": 2.0}, None),
    "qwen2_5_vl": (Qwen2VLVideoProcessor, {"fps": 2.0}, Qwen2_5_VLProcessor),
    "qwen3_vl": (Qwen3VLVideoProcessor, {}, Qwen3VLProcessor),
    "qwen2_5_vl_all_frames": (
        Qwen2VLVideoProcessor,
        {"do_sample_frames": False},
        Qwen2_5_VLProcessor,
    ),
    "qwen3_vl_cap": (Qwen3VLVideoProcessor, {"cap_pixels_per_frame": True}, Qwen3VLProcessor),
}
CALL = {"do_sample_frames": True, "return_metadata": True, "return_tensors": "pt"}
CONFIG_KEYS = (
    "fps",
    "num_frames",
    "min_frames",
    "max_frames",
    "do_sample_frames",
    "size",
    "patch_size",
    "temporal_patch_size",
    "merge_size",
    "image_mean",
    "image_std",
    "resample",
    "rescale_factor",
    "do_resize",
    "do_rescale",
    "do_normalize",
    "do_convert_rgb",
    "cap_pixels_per_frame",
    "max_video_tokens",
)


def sha(a) -> str:
    if isinstance(a, torch.Tensor):
        a = a.detach().cpu().contiguous().numpy()
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def jsonable(v):
    if isinstance(v, torch.Tensor | np.ndarray):
        return jsonable(v.tolist())
    if isinstance(v, SizeDict):
        v = dict(iter(v))  # SizeDict iterates over its set (key, value) pairs
    if isinstance(v, dict):
        return {k: jsonable(x) for k, x in v.items() if x is not None}
    if isinstance(v, list | tuple):
        return [jsonable(x) for x in v]
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, np.floating):
        return float(v)
    if hasattr(v, "value") and hasattr(v, "name"):  # enums (PILImageResampling)
        return {"name": v.name, "value": int(v.value)}
    return v


def config_of(vp) -> dict:
    return {k: jsonable(getattr(vp, k, None)) for k in CONFIG_KEYS}


class Recorder:
    """Instance patches: decode through transformers' pyav loader; keep the decoded and the
    resized frames."""

    def __init__(self, vp):
        self.decoded = []
        self.resized = []
        stock_resize = vp.resize

        def fetch_videos(video_url_or_urls, sample_indices_fn=None):
            # BaseVideoProcessor.fetch_videos with backend="pyav" instead of torchcodec
            if isinstance(video_url_or_urls, list):
                return list(
                    zip(
                        *[
                            fetch_videos(x, sample_indices_fn=sample_indices_fn)
                            for x in video_url_or_urls
                        ]
                    )
                )
            video, metadata = load_video(
                video_url_or_urls, backend="pyav", sample_indices_fn=sample_indices_fn
            )
            self.decoded.append(video.copy())
            return video, metadata

        def resize(*args, **kwargs):
            out = stock_resize(*args, **kwargs)
            self.resized.append(out.clone())
            return out

        vp.fetch_videos = fetch_videos
        vp.resize = resize


def processor_for(proc_cls, vp):
    """The processor class's own video code (``_process_videos``, ``replace_video_token``) on
    ``vp``, without a tokenizer: only the attributes that code reads are set."""
    proc = proc_cls.__new__(proc_cls)
    proc.video_processor = vp
    proc.video_token = "<|video_pad|>"
    proc.vision_start_token = "<|vision_start|>"
    proc.vision_end_token = "<|vision_end|>"
    return proc


def decode_all(path: str):
    """All frames as ``read_video_pyav`` would return them, and metadata from a full decode."""
    with av.open(path) as container:
        stream = container.streams.video[0]
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
        fps = float(stream.average_rate)
        meta = {
            "total_num_frames": len(frames),
            "fps": fps,
            "width": stream.width,
            "height": stream.height,
            "duration": len(frames) / fps,
            "video_backend": "pyav",
        }
    return np.stack(frames), meta


def run(family: str, video, video_metadata=None) -> dict:
    vp_cls, extra, proc_cls = FAMILIES[family]
    vp = vp_cls()
    rec = Recorder(vp)
    kwargs = {**CALL, **extra}
    if video_metadata is not None:
        if not kwargs["do_sample_frames"]:
            # nothing samples, so nothing sets frames_indices: give them, as read_video_pyav
            # does for a file decoded whole
            video_metadata["frames_indices"] = list(range(video_metadata["total_num_frames"]))
        kwargs["video_metadata"] = [video_metadata]
    if proc_cls is None:
        out = vp(videos=[video], **kwargs)
    else:
        proc = processor_for(proc_cls, vp)
        out, replacements = proc._process_videos([video], **kwargs)
    meta = out["video_metadata"][0]
    indices = [int(i) for i in meta.frames_indices]
    pixels = out["pixel_values_videos"]
    grid = [int(x) for x in out["video_grid_thw"][0]]

    # the sampled indices, recomputed by the processor's own method from the metadata alone
    probe = VideoMetadata(
        **{k: meta[k] for k in ("total_num_frames", "fps", "width", "height", "duration")}
    )
    if kwargs["do_sample_frames"]:
        again = vp.sample_frames(metadata=probe, **extra)
    else:  # load_video's own default_sample_indices_fn with neither num_frames nor fps
        again = default_sample_indices_fn(probe)
    assert [int(i) for i in again] == indices, (family, again, indices)

    if isinstance(video, str):
        assert len(rec.decoded) == 1
        frames = rec.decoded[0]
    else:
        frames = video[indices]
    assert frames.dtype == np.uint8 and frames.shape[0] == len(indices), frames.shape
    (resized,) = rec.resized
    assert pixels.dtype == torch.float32
    flat = pixels.reshape(-1)
    rec_out = {
        "metadata": {
            "total_num_frames": int(meta.total_num_frames),
            "fps": float(meta.fps),
            "width": int(meta.width),
            "height": int(meta.height),
            "duration": float(meta.duration),
            "video_backend": meta.video_backend,
        },
        "frames_indices": indices,
        "n_frames_sampled": len(indices),
        "timestamps": [float(t) for t in meta.timestamps],
        "sampled_fps": float(meta.sampled_fps),
        "decoded_frames": {
            "dtype": str(frames.dtype),
            "shape": list(frames.shape),
            "sha256": sha(frames),
            "per_frame_sha256": [sha(f) for f in frames],
        },
        "resized_frames": {
            "dtype": str(resized.dtype).removeprefix("torch."),
            "shape": list(resized.shape),
            "sha256": sha(resized),
        },
        "video_grid_thw": grid,
        "pixel_values_videos": {
            "dtype": str(pixels.dtype).removeprefix("torch."),
            "shape": list(pixels.shape),
            "sha256": sha(pixels.to(torch.float32)),
            "first16": [float(x) for x in flat[:16]],
            "last16": [float(x) for x in flat[-16:]],
            "sum": float(pixels.double().sum()),
        },
    }
    if "second_per_grid_ts" in out:
        rec_out["second_per_grid_ts"] = [float(x) for x in out["second_per_grid_ts"]]
    if proc_cls is Qwen3VLProcessor:
        text = replacements[0]
        patch_ts = proc._calculate_timestamps(
            list(indices), float(meta.fps), vp.temporal_patch_size
        )
        stamps = [f"<{t:.1f} seconds>" for t in patch_ts[: grid[0]]]
        assert text.startswith(stamps[0]) and text.count(" seconds>") == grid[0]
        rec_out["patch_timestamps"] = [float(t) for t in patch_ts]
        rec_out["timestamp_strings"] = stamps
        rec_out["prompt_replacement"] = {
            "chars": len(text),
            "sha256": sha(np.frombuffer(text.encode(), np.uint8)),
        }
    return rec_out


def same_result(a: dict, b: dict) -> bool:
    skip = ("metadata",)  # the array call's metadata is given, not read from the header
    return {k: v for k, v in a.items() if k not in skip} == {
        k: v for k, v in b.items() if k not in skip
    }


def call_error(video, **kwargs) -> str:
    """The error of a stock ``Qwen2VLVideoProcessor`` call (no pyav patch)."""
    try:
        Qwen2VLVideoProcessor()(videos=[video], **CALL, **kwargs)
    except Exception as e:  # recorded, not handled
        return f"{type(e).__name__}: {str(e).splitlines()[0]}"
    return "no error"


def dumps(v, indent: int = 0) -> str:
    """JSON, one key per line, lists of numbers or strings on one line."""
    pad = " " * (indent + 1)
    if isinstance(v, dict) and v:
        items = [f"{pad}{json.dumps(k)}: {dumps(x, indent + 1)}" for k, x in v.items()]
        return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}"
    if isinstance(v, list) and any(isinstance(x, dict | list) for x in v):
        return "[\n" + ",\n".join(pad + dumps(x, indent + 1) for x in v) + "\n" + " " * indent + "]"
    return json.dumps(v)


def main() -> None:
    warnings.simplefilter("ignore")
    transformers.logging.set_verbosity_error()
    first = os.path.join(HERE, CLIPS[0])
    first_frames, first_meta = decode_all(first)
    ref = {
        "environment": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "torchvision": torchvision.__version__,
            "transformers": transformers.__version__,
            "av": av.__version__,
            "ffmpeg": str(av.ffmpeg_version_info),
            "numpy": np.__version__,
            "device": "cpu",
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "torch_threads": torch.get_num_threads(),
        },
        "call": "video_processor(videos=[path], do_sample_frames=True, return_metadata=True, "
        'return_tensors="pt", **variant_kwargs), with fetch_videos -> load_video(backend="pyav")',
        "notes": {
            # a path: the stock fetch_videos wants torchcodec, else torchvision's read_video
            "stock_fetch_videos": call_error(first, fps=2.0),
            # decoded frames + metadata, Qwen2VLVideoProcessor's default fps/num_frames (None)
            "qwen2_vl_default_sampling": call_error(first_frames, video_metadata=[first_meta]),
        },
        "families": {},
        "clips": {},
    }
    for family, (vp_cls, extra, proc_cls) in FAMILIES.items():
        ref["families"][family] = {
            "video_processor": vp_cls.__name__,
            "processor": proc_cls.__name__ if proc_cls else None,
            "call_kwargs": {**CALL, **extra},
            "config": config_of(vp_cls()),
        }
    for name in CLIPS:
        path = os.path.join(HERE, name)
        with open(path, "rb") as f:
            data = f.read()
        with av.open(path) as c:
            s = c.streams.video[0]
            header = {
                "codec": s.codec_context.name,
                "stream_frames": int(s.frames),
                "average_rate": str(s.average_rate),
                "width": s.width,
                "height": s.height,
                "pix_fmt": s.format.name,
            }
        all_frames, full_meta = decode_all(path)
        header["decoded_frames"] = int(all_frames.shape[0])
        clip = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(), "stream": header}
        for family in FAMILIES:
            entry = {}
            try:
                entry["file_call"] = run(family, path)
            except Exception as e:  # an expected failure is part of the reference
                entry["file_call"] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0]}"}
            array = run(family, all_frames, copy.deepcopy(full_meta))
            if "error" in entry["file_call"]:
                entry["array_call"] = array
            else:
                entry["array_call_matches_file_call"] = same_result(entry["file_call"], array)
                assert entry["array_call_matches_file_call"], (name, family)
            clip[family] = entry
        ref["clips"][name] = clip
        print(name, flush=True)
    with open(OUT, "w") as f:
        f.write(dumps(ref) + "\n")
    print(f"wrote {OUT}", file=sys.stderr)


if __name__ == "__main__":
    main()
