"""The benchmark harness (tests/benchmarks/run_all.py) without running a benchmark: discovery order, every result shape
a bench module may return, and the document it renders. The benchmarks themselves run only under ``make bench``."""

from __future__ import annotations

import os

import pytest

from tests.benchmarks.common import BenchResult, Table, Verdict, ratio_column
from tests.benchmarks.run_all import _as_markdown, discover, machine


def test_discovery_follows_the_issue_numbering():
    names = discover()
    assert {"resume", "memory", "permutation"} <= set(names)
    known = [n for n in names if n in ("resume", "memory", "loader", "index", "permutation", "trainer", "scale")]
    order = ["resume", "memory", "loader", "index", "permutation", "trainer", "scale"]
    assert known == [n for n in order if n in known]


def test_every_result_shape_renders_with_its_verdicts():
    result = BenchResult(
        5,
        "Permutation",
        "how it was measured",
        [Table("t", ["contender", "rate"], [["a", "1"], ["b", "2"]], ["a note"])],
        [Verdict("at least 1e7/s", False, "Measured 5e6/s. Gap: 2x.")],
    )
    markdown, verdicts, number = _as_markdown("permutation", result)
    assert number == 5 and "| a | 1 |" in markdown and "a note" in markdown
    assert verdicts == ["- **MISSED** — target: at least 1e7/s. Measured 5e6/s. Gap: 2x."]

    markdown, verdicts, number = _as_markdown("index", [{"contender": "build", "tokens/s": 10}])
    assert number == 4 and "| build | 10 |" in markdown and verdicts == []
    numbers = {
        "build_tokens_per_s": 700.0,
        "raw_encode_tokens_per_s": 1000.0,
        "num_proc": 2,
        "layouts": {"concat": {"x": 1}},
    }
    markdown, verdicts, number = _as_markdown("index", numbers)
    assert "| layouts.concat.x | 1 |" in markdown and "| build_tokens_per_s | 700 |" in markdown
    assert (
        len(verdicts) == 1
        and verdicts[0].startswith("- **MISSED**")
        and "70%" in verdicts[0]
        and "Gap: 1.14x" in verdicts[0]
    )
    markdown, verdicts, number = _as_markdown("index", {"title": "Index", "rows": [{"x": 1}], "verdicts": ["MET: ok"]})
    assert "| 1 |" in markdown and verdicts == ["MET: ok"]
    markdown, verdicts, _ = _as_markdown("trainer", "## 6. Trainer\n- **MET** — under 1%")
    assert verdicts == ["- **MET** — under 1%"]


def test_ratios_name_the_best_contender():
    assert ratio_column([2.0, 1.0, None], higher_is_better=False) == ["2x", "1.00x (best)", "—"]
    assert ratio_column([2.0, 8.0], higher_is_better=True) == ["0.25x", "1.00x (best)"]


def test_document_states_cores_date_load_and_every_verdict():
    from tests.benchmarks.report import Section, render_document

    section = Section(1, "resume", "## 1. Resume\n\nbody\n\n- **MET** — target: x.", "2026-01-01 00:00 UTC", (2.5, 3.0))
    doc = render_document([section], machine(), "numpy 2")
    assert f"- Machine: {os.cpu_count()} cores" in doc
    assert "_Run: 2026-01-01 00:00 UTC; load 2.5 before, 3.0 after (**timed under load**" in doc
    assert "- Benchmark 1 (resume, 2026-01-01 00:00 UTC): **MET** — target: x." in doc
    assert "## 1. Resume" in doc
    calm = Section(1, "resume", "## 1. Resume", "2026-01-01 00:00 UTC", (0.2, 0.3))
    assert "under load" not in render_document([calm], machine(), "numpy 2")


