"""The audit trail of a plan's redactions, as ``stats`` and ``verify`` print it: per redacted document, the steps that
trained on it before its redaction step (:func:`detsampler.where.redaction_audit`), the input tokens they read and,
where the index stores its tokens, the labels they trained (:func:`detsampler.loader.redact.trained_labels`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from detsampler.plan import Plan
from detsampler.where import redaction_audit

__all__ = ["print_redactions", "redaction_lines", "redaction_rows"]


def redaction_rows(
    plan: Plan, layout: Any, stop: int | None, indexes: Sequence[Any] | None = None, instance_filter: Any = None
) -> list[dict]:
    """:func:`~detsampler.where.redaction_audit` of ``plan`` over ``layout`` (over a mixture: the sources' layouts),
    counted to step ``stop`` (the checkpoint's step; None: to each redaction step). Empty without redactions. With
    ``indexes`` (one per layout) each row also holds ``trained``: the labels those reads trained, read through
    ``instance_filter`` (the run's), for the indexes that store their tokens."""
    if not plan.redactions:
        return []
    rows = redaction_audit(plan, layout, stop)
    if indexes is None:
        return rows
    from detsampler.loader.dataset import PackedDataset
    from detsampler.loader.redact import trained_labels
    from detsampler.where import where

    layouts = list(layout) if isinstance(layout, (list, tuple)) else [layout]
    datasets = [
        PackedDataset(index, lay, instance_filter=instance_filter)
        if getattr(index, "tokens", None) is not None
        else None
        for index, lay in zip(indexes, layouts)
    ]
    for row in rows:
        source = row.get("source")
        dataset = datasets[source or 0]
        if dataset is not None:
            last = row["from_step"] if stop is None else min(row["from_step"], int(stop))
            reads = where(plan, layout, row["document"], (0, last), source=source)
            count = trained_labels(dataset, reads, row["document"])
            if count is not None:  # unknown only for a document erased since, under an instance filter
                row["trained"] = count
    return rows


def _ranges(steps: list[int]) -> str:
    """``0, 3..5, 9``: the sorted steps with runs of consecutive steps written ``a..b``."""
    parts, i = [], 0
    while i < len(steps):
        j = i
        while j + 1 < len(steps) and steps[j + 1] == steps[j] + 1:
            j += 1
        parts.append(str(steps[i]) if i == j else f"{steps[i]}..{steps[j]}")
        i = j + 1
    return ", ".join(parts)


def redaction_lines(rows: list[dict], stop: int | None, labels: Sequence[str] | None = None) -> list[str]:
    """One line per redacted document: ``doc D: trained at steps [...] before step s (N tokens read, T trained, R
    reads)`` (T: the labels trained, where counted); over a mixture ``doc D of source NAME: ...`` (``labels``: the
    sources' names)."""
    lines = []
    for row in rows:
        source = "" if "source" not in row else f" of source {labels[row['source']] if labels else row['source']}"
        s = row["from_step"]
        counted = f"; counted to step {stop}, where the run stops" if stop is not None and stop < s else ""
        trained = f"trained at steps [{_ranges(row['steps'])}]" if row["steps"] else "trained at no step"
        taught = f", {row['trained']:,} trained" if "trained" in row else ""
        lines.append(
            f"redacted doc {row['document']}{source}: {trained} before step {s} ({row['tokens']:,} tokens read{taught},"
            f" {row['reads']} read{'' if row['reads'] == 1 else 's'}){counted}"
        )
    return lines


def print_redactions(rows: list[dict], stop: int | None, labels: Sequence[str] | None = None) -> None:
    """Print :func:`redaction_lines`."""
    for line in redaction_lines(rows, stop, labels):
        print(line)
