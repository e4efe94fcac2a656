"""Image bytes -> size (from the header alone) or RGB pixels (decoded), within a pixel budget.

Formats are recognised by content, never by the part's name: whatever the installed Pillow
decodes is accepted (JPEG, PNG, APNG and GIF: first frame, WebP, AVIF, JPEG 2000, QOI, BMP,
TIFF, ...) except EPS, which Pillow renders by running Ghostscript on the bytes. The EXIF
orientation is applied, as ``transformers.image_utils.load_image`` does
(``PIL.ImageOps.exif_transpose``): :func:`probe` reads the tag from the header and returns the
size of the upright image, :func:`decode` returns its pixels.

Colour conversion follows the installed transformers' PIL image processors, whose rule the
caller passes (``alpha_on_white``: the encoding side's
:func:`~energon_packing.encoding.hf_compat.alpha_on_white`, since this room reads no
transformers): alpha composited on white, then RGB (5.21+; before, PIL's ``convert("RGB")``
drops the alpha). High-bit-depth and float images are the exception (``high_bit_depth``): PIL's
``convert("RGB")`` saturates them (a 16-bit PNG turns white, a float TIFF in [0, 1] black);
``"scale"`` maps their range onto 0..255 first (in row strips: a few bytes per pixel, never a
64-bit copy of the image), ``"clip"`` keeps PIL's (and transformers') behaviour for bit-equality
with a processor.
"""

from __future__ import annotations

import contextlib
import functools
import io
import struct
import warnings

import numpy as np
from PIL import ExifTags, Image

from energon_packing.errors import Skip, describe

__all__ = [
    "NOT_IMAGE_SUFFIXES",
    "VIDEO_SUFFIXES",
    "decode",
    "may_be_image",
    "may_be_video",
    "probe",
    "verify",
]

#: Part-name suffixes read as videos (kept compressed until their pack is emitted).
VIDEO_SUFFIXES = frozenset(("mp4", "m4v", "mkv", "webm", "mov", "avi"))

#: Part-name suffixes that are never read as images (text, tensors, audio, video, archives):
#: every other part may be one, since formats are recognised by content.
NOT_IMAGE_SUFFIXES = frozenset(
    ("json", "jsonl", "txt", "text", "md", "csv", "tsv", "yaml", "yml", "xml", "html", "htm")
    + ("cls", "cls2", "id", "idx", "index", "npy", "npz", "pt", "pth", "pkl", "pickle")
    + ("safetensors", "parquet", "arrow", "gz", "bz2", "xz", "zst", "zip", "tar")
    + ("mp4", "m4v", "mkv", "webm", "avi", "mov", "mpg", "mpeg")
    + ("wav", "flac", "mp3", "ogg", "oga", "opus", "m4a", "aac")
)
#: Pillow formats never opened: EPS runs Ghostscript, an interpreter, on the bytes.
_REFUSED_FORMATS = frozenset({"EPS"})
#: EXIF orientation -> the transpose that makes the image upright (``exif_transpose``'s table).
_TRANSPOSE = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}
#: Pixels per strip when scaling high-bit-depth images (bounds the float64 temporaries).
_STRIP_PIXELS = 1 << 18


def may_be_image(part: str) -> bool:
    """Whether a shard part may hold an image: any part but ``json`` and the names in
    :data:`NOT_IMAGE_SUFFIXES` (whatever the extension, even none: content decides)."""
    suffix = part.rpartition(".")[2].lower()
    return part != "json" and suffix not in NOT_IMAGE_SUFFIXES


def may_be_video(part: str) -> bool:
    """Whether a shard part is read as a video: its name ends in one of
    :data:`VIDEO_SUFFIXES` (any case)."""
    return part.rpartition(".")[2].lower() in VIDEO_SUFFIXES


#: The plugins ``PIL.Image.preinit`` loads: a fresh process's ``Image.open`` tries their
#: formats first. Plugins without an ``accept`` test (IM, IMT, ...) parse every file they are
#: offered, so registration order alone (alphabetical once ``Image.init`` ran first) would
#: make each JPEG pay for two failed parses.
_FIRST_PLUGINS = ("Bmp", "Gif", "Jpeg", "Ppm", "Png")


def _formats() -> tuple[str, ...]:
    """Every format the installed Pillow opens but EPS, in the order a fresh process's
    ``Image.open`` tries them: the common plugins first, then the rest as registered (worked
    out again only when a plugin registers later, e.g. ``pillow-heif``)."""
    Image.preinit()
    Image.init()
    return _ordered(len(Image.ID))