def test_every_ceiling_copy_reads_the_tokens_the_loader_delivers(small_index):
    """Benchmark 3's ceiling copies exactly what detsampler's concat samples hold (inputs and the last label)."""
    import numpy as np

    from detsampler import LayoutConfig, Plan
    from detsampler.loader.dataset import PackedDataset
    from tests.benchmarks.ceiling import ceiling_runs, gather_copy, slice_copy, span_pieces

    seq_len, batch = 64, 4
    layout = small_index.layout(LayoutConfig(kind="concat", seq_len=seq_len))
    ds = PackedDataset(small_index, layout)
    plan = Plan(layout.num_samples, seed=3, global_batch_size=batch, micro_batch_size=batch)
    offsets, lengths = np.asarray(small_index.offsets), np.asarray(small_index.lengths)
    for step in range(5):
        ids = plan.micro_batch(step, 0, 0)
        spans = layout.locate(np.asarray(ids))
        got = ds.get_batch(ids)
        want = np.concatenate([got["input_ids"].numpy(), got["labels"].numpy()[:, -1:]], axis=1).reshape(-1)
        out = np.empty(batch * (seq_len + 1), dtype=small_index.tokens.dtype)
        pieces = span_pieces(spans, offsets, lengths)
        assert np.array_equal(slice_copy(small_index.tokens, pieces, small_index.eos_id, out), want)
        assert np.array_equal(gather_copy(small_index.tokens, spans, offsets, lengths, small_index.eos_id), want)
    spans = [layout.locate(np.asarray(plan.micro_batch(s, 0, 0))) for s in range(3)]
    runs = ceiling_runs(small_index, spans, batch * (seq_len + 1), 3 * batch * seq_len, repeats=3)
    assert [r.name for r in runs] == ["memcpy of the same bytes", "per-span slice copy loop", "vectorized gather"]
    assert all(0 < r.low <= r.median <= r.high for r in runs)


def test_the_ceiling_reads_the_raw_memory_map_not_the_checked_array(small_index):
    """The ceiling copies from ``np.load(tokens.npy, mmap_mode="r")``: a freshly opened index's checked token array is
    never read (no chunk verified), and the raw map holds the same tokens."""
    import numpy as np

    from detsampler import LayoutConfig, Plan
    from detsampler.index.reader import TokenIndex
    from tests.benchmarks.ceiling import ceiling_runs, raw_tokens

    fresh = TokenIndex.open(small_index.path)
    layout = fresh.layout(LayoutConfig(kind="concat", seq_len=32))
    plan = Plan(layout.num_samples, seed=0, global_batch_size=2, micro_batch_size=2)
    spans = [layout.locate(np.asarray(plan.micro_batch(s, 0, 0))) for s in range(2)]
    ceiling_runs(fresh, spans, 2 * 33, 2 * 2 * 32, repeats=2)
    assert fresh.tokens.verified == 0
    raw = raw_tokens(fresh)
    assert type(raw) is np.memmap and raw.dtype == fresh.tokens.dtype
    assert np.array_equal(raw, np.asarray(small_index.tokens))


def test_the_before_paths_and_the_staged_read_equal_get_batch_and_every_stage_is_timed(small_index):
    """Benchmark 3's "before" rows (the per-span pass issue 35 replaced, and the read path before pack_fields) and the
    stage table's step-by-step read yield the same tensors as get_batch, for each layout kind, with an instance
    filter; stage_times times every step."""
    import numpy as np
    import torch

    from detsampler import LayoutConfig, Plan
    from detsampler.filter import RepetitionFilter
    from detsampler.loader.dataset import FIELDS, PackedDataset
    from tests.benchmarks.ceiling import get_batch_before, get_batch_per_span, stage_times
    from tests.benchmarks.read_stages import FIELD_STAGES, staged_batch

    for kind in ("concat", "document", "bestfit"):
        layout = small_index.layout(LayoutConfig(kind=kind, seq_len=48))
        ds = PackedDataset(small_index, layout)
        filtered = PackedDataset(small_index, layout, instance_filter=RepetitionFilter(max_count=3), instance_mask=True)
        plan = Plan(len(ds), seed=1, global_batch_size=3, micro_batch_size=3)
        batches = [np.asarray(plan.micro_batch(s, 0, 0)) for s in range(3)]
        for ids in batches:
            got = ds.get_batch(ids)
            for other in (get_batch_before(ds, ids), get_batch_per_span(ds, ids), staged_batch(ds, ids, {})):
                assert all(torch.equal(got[k], other[k]) for k in FIELDS)
            want, staged = filtered.get_batch(ids), staged_batch(filtered, ids, {})
            assert set(want) == set(staged) and all(torch.equal(want[k], staged[k]) for k in want)
    times = stage_times(ds, plan, batches, repeats=2)
    assert {"plan", *FIELD_STAGES, "get_batch", "get_batch per span", "get_batch before"} <= set(times)
    assert all(times[k] > 0 for k in ("plan", "locate", "token join", "get_batch", "get_batch before"))


