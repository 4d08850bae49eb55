"""pack_fields (the packed dataset's read path) against the straightforward one it replaced: gather_spans laid out
cell by cell, then turned into the four fields; exact equality on random corpora, layouts, batches and options."""

from __future__ import annotations

import numpy as np
from hypothesis import example, given
from hypothesis import strategies as st

from detsampler.gather import IGNORE_INDEX, gather_spans, pack_fields
from detsampler.layout import LayoutConfig, make_layout


def _reference_fields(spans, layout, starts, lengths, flat, eos_id, pad_id, eos_stored, restart) -> np.ndarray:
    """The packed dataset's fields as computed before pack_fields (gather_spans, then masks over the whole grid)."""
    g = gather_spans(spans, layout.sample_len, starts, lengths, flat, eos_id, pad_id, eos_stored=eos_stored)
    L = layout.config.seq_len
    out = np.empty((4, len(spans), L), dtype=np.int64)
    input_ids, labels, position_ids, document_ids = out
    if layout.labels_cross_documents:
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
    position_ids[:] = span_pos if restart else np.arange(L, dtype=np.int64)
    return out


@given(
    max_len=st.sampled_from([3, 40, 700]),  # spans of a few cells (the gather) to spans of hundreds (slice copies)
    num_docs=st.integers(1, 60),
    kind=st.sampled_from(["concat", "document", "bestfit"]),
    seq_len=st.sampled_from([2, 5, 16, 64]),
    eos_stored=st.booleans(),
    restart=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
    batch=st.integers(1, 12),
)
@example(max_len=700, num_docs=3, kind="concat", seq_len=64, eos_stored=False, restart=False, seed=0, batch=4)
@example(max_len=3, num_docs=60, kind="bestfit", seq_len=16, eos_stored=True, restart=True, seed=1, batch=12)
def test_pack_fields_equals_the_reference(max_len, num_docs, kind, seq_len, eos_stored, restart, seed, batch):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, max_len + 1, size=num_docs).astype(np.int64)
    stored = lengths + int(eos_stored)
    offsets = np.concatenate([[0], np.cumsum(stored)]).astype(np.int64)
    flat = rng.integers(0, 60_000, size=int(offsets[-1])).astype(np.uint16)
    try:
        layout = make_layout(LayoutConfig(kind=kind, seq_len=seq_len, seed=seed % 7), lengths)
    except ValueError:  # no complete concat sample
        return
    ids = rng.integers(0, layout.num_samples, size=batch)
    spans = layout.locate(ids)
    starts, lens = offsets[spans.doc_ids], lengths[spans.doc_ids]
    want = _reference_fields(spans, layout, starts, lens, flat, 65_000, -7, eos_stored, restart)
    reads = []

    def read(a, b):
        reads.append((a.copy(), b.copy()))
        return flat

    got = pack_fields(
        spans,
        seq_len,
        layout.sample_len,
        starts,
        lens,
        read,
        eos_id=65_000,
        pad_id=-7,
        eos_stored=eos_stored,
        labels_cross_documents=layout.labels_cross_documents,
        restart_position_ids=restart,
        out=np.full((4, batch, seq_len), 12345, dtype=np.int64),
    )
    np.testing.assert_array_equal(got, want)
    ((a, b),) = reads  # one read, of ranges within the spans' documents' stored tokens
    assert ((a >= starts) & (b <= starts + lens + int(eos_stored)) & (a <= b)).all()
