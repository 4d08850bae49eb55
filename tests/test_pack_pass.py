"""The vectorized pass of detsampler.gather against the per-span path it replaced (tests/pack_reference.py): every
byte of every field, of the token output and of the laid-out loss mask equal, on random corpora, layouts, batches,
token dtypes, EOS modes, position policies, masks, padding and sharded token arrays; and the reads it makes are
exactly token_ranges' (what the exact prefetcher fetches)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from detsampler.gather import lay_out, pack_fields, pack_tokens, token_ranges
from detsampler.index.sharded import ShardedArray
from detsampler.layout import LayoutConfig, Spans, make_layout
from tests.pack_reference import pack_fields_per_span, pack_tokens_per_span

DTYPES = {"uint16": np.uint16, "uint32": np.uint32, "int64": np.int64, "uint8": np.uint8}


def _corpus(rng, max_len: int, num_docs: int, eos_stored: bool, dtype) -> tuple:
    lengths = rng.integers(0, max_len + 1, size=num_docs).astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths + int(eos_stored))]).astype(np.int64)
    high = min(int(np.iinfo(dtype).max), 60_000)
    flat = rng.integers(0, high + 1, size=int(offsets[-1])).astype(dtype)
    mask = rng.integers(0, 3, size=flat.size).astype(np.uint8)  # a foreign mask's values: 0, 1 and 2
    return lengths, offsets, flat, mask


def _reader(arr: np.ndarray, sharded: bool, reads: list):
    half = len(arr) // 2
    source = ShardedArray([arr[:half], arr[half:]], np.array([0, half, len(arr)]), dtype=arr.dtype) if sharded else arr

    def read(a, b):
        reads.append((np.array(a), np.array(b)))
        return source

    return read


def _both(fn_new, fn_old, spans, layout, starts, lens, flat, mask, sharded, **kwargs):
    """(new output, new mask, reads made) and the reference's (output, mask)."""
    got, want = [], []
    for fn, store in ((fn_new, got), (fn_old, want)):
        reads: list = []
        mask_out = None if mask is None else np.full((len(spans), layout.sample_len), 77, dtype=np.int64)
        extra = {} if mask is None else {"mask_out": mask_out, "mask_read": _reader(mask, sharded, [])}
        out = fn(spans, starts=starts, lens=lens, read=_reader(flat, sharded, reads), **kwargs, **extra)
        store.extend([out, mask_out, reads])
    return got, want


@given(
    max_len=st.sampled_from([0, 3, 40, 700]),
    num_docs=st.integers(1, 60),
    kind=st.sampled_from(["concat", "document", "bestfit"]),
    seq_len=st.sampled_from([2, 5, 16, 64, 256]),
    eos_stored=st.booleans(),
    restart=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
    batch=st.integers(1, 12),
    sharded=st.booleans(),
    dtype=st.sampled_from(sorted(DTYPES)),
    masked=st.booleans(),
    mask_eos=st.integers(0, 1),
    examples=st.booleans(),
    eos_id=st.sampled_from([3, 250, 65_000, 1 << 40]),  # 1 << 40 fits no stored dtype but int64
    pad_id=st.sampled_from([0, -7, 300]),
)
@example(  # many pieces (a repeat) and many padded rows (a masked write), a uint8 token array
    max_len=3, num_docs=60, kind="bestfit", seq_len=16, eos_stored=False, restart=True, seed=1, batch=12, sharded=False,
    dtype="uint8", masked=True, mask_eos=1, examples=True, eos_id=250, pad_id=-7,
)  # fmt: skip
@example(  # a 64 x 2,048 concat batch, as benchmark 3 reads it
    max_len=700, num_docs=60, kind="concat", seq_len=2048, eos_stored=False, restart=False, seed=3, batch=12,
    sharded=False, dtype="uint16", masked=True, mask_eos=0, examples=True, eos_id=3, pad_id=0,
)  # fmt: skip
def test_pack_fields_equals_the_per_span_path(
    max_len, num_docs, kind, seq_len, eos_stored, restart, seed, batch, sharded, dtype, masked, mask_eos, examples,
    eos_id, pad_id,
):  # fmt: skip
    rng = np.random.default_rng(seed)
    lengths, offsets, flat, mask = _corpus(rng, max_len, num_docs, eos_stored, DTYPES[dtype])
    try:
        layout = make_layout(LayoutConfig(kind=kind, seq_len=seq_len, seed=seed % 7), lengths)
    except ValueError:  # no complete concat sample
        return
    spans = layout.locate(rng.integers(0, layout.num_samples, size=batch))
    starts, lens = offsets[spans.doc_ids], lengths[spans.doc_ids]

    def run(fn):
        def call(spans, starts, lens, read, **extra):
            out = np.full((4, batch, seq_len), 12345, dtype=np.int64)
            return fn(
                spans, seq_len, layout.sample_len, starts, lens, read, eos_id=eos_id, pad_id=pad_id,
                eos_stored=eos_stored, labels_cross_documents=layout.labels_cross_documents,
                restart_position_ids=restart, out=out, mask_eos=mask_eos, mask_examples=examples, **extra,
            )  # fmt: skip

        return call

    got, want = _both(
        run(pack_fields), run(pack_fields_per_span), spans, layout, starts, lens, flat, mask if masked else None,
        sharded,
    )  # fmt: skip
    np.testing.assert_array_equal(got[0], want[0])
    if masked:
        np.testing.assert_array_equal(got[1], want[1])
        _check_masked_labels(run(pack_fields), want, spans, starts, lens, flat, mask, sharded, layout)
    ((a, b),) = got[2]  # one read, of exactly the ranges token_ranges names
    src, n = token_ranges(spans, starts, lens, eos_stored)
    np.testing.assert_array_equal(a, src)
    np.testing.assert_array_equal(b, src + n)


