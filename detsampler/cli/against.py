"""``verify --checkpoint NEW --against OLD``: the proof that a change made on resume (a redaction, a new schedule entry)
moved nothing it must not move.

Two checks, each printed on one line: the data changes between OLD's recorded fingerprint and NEW's, with the resume
rule's verdict at OLD's step (:func:`detsampler.resume.check_resume`); and, over the steps verified, whether every step
of NEW's plan reads the samples OLD's plan reads there (the global batch as a set: the cut into ranks and micro steps
may differ). The samples are compared only when the index and the layout are the same (ids of another layout name other
samples).

Invariant: the report fails exactly when the resume rule refuses the change (the past changed); samples that differ
from OLD's step on are reported, not failed (an accepted change, such as a new batch-size entry, moves them).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from detsampler.cli.checkpoint import Audit, mixture_of
from detsampler.plan import Plan
from detsampler.record import DataRecord
from detsampler.resume import check_resume, fingerprint_changes

__all__ = ["report_against"]


def _plan_of(record: Any, audit: Audit) -> Plan:
    if record.is_mixture:
        return record.plan(source=mixture_of(record, audit.layouts))
    return record.plan(audit.layouts[0].num_samples, layout=audit.layouts[0])


def _compare_samples(old: Plan, new: Plan, a: int, b: int) -> tuple[list[int], int]:
    """The steps of ``a..b-1`` whose global batches differ as sets, and the number of samples compared."""
    differ, samples = [], 0
    for step in range(a, b):
        x, y = np.sort(old.global_batch(step)), np.sort(new.global_batch(step))
        samples += len(y)
        if x.shape != y.shape or not np.array_equal(x, y):
            differ.append(step)
    return differ, samples


def report_against(audit: Audit, against: tuple[DataRecord, str], a: int, b: int) -> tuple[list[str], bool]:
    """The lines comparing ``audit``'s checkpoint with ``against`` (the older record and where it was read, as
    :func:`~detsampler.cli.record_files.find_record` returns them) over steps ``a..b-1``, and whether the resume rule
    accepts the change at the older checkpoint's step."""
    record, where = against
    old_fp, new_fp = record.fingerprint, audit.record.fingerprint
    changes = fingerprint_changes(old_fp, new_fp)
    what = "changes " + "; ".join(changes) if changes else "unchanged"
    lines = [f"against {where}: saved at step {record.step}, data {what}"]
    accepted = True
    try:
        check_resume(old_fp, new_fp, record.step)
        lines.append(f"  accepted by the resume rule at step {record.step} (check_resume)")
    except ValueError as exc:
        accepted = False
        lines.append(f"  refused by the resume rule at step {record.step}: {exc}")
    if (old_fp.index, old_fp.layout) != (new_fp.index, new_fp.layout):
        lines.append("  samples not compared: the index or layout differs")
        return lines, accepted
    differ, samples = _compare_samples(_plan_of(record, audit), audit.plan, a, b)
    if not differ:
        lines.append(
            f"  steps {a}..{b - 1}: every step reads the samples its plan reads ({b - a} steps, {samples} samples)"
        )
    else:
        shown = ", ".join(str(s) for s in differ[:3]) + (" ..." if len(differ) > 3 else "")
        lines.append(f"  steps {a}..{b - 1}: {len(differ)} step(s) read other samples than its plan: {shown}")
    return lines, accepted
