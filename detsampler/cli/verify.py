"""``detsampler verify``: parse, run the audit of :mod:`detsampler.verify` over steps A..B-1, print its report.

Exit status 0 when the report holds, 1 when not. The whole report (the files' check, the epochs, the redactions, the
comparison with ``--against``) is computed before its first line is printed: a refusal prints nothing on stdout.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from detsampler.cli.against import report_against
from detsampler.cli.checkpoint import after_checkpoint, open_audit
from detsampler.cli.erase import erasure_proof_lines
from detsampler.cli.inputs import mixture_plan, prepare, verify_files
from detsampler.cli.options import layout_for, mixture_config, plan_from_args
from detsampler.cli.record_files import find_record
from detsampler.cli.redactions import redaction_lines, redaction_rows
from detsampler.mixture import MixtureConfig
from detsampler.plan import Plan
from detsampler.verify import verify_mixture_plan, verify_plan

__all__ = ["cmd_verify"]


def _epoch_lines(rows: list[dict[str, Any]], indent: str) -> list[str]:
    lines = []
    for r in rows:
        gaps = "n/a (partial epoch)" if r["gaps"] is None else r["gaps"]
        skipped = f", {r['skipped_samples']} skipped" if r["skipped_samples"] else ""
        lines.append(
            f"{indent}epoch {r['epoch']}: {r['positions']} positions, {r['distinct_samples']} distinct samples "
            f"({100 * r['coverage']:.2f}% of the epoch){skipped}, duplicates {r['duplicates']}, gaps {gaps}"
            + (", complete" if r["complete"] else "")
        )
    return lines


def _erasure_lines(indexes: Sequence[Any], labels: Sequence[str] | None = None) -> tuple[list[str], bool]:
    """The erasure proof of each index that records erasures (:func:`~detsampler.cli.erase.erasure_proof_lines`):
    (its lines, whether every erased document's bytes read back as the neutral id)."""
    lines, ok = [], True
    for k, index in enumerate(indexes):
        if getattr(index, "erasures", None):
            if labels is not None:
                lines.append(f"source {labels[k]}:")
            proof, gone = erasure_proof_lines(index)
            lines += proof
            ok &= gone
    return lines, ok


def _verdict(report: dict, changed_before: int | None = None, erased: bool = True) -> tuple[str, int]:
    """The last line and the exit status; ``changed_before``: the older checkpoint's step when ``--against`` found the
    past changed; ``erased``: whether every recorded erasure's bytes read back as the neutral id."""
    if not erased:
        return "FAILED: an erased document's stored bytes are not all the neutral id", 1
    if not report["ok"]:
        return "FAILED: duplicates or gaps found", 1
    if changed_before is not None:
        return f"FAILED: the data changed before step {changed_before}", 1
    return "OK: no duplicates, no gaps", 0


def _header_lines(report: dict, plan: Plan, what: str) -> list[str]:
    a, b = report["steps"]
    lines = [
        f"verify steps {a}..{b - 1}: {b - a} steps x {plan.world_size} rank(s), positions [{report['positions'][0]}, "
        f"{report['positions'][1]}), {what}"
    ]
    if report["skipped"]["positions"]:
        ranges = ", ".join(f"{lo}..{hi}" for lo, hi in report["skipped"]["data_steps"])
        lines.append(
            f"  skipped: data steps {ranges} ({report['skipped']['positions']} positions, never trained on; "
            "accounted as skipped, not as gaps)"
        )
    if report["position_problems"]:
        lines.append(f"  micro batches do not partition steps {report['position_problems'][:10]}")
    return lines


def _report_lines(
    plan: Plan,
    layouts: Sequence[Any],
    labels: Sequence[str] | None,
    a: int,
    b: int,
    indexes: Sequence[Any],
    instance_filter: Any = None,
) -> tuple[dict, list[str], bool]:
    """The audit of steps ``a..b-1`` of ``plan`` over ``layouts`` (one, or a mixture's with ``labels``) and their
    ``indexes``: (its report, its lines: the header, the epochs, the redactions (their trained labels counted through
    ``instance_filter``), the erasure proofs; whether every erasure is proved)."""
    erasures, erased = _erasure_lines(indexes, labels)
    if labels is None:
        report = verify_plan(plan, a, b)
        layout = layouts[0]
        lines = _header_lines(report, plan, f"{layout.config.kind} layout of {layout.num_samples} samples per epoch")
        lines += _epoch_lines(report["epochs"], "  ")
        lines += redaction_lines(redaction_rows(plan, layout, b, indexes, instance_filter), b)
        return report, lines + erasures, erased
    report = verify_mixture_plan(plan, a, b)
    lines = _header_lines(report, plan, f"{layouts[0].config.kind} layouts, mixture of {len(layouts)} sources")
    for name, src in zip(labels, report["sources"]):
        lines.append(
            f"  source {name}: {src['num_samples']} samples per epoch, source positions [{src['served'][0]},"
            f" {src['served'][1]})"
        )
        lines += _epoch_lines(src["epochs"], "    ")
    lines += redaction_lines(redaction_rows(plan, list(layouts), b, indexes, instance_filter), b, labels)
    return report, lines + erasures, erased


def _print(lines: list[str], report: dict, changed_before: int | None = None, erased: bool = True) -> int:
    """Print ``lines`` and the verdict; returns the exit status."""
    verdict, status = _verdict(report, changed_before, erased)
    print("\n".join([*lines, verdict]))
    return status


def _cmd_verify_checkpoint(args: argparse.Namespace) -> int:
    """Verify what ``--checkpoint`` records over ``--steps`` (default: every step it trained, ``0:STEP``)."""
    audit = open_audit(args)
    record, plan = audit.record, audit.plan
    against = find_record(args.against, "--against") if args.against is not None else None
    if args.steps is None and record.step == 0:
        raise ValueError(f"checkpoint {audit.where} was saved at step 0: no step was trained; pass --steps A:B")
    a, b = (0, record.step) if args.steps is None else args.steps
    lines = [
        f"checkpoint {audit.where}: saved at step {record.step}"
        + (f" by {record.framework}" if record.framework else "")
        + f", data fingerprint {record.fingerprint.hash} (checked against the reopened index"
        + ("es" if len(audit.layouts) > 1 else "")
        + ")"
    ]
    after = after_checkpoint(record, b)
    if after is not None:
        lines.append(after)
    if getattr(args, "tokens", False):
        lines += [verify_files(p.index).line() for p in audit.prepared]
    indexes = [p.index for p in audit.prepared]
    report, more, erased = _report_lines(plan, audit.layouts, audit.labels, a, b, indexes, record.instance_filter())
    lines += more
    changed_before = None
    if against is not None:
        compared, accepted = report_against(audit, against, a, b)
        lines += compared
        changed_before = None if accepted else against[0].step
    return _print(lines, report, changed_before, erased)


def cmd_verify(args: argparse.Namespace) -> int:
    """Verify ``--steps A:B`` and print the report; exit status 0 when it holds, 1 when not."""
    if args.checkpoint is not None:
        return _cmd_verify_checkpoint(args)
    if args.against is not None:
        raise ValueError(
            "--against needs --checkpoint: it compares two checkpoints' records (--checkpoint NEW --against OLD)"
        )
    if args.steps is None:
        raise ValueError("verify needs --steps A:B (or --checkpoint PATH, which verifies every step it trained)")
    config = mixture_config(args)
    if config is not None:
        return _cmd_verify_mixture(args, config)
    prepared = prepare(args)
    layout = layout_for(prepared.index, args)
    plan = plan_from_args(args, layout.num_samples, layout=layout, documents=[prepared.index.num_documents])
    lines = [verify_files(prepared.index).line()] if getattr(args, "tokens", False) else []
    a, b = args.steps
    report, more, erased = _report_lines(plan, [layout], None, a, b, [prepared.index])
    return _print(lines + more, report, erased=erased)


def _cmd_verify_mixture(args: argparse.Namespace, config: MixtureConfig) -> int:
    prepared, layouts, plan = mixture_plan(args, config)
    lines = []
    if getattr(args, "tokens", False):
        lines += [f"source {name}: {verify_files(p.index).line()}" for p, name in zip(prepared, config.labels)]
    a, b = args.steps
    report, more, erased = _report_lines(plan, layouts, config.labels, a, b, [p.index for p in prepared])
    return _print(lines + more, report, erased=erased)
