"""docs/comparison.md cites code as `` `file:line` (`text`) ``: the cited line (or range) must contain that text.
Checked for every detsampler citation against this tree, and for a peer's citation against its installed release where
that file is installed (the main-branch citations of the page were checked by hand at the commits it names)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "comparison.md"
CITATION = re.compile(
    r"`(?P<path>[\w./-]+\.(?:py|cc))?:(?P<a>\d+)(?:-(?P<b>\d+))?`(?P<sym>\s+\(`(?P<text>[^`]+)`)?", re.MULTILINE
)
OURS = ("detsampler/", "tests/", "train/")


def _flat(text: str) -> str:
    return " ".join(text.split())


def _bullets(doc: str) -> list[str]:
    """The sources list's bullets (``- [X1] ...`` with their continuation lines)."""
    sources = doc[doc.index("## Sources") :]
    return [b for b in re.split(r"\n(?=- \[)", sources) if b.startswith("- [")]


def citations(doc: str) -> list[tuple[str, str, int, int, str | None]]:
    """(bullet label, path, first line, last line, quoted text or None) of every citation; ``:N`` continues the path
    last named in its bullet."""
    out = []
    for bullet in _bullets(doc):
        label, path = bullet.split("]")[0][3:], None
        for m in CITATION.finditer(bullet):
            path = m["path"] or path
            a = int(m["a"])
            out.append((label, path, a, int(m["b"] or a), _flat(m["text"]) if m["text"] else None))
    return out


def _lines(file: Path, a: int, b: int) -> str:
    lines = file.read_text().splitlines()
    assert 1 <= a <= b <= len(lines), f"{file}:{a}-{b} is past its {len(lines)} lines"
    return _flat(" ".join(lines[a - 1 : b]))


def test_every_detsampler_citation_names_a_line_that_holds_its_text():
    ours = [c for c in citations(DOC.read_text()) if c[1].startswith(OURS)]
    assert len(ours) >= 30
    for label, path, a, b, text in ours:
        assert text is not None, f"[{label}] {path}:{a} quotes no text"
        assert text in _lines(ROOT / path, a, b), f"[{label}] {path}:{a}-{b} does not contain {text!r}"


def test_every_installed_peer_citation_names_a_line_that_holds_its_text():
    checked = 0
    for label, path, a, b, text in citations(DOC.read_text()):
        if path.startswith(OURS):
            continue
        try:
            spec = importlib.util.find_spec(path.split("/")[0])
        except (ImportError, ValueError):
            spec = None
        file = (
            Path(spec.submodule_search_locations[0]).parent / path if spec and spec.submodule_search_locations else None
        )
        if file is None or not file.is_file():
            continue  # not installed here, or a main-branch file the release does not ship
        assert text is not None, f"[{label}] {path}:{a} quotes no text"
        assert text in _lines(file, a, b), f"[{label}] {path}:{a}-{b} does not contain {text!r}"
        checked += 1
    if importlib.util.find_spec("torchtitan"):  # installed by `make test`
        assert checked >= 10


def test_every_code_path_in_the_page_is_cited_with_its_text():
    """A bare `detsampler/x.py:N` anywhere on the page (outside the checked form) would escape the checks above."""
    doc = DOC.read_text()
    for m in CITATION.finditer(doc):
        if (m["path"] or "").startswith(OURS):
            assert m["text"], f"{m[0]!r} quotes no text"
