"""``make bench``: run every ``tests/benchmarks/bench_*.py`` one after the other, print them, regenerate
docs/benchmarks.md.

A benchmark module has a ``main()`` (or ``main(argv)``, called with ``[]``) returning a
:class:`~tests.benchmarks.common.BenchResult` (preferred), a markdown string, a list of row dicts (shown as a table), a
dict with ``"markdown"`` or ``"rows"`` (and optionally ``"title"``, ``"number"``, ``"verdicts"``), or a dict of numbers
(nested dicts allowed), shown as a two-column table. For a dict of numbers the harness derives the issue's target
verdict where it knows how (``NUMBER_VERDICTS``: benchmark 4 from ``bench_index``'s ``build_tokens_per_s`` and
``raw_encode_tokens_per_s``). Benchmarks run sequentially, never in parallel, so each has the machine to itself (as far
as we control). A benchmark that raises is reported as failed in the output and the document, the others still run, and
the command exits 1.

Usage: ``python -m tests.benchmarks.run_all [--only resume,memory] [--no-write] [--out docs/benchmarks.md]``.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import importlib.metadata
import inspect
import os
import platform
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from tests.benchmarks.common import BenchResult, Table, Verdict

__all__ = ["discover", "main", "render"]

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
# Benchmark numbers of the issue, by module name; unknown modules come after, by name.
ORDER = {
    "resume": 1,
    "memory": 2,
    "loader": 3,
    "index": 4,
    "permutation": 5,
    "trainer": 6,
    "scale": 7,
    "hf_build": 8,
    "onthefly": 9,
    "source_open": 10,
    "corpus_scale": 11,
}
PACKAGES = (
    "numpy",
    "torch",
    "torchdata",
    "datasets",
    "grain",
    "sentencepiece",
    "megatron-core",
    "ai2-olmo-core",
    "torchtitan",
    "accelerate",
    "tokenizers",
    "datatrove",
)


def discover() -> list[str]:
    """Names (``bench_x`` -> ``x``) of the benchmark modules present, in the issue's order."""
    names = [p.stem[len("bench_") :] for p in HERE.glob("bench_*.py")]
    return sorted(names, key=lambda n: (ORDER.get(n, 99), n))


def _index_verdicts(r: dict) -> list[Verdict]:
    """Benchmark 4's target from bench_index's numbers: build_index at least 80% of sentencepiece's batched encode."""
    build, raw = r.get("build_tokens_per_s"), r.get("raw_encode_tokens_per_s")
    if not build or not raw:
        return []
    ratio = build / raw
    met = ratio >= 0.8
    detail = (
        f"build_index {build:,.0f} tokens/s = {ratio:.0%} of sentencepiece's batched encode ({raw:,.0f} tokens/s) "
        f"with num_proc={r.get('num_proc')} on {r.get('cpu_count')} cores."
    )
    if not met:
        detail += (
            f" Gap: {0.8 / ratio:.2f}x. The harness does not analyse the limit: a build tokenizes, writes, fsyncs and "
            "checksums; see bench_index.py's printed table for the parts."
        )
    return [
        Verdict(
            "build_index at least 80% of sentencepiece's batched encode on the same cores (verdict computed by"
            " run_all)",
            met,
            detail,
        )
    ]


NUMBER_VERDICTS = {"index": _index_verdicts}


def _fmt_value(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}"
    return str(v)


def _dict_rows(d: dict, prefix: str = "") -> list[list[str]]:
    rows: list[list[str]] = []
    for k, v in d.items():
        if isinstance(v, dict):
            rows += _dict_rows(v, f"{prefix}{k}.")
        else:
            rows.append([f"{prefix}{k}", _fmt_value(v)])
    return rows


def _call_main(module: Any) -> Any:
    """``module.main()``, or ``module.main([])`` when its first parameter is an ``argv`` (so it
    parses no CLI of ours)."""
    params = list(inspect.signature(module.main).parameters)
    return module.main([]) if params and params[0] == "argv" else module.main()


def _as_markdown(name: str, result: Any, doc: str | None = None) -> tuple[str, list[str], int]:
    """(markdown, verdict lines, number) of whatever a benchmark's main() returned; ``doc`` (the module's docstring)
    describes the method where the result carries no description of its own (a dict of numbers)."""
    number = ORDER.get(name, 99)
    if isinstance(result, BenchResult) or hasattr(result, "markdown"):
        verdicts = [v.markdown() for v in getattr(result, "verdicts", [])]
        return result.markdown(), verdicts, getattr(result, "number", number)
    if isinstance(result, str):
        verdicts = [line for line in result.splitlines() if "MET" in line or "MISSED" in line]
        return result, verdicts, number
    if isinstance(result, dict):
        number = int(result.get("number", number))
        if "markdown" in result:
            return str(result["markdown"]), [str(v) for v in result.get("verdicts", [])], number
        if "rows" in result:
            title = result.get("title", name)
            return _rows_markdown(title, result["rows"]), [str(v) for v in result.get("verdicts", [])], number
        verdicts = NUMBER_VERDICTS.get(name, lambda r: [])(result)
        title = f"{number}. {name} (the numbers bench_{name}.main() returned)"
        parts = [f"## {title}", ""] + ([doc.strip(), ""] if doc else [])
        parts += [Table("Results", ["quantity", "value"], _dict_rows(result)).markdown()]
        if verdicts:
            parts += ["", "Target verdict:", ""] + [v.markdown() for v in verdicts]
        return "\n".join(parts), [v.markdown() for v in verdicts], number
    if isinstance(result, list):
        return _rows_markdown(name, result), [], number
    return f"## {name}\n\n{result!r}", [], number


