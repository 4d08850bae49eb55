"""Layouts: concat tiles the token stream exactly; document and bestfit hold every position of every document once."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st

from detsampler.layout import BestFitLayout, LayoutConfig, Spans, document_order, make_layout, pack_best_fit
from tests.strategies import doc_lengths, seeds

seq_lens = st.integers(min_value=1, max_value=40)
packed_seq_lens = st.integers(min_value=2, max_value=40)  # a document/bestfit sample of 1 token has no label


def positions_covered(spans: Spans, lengths: np.ndarray) -> np.ndarray:
    """How many times each token position (documents with EOS, in dataset order) is covered by ``spans``."""
    doc_begin = np.concatenate([[0], np.cumsum(lengths + 1)])
    cover = np.zeros(doc_begin[-1], dtype=np.int64)
    for d, s, e in zip(spans.doc_ids.tolist(), spans.starts.tolist(), spans.stops.tolist()):
        assert 0 <= s < e <= lengths[d] + 1
        cover[doc_begin[d] + s : doc_begin[d] + e] += 1
    return cover


def stream_of(spans: Spans, lengths: np.ndarray, i: int) -> np.ndarray:
    """The global token positions of sample ``i``, in order."""
    doc_begin = np.concatenate([[0], np.cumsum(lengths + 1)])
    return np.concatenate([np.arange(doc_begin[d] + s, doc_begin[d] + e) for d, s, e in spans.sample(i)])


@given(lengths=doc_lengths(), seq_len=seq_lens, seed=seeds)
@example(lengths=np.array([0]), seq_len=1, seed=0)
@example(lengths=np.array([5]), seq_len=5, seed=0)
def test_concat_tiles_the_stream(lengths, seq_len, seed):
    assume(lengths.sum() + len(lengths) > seq_len)
    layout = make_layout(LayoutConfig(kind="concat", seq_len=seq_len, seed=seed), lengths)
    spans = layout.locate(np.arange(layout.num_samples))
    np.testing.assert_array_equal(spans.num_tokens, np.full(layout.num_samples, seq_len + 1))
    # In stream order (documents in the layout's order, each followed by its EOS) sample c is [cL, cL + L + 1).
    order = layout.order
    stream_begin = np.empty(len(lengths), dtype=np.int64)
    stream_begin[order] = np.concatenate([[0], np.cumsum(lengths[order] + 1)[:-1]])
    for c in range(layout.num_samples):
        got = np.concatenate([np.arange(stream_begin[d] + s, stream_begin[d] + e) for d, s, e in spans.sample(c)])
        np.testing.assert_array_equal(got, np.arange(c * seq_len, c * seq_len + seq_len + 1))
    assert layout.num_samples == (int(lengths.sum()) + len(lengths) - 1) // seq_len


@given(
    lengths=doc_lengths(),
    seq_len=st.integers(min_value=2, max_value=40),
    seed=seeds,
    kind=st.sampled_from(["document", "bestfit"]),
    window_docs=st.integers(min_value=1, max_value=12),
)
@example(lengths=np.array([0]), seq_len=2, seed=0, kind="bestfit", window_docs=1)
def test_packed_layouts_hold_every_position_once(lengths, seq_len, seed, kind, window_docs):
    layout = make_layout(LayoutConfig(kind=kind, seq_len=seq_len, seed=seed, window_docs=window_docs), lengths)
    spans = layout.locate(np.arange(layout.num_samples))
    np.testing.assert_array_equal(positions_covered(spans, lengths), 1)
    assert (spans.num_tokens <= seq_len).all() and (spans.num_tokens >= 1).all()
    # A document is cut only when it is longer than seq_len: its pieces are then full except the last.
    pieces = np.bincount(spans.doc_ids, minlength=len(lengths))
    np.testing.assert_array_equal(pieces, -(-(lengths + 1) // seq_len))


@given(lengths=doc_lengths(), seq_len=packed_seq_lens, seed=seeds, window_docs=st.integers(min_value=1, max_value=12))
def test_bestfit_windows_are_consecutive_documents(lengths, seq_len, seed, window_docs):
    layout = make_layout(LayoutConfig(kind="bestfit", seq_len=seq_len, seed=seed, window_docs=window_docs), lengths)
    ends = np.cumsum(layout.bins_per_window)
    for window in range(layout.num_windows):
        ids = np.arange(ends[window] - layout.bins_per_window[window], ends[window])
        docs = set(layout.locate(ids).doc_ids.tolist())
        assert docs == set(layout.window_documents(window).tolist())


@given(
    lengths=doc_lengths(),
    seq_len=seq_lens,
    seed=seeds,
    kind=st.sampled_from(["concat", "document", "bestfit"]),
    data=st.data(),
)
def test_locate_is_pointwise(lengths, seq_len, seed, kind, data):
    """Locating a batch equals locating each sample alone, in any order and with repeats."""
    assume(lengths.sum() + len(lengths) > seq_len)
    assume(kind == "concat" or seq_len >= 2)
    layout = make_layout(LayoutConfig(kind=kind, seq_len=seq_len, seed=seed, window_docs=5), lengths)
    ids = np.array(data.draw(st.lists(st.integers(0, layout.num_samples - 1), min_size=1, max_size=10)))
    batch = layout.locate(ids)
    for i, sample_id in enumerate(ids.tolist()):
        assert batch.sample(i) == layout.locate(np.array([sample_id])).sample(0)


def test_best_fit_decreasing_packs_tightly():
    # 6+4 and 5+5 and 3+3+... : BFD puts each item in the fullest bin it fits.
    offsets, docs, starts, stops = pack_best_fit(np.array([6, 5, 5, 4, 3, 3, 2]), capacity=10)
    bins = [sorted((stops[lo:hi] - starts[lo:hi]).tolist()) for lo, hi in zip(offsets[:-1], offsets[1:])]
    assert bins == [[4, 6], [5, 5], [2, 3, 3]]


def test_bestfit_opens_a_given_packing_and_reports_padding():
    lengths = np.random.default_rng(0).integers(0, 300, size=500)
    config = LayoutConfig(kind="bestfit", seq_len=128, window_docs=64)
    layout = make_layout(config, lengths)
    again = BestFitLayout(config, lengths, packing=layout.packing, num_tokens=layout.num_tokens)
    assert again.num_samples == layout.num_samples and again._order is None  # the order is read pointwise
    assert again.locate(np.arange(10)).sample(3) == layout.locate(np.arange(10)).sample(3)
    padding = layout.describe()["padding_fraction"]
    document = make_layout(LayoutConfig(kind="document", seq_len=128), lengths).describe()["padding_fraction"]
    assert 0 <= padding < document


def test_document_order_is_a_seeded_permutation():
    order = document_order(1000, seed=5)
    np.testing.assert_array_equal(np.sort(order), np.arange(1000))
    assert not np.array_equal(order, document_order(1000, seed=6))


@pytest.mark.parametrize(
    "kwargs, lengths, message",
    [
        ({"seq_len": 0}, [3], "seq_len must be an integer >= 1, got 0"),
        ({"kind": "packed"}, [3], "layout kind must be one of"),
        ({"window_docs": 0}, [3], "window_docs must be an integer >= 1"),
        ({}, [], "the dataset is empty"),
        ({}, [3, -1], "document lengths must be >= 0, got -1 for document 1"),
        ({"seq_len": 10}, [3, 4], "no complete sample: the corpus has 9 tokens with EOS"),
    ],
)
def test_bad_input(kwargs, lengths, message):
    with pytest.raises(ValueError, match=message):
        make_layout(LayoutConfig(**kwargs), np.array(lengths, dtype=np.int64))


def test_locate_rejects_out_of_range_ids():
    layout = make_layout(LayoutConfig(kind="document", seq_len=4), np.array([3, 3]))
    with pytest.raises(ValueError, match=r"Got sample id 2, allowed sample ids are in \[0, 2\)"):
        layout.locate(np.array([0, 2]))


@pytest.mark.parametrize("kind", ["document", "bestfit"])
def test_packed_layouts_refuse_samples_without_labels(kind):
    """seq_len 1 leaves a document/bestfit sample no label (issue 10 item 12: the trainer's loss was NaN)."""
    with pytest.raises(ValueError, match=f"seq_len must be >= 2 for the {kind} layout"):
        LayoutConfig(kind=kind, seq_len=1)
    LayoutConfig(kind="concat", seq_len=1)  # one input and its label


@pytest.mark.parametrize("field, value", [("seq_len", True), ("window_docs", True), ("seed", 1.5), ("seq_len", 8.0)])
def test_layout_config_refuses_bools_and_floats(field, value):
    with pytest.raises(ValueError, match=field):
        LayoutConfig(kind="bestfit", **{field: value})
