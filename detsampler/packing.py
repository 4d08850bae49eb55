"""Best-fit-decreasing packing of documents into bins of ``seq_len`` positions, window by window (numpy only).

A window is ``window_docs`` consecutive documents of the seeded document order. Each window is packed on its own, so any
range of windows can be packed by any process and the results concatenated: :func:`pack_windows` is a pure function of
(lengths, config, window range). :data:`PACKING_VERSION` names the algorithm; persisted packings include it in their
key.

The algorithm (version 1): a document longer than the capacity ``C`` is cut into full pieces of ``C`` (a bin each,
first, in document order) and a remainder; the remainders are taken largest first (ties by position in the window),
each put into the bin with the least remaining capacity that holds it (ties: the bin opened first), or into a new bin.

The implementation packs many windows at once, in lockstep: remainders above ``C / 2`` follow only larger ones, so each
opens its own bin, all at once; then step ``k`` places the ``k``-th of the others in every window, with numpy
operations over the windows. A window's state is, per remaining capacity ``r`` in ``[1, C]``, the number of its bins
with ``r`` left and the first of them, and a bitmap tree over ``r`` that finds the least ``r >= size`` in
``O(log_64 C)`` word operations: a few dozen array elements per document, no Python iteration.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["PACKING_VERSION", "Packed", "pack_best_fit", "pack_windows"]

# 1: best-fit decreasing per window, full pieces of documents longer than seq_len first, ties broken by position
PACKING_VERSION = 1
STATE_CELLS = 1 << 23  # windows packed in lockstep x (capacity + 1): bounds the state (two int32 per cell) to 64 MB
LOCKSTEP_DOCS = 1 << 19  # documents packed in lockstep at most (the step count is the largest window's)

_ONE = np.uint64(1)
_ALL = np.uint64(0xFFFF_FFFF_FFFF_FFFF)


@dataclass(frozen=True)
class Packed:
    """The packing of a range of windows: per window its number of bins, per bin its number of items, per item its
    document and piece (the piece ``p`` of document ``d`` is its positions ``[p*L, min((p+1)*L, lengths[d]+1))``)."""

    bins_per_window: np.ndarray  # int64
    items_per_bin: np.ndarray  # int64
    item_docs: np.ndarray  # int64
    item_pieces: np.ndarray  # uint32


def _exclusive(counts: np.ndarray) -> np.ndarray:
    """Where each run starts when runs of ``counts`` are laid end to end."""
    return np.cumsum(counts) - counts


def _order_by(major: np.ndarray, minor: np.ndarray, minor_bound: int) -> np.ndarray:
    """The stable order of ``(major, minor)`` (``0 <= minor < minor_bound``, both int64 >= 0): one sort of unique keys
    (fast) when they fit 63 bits, else a lexsort."""
    n = len(major)
    if not n or (int(major.max()) + 1) * minor_bound * n < 1 << 62:
        return np.argsort((major * minor_bound + minor) * n + np.arange(n))
    return np.lexsort((minor, major))


def _lowest_bit(words: np.ndarray) -> np.ndarray:
    """The index of the lowest set bit of each (nonzero) uint64 word."""
    low = words & (~words + _ONE)
    return np.frexp(low.astype(np.float64))[1] - 1  # powers of two are exact in float64 (0 gives -1)


class _SuccessorSets:
    """Per row, a set of integers in ``[0, size)`` with vectorized insert, remove and successor (least member >= x):
    a tree of 64-bit words, level 0 one bit per integer, each level above one bit per nonzero word below. Every
    operation takes rows ``0 .. len(values) - 1``, one value each."""

    def __init__(self, rows: int, size: int) -> None:
        self.levels: list[np.ndarray] = []  # flat: row r's words at [r * width, (r + 1) * width)
        self.bases: list[np.ndarray] = []
        self.widths: list[int] = []
        while True:
            size = -(-size // 64)
            self.levels.append(np.zeros(rows * size, np.uint64))
            self.bases.append(np.arange(rows, dtype=np.int64) * size)
            self.widths.append(size)
            if size == 1:
                return

    def update(self, values: np.ndarray, mask: np.ndarray, insert: bool) -> None:
        """Insert (or remove) ``values[i]`` in row ``i`` where ``mask[i]``."""
        cell = self.bases[0][: len(values)] + (values >> 6)
        bit = (_ONE << (values & 63).astype(np.uint64)) * mask
        before = self.levels[0][cell]
        after = before | bit if insert else before & ~bit
        self.levels[0][cell] = after
        # the level above changes only where a word became nonempty (insert) or empty (remove)
        rows = np.flatnonzero((before == 0) & mask if insert else (after == 0) & mask)
        values = values[rows] >> 6
        for level, base in zip(self.levels[1:], self.bases[1:]):
            if not rows.size:
                return
            cell = base[rows] + (values >> 6)
            bit = _ONE << (values & 63).astype(np.uint64)
            before = level[cell]
            after = before | bit if insert else before & ~bit
            level[cell] = after
            keep = before == 0 if insert else after == 0
            rows, values = rows[keep], values[keep] >> 6

    def assign(self, members: np.ndarray) -> None:
        """Make row ``r``'s set ``{v : members[r, v]}`` (a bool array of ``rows x size``), every row at once."""
        for level, width in zip(self.levels, self.widths):
            padded = np.zeros((len(members), 64 * width), bool)
            padded[:, : members.shape[1]] = members
            words = np.packbits(padded, axis=1, bitorder="little").view("<u8")  # bit k of word w: value 64 w + k
            level[:] = words.reshape(-1)
            members = words != 0

    def successor(self, values: np.ndarray) -> np.ndarray:
        """The least member ``>= values[i]`` of row ``i``'s set, or -1."""
        word = values >> 6
        bits = self.levels[0][self.bases[0][: len(values)] + word] & (_ALL << (values & 63).astype(np.uint64))
        out = (word << 6) + _lowest_bit(bits)  # wrong where bits == 0: those look further up
        miss = np.flatnonzero(bits == 0)
        if miss.size:
            out[miss] = self._successor_above(miss, word[miss] + 1)
        return out

    def _successor_above(self, rows: np.ndarray, values: np.ndarray) -> np.ndarray:
        """For rows whose word at level 0 holds nothing at or above the value: the least member in a later word (at
        level 0 bit position ``>= 64 * values[i]``), or -1."""
        out = np.full(len(rows), -1, np.int64)
        pending = np.arange(len(rows))
        for height in range(1, len(self.levels)):
            level, word = self.levels[height], values >> 6
            inside = word < self.widths[height]  # past this level's last word: nothing
            pending, rows, values, word = pending[inside], rows[inside], values[inside], word[inside]
            bits = level[self.bases[height][rows] + word] & (_ALL << (values & 63).astype(np.uint64))
            hit = bits != 0
            found, at = (word[hit] << 6) + _lowest_bit(bits[hit]), rows[hit]
            for below in range(height - 1, -1, -1):  # descend along the lowest set bits
                found = (found << 6) + _lowest_bit(self.levels[below][self.bases[below][at] + found])
            out[pending[hit]] = found
            pending, rows, values = pending[~hit], rows[~hit], word[~hit] + 1
            if not pending.size:
                break
        return out


