"""docs/design.md §10: the counts under the Faults table are the sums of its rows (scripts/fault_counts.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _tool():
    spec = importlib.util.spec_from_file_location("fault_counts", ROOT / "scripts" / "fault_counts.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_counts_under_the_faults_table_are_the_sums_of_its_rows():
    tool = _tool()
    text = (ROOT / "docs" / "design.md").read_text()
    assert tool.with_counts(text) == text, "run: python scripts/fault_counts.py --write"


def test_a_row_of_no_known_outcome_or_mark_is_refused():
    tool = _tool()
    text = (ROOT / "docs" / "design.md").read_text()
    row = "| 2 ×1 | x | y | silent | `t` |\n"
    at = text.index("| 2 ×1 |")
    with pytest.raises(ValueError, match="refused or recovered only"):
        tool.counts_table(text[:at] + row + text[at:])
    with pytest.raises(ValueError, match="have no group"):
        tool.counts_table(text[:at] + row.replace("2 ×1", "Q ×1").replace("silent", "refused") + text[at:])
    counts = tool.counts_table(text[:at] + row.replace("silent", "refused") + text[at:])
    assert "| 1 to 12 | the first list of faults | 78 | 54 | 24 |" in counts
