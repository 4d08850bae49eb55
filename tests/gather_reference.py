"""The packed dataset's former read path, kept as the reference :func:`detsampler.gather.pack_fields` must equal
(tests/test_gather.py) and as benchmark 3's "before": :func:`gather_spans` lays a batch's spans out in five
``[B, sample_len]`` grids with one fancy-index gather, :func:`fields_from_gathered` turns them into the four fields by
masks over the whole grid."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from detsampler.cells import check_spans as _check_spans
from detsampler.gather import FIELDS, IGNORE_INDEX
from detsampler.layout import Spans

__all__ = ["Gathered", "fields_from_gathered", "gather_spans"]


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


def fields_from_gathered(g: Gathered, seq_len: int, labels_cross_documents: bool, restart_position_ids: bool):
    """The four :data:`FIELDS` (int64 ``[4, B, seq_len]``) from a :func:`gather_spans` grid, by masks over the whole
    grid: the straightforward form :func:`~detsampler.gather.pack_fields` must equal (tests/test_gather.py; benchmark
    3's "before")."""
    L = seq_len
    out = np.empty((len(FIELDS), len(g.tokens), L), dtype=np.int64)
    input_ids, labels, position_ids, document_ids = out
    if labels_cross_documents:
        input_ids[:], labels[:], document_ids[:] = g.tokens[:, :L], g.tokens[:, 1:], g.doc_ids[:, :L]
        if not g.full:
            labels[~g.valid[:, 1:]] = IGNORE_INDEX
        span_pos = g.span_positions[:, :L]
    else:
        input_ids[:], document_ids[:] = g.tokens, g.doc_ids
        labels.fill(IGNORE_INDEX)
        has_next = g.valid[:, :-1] & ~g.last_in_span[:, :-1]
        labels[:, :-1][has_next] = g.tokens[:, 1:][has_next]
        span_pos = g.span_positions
    position_ids[:] = span_pos if restart_position_ids else np.arange(L, dtype=np.int64)
    return out
