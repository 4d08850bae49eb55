"""Audits of a plan: recompute what every rank reads and check it, and count what a layout and a plan serve.

Invariants checked by :func:`verify_plan` / :func:`verify_mixture_plan`: the micro batches of each step partition the
step's positions; no sample repeats within an epoch (per source and source epoch for a mixture); every epoch whose
positions the range covers completely reads every sample, or skips it (data steps in a skip range between the audited
steps are skipped: counted as such, never as gaps). :func:`layout_stats`, :func:`document_stats`,
:func:`mixture_stats` and :func:`trained_and_skipped` read every number from the layout, the lengths and the plan;
nothing is estimated. Numpy only (the CLI parses and prints around these).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from detsampler.layout import Layout
from detsampler.plan import Plan

__all__ = [
    "document_stats",
    "layout_stats",
    "mixture_stats",
    "trained_and_skipped",
    "verify_mixture_plan",
    "verify_plan",
]


def _micro_batch_positions(plan: Plan, step: int) -> np.ndarray:
    """The positions of all of ``step``'s micro batches, every micro step and rank, concatenated."""
    parts = [
        plan.micro_batch_positions(step, a, r)
        for a in range(plan.num_micro_steps(step))
        for r in range(plan.world_size)
    ]
    return np.concatenate(parts)


def _partitions_step(plan: Plan, step: int, positions: np.ndarray) -> bool:
    """The micro batches read exactly the step's positions, once each (a balanced plan deals them out of order)."""
    start = plan.consumed(step)
    return np.array_equal(np.sort(positions), np.arange(start, start + plan.batch_size(step), dtype=np.int64))


def _epoch_row(epoch: int, read: np.ndarray, skipped: np.ndarray | None, n: int, complete: bool) -> dict[str, Any]:
    """The report of one epoch of ``n`` samples: ``read[i]`` the reads of sample ``i`` by the audited steps,
    ``skipped[i]`` its positions in the skip ranges between them. Every position of a complete epoch is read or skipped,
    so a sample read or skipped more than once is a duplicate and one neither read nor skipped a gap (counted only if
    ``complete``)."""
    total = read if skipped is None else read + skipped
    seen = int((read > 0).sum())
    return {
        "epoch": epoch,
        "positions": int(read.sum()),
        "distinct_samples": seen,
        "skipped_samples": 0 if skipped is None else int(skipped.sum()),
        "duplicates": int((total[total > 1] - 1).sum()),
        "gaps": (n - int((total > 0).sum())) if complete else None,
        "coverage": seen / n,
        "complete": complete,
    }


logger = logging.getLogger("detsampler")

PROGRESS_STEPS = 1 << 18  # a progress line every this many steps (each check costs tens of microseconds a step)


def _steps(start: int, stop: int, what: str) -> Iterator[int]:
    """``range(start, stop)``, logging a progress line every :data:`PROGRESS_STEPS` steps of a longer range."""
    total = stop - start
    for step in range(start, stop):
        done = step - start
        if done and done % PROGRESS_STEPS == 0:
            logger.info("verify: %s: %d of %d steps (%.0f%%)", what, done, total, 100 * done / total)
        yield step


def _rows_ok(rows: Any) -> bool:
    return all(r["duplicates"] == 0 and not r["gaps"] for r in rows)


def _data_spans(plan: Plan, start: int, stop: int) -> list[list[int]]:
    """The positions of training steps [start, stop) as maximal runs ``[lo, hi)``: the data steps they read, without the
    skipped ones."""
    spans: list[list[int]] = []
    for step in _steps(start, stop, "reading the steps' positions"):
        lo = plan.consumed(step)
        if spans and spans[-1][1] == lo:
            spans[-1][1] = lo + plan.batch_size(step)
        else:
            spans.append([lo, lo + plan.batch_size(step)])
    return spans


def _skipped(plan: Plan, start: int, stop: int, read: list[list[int]]) -> tuple[list[list[int]], dict[str, Any]]:
    """(the position runs between the read runs: the data of the skip ranges inside the audited steps, and their
    summary: the skipped data steps, clipped to the audited ones, and how many positions they hold)."""
    spans = [[a[1], b[0]] for a, b in zip(read, read[1:]) if b[0] > a[1]]
    d_lo, d_hi = plan.data_step(start), plan.data_step(stop)
    steps = [[max(a, d_lo), min(b, d_hi - 1)] for a, b in plan.skip_steps or () if max(a, d_lo) <= min(b, d_hi - 1)]
    return spans, {"data_steps": steps, "positions": sum(hi - lo for lo, hi in spans)}


