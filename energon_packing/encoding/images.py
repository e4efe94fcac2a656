"""Image bytes -> size (from the header alone) or RGB pixels (decoded), within a pixel budget.

Whatever Pillow decodes is accepted (JPEG, PNG, GIF: first frame, WebP, BMP, TIFF, ...).
Colour conversion follows transformers' PIL image processors: alpha composited on white, then
RGB. High-bit-depth and float images are the exception (``high_bit_depth``): PIL's
``convert("RGB")`` saturates them (a 16-bit PNG turns white, a float TIFF in [0, 1] black);
``"scale"`` maps their range onto 0..255 first, ``"clip"`` keeps PIL's (and transformers')
behaviour for bit-equality with a processor.
"""

from __future__ import annotations

import contextlib
import io
import re
import warnings

import numpy as np
from PIL import Image

__all__ = ["IMAGE_PART", "ImageError", "decode", "probe"]

#: Shard part names read as images: every extension of a format Pillow decodes.
IMAGE_PART = re.compile(
    r"^[A-Za-z0-9_.-]+\.(jpg|jpeg|jpe|jfif|png|gif|webp|bmp|dib|tif|tiff|ppm|pgm|pbm|pnm|tga|ico)$",
    re.IGNORECASE,
)


class ImageError(ValueError):
    """An image that cannot be costed or decoded; ``reason`` is a skip-report key."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


@contextlib.contextmanager
def _open(data: bytes):
    # Our budget (max_image_pixels) is checked from the header in probe(); PIL's own
    # DecompressionBombWarning would only repeat it, once per image, in every worker.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        with Image.open(io.BytesIO(data)) as image:
            yield image


def probe(data: bytes, *, max_pixels: int | None = None) -> tuple[int, int]:
    """``(width, height)`` from the image header, without decoding pixels; an image over
    ``max_pixels`` pixels is :class:`ImageError` ``image_too_large`` before any decode."""
    if not data:
        raise ImageError("corrupt_image", "image file is empty (0 bytes)")
    try:
        with _open(data) as image:
            width, height = image.size
    except Image.DecompressionBombError as e:
        # PIL refuses outright above 2 * Image.MAX_IMAGE_PIXELS, whatever our knob says.
        raise ImageError(
            "image_too_large",
            f"image refused by PIL before decoding ({e}); max_image_pixels={max_pixels} "
            f"cannot allow it unless PIL.Image.MAX_IMAGE_PIXELS is raised as well",
        ) from None
    except Exception as e:  # PIL raises several types for bad headers
        raise ImageError(
            "corrupt_image", f"image header unreadable ({type(e).__name__}: {str(e)[:200]})"
        ) from None
    if width < 1 or height < 1:
        raise ImageError("corrupt_image", f"image has zero size ({width}x{height} px)")
    if max_pixels is not None and width * height > max_pixels:
        raise ImageError(
            "image_too_large",
            f"image header says {width}x{height} = {width * height:,} pixels, more than "
            f"max_image_pixels={max_pixels:,}; nothing was decoded",
        )
    return width, height


def decode(
    data: bytes, *, max_pixels: int | None = None, high_bit_depth: str = "scale"
) -> Image.Image:
    """The image as an RGB PIL image (first frame of animations), within ``max_pixels``."""
    probe(data, max_pixels=max_pixels)
    try:
        with _open(data) as opened:
            opened.seek(0)
            opened.load()
            return _to_rgb(opened, high_bit_depth)
    except ImageError:
        raise
    except Exception as e:
        raise ImageError(
            "corrupt_image", f"image does not decode ({type(e).__name__}: {str(e)[:200]})"
        ) from None


def _to_rgb(image: Image.Image, high_bit_depth: str) -> Image.Image:
    if high_bit_depth == "scale" and (image.mode.startswith("I") or image.mode == "F"):
        image = _scaled(image)
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        image = image.convert("RGBA")
        background = Image.new("RGBA", image.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, image).convert("RGB")
    return image.convert("RGB")


def _scaled(image: Image.Image) -> Image.Image:
    """A 16/32-bit integer or float grey image as 8-bit grey, its value range kept."""
    values = np.asarray(image, dtype=np.float64)
    finite = values[np.isfinite(values)]
    if image.mode == "F":
        low, high = (
            (0.0, 1.0)
            if finite.size == 0 or (finite.min() >= 0 and finite.max() <= 1)
            else (
                float(finite.min()),
                float(finite.max()),
            )
        )
    else:  # I;16*: 0..65535; I: 32-bit, 16-bit data in practice
        low, high = (
            0.0,
            65535.0 if finite.size == 0 or finite.max() <= 65535 else float(finite.max()),
        )
    scaled = (np.nan_to_num(values, nan=low) - low) * (255.0 / max(high - low, 1e-12))
    return Image.fromarray(np.clip(np.rint(scaled), 0, 255).astype(np.uint8), mode="L")
