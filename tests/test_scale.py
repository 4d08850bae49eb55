"""Issue 12.4: an index of 10^8 documents (lengths only) opens and locates a micro batch in a fresh process without
reading anything of size D: the chunks read are counted, the private memory growth bounded, the spans checked exactly.

Disk: ~2.5 GB (lengths, offsets, one concat layout) under pytest's tmp directory, removed afterwards; time: ~1-2 minutes
on 2 cores (the build is the cost; the fresh process's open and locate are milliseconds).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from detsampler.index.synthetic import synthetic_index
from detsampler.layout import LayoutConfig

NUM_DOCUMENTS = 10**8
NEEDS_BYTES = 3 * 10**9


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
