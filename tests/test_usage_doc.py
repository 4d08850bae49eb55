"""docs/usage.md's Python examples run as written, in order and in one namespace, and print what the document says.

Blocks whose first line starts with ``# not run`` need a cluster, torchtitan or an API not on this branch and are
skipped.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

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


@pytest.mark.slow
def test_the_torchrun_example_prints_what_the_document_says(tmp_path):
    """The two torchrun commands of "An FSDP / torchrun trainer", run as written (the checkpoint path aside), print the
    lines the document shows (they showed mapping version 1's ids after version 2 became the default: issue 21)."""
    text = USAGE.read_text()
    section = text[text.index("## An FSDP / torchrun trainer") :]
    commands = re.search(r"```bash\n(.*?)```", section, re.S).group(1).strip().splitlines()
    printed_block = re.search(r"printed \(lines sorted by rank[^)]*\):\n\n```\n(.*?)```", section, re.S)
    expected = printed_block.group(1).splitlines()
    assert len(commands) == 2 and all(c.startswith("torchrun ") for c in commands), commands
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root), "PYTHONUNBUFFERED": "1"}
    printed = []
    for command in commands:
        argv = shlex.split(command.replace("/tmp/ds_ckpt", str(tmp_path / "ds_ckpt")))
        argv = [sys.executable, "-m", "torch.distributed.run", *argv[1:]]
        result = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
        printed.append(sorted(line for line in result.stdout.splitlines() if "world " in line))
    assert printed[0] + printed[1] == expected
