"""Layouts: how the documents of a corpus are cut into samples of ``seq_len`` tokens.

A layout sees only per-document token counts (documents in dataset order). Each document is followed by one EOS token, so
document ``d`` owns ``lengths[d] + 1`` token positions: ``[0, lengths[d])`` are its tokens and position ``lengths[d]`` its EOS.
A sample is a list of spans ``(doc_id, start, stop)`` over those positions (:class:`Spans`). Documents are visited in a
seeded order (``document_order``), fixed for the whole run; the plan shuffles samples per epoch on top of it.

- ``concat``: the documents in that order, each with its EOS, form one token stream; sample ``c`` is the stream's tokens
  ``[c*L, c*L + L + 1)``: L inputs and the shifted label. The inputs of samples ``0 .. num_samples-1`` tile the stream's first
  ``num_samples * L`` tokens exactly; only the final partial sample's tokens are left out.
- ``document``: each sample is one piece of one document: a document of ``m = length + 1`` positions gives ``ceil(m / L)``
  consecutive pieces of ``L`` positions (the last one shorter); the rest of a sample is padding.
- ``bestfit``: within windows of ``window_docs`` consecutive documents, documents are cut into pieces of ``L`` positions
  (only documents longer than ``L`` are cut) and the pieces are packed into bins of ``L`` by best-fit decreasing. A sample is
  a (window, bin) pair; only the number of bins per window is kept, and a window's packing is recomputed when asked for.
For ``document`` and ``bestfit`` every position of every document lies in exactly one sample per epoch
(tests/test_layout.py).
"""

from __future__ import annotations

import bisect
import numbers
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Literal, Protocol

import numpy as np

from detsampler.keys import stable_hash64
from detsampler.permutation import permute

__all__ = [
    "BestFitLayout",
    "ConcatLayout",
    "DocumentLayout",
    "Layout",
    "LAYOUTS",
    "LAYOUT_KINDS",
    "LayoutConfig",
    "LayoutKind",
    "Spans",
    "document_order",
    "make_layout",
]

LayoutKind = Literal["concat", "document", "bestfit"]  # the keys of LAYOUTS (below), for type checkers


@dataclass(frozen=True, kw_only=True)
class LayoutConfig:
    """How to cut documents into samples. ``seq_len`` is the number of input tokens of a sample."""

    kind: LayoutKind = "concat"
    seq_len: int = 512
    seed: int = 0
    window_docs: int = 1024  # bestfit only: documents packed together

    def __post_init__(self) -> None:
        if self.kind not in LAYOUTS:
            raise ValueError(f"layout kind must be one of {tuple(LAYOUTS)}, got {self.kind!r}")
        if isinstance(self.seq_len, bool) or not isinstance(self.seq_len, int) or self.seq_len < 1:
            raise ValueError(f"seq_len must be an integer >= 1, got {self.seq_len!r}")
        if self.kind != "concat" and self.seq_len < 2:
            # NOTE: a document/bestfit sample holds seq_len positions and its labels are the next ones within it: with one
            # position there is no label, and training on it gives a NaN loss.
            raise ValueError(f"seq_len must be >= 2 for the {self.kind} layout (a sample of 1 token has no label), got 1")
        if isinstance(self.seed, bool) or not isinstance(self.seed, numbers.Integral):
            raise ValueError(f"seed must be an integer, got {self.seed!r}")
        if isinstance(self.window_docs, bool) or not isinstance(self.window_docs, int) or self.window_docs < 1:
            raise ValueError(f"window_docs must be an integer >= 1, got {self.window_docs!r}")


