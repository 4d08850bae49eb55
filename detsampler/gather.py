"""Reading the tokens of a batch of samples' spans at once (numpy only): one fancy-index gather, no per-token Python.

Given :class:`~detsampler.layout.Spans` for B samples and, per span, where its document's tokens start in a flat token
array and how many tokens the document has, :func:`gather_spans` lays the spans' positions out in a ``[B, sample_len]``
grid: position ``lengths[d]`` of document ``d`` reads ``eos_id`` (the EOS is virtual, never stored), or with
``eos_stored`` the stored token there (the document's own last token: a real EOS, or a pre-tokenized corpus's
separator); cells after a sample's last span are padding (``pad_id``, document -1).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from detsampler.layout import Spans

__all__ = ["FIELDS", "IGNORE_INDEX", "Gathered", "gather_spans", "pack_fields"]

FIELDS = ("input_ids", "labels", "position_ids", "document_ids")
IGNORE_INDEX = -100  # the label of a position that has no next token to predict
_FEW_SPANS = 64  # at least this many cells per span on average: a slice copy per span beats building addresses


@dataclass(frozen=True)
class Gathered:
    """Per cell of a ``[B, sample_len]`` grid: the token, its document (-1 on padding), its position within its span,
    whether it is the last position of its span, and whether it holds a token at all (cells fill each row from the
    left).
    """

    tokens: np.ndarray  # int64, pad_id on padding
    doc_ids: np.ndarray  # int64, -1 on padding
    span_positions: np.ndarray  # int64, 0 on padding
    last_in_span: np.ndarray  # bool
    valid: np.ndarray  # bool
    full: bool  # every cell holds a token (no padding anywhere)


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


def _into_grid(values: np.ndarray, valid: np.ndarray | None, shape: tuple[int, int], fill: int | bool) -> np.ndarray:
    """``values`` (the filled cells of all rows, row-major) laid into the grid, ``fill`` elsewhere; no copy when every
    row is full (``valid`` None)."""
    if valid is None:
        return values.reshape(shape)
    grid = np.full(shape, fill, dtype=values.dtype)
    grid[valid] = values
    return grid


def gather_spans(
    spans: Spans,
    sample_len: int,
    doc_starts: np.ndarray,
    doc_lengths: np.ndarray,
    flat_tokens: np.ndarray,
    eos_id: int,
    pad_id: int,
    eos_stored: bool = False,
) -> Gathered:
    """The tokens of ``spans``: span ``j`` reads ``flat_tokens[doc_starts[j] + p]`` for its positions ``p <
    doc_lengths[j]`` and ``eos_id`` at ``p == doc_lengths[j]`` (with ``eos_stored``, ``flat_tokens[doc_starts[j] +
    doc_lengths[j]]`` there too). ``doc_starts`` / ``doc_lengths`` are per span (not per document).

    Cost: a constant number of passes over the batch's cells and one fancy-index gather from ``flat_tokens``.
    """
    num_samples = len(spans)
    doc_starts = np.asarray(doc_starts, dtype=np.int64)
    doc_lengths = np.asarray(doc_lengths, dtype=np.int64)
    span_len = (spans.stops - spans.starts).astype(np.int64, copy=False)
    cum = np.zeros(span_len.size + 1, dtype=np.int64)
    np.cumsum(span_len, out=cum[1:])
    span_begin, span_end, total = cum[:-1], cum[1:], int(cum[-1])
    per_sample = cum[spans.offsets[1:]] - cum[spans.offsets[:-1]]
    _check_spans(spans, per_sample, sample_len, doc_lengths)

    cell = np.arange(total, dtype=np.int64)
    span_positions = cell - np.repeat(span_begin, span_len)
    src = span_positions + np.repeat(doc_starts + spans.starts, span_len)
    if eos_stored:
        values = np.asarray(flat_tokens[src], dtype=np.int64)
    else:
        eos_cells = span_end[np.flatnonzero(spans.stops == doc_lengths + 1)] - 1
        src[eos_cells] = 0  # the EOS is virtual: read anything in bounds, overwrite below
        values = np.asarray(flat_tokens[src], dtype=np.int64) if flat_tokens.size else np.zeros(total, dtype=np.int64)
        values[eos_cells] = eos_id
    last = np.zeros(total, dtype=bool)
    last[span_end[span_len > 0] - 1] = True

    full = bool((per_sample == sample_len).all())
    valid = None if full else np.arange(sample_len)[None, :] < per_sample[:, None]
    shape = (num_samples, sample_len)
    doc_ids = np.repeat(spans.doc_ids.astype(np.int64, copy=False), span_len)
    return Gathered(
        tokens=_into_grid(values, valid, shape, pad_id),
        doc_ids=_into_grid(doc_ids, valid, shape, -1),
        span_positions=_into_grid(span_positions, valid, shape, 0),
        last_in_span=_into_grid(last, valid, shape, False),
        valid=np.ones(shape, dtype=bool) if valid is None else valid,
        full=full,
    )


def _grid_begins(spans: Spans, span_len: np.ndarray, sample_len: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per span, its first cell in the flattened ``[B, sample_len]`` grid; per sample, its filled cells; the CSR
    cumulative span lengths."""
    cum = np.zeros(span_len.size + 1, dtype=np.int64)
    np.cumsum(span_len, out=cum[1:])
    first = cum[spans.offsets[:-1]]
    per_sample = cum[spans.offsets[1:]] - first
    shift = np.arange(len(spans), dtype=np.int64) * sample_len - first
    return cum[:-1] + np.repeat(shift, np.diff(spans.offsets)), per_sample, cum


