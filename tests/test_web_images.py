"""Images as the web makes them: sideways JPEGs, odd part names, any format under any name,
16-bit scans, text-line crops. Unit proofs against PIL and transformers, then one corpus through
the real loader (issue 17: items 1, 3, 5 and 7)."""

from __future__ import annotations

import io
import json
import math
import struct
import tracemalloc

import numpy as np
import pytest
from helpers import decode_image, loader_batches, make_dataset, raw_sample, stop_workers
from PIL import Image

from energon_packing.encoding.chat import Skip, check_loss_weight
from energon_packing.encoding.vision import VisionConfig, patchify
from energon_packing.loader.samples import is_conversation_part, load_conversation
from energon_packing.media.images import decode, may_be_image, probe

SMALL = VisionConfig(min_pixels=56 * 56, max_pixels=224 * 224)
Image.init()  # every plugin registered: Image.OPEN lists what this Pillow reads


def noise(width: int, height: int, seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 255, (height, width, 3), dtype=np.uint8))


def save(image: Image.Image, fmt: str, **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **options)
    return buffer.getvalue()


def oriented(fmt: str, orientation: int, size=(80, 16)) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    return save(noise(*size), fmt, exif=exif)


def png_exif_after_pixels(orientation: int) -> bytes:
    """A PNG whose eXIf chunk follows the IDAT (legal; PIL finds it only by decoding)."""
    data = oriented("PNG", orientation)
    chunks, offset = [], 8
    while offset < len(data):
        (length,) = struct.unpack(">I", data[offset : offset + 4])
        chunks.append(data[offset : offset + 12 + length])
        offset += 12 + length
    exif = [c for c in chunks if c[4:8] == b"eXIf"]
    rest = [c for c in chunks if c[4:8] != b"eXIf"]
    assert len(exif) == 1 and rest[-1][4:8] == b"IEND"
    return data[:8] + b"".join(rest[:-1] + exif + rest[-1:])


def reference(data: bytes):
    """What transformers gives: ``load_image`` (exif_transpose, RGB) + the Qwen2-VL processor."""
    pil = pytest.importorskip("transformers.models.qwen2_vl.image_processing_pil_qwen2_vl")
    from transformers.image_utils import load_image

    processor = pil.Qwen2VLImageProcessorPil(
        min_pixels=SMALL.min_pixels, max_pixels=SMALL.max_pixels
    )
    image = load_image(Image.open(io.BytesIO(data)))
    out = processor(images=[image], return_tensors="np")
    return image.size, out["pixel_values"], out["image_grid_thw"].tolist()


# ---- 17.3: EXIF orientation ----------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "PNG-after-IDAT", "WEBP", "TIFF", "AVIF"])
def test_exif_orientation_is_applied_as_load_image_does(fmt):
    """Orientations 1..8: header size, grid and pixels equal load_image + the processor's."""
    for orientation in range(1, 9):
        if fmt == "PNG-after-IDAT":
            data = png_exif_after_pixels(orientation)
        else:
            data = oriented(fmt, orientation)
        size, pixels, grids = reference(data)
        assert probe(data) == size == ((16, 80) if orientation >= 5 else (80, 16)), orientation
        ours, grid = patchify(data, SMALL)
        assert [list(grid)] == grids, (fmt, orientation)
        assert np.array_equal(ours, pixels), (fmt, orientation)
        assert decode_image(data).size == size


def test_orientation_6_gives_the_upright_grid():
    data = oriented("JPEG", 6)  # 80x16 stored, 16x80 seen
    assert patchify(data, SMALL)[1] == (1, 10, 2)
    assert reference(data)[2] == [[1, 10, 2]]


