"""Real images for the media tests, made with Pillow: JPEG, PNG and WebP of given sizes, EXIF orientations and
content (a seeded pattern, so that each image's bytes and pixels differ), and the malformed ones the build refuses."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
from PIL import Image

__all__ = ["bomb_png", "image_bytes", "random_sizes"]


def image_bytes(fmt: str, width: int, height: int, orientation: int | None = None, seed: int = 0) -> bytes:
    """An image stored as ``width`` x ``height`` pixels (before orientation) in ``fmt``, with the EXIF orientation
    tag ``orientation`` when given; its pixels a seeded gradient with noise."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 // max(width, 1), y * 255 // max(height, 1), (x + y) % 256], axis=-1)
    pixels = (base + rng.integers(0, 32, size=base.shape)).clip(0, 255).astype(np.uint8)
    buf = io.BytesIO()
    kwargs = {"quality": 90} if fmt in ("JPEG", "WEBP") else {}
    if orientation is not None:
        exif = Image.Exif()
        exif[0x0112] = orientation
        kwargs["exif"] = exif.tobytes()
    Image.fromarray(pixels, "RGB").save(buf, fmt, **kwargs)
    return buf.getvalue()


def bomb_png(width: int, height: int) -> bytes:
    """A small, valid PNG whose header claims ``width`` x ``height`` pixels (its IHDR rewritten, CRC fixed): what a
    decompression bomb looks like before any pixel is decoded."""
    data = bytearray(image_bytes("PNG", 8, 8))
    ihdr = bytearray(data[12:29])  # type + 13 bytes of IHDR data
    ihdr[4:12] = struct.pack(">II", width, height)
    data[12:29] = ihdr
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(ihdr)))
    return bytes(data)


def random_sizes(n: int, seed: int, largest: int = 4000, max_ratio: float = 200.0) -> tuple[np.ndarray, np.ndarray]:
    """``n`` (width, height) pairs, log-uniform in ``[1, largest]``, aspect ratios at most ``max_ratio``."""
    rng = np.random.default_rng(seed)
    w = np.exp(rng.uniform(0, np.log(largest), 4 * n)).astype(np.int64) + 1
    h = np.exp(rng.uniform(0, np.log(largest), 4 * n)).astype(np.int64) + 1
    keep = np.maximum(w, h) / np.minimum(w, h) <= max_ratio
    return w[keep][:n], h[keep][:n]
