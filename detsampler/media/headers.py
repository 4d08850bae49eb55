"""Reading an image's header at build time: format, size after EXIF orientation, CRC-32 of its bytes; never a decode.

Pillow's ``Image.open`` is lazy: it parses the header (size, mode, format, the JPEG/WebP EXIF segment) and decodes no
pixel. The file's structure is walked without decompressing anything: a PNG's chunk table (its ``eXIf`` chunk wherever
it is, and ``IEND`` at the end), a JPEG's end-of-image marker, a WebP's RIFF length, so that a file cut short is refused
here and not in a DataLoader worker hours into a run.

Invariant: :func:`read_header` returns a header only for a non-empty, complete JPEG, PNG or WebP of one frame whose
pixels (``width * height``) are at most ``max_pixels``; anything else is a :class:`MediaError`, one line naming the
image (its source and item) and what was received. ``width`` and ``height`` are those after the EXIF orientation: what
the processor sees once the loader has applied the recorded orientation.
"""

from __future__ import annotations

import io
import struct
import warnings
import zlib
from dataclasses import dataclass

__all__ = ["IMAGE_FORMATS", "ImageHeader", "MediaError", "read_header"]

IMAGE_FORMATS = ("JPEG", "PNG", "WEBP")
DEFAULT_MAX_PIXELS = 89_478_485  # Pillow's Image.MAX_IMAGE_PIXELS: its decompression-bomb warning threshold
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_ORIENTATION_TAG = 0x0112


class MediaError(ValueError):
    """An image refused at build (or at read): the message names its source and item and what was received."""


@dataclass(frozen=True)
class ImageHeader:
    """``format`` (one of :data:`IMAGE_FORMATS`), ``width`` x ``height`` pixels after EXIF orientation,
    ``orientation`` (the EXIF value 1..8; 5 to 8 swap the stored width and height), ``crc32`` and ``size`` (bytes) of
    the file."""

    format: str
    width: int
    height: int
    orientation: int
    crc32: int
    size: int


def read_header(data: bytes, name: str, max_pixels: int = DEFAULT_MAX_PIXELS) -> ImageHeader:
    """The header of the image ``data`` (named ``name`` in errors: its source and item), read without decoding."""
    from PIL import Image, UnidentifiedImageError

    if not data:
        raise MediaError(f"{name}: the image is empty (0 bytes)")
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        _check_webp(data, name)  # before opening: Pillow's WebP decoder takes the whole file and fails unnamed
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # the limit is checked below, by value
            with Image.open(io.BytesIO(data)) as image:
                fmt, (width, height) = image.format, image.size
                frames = int(getattr(image, "n_frames", 1))
                exif = image.info.get("exif")
    except Image.DecompressionBombError as exc:
        raise MediaError(f"{name}: a decompression bomb ({exc}); at most {max_pixels} pixels allowed") from None
    except UnidentifiedImageError:
        raise MediaError(
            f"{name}: not an image in a format Pillow knows ({len(data)} bytes starting {data[:8]!r}); allowed formats"
            f" are {', '.join(IMAGE_FORMATS)}"
        ) from None
    except (OSError, SyntaxError, ValueError, struct.error, EOFError) as exc:
        raise MediaError(f"{name}: a corrupt image ({len(data)} bytes; Pillow: {exc})") from None
    if fmt not in IMAGE_FORMATS:
        raise MediaError(f"{name}: a {fmt} image; allowed formats are {', '.join(IMAGE_FORMATS)}")
    if width * height > max_pixels:
        raise MediaError(
            f"{name}: {width}x{height} = {width * height} pixels, a decompression bomb; at most {max_pixels} allowed"
        )
    if frames != 1:
        raise MediaError(f"{name}: an animated {fmt} of {frames} frames; an image has one frame")
    if fmt == "PNG":
        exif = _check_png(data, name) or exif
    elif fmt == "JPEG":
        _check_jpeg(data, name)
    orientation = _orientation(exif)
    if orientation >= 5:
        width, height = height, width
    return ImageHeader(fmt, width, height, orientation, zlib.crc32(data), len(data))


def _check_png(data: bytes, name: str) -> bytes | None:
    """Walk the chunk table (lengths and types only): complete up to ``IEND``; returns the ``eXIf`` chunk's data."""
    pos, exif = len(_PNG_SIGNATURE), None
    while pos + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        end = pos + 12 + length
        if end > len(data):
            break
        if kind == b"eXIf":
            exif = data[pos + 8 : pos + 8 + length]
        if kind == b"IEND":
            return exif
        pos = end
    raise MediaError(f"{name}: a truncated PNG ({len(data)} bytes, its chunks end before IEND)")


def _check_jpeg(data: bytes, name: str) -> None:
    if not data.rstrip(b"\0").endswith(b"\xff\xd9"):
        raise MediaError(f"{name}: a truncated JPEG ({len(data)} bytes, no end-of-image marker at its end)")


def _check_webp(data: bytes, name: str) -> None:
    riff = struct.unpack("<I", data[4:8])[0]
    if len(data) < 8 + riff:
        raise MediaError(f"{name}: a truncated WebP ({len(data)} bytes, its RIFF header says {8 + riff})")


def _orientation(exif: bytes | None) -> int:
    """The EXIF orientation tag (1 when absent), parsed from the EXIF bytes alone."""
    if not exif:
        return 1
    from PIL import Image

    parsed = Image.Exif()
    try:
        parsed.load(exif)
    except (SyntaxError, ValueError, struct.error, OSError):
        return 1  # NOTE: an unreadable EXIF block is ignored as Pillow's exif_transpose ignores it
    value = parsed.get(_ORIENTATION_TAG, 1)
    # NOTE: a value outside 1..8 (cameras write 0) means no transform, as Pillow's exif_transpose reads it
    return value if isinstance(value, int) and 1 <= value <= 8 else 1
