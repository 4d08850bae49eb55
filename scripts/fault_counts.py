"""The counts under docs/design.md's Faults table (§10), computed from its rows.

Each row's first cell is ``MARK ×N`` (N faults of one kind) and its fourth cell the outcome (``refused`` or
``recovered``; ``silent`` is never allowed). The table of counts between the ``<!-- fault-counts -->`` markers is what
this script writes; ``tests/test_fault_counts.py`` checks that the page holds exactly what it would write.

    python scripts/fault_counts.py          # print the counts
    python scripts/fault_counts.py --write  # rewrite them in docs/design.md
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

DESIGN = Path(__file__).resolve().parents[1] / "docs" / "design.md"
BEGIN, END = "<!-- fault-counts -->", "<!-- /fault-counts -->"
ROW = re.compile(r"^\| (?P<mark>[0-9A-Z]+) ×(?P<n>\d+) \|(?:[^|]|\\\|)*\|(?:[^|]|\\\|)*\| (?P<outcome>[^|]+?) \|", re.M)

# Each mark's group, in the order they are printed. A new mark needs its line here.
GROUPS: dict[str, tuple[str, tuple[str, ...]]] = {
    "1 to 12": ("the first list of faults", tuple(str(i) for i in range(1, 13))),
    "B": ("bad input at the CLI, the API and the trainer", ("B",)),
    "E": ("the index, pre-tokenized sources, caches and CLI inputs at the edges", ("E",)),
    "21": ("the trainer's config and the edges it meets", ("21",)),
    "22": ("object storage", ("22",)),
    "23": ("chat data and loss masks", ("23",)),
    "24": ("a new document order each epoch", ("24",)),
    "25": ("the Grain and torchft integrations", ("25",)),
    "31": ("the surfaces added by issues 22 to 25, reviewed (issue 31)", ("31",)),
    "32": ("takedowns end to end: ids, redaction in every integration, erasure (issue 32)", ("32",)),
    "33": ("images beside text: headers, counts, packing, the VLM batch, chat, the CLI, media in a bucket", ("33",)),
    "34": ("the compute-balanced plan", ("34",)),
    "37": ("buckets at the scale of large runs: opens, prefetch everywhere, the node-shared cache (issue 37)", ("37",)),
}


def faults_section(text: str) -> str:
    start = text.index("## 10. Faults")
    return text[start : text.index(BEGIN, start)]


def rows(text: str) -> list[tuple[str, int, str]]:
    """(mark, count, outcome) of every row of the Faults table."""
    out = []
    for m in ROW.finditer(faults_section(text)):
        outcome = m["outcome"].strip()
        kind = outcome.split()[0]
        if kind not in ("refused", "recovered"):
            raise ValueError(f"a fault row marked {m['mark']} has the outcome {outcome!r}: refused or recovered only")
        out.append((m["mark"], int(m["n"]), kind))
    return out


def counts_table(text: str) -> str:
    """The markdown of the counts: the totals, then one line per group of marks."""
    group_of = {mark: name for name, (_, marks) in GROUPS.items() for mark in marks}
    per: dict[str, list[int]] = {name: [0, 0, 0] for name in GROUPS}
    for mark, n, kind in rows(text):
        if mark not in group_of:
            raise ValueError(f"fault rows marked {mark!r} have no group: add it to GROUPS in {__file__}")
        tried_refused_recovered = per[group_of[mark]]
        tried_refused_recovered[0] += n
        tried_refused_recovered[1 if kind == "refused" else 2] += n
    total = [sum(v[i] for v in per.values()) for i in range(3)]
    lines = [
        BEGIN,
        f"Counts, every row above: **{total[0]} faults tried, {total[1]} refused clearly, {total[2]} recovered, "
        "0 silent**",
        "(written by `python scripts/fault_counts.py --write`, checked by `tests/test_fault_counts.py`).",
        "",
        "| mark | faults of | tried | refused | recovered |",
        "|---|---|---|---|---|",
    ]
    for name, (what, _) in GROUPS.items():
        tried, refused, recovered = per[name]
        if tried:
            lines.append(f"| {name} | {what} | {tried} | {refused} | {recovered} |")
    lines.append(END)
    return "\n".join(lines)


def with_counts(text: str) -> str:
    """``text`` with its counts table rewritten from its rows."""
    start, end = text.index(BEGIN), text.index(END) + len(END)
    return text[:start] + counts_table(text) + text[end:]


def main(argv: list[str]) -> int:
    text = DESIGN.read_text()
    if argv[1:] == ["--write"]:
        DESIGN.write_text(with_counts(text))
    print(counts_table(text))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
