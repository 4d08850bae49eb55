"""docs/usage.md's Python examples run as written, in order and in one namespace, and print what the document says.

Blocks whose first line starts with ``# not run`` need a cluster, torchtitan or an API not on this branch and are
skipped.
"""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

USAGE = Path(__file__).resolve().parents[1] / "docs" / "usage.md"


def python_blocks_with_output() -> list[tuple[str, str | None]]:
    """Each runnable ```python block, with the ``` block after a line 'prints' that follows it (its expected output)."""
    pattern = re.compile(r"```python\n(.*?)```\n(?:\s*prints\s*\n\s*```\n(.*?)```)?", re.S)
    blocks = [(m.group(1), m.group(2)) for m in pattern.finditer(USAGE.read_text())]
    return [(code, out) for code, out in blocks if not code.startswith("# not run")]


def test_usage_examples_run_and_print_what_they_say():
    blocks = python_blocks_with_output()
    assert len(blocks) >= 3, "docs/usage.md lost its runnable examples"
    namespace = {"__name__": "__usage__"}
    for code, expected in blocks:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(code, str(USAGE), "exec"), namespace)
        if expected is not None:
            assert out.getvalue() == expected, code