def _chunks(spans: list[list[int]], chunk: int):
    for lo, hi in spans:
        for c0 in range(lo, hi, chunk):
            yield np.arange(c0, min(hi, c0 + chunk), dtype=np.int64)


def _epoch_counts(plan: Plan, spans: list[list[int]], chunk: int) -> dict[int, np.ndarray]:
    """epoch -> reads of each sample over the positions of ``spans``."""
    n = plan.stream.num_samples
    counts: dict[int, np.ndarray] = {}
    for positions in _chunks(spans, chunk):
        ids, epochs = plan.stream.sample_ids(positions), plan.stream.epochs(positions)
        if getattr(plan.stream, "epoch_ids", False):  # ids carry their epoch (epoch_order): e * n + sample
            ids = np.where(ids // n == epochs, ids - epochs * n, -1)
        if ids.size and (ids.min() < 0 or ids.max() >= n):
            lo, hi = int(ids.min()), int(ids.max())
            raise ValueError(f"the plan's stream yields sample ids outside [0, {n}): {lo} .. {hi}")
        for e in np.unique(epochs).tolist():
            c = counts.setdefault(e, np.zeros(n, dtype=np.int64))
            c += np.bincount(ids[epochs == e], minlength=n)
    return counts


def verify_plan(plan: Plan, start: int, stop: int, chunk: int = 1 << 16) -> dict:
    """Check steps ``[start, stop)`` over every rank and micro step: the micro batches partition each step's positions;
    no sample repeats within an epoch; every epoch whose positions the range covers whole (read, or skipped by a skip
    range inside it) reads or skips each sample exactly once.

    Args:
        plan: the plan to audit (an epoch stream; see :func:`verify_mixture_plan` for mixtures).
        start: the first training step audited.
        stop: one past the last step audited.
        chunk: positions per vectorized batch (memory is O(chunk + samples per epoch)).

    Returns:
        A report: ``ok``, ``position_problems`` (steps whose micro batches do not partition them), one row per epoch
        (``duplicates``, ``gaps`` where the epoch is covered whole, ``skipped``), and ``skipped`` summed.
    """
    n = plan.stream.num_samples
    first, last = plan.consumed(start), plan.consumed(stop)
    position_problems = [
        step
        for step in _steps(start, stop, "checking the micro batches")
        if not _partitions_step(plan, step, _micro_batch_positions(plan, step))
    ]
    read_spans = _data_spans(plan, start, stop)
    skipped_spans, skipped = _skipped(plan, start, stop, read_spans)
    read, skip = _epoch_counts(plan, read_spans, chunk), _epoch_counts(plan, skipped_spans, chunk)
    epochs_report = []
    for e in sorted(set(read) | set(skip)):
        complete = first <= e * n and (e + 1) * n <= last
        epochs_report.append(_epoch_row(e, read.get(e, np.zeros(n, dtype=np.int64)), skip.get(e), n, complete))
    ok = not position_problems and _rows_ok(epochs_report)
    return {
        "steps": [start, stop],
        "positions": [first, last],
        "num_samples": n,
        "ok": ok,
        "position_problems": position_problems,
        "skipped": skipped,
        "epochs": epochs_report,
    }


def _source_counts(mixture: Any, spans: list[list[int]], chunk: int) -> dict[tuple[int, int], np.ndarray]:
    """(source, source epoch) -> reads of each source sample, over the mixture positions of ``spans``."""
    counts: dict[tuple[int, int], np.ndarray] = {}
    for positions in _chunks(spans, chunk):
        look = mixture.lookup(positions)
        samples = look.source_sample
        if any(getattr(mixture, "epoch_ordered", ())):  # an epoch_order source's ids carry its epoch: e * N_k + i
            ordered = np.asarray(mixture.epoch_ordered, dtype=bool)[look.source]
            sizes = np.asarray(mixture.sizes, dtype=np.int64)[look.source]
            samples = np.where(ordered, samples - look.source_epoch * sizes, samples)
        for k in np.unique(look.source).tolist():
            mine = look.source == k
            for e in np.unique(look.source_epoch[mine]).tolist():
                c = counts.setdefault((k, e), np.zeros(mixture.sizes[k], dtype=np.int64))
                c += np.bincount(samples[mine & (look.source_epoch == e)], minlength=mixture.sizes[k])
    return counts


def verify_mixture_plan(plan: Plan, start: int, stop: int, chunk: int = 1 << 16) -> dict:
    """:func:`verify_plan` for a plan over a mixture: the same checks, per source and per source epoch (each source's
    positions ``p_k`` of the range, read or skipped, are exactly ``[served_k(first), served_k(last))``, so a source
    epoch inside them is complete and checked for gaps, whatever skip ranges lie in the range).

    Args:
        plan: a plan whose ``stream`` is a :class:`~detsampler.mixture.Mixture`; ``start``, ``stop``, ``chunk`` as for
            :func:`verify_plan`.

    Returns:
        A report: ``ok``, ``position_problems`` and, per source, its served range and one row per source epoch.
    """
    mixture = plan.stream
    first, last = plan.consumed(start), plan.consumed(stop)
    position_problems = [
        step
        for step in _steps(start, stop, "checking the micro batches")
        if not _partitions_step(plan, step, _micro_batch_positions(plan, step))
    ]
    read_spans = _data_spans(plan, start, stop)
    skipped_spans, skipped = _skipped(plan, start, stop, read_spans)
    read, skip = _source_counts(mixture, read_spans, chunk), _source_counts(mixture, skipped_spans, chunk)
    served_first, served_last = mixture.served(first), mixture.served(last)
    sources = []
    for k, n in enumerate(mixture.sizes):
        rows = []
        for e in sorted({e for kk, e in set(read) | set(skip) if kk == k}):
            complete = int(served_first[k]) <= e * n and (e + 1) * n <= int(served_last[k])
            rows.append(_epoch_row(e, read.get((k, e), np.zeros(n, dtype=np.int64)), skip.get((k, e)), n, complete))
        served = [int(served_first[k]), int(served_last[k])]
        sources.append({"source": k, "num_samples": n, "served": served, "epochs": rows})
    ok = not position_problems and all(_rows_ok(src["epochs"]) for src in sources)
    return {
        "steps": [start, stop],
        "positions": [first, last],
        "ok": ok,
        "position_problems": position_problems,
        "skipped": skipped,
        "sources": sources,
    }


def mixture_stats(plan: Plan, labels: Sequence[str], step: int | None) -> dict:
    """Per source of ``plan``'s mixture: samples per epoch, tokens; at ``step``: samples, epochs, tokens served so far,
    their shares and the share the weights ask for."""
    mixture = plan.stream
    out: dict[str, Any] = {"sources": []}
    rows = mixture.report(plan.consumed(step)) if step is not None else None
    for k, (name, layout) in enumerate(zip(labels, mixture.sources)):
        row: dict[str, Any] = {
            "name": name,
            "samples_per_epoch": layout.num_samples,
            "padding_fraction": layout.describe().get("padding_fraction", 0.0),
        }
        if rows is not None:
            r = rows[k]
            row.update(
                {
                    "samples": r["served"],
                    "epochs": r["epochs"],
                    "upsampled": r["upsampled"],
                    "tokens": r["tokens"],
                    "sample_share": r["share"],
                    "token_share": r["token_share"],
                    "expected_share": r["expected_share"],
                }
            )
        out["sources"].append(row)
    if step is not None:
        out.update(
            {
                "step": step,
                "data_step": plan.data_step(step),
                "position": plan.consumed(step),
                "weights_at_step": [str(w) for w in mixture.weights_at(plan.consumed(step))],
            }
        )
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
        "document_tokens": {
            "min": int(lengths.min()),
            "median": float(np.median(lengths)),
            "mean": float(lengths.mean()),
            "max": int(lengths.max()),
        },
    }


