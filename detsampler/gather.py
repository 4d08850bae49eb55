"""Reading a batch of samples' spans into the packed dataset's four fields in one vectorized pass (numpy only).

Given :class:`~detsampler.layout.Spans` for B samples and, per span, where its document's tokens start in a flat token
array and how many tokens the document has, :func:`pack_fields` lays the spans' positions out in ``[B, sample_len]``
rows: position ``lengths[d]`` of document ``d`` reads ``eos_id`` (the EOS is virtual, never stored), or with
``eos_stored`` the stored token there (the document's own last token: a real EOS, or a pre-tokenized corpus's
separator); cells after a sample's last span are padding (``pad_id``, document -1). tests/gather_reference.py holds the
straightforward form it must equal, tests/pack_reference.py the per-span path it replaced (equal byte for byte, masks
included: tests/test_pack_pass.py).

The pass: every quantity is computed over arrays of spans (:class:`Cells`); the batch's stored tokens are copied in
one ``bytes.join`` of memory views of the token array, one slice per span and one of a small constant buffer for each
virtual EOS and each run of padding, so that the joined bytes are the whole ``[B, sample_len]`` grid in the stored
dtype; the four int64 fields are each written from that grid, the pieces' documents and restarting positions by one
``np.repeat`` (or a slice per piece when there are few). A stored loss mask is joined the same way, from the same
element ranges. Nothing is done per token in Python; per span, two memory-view slices.
"""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

import numpy as np

from detsampler.layout import Spans
from detsampler.ranges import concat_ranges

__all__ = ["FIELDS", "IGNORE_INDEX", "Cells", "lay_out", "pack_fields", "pack_tokens", "token_ranges"]

FIELDS = ("input_ids", "labels", "position_ids", "document_ids")
IGNORE_INDEX = -100  # the label of a position that has no next token to predict
_FEW_PIECES = 4  # up to this many spans, a slice write per piece beats a whole-grid np.repeat


def _check_spans(spans: Spans, per_sample: np.ndarray, sample_len: int, doc_lengths: np.ndarray) -> None:
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
        _check_spans(spans, per_sample, sample_len, doc_lengths)
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


def _fits(value: int, dtype: np.dtype) -> bool:
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


def _joined(flat, cells: Cells, eos_value: int, fill: int, writable: bool = False) -> np.ndarray:
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


def _token_grid(cells: Cells, flat, eos_id: int, pad_id: int) -> tuple[np.ndarray, bool]:
    """``[B, sample_len]`` tokens (the stored dtype, or int64 where ``eos_id`` does not fit it) and whether the padding
    cells already hold ``pad_id``."""
    dtype = flat.dtype if isinstance(flat, np.ndarray) else np.dtype(getattr(flat, "dtype", np.int64))
    if not _fits(eos_id, dtype):
        flat, dtype = _widened(flat, cells), np.dtype(np.int64)
        cells = _restarted(cells)
    padded = _fits(pad_id, dtype)
    grid = _joined(flat, cells, eos_id, pad_id if padded else 0)
    return grid.reshape(cells.num_samples, cells.sample_len), padded


def _widened(flat, cells: Cells) -> np.ndarray:
    """The elements the spans read, as int64, in span order (for an EOS id the stored dtype cannot hold)."""
    keep = cells.reads > 0
    return np.asarray(flat[concat_ranges(cells.src[keep], cells.reads[keep])[0]], dtype=np.int64)


def _restarted(cells: Cells) -> Cells:
    src = np.zeros(cells.reads.size, dtype=np.int64)
    np.cumsum(cells.reads[:-1], out=src[1:])
    return cells._replace(src=src)


@lru_cache(maxsize=16)
def _ramp(n: int) -> np.ndarray:
    """``arange(n)`` (int64, read-only), made once per length."""
    out = np.arange(n, dtype=np.int64)
    out.setflags(write=False)
    return out


def _padding(first: np.ndarray, value: int, grid: np.ndarray) -> None:
    """``grid[i, first[i]:] = value`` for each row with ``first[i] < width`` (``grid``: ``[B, width]``): a slice per
    such row (cheaper than a whole-grid masked write even with every row padded: tests/benchmarks/bench_loader.py)."""
    width = grid.shape[1]
    for i in np.flatnonzero(first < width).tolist():
        grid[i, max(int(first[i]), 0) :] = value


