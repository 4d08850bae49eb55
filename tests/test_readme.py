"""The README's Python examples run as written and print what the README says they print."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks_with_output() -> list[tuple[str, str | None]]:
    """Each ```python block, with the ``` block that follows it after a line 'prints' (its expected output), if any."""
    text = README.read_text()
    pattern = re.compile(r"```python\n(.*?)```\n(?:\s*prints\s*\n\s*```\n(.*?)```)?", re.S)
    return [(m.group(1), m.group(2)) for m in pattern.finditer(text)]


def test_readme_examples_run_and_print_what_they_say(tmp_path, monkeypatch):
    monkeypatch.setenv("DETSAMPLER_CACHE", str(tmp_path / "cache"))  # the default index example builds one
    blocks = python_blocks_with_output()
    assert blocks, "the README has no python example"
    for code, expected in blocks:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(code, str(README), "exec"), {"__name__": "__readme__"})
        if expected is not None:
            assert out.getvalue() == expected
