"""Benchmark 2: a sampler's peak memory and time to its first index, per epoch size N.

Contenders: detsampler's ``DeterministicBatchSampler`` (Plan + sampler, first micro batch of rank 0) and
``torch.utils.data.DistributedSampler(shuffle=True)`` (first index of rank 0), both for 8 data-parallel ranks. Each
(contender, N) runs in a fresh interpreter (``_sampler_child``), one after the other, so no measurement inherits
another's heap. "RSS growth" is the peak resident size reached while building the sampler and taking its first index,
minus the resident size just before (the kernel's peak mark is reset there through ``/proc/self/clear_refs``); "process
peak RSS" is the child's peak since it started, imports included.
"""

from __future__ import annotations

import statistics
import time

from tests.benchmarks.common import BenchResult, Table, Verdict, fmt_bytes, fmt_seconds, ratio_column, run_child

__all__ = ["main"]

WORLD_SIZE = 8
# (contender, N, repeats, timeout seconds); DistributedSampler at 1e12 would need ~N * 48 bytes (tens of TB): not run.
RUNS = [
    ("detsampler", 10**6, 3, 60),
    ("distributed", 10**6, 3, 60),
    ("detsampler", 10**8, 3, 60),
    ("distributed", 10**8, 1, 240),
    ("detsampler", 10**12, 3, 60),
]
TARGET_SECONDS = 0.010
TARGET_BYTES = 5e6  # "a few MB"
LABELS = {"detsampler": "detsampler DeterministicBatchSampler", "distributed": "torch DistributedSampler(shuffle=True)"}


def main() -> BenchResult:
    t_start = time.perf_counter()
    results: dict[tuple[str, int], dict | None] = {}
    for contender, n, repeats, timeout in RUNS:
        runs = [
            run_child(
                "tests.benchmarks._sampler_child", {"contender": contender, "n": n, "world_size": WORLD_SIZE}, timeout
            )
            for _ in range(repeats)
        ]
        runs = [r for r in runs if r is not None]
        results[(contender, n)] = (
            {
                "seconds": statistics.median(r["seconds"] for r in runs),
                "growth": max(r["growth"] for r in runs),
                "peak_rss": max(r["peak_rss"] for r in runs),
                "repeats": len(runs),
            }
            if runs
            else None
        )

    tables = []
    for n in sorted({n for _, n, _, _ in RUNS}):
        names = [c for c in LABELS if (c, n) in results]
        cells = [results[(c, n)] for c in names]
        t_ratio = ratio_column([r["seconds"] if r else None for r in cells], higher_is_better=False)
        m_ratio = ratio_column([r["growth"] if r else None for r in cells], higher_is_better=False)
        rows = []
        for c, r, tr, mr in zip(names, cells, t_ratio, m_ratio):
            if r is None:
                rows.append([LABELS[c], "failed or timed out", "—", "—", "—", "—"])
            else:
                rows.append(
                    [LABELS[c], fmt_seconds(r["seconds"]), tr, fmt_bytes(r["growth"]), mr, fmt_bytes(r["peak_rss"])]
                )
        notes = []
        if n == 10**12:
            notes.append(
                "DistributedSampler is not run at 1e12: its permutation alone would need ~48 TB (a Python list of"
                " ints)."
            )
        tables.append(
            Table(
                f"N = {n:.0e} samples per epoch, {WORLD_SIZE} ranks (median time over repeats, max memory)",
                ["contender", "time to first index", "time / best", "RSS growth", "growth / best", "process peak RSS"],
                rows,
                notes,
            )
        )

    det = [results[("detsampler", n)] for n in (10**6, 10**8, 10**12)]
    ok_det = [r for r in det if r]
    worst_t = max((r["seconds"] for r in ok_det), default=float("inf"))
    worst_m = max((r["growth"] for r in ok_det), default=float("inf"))
    spread = (
        f"; time across N spans {min(r['seconds'] for r in ok_det) * 1e3:.2f}-{worst_t * 1e3:.2f} ms, "
        f"growth {fmt_bytes(min(r['growth'] for r in ok_det))}-{fmt_bytes(worst_m)}"
        if ok_det
        else ""
    )
    ds8 = results.get(("distributed", 10**8))
    verdicts = [
        Verdict(
            "detsampler independent of N: time to first index under 10 ms",
            len(ok_det) == 3 and worst_t < TARGET_SECONDS,
            f"Worst over N in {{1e6, 1e8, 1e12}}: {fmt_seconds(worst_t)}{spread}.",
        ),
        Verdict(
            "detsampler independent of N: a few MB (taken here as < 5 MB of RSS growth)",
            len(ok_det) == 3 and worst_m < TARGET_BYTES,
            f"Worst RSS growth over N in {{1e6, 1e8, 1e12}}: {fmt_bytes(worst_m)}.",
        ),
    ]
    notes = []
    if ds8:
        notes.append(
            f"DistributedSampler at 1e8 took {fmt_seconds(ds8['seconds'])} and grew RSS by {fmt_bytes(ds8['growth'])}"
            " on every rank, at every epoch start (torch.randperm(N).tolist())."
        )
    return BenchResult(
        2,
        "Sampler memory and start-up per epoch",
        __doc__.split("\n", 2)[2].strip(),
        tables,
        verdicts,
        notes,
        time.perf_counter() - t_start,
    )


if __name__ == "__main__":
    print(main().markdown())
