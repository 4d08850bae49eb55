"""Where a micro batch's spans fall in its ``[B, sample_len]`` grid, and the grid of one array's values read from them
in one ``bytes.join`` (numpy only): the part of the read path that :mod:`detsampler.gather` shares between the token
ids and a loss mask.

:func:`lay_out` computes :class:`Cells` over arrays of spans (a dozen numpy calls, whatever their number);
:func:`joined` copies what the spans read of a flat array by joining memory views of it, one slice per span and one of a
small constant buffer for each virtual EOS and each run of padding, so that the joined bytes are the whole grid in the
array's dtype: per span, one memory-view slice in Python and nothing per element. (A slice assignment per span costs
1.2x as much at 12 spans a batch and 2.5x at 80; a fancy-index gather of every element's address, 8x at 12 spans:
docs/design.md, "The read path at its floor".)
"""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

import numpy as np

from detsampler.ranges import concat_ranges
from detsampler.spans import Spans

__all__ = ["Cells", "check_spans", "fits", "joined", "lay_out", "restarted", "token_ranges", "widened"]


def check_spans(spans: Spans, per_sample: np.ndarray, sample_len: int, doc_lengths: np.ndarray) -> None:
    if per_sample.size and int(per_sample.max()) > sample_len:
        raise ValueError(f"a sample spans {int(per_sample.max())} positions, more than sample_len={sample_len}")
    past_eos = spans.stops > doc_lengths + 1
    if past_eos.any():
        j = int(np.argmax(past_eos))
        raise ValueError(
            f"span of document {int(spans.doc_ids[j])} reaches position {int(spans.stops[j]) - 1}, but the document has"
            f" only {int(doc_lengths[j])} tokens and an EOS: the layout does not match the index"
        )


class Cells(NamedTuple):
    """Where a batch's spans fall in the flattened ``[B, sample_len]`` grid and what each reads of the flat token
    array (int64, one value per span unless said otherwise).

    Invariant: the cells ``[begin[j], begin[j] + length[j])`` of the spans and the ``gap[j]`` padding cells after each
    (and ``lead`` before the first) tile the grid in order; span ``j`` reads ``reads[j]`` stored elements from
    ``src[j]`` and, where ``eos[j]``, a virtual EOS after them (``length == reads + eos``)."""

    num_samples: int
    sample_len: int
    src: np.ndarray
    reads: np.ndarray
    eos: np.ndarray | None  # bool; None: no span ends at a virtual EOS
    begin: np.ndarray
    length: np.ndarray
    gap: np.ndarray | None  # None: no padding anywhere
    lead: int
    per_sample: np.ndarray  # positions each sample holds

    @property
    def padded(self) -> bool:
        return self.gap is not None


def token_ranges(
    spans: Spans, doc_starts: np.ndarray, doc_lengths: np.ndarray, eos_stored: bool
) -> tuple[np.ndarray, np.ndarray]:
    """What a batch reads of the flat token array: span ``j`` reads elements ``[src[j], src[j] + reads[j])`` (int64;
    ``reads[j]`` may be 0: a span of a virtual EOS alone). Exactly the reads :func:`pack_fields` and :func:`pack_tokens`
    make (the same :func:`lay_out`), so an exact prefetcher (:mod:`detsampler.reads`) knows them beforehand."""
    doc_starts = np.asarray(doc_starts, dtype=np.int64)
    doc_lengths = np.asarray(doc_lengths, dtype=np.int64)
    reads = np.maximum(np.minimum(spans.stops, doc_lengths + int(eos_stored)) - spans.starts, 0)
    return doc_starts + spans.starts, reads.astype(np.int64, copy=False)


def lay_out(spans: Spans, sample_len: int, doc_starts: np.ndarray, doc_lengths: np.ndarray, eos_stored: bool) -> Cells:
    """The :class:`Cells` of ``spans`` (checked against ``sample_len`` and the documents' lengths): about a dozen
    numpy calls over arrays of spans, whatever their number."""
    doc_lengths = np.asarray(doc_lengths, dtype=np.int64)
    starts, stops = spans.starts, spans.stops
    length = stops - starts
    cum = np.empty(length.size + 1, dtype=np.int64)
    cum[0] = 0
    np.add.accumulate(length, out=cum[1:])  # NOTE: ufunc methods, not np.cumsum / ndarray.max: a µs less per call
    first = cum[spans.offsets]
    per_sample = first[1:] - first[:-1]
    over = stops - doc_lengths  # 1: the span ends at its document's EOS; more: past it
    top = int(np.maximum.reduce(over)) if over.size else 0
    widest = int(np.maximum.reduce(per_sample)) if per_sample.size else 0
    if top > 1 or widest > sample_len:
        check_spans(spans, per_sample, sample_len, doc_lengths)
    src = np.asarray(doc_starts, dtype=np.int64) + starts
    eos = None if eos_stored or top < 1 else over > 0
    reads = length if eos is None else length - eos  # a span never passes its document's stored last token
    num_samples = len(spans)
    cells = num_samples * sample_len
    if int(first[-1]) == cells:  # every sample holds at most sample_len positions, so each holds exactly that many
        return Cells(num_samples, sample_len, src, reads, eos, cum[:-1], length, None, 0, per_sample)
    # each sample's spans start at its row: shift them by the row's start less the cells before it
    shift = np.arange(0, cells, sample_len, dtype=np.int64) - first[:-1]
    begin = cum[:-1] + np.repeat(shift, spans.offsets[1:] - spans.offsets[:-1])
    gap = np.empty(length.size, dtype=np.int64)
    ends = begin + length
    gap[:-1] = begin[1:] - ends[:-1]
    if length.size:
        gap[-1] = cells - ends[-1]
    lead = int(begin[0]) if length.size else cells
    return Cells(num_samples, sample_len, src, reads, eos, begin, length, gap, lead, per_sample)


