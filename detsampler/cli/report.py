"""Text output shared by the commands: aligned key/value rows, paths, counts, weights and a media index's images."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["fmt_int", "fmt_loss_mask", "fmt_weights", "image_line", "print_rows", "rel"]


def print_rows(rows: Sequence[tuple[str, Any]]) -> None:
    """Print ``key  value`` lines, the keys padded to the longest."""
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")


def rel(path: str) -> str:
    """``path`` relative to the current directory when it lies under it (an object store URL as it is)."""
    from pathlib import Path

    if "://" in str(path):
        return str(path)
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def fmt_int(n: int) -> str:
    """``n`` with thousands separators."""
    return f"{n:,}"


def fmt_weights(weights: Iterable[Any]) -> str:
    """Weights as ``w, w, ...`` (fractions print exactly)."""
    return ", ".join(str(w) for w in weights)


def fmt_loss_mask(counts: dict[str, Any]) -> str:
    """A chat index's loss-mask counts (``TokenIndex.loss_mask_counts``) as one line."""
    total = counts["trained_tokens"] + counts["masked_tokens"]
    share = 100 * counts["trained_tokens"] / max(total, 1)
    return (
        f"policy {counts['policy']}: {fmt_int(counts['trained_tokens'])} tokens trained ({share:.1f}%),"
        f" {fmt_int(counts['masked_tokens'])} masked"
    )


def image_line(im: dict) -> str:
    """One image of a media index (:meth:`~detsampler.media.index.MediaIndex.image_records`): id, document, item,
    where its bytes are, format, size after EXIF orientation, and its LLM tokens and vision patches."""
    turned = f" (EXIF orientation {im['orientation']})" if im["orientation"] != 1 else ""
    a, b = im["bytes"]
    return (
        f"image {im['image']} (doc {im['document']}, item {im['item']}): {im['source']} [{a}, {b}) {im['format']}"
        f" {im['width']}x{im['height']}{turned}: {im['tokens']} tokens, {im['patches']} patches"
    )