@functools.lru_cache(maxsize=4)
def _ordered(registered: int) -> tuple[str, ...]:
    first = tuple(f"PIL.{name}ImagePlugin" for name in _FIRST_PLUGINS)
    names = [name for name in Image.ID if name in Image.OPEN and name not in _REFUSED_FORMATS]
    plugin = {name: getattr(Image.OPEN[name][0], "__module__", "") for name in names}
    common = sorted((n for n in names if plugin[n] in first), key=lambda n: first.index(plugin[n]))
    return tuple(common + [name for name in names if name not in common])


def _png_exif(data: bytes) -> bytes | None:
    """An ``eXIf`` chunk placed after the pixel data, found by walking chunk headers (PIL
    would decode every pixel to find it)."""
    offset = 8
    while offset + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[offset : offset + 8])
        if kind == b"eXIf":
            return b"Exif\x00\x00" + data[offset + 8 : offset + 8 + length]
        if kind == b"IEND":
            return None
        offset += 12 + length
    return None


@functools.cache
def _self_orienting() -> frozenset[str]:
    """Formats whose Pillow plugin applies the orientation itself (TIFF since Pillow 12: the
    size at open is already upright, and so are the loaded pixels), found by trying it."""
    buffer = io.BytesIO()
    exif = Image.Exif()
    exif[ExifTags.Base.Orientation] = 6
    try:
        Image.new("L", (2, 1)).save(buffer, format="TIFF", exif=exif)
        with Image.open(buffer) as image:
            return frozenset({"TIFF"} if image.size == (1, 2) else ())
    except Exception:  # no TIFF support in this Pillow: no TIFF image opens either
        return frozenset()


def _orientation(image: Image.Image, data: bytes) -> int:
    """The EXIF orientation (1..8) as ``exif_transpose`` reads it, from the header alone;
    1 when the tag is absent, out of range or its EXIF block unreadable (as viewers do)."""
    if image.format in _self_orienting():
        return 1
    try:
        if image.format == "PNG" and "exif" not in image.info:
            found = _png_exif(data)
            if found is not None:
                image.info["exif"] = found
            exif = Image.Image.getexif(image)  # PngImageFile.getexif would decode the pixels
        else:
            exif = image.getexif()
        value = exif.get(ExifTags.Base.Orientation, 1)
        return value if isinstance(value, int) and value in _TRANSPOSE else 1
    except Exception:  # a damaged EXIF block does not make the pixels unreadable
        return 1


def _header(data: bytes, image: Image.Image, max_pixels: int | None) -> tuple[int, int, int]:
    """``(width, height, orientation)`` of the upright image, checked against the budget."""
    width, height = image.size
    if width < 1 or height < 1:
        raise Skip("corrupt_image", f"image has zero size ({width}x{height} px)")
    if max_pixels is not None and width * height > max_pixels:
        raise Skip(
            "image_too_large",
            f"image header says {width}x{height} = {width * height:,} pixels, more than "
            f"max_image_pixels={max_pixels:,}; nothing was decoded",
        )
    orientation = _orientation(image, data)
    if orientation >= 5:  # a quarter turn or a transposition: the sides swap
        width, height = height, width
    return width, height, orientation


@contextlib.contextmanager
def _opened(data: bytes, max_pixels: int | None):
    """The lazily opened image; PIL's failures to read its header as :class:`Skip`."""
    if not data:
        raise Skip("corrupt_image", "image file is empty (0 bytes)")
    # Our budget (max_image_pixels) is checked from the header in _header(); PIL's own
    # DecompressionBombWarning would only repeat it, once per image, in every worker.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        try:
            image = Image.open(io.BytesIO(data), formats=_formats())
        except Image.DecompressionBombError as e:
            # PIL refuses outright above 2 * Image.MAX_IMAGE_PIXELS, whatever our knob says.
            raise Skip(
                "image_too_large",
                f"image refused by PIL before decoding ({e}); max_image_pixels={max_pixels} "
                f"cannot allow it unless PIL.Image.MAX_IMAGE_PIXELS is raised as well",
            ) from None
        except Exception as e:  # PIL raises several types for bad headers
            raise Skip("corrupt_image", f"image header unreadable ({describe(e)})") from None
        with image:
            yield image


def probe(data: bytes, *, max_pixels: int | None = None) -> tuple[int, int]:
    """``(width, height)`` of the upright image (EXIF orientation applied) from the header,
    without decoding pixels; an image over ``max_pixels`` pixels is :class:`Skip`
    ``image_too_large`` before any decode."""
    with _opened(data, max_pixels) as image:
        width, height, _ = _header(data, image, max_pixels)
    return width, height


