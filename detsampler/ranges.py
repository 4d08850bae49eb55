"""Integer ranges expanded into one array (numpy only, no per-element Python)."""

from __future__ import annotations

import numpy as np

__all__ = ["concat_ranges"]


def concat_ranges(first: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each ``i``, the integers ``first[i] .. first[i] + counts[i] - 1`` (int64), concatenated in order; and the
    CSR offsets (``len(counts) + 1`` values): range ``i`` is ``out[offsets[i]:offsets[i + 1]]``."""
    counts = np.asarray(counts, dtype=np.int64)
    offsets = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    within = np.arange(offsets[-1], dtype=np.int64) - np.repeat(offsets[:-1], counts)
    return np.repeat(np.asarray(first, dtype=np.int64), counts) + within, offsets
