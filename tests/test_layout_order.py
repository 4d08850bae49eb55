"""Issue 15: persisted ``concat`` and ``document`` layouts store the document order (``order.npy``) and read
``order[positions]`` from it, checked like the other layout files, instead of walking the keyed permutation."""

from __future__ import annotations

import json
import logging

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from detsampler.index import TokenIndex
from detsampler.index.checksums import VerifiedArray
from detsampler.index.files import HEADER_BYTES
from detsampler.index.layouts import LAYOUT_FORMAT_VERSION, layout_dir
from detsampler.index.synthetic import write_lengths_index
from detsampler.layout import LayoutConfig, document_order, make_layout
from tests.test_layouts import assert_same_layout


def _lengths_index(root, lengths: np.ndarray) -> TokenIndex:
    identity = {"test": "layout-order", "lengths": np.asarray(lengths).tolist()}
    return write_lengths_index(root, [np.asarray(lengths, dtype=np.int64)], len(lengths), identity)


@given(
    lengths=st.lists(st.integers(0, 300), min_size=1, max_size=80),
    seq_len=st.integers(2, 130),
    seed=st.integers(0, 2**63 - 1),
    kind=st.sampled_from(["concat", "document"]),
)
def test_a_persisted_layout_locates_as_the_in_ram_layout(tmp_path_factory, lengths, seq_len, seed, kind):
    lengths = np.asarray(lengths, dtype=np.int64)
    if kind == "concat" and int(lengths.sum()) + len(lengths) - 1 < seq_len:
        return  # no complete sample: refused alike (test_layout.py)
    index = _lengths_index(tmp_path_factory.mktemp("order"), lengths)
    config = LayoutConfig(kind=kind, seq_len=seq_len, seed=seed)
    layout = index.layout(config)
    assert isinstance(layout.inner._order, VerifiedArray)  # read from order.npy, not walked
    assert_same_layout(layout, make_layout(config, lengths))
    ids = np.random.default_rng(seed % 2**32).integers(0, layout.num_samples, size=17)  # repeats, any order
    got, want = layout.locate(ids), make_layout(config, lengths).locate(ids)
    for field in ("offsets", "doc_ids", "starts", "stops"):
        np.testing.assert_array_equal(getattr(got, field), getattr(want, field))
    np.testing.assert_array_equal(np.asarray(layout.order), document_order(len(lengths), seed))


def test_the_order_is_stored_in_the_narrowest_dtype_and_checked(tmp_path):
    lengths = np.random.default_rng(0).integers(0, 50, size=20_000)
    index = _lengths_index(tmp_path, lengths)
    for kind in ("concat", "document"):
        config = LayoutConfig(kind=kind, seq_len=64, seed=9)
        layout = index.layout(config)
        record = json.loads((layout.path / "layout.json").read_text())
        assert record["format_version"] == LAYOUT_FORMAT_VERSION == 3
        assert record["files"]["order.npy"]["dtype"] == "int32" and "sums" in record["files"]["order.npy"]
        assert (layout.path / "order.npy").stat().st_size == HEADER_BYTES + 4 * len(lengths)
        np.testing.assert_array_equal(np.load(layout.path / "order.npy"), document_order(len(lengths), 9))
        order = layout.inner._order
        layout.locate(np.arange(3))
        assert 0 < order.verified < 4  # the chunks read were checked, the rest was not read


def test_a_truncated_order_file_is_rebuilt(tmp_path, caplog):
    index = _lengths_index(tmp_path, np.arange(1, 2001))
    config = LayoutConfig(kind="concat", seq_len=32, seed=1)
    index.layout(config)
    path = layout_dir(index, config) / "order.npy"
    path.write_bytes(path.read_bytes()[:-4])
    with caplog.at_level(logging.WARNING, logger="detsampler"):
        layout = TokenIndex.open(index.path).layout(config)
    assert "order.npy is" in caplog.text and "its record says" in caplog.text and "rebuilding it" in caplog.text
    assert_same_layout(layout, make_layout(config, np.arange(1, 2001)))


def test_an_edited_order_chunk_is_found_while_locating_and_rebuilt(tmp_path, caplog):
    lengths = np.full(40_000, 3)
    index = _lengths_index(tmp_path, lengths)
    config = LayoutConfig(kind="document", seq_len=8, seed=2)
    index.layout(config)
    order = np.load(layout_dir(index, config) / "order.npy", mmap_mode="r+")
    assert order.nbytes > 1 << 16  # two chunks or more
    order[len(order) // 2], order[len(order) // 2 + 1] = order[len(order) // 2 + 1], order[len(order) // 2]
    order.flush()
    del order
    layout = TokenIndex.open(index.path).layout(config)
    with caplog.at_level(logging.WARNING, logger="detsampler"):
        assert_same_layout(layout, make_layout(config, lengths))
    assert "order.npy chunk" in caplog.text and "rebuilding the layout" in caplog.text