class _Bins:
    """The bins of ``rows`` windows packed in lockstep (see the module doc), flat arrays by row: remaining capacity per
    bin, and per capacity value its number of bins, its least bin (-1 once that bin left: found again, by a scan of
    the row, only if the bucket is chosen again) and membership in a successor set. Every step
    places one item in each of rows ``0 .. k - 1``. Capacity value 0 is no bucket (a full bin takes nothing more): the
    cell ``(row, 0)`` is scratch, written by rows that have nothing to write."""

    def __init__(self, rows: int, max_bins: int, capacity: int) -> None:
        self.capacity, self.width, self.max_bins = capacity, capacity + 1, max(max_bins, 1)
        self.remaining = np.full(rows * self.max_bins, -1, np.int32)
        self.bin_base = np.arange(rows, dtype=np.int64) * self.max_bins
        self.opened = np.zeros(rows, np.int64)
        self.count = np.zeros(rows * self.width, np.int32)
        self.first = np.zeros(rows * self.width, np.int32)
        self.cell_base = np.arange(rows, dtype=np.int64) * self.width
        self.nonempty = _SuccessorSets(rows, self.width)

    def open_first(self, rows: np.ndarray, bins: np.ndarray, left: np.ndarray) -> None:
        """Before any step: open bin ``bins[i]`` of row ``rows[i]`` with ``left[i] > 0`` capacity left (each row's
        bins ``0 .. m - 1``, in order of ``bins`` within a row)."""
        self.opened = np.bincount(rows, minlength=len(self.opened)).astype(np.int64)
        self.remaining[self.bin_base[rows] + bins] = left
        cells = self.cell_base[rows] + left
        self.count[:] = np.bincount(cells, minlength=len(self.count))
        self.first[cells] = np.iinfo(self.first.dtype).max
        np.minimum.at(self.first, cells, bins)  # each bucket's least bin
        self.nonempty.assign(self.count.reshape(len(self.opened), self.width) > 0)

    def place(self, sizes: np.ndarray) -> np.ndarray:
        """Put item ``sizes[i]`` into row ``i``'s best bin (a new one if none holds it); returns the bins chosen."""
        k = len(sizes)
        fit = self.nonempty.successor(sizes)
        old = fit >= 0
        cell = self.cell_base[:k] + np.maximum(fit, 0)
        opened = self.opened[:k]
        bins = np.where(old, self.first[cell], opened)
        unknown = np.flatnonzero(bins < 0)  # a bucket that lost its first bin: its least bin, found now
        if unknown.size:
            width = int(opened[unknown].max())
            remaining = self.remaining.reshape(-1, self.max_bins)[unknown, :width]
            bins[unknown] = np.argmax(remaining == fit[unknown, None], axis=1)
        opened += ~old
        left = np.where(old, fit, self.capacity) - sizes
        self.remaining[self.bin_base[:k] + bins] = left
        self._leave(cell, fit, old)
        self._enter(left, bins)
        return bins

    def _leave(self, cell: np.ndarray, fit: np.ndarray, old: np.ndarray) -> None:
        """Row ``i``'s bin left bucket ``fit[i]`` where ``old[i]`` (its remaining capacity already updated)."""
        count = self.count[cell] - old
        self.count[cell] = count
        self.nonempty.update(np.maximum(fit, 0), old & (count == 0), insert=False)
        self.first[cell] = np.where(old, -1, self.first[cell])  # unknown until the bucket is chosen again

    def _enter(self, left: np.ndarray, bins: np.ndarray) -> None:
        cell = self.cell_base[: len(left)] + left
        count = self.count[cell]
        keep = left > 0
        self.first[cell] = np.where(count == 0, bins, np.minimum(self.first[cell], bins))
        self.count[cell] = count + keep
        self.nonempty.update(left, keep & (count == 0), insert=True)


