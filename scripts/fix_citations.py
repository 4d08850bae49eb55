"""Move docs/comparison.md's citations of this tree (`` `file:line` (`text`) ``) to the lines that hold their text now.

A citation whose quoted text is no longer on its lines is moved to the nearest lines of the same count that hold it;
one whose text is nowhere in its file is printed and left as it is (rewrite it by hand). The check itself is
``tests/test_comparison_citations.py``.

    python scripts/fix_citations.py
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "comparison.md"
CITATION = re.compile(
    r"`(?P<path>[\w./-]+\.(?:py|cc))?:(?P<a>\d+)(?:-(?P<b>\d+))?`(?P<sym>\s+\(`(?P<text>[^`]+)`)?", re.MULTILINE
)
OURS = ("detsampler/", "tests/", "train/")


def _flat(text: str) -> str:
    return " ".join(text.split())


def _holds(lines: list[str], a: int, b: int, text: str) -> bool:
    return 1 <= a <= b <= len(lines) and text in _flat(" ".join(lines[a - 1 : b]))


def _nearest(lines: list[str], a: int, b: int, text: str) -> int | None:
    """The first line of the nearest span of ``b - a + 1`` lines that holds ``text``."""
    width = b - a
    starts = [s for s in range(1, len(lines) - width + 1) if _holds(lines, s, s + width, text)]
    return min(starts, key=lambda s: (abs(s - a), s)) if starts else None


def fixed(doc: str) -> tuple[str, list[str]]:
    """``doc`` with every movable citation moved, and a line per citation that could not be."""
    out, problems, last = [], [], 0
    start = doc.index("## Sources")
    for bullet in re.finditer(r"^- \[.*?(?=^- \[|\Z)", doc[start:], re.M | re.S):
        path = None
        for m in CITATION.finditer(bullet.group()):
            path = m["path"] or path
            if not path or not path.startswith(OURS) or not m["text"]:
                continue
            lines = (ROOT / path).read_text().splitlines()
            a, b, text = int(m["a"]), int(m["b"] or m["a"]), _flat(m["text"])
            if _holds(lines, a, b, text):
                continue
            new = _nearest(lines, a, b, text)
            if new is None:
                problems.append(f"{path}:{a}: {text!r} is nowhere in the file")
                continue
            span = f"{new}-{new + b - a}" if m["b"] else f"{new}"
            where = start + bullet.start() + m.start("a")
            end = start + bullet.start() + (m.end("b") if m["b"] else m.end("a"))
            out.append(doc[last:where] + span)
            last = end
    out.append(doc[last:])
    return "".join(out), problems


def main() -> int:
    text, problems = fixed(DOC.read_text())
    DOC.write_text(text)
    for line in problems:
        print(line)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