def _rows_markdown(title: str, rows: list) -> str:
    if not rows:
        return f"## {title}\n\n(no rows)"
    if isinstance(rows[0], dict):
        columns = list(rows[0])
        cells = [[str(r.get(c, "")) for c in columns] for r in rows]
    else:
        columns = [f"col{i}" for i in range(len(rows[0]))]
        cells = [[str(c) for c in r] for r in rows]
    return f"## {title}\n\n" + Table(title, columns, cells).markdown()


def _load() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:
        return float("nan")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _versions() -> str:
    out = [f"Python {platform.python_version()}"]
    for pkg in PACKAGES:
        try:
            out.append(f"{pkg} {importlib.metadata.version(pkg)}")
        except importlib.metadata.PackageNotFoundError:
            out.append(f"{pkg} (not installed)")
    return ", ".join(out)


def render(sections: list[tuple[int, str, str, list[str], float]], loads: list[float], total: float) -> str:
    """docs/benchmarks.md from ``(number, name, markdown, verdicts, seconds)`` sections."""
    cores = os.cpu_count()
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else cores
    today = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    peak_load = max(loads) if loads else float("nan")
    under_load = peak_load > 1.5
    lines = [
        "# Benchmarks",
        "",
        (
            "Regenerated by `make bench` (`python -m tests.benchmarks.run_all`); do not edit by hand. Every benchmark"
            " runs its"
        ),
        (
            "contenders side by side in one run on the same machine and data, and reports medians with the ratio to the"
            " best"
        ),
        "contender (`1.00x (best)`); for times a ratio above 1 is slower, for rates a ratio below 1 is slower.",
        "",
        f"- Date: {today}",
        (
            f"- Machine: {cores} cores ({usable} usable by this process), {_cpu_model()}, {platform.system()}"
            f" {platform.release()}"
        ),
        f"- Software: {_versions()}",
        f"- Total time: {total:.0f} s",
        f"- 1-minute load average at the start and after each benchmark: {', '.join(f'{x:.1f}' for x in loads)}"
        + (
            f". **Timings were taken under load** (peak {peak_load:.1f} on {cores} cores; this run itself accounts for "
            "about 1): other processes shared the cores, so absolute times are pessimistic; the ratios within a "
            "benchmark, whose contenders ran interleaved or back to back, are the figures to read."
            if under_load
            else "."
        ),
        "",
        "## Summary of targets",
        "",
    ]
    for number, name, _, verdicts, _ in sections:
        for v in verdicts or ["- (no target verdict reported)"]:
            lines.append(f"- Benchmark {number} ({name}): {v.lstrip('- ')}")
    present = {name for _, name, _, _, _ in sections}
    missing = [n for n in ORDER if n not in present]
    if missing:
        lines += [
            "",
            "Not in this run (module absent or not selected): " + ", ".join(f"{ORDER[n]} ({n})" for n in missing) + ".",
        ]
    lines.append("")
    for _, _, markdown, _, _ in sections:
        lines += [markdown, ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", default="", help="comma-separated benchmark names (e.g. resume,memory); default: all")
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks.md alone")
    parser.add_argument("--out", default=str(ROOT / "docs" / "benchmarks.md"), help="where to write the document")
    args = parser.parse_args(argv)
    names = discover()
    if args.only:
        wanted = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = [n for n in wanted if n not in names]
        if unknown:
            parser.error(f"--only got {unknown}, allowed names are {names}")
        names = [n for n in names if n in wanted]

    sections = []
    loads = [_load()]
    failed = []
    t_start = time.perf_counter()
    for name in names:
        print(f"=== benchmark {name} (tests/benchmarks/bench_{name}.py) ===", flush=True)
        t0 = time.perf_counter()
        try:
            module = importlib.import_module(f"tests.benchmarks.bench_{name}")
            markdown, verdicts, number = _as_markdown(name, _call_main(module), module.__doc__)
        except Exception:  # report and go on with the others
            failed.append(name)
            tb = traceback.format_exc()
            sys.stderr.write(tb)
            number = ORDER.get(name, 99)
            markdown = f"## {number}. {name}\n\nFAILED in this run:\n\n```\n{tb.strip().splitlines()[-1]}\n```"
            verdicts = ["**FAILED** — the benchmark raised; see the run's output."]
        seconds = time.perf_counter() - t0
        loads.append(_load())
        sections.append((number, name, markdown, verdicts, seconds))
        print(markdown, flush=True)
        print(f"--- {name}: {seconds:.0f} s ---\n", flush=True)
    total = time.perf_counter() - t_start
    document = render(sections, loads, total)
    if not args.no_write:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(document)
        print(f"wrote {out} ({total:.0f} s in all)")
    if failed:
        print(f"FAILED benchmarks: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
