"""pack_fields (the packed dataset's read path) against the straightforward one it replaced: gather_spans laid out
cell by cell, then turned into the four fields; exact equality on random corpora, layouts, batches and options."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from detsampler.gather import IGNORE_INDEX, pack_fields
from detsampler.index.sharded import ShardedArray
from detsampler.layout import LayoutConfig, Spans, make_layout
from tests.gather_reference import fields_from_gathered, gather_spans


def _reference_fields(spans, layout, starts, lengths, flat, eos_id, pad_id, eos_stored, restart) -> np.ndarray:
    g = gather_spans(spans, layout.sample_len, starts, lengths, flat, eos_id, pad_id, eos_stored=eos_stored)
    return fields_from_gathered(g, layout.config.seq_len, layout.labels_cross_documents, restart)


def test_a_short_concat_window_labels_only_its_cells():
    """A window that crosses documents (concat) but is shorter than the sample: labels past its last cell are ignored,
    inputs are padding (no layout makes one today; the rule still holds)."""
    spans = Spans(np.array([0, 2]), np.array([1, 0]), np.array([2, 0]), np.array([4, 2]))  # 2 + 2 of 5 cells
    lengths, starts = np.array([3, 3]), np.array([3, 0])
    flat = np.arange(10, 16, dtype=np.uint16)
    layout = SimpleNamespace(sample_len=5, config=SimpleNamespace(seq_len=4), labels_cross_documents=True)
    want = _reference_fields(spans, layout, starts, lengths, flat, 99, -7, False, True)
    got = pack_fields(
        spans,
        4,
        5,
        starts,
        lengths,
        lambda a, b: flat,
        eos_id=99,
        pad_id=-7,
        eos_stored=False,
        labels_cross_documents=True,
        restart_position_ids=True,
        out=np.zeros((4, 1, 4), np.int64),
    )
    np.testing.assert_array_equal(got, want)
    assert got[1].tolist() == [[99, 10, 11, IGNORE_INDEX]] and got[0].tolist() == [[15, 99, 10, 11]]


@pytest.mark.parametrize("kind", ["concat", "document", "bestfit"])
def test_an_empty_micro_batch_reads_as_empty_fields(small_index, kind):
    """A micro batch of no samples (torchft's share of a healing group) reads as ``[0, seq_len]`` fields: the labels of
    the flat grid wrote its last cell, past the end of an empty one (IndexError under document and bestfit)."""
    from detsampler.loader.dataset import PackedDataset

    ds = PackedDataset(small_index, make_layout(LayoutConfig(kind=kind, seq_len=8), small_index.lengths))
    batch = ds.get_batch([])
    assert {k: tuple(v.shape) for k, v in batch.items()} == {k: (0, 8) for k in batch} and "labels" in batch


@given(
    max_len=st.sampled_from([3, 40, 700]),  # spans of a few cells (the gather) to spans of hundreds (slice copies)
    num_docs=st.integers(1, 60),
    kind=st.sampled_from(["concat", "document", "bestfit"]),
    seq_len=st.sampled_from([2, 5, 16, 64, 256]),  # 256: padded samples of few, long pieces (slice writes)
    eos_stored=st.booleans(),
    restart=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
    batch=st.integers(1, 12),
    sharded=st.booleans(),
)
@example(
    max_len=700, num_docs=3, kind="concat", seq_len=64, eos_stored=False, restart=False, seed=0, batch=4, sharded=False
)
@example(
    max_len=700,
    num_docs=8,
    kind="document",
    seq_len=256,
    eos_stored=False,
    restart=True,
    seed=2,
    batch=6,
    sharded=False,
)
@example(  # grids of 1 MiB and more: documents by a slice per piece without restarting positions too
    max_len=700,
    num_docs=60,
    kind="concat",
    seq_len=2048,
    eos_stored=False,
    restart=False,
    seed=3,
    batch=64,
    sharded=False,
)
@example(
    max_len=700,
    num_docs=60,
    kind="document",
    seq_len=2048,
    eos_stored=True,
    restart=False,
    seed=4,
    batch=64,
    sharded=False,
)
@example(
    max_len=3, num_docs=60, kind="bestfit", seq_len=16, eos_stored=True, restart=True, seed=1, batch=12, sharded=False
)
def test_pack_fields_equals_the_reference(max_len, num_docs, kind, seq_len, eos_stored, restart, seed, batch, sharded):
    """Also when the flat tokens are a sharded index's (read by index arrays, not slices)."""
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
    half = len(flat) // 2
    source = ShardedArray([flat[:half], flat[half:]], np.array([0, half, len(flat)]), dtype=flat.dtype)

    def read(a, b):
        reads.append((a.copy(), b.copy()))
        return source if sharded else flat

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
