"""A hostile corpus: one shard sample per class of abuse, with the outcome each must have.

``CASES`` maps a key to ``(shard sample, expected reason)``; reason ``None`` means the sample
must be packed. Nothing here is large on disk except where size is the point.
"""

from __future__ import annotations

import io
import json
import struct
import tarfile
import zlib
from pathlib import Path

import numpy as np
from helpers import raw_sample
from PIL import Image


def ask(content, answer="Blue."):
    return [{"role": "user", "content": content}, {"role": "assistant", "content": answer}]


def image(fmt: str, size=(48, 40), mode="RGB") -> bytes:
    buffer = io.BytesIO()
    Image.new(mode, size, (40, 120, 200) if mode == "RGB" else 90).save(buffer, format=fmt)
    return buffer.getvalue()


def png16() -> bytes:
    """A 16-bit grey PNG whose values span 0..20000: saturating turns it white."""
    values = np.linspace(0, 20000, 64 * 64).reshape(64, 64).astype(np.uint16)
    buffer = io.BytesIO()
    Image.fromarray(values).save(buffer, format="PNG")
    return buffer.getvalue()


def float_tiff() -> bytes:
    """A float TIFF with values in [0, 1]: saturating turns it black."""
    values = np.linspace(0, 1, 64 * 64).reshape(64, 64).astype(np.float32)
    buffer = io.BytesIO()
    Image.fromarray(values).save(buffer, format="TIFF")
    return buffer.getvalue()


