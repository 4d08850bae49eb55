"""docs/benchmarks.md's sections and README's benchmark table (tests/benchmarks/report.py, headlines.py, run_all.py),
exercised on tiny benchmark modules written here: ``--only`` replaces one section and keeps the others, and README's
table is always the one derived from the document."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from tests.benchmarks import run_all
from tests.benchmarks.headlines import HEADLINES, headline_rows, readme_table
from tests.benchmarks.report import README_END, README_START, parse_sections

ROOT = Path(__file__).resolve().parents[1]

TINY = """
import os
from tests.benchmarks.common import BenchResult, Table, Verdict

def main():
    rate = float(os.environ.get("TINY_RATE_{name}", "1"))
    table = Table("Rates", ["contender", "rate"], [["detsampler", f"{{rate:g}}"], ["peer", "2"]])
    return BenchResult({number}, "{name}", "method", [table], [Verdict("rate >= 1", rate >= 1, f"rate {{rate:g}}")])
"""


@pytest.fixture
def tiny_benchmarks(tmp_path, monkeypatch):
    """A package of two real (tiny) benchmark modules, ``alpha`` and ``beta``, and a README with the table markers."""
    package = tmp_path / "tinybench"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for number, name in ((91, "alpha"), (92, "beta")):
        (package / f"bench_{name}.py").write_text(textwrap.dedent(TINY.format(name=name, number=number)))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(run_all, "HERE", package)
    monkeypatch.setattr(run_all, "PACKAGE", "tinybench")
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\n{README_START}\nstale\n{README_END}\n\nafter\n")
    yield tmp_path, readme
    for mod in [m for m in sys.modules if m.startswith("tinybench")]:
        del sys.modules[mod]


def test_only_replaces_its_section_and_keeps_the_others(tiny_benchmarks, monkeypatch):
    tmp_path, readme = tiny_benchmarks
    out = tmp_path / "benchmarks.md"
    assert run_all.main(["--out", str(out), "--readme", str(readme)]) == 0
    first = parse_sections(out.read_text())
    assert list(first) == ["alpha", "beta"] and first["alpha"].loads is not None
    assert "- Benchmark 91 (alpha, " in out.read_text() and "**MET** — target: rate >= 1. rate 1" in out.read_text()

    monkeypatch.setenv("TINY_RATE_alpha", "0.5")
    assert run_all.main(["--only", "alpha", "--out", str(out), "--readme", str(readme)]) == 0
    second = parse_sections(out.read_text())
    assert second["beta"] == first["beta"]  # kept as it was: markdown, date, load, seconds
    assert "| detsampler | 0.5 |" in second["alpha"].markdown and "**MISSED**" in out.read_text()
    text = readme.read_text()
    assert "stale" not in text and text.endswith(f"{README_END}\n\nafter\n")
    assert readme_table(list(second.values())) in text


def test_only_refuses_a_document_without_sections(tiny_benchmarks):
    tmp_path, readme = tiny_benchmarks
    out = tmp_path / "benchmarks.md"
    out.write_text("# Benchmarks\n\nno sections\n")
    with pytest.raises(SystemExit):
        run_all.main(["--only", "alpha", "--out", str(out), "--readme", str(readme)])
    assert out.read_text() == "# Benchmarks\n\nno sections\n"


def test_readme_table_is_the_one_derived_from_docs_benchmarks_md():
    """README's table cannot drift: it must equal what ``run_all --readme-only`` writes from docs/benchmarks.md."""
    sections = list(parse_sections((ROOT / "docs" / "benchmarks.md").read_text()).values())
    readme = (ROOT / "README.md").read_text()
    assert readme_table(sections) in readme, "run `python -m tests.benchmarks.run_all --readme-only`"


def test_every_section_of_docs_benchmarks_md_has_its_own_headline_rows(capsys):
    """A known benchmark whose tables changed falls back to a generic row; this names it so its headline is updated."""
    sections = parse_sections((ROOT / "docs" / "benchmarks.md").read_text())
    for name, section in sections.items():
        rows = headline_rows(section)
        assert rows and all(len(r) == 3 for r in rows)
        if name in HEADLINES:
            assert "README row of benchmark" not in capsys.readouterr().out, name


def test_scale_sizes_over_the_disk_budget_or_the_free_disk_are_skipped_with_the_reason():
    import numpy as np

    from tests.benchmarks.bench_scale import MAX_EXTRA_BYTES, estimated_bytes, skip_reason, synthetic_lengths

    assert estimated_bytes(10**8) < MAX_EXTRA_BYTES < estimated_bytes(10**9)
    assert skip_reason(10**6, 100 * 10**9) is None and skip_reason(10**8, 100 * 10**9) is None
    assert "over the 10.0 GB budget" in skip_reason(10**9, 10**12)
    assert "free" in skip_reason(10**8, 10 * 10**9)
    assert 7 <= float(np.median(synthetic_lengths(10_000, median=8.0))) <= 9


def test_the_ceiling_headline_names_the_dataloader_floor_when_the_section_has_it():
    from tests.benchmarks.headlines import _floor

    table = (
        "**torch's DataLoader alone: µs per batch to hand over a batch made in advance**\n\n"
        "| micro batch | num_workers | list of index lists | DeterministicBatchSampler | at most (list) | / ceiling |"
        " 70% of the ceiling allows |\n|---|---|---|---|---|---|---|\n"
        "| 8 x 2,048 | 1 | 900.0 µs | 950.0 µs | 1.8e+07 tokens/s | 0.3% | 3.4 µs |\n"
        "| 8 x 2,048 | 0 | 12.5 µs | 72.3 µs | 1.31e+09 tokens/s | 18.9% | 3.4 µs |\n"
    )
    assert _floor(table) == (
        "; torch's DataLoader alone takes 12.5 µs per batch, at most 18.9% of the ceiling, where 70% allows 3.4 µs"
    )
    assert _floor("no such table") == ""
