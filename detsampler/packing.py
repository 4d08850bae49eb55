"""Best-fit-decreasing packing of documents into bins of ``seq_len`` positions, window by window (numpy only).

A window is ``window_docs`` consecutive documents of the seeded document order. Each window is packed on its own, so any
range of windows can be packed by any process and the results concatenated: :func:`pack_windows` is a pure function of
(lengths, config, window range). :data:`PACKING_VERSION` names the algorithm; persisted packings include it in their
key.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np

__all__ = ["PACKING_VERSION", "Packed", "pack_best_fit", "pack_windows"]

# 1: best-fit decreasing per window, full pieces of documents longer than seq_len first, ties broken by position
PACKING_VERSION = 1


def _ranges(first: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each i, the integers ``first[i] .. first[i] + counts[i] - 1``, concatenated, and the CSR offsets."""
    offsets = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    within = np.arange(offsets[-1], dtype=np.int64) - np.repeat(offsets[:-1], counts)
    return np.repeat(first, counts) + within, offsets


def pack_best_fit(extents: np.ndarray, capacity: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Best-fit-decreasing packing of documents of ``extents`` positions into bins of ``capacity``.

    A document longer than ``capacity`` is cut into full pieces of ``capacity`` (a bin each) and a remainder; all
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


@dataclass(frozen=True)
class Packed:
    """The packing of a range of windows: per window its number of bins, per bin its number of items, per item its
    document and piece (the piece ``p`` of document ``d`` is its positions ``[p*L, min((p+1)*L, lengths[d]+1))``)."""

    bins_per_window: np.ndarray  # int64
    items_per_bin: np.ndarray  # int64
    item_docs: np.ndarray  # int64
    item_pieces: np.ndarray  # uint32


def pack_windows(
    window_docs: list[np.ndarray] | tuple[np.ndarray, ...],
    extents: list[np.ndarray] | tuple[np.ndarray, ...],
    seq_len: int,
) -> Packed:
    """Pack each window (its document ids and their extents, ``lengths + 1``) by :func:`pack_best_fit`, concatenated."""
    bins, per_bin, docs, pieces = [], [], [], []
    for ids, ext in zip(window_docs, extents):
        bin_offsets, items, starts, _ = pack_best_fit(ext, seq_len)
        bins.append(len(bin_offsets) - 1)
        per_bin.append(np.diff(bin_offsets))
        docs.append(np.asarray(ids, dtype=np.int64)[items])
        pieces.append((starts // seq_len).astype(np.uint32))
    cat = lambda parts, dt: np.concatenate(parts) if parts else np.zeros(0, dt)
    return Packed(np.asarray(bins, dtype=np.int64), cat(per_bin, np.int64), cat(docs, np.int64), cat(pieces, np.uint32))
