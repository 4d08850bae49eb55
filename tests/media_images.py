"""Real images for the media tests, made with Pillow: JPEG, PNG and WebP of given sizes, EXIF orientations and
content (a seeded pattern, so that each image's bytes and pixels differ), and the malformed ones the build refuses."""

from __future__ import annotations

import struct
import zlib

import numpy as np

from train.vlm_corpus import image_bytes  # one maker of test images, shared with the demo's corpus

__all__ = ["bomb_png", "image_bytes", "random_sizes"]


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