def layout_stats(layout: Layout, plan: Plan, step: int | None = None) -> dict[str, Any]:
    """``layout``'s samples per epoch, padding, dropped tokens and steps per epoch under ``plan`` (and with ``step``,
    the epoch reached there)."""
    d = layout.describe()
    row = {
        "samples_per_epoch": layout.num_samples,
        "padding_fraction": d["padding_fraction"],
        "dropped_tokens": d["dropped_tokens"],
        "steps_per_epoch": layout.num_samples / plan.global_batch_size,
        **{k: d[k] for k in ("overlong", "examples_truncated", "examples_dropped") if k in d},
    }
    if step is not None:
        row["epochs_at_step"] = plan.consumed(step) / layout.num_samples
        row["epoch_at_step"] = plan.epoch(step)
    return row


def _input_tokens(layout: Layout, sample_ids: np.ndarray) -> int:
    """The input tokens of ``sample_ids`` (each sample's located tokens, at most ``seq_len``: padding not counted)."""
    if not len(sample_ids):
        return 0
    return int(np.minimum(layout.locate(sample_ids).num_tokens, layout.config.seq_len).sum())


def _served(plan: Plan, layouts: Sequence[Layout], lo: int, hi: int, chunk: int) -> np.ndarray:
    """Per source (one row per layout), ``[samples, input tokens]`` of the global positions ``[lo, hi)``."""
    out = np.zeros((len(layouts), 2), dtype=np.int64)
    for a in range(lo, hi, chunk):
        positions = np.arange(a, min(hi, a + chunk), dtype=np.int64)
        if len(layouts) == 1:
            out[0] += (len(positions), _input_tokens(layouts[0], plan.stream.sample_ids(positions)))
            continue
        found = plan.stream.lookup(positions)
        for k, layout in enumerate(layouts):
            ids = found.source_sample[found.source == k]
            out[k] += (len(ids), _input_tokens(layout, ids))
    return out


