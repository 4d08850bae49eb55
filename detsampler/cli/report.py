"""Text output shared by the commands: aligned key/value rows, paths, counts and weights."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["fmt_int", "fmt_weights", "print_rows", "rel"]


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