def test_orientation_is_read_from_the_header_alone():
    data = oriented("JPEG", 8, size=(320, 64))
    truncated = data[: len(data) // 2]  # EXIF and frame header intact, pixels cut
    assert probe(truncated) == (64, 320)
    with pytest.raises(Skip, match="does not decode"):
        decode_image(truncated)


def test_unreadable_exif_is_no_orientation():
    data = bytearray(oriented("JPEG", 6))
    at = data.index(b"Exif\x00\x00") + 6
    data[at : at + 4] = b"XXXX"  # not a TIFF header: PIL's getexif raises
    assert probe(bytes(data)) == (80, 16)
    assert decode_image(bytes(data)).size == (80, 16)


# ---- 17.4: formats by content, any part name -------------------------------------------------

#: extension -> (Pillow format, mode, save options): every format this Pillow can write
WRITABLE = {
    "avif": ("AVIF", "RGB", {}),
    "bmp": ("BMP", "RGB", {}),
    "dds": ("DDS", "RGB", {}),
    "dib": ("DIB", "RGB", {}),
    "gif": ("GIF", "RGB", {}),
    "icns": ("ICNS", "RGB", {}),
    "ico": ("ICO", "RGB", {}),
    "im": ("IM", "RGB", {}),
    "jpg": ("JPEG", "RGB", {}),
    "jp2": ("JPEG2000", "RGB", {}),
    "msp": ("MSP", "1", {}),
    "pcx": ("PCX", "RGB", {}),
    "png": ("PNG", "RGB", {}),
    "ppm": ("PPM", "RGB", {}),
    "qoi": ("QOI", "RGB", {}),
    "sgi": ("SGI", "RGB", {}),
    "spi": ("SPIDER", "F", {}),
    "tga": ("TGA", "RGB", {}),
    "tif": ("TIFF", "RGB", {}),
    "webp": ("WEBP", "RGB", {"lossless": True}),
    "xbm": ("XBM", "1", {}),
}


def apng() -> bytes:
    frames = [noise(40, 30, seed) for seed in range(2)]
    return save(frames[0], "PNG", save_all=True, append_images=frames[1:])


@pytest.mark.filterwarnings("ignore:IM image format is deprecated:DeprecationWarning")
@pytest.mark.parametrize(
    "ext",
    [*(pytest.param(e, marks=pytest.mark.slow) if e == "icns" else e for e in WRITABLE), "apng"],
)  # ICNS writes every icon size up to 1024 px: 2 s
def test_every_format_pillow_writes_decodes_whatever_its_name(ext):
    if ext == "apng":
        data = apng()
    else:
        fmt, mode, options = WRITABLE[ext]
        data = save(noise(40, 30).convert(mode), fmt, **options)
    expected = Image.open(io.BytesIO(data)).convert(
        "RGB"
    )  # PIL's own conversion: "clip" (SPIDER is float)
    for name in (f"a.{ext}", "photo (1).jpg", "图片.png", "img0", "scan.data"):
        assert is_conversation_part(name), name
        fields = load_conversation(
            raw_sample("k", {"messages": [], "images": [name]}, {name: data})
        )
        assert fields["images"] == {name: data}
    assert probe(data) == expected.size
    assert decode_image(data, high_bit_depth="clip").tobytes() == expected.tobytes()
    assert patchify(data, SMALL)[1][0] == 1


def test_formats_pillow_only_reads():
    written = {fmt for fmt, _, _ in WRITABLE.values()} | {"MPO", "EPS"}  # MPO: JPEG's writer
    unwritable = sorted(set(Image.OPEN) - written)
    assert "JPEG" not in unwritable
    pytest.skip(
        f"Pillow {Image.__version__} reads but cannot write {', '.join(unwritable)} (BUFR, "
        f"GRIB, HDF5 need a handler even to read): no sample file of these to test with"
    )


def test_the_alpha_rule_is_the_callers_and_the_encoding_side_passes_transformers():
    """The media room reads no transformers: ``decode`` composites alpha on white or drops it
    as told; the encoding side (``patchify``) passes the installed transformers' rule, so its
    pixels equal the real image processor's on a half-transparent PNG handed to it as opened
    (``load_image`` would drop the alpha first)."""
    from energon_packing.encoding.hf_compat import alpha_on_white

    pil = pytest.importorskip("transformers.models.qwen2_vl.image_processing_pil_qwen2_vl")

    rgba = noise(80, 16).convert("RGBA")
    rgba.putalpha(Image.fromarray(np.tile(np.arange(0, 240, 3, dtype=np.uint8), (16, 1))))
    data = save(rgba, "PNG")
    white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
    on_white = Image.alpha_composite(white, rgba).convert("RGB")
    assert decode(data, alpha_on_white=True).tobytes() == on_white.tobytes()
    assert decode(data, alpha_on_white=False).tobytes() == rgba.convert("RGB").tobytes()
    assert on_white.tobytes() != rgba.convert("RGB").tobytes()
    assert decode_image(data).tobytes() == decode(data, alpha_on_white=alpha_on_white()).tobytes()
    processor = pil.Qwen2VLImageProcessorPil(
        min_pixels=SMALL.min_pixels, max_pixels=SMALL.max_pixels
    )
    real = processor(images=[Image.open(io.BytesIO(data))], return_tensors="np")
    ours, grid = patchify(data, SMALL)
    assert [list(grid)] == real["image_grid_thw"].tolist()
    assert np.array_equal(ours, real["pixel_values"])


def test_eps_is_refused_it_would_run_ghostscript():
    data = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\nshowpage\n"
    with pytest.raises(Skip) as info:
        probe(data)
    assert info.value.reason == "corrupt_image"


def test_formats_are_tried_in_the_order_a_fresh_image_open_tries_them():
    """Pillow's plugins without an ``accept`` test (IM, IMT, ...) parse whatever they are
    offered: tried in registration order after ``Image.init()`` (alphabetical), every JPEG
    would first fail two parses. Ours is the order of a fresh process's ``Image.open``,
    whatever ran first in this one, and still every format but EPS."""
    import ast
    import subprocess
    import sys

    ours = subprocess.run(
        [
            sys.executable,
            "-c",
            "from PIL import Image; Image.init(); "
            "from energon_packing.media.images import _formats; print(_formats())",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    fresh = subprocess.run(
        [sys.executable, "-c", "from PIL import Image; Image.preinit(); print(tuple(Image.ID))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    ours, fresh = ast.literal_eval(ours), ast.literal_eval(fresh)
    assert ours[: len(fresh)] == fresh  # BMP, DIB, GIF, JPEG, PPM, PNG (or this Pillow's)
    assert "JPEG" in fresh and "PNG" in fresh
    assert sorted(ours) == sorted(set(Image.OPEN) - {"EPS"})


def test_part_names_are_any_name_but_text_and_media():
    for name in ("photo (1).jpg", "图片.png", "a+b@c~d.jpg", "x y.JPEG", "img0", "p.v2.png"):
        assert is_conversation_part(name) and may_be_image(name), name
    for name in ("txt", "meta.json", "caption.txt", "voice.aac", "cls", "emb.npy"):
        assert not is_conversation_part(name), name
    for name in ("song.mp3", "a.WAV", "x.v2.flac", "o.ogg", "p.opus", "q.m4a"):
        assert is_conversation_part(name) and not may_be_image(name), name  # read as audio
    for name in ("clip.mp4", "b.WEBM", "x.v2.mkv", "a.mov", "o.avi", "p.m4v"):
        assert is_conversation_part(name) and not may_be_image(name), name  # read as videos
    assert is_conversation_part("json")


def test_a_name_equal_up_to_unicode_normalization_is_the_same_part():
    data = save(noise(8, 8), "PNG")
    composed, decomposed = "caf\u00e9.png", "cafe\u0301.png"
    fields = load_conversation(
        raw_sample("k", {"messages": [], "images": [composed]}, {decomposed: data})
    )
    assert fields["images"][composed] == data


def test_missing_image_says_why():
    from energon_packing.encoding.chat import ImageRefs, image_sizes

    for name, why in (
        ("a/b.jpg", "cannot hold '/'"),
        ("clip.mp4", "never read as images"),
        ("c.jpg", "no such part .*'a.png'"),
    ):
        refs = ImageRefs([name])
        refs.take(name)
        with pytest.raises(Skip, match=why):
            image_sizes(refs, image_names=[name], images={"a.png": b"x"}, max_pixels=None)


# ---- 17.5: bounded decode memory, values unchanged -------------------------------------------


def old_scaled(image: Image.Image) -> np.ndarray:
    """The pre-issue-17 formula (whole image in float64): the values to keep."""
    values = np.asarray(image, dtype=np.float64)
    finite = values[np.isfinite(values)]
    if image.mode == "F":
        in_unit = finite.size == 0 or (finite.min() >= 0 and finite.max() <= 1)
        low, high = (0.0, 1.0) if in_unit else (float(finite.min()), float(finite.max()))
    else:
        big = finite.size and finite.max() > 65535
        low, high = 0.0, (float(finite.max()) if big else 65535.0)
    with np.errstate(over="ignore"):  # +-inf, as nan_to_num makes them, times the factor
        scaled = (np.nan_to_num(values, nan=low) - low) * (255.0 / max(high - low, 1e-12))
    return np.clip(np.rint(scaled), 0, 255).astype(np.uint8)


def high_bit_depth_images():
    rng = np.random.default_rng(3)
    ramp = rng.integers(0, 65536, (70, 90)).astype(np.uint16)
    floats = rng.normal(0.5, 2.0, (70, 90)).astype(np.float32)
    floats[3, 4], floats[5, 6], floats[7, 8] = np.nan, np.inf, -np.inf
    yield "I;16", save(Image.fromarray(ramp), "PNG")
    yield "I;16B", save(Image.fromarray(ramp.astype(">u2")), "TIFF")
    yield "I", save(Image.fromarray(ramp.astype(np.int32) * 3 - 5000), "TIFF")
    yield "F", save(Image.fromarray(floats), "TIFF")
    yield "F unit", save(Image.fromarray(np.clip(floats, 0, 1)), "TIFF")


@pytest.mark.parametrize("high_bit_depth", ["scale", "clip"])
def test_high_bit_depth_values_are_unchanged(high_bit_depth):
    for label, data in high_bit_depth_images():
        image = Image.open(io.BytesIO(data))
        image.load()
        if high_bit_depth == "scale":
            expected = Image.fromarray(old_scaled(image), mode="L").convert("RGB")
        else:
            expected = image.convert("RGB")
        got = decode_image(data, high_bit_depth=high_bit_depth)
        assert got.tobytes() == expected.tobytes(), label


def numpy_peak(data: bytes) -> int:
    tracemalloc.start()
    try:
        decode_image(data)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_16_bit_image_decodes_without_64_bit_copies():
    """numpy's allocations (tracemalloc sees them; PIL's own buffers it does not) stay near one
    byte a pixel plus bounded strips: the old formula held three float64 copies (>= 24 B/px)."""
    width, height = 1600, 1250  # 2 MP
    values = np.linspace(0, 65535, width * height).reshape(height, width).astype(np.uint16)
    data = save(Image.fromarray(values), "PNG")
    peak = numpy_peak(data)
    assert peak < 1.5 * width * height + 16 * 2**20, f"{peak / (width * height):.1f} B/px"


# ---- 17.7: loss weights bf16 cannot hold -----------------------------------------------------


def test_subnormal_loss_weights_are_skipped():
    for weight in (1e-45, 1e-39, 1e-320, math.nan, math.inf, -1.0):
        with pytest.raises(Skip) as info:
            check_loss_weight(weight)
        assert info.value.reason == "bad_loss_weight", weight
    assert check_loss_weight(1.2e-38) == 1.2e-38  # normal in float32


# ---- through the real loader ---------------------------------------------------------------


def grey_png(width: int, height: int) -> bytes:
    return save(Image.new("L", (width, height), 90), "PNG")


def png16() -> bytes:
    values = np.linspace(0, 20000, 64 * 48).reshape(48, 64).astype(np.uint16)
    return save(Image.fromarray(values), "PNG")


def ask(content: str) -> list[dict]:
    return [{"role": "user", "content": content}, {"role": "assistant", "content": "Blue."}]


def one_image(key: str, name: str, data: bytes, **document) -> dict:
    return raw_sample(
        key, {"messages": ask("<image>Colour?"), "images": [name], **document}, {name: data}
    )


#: key -> expected reason (None: packed)
WEB = {
    **{f"line{i:03d}": "image_aspect_ratio" for i in range(101)},  # 101 text lines in a row
    "tall_1x20000": "image_aspect_ratio",
    "wide_20000x1": "image_aspect_ratio",
    "exif6": None,
    "name_space": None,
    "name_cjk": None,
    "name_symbols": None,
    "name_none": None,
    "png_as_jpg": None,
    "avif": None,
    "apng": None,
    "jp2": None,
    "qoi": None,
    "png16": None,
    "weight_subnormal": "bad_loss_weight",
    **{f"text{i}": None for i in range(4)},
}


def web_samples() -> list[dict]:
    line = grey_png(1600, 7)
    samples = [one_image(f"line{i:03d}", "line.png", line) for i in range(101)]
    samples += [
        one_image("tall_1x20000", "t.png", grey_png(1, 20000)),
        one_image("wide_20000x1", "w.png", grey_png(20000, 1)),
        one_image("exif6", "photo.jpg", oriented("JPEG", 6)),
        one_image("name_space", "photo (1).jpg", save(noise(40, 30), "JPEG")),
        one_image("name_cjk", "图片.png", save(noise(40, 30), "PNG")),
        one_image("name_symbols", "a+b@c~d.jpg", save(noise(40, 30), "JPEG")),
        one_image("name_none", "img0", save(noise(40, 30), "WEBP")),
        one_image("png_as_jpg", "x.jpg", save(noise(40, 30), "PNG")),
        one_image("avif", "a.avif", save(noise(40, 30), "AVIF")),
        one_image("apng", "a.apng", apng()),
        one_image("jp2", "a.jp2", save(noise(40, 30), "JPEG2000")),
        one_image("qoi", "a.qoi", save(noise(40, 30), "QOI")),
        one_image("png16", "a.png", png16()),
        one_image("weight_subnormal", "a.png", grey_png(40, 30), loss_weight=1e-45),
        *(raw_sample(f"text{i}", {"messages": ask(f"Hello {i}?")}) for i in range(4)),
    ]
    return samples


@pytest.fixture(scope="module")
def web_dataset(tmp_path_factory):
    path = tmp_path_factory.mktemp("web")
    return make_dataset(path, [], raw=web_samples())  # one shard, read in order


def run_web(path, workers: int, carry: bool, processor=None):
    from energon_packing import MetricsAggregator, PackingTaskEncoder
    from energon_packing.schema import is_empty

    te = PackingTaskEncoder(
        tokenizer=None if processor else "bundled",
        processor=processor,
        max_input_seq_length=2048,
        carry=carry,
    )
    aggregate = MetricsAggregator()
    packed, grids = [], {}
    for batch in loader_batches(path, te, buffer=8, workers=workers):
        aggregate.update(batch)
        if is_empty(batch):
            continue
        for row, keys in enumerate(batch["source_ids"]):
            packed += keys
            owners = batch["image_source_index"][row].tolist()
            for owner, grid in zip(owners, batch["image_grid_thw"][row].tolist()):
                grids.setdefault(keys[owner], []).append(grid)
    stop_workers()
    return packed, aggregate.skipped, grids


#: the processor path's reason for a Qwen2-VL aspect ratio over 200: the same as the built-in's
PROCESSOR_ASPECT = {"image_aspect_ratio"}


def check_web(packed, skipped, grids, image_processor=None):
    assert sorted(packed + [k for k, _ in skipped]) == sorted(WEB), "once each"
    reasons = dict(skipped)
    if image_processor is not None:
        aspect = {reasons[k] for k, r in WEB.items() if r == "image_aspect_ratio"}
        assert len(aspect) == 1 and aspect <= PROCESSOR_ASPECT, aspect
        reasons.update({k: r for k, r in WEB.items() if r == "image_aspect_ratio"})
    assert reasons == {k: r for k, r in WEB.items() if r}
    assert {k for k, r in WEB.items() if r is None} <= set(packed)
    # the grid transformers gives: load_image (exif_transpose) + the image processor
    from transformers.image_utils import load_image
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    if image_processor is None:  # the built-in path: Qwen2-VL's defaults
        image_processor = Qwen2VLImageProcessorPil()
    upright = load_image(Image.open(io.BytesIO(oriented("JPEG", 6))))
    expected = image_processor(images=[upright], return_tensors="np")["image_grid_thw"]
    assert grids["exif6"] == expected.tolist()
    assert grids["exif6"][0][1] > grids["exif6"][0][2]  # taller than wide: upright


@pytest.mark.energon
def test_web_images_through_the_real_loader(web_dataset):
    """101 text-line crops in a row do not stop the run; sideways photos are upright; odd part
    names and formats named by content are packed; exactly once each."""
    check_web(*run_web(web_dataset, workers=0, carry=False))


@pytest.mark.energon
@pytest.mark.slow  # the default set has workers=2 over tests/hostile.py's web cases
@pytest.mark.parametrize("carry", [False, True])
def test_web_images_through_the_real_loader_with_workers(web_dataset, carry):
    check_web(*run_web(web_dataset, workers=2, carry=carry))


@pytest.mark.energon
@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])
@pytest.mark.processor_media
def test_web_images_on_the_processor_path(web_dataset, workers):
    """The same corpus through a Qwen2-VL processor: the same outcomes, the same upright grid."""
    from energon_packing.testing.families import build

    processor, _, _ = build("qwen2_vl", model=False)
    result = run_web(web_dataset, workers=workers, carry=True, processor=processor)
    check_web(*result, image_processor=processor.image_processor)


# ---- 17.2 (part): a field_map naming a part the samples lack ----------------------------------

FIELD_MAP_YAML = """sample_type:
  __module__: energon_packing.loader.samples
  __class__: ConversationSample
field_map:
  messages: conversation[messages]
  image_names: json[images]
  images: json
"""


def test_check_field_map_names_the_field_the_part_and_the_key():
    from megatron.energon.errors import FatalSampleError

    from energon_packing.loader.samples import FieldMapError, check_field_map

    sample = {"__key__": "s0", "json": b"{}"}
    for field_map in (
        {"messages": "conversation[messages]", "images": "json"},
        {"messages": [["conversation", "messages"]], "images": [["json"]]},  # Energon's parse
    ):
        with pytest.raises(FieldMapError, match="'s0'.*field 'messages' to part 'conversation'"):
            check_field_map(sample, field_map)
    assert issubclass(FieldMapError, FatalSampleError)
    check_field_map(sample, {"messages": "conversation,json[messages]"})  # an option is there


@pytest.mark.energon
def test_a_field_map_naming_an_absent_part_stops_the_loader_build(tmp_path):
    """The first sample of the first shard lacks the part: the build raises, naming the yaml."""
    from megatron.energon.errors import FatalSampleError

    from energon_packing import PackingTaskEncoder

    samples = [raw_sample(f"s{i}", {"messages": ask("Hi?")}) for i in range(3)]
    path = make_dataset(tmp_path, [], raw=samples)
    (path / ".nv-meta" / "field_map.yaml").write_text(FIELD_MAP_YAML)
    te = PackingTaskEncoder(tokenizer="bundled", max_input_seq_length=256)
    with pytest.raises(
        FatalSampleError,
        match=r"'s0': .*field_map\.yaml field_map maps field 'messages' to part 'conversation'",
    ):
        loader_batches(path, te, buffer=4, dataset_config="field_map.yaml")


@pytest.mark.energon
def test_a_field_map_part_a_later_sample_lacks_stops_at_that_sample(tmp_path):
    from megatron.energon.errors import FatalSampleError

    from energon_packing import PackingTaskEncoder

    good = raw_sample("s0", {"messages": ask("Hi?")})
    good["conversation"] = json.dumps({"messages": ask("Hi?")}).encode()
    path = make_dataset(tmp_path, [], raw=[good, raw_sample("s1", {"messages": ask("Hi?")})])
    (path / ".nv-meta" / "field_map.yaml").write_text(FIELD_MAP_YAML)
    te = PackingTaskEncoder(tokenizer="bundled", max_input_seq_length=256)
    loader = loader_batches(path, te, buffer=4, dataset_config="field_map.yaml")
    with pytest.raises(FatalSampleError, match="'s1'.*field 'messages' to part 'conversation'"):
        list(loader)


CAPTIONING_YAML = """sample_type:
  __module__: megatron.energon
  __class__: CaptioningSample
field_map:
  image: jpg
  caption: txt
"""


@pytest.mark.energon
def test_a_non_conversation_field_map_naming_an_absent_part_stops_the_loader_build(tmp_path):
    """Issue 31 item 6: Energon's CaptioningSample over shards with png parts: the build raises
    naming the part and the yaml (Energon alone skips every sample: 0 packs, 0 skips)."""
    from energon_packing import PackingTaskEncoder
    from energon_packing.loader.samples import FieldMapError

    samples = [{"__key__": f"s{i}", "png": b"x", "txt": b"a cat"} for i in range(3)]
    path = make_dataset(tmp_path, [], raw=samples)
    (path / ".nv-meta" / "captions.yaml").write_text(CAPTIONING_YAML)
    te = PackingTaskEncoder(tokenizer="bundled", max_input_seq_length=256)
    with pytest.raises(FieldMapError) as raised:
        loader_batches(path, te, buffer=4, dataset_config="captions.yaml")
    message = str(raised.value)
    assert str(path / ".nv-meta" / "captions.yaml") in message
    assert "field 'image' to part 'jpg'" in message and "['png', 'txt']" in message
    assert "\n" not in message and "conversation_loader" not in message
