"""What every benchmark shares: timing helpers, result tables with ratios to the best contender, and target verdicts.

A benchmark module ``tests/benchmarks/bench_<name>.py`` has a ``main()`` that runs its contenders side by side (in one
process, interleaved, or in fresh subprocesses one after the other) and returns a :class:`BenchResult`; ``run_all``
prints it and writes its markdown into ``docs/benchmarks.md``. Run one alone with ``python -m
tests.benchmarks.bench_<name>``.
"""

from __future__ import annotations

import json
import math
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "BenchResult",
    "Table",
    "Verdict",
    "fmt_bytes",
    "fmt_rate",
    "fmt_seconds",
    "median_time",
    "peak_rss_bytes",
    "ratio_column",
    "run_child",
]


@dataclass
class Table:
    """A markdown table: ``columns`` names, ``rows`` of already formatted cells, optional notes printed under it."""

    title: str
    columns: list[str]
    rows: list[list[str]]
    notes: list[str] = field(default_factory=list)

    def markdown(self) -> str:
        lines = [f"**{self.title}**", "", "| " + " | ".join(self.columns) + " |", "|" + "---|" * len(self.columns)]
        lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in self.rows]
        if self.notes:
            lines.append("")
            lines += [f"- {n}" for n in self.notes]
        return "\n".join(lines)


@dataclass
class Verdict:
    """A target of the issue and whether this run met it; ``detail`` states the measured value and,
    if missed, the gap."""

    target: str
    met: bool
    detail: str

    def markdown(self) -> str:
        return f"- **{'MET' if self.met else 'MISSED'}** — target: {self.target}. {self.detail}"


@dataclass
class BenchResult:
    """What one benchmark returns to ``run_all``."""

    number: int
    title: str
    method: str
    tables: list[Table]
    verdicts: list[Verdict]
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def markdown(self) -> str:
        parts = [f"## {self.number}. {self.title}", "", self.method, ""]
        for table in self.tables:
            parts += [table.markdown(), ""]
        if self.verdicts:
            parts += ["Target verdict:", ""] + [v.markdown() for v in self.verdicts] + [""]
        if self.notes:
            parts += [f"- {n}" for n in self.notes] + [""]
        parts.append(f"_(this benchmark took {self.seconds:.0f} s)_")
        return "\n".join(parts)


def median_time(fn: Callable[[], Any], repeats: int) -> float:
    """Median wall time of ``repeats`` calls of ``fn`` (seconds)."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def peak_rss_bytes() -> int:
    """This process's peak resident set size so far (Linux reports ``ru_maxrss`` in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def ratio_column(values: Sequence[float | None], higher_is_better: bool) -> list[str]:
    """Each value against the best one: ``value / best`` for times, ``value / best`` for rates (best is 1.00x)."""
    known = [v for v in values if v is not None and math.isfinite(v) and v > 0]
    if not known:
        return ["—" for _ in values]
    best = max(known) if higher_is_better else min(known)
    out = []
    for v in values:
        if v is None or not math.isfinite(v) or v <= 0:
            out.append("—")
        elif v == best:
            out.append("1.00x (best)")
        else:
            out.append(f"{v / best:.3g}x")
    return out


def fmt_seconds(s: float | None) -> str:
    if s is None:
        return "—"
    if s < 1e-3:
        return f"{s * 1e6:.0f} µs"
    if s < 1:
        return f"{s * 1e3:.2f} ms"
    if s < 3600:
        return f"{s:.1f} s"
    if s < 86400 * 3:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} days"


def fmt_bytes(b: float | None) -> str:
    if b is None:
        return "—"
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(b) >= size:
            return f"{b / size:.1f} {unit}"
    return f"{b:.0f} B"


def fmt_rate(r: float | None, unit: str = "/s") -> str:
    if r is None:
        return "—"
    return f"{r:.3g}{unit}"


def run_child(module: str, args: dict, timeout: float) -> dict | None:
    """Run ``python -m module`` in a fresh interpreter with ``args`` as JSON on stdin; return its last stdout line as
    JSON.

    Returns None when the child ran past ``timeout`` seconds (it is killed) or failed before printing a result; its
    stderr is echoed on failure. A child that printed its result and then exited non-zero (a peer's threads aborting
    the interpreter's teardown: "terminate called without an active exception") measured what it was asked to: its
    result is returned with ``"exit_code"`` added, and the exit is echoed.
    """
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    try:
        proc = subprocess.run(
            [sys.executable, "-m", module],
            input=json.dumps(args),
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
        )
    except subprocess.TimeoutExpired:
        return None
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0:
        after = " after printing its result" if lines else ""
        sys.stderr.write(f"[{module} {args}] exited {proc.returncode}{after}:\n{proc.stderr[-2000:]}\n")
        return {**json.loads(lines[-1]), "exit_code": proc.returncode} if lines else None
    return json.loads(lines[-1]) if lines else None