@dataclass(frozen=True)
class Spans:
    """Token spans of a batch of samples, in CSR form: sample ``i`` covers spans ``offsets[i]:offsets[i+1]``.

    A span ``(doc_ids[j], starts[j], stops[j])`` is the half-open range of token positions of one document, where position
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
        return np.add.reduceat(self.stops - self.starts, self.offsets[:-1]) if self.doc_ids.size else np.zeros(0, np.int64)

    def sample(self, i: int) -> list[tuple[int, int, int]]:
        """The spans of sample ``i`` as ``(doc_id, start, stop)`` tuples."""
        lo, hi = int(self.offsets[i]), int(self.offsets[i + 1])
        return list(zip(self.doc_ids[lo:hi].tolist(), self.starts[lo:hi].tolist(), self.stops[lo:hi].tolist()))


class Layout(Protocol):
    """What the plan, the dataset, mixtures and the tools read of a layout; nothing else of it is used.

    ``labels_cross_documents``: True when a sample is a window of one token stream whose label at the last input is the
    next document's first token (concat: ``sample_len = seq_len + 1``, position ids count 0..L-1); False when labels stay
    within a span (document, bestfit: the last position of each span gets no label, position ids restart per span).
    """

    config: LayoutConfig
    num_samples: int
    num_documents: int
    num_tokens: int  # token positions of the corpus, one EOS per document counted
    lengths: np.ndarray  # tokens of each document (EOS not counted), the array the layout was made over
    labels_cross_documents: bool

    @property
    def tokens_per_epoch(self) -> int:
        """Input tokens one epoch of samples serves (padding not counted)."""

    @property
    def sample_len(self) -> int:
        """Token positions a full sample holds: ``seq_len + 1`` for concat (inputs and label), else ``seq_len``."""

    def locate(self, sample_ids: np.ndarray) -> Spans:
        """The spans of samples ``sample_ids`` (each in ``[0, num_samples)``)."""

    def describe(self) -> dict:
        """Counts and configuration, for summaries and fingerprints."""


def _check_lengths(lengths: np.ndarray) -> np.ndarray:
    arr = np.asarray(lengths)
    if arr.ndim != 1:
        raise ValueError(f"document lengths must be a 1-D array, got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError("the dataset is empty: a layout needs at least one document")
    if arr.dtype.kind not in "iu":
        raise ValueError(f"document lengths must be integers, got dtype {arr.dtype}")
    if arr.min() < 0:
        raise ValueError(f"document lengths must be >= 0, got {int(arr.min())} for document {int(np.argmin(arr))}")
    return arr.astype(np.int64, copy=False)


def _check_sample_ids(sample_ids: np.ndarray, num_samples: int) -> np.ndarray:
    ids = np.asarray(sample_ids, dtype=np.int64).reshape(-1)
    if ids.size and (ids.min() < 0 or ids.max() >= num_samples):
        bad = int(ids[(ids < 0) | (ids >= num_samples)][0])
        raise ValueError(f"Got sample id {bad}, allowed sample ids are in [0, {num_samples})")
    return ids


def document_order(num_documents: int, seed: int) -> np.ndarray:
    """The seeded order in which a layout visits documents: ``order[i]`` is the i-th document (a permutation).

    Drawn from mapping version 1's permutation in every mapping version: version 2 changed the sample orders (plan epochs,
    mixture sources), not the layouts' cutting, so a layout, its cached bin counts and the tokens of its samples are the same
    whatever version a plan reads it with (tests/test_pinned.py pins them once).
    """
    return permute(np.arange(num_documents, dtype=np.int64), num_documents, stable_hash64("document-order", seed), version=1)


def _ranges(first: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each i, the integers ``first[i] .. first[i] + counts[i] - 1``, concatenated, and the CSR offsets."""
    offsets = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    within = np.arange(offsets[-1], dtype=np.int64) - np.repeat(offsets[:-1], counts)
    return np.repeat(first, counts) + within, offsets


class ConcatLayout:
    """Documents (each with its EOS) concatenated in the seeded order; sample ``c`` is stream tokens ``[cL, cL + L + 1)``."""

    labels_cross_documents = True

    def __init__(self, config: LayoutConfig, lengths: np.ndarray) -> None:
        self.config = config
        self.lengths = _check_lengths(lengths)
        self.num_documents = len(self.lengths)
        self.order = document_order(self.num_documents, config.seed)
        self._extent = self.lengths[self.order] + 1  # positions per document, in stream order
        self._ends = np.cumsum(self._extent)
        self.num_tokens = int(self._ends[-1])
        self.num_samples = (self.num_tokens - 1) // config.seq_len
        if self.num_samples < 1:
            raise ValueError(
                f"no complete sample: the corpus has {self.num_tokens} tokens with EOS, a concat sample of "
                f"seq_len={config.seq_len} needs {config.seq_len + 1}"
            )

    @property
    def sample_len(self) -> int:
        return self.config.seq_len + 1

    @property
    def tokens_per_epoch(self) -> int:
        return self.num_samples * self.config.seq_len

    def locate(self, sample_ids: np.ndarray) -> Spans:
        ids = _check_sample_ids(sample_ids, self.num_samples)
        begin = ids * self.config.seq_len
        end = begin + self.config.seq_len + 1
        first = np.searchsorted(self._ends, begin, side="right")
        last = np.searchsorted(self._ends, end - 1, side="right")
        pos, offsets = _ranges(first, last - first + 1)
        doc_begin = self._ends[pos] - self._extent[pos]
        counts = np.diff(offsets)
        starts = np.maximum(np.repeat(begin, counts) - doc_begin, 0)
        stops = np.minimum(np.repeat(end, counts) - doc_begin, self._extent[pos])
        return Spans(offsets, self.order[pos], starts, stops)

    def describe(self) -> dict:
        used = self.num_samples * self.config.seq_len
        return {
            **asdict(self.config),
            "num_documents": self.num_documents,
            "num_tokens": self.num_tokens,
            "num_samples": self.num_samples,
            "padding_fraction": 0.0,
            "dropped_tokens": self.num_tokens - used,
        }


