"""``detsampler verify``: parse, run the audit of :mod:`detsampler.verify` over steps A..B-1, print its report.

Exit status 0 when the report holds, 1 when not.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from detsampler.cli.against import report_against
from detsampler.cli.checkpoint import after_checkpoint, open_audit
from detsampler.cli.erase import print_erasure_proof
from detsampler.cli.inputs import mixture_plan, prepare, verify_files
from detsampler.cli.options import layout_for, mixture_config, plan_from_args
from detsampler.cli.record_files import find_record
from detsampler.cli.redactions import print_redactions, redaction_rows
from detsampler.mixture import MixtureConfig
from detsampler.plan import Plan
from detsampler.verify import verify_mixture_plan, verify_plan

__all__ = ["cmd_verify"]


def _print_epochs(rows: list[dict[str, Any]], indent: str) -> None:
    for r in rows:
        gaps = "n/a (partial epoch)" if r["gaps"] is None else r["gaps"]
        skipped = f", {r['skipped_samples']} skipped" if r["skipped_samples"] else ""
        print(
            f"{indent}epoch {r['epoch']}: {r['positions']} positions, {r['distinct_samples']} distinct samples "
            f"({100 * r['coverage']:.2f}% of the epoch){skipped}, duplicates {r['duplicates']}, gaps {gaps}"
            + (", complete" if r["complete"] else "")
        )


def _proved_erased(indexes: Sequence[Any], labels: Sequence[str] | None = None) -> bool:
    """The erasure proof of each index that records erasures (:func:`~detsampler.cli.erase.print_erasure_proof`)."""
    ok = True
    for k, index in enumerate(indexes):
        if getattr(index, "erasures", None):
            if labels is not None:
                print(f"source {labels[k]}:")
            ok &= print_erasure_proof(index)
    return ok


def _print_verdict(report: dict, changed_before: int | None = None, erased: bool = True) -> int:
    """The last line; ``changed_before``: the older checkpoint's step when ``--against`` found the past changed;
    ``erased``: whether every recorded erasure's bytes read back as the neutral id."""
    if not erased:
        print("FAILED: an erased document's stored bytes are not all the neutral id")
        return 1
    if not report["ok"]:
        print("FAILED: duplicates or gaps found")
    elif changed_before is not None:
        print(f"FAILED: the data changed before step {changed_before}")
    else:
        print("OK: no duplicates, no gaps")
    return 0 if report["ok"] and changed_before is None else 1


def _print_header(report: dict, plan: Plan, what: str) -> None:
    a, b = report["steps"]
    print(
        f"verify steps {a}..{b - 1}: {b - a} steps x {plan.world_size} rank(s), positions [{report['positions'][0]}, "
        f"{report['positions'][1]}), {what}"
    )
    if report["skipped"]["positions"]:
        ranges = ", ".join(f"{lo}..{hi}" for lo, hi in report["skipped"]["data_steps"])
        print(
            f"  skipped: data steps {ranges} ({report['skipped']['positions']} positions, never trained on; "
            "accounted as skipped, not as gaps)"
        )
    if report["position_problems"]:
        print(f"  micro batches do not partition steps {report['position_problems'][:10]}")


def _cmd_verify_checkpoint(args: argparse.Namespace) -> int:
    """Verify what ``--checkpoint`` records over ``--steps`` (default: every step it trained, ``0:STEP``)."""
    audit = open_audit(args)
    record, plan = audit.record, audit.plan
    against = find_record(args.against, "--against") if args.against is not None else None  # refused before any output
    if args.steps is None and record.step == 0:
        raise ValueError(f"checkpoint {audit.where} was saved at step 0: no step was trained; pass --steps A:B")
    a, b = (0, record.step) if args.steps is None else args.steps
    print(
        f"checkpoint {audit.where}: saved at step {record.step}"
        + (f" by {record.framework}" if record.framework else "")
        + f", data fingerprint {record.fingerprint.hash} (checked against the reopened index"
        + ("es" if len(audit.layouts) > 1 else "")
        + ")"
    )
    after = after_checkpoint(record, b)
    if after is not None:
        print(after)
    if getattr(args, "tokens", False):
        for line in [verify_files(p.index).line() for p in audit.prepared]:  # every check before any line
            print(line)
    if audit.labels is None:
        report = verify_plan(plan, a, b)
        layout = audit.layouts[0]
        _print_header(report, plan, f"{layout.config.kind} layout of {layout.num_samples} samples per epoch")
        _print_epochs(report["epochs"], "  ")
        indexes, instance_filter = [p.index for p in audit.prepared], record.instance_filter()
        print_redactions(redaction_rows(plan, layout, b, indexes, instance_filter), b)
    else:
        report = verify_mixture_plan(plan, a, b)
        _print_mixture(report, plan, audit.layouts, audit.labels)
        rows = redaction_rows(plan, audit.layouts, b, [p.index for p in audit.prepared], record.instance_filter())
        print_redactions(rows, b, audit.labels)
    erased = _proved_erased([p.index for p in audit.prepared], audit.labels)
    changed_before = None
    if against is not None and not report_against(audit, against, a, b):
        changed_before = against[0].step
    return _print_verdict(report, changed_before, erased)


def _print_mixture(report: dict, plan: Plan, layouts: list, labels: Sequence[str]) -> None:
    _print_header(report, plan, f"{layouts[0].config.kind} layouts, mixture of {len(layouts)} sources")
    for name, src in zip(labels, report["sources"]):
        print(
            f"  source {name}: {src['num_samples']} samples per epoch, source positions [{src['served'][0]},"
            f" {src['served'][1]})"
        )
        _print_epochs(src["epochs"], "    ")


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
    if getattr(args, "tokens", False):
        print(verify_files(prepared.index).line())
    layout = layout_for(prepared.index, args)
    plan = plan_from_args(args, layout.num_samples)
    a, b = args.steps
    report = verify_plan(plan, a, b)
    _print_header(report, plan, f"{layout.config.kind} layout of {layout.num_samples} samples per epoch")
    _print_epochs(report["epochs"], "  ")
    print_redactions(redaction_rows(plan, layout, b, [prepared.index]), b)
    return _print_verdict(report, erased=_proved_erased([prepared.index]))


def _cmd_verify_mixture(args: argparse.Namespace, config: MixtureConfig) -> int:
    prepared, layouts, plan = mixture_plan(args, config)
    if getattr(args, "tokens", False):
        for p, name in zip(prepared, config.labels):
            print(f"source {name}: {verify_files(p.index).line()}")
    a, b = args.steps
    report = verify_mixture_plan(plan, a, b)
    _print_mixture(report, plan, layouts, config.labels)
    print_redactions(redaction_rows(plan, layouts, b, [p.index for p in prepared]), b, config.labels)
    return _print_verdict(report, erased=_proved_erased([p.index for p in prepared], config.labels))
