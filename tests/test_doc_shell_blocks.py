"""Every shell block of the README and docs is run by this test, marked ``<!-- shell: run -->`` on the line before it,
or marked ``<!-- shell: not run: REASON -->``.

A run block is a list of ``$ detsampler ...`` commands, each followed by what it prints (stdout, then stderr); each is
run in process in an empty directory with its own cache, and must print exactly that.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *(ROOT / "docs" / name for name in ("cli.md", "usage.md", "design.md", "integrations.md"))]
SHELL_LANGS = {"bash", "console", "sh", "shell"}
MARK = re.compile(r"^<!-- shell: (run|not run: \S.*) -->$")


def shell_blocks(path: Path) -> list[tuple[int, list[str], str]]:
    """(line of the opening fence, the block's lines, the non-blank line before the fence) of each shell block: a fenced
    block in a shell language, or an unlabelled one whose first line is a ``$ `` command."""
    lines = path.read_text().split("\n")
    blocks, i = [], 0
    while i < len(lines):
        fence = re.match(r"^```(\w*)\s*$", lines[i])
        if not fence:
            i += 1
            continue
        j = i + 1
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        body, lang = lines[i + 1 : j], fence.group(1)
        if lang in SHELL_LANGS or (lang == "" and body and body[0].startswith("$ ")):
            k = i - 1
            while k >= 0 and not lines[k].strip():
                k -= 1
            blocks.append((i + 1, body, lines[k] if k >= 0 else ""))
        i = j + 1
    return blocks


def test_every_shell_block_is_run_or_marked_not_run() -> None:
    unmarked = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in DOCS
        for line, _, before in shell_blocks(path)
        if not MARK.match(before)
    ]
    assert unmarked == [], "mark each with <!-- shell: run --> (and make it run) or <!-- shell: not run: REASON -->"


RUN = [
    pytest.param(body, id=f"{path.name}:{line}")
    for path in DOCS
    for line, body, before in shell_blocks(path)
    if before == "<!-- shell: run -->"
]


def _commands(body: list[str]) -> list[tuple[str, list[str]]]:
    commands: list[tuple[str, list[str]]] = []
    for line in body:
        if line.startswith("$ "):
            commands.append((line[2:], []))
        else:
            commands[-1][1].append(line)
    return commands


@pytest.mark.parametrize("body", RUN)
def test_run_blocks_print_what_they_say(capsys, monkeypatch, tmp_path, body: list[str]) -> None:
    from detsampler.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DETSAMPLER_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("COLUMNS", "80")  # argparse's help width
    for command, expected in _commands(body):
        argv = shlex.split(command)
        assert argv[0] == "detsampler", command
        try:
            main(argv[1:])
        except SystemExit:
            pass
        captured = capsys.readouterr()
        assert (captured.out + captured.err).splitlines() == expected, command
