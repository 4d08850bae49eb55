"""Benchmark 12's harness (tests/benchmarks/bench_shard_build.py) on a tiny corpus: the balanced shard files, every
contender building the same sharded index, and the rendered table and verdict. The timing itself runs under
``make bench`` only."""

from __future__ import annotations

import json

import pytest

from tests.benchmarks import bench_shard_build as bench

pytestmark = pytest.mark.slow  # it starts a few CLI processes


def test_the_corpus_is_balanced_and_holds_every_document_once(tmp_path):
    from detsampler.text.corpus import default_corpus

    sizes = bench.write_corpus(tmp_path, 3, max_documents=12)
    texts = [json.loads(line)["text"] for f in sorted(tmp_path.glob("*.jsonl")) for line in f.read_text().splitlines()]
    assert sorted(texts) == sorted(default_corpus(max_documents=12)["text"])
    assert len(sizes) == 3 and max(sizes) - min(sizes) <= max(len(t) for t in texts) * 1.2


def test_every_contender_builds_the_manifest_and_the_result_renders(tmp_path):
    result = bench.run(num_shards=2, max_documents=6, repeats=1, work=tmp_path / "work", vocab_size=400)
    (table,) = result.tables
    assert [row[0] for row in table.rows] == list(bench.CONTENDERS)
    assert table.rows[0][3] == "1.00x" and all(row[2].endswith(" s") for row in table.rows)
    assert "load average" in table.notes[0] and "CPU" in table.notes[1] and "--finalize" in table.notes[2]
    assert all(" s / " in row[5] for row in table.rows) and [row[6][-1] for row in table.rows] == ["x", "x", ")"]
    (verdict,) = result.verdicts
    assert "1.6x" in verdict.target and "Measured" in verdict.detail and "on idle cores" in verdict.detail
    assert result.markdown().startswith("## 12. Sharded index build")