class DocumentLayout:
    """Each sample is one piece of at most ``seq_len`` positions of one document, starting at a document boundary."""

    labels_cross_documents = False

    def __init__(self, config: LayoutConfig, lengths: np.ndarray) -> None:
        self.config = config
        self.lengths = _check_lengths(lengths)
        self.num_documents = len(self.lengths)
        self.order = document_order(self.num_documents, config.seed)
        self._extent = self.lengths[self.order] + 1
        self._pieces = -(-self._extent // config.seq_len)
        self._ends = np.cumsum(self._pieces)
        self.num_samples = int(self._ends[-1])
        self.num_tokens = int(self._extent.sum())

    @property
    def sample_len(self) -> int:
        return self.config.seq_len

    @property
    def tokens_per_epoch(self) -> int:
        return self.num_tokens

    def locate(self, sample_ids: np.ndarray) -> Spans:
        ids = _check_sample_ids(sample_ids, self.num_samples)
        pos = np.searchsorted(self._ends, ids, side="right")
        piece = ids - (self._ends[pos] - self._pieces[pos])
        starts = piece * self.config.seq_len
        stops = np.minimum(starts + self.config.seq_len, self._extent[pos])
        return Spans(np.arange(len(ids) + 1, dtype=np.int64), self.order[pos], starts, stops)

    def describe(self) -> dict:
        return {
            **asdict(self.config),
            "num_documents": self.num_documents,
            "num_tokens": self.num_tokens,
            "num_samples": self.num_samples,
            "padding_fraction": 1.0 - self.num_tokens / (self.num_samples * self.config.seq_len),
            "dropped_tokens": 0,
        }


def pack_best_fit(extents: np.ndarray, capacity: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Best-fit-decreasing packing of documents of ``extents`` positions into bins of ``capacity``.

    A document longer than ``capacity`` is cut into full pieces of ``capacity`` (each a bin of its own) and a remainder; all
    remainders and short documents are packed by best-fit decreasing (ties broken by position, so the result is a pure
    function of ``extents``). Returns ``(bin_offsets, item_docs, item_starts, item_stops)``: bin ``b`` holds items
    ``bin_offsets[b]:bin_offsets[b+1]``, ``item_docs`` indexing into ``extents``.
    """
    extents = np.asarray(extents, dtype=np.int64)
    full = extents // capacity
    full_piece, _ = _ranges(np.zeros(len(extents), np.int64), full)
    full_doc_idx = np.repeat(np.arange(len(extents)), full)
    full_starts = full_piece * capacity

    rest = extents - full * capacity
    rest_idx = np.flatnonzero(rest)
    rest_idx = rest_idx[np.argsort(-rest[rest_idx], kind="stable")]
    free: list[tuple[int, int]] = []  # (remaining capacity, bin), sorted
    members: list[list[int]] = []
    for doc in rest_idx.tolist():
        size = int(rest[doc])
        k = bisect.bisect_left(free, (size, -1))
        if k == len(free):
            members.append([doc])
            bisect.insort(free, (capacity - size, len(members) - 1))
        else:
            remaining, b = free.pop(k)
            members[b].append(doc)
            bisect.insort(free, (remaining - size, b))

    packed_docs = np.fromiter((d for m in members for d in m), dtype=np.int64, count=len(rest_idx))
    packed_counts = np.fromiter((len(m) for m in members), dtype=np.int64, count=len(members))
    counts = np.concatenate([np.ones(len(full_doc_idx), np.int64), packed_counts])
    bin_offsets = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=bin_offsets[1:])
    docs = np.concatenate([full_doc_idx, packed_docs])
    starts = np.concatenate([full_starts, full[packed_docs] * capacity])
    stops = np.concatenate([full_starts + capacity, extents[packed_docs]])
    return bin_offsets, docs, starts, stops


class BestFitLayout:
    """Best-fit-decreasing bins of ``seq_len`` positions within windows of ``window_docs`` consecutive documents."""

    labels_cross_documents = False

    def __init__(self, config: LayoutConfig, lengths: np.ndarray, bins_per_window: np.ndarray | None = None) -> None:
        self.config = config
        self.lengths = _check_lengths(lengths)
        self.num_documents = len(self.lengths)
        self.order = document_order(self.num_documents, config.seed)
        self.num_windows = -(-self.num_documents // config.window_docs)
        self.num_tokens = int(self.lengths.sum()) + self.num_documents
        if bins_per_window is None:
            bins_per_window = np.array([len(self._pack(w)[0]) - 1 for w in range(self.num_windows)], dtype=np.int64)
        self.bins_per_window = np.asarray(bins_per_window, dtype=np.int64)
        if self.bins_per_window.shape != (self.num_windows,):
            raise ValueError(f"bins_per_window must have {self.num_windows} entries, got {self.bins_per_window.shape}")
        self._ends = np.cumsum(self.bins_per_window)
        self.num_samples = int(self._ends[-1])
        self._pack = lru_cache(maxsize=256)(self._pack)

    @property
    def sample_len(self) -> int:
        return self.config.seq_len

    @property
    def tokens_per_epoch(self) -> int:
        return self.num_tokens

    def window_documents(self, window: int) -> np.ndarray:
        """The document ids of window ``window``, in the seeded order."""
        w = self.config.window_docs
        return self.order[window * w : (window + 1) * w]

    def _pack(self, window: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        docs = self.window_documents(window)
        bin_offsets, items, starts, stops = pack_best_fit(self.lengths[docs] + 1, self.config.seq_len)
        return bin_offsets, docs[items], starts, stops

    def locate(self, sample_ids: np.ndarray) -> Spans:
        ids = _check_sample_ids(sample_ids, self.num_samples)
        windows = np.searchsorted(self._ends, ids, side="right")
        bins = ids - (self._ends[windows] - self.bins_per_window[windows])
        counts = np.empty(len(ids), dtype=np.int64)
        parts: list[tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        for window in np.unique(windows).tolist():
            where = np.flatnonzero(windows == window)
            bin_offsets, docs, starts, stops = self._pack(window)
            item, _ = _ranges(bin_offsets[bins[where]], np.diff(bin_offsets)[bins[where]])
            counts[where] = np.diff(bin_offsets)[bins[where]]
            parts.append((window, where, docs[item], starts[item], stops[item]))
        offsets = np.zeros(len(ids) + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        doc_ids = np.empty(offsets[-1], dtype=np.int64)
        span_starts, span_stops = np.empty_like(doc_ids), np.empty_like(doc_ids)
        for _, where, d, s, e in parts:
            dest, _ = _ranges(offsets[where], counts[where])
            doc_ids[dest], span_starts[dest], span_stops[dest] = d, s, e
        return Spans(offsets, doc_ids, span_starts, span_stops)

    def describe(self) -> dict:
        return {
            **asdict(self.config),
            "num_documents": self.num_documents,
            "num_tokens": self.num_tokens,
            "num_samples": self.num_samples,
            "num_windows": self.num_windows,
            "padding_fraction": 1.0 - self.num_tokens / (self.num_samples * self.config.seq_len),
            "dropped_tokens": 0,
        }


LAYOUTS: dict[str, type] = {"concat": ConcatLayout, "document": DocumentLayout, "bestfit": BestFitLayout}
LAYOUT_KINDS: tuple[str, ...] = tuple(LAYOUTS)


def make_layout(config: LayoutConfig, lengths: np.ndarray, bins_per_window: np.ndarray | None = None) -> Layout:
    """The layout ``config.kind`` over documents of ``lengths`` tokens (EOS not counted).

    Args:
        config: the kind, ``seq_len``, seed and (bestfit) window.
        lengths: tokens per document, in dataset order.
        bins_per_window: bestfit only: the stored bin counts per window (else computed).
    """
    if bins_per_window is not None:
        if config.kind != "bestfit":
            raise ValueError(f"bins_per_window is for the bestfit layout, got kind {config.kind!r}")
        return BestFitLayout(config, lengths, bins_per_window)
    return LAYOUTS[config.kind](config, lengths)
