"""Token spans of samples (:class:`Spans`, in CSR form) and their merging: what a layout's ``locate`` returns."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from detsampler.ranges import concat_ranges

__all__ = ["Spans", "merge_spans"]


@dataclass(frozen=True)
class Spans:
    """Token spans of a batch of samples, in CSR form: sample ``i`` covers spans ``offsets[i]:offsets[i+1]``.

    A span ``(doc_ids[j], starts[j], stops[j])`` is the half-open range of token positions of one document, where
    position
    ``lengths[doc]`` is the document's EOS. Spans of a sample are in the order their tokens appear in the sample.
    """

    offsets: np.ndarray
    doc_ids: np.ndarray
    starts: np.ndarray
    stops: np.ndarray

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def num_tokens(self) -> np.ndarray:
        """Tokens per sample (int64, one per sample)."""
        return (
            np.add.reduceat(self.stops - self.starts, self.offsets[:-1]) if self.doc_ids.size else np.zeros(0, np.int64)
        )

    def sample(self, i: int) -> list[tuple[int, int, int]]:
        """The spans of sample ``i`` as ``(doc_id, start, stop)`` tuples."""
        lo, hi = int(self.offsets[i]), int(self.offsets[i + 1])
        return list(zip(self.doc_ids[lo:hi].tolist(), self.starts[lo:hi].tolist(), self.stops[lo:hi].tolist()))


def merge_spans(parts: Sequence[tuple[np.ndarray, Spans]], num_samples: int) -> Spans:
    """One :class:`Spans` for ``num_samples`` samples from pieces: ``parts[j] = (indices, spans of those samples)``;
    the indices of all parts partition ``range(num_samples)``."""
    counts = np.zeros(num_samples, dtype=np.int64)
    for idx, spans in parts:
        counts[idx] = np.diff(spans.offsets)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    total = int(offsets[-1])
    doc_ids, starts, stops = (np.empty(total, dtype=np.int64) for _ in range(3))
    for idx, spans in parts:
        per = np.diff(spans.offsets)
        # destination of each span: the sample's first slot plus its rank within the sample
        dest = concat_ranges(offsets[idx], per)[0]
        doc_ids[dest], starts[dest], stops[dest] = spans.doc_ids, spans.starts, spans.stops
    return Spans(offsets, doc_ids, starts, stops)
