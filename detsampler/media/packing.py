"""Packing on two axes: LLM tokens (text and image tokens) into bins of ``seq_len`` positions, with a cap of
``max_patches`` vision patches per bin, never splitting an image (numpy only).

A document is a run of positions (``lengths[d] + 1``: its tokens, image tokens expanded, and its EOS); its images are
runs of image tokens inside it (:class:`MediaRuns`), each costing some vision patches. First each document becomes
pieces (:func:`cut_pieces`): one piece when it fits a bin on both axes; else, under ``overlong="split"``, consecutive
pieces cut only between images (a cut that would fall inside an image moves to the image's start), each as long as the
bin and the patch cap allow; under ``"drop"`` it is left out (counted). An image that alone exceeds either axis is
refused, naming it, under ``"split"``; under ``"drop"`` its document is left out.

Then, window by window, the pieces are packed by best-fit decreasing over tokens (:func:`pack_pieces`): largest first
(ties by position in the window), each into the bin with the least tokens left that holds it *and* has room for its
patches (ties: the bin opened first), or into a new bin. Many windows are packed in lockstep: step ``k`` places the
``k``-th piece of every window with numpy operations over the windows and their open bins.

:data:`MEDIA_PACKING_VERSION` names the algorithm; the layout records it in its identity.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["MEDIA_PACKING_VERSION", "OVERLONG_MEDIA", "MediaRuns", "Pieces", "cut_pieces", "pack_pieces"]

# 1: pieces cut between images; best-fit decreasing over tokens with a patch cap, ties by position / bin opened first
MEDIA_PACKING_VERSION = 1
OVERLONG_MEDIA = ("split", "drop")
STATE_CELLS = 1 << 22  # windows packed in lockstep x their largest bin count: bounds the state to 32 MB


@dataclass(frozen=True)
class MediaRuns:
    """The images of each document, in CSR form by document: document ``d``'s images are ``doc_offsets[d] :
    doc_offsets[d + 1]``; image ``i`` is the token positions ``[starts[i], starts[i] + tokens[i])`` of its document
    and costs ``patches[i]`` vision patches. Within a document the runs are in position order and never overlap."""

    doc_offsets: np.ndarray
    starts: np.ndarray
    tokens: np.ndarray
    patches: np.ndarray

    def check(self, lengths: np.ndarray) -> None:
        """Raise a ValueError naming the first document whose runs are out of order, overlap or leave its tokens."""
        n = len(lengths)
        if len(self.doc_offsets) != n + 1 or self.doc_offsets[0] != 0 or np.any(np.diff(self.doc_offsets) < 0):
            raise ValueError(f"MediaRuns.doc_offsets must be a non-decreasing CSR of {n + 1} entries from 0")
        m = int(self.doc_offsets[-1])
        if not len(self.starts) == len(self.tokens) == len(self.patches) == m:
            raise ValueError(f"MediaRuns: {m} images by doc_offsets, but starts/tokens/patches have other lengths")
        doc = np.repeat(np.arange(n), np.diff(self.doc_offsets))
        stops = self.starts + self.tokens
        first = np.zeros(m, bool)
        first[self.doc_offsets[:-1][np.diff(self.doc_offsets) > 0]] = True
        prev_stop = np.concatenate([[0], stops[:-1]])
        bad = (self.tokens < 1) | (self.patches < 0) | (self.starts < 0) | (stops > np.asarray(lengths)[doc])
        bad |= ~first & (self.starts < prev_stop)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(
                f"MediaRuns: image {i} of document {int(doc[i])} (positions [{int(self.starts[i])}, {int(stops[i])}),"
                f" {int(self.patches[i])} patches) is out of order, overlaps another or leaves the document's"
                f" {int(lengths[doc[i]])} tokens"
            )

    def doc_patches(self) -> np.ndarray:
        """Vision patches of each document (int64)."""
        doc = np.repeat(np.arange(len(self.doc_offsets) - 1), np.diff(self.doc_offsets))
        return np.bincount(doc, weights=self.patches, minlength=len(self.doc_offsets) - 1).astype(np.int64)


@dataclass(frozen=True)
class Pieces:
    """The pieces of the documents ``docs`` (in the given order): piece ``j`` is positions ``[starts[j], stops[j])``
    of document ``docs[j]`` holding ``patches[j]`` vision patches; a document's pieces are consecutive and tile its
    positions. ``dropped``: the documents left out under ``overlong="drop"``."""

    docs: np.ndarray
    starts: np.ndarray
    stops: np.ndarray
    patches: np.ndarray
    dropped: np.ndarray


def _split(doc: int, extent: int, runs: MediaRuns, seq_len: int, max_patches: int) -> list[tuple[int, int, int]]:
    """The pieces ``(start, stop, patches)`` of one document that does not fit a bin: each piece takes the images
    that fit both axes, and is cut at the next image's start when that one does not fit, else at ``seq_len``."""
    a, b = int(runs.doc_offsets[doc]), int(runs.doc_offsets[doc + 1])
    starts, tokens, patches = (np.asarray(x[a:b], np.int64) for x in (runs.starts, runs.tokens, runs.patches))
    out, start, i = [], 0, 0
    while start < extent:
        limit, used, j = start + seq_len, 0, i
        while j < len(starts) and starts[j] + tokens[j] <= limit and used + patches[j] <= max_patches:
            used += int(patches[j])
            j += 1
        stop = int(starts[j]) if j < len(starts) and starts[j] < limit else min(limit, extent)
        if stop == start:
            raise ValueError(
                f"document {doc}: image {j} of it ({int(tokens[j])} tokens, {int(patches[j])} patches) does"
                f" not fit one sample of seq_len={seq_len} and max_patches={max_patches}, and an image is never split;"
                " raise seq_len or max_patches, lower the processor's max_pixels, or use overlong='drop'"
            )
        out.append((start, stop, used))
        start, i = stop, j
    return out


