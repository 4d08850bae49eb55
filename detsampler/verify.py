"""Audits of a plan: recompute what every rank reads and check it, and count what a layout and a plan serve.

Invariants checked by :func:`verify_plan` / :func:`verify_mixture_plan`: the micro batches of each step partition the step's
positions; no sample repeats within an epoch (per source and source epoch for a mixture); every epoch the range covers
completely reads every sample. :func:`layout_stats`, :func:`document_stats` and :func:`mixture_stats` read every number
from the layout, the lengths and the plan; nothing is estimated. Numpy only (the CLI parses and prints around these).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from detsampler.layout import Layout
from detsampler.plan import Plan

__all__ = ["document_stats", "layout_stats", "mixture_stats", "verify_mixture_plan", "verify_plan"]


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


def mixture_stats(plan: Plan, labels: Sequence[str], step: int | None) -> dict:
    """Per source of ``plan``'s mixture: samples per epoch, tokens; at ``step``: samples, epochs, tokens served so far,
    their shares and the share the weights ask for."""
    mixture = plan.stream
    out: dict[str, Any] = {"sources": []}
    rows = mixture.report(plan.consumed(step)) if step is not None else None
    for k, (name, layout) in enumerate(zip(labels, mixture.sources)):
        row: dict[str, Any] = {"name": name, "samples_per_epoch": layout.num_samples,
                               "padding_fraction": layout.describe().get("padding_fraction", 0.0)}
        if rows is not None:
            r = rows[k]
            row.update({"samples": r["served"], "epochs": r["epochs"], "upsampled": r["upsampled"], "tokens": r["tokens"],
                        "sample_share": r["share"], "token_share": r["token_share"], "expected_share": r["expected_share"]})
        out["sources"].append(row)
    if step is not None:
        out.update({"step": step, "data_step": plan.data_step(step), "position": plan.consumed(step),
                    "weights_at_step": [str(w) for w in mixture.weights_at(plan.consumed(step))]})
    return out


def document_stats(lengths: np.ndarray) -> dict[str, Any]:
    """Document and token counts of an index's ``lengths`` (EOS counted once per document in ``tokens_with_eos``)."""
    lengths = np.asarray(lengths)
    num_tokens = int(lengths.sum())
    return {
        "documents": int(lengths.size),
        "tokens": num_tokens,
        "tokens_with_eos": num_tokens + int(lengths.size),
        "empty_documents": int((lengths == 0).sum()),
        "document_tokens": {"min": int(lengths.min()), "median": float(np.median(lengths)), "mean": float(lengths.mean()),
                            "max": int(lengths.max())},
    }


def layout_stats(layout: Layout, plan: Plan, step: int | None = None) -> dict[str, Any]:
    """``layout``'s samples per epoch, padding, dropped tokens and steps per epoch under ``plan`` (and with ``step``, the
    epoch reached there)."""
    d = layout.describe()
    row = {"samples_per_epoch": layout.num_samples, "padding_fraction": d["padding_fraction"],
           "dropped_tokens": d["dropped_tokens"], "steps_per_epoch": layout.num_samples / plan.global_batch_size}
    if step is not None:
        row["epochs_at_step"] = plan.consumed(step) / layout.num_samples
        row["epoch_at_step"] = plan.epoch(step)
    return row