def _remainders_by_window(window: np.ndarray, rest: np.ndarray, num_windows: int):
    """The documents with a remainder, ordered by (window, remainder descending, position); each one's window and rank
    in it (its placement order), and the number per window."""
    items = np.flatnonzero(rest)
    capacity = int(rest.max(initial=0)) + 1
    items = items[_order_by(window[items], capacity - rest[items], capacity + 1)]
    per_window = np.bincount(window[items], minlength=num_windows)
    rank = np.arange(len(items)) - np.repeat(_exclusive(per_window), per_window)
    return items, window[items], rank, per_window


def _assign(window: np.ndarray, rest: np.ndarray, num_windows: int, capacity: int):
    """Best-fit decreasing of the remainders ``rest`` of the documents of ``num_windows`` windows (document ``i`` in
    window ``window[i]``), all windows in lockstep. Returns the items (documents), each one's bin in its window and
    rank (placement order), and the packed bins of each window.

    A remainder above ``capacity / 2`` follows only larger ones, so no open bin holds it: those open their bins
    at once; the others are placed one step per rank, in every window at once (windows ordered by steps needed)."""
    items, item_window, rank, per_window = _remainders_by_window(window, rest, num_windows)
    sizes = rest[items]
    large = np.bincount(item_window, weights=2 * sizes > capacity, minlength=num_windows).astype(np.int64)
    steps = per_window - large
    order = np.argsort(-steps, kind="stable")
    row_of = np.empty(num_windows, np.int64)
    row_of[order] = np.arange(num_windows)
    rows, step = row_of[item_window], rank - large[item_window]
    bins = _Bins(num_windows, int(per_window.max(initial=0)), capacity)
    chosen = rank.copy()  # the large ones open bins 0, 1, ... of their window
    first = step < 0
    bins.open_first(rows[first], rank[first], capacity - sizes[first])
    depth = int(steps.max(initial=0))
    grid = np.zeros((depth, num_windows), np.int64)  # step-major: the rows placing an item at step j are a prefix
    grid[step[~first], rows[~first]] = sizes[~first]
    placed = np.zeros((depth, num_windows), np.int64)
    active = num_windows - np.searchsorted(steps[order][::-1], np.arange(depth), side="right")
    for j in range(depth):
        placed[j, : active[j]] = bins.place(grid[j, : active[j]])
    chosen[~first] = placed[step[~first], rows[~first]]
    return items, chosen, rank, bins.opened[row_of]