def _per_cell(values: np.ndarray, span_len: np.ndarray, grid_begin: np.ndarray, size: int, fill: int, full: bool):
    """A flat grid of ``size`` cells: ``values[j]`` on the cells of span ``j``, ``fill`` elsewhere."""
    spread = np.repeat(values, span_len)
    if full:
        return spread
    grid = np.full(size, fill, dtype=np.int64)
    grid[_cells(span_len, grid_begin)] = spread
    return grid


def _cells(span_len: np.ndarray, grid_begin: np.ndarray) -> np.ndarray:
    """The grid cells of all spans, in order."""
    cum = np.cumsum(span_len) - span_len
    return np.repeat(grid_begin - cum, span_len) + np.arange(int(span_len.sum()), dtype=np.int64)


def _fill_tokens(
    grid: np.ndarray, spans: Spans, grid_begin: np.ndarray, reads: np.ndarray, src: np.ndarray, read
) -> None:
    """Write the stored tokens of each span into ``grid`` (flat): span ``j``'s first ``reads[j]`` cells get
    ``flat[src[j] : src[j] + reads[j]]`` where ``flat = read(src, src + reads)``."""
    flat = read(src, src + reads)
    if isinstance(flat, np.memmap):  # a plain view: slicing a memmap subclass costs a Python call per slice
        flat = flat.view(np.ndarray)
    if reads.size * _FEW_SPANS <= grid.size:
        for g, a, m in zip(grid_begin.tolist(), src.tolist(), reads.tolist()):
            if m:
                grid[g : g + m] = flat[a : a + m]
    elif reads.size:
        keep = reads > 0
        grid[_cells(reads[keep], grid_begin[keep])] = flat[_cells(reads[keep], src[keep])]


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
) -> np.ndarray:
    """Write the four :data:`FIELDS` of the samples of ``spans`` into ``out`` (int64 ``[4, B, seq_len]``); the values
    are exactly those :func:`gather_spans` lays out, turned into fields as the packed dataset defines them: ``concat``
    (``labels_cross_documents``, ``sample_len == seq_len + 1``) shifts one window into inputs and labels; otherwise
    each span's last position and padding get :data:`IGNORE_INDEX`. ``read(starts, stops)`` returns the flat token
    array, having checked whatever it guards for those element ranges (the only ones read).

    Cost: per span, one slice copy of its stored tokens (or, with spans of fewer than 64 cells on average, one
    fancy-index gather), plus a few whole-grid passes; nothing per token in Python.
    """
    num_samples = len(spans)
    doc_starts = np.asarray(doc_starts, dtype=np.int64)
    doc_lengths = np.asarray(doc_lengths, dtype=np.int64)
    span_len = (spans.stops - spans.starts).astype(np.int64, copy=False)
    grid_begin, per_sample, _ = _grid_begins(spans, span_len, sample_len)
    _check_spans(spans, per_sample, sample_len, doc_lengths)
    size = num_samples * sample_len
    full = bool((per_sample == sample_len).all())
    tokens = np.empty(size, dtype=np.int64) if full else np.full(size, pad_id, dtype=np.int64)
    reads = np.maximum(np.minimum(spans.stops, doc_lengths + int(eos_stored)) - spans.starts, 0)
    _fill_tokens(tokens, spans, grid_begin, reads, doc_starts + spans.starts, read)
    if not eos_stored:
        tokens[(grid_begin + span_len - 1)[spans.stops == doc_lengths + 1]] = eos_id
    ends = (grid_begin + span_len - 1)[span_len > 0]  # each span's last cell
    grid = tokens.reshape(num_samples, sample_len)
    input_ids, labels, position_ids, document_ids = out
    L = seq_len
    if labels_cross_documents:
        input_ids[:], labels[:] = grid[:, :L], grid[:, 1:]
        if not full:
            labels[np.arange(1, sample_len)[None, :] >= per_sample[:, None]] = IGNORE_INDEX
    else:
        input_ids[:] = grid
        flat = labels.reshape(-1)
        flat[:-1] = tokens[1:]
        flat[ends] = IGNORE_INDEX
        if not full:
            labels[np.arange(sample_len)[None, :] >= per_sample[:, None]] = IGNORE_INDEX
        labels[:, -1] = IGNORE_INDEX
    docs = _per_cell(spans.doc_ids.astype(np.int64, copy=False), span_len, grid_begin, size, -1, full)
    document_ids[:] = docs.reshape(num_samples, sample_len)[:, :L]
    if restart_position_ids:
        pos = np.arange(size, dtype=np.int64) - _per_cell(grid_begin, span_len, grid_begin, size, 0, full)
        if not full:
            pos[docs == -1] = 0
        position_ids[:] = pos.reshape(num_samples, sample_len)[:, :L]
    else:
        position_ids[:] = np.arange(L, dtype=np.int64)
    return out
