"""Issue 23.2: ``cu_seqlens`` and the padding-free form of a packed micro batch (numpy only), against a naive model
built span by span from the layout's spans, on random corpora and all three layouts."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from detsampler.boundaries import flatten, segment_starts, sequence_boundaries
from detsampler.gather import IGNORE_INDEX, pack_fields
from detsampler.layout import LayoutConfig, make_layout
from tests.strategies import doc_lengths


def fields_of(lengths: np.ndarray, config: LayoutConfig, ids: np.ndarray):
    """The packed dataset's four fields of samples ``ids`` of a corpus whose token values are their flat positions
    (so every token says where it came from), and the samples' spans."""
    layout = make_layout(config, lengths)
    spans = layout.locate(ids)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    flat = np.arange(int(lengths.sum()) + 1, dtype=np.int64)
    out = np.zeros((4, len(ids), config.seq_len), np.int64)
    pack_fields(
        spans,
        config.seq_len,
        layout.sample_len,
        starts[spans.doc_ids],
        lengths[spans.doc_ids],
        lambda a, b: flat,
        eos_id=-7,
        pad_id=-9,
        eos_stored=False,
        labels_cross_documents=layout.labels_cross_documents,
        restart_position_ids=not layout.labels_cross_documents,
        out=out,
    )
    return dict(zip(("input_ids", "labels", "position_ids", "document_ids"), out)), spans


@given(
    lengths=doc_lengths(max_docs=30, max_len=40),
    seq_len=st.integers(2, 24),
    kind=st.sampled_from(["bestfit", "document", "concat"]),
    data=st.data(),
)
def test_boundaries_and_the_flat_row_follow_the_spans(lengths, seq_len, kind, data):
    config = LayoutConfig(kind=kind, seq_len=seq_len, seed=1, window_docs=7)
    if kind == "concat" and int(lengths.sum()) + len(lengths) <= seq_len:
        return
    num_samples = make_layout(config, lengths).num_samples
    ids = np.asarray(data.draw(st.lists(st.integers(0, num_samples - 1), min_size=1, max_size=6)))
    f, spans = fields_of(lengths, config, ids)
    # the naive model: per row, its spans (concat: the whole row), then its padding
    segments, kept = [], []
    for i in range(len(ids)):
        lo, hi = spans.offsets[i], spans.offsets[i + 1]
        span_len = [seq_len] if kind == "concat" else (spans.stops - spans.starts)[lo:hi].tolist()
        used = sum(span_len)
        segments += span_len + ([seq_len - used] if used < seq_len else [])
        kept += span_len
    cu, longest = sequence_boundaries(f["position_ids"], f["document_ids"])
    assert cu.dtype == np.int32 and cu.tolist() == np.cumsum([0, *segments]).tolist() and longest == max(segments)
    flat = flatten(f)
    total = sum(kept)
    assert flat["cu_seq_lens_q"].tolist() == np.cumsum([0, *kept]).tolist() == flat["cu_seq_lens_k"].tolist()
    assert flat["max_length_q"] == flat["max_length_k"] == max(kept)
    keep = f["document_ids"] >= 0
    assert flat["input_ids"].shape == (1, total) and (flat["input_ids"][0] == f["input_ids"][keep]).all()
    seg = np.repeat(np.arange(len(kept)), kept)
    assert (flat["seq_idx"][0] == seg).all() and flat["seq_idx"].dtype == np.int32
    first = np.zeros(total, bool)
    first[np.cumsum([0, *kept])[:-1]] = True
    assert (flat["position_ids"][0] == np.arange(total) - np.repeat(np.cumsum([0, *kept])[:-1], kept)).all()
    labels = flat["labels"][0]
    assert (labels[first] == IGNORE_INDEX).all()
    # elsewhere the label of t is the dataset's target of t - 1: within a bestfit/document span the token at t
    inner = ~first
    want = f["labels"][keep][np.flatnonzero(inner) - 1]
    assert (labels[inner] == want).all()
    if kind != "concat":
        assert (labels[inner] == flat["input_ids"][0][inner]).all()


def test_a_loss_mask_sets_the_masked_targets_to_the_separator():
    lengths = np.array([9, 3, 12, 5, 7, 2])
    f, _ = fields_of(lengths, LayoutConfig(kind="bestfit", seq_len=16, seed=2, window_docs=6), np.arange(3))
    mask = (f["position_ids"] % 2 == 0) & (f["document_ids"] >= 0)
    flat, masked = flatten(f), flatten({**f, "loss_mask": mask})  # labels left unmasked: the mask alone applies
    keep = f["document_ids"] >= 0
    shifted = np.concatenate([[False], ~mask[keep][:-1]])  # the target of t - 1 sits at t
    assert (masked["labels"][0][shifted] == IGNORE_INDEX).all()
    assert (masked["labels"][0][~shifted] == flat["labels"][0][~shifted]).all()


def test_segment_starts_treat_a_rows_padding_as_one_segment():
    pos = np.array([[0, 1, 2, 0, 1, 0, 0, 0], [0, 1, 2, 3, 4, 5, 6, 7]])
    docs = np.array([[4, 4, 4, 9, 9, -1, -1, -1], [1, 1, 1, 1, 2, 2, 2, 2]])  # concat: a row is one segment
    assert segment_starts(pos, docs).astype(int).tolist() == [[1, 0, 0, 1, 0, 1, 0, 0], [1, 0, 0, 0, 0, 0, 0, 0]]
    assert sequence_boundaries(pos, docs)[0].tolist() == [0, 3, 5, 8, 16]
    assert segment_starts(pos).astype(int)[0].tolist() == [1, 0, 0, 1, 0, 1, 1, 1]  # without ids: per position


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"input_ids": np.zeros((1, 4), np.int64)}, r"missing \['labels', 'position_ids', 'document_ids'\]"),
        ({"position_ids": np.zeros(4, np.int64)}, r"position_ids must be \[batch, seq_len\], got shape \(4,\)"),
    ],
)
def test_bad_input_is_refused(fields, message):
    with pytest.raises(ValueError, match=message):
        flatten(fields) if "input_ids" in fields else sequence_boundaries(fields["position_ids"])