def _pack_group(window: np.ndarray, extents: np.ndarray, num_windows: int, capacity: int):
    """The packing of ``num_windows`` windows (document ``i`` of extent ``extents[i]`` in window ``window[i]``):
    ``(bins_per_window, items_per_bin, item_index, item_pieces)``, items indexing the documents."""
    full = extents // capacity
    rest = extents - full * capacity
    items, item_bin, rank, packed_bins = _assign(window, rest, num_windows, capacity)
    full_bins = np.bincount(window, weights=full, minlength=num_windows).astype(np.int64)
    bins_per_window = full_bins + packed_bins
    first_bin = _exclusive(bins_per_window)
    # full pieces: a bin each, in document order, then the packed bins in the order they were opened
    full_docs = np.repeat(np.arange(len(extents)), full)
    full_start = _exclusive(full)
    piece = np.arange(len(full_docs)) - np.repeat(full_start, full)
    full_window_start = _exclusive(full_bins)
    full_gbin = first_bin[window[full_docs]] + np.arange(len(full_docs)) - np.repeat(full_window_start, full_bins)
    packed_gbin = first_bin[window[items]] + full_bins[window[items]] + item_bin
    gbin = np.concatenate([full_gbin, packed_gbin])
    order = _order_by(gbin, np.concatenate([np.zeros(len(full_docs), np.int64), rank]), len(extents) + 1)
    docs = np.concatenate([full_docs, items])[order]
    pieces = np.concatenate([piece, full[items]])[order]
    items_per_bin = np.bincount(gbin, minlength=int(bins_per_window.sum()))
    return bins_per_window, items_per_bin, docs, pieces


def pack_best_fit(extents: np.ndarray, capacity: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Best-fit-decreasing packing of documents of ``extents`` positions into bins of ``capacity`` (one window; see the
    module doc). Returns ``(bin_offsets, item_docs, item_starts, item_stops)``: bin ``b`` holds items
    ``bin_offsets[b]:bin_offsets[b+1]``, ``item_docs`` indexing into ``extents``."""
    extents = np.asarray(extents, dtype=np.int64)
    _, per_bin, docs, pieces = _pack_group(np.zeros(len(extents), np.int64), extents, 1, capacity)
    bin_offsets = np.zeros(len(per_bin) + 1, dtype=np.int64)
    np.cumsum(per_bin, out=bin_offsets[1:])
    starts = pieces * capacity
    return bin_offsets, docs, starts, np.minimum(starts + capacity, extents[docs])


def _groups(sizes: list[int], capacity: int) -> list[tuple[int, int]]:
    """Consecutive windows packed in lockstep: at most STATE_CELLS state cells and about LOCKSTEP_DOCS documents."""
    most = max(1, STATE_CELLS // (capacity + 1))
    out, start, docs = [], 0, 0
    for i, n in enumerate(sizes):
        if i > start and (i - start >= most or docs + n > LOCKSTEP_DOCS):
            out.append((start, i))
            start, docs = i, 0
        docs += n
    if start < len(sizes):
        out.append((start, len(sizes)))
    return out


def pack_windows(
    window_docs: list[np.ndarray] | tuple[np.ndarray, ...],
    extents: list[np.ndarray] | tuple[np.ndarray, ...],
    seq_len: int,
) -> Packed:
    """Pack each window (its document ids and their extents, ``lengths + 1``) by best-fit decreasing (see the module
    doc), many windows in lockstep; the windows' packings concatenated."""
    parts: list[tuple] = []
    for a, b in _groups([len(e) for e in extents], seq_len):
        ext = [np.asarray(e, dtype=np.int64) for e in extents[a:b]]
        window = np.repeat(np.arange(b - a), [len(e) for e in ext])
        flat = np.concatenate(ext) if ext else np.zeros(0, np.int64)
        ids = np.concatenate([np.asarray(d, dtype=np.int64) for d in window_docs[a:b]]) if ext else flat
        bins, per_bin, items, pieces = _pack_group(window, flat, b - a, seq_len)
        parts.append((bins, per_bin, ids[items], pieces.astype(np.uint32)))
    cat = lambda i, dt: np.concatenate([p[i] for p in parts]).astype(dt) if parts else np.zeros(0, dt)
    return Packed(cat(0, np.int64), cat(1, np.int64), cat(2, np.int64), cat(3, np.uint32))
