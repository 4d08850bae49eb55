"""Text output shared by the commands: aligned key/value rows, paths, counts, weights and a media index's images."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, TextIO

__all__ = ["fmt_int", "fmt_loss_mask", "fmt_weights", "image_line", "json_stdout", "print_json", "print_rows", "rel"]

_JSON_OUT: list[TextIO] = []  # where print_json writes while json_stdout is active (the real stdout)


@contextlib.contextmanager
def json_stdout(enabled: bool) -> Iterator[None]:
    """With ``enabled`` (``--json``): stdout carries exactly the JSON of :func:`print_json`, and every other line
    printed meanwhile (rows, progress, notes) goes to stderr. Without it, nothing changes."""
    if not enabled:
        yield
        return
    _JSON_OUT.append(sys.stdout)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        _JSON_OUT.pop()


def print_json(document: Any, **dumps: Any) -> None:
    """Print ``document`` as JSON on stdout (the real one under :func:`json_stdout`); ``dumps``: json.dumps' options."""
    print(json.dumps(document, **dumps), file=_JSON_OUT[-1] if _JSON_OUT else sys.stdout, flush=True)


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
