"""docs/integrations.md's runnable Python example (torchdata's StatefulDataLoader) prints what the document says."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "integrations.md"


def test_integrations_doc_examples_run_and_print_what_they_say():
    pattern = re.compile(r"```python\n(.*?)```\n(?:\s*prints\s*\n\s*```\n(.*?)```)?", re.S)
    blocks = [
        (m.group(1), m.group(2)) for m in pattern.finditer(DOC.read_text()) if not m.group(1).startswith("# not run")
    ]
    assert blocks, "docs/integrations.md lost its runnable example"
    for code, expected in blocks:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(code, str(DOC), "exec"), {"__name__": "__integrations_doc__"})
        assert out.getvalue() == expected, code