@lru_cache(maxsize=32)
def _fillers(dtype: np.dtype, eos: int, fill: int, size: int) -> memoryview:
    """A read-only memory view of ``[eos, fill, fill, ...]`` (``size + 1`` elements of ``dtype``): the bytes a
    virtual EOS and the padding after it are joined from."""
    buf = np.full(size + 1, fill, dtype=dtype)
    buf[0] = eos
    buf.setflags(write=False)
    return memoryview(buf)


def fits(value: int, dtype: np.dtype) -> bool:
    """Whether ``dtype`` holds ``value`` exactly."""
    low, high = _bounds(np.dtype(dtype))
    return low <= value <= high


@lru_cache(maxsize=32)
def _bounds(dtype: np.dtype) -> tuple[float, float]:
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return info.min, info.max
    if dtype.kind == "f":
        return float("-inf"), float("inf")
    return 0, 1 if dtype.kind == "b" else 0


def joined(flat, cells: Cells, eos_value: int, fill: int, writable: bool = False) -> np.ndarray:
    """The ``num_samples * sample_len`` cells of the grid in ``flat``'s dtype (read-only unless ``writable``): each
    span's stored
    elements, ``eos_value`` at a virtual EOS, ``fill`` on padding; one ``bytes.join`` of memory views, a slice per span
    and one per virtual EOS or run of padding. ``flat``: a 1-D array, or anything that takes an integer index array
    (e.g. a sharded array: then one gather of the spans' elements first)."""
    src, reads = cells.src, cells.reads
    if not (isinstance(flat, np.ndarray) and flat.ndim == 1 and flat.flags.c_contiguous):
        keep = reads > 0  # one call that takes every element read, in span order
        flat = np.ascontiguousarray(flat[concat_ranges(src[keep], reads[keep])[0]])
        src = np.zeros(reads.size, dtype=np.int64)
        np.cumsum(reads[:-1], out=src[1:])
    view = memoryview(flat.view(np.ndarray) if isinstance(flat, np.memmap) else flat)
    pairs = zip(src.tolist(), (src + reads).tolist())
    if cells.eos is None and not cells.padded:
        parts = [view[a:b] for a, b in pairs]
    else:
        parts = _with_fillers(view, pairs, cells, _fillers(flat.dtype, eos_value, fill, _longest_gap(cells)))
    out = np.frombuffer((bytearray() if writable else b"").join(parts), dtype=flat.dtype)
    if out.size != cells.num_samples * cells.sample_len:
        raise ValueError(
            f"the batch's reads give {out.size} cells, its grid has {cells.num_samples * cells.sample_len}: the"
            " token array returned by read is shorter than the ranges asked"
        )
    return out


def _longest_gap(cells: Cells) -> int:
    """The size of the filler buffer: a power of two above the longest run of padding (few distinct sizes)."""
    longest = max(cells.lead, int(cells.gap.max()) if cells.padded and cells.gap.size else 0)
    return 1 << max(longest, 1).bit_length()


def _with_fillers(view: memoryview, pairs, cells: Cells, fillers: memoryview) -> list:
    """The memory views to join: each span's elements, then its virtual EOS (``fillers[0]``) and the padding after it
    (``fillers[1:]``), the padding before the first span first."""
    eos = [False] * cells.reads.size if cells.eos is None else cells.eos.tolist()
    parts = []
    add = parts.append
    if not cells.padded:
        eos_piece = fillers[0:1]
        for (a, b), e in zip(pairs, eos):
            add(view[a:b])
            if e:
                add(eos_piece)
        return parts
    if cells.lead:
        add(fillers[1 : 1 + cells.lead])
    for (a, b), e, g in zip(pairs, eos, cells.gap.tolist()):
        add(view[a:b])
        if e or g:
            add(fillers[1 - e : 1 + g])
    return parts


def widened(flat, cells: Cells) -> np.ndarray:
    """The elements the spans read, as int64, in span order (for an EOS id the stored dtype cannot hold)."""
    keep = cells.reads > 0
    return np.asarray(flat[concat_ranges(cells.src[keep], cells.reads[keep])[0]], dtype=np.int64)


def restarted(cells: Cells) -> Cells:
    src = np.zeros(cells.reads.size, dtype=np.int64)
    np.cumsum(cells.reads[:-1], out=src[1:])
    return cells._replace(src=src)
