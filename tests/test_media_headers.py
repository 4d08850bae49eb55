"""Image headers at build time (issue 33): format, size after EXIF orientation and CRC-32 from the header alone, and
every malformed image refused in one line naming it."""

from __future__ import annotations

import io
import zlib

import pytest
from PIL import Image, ImageFile, ImageOps

from detsampler.media.headers import MediaError, read_header
from tests.media_images import bomb_png, image_bytes

FORMATS = ("JPEG", "PNG", "WEBP")


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("orientation", [None, 1, 3, 5, 6, 8])
def test_size_after_exif_orientation_equals_the_decoded_transposed_image(fmt, orientation):
    data = image_bytes(fmt, 37, 20, orientation)
    header = read_header(data, "shard-0.tar:doc-3.jpg")
    decoded = ImageOps.exif_transpose(Image.open(io.BytesIO(data)))  # what transformers' load_image applies
    assert (header.width, header.height) == decoded.size
    assert (header.format, header.orientation) == (fmt, orientation or 1)
    assert (header.crc32, header.size) == (zlib.crc32(data), len(data))


def test_the_header_is_read_without_decoding(monkeypatch):
    images = [image_bytes(fmt, 30, 10, 6) for fmt in FORMATS]
    calls = []
    for cls in (Image.Image, ImageFile.ImageFile):  # every decode goes through load()
        monkeypatch.setattr(cls, "load", lambda self: calls.append(self) or None)
    for data in images:
        read_header(data, "x")
    assert calls == []


def _truncated(fmt: str) -> bytes:
    data = image_bytes(fmt, 64, 48, seed=1)
    return data[: len(data) - 5]


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"", r"the image is empty \(0 bytes\)"),
        (b"not an image at all", "not an image in a format Pillow knows"),
        (image_bytes("JPEG", 64, 48)[:300], "a corrupt image"),
        (_truncated("JPEG"), "a truncated JPEG"),
        (_truncated("PNG"), "a truncated PNG"),
        (_truncated("WEBP"), "a truncated WebP"),
        (bomb_png(20_000, 20_000), "a decompression bomb"),
        (image_bytes("GIF", 8, 8), "a GIF image; allowed formats are JPEG, PNG, WEBP"),
    ],
    ids=["zero-size", "not-an-image", "corrupt", "truncated-jpeg", "truncated-png", "truncated-webp", "bomb", "gif"],
)
def test_malformed_images_are_refused_naming_source_and_item(data, expected):
    with pytest.raises(MediaError, match=expected) as info:
        read_header(data, "shard-00002.tar:sample-17.jpg")
    message = str(info.value)
    assert message.startswith("shard-00002.tar:sample-17.jpg: ") and "\n" not in message


def test_the_pixel_limit_is_a_setting():
    data = image_bytes("PNG", 40, 30)
    assert read_header(data, "x", max_pixels=1200).width == 40
    with pytest.raises(MediaError, match=r"x: 40x30 = 1200 pixels, a decompression bomb; at most 1199 allowed"):
        read_header(data, "x", max_pixels=1199)
    with pytest.raises(MediaError, match="a decompression bomb"):
        read_header(bomb_png(12_000, 10_000), "x")  # within Pillow's own hard limit, above the default


def test_an_animated_image_is_refused():
    frames = [Image.new("RGB", (8, 8), (i * 40, 0, 0)) for i in range(3)]
    buf = io.BytesIO()
    frames[0].save(buf, "WEBP", save_all=True, append_images=frames[1:])
    with pytest.raises(MediaError, match="an animated WEBP of 3 frames"):
        read_header(buf.getvalue(), "x")
