"""Issue 12.4: an index of 10^8 documents (lengths only) opens and locates a micro batch in a fresh process without
reading anything of size D: the chunks read are counted, the private memory growth bounded, the spans checked exactly.
And the on-disk widths that make 10^9 documents fit: int32 lengths and no offsets in a lengths-only index (format 3),
int32 layout arrays wherever their bound fits (layout format 2; format 3 adds the int32 document order).

Disk: ~1.6 GB (int32 lengths, one concat layout: int64 ends and int32 order) under pytest's tmp directory, removed
afterwards; time: ~1-2 minutes on 2 cores (the build is the cost; the fresh process's open and locate are milliseconds).
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from detsampler.index import TokenIndex
from detsampler.index.files import HEADER_BYTES
from detsampler.index.format import LENGTHS_FORMAT_VERSION, seal_meta
from detsampler.index.layouts import _dtypes
from detsampler.index.synthetic import synthetic_index, synthetic_lengths, write_lengths_index
from detsampler.layout import LayoutConfig, make_layout
from tests.test_layouts import CONFIGS, assert_same_layout

NUM_DOCUMENTS = 10**8
NEEDS_BYTES = 2 * 10**9  # lengths 0.4 GB, concat ends 0.8 GB and order 0.4 GB, with a margin


@pytest.mark.slow
def test_a_1e8_document_index_opens_and_locates_without_reading_it(tmp_path):
    free = shutil.disk_usage(tmp_path).free
    if free < NEEDS_BYTES + 2 * 10**9:
        pytest.skip(
            f"needs {NEEDS_BYTES / 1e9:.0f} GB of free disk (plus 2 GB spare) under {tmp_path}, has {free / 1e9:.1f}"
        )
    index = synthetic_index(tmp_path, NUM_DOCUMENTS, mean_length=1000, seed=0)
    assert index.num_documents == NUM_DOCUMENTS and index.tokens is None
    index.layout(LayoutConfig(kind="concat", seq_len=2048))  # built once, here
    args = {"index": str(index.path), "kind": "concat", "seq_len": 2048, "mode": "persisted", "repeats": 20}
    proc = subprocess.run(
        [sys.executable, "-m", "tests.benchmarks._corpus_scale_child"],
        input=json.dumps(args),
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert r["spans_ok"]  # each sample is exactly stream tokens [cL, cL + L + 1), checked through the inverse order
    # A fresh process read at most a few dozen 64 KiB chunks (of ~37,000) to open and read a micro batch of 8 samples,
    # and its private memory grew by far less than one array of D int64 (800 MB).
    assert r["chunks_read"] < 100, r
    assert r["anon_growth"] < 50 * 10**6, r
    assert r["pickled_bytes"] < 1024, r  # what a DataLoader worker receives: paths


def test_a_lengths_only_index_stores_int32_lengths_and_no_offsets(tmp_path):
    """Format 3: 4 bytes per document on disk (lengths.npy as int32, no offsets.npy), read back exactly, and its
    layouts equal to the in-RAM layouts over the same lengths as int64."""
    n = 20_000
    index = synthetic_index(tmp_path, n, mean_length=40, seed=3)
    want = np.concatenate(list(synthetic_lengths(n, 40, 3)))
    assert index.meta["format_version"] == LENGTHS_FORMAT_VERSION and index.offsets is None
    assert set(index.meta["files"]) == {"lengths.npy"} and index.meta["files"]["lengths.npy"]["dtype"] == "int32"
    assert (index.path / "lengths.npy").stat().st_size == HEADER_BYTES + 4 * n
    assert not (index.path / "offsets.npy").exists()
    np.testing.assert_array_equal(np.asarray(index.lengths), want)
    assert index.num_tokens == int(want.sum()) and TokenIndex.open(index.path).verify_once()
    for config in CONFIGS:
        layout = index.layout(config)
        assert_same_layout(layout, make_layout(config, want))
        record = json.loads((layout.path / "layout.json").read_text())
        assert {k: v["dtype"] for k, v in record["files"].items()} == {
            k: v.name for k, v in _dtypes(index, config).items()
        }


def test_layout_arrays_are_int32_exactly_where_their_bound_fits():
    fits = SimpleNamespace(num_documents=10**9, num_tokens=10**12)  # 10^9 + 4.9e8 samples at most: < 2^31
    over = SimpleNamespace(num_documents=10**9, num_tokens=3 * 10**12)  # up to 2.46e9 samples
    i32, i64 = np.dtype(np.int32), np.dtype(np.int64)
    concat, document = LayoutConfig(kind="concat", seq_len=2048), LayoutConfig(kind="document", seq_len=2048)
    assert _dtypes(fits, concat) == {"ends.npy": i64, "order.npy": i32}  # stream positions; document ids
    assert _dtypes(fits, document) == {"ends.npy": i32, "order.npy": i32}
    assert _dtypes(over, document) == {"ends.npy": i64, "order.npy": i32}
    assert _dtypes(SimpleNamespace(num_documents=2**31, num_tokens=0), concat)["order.npy"] == i32  # ids < 2^31
    assert _dtypes(SimpleNamespace(num_documents=2**31 + 1, num_tokens=0), document)["order.npy"] == i64
    bestfit = LayoutConfig(kind="bestfit", seq_len=2048)
    assert _dtypes(fits, bestfit)["bin_items.npy"] == i32 and _dtypes(over, bestfit)["bin_items.npy"] == i64
    assert _dtypes(SimpleNamespace(num_documents=2**31, num_tokens=0), bestfit)["item_docs.npy"] == i64
    assert _dtypes(SimpleNamespace(num_documents=2**31 - 1, num_tokens=0), bestfit)["item_docs.npy"] == i32


def test_a_layout_recorded_with_another_dtype_is_rebuilt(tmp_path, caplog):
    index = synthetic_index(tmp_path, 5_000, mean_length=40, seed=1)
    config = LayoutConfig(kind="document", seq_len=32)
    path = index.layout(config).path
    record = json.loads((path / "layout.json").read_text())
    record["files"]["ends.npy"]["dtype"] = "int64"
    (path / "layout.json").write_text(json.dumps(seal_meta({k: v for k, v in record.items() if k != "meta_sha256"})))
    with caplog.at_level(logging.WARNING, logger="detsampler"):
        layout = TokenIndex.open(index.path).layout(config)
    assert "not recorded as int32" in caplog.text
    assert_same_layout(layout, make_layout(config, np.asarray(index.lengths)))


def test_lengths_that_do_not_fit_int32_are_refused(tmp_path):
    with pytest.raises(ValueError, match=r"document lengths must be in \[0, 2\^31\), got 2147483648"):
        write_lengths_index(tmp_path, [np.array([1, 2**31])], 2, {"test": "big"})
    with pytest.raises(ValueError, match="got -1"):
        write_lengths_index(tmp_path, [np.array([1, -1])], 2, {"test": "negative"})
    assert not list(tmp_path.iterdir())  # nothing left behind


def test_a_value_beyond_the_bound_is_refused_not_wrapped(tmp_path):
    """An index whose counts understate its lengths could give a bound too small: the writer refuses, never wraps."""
    from detsampler.index.layouts import _NpyStream

    out = _NpyStream(tmp_path / "ends.npy", np.dtype(np.int32))
    out.write(np.array([1, 2**31 - 1]))
    with pytest.raises(ValueError, match="ends.npy: a value exceeds int32"):
        out.write(np.array([2**31]))
    out.close()
    np.testing.assert_array_equal(np.load(tmp_path / "ends.npy"), [1, 2**31 - 1])