def cut_pieces(
    docs: np.ndarray, extents: np.ndarray, runs: MediaRuns, seq_len: int, max_patches: int, overlong: str
) -> Pieces:
    """The pieces of documents ``docs`` of ``extents`` positions (see the module doc). Documents that fit a bin on
    both axes (the common case) are one piece each, vectorized; only the others are cut, one by one."""
    if overlong not in OVERLONG_MEDIA:
        raise ValueError(f"overlong must be one of {OVERLONG_MEDIA}, got {overlong!r}")
    docs, extents = np.asarray(docs, np.int64), np.asarray(extents, np.int64)
    patches = runs.doc_patches()[docs]
    fits = (extents <= seq_len) & (patches <= max_patches)
    if fits.all():
        return Pieces(docs, np.zeros(len(docs), np.int64), extents, patches, np.zeros(0, np.int64))
    if overlong == "drop":
        return Pieces(docs[fits], np.zeros(int(fits.sum()), np.int64), extents[fits], patches[fits], docs[~fits])
    parts = [[(0, int(e), int(p))] if f else _split(int(d), int(e), runs, seq_len, max_patches)
             for d, e, p, f in zip(docs, extents, patches, fits)]  # fmt: skip
    counts = np.fromiter(map(len, parts), np.int64, len(parts))
    flat = np.array([piece for pieces in parts for piece in pieces], np.int64).reshape(-1, 3)
    return Pieces(np.repeat(docs, counts), flat[:, 0], flat[:, 1], flat[:, 2], np.zeros(0, np.int64))


@dataclass(frozen=True)
class PackedPieces:
    """Per window its number of bins; per bin its number of items; per item the piece it is (an index into the
    pieces given to :func:`pack_pieces`), bins numbered window by window in the order they were opened, items in the
    order they were placed."""

    bins_per_window: np.ndarray
    items_per_bin: np.ndarray
    item_pieces: np.ndarray