@pytest.fixture(scope="module")
def chat_index_for_stages(tmp_path_factory):
    from detsampler.index import build_index
    from detsampler.text.chat import ChatConfig
    from tests.chat_data import chat_dataset, make_chat_tokenizer

    tok = make_chat_tokenizer(tmp_path_factory.mktemp("chat-tok"))
    return build_index(chat_dataset(24, seed=3), tok, cache_dir=tmp_path_factory.mktemp("chat"), progress=False,
                       chat=ChatConfig())  # fmt: skip


def test_the_staged_read_of_a_chat_index_equals_get_batch(chat_index_for_stages):
    """The stage table of benchmark 15: the step-by-step read of a chat index (the loss mask laid out and applied to
    the labels in the same pass) equals get_batch, loss_mask included, for each layout kind."""
    import numpy as np
    import torch

    from detsampler import LayoutConfig
    from detsampler.loader.dataset import PackedDataset
    from tests.benchmarks.read_stages import staged_batch

    for kind in ("concat", "document", "bestfit"):
        ds = PackedDataset(chat_index_for_stages, chat_index_for_stages.layout(LayoutConfig(kind=kind, seq_len=64)))
        for ids in (np.arange(3), np.arange(len(ds))[::-1][:4]):
            want, got = ds.get_batch(ids), staged_batch(ds, ids, {})
            assert set(want) == set(got) and "loss_mask" in got
            assert all(torch.equal(want[k], got[k]) for k in want)


def test_the_ceiling_verdict_states_the_gap_or_meets_the_target():
    from tests.benchmarks.bench_loader import _ceiling_verdict, _shape_tables
    from tests.benchmarks.ceiling import CeilingRun

    runs = [CeilingRun("memcpy of the same bytes", 1e9, 0.9e9, 1.1e9), CeilingRun("vectorized gather", 1e8, 1, 2)]
    stages = {
        b: {
            "plan": 40.0,
            "locate": 100.0,
            "read + fields": 200.0,
            "get_batch": 300.0,
            "read + fields before": 400.0,
            "get_batch before": 500.0,
        }
        for b in (8, 64)
    }
    rows = [
        (8, runs, runs[0], {"fields": 1e7, "tokens": 5e6}, {"fields": 2e7, "tokens": 3e7}),
        (64, runs, runs[0], {"fields": 5e7}, {"fields": 6e7}),
    ]
    missed = _ceiling_verdict(rows, stages, 2)
    assert not missed.met
    assert "8 x 2,048: detsampler concat 1e+07 tokens/s = 1.00% of the ceiling's 1e+09 tokens/s" in missed.detail
    assert "70x short of 70%" in missed.detail and "locate 100" in missed.detail
    met = _ceiling_verdict([(8, runs, runs[0], {"fields": 1e7, "tokens": 7e8}, {"fields": 8e8})], stages, 2)
    assert met.met and "detsampler concat, output='tokens' 7e+08 tokens/s = 70.00%" in met.detail
    tables = _shape_tables([rows[0]], {8: {**stages[8], "read, tokens": 50.0, "get_batch tokens": 150.0}})
    assert tables[1].rows[2] == [
        "8 x 2,048",
        "detsampler concat, output='tokens', DataLoader, best num_workers",
        "5e+06 tokens/s",
        "0.50%",
    ]
    assert tables[2].rows == [  # the steps measured, in the read's order, then the whole reads
        ["plan (the sampler's next micro batch)", "40.0"],
        ["locate", "100.0"],
        ["get_batch, whole", "300.0"],
        ["get_batch, output='tokens'", "150.0"],
        ["get_batch before pack_fields", "500.0"],
    ]


def test_scale_lengths_are_seeded_and_hold_a_token_and_the_eos():
    import numpy as np

    from tests.benchmarks.bench_scale import synthetic_lengths

    a = synthetic_lengths(10_000)
    assert np.array_equal(a, synthetic_lengths(10_000)) and a.min() >= 2 and 30 < np.median(a) < 50


