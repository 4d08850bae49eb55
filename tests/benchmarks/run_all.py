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

Each benchmark's section of the document carries its own date and load (tests/benchmarks/report.py): ``--only NAME``
replaces that section and keeps the others. README.md's benchmark table is then rewritten from the document as written
(tests/benchmarks/headlines.py), so it always shows what docs/benchmarks.md holds; ``--readme-only`` does only that.

Usage: ``python -m tests.benchmarks.run_all [--only resume,memory] [--no-write] [--out docs/benchmarks.md]
[--readme README.md] [--readme-only]``.
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
from tests.benchmarks.headlines import readme_table
from tests.benchmarks.report import (
    Section,
    merge_sections,
    parse_sections,
    read_sections,
    readme_with_table,
    render_document,
)

__all__ = ["discover", "main", "run_one", "write_outputs", "write_readme"]

HERE = Path(__file__).resolve().parent
PACKAGE = "tests.benchmarks"  # the package of HERE, where the bench_<name> modules are imported from
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
    "shard_build": 12,
    "where": 13,
    "filter": 14,
    "sft_mask": 15,
    "sft_packing": 16,
    "remote": 17,
    "sft_open": 18,
    "vlm": 19,
    "balance": 20,
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


def machine() -> str:
    cores = os.cpu_count()
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else cores
    return f"{cores} cores ({usable} usable by this process), {_cpu_model()}, {platform.system()} {platform.release()}"


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def run_one(name: str) -> tuple[Section, bool]:
    """Run benchmark ``name`` and return its section (dated, with the load before and after) and whether it passed;
    a benchmark that raises gets a FAILED section."""
    load_before, t0, ok = _load(), time.perf_counter(), True
    try:
        module = importlib.import_module(f"{PACKAGE}.bench_{name}")
        markdown, _, number = _as_markdown(name, _call_main(module), module.__doc__)
    except Exception:  # report and go on with the others
        ok, tb = False, traceback.format_exc()
        sys.stderr.write(tb)
        number = ORDER.get(name, 99)
        markdown = (
            f"## {number}. {name}\n\nFAILED in this run:\n\n```\n{tb.strip().splitlines()[-1]}\n```\n\n"
            "- **FAILED** — the benchmark raised; see the run's output."
        )
    seconds = time.perf_counter() - t0
    return Section(number, name, markdown, _now(), (load_before, _load()), seconds), ok


def write_outputs(sections: list[Section], out: Path, readme: Path) -> None:
    """docs/benchmarks.md from ``sections``, then README's table from that document as written."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_document(sections, machine(), _versions()))
    write_readme(out, readme)


def write_readme(doc: Path, readme: Path) -> None:
    """README's benchmark table regenerated from the document at ``doc`` (nothing is run)."""
    sections = list(parse_sections(doc.read_text()).values())
    readme.write_text(readme_with_table(readme.read_text(), readme_table(sections)))
    print(f"wrote {readme}'s benchmark table from {doc}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", default="", help="comma-separated benchmark names (e.g. resume,memory); default: all")
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks.md alone")
    parser.add_argument("--out", default=str(ROOT / "docs" / "benchmarks.md"), help="where to write the document")
    parser.add_argument("--readme", default=str(ROOT / "README.md"), help="the README whose benchmark table to write")
    parser.add_argument("--readme-only", action="store_true", help="run nothing: rewrite README's table from --out")
    args = parser.parse_args(argv)
    out, readme = Path(args.out), Path(args.readme)
    if args.readme_only:
        write_readme(out, readme)
        return 0
    names = discover()
    old = read_sections(out)
    if args.only:
        wanted = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = [n for n in wanted if n not in names]
        if unknown:
            parser.error(f"--only got {unknown}, allowed names are {names}")
        if out.exists() and not old and not args.no_write:
            parser.error(f"{out} holds no benchmark sections to keep; run every benchmark (no --only) once")
        names = [n for n in names if n in wanted]

    sections, failed = [], []
    t_start = time.perf_counter()
    for name in names:
        print(f"=== benchmark {name} (tests/benchmarks/bench_{name}.py) ===", flush=True)
        section, ok = run_one(name)
        sections.append(section)
        failed += [] if ok else [name]
        print(section.block(), flush=True)
        print(f"--- {name}: {section.seconds:.0f} s ---\n", flush=True)
    total = time.perf_counter() - t_start
    if not args.no_write:
        write_outputs(merge_sections(old, sections, keep_old=bool(args.only)), out, readme)
        print(f"wrote {out} ({total:.0f} s in all)")
    if failed:
        print(f"FAILED benchmarks: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