def _pieces(cells: Cells, doc_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The pieces that tile the flattened grid, in order: ``(length, document)`` (-1 on padding)."""
    doc_ids = doc_ids.astype(np.int64, copy=False)
    if not cells.padded:
        return cells.length, doc_ids
    n = cells.length.size
    length, doc = np.empty(2 * n + 1, dtype=np.int64), np.full(2 * n + 1, -1, dtype=np.int64)
    length[0], length[1::2], length[2::2] = cells.lead, cells.length, cells.gap
    doc[1::2] = doc_ids
    return length, doc


def _write_pieces(cells: Cells, doc_ids: np.ndarray, document_ids: np.ndarray, position_ids: np.ndarray | None) -> None:
    """Each piece's document into ``document_ids`` (``[B, L]``, the first ``L`` columns of each ``sample_len`` row)
    and, given ``position_ids``, the positions within it (restarting at each piece; padding is fixed by the caller)."""
    B, width, sample_len = cells.num_samples, document_ids.shape[1], cells.sample_len
    if cells.length.size <= _FEW_PIECES:  # the spans alone (each within a row); padding: -1 by row suffixes
        ramp = _ramp(width)
        for g, m, d in zip(cells.begin.tolist(), cells.length.tolist(), doc_ids.tolist()):
            row, col = divmod(g, sample_len)
            stop = min(col + m, width)
            if col < stop:
                document_ids[row, col:stop] = d
                if position_ids is not None:
                    position_ids[row, col:stop] = ramp[: stop - col]
        if cells.padded:
            _padding(cells.per_sample, -1, document_ids)
        return
    length, doc = _pieces(cells, doc_ids)
    whole = sample_len == width  # the grid is the fields' own shape: write through flat views, no temporary
    if whole:
        document_ids.reshape(-1)[:] = np.repeat(doc, length)
    else:
        document_ids[:] = np.repeat(doc, length).reshape(B, sample_len)[:, :width]
    if position_ids is not None:
        begin = np.empty(length.size, dtype=np.int64)
        begin[0] = 0
        np.add.accumulate(length[:-1], out=begin[1:])
        if whole:
            np.subtract(_ramp(B * sample_len), np.repeat(begin, length), out=position_ids.reshape(-1))
        else:
            within = _ramp(B * sample_len) - np.repeat(begin, length)
            position_ids[:] = within.reshape(B, sample_len)[:, :width]


def _check_out(out: np.ndarray, shape: tuple[int, ...], what: str) -> None:
    if out.shape != shape or not out.flags.c_contiguous:
        raise ValueError(f"{what} must be a C-contiguous array of shape {shape}, got shape {out.shape}")


def pack_fields(
    spans: Spans,
    seq_len: int,
    sample_len: int,
    doc_starts: np.ndarray,
    doc_lengths: np.ndarray,
    read,
    *,
    eos_id: int,
    pad_id: int,
    eos_stored: bool,
    labels_cross_documents: bool,
    restart_position_ids: bool,
    out: np.ndarray,
    mask_out: np.ndarray | None = None,
    mask_read=None,
    mask_eos: int = 0,
    mask_examples: bool = False,
    mask_labels: bool = False,
) -> np.ndarray:
    """Write the four :data:`FIELDS` of the samples of ``spans`` into ``out`` (int64 C-contiguous ``[4, B,
    seq_len]``); the values are exactly those tests/gather_reference.py's ``gather_spans`` lays out, turned into fields
    as the packed dataset defines them: ``concat`` (``labels_cross_documents``, ``sample_len == seq_len + 1``) shifts
    one window into inputs and labels; otherwise (``sample_len == seq_len``) each span's last position and padding get
    :data:`IGNORE_INDEX`. ``read(starts, stops)`` returns the flat token array, having checked whatever it guards for
    those element ranges (the only ones read).

    With ``mask_read`` (a reader of the same form for an array aligned with the tokens: a loss mask), its values are
    laid out cell for cell as the tokens (a virtual EOS reads ``mask_eos``, padding 0), into ``mask_out`` when given
    (C-contiguous ``[B, sample_len]``, any integer dtype). With ``mask_examples`` (each document is an example: chat
    data), a document's first position reads 0 there: no label that the mask keeps predicts an example's first token,
    so none crosses from one example into the next, whatever the layout (``concat`` included). With ``mask_labels``
    the labels are masked in the same pass: a label is :data:`IGNORE_INDEX` wherever the mask at the position it
    predicts is 0 (any other value trains), so that the loss mask is ``labels != IGNORE_INDEX``.

    Cost: :func:`lay_out` (a dozen calls over arrays of spans), one ``bytes.join`` of a memory-view slice per span and
    one per virtual EOS or run of padding (and as many for the mask), one widening copy per field from the joined grid
    (with ``mask_labels``, a multiply-add for the labels instead), the pieces' documents and positions by one
    ``np.repeat`` each (a slice per span when there are at most four), padding by a slice per padded row: nothing per
    token in Python.
    """
    num_samples, L = len(spans), seq_len
    if sample_len != L + int(bool(labels_cross_documents)):
        raise ValueError(
            f"sample_len={sample_len} with seq_len={L}: a concat sample holds seq_len + 1 positions, any other seq_len"
        )
    _check_out(out, (len(FIELDS), num_samples, L), "out")
    cells = lay_out(spans, sample_len, doc_starts, doc_lengths, eos_stored)
    flat = read(cells.src, cells.src + cells.reads)
    mask = _mask_cells(cells, spans, mask_read, mask_out, mask_eos, mask_examples, mask_labels)
    tokens, padded = _token_grid(cells, flat, eos_id, pad_id)
    keep = None if mask is None or not mask_labels else mask != 0
    input_ids, labels, position_ids, document_ids = out
    if labels_cross_documents:
        input_ids[:] = tokens[:, :L]
        _write_labels(labels, tokens[:, 1:], None if keep is None else keep.reshape(num_samples, sample_len)[:, 1:])
    else:
        input_ids[:] = tokens
        flat_labels = labels.reshape(-1)
        _write_labels(flat_labels[:-1], tokens.reshape(-1)[1:], None if keep is None else keep[1:])
        flat_labels[-1] = IGNORE_INDEX
        ends = cells.begin + cells.length - 1
        flat_labels[ends[cells.length > 0]] = IGNORE_INDEX  # each span's last cell
    _write_pieces(cells, spans.doc_ids, document_ids, position_ids if restart_position_ids else None)
    if not restart_position_ids:
        position_ids[:] = _ramp(L)
    if cells.padded:
        first = cells.per_sample
        if not padded:
            _padding(first, pad_id, input_ids)
        _padding(first - int(bool(labels_cross_documents)), IGNORE_INDEX, labels)
        if restart_position_ids:
            _padding(first, 0, position_ids)
    return out


def _write_labels(labels: np.ndarray, tokens: np.ndarray, keep: np.ndarray | None) -> None:
    """``labels[:] = tokens`` (the next positions' tokens), and :data:`IGNORE_INDEX` where ``keep`` (bool, optional)
    is False: ``(tokens + 100) * keep - 100`` in int64, three passes and no masked write (a boolean-mask assignment
    costs twice as much on a mask of trained and untrained runs)."""
    if keep is None:
        labels[:] = tokens
        return
    np.add(tokens, -IGNORE_INDEX, out=labels, dtype=np.int64)
    np.multiply(labels, keep, out=labels)
    labels += IGNORE_INDEX


def _mask_cells(
    cells: Cells, spans: Spans, mask_read, mask_out: np.ndarray | None, mask_eos: int, examples: bool, labels: bool
) -> np.ndarray | None:
    """The mask values of the cells (flat ``[B * sample_len]``, writable; a virtual EOS reads ``mask_eos``, padding 0;
    with ``examples`` a document's first position 0), read once right after the tokens and laid out in ``mask_out``
    when given; None without ``mask_read``."""
    if mask_read is None:
        if mask_out is not None or labels:
            raise ValueError("mask_out and mask_labels come with mask_read")
        return None
    if mask_out is None and not labels:
        raise ValueError("mask_read comes with mask_out or mask_labels")
    if mask_out is not None:
        _check_out(mask_out, (cells.num_samples, cells.sample_len), "mask_out")
    mask = _joined(mask_read(cells.src, cells.src + cells.reads), cells, int(mask_eos), 0, writable=True)
    if examples:
        # NOTE: a document's first token has nothing of its own document before it: as a target it could only be
        # predicted from another example (concat's label at the previous example's EOS), so it is never trained
        mask[cells.begin[(spans.starts == 0) & (cells.length > 0)]] = 0
    if mask_out is not None:
        mask_out.reshape(-1)[:] = mask
    return mask


def pack_tokens(
    spans: Spans,
    sample_len: int,
    doc_starts: np.ndarray,
    doc_lengths: np.ndarray,
    read,
    *,
    eos_id: int,
    eos_stored: bool,
    out: np.ndarray,
    mask_out: np.ndarray | None = None,
    mask_read=None,
    mask_eos: int = 0,
    mask_examples: bool = False,
) -> np.ndarray:
    """Write the token ids of the samples of ``spans`` into ``out`` (``[B, sample_len]``, an integer dtype that holds
    every id): the positions :func:`pack_fields` lays out before it derives the fields (for ``concat`` its inputs are
    ``out[:, :-1]`` and its labels ``out[:, 1:]``). Every sample must fill its ``sample_len`` positions (a ``concat``
    sample always does): there is no padding to mark without the other fields.

    Cost: :func:`lay_out`, one ``bytes.join`` of the spans' stored tokens and one copy into ``out``; no other
    whole-grid pass. ``mask_out`` / ``mask_read`` / ``mask_eos`` / ``mask_examples``: as for :func:`pack_fields`.
    """
    cells = lay_out(spans, sample_len, doc_starts, doc_lengths, eos_stored)
    short = cells.per_sample < sample_len
    if short.any():
        raise ValueError(
            f"sample {int(np.argmax(short))} of the batch holds {int(cells.per_sample[short][0])} positions, fewer than"
            f" sample_len={sample_len}: token ids alone cannot mark its padding (read the four fields instead)"
        )
    if not out.flags.c_contiguous:
        raise ValueError("out must be C-contiguous: its rows are written through one flat view")
    flat = read(cells.src, cells.src + cells.reads)
    _mask_cells(cells, spans, mask_read, mask_out, mask_eos, mask_examples, False)
    tokens, _ = _token_grid(cells, flat, eos_id, 0)
    out.reshape(-1)[:] = tokens.reshape(-1)
    return out