def _check_masked_labels(call, want, spans, starts, lens, flat, mask, sharded, layout) -> None:
    """``mask_labels``: the same fields, but each label whose predicted position's mask value is 0 is -100 (the
    reference's labels masked by the reference's laid-out mask, any nonzero value trains)."""
    got = call(spans, starts, lens, _reader(flat, sharded, []), mask_read=_reader(mask, sharded, []), mask_labels=True)
    fields, laid_out = want[0].copy(), want[1]
    if layout.labels_cross_documents:
        fields[1][laid_out[:, 1:] == 0] = -100
    else:
        fields[1].reshape(-1)[:-1][laid_out.reshape(-1)[1:] == 0] = -100
    np.testing.assert_array_equal(got, fields)


@given(
    max_len=st.sampled_from([0, 3, 40, 700]),
    num_docs=st.integers(1, 60),
    seq_len=st.sampled_from([1, 5, 64, 256]),
    eos_stored=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
    batch=st.integers(1, 12),
    sharded=st.booleans(),
    dtype=st.sampled_from(sorted(DTYPES)),
    masked=st.booleans(),
    examples=st.booleans(),
)
def test_pack_tokens_equals_the_per_span_path(
    max_len, num_docs, seq_len, eos_stored, seed, batch, sharded, dtype, masked, examples
):
    rng = np.random.default_rng(seed)
    lengths, offsets, flat, mask = _corpus(rng, max_len, num_docs, eos_stored, DTYPES[dtype])
    try:
        layout = make_layout(LayoutConfig(kind="concat", seq_len=seq_len, seed=seed % 7), lengths)
    except ValueError:
        return
    spans = layout.locate(rng.integers(0, layout.num_samples, size=batch))
    starts, lens = offsets[spans.doc_ids], lengths[spans.doc_ids]
    eos_id = int(min(np.iinfo(DTYPES[dtype]).max, 65_000))

    def run(fn):
        def call(spans, starts, lens, read, **extra):
            out = np.full((batch, layout.sample_len), 99, dtype=DTYPES[dtype])
            return fn(
                spans, layout.sample_len, starts, lens, read, eos_id=eos_id, eos_stored=eos_stored, out=out,
                mask_eos=1, mask_examples=examples, **extra,
            )  # fmt: skip

        return call

    got, want = _both(
        run(pack_tokens), run(pack_tokens_per_span), spans, layout, starts, lens, flat, mask if masked else None,
        sharded,
    )  # fmt: skip
    np.testing.assert_array_equal(got[0], want[0])
    if masked:
        np.testing.assert_array_equal(got[1], want[1])


def test_a_sample_with_no_span_is_all_padding():
    """Samples without spans (none of today's layouts makes one) are rows of padding, before, between and after
    samples that have spans: the pass tiles them as the per-span path does."""
    spans = Spans(np.array([0, 0, 2, 2, 3, 4]), np.array([1, 0, 1, 0]), np.array([0, 1, 2, 0]), np.array([2, 3, 4, 1]))
    lengths, starts = np.array([3, 3, 3, 3]), np.array([4, 0, 4, 0])
    flat = np.arange(10, 18, dtype=np.uint16)
    mask = np.ones(8, dtype=np.uint8)
    out = {}
    for name, fn in (("new", pack_fields), ("old", pack_fields_per_span)):
        grid = np.full((5, 4), 5, dtype=np.int64)
        out[name] = fn(
            spans, 4, 4, starts, lengths, lambda a, b: flat, eos_id=99, pad_id=-7, eos_stored=False,
            labels_cross_documents=False, restart_position_ids=True, out=np.zeros((4, 5, 4), np.int64),
            mask_out=grid, mask_read=lambda a, b: mask, mask_eos=1,
        ), grid  # fmt: skip
    np.testing.assert_array_equal(out["new"][0], out["old"][0])
    np.testing.assert_array_equal(out["new"][1], out["old"][1])
    assert out["new"][0][3].tolist() == [[-1] * 4, [1, 1, 0, 0], [-1] * 4, [1, 1, -1, -1], [0, -1, -1, -1]]


def test_the_cells_tile_the_grid():
    """lay_out's invariant on a padded batch: spans and gaps tile the grid in order, and each span reads its length
    less its virtual EOS."""
    layout = make_layout(LayoutConfig(kind="document", seq_len=8), np.array([3, 12, 0, 7]))
    spans = layout.locate(np.arange(layout.num_samples))
    cells = lay_out(spans, 8, np.zeros(len(spans.doc_ids), np.int64), layout.lengths[spans.doc_ids], False)
    assert cells.lead + int(cells.length.sum() + cells.gap.sum()) == 8 * len(spans)
    assert (cells.begin[1:] == cells.begin[:-1] + cells.length[:-1] + cells.gap[:-1]).all()
    assert (cells.length == cells.reads + cells.eos).all()


def test_a_mismatched_sample_len_is_refused():
    spans = Spans(np.array([0, 1]), np.array([0]), np.array([0]), np.array([4]))
    with pytest.raises(ValueError, match="sample_len=4 with seq_len=4: a concat sample holds seq_len"):
        pack_fields(
            spans, 4, 4, np.array([0]), np.array([3]), lambda a, b: np.zeros(3, np.uint16), eos_id=1, pad_id=0,
            eos_stored=False, labels_cross_documents=True, restart_position_ids=False,
            out=np.zeros((4, 1, 4), np.int64),
        )  # fmt: skip