def _served_before(plan: Plan, layouts: Sequence[Layout], position: int, chunk: int) -> np.ndarray:
    """Per source ``[samples, input tokens]`` of the global positions ``[0, position)``: whole epochs from one epoch's
    count (every sample once), the rest located; for a mixture, the mixture's own report."""
    if len(layouts) > 1:
        rows = plan.stream.report(int(position), chunk=chunk)
        return np.array([[r["served"], r["tokens"]] for r in rows], dtype=np.int64)
    layout = layouts[0]
    n = layout.num_samples
    full, rest = divmod(int(position), n)
    out = np.zeros((1, 2), dtype=np.int64)
    if full:
        per_epoch = sum(
            _input_tokens(layout, np.arange(a, min(n, a + chunk), dtype=np.int64)) for a in range(0, n, chunk)
        )
        out[0] += (full * n, full * per_epoch)
    return out + _served(plan, layouts, full * n, full * n + rest, chunk)


def trained_and_skipped(plan: Plan, layouts: Sequence[Layout], step: int, chunk: int = 1 << 16) -> dict[str, Any]:
    """What the data stream held before training step ``step``, split into what was trained (training steps ``0 ..
    step-1``) and what was skipped (the data steps of ``plan.skip_steps`` before ``d(step)``: never trained on).

    ``layouts``: the plan's layout (one), or each mixture source's. Tokens are input tokens (each sample's tokens up to
    ``seq_len``; padding not counted), exact: every sample of a partial epoch and of a skipped range is located.

    Returns ``{"step", "data_step", "position", "trained": {"steps", "samples", "tokens"}, "skipped": {"data_steps",
    "samples", "tokens"}, "sources": [per source {"trained_samples", "trained_tokens", "skipped_samples",
    "skipped_tokens"}]}``; trained + skipped is everything at positions ``[0, plan.consumed(step))``.
    """
    d = plan.data_step(step)
    position = plan.consumed(step)
    ranges = [[a, b] for a, b in (plan.skip_steps or ()) if a < d]
    skipped = np.zeros((len(layouts), 2), dtype=np.int64)
    for a, b in ranges:
        skipped += _served(plan, layouts, plan.data_consumed(a), plan.data_consumed(b + 1), chunk)
    trained = _served_before(plan, layouts, position, chunk) - skipped
    return {
        "step": int(step),
        "data_step": int(d),
        "position": int(position),
        "trained": {"steps": int(step), "samples": int(trained[:, 0].sum()), "tokens": int(trained[:, 1].sum())},
        "skipped": {"data_steps": ranges, "samples": int(skipped[:, 0].sum()), "tokens": int(skipped[:, 1].sum())},
        "sources": [
            {
                "trained_samples": int(t[0]),
                "trained_tokens": int(t[1]),
                "skipped_samples": int(s[0]),
                "skipped_tokens": int(s[1]),
            }
            for t, s in zip(trained.tolist(), skipped.tolist())
        ],
    }
