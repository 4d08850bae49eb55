"""Benchmark 11 ("corpus scale": issue 12's "scale" benchmark, numbered 11 after the others): per-process
open time, memory growth and locate time per micro batch at 10^6 .. 10^9 documents.

For each corpus size, a lengths-only index (``synthetic_index``: uniform lengths in [1, 2000), no tokens; int32
lengths, 4 bytes per document) is built, then each layout kind's persisted layout in turn (``index.layout``, timed:
the once-per-corpus cost), measured, and removed before the next (so the disk holds one layout at a time: ~16 GB at
10^9 documents, 4 GB of it the concat layout's order.npy). Every measurement of a process's cost runs in a fresh
interpreter (``_corpus_scale_child``), one after the other: open the index and the layout, plan, locate the first
micro batch (8 samples x 2048 tokens, rank 7 of
8, mid-epoch): "open + first micro batch" and the growth of the process's resident memory meanwhile (peak, and the
private part: the rest is mapped file pages, shared by every process on the node); then the median ``locate`` of 50
random steps whose chunks are read for the first time (cold: each chunk's checksum computed) and again (warm); and a
worker's reopen (the layout pickled, unpickled, one locate). Side by side: today's in-RAM layouts
(``make_layout(config, index.lengths)``) and ``torch.utils.data.DistributedSampler`` over the same number of samples
(its first index). The build of a best-fit layout with 1 and 2 processes (``num_proc``) measures the parallel build.
Sizes above ``DETSAMPLER_SCALE_MAX`` (default 10^8) and best-fit layouts above ``DETSAMPLER_SCALE_MAX_BESTFIT``
(default 10^8: a best-fit build takes ~1 us per document per process) are skipped with a message, as is 10^9 when the
disk is short; ``DETSAMPLER_SCALE_SIZES`` (e.g. ``1e6,1e9``) and ``DETSAMPLER_SCALE_KINDS`` (e.g. ``bestfit``) run
only the sizes and layout kinds named.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.benchmarks.common import BenchResult, Table, Verdict, fmt_bytes, fmt_seconds, ratio_column, run_child

__all__ = ["main"]

SIZES = [10**6, 10**7, 10**8, 10**9]
KINDS = ["concat", "document", "bestfit"]
BYTES_PER_DOC = 4 + 8 + 4 + 2  # int32 lengths + the largest layout held at a time (concat ends, int32 order), a margin
IN_RAM_MAX = 10**8  # today's layouts above this need more RAM than the machine has to spare
DISTRIBUTED_MAX = 10**8  # DistributedSampler materializes a list of the samples: ~50 bytes each


def _limits() -> tuple[int, int]:
    return int(float(os.environ.get("DETSAMPLER_SCALE_MAX", 1e8))), int(
        float(os.environ.get("DETSAMPLER_SCALE_MAX_BESTFIT", 1e8))
    )


def _sizes() -> list[int]:
    """``DETSAMPLER_SCALE_SIZES`` (e.g. ``1e6,1e9``: the smallest is the locate ratio's reference), else SIZES."""
    given = os.environ.get("DETSAMPLER_SCALE_SIZES")
    return sorted(int(float(x)) for x in given.split(",")) if given else SIZES


def _kinds() -> list[str]:
    """``DETSAMPLER_SCALE_KINDS`` (e.g. ``bestfit``), else every layout kind."""
    given = os.environ.get("DETSAMPLER_SCALE_KINDS")
    return [k for k in KINDS if k in given.split(",")] if given else KINDS


def _load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def _child(index: Path, kind: str, mode: str, **extra) -> dict | None:
    args = {"index": str(index), "kind": kind, "seq_len": 2048, "mode": mode, "repeats": 50, **extra}
    return run_child("tests.benchmarks._corpus_scale_child", args, timeout=1800)


def _build_index(root: Path, n: int) -> tuple[Any, float]:
    from detsampler.index.synthetic import synthetic_index

    t0 = time.perf_counter()
    index = synthetic_index(root, n, mean_length=1000, seed=0)
    return index, time.perf_counter() - t0


def _build_layout(index: Any, kind: str) -> float:
    from detsampler.layout import LayoutConfig

    t0 = time.perf_counter()
    index.layout(LayoutConfig(kind=kind, seq_len=2048))
    return time.perf_counter() - t0


def _remove_layout(index: Any, kind: str) -> None:
    from detsampler.index.layouts import layout_dir
    from detsampler.layout import LayoutConfig

    shutil.rmtree(layout_dir(index, LayoutConfig(kind=kind, seq_len=2048)), ignore_errors=True)


def _parallel_build(index_path: Path) -> dict[int, float]:
    """Wall time of packing a best-fit layout (window 256, so the layout is new) with 1 and 2 processes."""
    from detsampler.index import TokenIndex
    from detsampler.index.layouts import layout_dir
    from detsampler.layout import LayoutConfig

    index = TokenIndex.open(index_path)
    out = {}
    for num_proc in (1, 2):
        config = LayoutConfig(kind="bestfit", seq_len=2048, window_docs=256)
        shutil.rmtree(layout_dir(index, config), ignore_errors=True)
        t0 = time.perf_counter()
        index.layout(config, num_proc=num_proc)
        out[num_proc] = time.perf_counter() - t0
    return out


def _packing_speed(num_documents: int = 1 << 18, repeats: int = 3) -> list[list]:
    """Documents packed per second by one process: PACKING_VERSION 1's first implementation (a Python loop per
    document, kept in tests/test_packing.py as the reference) and the lockstep one, the same windows, alternated, best
    of ``repeats``; the outputs checked equal byte for byte."""
    import numpy as np

    from detsampler.index.synthetic import synthetic_lengths
    from detsampler.packing import pack_windows
    from tests.test_packing import assert_same_bytes, reference_pack_windows

    extents = next(synthetic_lengths(num_documents, 1000, seed=0, chunk=num_documents)) + 1
    rows = []
    for window in (1024, 256):
        cuts = np.arange(window, num_documents, window)
        ids, ext = np.split(np.arange(num_documents), cuts), np.split(extents, cuts)
        best, results = {"reference": float("inf"), "lockstep": float("inf")}, {}
        for _ in range(repeats):
            for name, fn in (("reference", reference_pack_windows), ("lockstep", pack_windows)):
                t0 = time.perf_counter()
                results[name] = fn(ids, ext, 2048)
                best[name] = min(best[name], time.perf_counter() - t0)
        assert_same_bytes(results["lockstep"], results["reference"])
        ref, new = num_documents / best["reference"], num_documents / best["lockstep"]
        rows.append(
            [f"{window} documents", f"{ref / 1e6:.2f} M/s", f"{new / 1e6:.2f} M/s", f"{new / ref:.1f}x", _load()]
        )
    return rows


def _row(label: str, r: dict | None, build: float | None) -> list:
    if r is None:
        return [label, "failed", "—", "—", "—", "—", "—", "—"]
    return [
        label,
        fmt_seconds(build),
        fmt_seconds(r["open_first"]),
        fmt_bytes(r.get("growth")),
        fmt_bytes(r.get("anon_growth")),
        fmt_seconds(r.get("locate")),
        fmt_seconds(r.get("locate_warm")),
        fmt_seconds(r.get("reopen")),
    ]


def main() -> BenchResult:
    t_start = time.perf_counter()
    max_n, max_bestfit = _limits()
    root = Path(os.environ.get("DETSAMPLER_SCALE_DIR") or tempfile.mkdtemp(prefix="detsampler-scale-"))
    root.mkdir(parents=True, exist_ok=True)
    notes, results, builds, parallel = [], {}, {}, {}
    speed = _packing_speed()
    for n in _sizes():
        kinds = [k for k in _kinds() if k != "bestfit" or n <= max_bestfit]
        need, free = n * BYTES_PER_DOC, shutil.disk_usage(root).free
        if n > max_n or need > free:
            notes.append(
                f"10^{len(str(n)) - 1} documents skipped: "
                + (
                    f"needs ~{need / 1e9:.0f} GB of disk, {free / 1e9:.0f} GB free"
                    if need > free
                    else f"above DETSAMPLER_SCALE_MAX={max_n:.0e} (set it to run)"
                )
            )
            continue
        if "bestfit" in _kinds() and "bestfit" not in kinds:
            notes.append(
                f"bestfit at 10^{len(str(n)) - 1} skipped: above DETSAMPLER_SCALE_MAX_BESTFIT={max_bestfit:.0e}"
            )
        index, seconds = _build_index(root / f"n{n}", n)
        loads: dict[str, str] = {}
        builds[n], path = {"index": seconds}, index.path
        for kind in kinds:
            builds[n][kind] = _build_layout(index, kind)
            loads[kind] = _load()
            results[(n, kind, "persisted")] = _child(path, kind, "persisted")
            if n <= IN_RAM_MAX and (kind != "bestfit" or n <= max_bestfit):
                results[(n, kind, "in_ram")] = _child(path, kind, "in_ram")
            if kind == "concat" and n <= DISTRIBUTED_MAX and results.get((n, "concat", "persisted")):
                results[(n, "concat", "distributed")] = _child(
                    path, "concat", "distributed", num_samples=results[(n, "concat", "persisted")]["num_samples"]
                )
            _remove_layout(index, kind)
        notes.append(
            f"10^{len(str(n)) - 1} documents: 1/5/15-minute load average after each layout's build: "
            + ", ".join(f"{k} {v}" for k, v in loads.items())
        )
        if n == min(max_bestfit, 10**7):
            parallel = _parallel_build(path)
            notes.append(f"1/5/15-minute load average after the 1 vs 2 process build: {_load()}")
        shutil.rmtree(root / f"n{n}", ignore_errors=True)
    shutil.rmtree(root, ignore_errors=True)
    return _report(results, builds, parallel, speed, notes, time.perf_counter() - t_start)


def _report(
    results: dict, builds: dict, parallel: dict, speed: list[list], notes: list[str], seconds: float
) -> BenchResult:
    columns = [
        "contender",
        "build (once)",
        "open + first micro batch",
        "RSS growth",
        "private growth",
        "locate (cold chunks)",
        "locate (warm)",
        "worker reopen",
    ]
    labels = {
        "persisted": "persisted layout (memory maps)",
        "in_ram": "today's in-RAM layout",
        "distributed": "torch DistributedSampler (first index)",
    }
    tables = []
    for n in sorted(builds):
        rows = []
        for kind in KINDS:
            for mode in ("persisted", "in_ram", "distributed"):
                if (n, kind, mode) in results:
                    build = builds[n].get(kind) if mode == "persisted" else None
                    rows.append(_row(f"{kind}: {labels[mode]}", results[(n, kind, mode)], build))
        opens = [
            results.get((n, k, m), {}) or {}
            for k in KINDS
            for m in ("persisted", "in_ram", "distributed")
            if (n, k, m) in results
        ]
        ratio = ratio_column([o.get("open_first") for o in opens], higher_is_better=False)
        for row, r in zip(rows, ratio):
            row.insert(3, r)
        columns_n = columns[:3] + ["open ratio"] + columns[3:]
        tables.append(Table(f"{n:.0e} documents (index built in {fmt_seconds(builds[n]['index'])})", columns_n, rows))
    tables.append(
        Table(
            "best-fit packing per process, windows of 2^18 documents (lengths as above, seq_len 2048), best of 3",
            ["window", "v1 reference (Python loop)", "lockstep (numpy)", "speed-up", "load 1/5/15"],
            speed,
        )
    )
    if parallel:
        t1, t2 = parallel[1], parallel[2]
        tables.append(
            Table(
                "best-fit layout build, 1 and 2 processes (num_proc)",
                ["processes", "wall time", "speed-up"],
                [["1", fmt_seconds(t1), "1.00x"], ["2", fmt_seconds(t2), f"{t1 / t2:.2f}x"]],
            )
        )
    return BenchResult(
        11,
        "Scale: open, memory and locate per process at 10^6 .. 10^9 documents",
        __doc__.split("\n\n", 1)[1],
        tables,
        _verdicts(results, builds, parallel),
        notes,
        seconds,
    )


def _verdicts(results: dict, builds: dict, parallel: dict) -> list[Verdict]:
    out = []
    if not builds:
        return out
    top, low = max(builds), min(builds)
    persisted = {k: results.get((top, k, "persisted")) for k in KINDS if results.get((top, k, "persisted"))}
    worst_open = max(r["open_first"] for r in persisted.values())
    worst_growth = max(r["growth"] for r in persisted.values())
    out.append(
        Verdict(
            "open + first micro batch < 100 ms and < 100 MB RSS growth per process, every layout kind (at "
            f"{top:.0e} documents, the largest run)",
            worst_open < 0.1 and worst_growth < 100e6,
            f"Worst over {sorted(persisted)}: {fmt_seconds(worst_open)}, {fmt_bytes(worst_growth)}.",
        )
    )
    ratios = []
    for k in persisted:
        a, b = results.get((low, k, "persisted")), results.get((top, k, "persisted"))
        if a and b:
            ratios.append((k, b["locate"] / a["locate"], b["locate_warm"] / a["locate_warm"]))
    if ratios:
        worst = max(w for _, _, w in ratios)
        out.append(
            Verdict(
                f"locate per micro batch at {top:.0e} within 2x of at {low:.0e} (judged on the steady state: "
                "chunks already read and checked)",
                worst <= 2.0,
                "Ratios (steady state / first read of each chunk, which at the large size includes reading "
                "the pages from disk and their CRC-32, while at the small size every file is in the page "
                "cache): " + ", ".join(f"{k} {w:.2f}x / {c:.2f}x" for k, c, w in ratios) + ".",
            )
        )
    reopen = max(r["reopen"] for (n, k, m), r in results.items() if m == "persisted" and r)
    out.append(
        Verdict(
            "a spawned worker's start (unpickle the layout, first locate) < 1 s whatever the corpus size",
            reopen < 1.0,
            f"Worst over every size and kind: {fmt_seconds(reopen)} (interpreter start not counted).",
        )
    )
    if parallel:
        speedup = parallel[1] / parallel[2]
        out.append(
            Verdict(
                ">= 0.8 W speed-up of a parallel build with W = 2 processes (best-fit packing)",
                speedup >= 1.6,
                f"Measured {speedup:.2f}x.",
            )
        )
    return out


if __name__ == "__main__":
    print(main().markdown())
