"""``detsampler verify``: recompute the plan for steps A..B-1 on every rank and micro step and check it.

Invariants checked: the micro batches of each step partition the step's positions; no sample repeats within an epoch
(per source and source epoch for a mixture); every epoch the range covers completely reads every sample.
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from detsampler.cli.inputs import mixture_plan, prepare
from detsampler.cli.options import layout_config, mixture_config, plan_from_args
from detsampler.mixture import MixtureConfig
from detsampler.plan import Plan

__all__ = ["verify_plan", "verify_mixture_plan", "cmd_verify"]


def _micro_batch_positions(plan: Plan, step: int) -> np.ndarray:
    """The positions of all of ``step``'s micro batches, every micro step and rank, concatenated."""
    parts = [plan.micro_batch_positions(step, a, r) for a in range(plan.num_micro_steps(step)) for r in range(plan.world_size)]
    return np.concatenate(parts)


def _partitions_step(plan: Plan, step: int, positions: np.ndarray) -> bool:
    return np.array_equal(np.sort(positions), plan.step_positions(step))


def _epoch_row(epoch: int, counts: np.ndarray, n: int, positions: int, complete: bool) -> dict[str, Any]:
    """The report of one epoch of ``n`` samples, ``counts[i]`` the reads of sample ``i`` (gaps only if ``complete``)."""
    seen = int((counts > 0).sum())
    return {
        "epoch": epoch,
        "positions": positions,
        "distinct_samples": seen,
        "duplicates": int((counts[counts > 1] - 1).sum()),
        "gaps": (n - seen) if complete else None,
        "coverage": seen / n,
        "complete": complete,
    }


def _rows_ok(rows: Any) -> bool:
    return all(r["duplicates"] == 0 and not r["gaps"] for r in rows)


def verify_plan(plan: Plan, start: int, stop: int) -> dict:
    """Check steps ``[start, stop)`` over every rank and micro step: the micro batches partition each step's positions; no
    sample repeats within an epoch; every epoch the range covers completely reads each sample once. Returns a report."""
    n = plan.stream.num_samples
    first, last = plan.consumed(start), plan.consumed(stop)
    counts: dict[int, np.ndarray] = {}
    position_problems = []
    pending: list[np.ndarray] = []

    def flush() -> None:  # the sample ids of many micro batches in one vectorized call (what plan.micro_batch computes)
        if not pending:
            return
        positions = np.concatenate(pending)
        pending.clear()
        ids, epochs = plan.stream.sample_ids(positions), plan.stream.epochs(positions)
        if ids.size and (ids.min() < 0 or ids.max() >= n):
            raise ValueError(f"the plan's stream yields sample ids outside [0, {n}): {int(ids.min())} .. {int(ids.max())}")
        for e in np.unique(epochs).tolist():
            c = counts.setdefault(e, np.zeros(n, dtype=np.int64))
            c += np.bincount(ids[epochs == e], minlength=n)

    for step in range(start, stop):
        positions = _micro_batch_positions(plan, step)
        if not _partitions_step(plan, step, positions):
            position_problems.append(step)
        pending.append(positions)
        if len(pending) >= 1024:
            flush()
    flush()
    epochs_report = []
    for e in sorted(counts):
        lo, hi = max(first, e * n), min(last, (e + 1) * n)
        complete = lo == e * n and hi == (e + 1) * n
        epochs_report.append(_epoch_row(e, counts[e], n, hi - lo, complete))
    ok = not position_problems and _rows_ok(epochs_report)
    return {"steps": [start, stop], "positions": [first, last], "num_samples": n, "ok": ok,
            "position_problems": position_problems, "epochs": epochs_report}


def _data_spans(plan: Plan, start: int, stop: int) -> list[list[int]]:
    """The positions of training steps [start, stop) as maximal runs ``[lo, hi)``: the data steps they read, without the
    skipped ones."""
    spans: list[list[int]] = []
    for step in range(start, stop):
        lo = plan.consumed(step)
        if spans and spans[-1][1] == lo:
            spans[-1][1] = lo + plan.batch_size(step)
        else:
            spans.append([lo, lo + plan.batch_size(step)])
    return spans


def _source_counts(mixture: Any, spans: list[list[int]], chunk: int) -> dict[tuple[int, int], np.ndarray]:
    """(source, source epoch) -> reads of each source sample, over the mixture positions of ``spans``."""
    counts: dict[tuple[int, int], np.ndarray] = {}
    for lo, hi in spans:
        for c0 in range(lo, hi, chunk):
            look = mixture.lookup(np.arange(c0, min(hi, c0 + chunk), dtype=np.int64))
            for k in np.unique(look.source).tolist():
                mine = look.source == k
                for e in np.unique(look.source_epoch[mine]).tolist():
                    c = counts.setdefault((k, e), np.zeros(mixture.sizes[k], dtype=np.int64))
                    c += np.bincount(look.source_sample[mine & (look.source_epoch == e)], minlength=mixture.sizes[k])
    return counts


