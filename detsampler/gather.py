"""Reading the tokens of a batch of samples' spans at once (numpy only): one fancy-index gather, no per-token Python.

Given :class:`~detsampler.layout.Spans` for B samples and, per span, where its document's tokens start in a flat token array
and how many tokens the document has, :func:`gather_spans` lays the spans' positions out in a ``[B, sample_len]`` grid:
position ``lengths[d]`` of document ``d`` reads ``eos_id`` (the EOS is virtual, never stored); cells after a sample's last
span are padding (``pad_id``, document -1).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from detsampler.layout import Spans

__all__ = ["Gathered", "gather_spans"]


@dataclass(frozen=True)
class Gathered:
    """Per cell of a ``[B, sample_len]`` grid: the token, its document (-1 on padding), its position within its document
    and within its span, whether it is the last position of its span, and whether it holds a token at all."""

    tokens: np.ndarray  # int64, pad_id on padding
    doc_ids: np.ndarray  # int64, -1 on padding
    doc_positions: np.ndarray  # int64, 0 on padding
    span_positions: np.ndarray  # int64, 0 on padding
    last_in_span: np.ndarray  # bool
    valid: np.ndarray  # bool


def gather_spans(
    spans: Spans,
    sample_len: int,
    doc_starts: np.ndarray,
    doc_lengths: np.ndarray,
    flat_tokens: np.ndarray,
    eos_id: int,
    pad_id: int,
) -> Gathered:
    """The tokens of ``spans``: span ``j`` reads ``flat_tokens[doc_starts[j] + p]`` for its positions ``p < doc_lengths[j]``
    and ``eos_id`` at ``p == doc_lengths[j]``. ``doc_starts`` / ``doc_lengths`` are per span (not per document)."""
    num_samples = len(spans)
    span_len = (spans.stops - spans.starts).astype(np.int64)
    cum = np.zeros(span_len.size + 1, dtype=np.int64)
    np.cumsum(span_len, out=cum[1:])
    total = int(cum[-1])
    sample_first = cum[spans.offsets[:-1]]
    per_sample = cum[spans.offsets[1:]] - sample_first
    if per_sample.size and int(per_sample.max()) > sample_len:
        raise ValueError(f"a sample spans {int(per_sample.max())} positions, more than sample_len={sample_len}")

    span_of = np.repeat(np.arange(span_len.size, dtype=np.int64), span_len)
    flat_pos = np.arange(total, dtype=np.int64)
    within = flat_pos - cum[span_of]
    doc_pos = spans.starts[span_of] + within
    length = np.asarray(doc_lengths, dtype=np.int64)[span_of]
    if total and bool((doc_pos > length).any()):
        j = int(span_of[np.argmax(doc_pos > length)])
        raise ValueError(
            f"span of document {int(spans.doc_ids[j])} reaches position {int(spans.stops[j]) - 1}, but the document has only "
            f"{int(doc_lengths[j])} tokens and an EOS: the layout does not match the index"
        )
    eos = doc_pos == length
    src = np.asarray(doc_starts, dtype=np.int64)[span_of] + doc_pos
    if flat_tokens.size:
        values = np.asarray(flat_tokens[np.where(eos, 0, src)], dtype=np.int64)  # the one gather
    else:
        values = np.zeros(total, dtype=np.int64)
    values[eos] = eos_id

    row = np.repeat(np.arange(num_samples, dtype=np.int64), np.diff(spans.offsets))[span_of]
    col = flat_pos - sample_first[row]
    shape = (num_samples, sample_len)
    tokens = np.full(shape, pad_id, dtype=np.int64)
    doc_ids = np.full(shape, -1, dtype=np.int64)
    doc_positions = np.zeros(shape, dtype=np.int64)
    span_positions = np.zeros(shape, dtype=np.int64)
    last = np.zeros(shape, dtype=bool)
    valid = np.zeros(shape, dtype=bool)
    tokens[row, col] = values
    doc_ids[row, col] = np.asarray(spans.doc_ids, dtype=np.int64)[span_of]
    doc_positions[row, col] = doc_pos
    span_positions[row, col] = within
    last[row, col] = within == span_len[span_of] - 1
    valid[row, col] = True
    return Gathered(tokens, doc_ids, doc_positions, span_positions, last, valid)