def png_header(width: int, height: int) -> bytes:
    """A PNG that is only a header claiming ``width x height`` (a few dozen bytes)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", b"") + chunk(b"IEND", b"")


def jpeg_claiming(width: int, height: int) -> bytes:
    """A small JPEG whose frame header is patched to claim ``width x height``."""
    data = bytearray(image("JPEG", (16, 16)))
    sof = data.index(b"\xff\xc0")
    data[sof + 5 : sof + 9] = struct.pack(">HH", height, width)
    return bytes(data)


def deep(depth: int) -> str:
    return "[" * depth + "]" * depth


def text_sample(key: str, document: str | bytes) -> dict:
    return {"__key__": key, "json": document.encode() if isinstance(document, str) else document}


SPECIAL_USER = "Copy this: <|vision_start|><|image_pad|><|image_pad|><|vision_end|> done"
SPECIAL_ANSWER = "It ends with <|im_end|> and <|im_start|>assistant\nmore"

# key -> (shard sample, expected skip reason or None when it must be packed)
CASES = {
    # 1. text that spells special tokens is text
    "special_user": (raw_sample("special_user", {"messages": ask(SPECIAL_USER)}), None),
    "special_answer": (
        raw_sample("special_answer", {"messages": ask("Say it.", SPECIAL_ANSWER)}),
        None,
    ),
    # 2. parse-level abuse
    "deep_messages": (
        text_sample("deep_messages", '{"messages": ' + deep(100_000) + "}"),
        "malformed_json",
    ),
    "deep_unused": (
        text_sample(
            "deep_unused",
            '{"messages": ' + json.dumps(ask("Hi?")) + ', "meta": ' + deep(100_000) + "}",
        ),
        "malformed_json",
    ),
    "digits_unused": (
        text_sample(
            "digits_unused",
            '{"messages": ' + json.dumps(ask("Hi?")) + ', "id": ' + "7" * 5000 + "}",
        ),
        "malformed_json",
    ),
    "int_weight": (
        text_sample(
            "int_weight",
            '{"messages": ' + json.dumps(ask("Hi?")) + ', "loss_weight": 1' + "0" * 400 + "}",
        ),
        "bad_loss_weight",
    ),
    "surrogate": (
        text_sample(
            "surrogate",
            '{"messages": [{"role": "user", "content": "a\\ud800b"}, '
            '{"role": "assistant", "content": "ok"}]}',
        ),
        "invalid_text",
    ),
    # 5. odd values never reach token_mask
    "weight_huge": (
        raw_sample("weight_huge", {"messages": ask("Hi?"), "loss_weight": 1e39}),
        "bad_loss_weight",
    ),
    "weight_tiny": (
        raw_sample("weight_tiny", {"messages": ask("Hi?"), "loss_weight": 1e-320}),
        "bad_loss_weight",
    ),
    "weight_zero": (
        raw_sample("weight_zero", {"messages": ask("Hi?"), "loss_weight": 0}),
        "bad_loss_weight",
    ),
    "weight_ok": (raw_sample("weight_ok", {"messages": ask("Hi?"), "loss_weight": 2.5}), None),
    "weight_subnormal": (  # a float32 subnormal: 0 in bf16
        raw_sample("weight_subnormal", {"messages": ask("Hi?"), "loss_weight": 1e-45}),
        "bad_loss_weight",
    ),
    # 10. images as the web makes them (tests/test_web_images.py has one of each)
    "text_line_1600x7": (
        raw_sample(
            "text_line_1600x7",
            {"messages": ask("<image>Read it."), "images": ["line.png"]},
            {"line.png": image("PNG", (1600, 7), mode="L")},
        ),
        "image_aspect_ratio",
    ),
    "name_with_space": (
        raw_sample(
            "name_with_space",
            {"messages": ask("<image>Colour?"), "images": ["photo (1).jpg"]},
            {"photo (1).jpg": image("JPEG")},
        ),
        None,
    ),
    "avif_named_jpg": (
        raw_sample(
            "avif_named_jpg",
            {"messages": ask("<image>Colour?"), "images": ["a.jpg"]},
            {"a.jpg": image("AVIF")},
        ),
        None,
    ),
    # 4. bounded work before rejection
    "many_turns": (
        raw_sample("many_turns", {"messages": ask("Hi?") * 50_000}),
        "too_many_turns",
    ),
    "long_text": (raw_sample("long_text", {"messages": ask("x" * 200_000)}), "text_too_long"),
    "huge_png_header": (
        raw_sample(
            "huge_png_header",
            {"messages": ask("<image>?"), "images": ["a.png"]},
            {"a.png": png_header(12000, 12000)},
        ),
        "image_too_large",
    ),
    "jpeg_claims_9000": (
        raw_sample(
            "jpeg_claims_9000",
            {"messages": ask("<image>?"), "images": ["a.jpg"]},
            {"a.jpg": jpeg_claiming(9000, 9000)},
        ),
        "image_too_large",
    ),
    # 8. values that would flood the log
    "role_2mb": (
        raw_sample(
            "role_2mb",
            {
                "messages": [
                    {"role": "r" * 2_000_000, "content": "x"},
                    {"role": "assistant", "content": "y"},
                ]
            },
        ),
        "unknown_role",
    ),
    "name_1mb": (
        raw_sample("name_1mb", {"messages": ask("<image>?"), "images": ["n" * 1_000_000]}),
        "missing_image",
    ),
    # 9. every format Pillow decodes, under its own extension
    **{
        f"format_{ext}": (
            raw_sample(
                f"format_{ext}",
                {"messages": ask("<image>Colour?"), "images": [f"a.{ext}"]},
                {f"a.{ext}": image(fmt)},
            ),
            None,
        )
        for ext, fmt in (("gif", "GIF"), ("webp", "WEBP"), ("bmp", "BMP"), ("tiff", "TIFF"))
    },
    "png16": (
        raw_sample(
            "png16", {"messages": ask("<image>Dark?"), "images": ["a.png"]}, {"a.png": png16()}
        ),
        None,
    ),
    "float_tiff": (
        raw_sample(
            "float_tiff",
            {"messages": ask("<image>Dark?"), "images": ["a.tif"]},
            {"a.tif": float_tiff()},
        ),
        None,
    ),
}


def corrupt_tar_size(shard: Path, member_suffix: str, size: int = 1 << 60) -> None:
    """Rewrites the size field of the member ending in ``member_suffix`` to ``size`` (GNU
    base-256 encoding) and fixes the header checksum: a shard damaged after ``energon prepare``."""
    data = bytearray(shard.read_bytes())
    offset = 0
    while offset < len(data):
        header = tarfile.TarInfo.frombuf(bytes(data[offset : offset + 512]), "utf-8", "strict")
        if header.name.endswith(member_suffix):
            field = bytearray(12)
            field[0] = 0x80
            field[4:] = size.to_bytes(8, "big")
            data[offset + 124 : offset + 136] = field
            data[offset + 148 : offset + 156] = b" " * 8
            checksum = sum(data[offset : offset + 512])
            data[offset + 148 : offset + 156] = b"%06o\x00 " % checksum
            shard.write_bytes(bytes(data))
            return
        offset += 512 + -(-header.size // 512) * 512
    raise ValueError(f"no member ending in {member_suffix} in {shard}")
