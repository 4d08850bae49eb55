"""docs/usage.md's "A contamination audit end to end" runs as written: the trainer (one process) trains 8 steps, `where`
finds a document's steps, the run resumes with the document redacted from step 8 on, and `verify --against` and `stats`
prove nothing else moved. Each command of the section's shell block runs in an empty directory (the repository's config
path made absolute; the cache in ``$DETSAMPLER_CACHE``); a ``detsampler`` command must print exactly what the document
shows, a trainer command the lines it shows, in order, ``...`` standing for lines left out and the loss, throughput and
data wait of a step line not compared (they depend on the machine; its sample hash is compared)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
USAGE = ROOT / "docs" / "usage.md"
SECTION = "## A contamination audit end to end"
_STEP_LINE = re.compile(r"^step +(\d+) \| loss [0-9.]+ \| lr ([0-9.e+-]+) \| .* \| samples ([0-9a-f]+)$")


def audit_commands() -> list[tuple[str, list[str]]]:
    """The section's shell block: (command, the lines shown after it)."""
    text = USAGE.read_text()
    section = text[text.index(SECTION) :]
    block = re.search(r"```console\n(.*?)```", section, re.S).group(1)
    commands: list[tuple[str, list[str]]] = []
    for line in block.splitlines():
        if line.startswith("$ "):
            commands.append((line[2:], []))
        else:
            commands[-1][1].append(line)
    return commands


def _comparable(line: str) -> str:
    m = _STEP_LINE.match(line)
    return f"step {m.group(1)} lr {m.group(2)} samples {m.group(3)}" if m else line


def _in_order(expected: list[str], printed: list[str]) -> bool:
    """Each shown line (``...`` aside) is printed, in this order."""
    got = iter(_comparable(line) for line in printed)
    return all(any(line == g for g in got) for line in map(_comparable, expected) if line != "...")


def test_the_contamination_audit_runs_as_the_document_shows(tmp_path, capsys, monkeypatch):
    from detsampler.cli import main

    commands = audit_commands()
    programs = [c.split()[:2] for c, _ in commands]
    assert programs[:3] == [["python", "-m"], ["detsampler", "where"], ["python", "-m"]], programs
    assert ["detsampler", "verify"] in programs, programs
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DETSAMPLER_CACHE", str(tmp_path / "cache"))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DETSAMPLER_CACHE": str(tmp_path / "cache")}
    for command, expected in commands:
        argv = shlex.split(command)
        if argv[0] == "python":
            argv = [sys.executable, *(str(ROOT / a) if a.startswith("train/configs/") else a for a in argv[1:])]
            result = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
            printed = (result.stdout + result.stderr).splitlines()
            assert result.returncode == 0, "\n".join(printed[-40:])
            assert _in_order(expected, printed), "\n".join(printed)
            continue
        assert argv[0] == "detsampler", command
        try:
            code = main(argv[1:])
        except SystemExit as exc:
            code = exc.code
        captured = capsys.readouterr()
        assert code == 0, captured.err
        assert (captured.out + captured.err).splitlines() == expected, command + "\n" + captured.out + captured.err