def decode(
    data: bytes,
    *,
    max_pixels: int | None = None,
    high_bit_depth: str = "scale",
    alpha_on_white: bool,
) -> Image.Image:
    """The upright image as an RGB PIL image (first frame of animations), within
    ``max_pixels``: the pixels of ``transformers``' ``load_image``.

    Args:
        data: The image file's bytes.
        max_pixels: The pixel budget, checked from the header before any decode
            (:class:`Skip` ``image_too_large``); None: no budget.
        high_bit_depth: ``"scale"`` or ``"clip"`` (see the module's docstring).
        alpha_on_white: Whether alpha is composited on white before RGB (the installed
            transformers' rule, :func:`energon_packing.encoding.hf_compat.alpha_on_white`),
            else PIL's ``convert("RGB")`` drops it.
    """
    with _opened(data, max_pixels) as opened:
        _, _, orientation = _header(data, opened, max_pixels)
        try:
            opened.load()  # frame 0: a freshly opened image is there (SPIDER refuses seek(0))
            image = _to_rgb(opened, high_bit_depth, alpha_on_white)
        except Exception as e:
            raise Skip("corrupt_image", f"image does not decode ({describe(e)})") from None
    # after conversion: 3 bytes a pixel to move, and the result owns its pixels
    return image.transpose(_TRANSPOSE[orientation]) if orientation != 1 else image


def verify(data: bytes) -> tuple[int, int]:
    """Decodes ``data`` as :func:`decode` would, to find out whether it can, and returns the
    upright ``(width, height)``; raises :class:`Skip` (``corrupt_image``, ...) where
    :func:`decode` would. A JPEG is decoded at 1/8 scale (``draft``): every coefficient is
    still entropy-decoded, so a truncated or broken scan fails alike, at a fraction of the
    cost; no colour conversion, no pixel budget."""
    with _opened(data, None) as opened:
        width, height, _ = _header(data, opened, None)
        try:
            if opened.format == "JPEG":
                opened.draft(
                    opened.mode, (max(1, opened.size[0] // 8), max(1, opened.size[1] // 8))
                )
            opened.load()
        except Exception as e:
            raise Skip("corrupt_image", f"image does not decode ({describe(e)})") from None
    return width, height


def _to_rgb(image: Image.Image, high_bit_depth: str, alpha_on_white: bool) -> Image.Image:
    if high_bit_depth == "scale" and (image.mode.startswith("I") or image.mode == "F"):
        image = _scaled(image)
    alpha = "A" in image.getbands() or image.info.get("transparency") is not None
    if alpha and alpha_on_white:
        image = image.convert("RGBA")
        background = Image.new("RGBA", image.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, image).convert("RGB")
    return image.convert("RGB")


def _strips(image: Image.Image):
    """The image's values as numpy arrays of a few rows each (PIL's own dtype, no copy of
    the whole image)."""
    width, height = image.size
    rows = max(1, _STRIP_PIXELS // width)
    for top in range(0, height, rows):
        yield top, np.asarray(image.crop((0, top, width, min(height, top + rows))))


def _scaled(image: Image.Image) -> Image.Image:
    """A 16/32-bit integer or float grey image as 8-bit grey, its value range kept.

    Values as before (float64 arithmetic, exactly), computed one strip at a time: the image's
    own bytes, one byte a pixel out, and temporaries of :data:`_STRIP_PIXELS` at most.
    """
    low, high, seen = np.inf, -np.inf, False
    for _, strip in _strips(image):
        finite = strip if image.mode != "F" else strip[np.isfinite(strip)]
        if finite.size:
            seen = True
            low, high = min(low, float(finite.min())), max(high, float(finite.max()))
    if image.mode == "F":
        if not seen or (low >= 0 and high <= 1):
            low, high = 0.0, 1.0
    else:  # I;16*: 0..65535; I: 32-bit, 16-bit data in practice
        low, high = 0.0, (65535.0 if not seen or high <= 65535 else high)
    factor = 255.0 / max(high - low, 1e-12)
    out = np.empty((image.size[1], image.size[0]), dtype=np.uint8)
    for top, strip in _strips(image):
        values = strip.astype(np.float64)
        if image.mode == "F":
            np.nan_to_num(values, copy=False, nan=low)
        with np.errstate(over="ignore"):  # +-inf (float max after nan_to_num): clipped next
            values -= low
            values *= factor
        np.rint(values, out=values)
        np.clip(values, 0, 255, out=values)
        out[top : top + len(strip)] = values
    return Image.fromarray(out, mode="L")