def test_the_verdict_names_the_dataloader_floor_against_the_target_budget():
    """8 x 2,048 at a ceiling of 1e9 tokens/s: 70% allows 16384 / 7e8 s = 23.4 µs; a 46.8 µs floor caps at 35%."""
    from tests.benchmarks.bench_loader import _ceiling_verdict, _floor_table
    from tests.benchmarks.ceiling import CeilingRun

    runs = [CeilingRun("memcpy of the same bytes", 1e9, 0.9e9, 1.1e9)]
    stages = {8: {"plan": 40.0, "locate": 100.0, "read + fields": 200.0, "get_batch": 300.0}}
    floors = {(8, 0): (46.8, 90.0), (8, 1): (500.0, 600.0), (8, 2): (400.0, 450.0)}
    row = (8, runs, runs[0], {"fields": 1e7}, {"fields": 2e7})
    verdict = _ceiling_verdict([row], stages, 2, floors, {8: 30.0})
    assert "70% of the ceiling allows 23.4 µs per 8 x 2,048 batch" in verdict.detail
    assert "takes 46.8 µs" in verdict.detail and "at most 35.0% of the ceiling" in verdict.detail
    assert "writing the four int64 fields alone takes 30.0 µs." in verdict.detail
    table = _floor_table(floors, [row], {8: 30.0})
    assert table.rows[0] == ["8 x 2,048", "0", "46.8 µs", "90.0 µs", "3.5e+08 tokens/s", "35.0%", "30.0 µs", "23.4 µs"]


def test_the_dataloader_floor_hands_over_the_ready_batch_with_and_without_workers():
    """The floor's DataLoader yields the ready block's four fields; it is timed in µs per batch, any worker count."""
    from torch.utils.data import DataLoader

    from detsampler.loader.dataset import collate_micro_batch
    from tests.benchmarks.ceiling import ReadyBatches, dataloader_floor, fields_write_floor

    ready = ReadyBatches(2, 16, 100)
    ready.block[1] = 7
    batches = list(DataLoader(ready, batch_sampler=[[0, 1]] * 3, num_workers=1, collate_fn=collate_micro_batch))
    assert len(batches) == 3
    assert [tuple(v.shape) for v in batches[0].values()] == [(2, 16)] * 4
    assert int(batches[2]["labels"].sum()) == 7 * 32 and int(batches[2]["input_ids"].sum()) == 0
    for workers in (0, 1):
        assert dataloader_floor(lambda: [[0, 1]] * 4, 2, 16, workers, repeats=2) > 0
    assert fields_write_floor(2, 16, repeats=3) > 0


def test_the_stored_table_ranks_by_the_second_pass_and_shows_the_first():
    from tests.benchmarks.bench_loader import WORKERS, _group_table

    rates = {("a", w): (2e7, 10, 1e7) for w in WORKERS} | {("b", w): (3e7, 10, 3e7) for w in WORKERS}
    rates[("b", 1)] = "RuntimeError: boom"
    table, strongest = _group_table("T", rates, ["a", "b"], 1e9, first_pass=True)
    assert table.columns[2:4] == ["tokens/s", "first pass"]
    assert table.rows[0][2:4] == ["2e+07 tokens/s", "1e+07 tokens/s"]
    assert table.rows[len(WORKERS) + 1][2:4] == ["failed: RuntimeError: boom", "—"]
    assert strongest.startswith("Strongest contender: b with num_workers=")


def test_a_child_that_aborts_after_its_result_still_reports_it(tmp_path, monkeypatch):
    """A peer's threads can abort a child's interpreter teardown (exit -6) after it printed its measurement: the result
    counts, with its exit code; a child that dies before printing one yields None."""
    from tests.benchmarks.common import run_child

    (tmp_path / "abort_after.py").write_text(
        "import json, os, sys\nargs = json.load(sys.stdin)\nprint(json.dumps({'got': args['x']}), flush=True)\n"
        "os.abort()\n"
    )
    (tmp_path / "abort_before.py").write_text("import os\nos.abort()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    assert run_child("abort_after", {"x": 3}, timeout=60) == {"got": 3, "exit_code": -6}
    assert run_child("abort_before", {}, timeout=60) is None