def _place(
    tokens: np.ndarray, patches: np.ndarray, depth: np.ndarray, seq_len: int, max_patches: int
) -> tuple[np.ndarray, np.ndarray]:
    """Best fit of ``rows`` windows in lockstep: ``tokens[j, r]``/``patches[j, r]`` is row ``r``'s ``j``-th piece
    (rows sorted by ``depth``, their piece counts, descending). Returns each piece's bin in its window (same shape)
    and each row's number of bins."""
    rows = tokens.shape[1]
    width = int(depth.max(initial=0))
    left_tokens = np.full((rows, max(width, 1)), -1, np.int64)  # -1: not opened (holds nothing)
    left_patches = np.full((rows, max(width, 1)), -1, np.int64)
    opened = np.zeros(rows, np.int64)
    chosen = np.zeros(tokens.shape, np.int64)
    big = np.iinfo(np.int64).max
    for j in range(len(tokens)):
        a = int(np.searchsorted(-depth, -j, side="left"))  # rows with more than j pieces: a prefix
        t, p = tokens[j, :a, None], patches[j, :a, None]
        span = max(int(opened[:a].max(initial=0)), 1)
        lt, lp = left_tokens[:a, :span], left_patches[:a, :span]
        fits = (lt >= t) & (lp >= p)
        best = np.where(fits, lt, big).argmin(axis=1)
        r = np.arange(a)
        old = fits[r, best]
        bins = np.where(old, best, opened[:a])
        left_tokens[r, bins] = np.where(old, lt[r, best], seq_len) - t[:, 0]
        left_patches[r, bins] = np.where(old, lp[r, best], max_patches) - p[:, 0]
        opened[:a] += ~old
        chosen[j, :a] = bins
    return chosen, opened


def _groups(counts: np.ndarray) -> list[tuple[int, int]]:
    """Consecutive windows packed in lockstep, at most ``STATE_CELLS`` cells of (window, bin) state each."""
    out, start, widest = [], 0, 0
    for i, n in enumerate(counts.tolist()):
        if i > start and (i + 1 - start) * max(widest, n) > STATE_CELLS:
            out.append((start, i))
            start, widest = i, 0
        widest = max(widest, n)
    if start < len(counts):
        out.append((start, len(counts)))
    return out


def pack_pieces(
    window: np.ndarray, tokens: np.ndarray, patches: np.ndarray, num_windows: int, seq_len: int, max_patches: int
) -> PackedPieces:
    """Best-fit decreasing of pieces (piece ``j`` of ``tokens[j]`` positions and ``patches[j]`` patches, in window
    ``window[j]``, pieces given in position order: the tie break) into bins of ``seq_len`` positions and
    ``max_patches`` patches, window by window (see the module doc). Every piece must fit an empty bin."""
    window, tokens, patches = (np.asarray(x, np.int64) for x in (window, tokens, patches))
    if len(tokens) and (tokens.max() > seq_len or patches.max() > max_patches or tokens.min() < 1):
        raise ValueError(f"every piece must hold 1 to {seq_len} positions and at most {max_patches} patches")
    order = np.lexsort((np.arange(len(tokens)), -tokens, window))  # by window, largest first, then position
    per_window = np.bincount(window, minlength=num_windows)
    rank = np.arange(len(order)) - np.repeat(np.cumsum(per_window) - per_window, per_window)
    bin_of = np.zeros(len(order), np.int64)
    bins_per_window = np.zeros(num_windows, np.int64)
    starts = np.cumsum(per_window) - per_window
    for a, b in _groups(per_window):
        rows = a + np.argsort(-per_window[a:b], kind="stable")  # windows by piece count, descending
        depth = per_window[rows]
        grid_t = np.zeros((int(depth.max(initial=0)), b - a), np.int64)
        grid_p = np.zeros_like(grid_t)
        mine = order[starts[a] : starts[b - 1] + per_window[b - 1]] if b > a else order[:0]
        slot = np.empty(num_windows, np.int64)
        slot[rows] = np.arange(b - a)
        col, step = slot[window[mine]], rank[starts[a] : starts[a] + len(mine)]
        grid_t[step, col], grid_p[step, col] = tokens[mine], patches[mine]
        chosen, opened = _place(grid_t, grid_p, depth, seq_len, max_patches)
        bin_of[starts[a] : starts[a] + len(mine)] = chosen[step, col]
        bins_per_window[rows] = opened
    first_bin = np.cumsum(bins_per_window) - bins_per_window
    global_bin = first_bin[window[order]] + bin_of
    placed = np.lexsort((rank, global_bin))
    items_per_bin = np.bincount(global_bin, minlength=int(bins_per_window.sum()))
    return PackedPieces(bins_per_window, items_per_bin, order[placed])