def verify_mixture_plan(plan: Plan, start: int, stop: int, chunk: int = 1 << 16) -> dict:
    """:func:`verify_plan` for a plan over a mixture: the same checks, per source and per source epoch (each source's
    positions ``p_k`` of the range must be exactly ``[served_k(first), served_k(last))``)."""
    mixture = plan.stream
    first, last = plan.consumed(start), plan.consumed(stop)
    position_problems = [step for step in range(start, stop)
                         if not _partitions_step(plan, step, _micro_batch_positions(plan, step))]
    spans = _data_spans(plan, start, stop)
    counts = _source_counts(mixture, spans, chunk)
    served_first, served_last = mixture.served(first), mixture.served(last)
    sources = []
    for k, n in enumerate(mixture.sizes):
        rows = []
        for (kk, e), c in sorted(counts.items()):
            if kk != k:
                continue
            lo, hi = max(int(served_first[k]), e * n), min(int(served_last[k]), (e + 1) * n)
            complete = lo == e * n and hi == (e + 1) * n and not spans[1:]
            rows.append(_epoch_row(e, c, n, int(c.sum()), complete))
        sources.append({"source": k, "num_samples": n, "served": [int(served_first[k]), int(served_last[k])], "epochs": rows})
    ok = not position_problems and all(_rows_ok(src["epochs"]) for src in sources)
    return {"steps": [start, stop], "positions": [first, last], "ok": ok, "position_problems": position_problems,
            "sources": sources}


def _print_epochs(rows: list[dict[str, Any]], indent: str) -> None:
    for r in rows:
        gaps = "n/a (partial epoch)" if r["gaps"] is None else r["gaps"]
        print(f"{indent}epoch {r['epoch']}: {r['positions']} positions, {r['distinct_samples']} distinct samples "
              f"({100 * r['coverage']:.2f}% of the epoch), duplicates {r['duplicates']}, gaps {gaps}"
              + (", complete" if r["complete"] else ""))


def _print_verdict(report: dict) -> int:
    print("OK: no duplicates, no gaps" if report["ok"] else "FAILED: duplicates or gaps found")
    return 0 if report["ok"] else 1


def _print_header(report: dict, plan: Plan, what: str) -> None:
    a, b = report["steps"]
    print(f"verify steps {a}..{b - 1}: {b - a} steps x {plan.world_size} rank(s), positions [{report['positions'][0]}, "
          f"{report['positions'][1]}), {what}")
    if report["position_problems"]:
        print(f"  micro batches do not partition steps {report['position_problems'][:10]}")


def cmd_verify(args: argparse.Namespace) -> int:
    """Verify ``--steps A:B`` and print the report; exit status 0 when it holds, 1 when not."""
    config = mixture_config(args)
    if config is not None:
        return _cmd_verify_mixture(args, config)
    prepared = prepare(args, verify_tokens=getattr(args, "tokens", False))
    if getattr(args, "tokens", False):
        print(f"index files: every chunk checksum and sha256 verified ({prepared.index.num_tokens} tokens)")
    layout = prepared.index.layout(layout_config(args))
    plan = plan_from_args(args, layout.num_samples)
    a, b = args.steps
    report = verify_plan(plan, a, b)
    _print_header(report, plan, f"{layout.config.kind} layout of {layout.num_samples} samples per epoch")
    _print_epochs(report["epochs"], "  ")
    return _print_verdict(report)


def _cmd_verify_mixture(args: argparse.Namespace, config: MixtureConfig) -> int:
    prepared, layouts, plan = mixture_plan(args, config)
    if getattr(args, "tokens", False):
        from detsampler.index import TokenIndex

        for p in prepared:
            TokenIndex.open(p.index.path, verify_tokens=True)
        print(f"index files: every chunk checksum and sha256 verified ({len(prepared)} sources)")
    a, b = args.steps
    report = verify_mixture_plan(plan, a, b)
    _print_header(report, plan, f"{layouts[0].config.kind} layouts, mixture of {len(layouts)} sources")
    for name, src in zip(config.labels, report["sources"]):
        print(f"  source {name}: {src['num_samples']} samples per epoch, source positions [{src['served'][0]}, {src['served'][1]})")
        _print_epochs(src["epochs"], "    ")
    return _print_verdict(report)
