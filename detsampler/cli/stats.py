"""``detsampler stats``: corpus and index counts, and per layout kind (or per mixture source) samples per epoch,
padding, dropped tokens, steps per epoch and what a step has reached; with skip ranges before the step (and always with
``--checkpoint``), the tokens trained and the tokens skipped (never trained on) before it.

Invariant: every number is read from the index, the layouts and the plan; nothing is estimated.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

import numpy as np

from detsampler.cli.checkpoint import after_checkpoint, open_audit
from detsampler.cli.inputs import mixture_plan, prepare
from detsampler.cli.options import (
    is_media,
    layout_config,
    layout_for,
    media_layout_config,
    mixture_config,
    plan_from_args,
)
from detsampler.cli.redactions import print_redactions, redaction_rows
from detsampler.cli.report import fmt_int, fmt_loss_mask, print_json, print_rows
from detsampler.layout import LAYOUT_KINDS
from detsampler.mixture import MixtureConfig
from detsampler.plan import Plan
from detsampler.verify import document_stats, layout_stats, mixture_stats, trained_and_skipped

__all__ = ["cmd_stats", "index_stats"]


def _cmd_stats_mixture(args: argparse.Namespace, config: MixtureConfig) -> int:
    prepared, layouts, plan = mixture_plan(args, config)
    return _report_mixture(args, [p.index for p in prepared], layouts, plan, config.labels, args.step, split=None)


def _report_mixture(
    args: argparse.Namespace,
    indexes: Sequence[Any],
    layouts: Sequence[Any],
    plan: Plan,
    labels: Sequence[str],
    step: int | None,
    split: bool | None,
    extra: dict | None = None,
    instance_filter: Any = None,
    before: Sequence[str] = (),
) -> int:
    """The mixture's table (and JSON); the trained/skipped split at ``step`` when ``split`` (None: when skip ranges lie
    before ``step``); ``before``: lines printed first (without ``--json``), once everything is computed."""
    out = mixture_stats(plan, labels, step)
    for row, index in zip(out["sources"], indexes):
        row.update({"documents": index.num_documents, "tokens_in_corpus": index.num_tokens})
    kind, seq_len = layouts[0].config.kind, layouts[0].config.seq_len
    out["layout"] = {"kind": kind, "seq_len": seq_len}
    if split is None:
        split = step is not None and any(a < plan.data_step(step) for a, _ in plan.skip_steps or ())
    if step is not None and split:
        out["split"] = trained_and_skipped(plan, layouts, step)
        for row, part in zip(out["sources"], out["split"]["sources"]):
            row.update(part)
    out.update(extra or {})
    redactions = redaction_rows(plan, list(layouts), step, list(indexes), instance_filter)
    if redactions:
        out["redactions"] = redactions
    if args.json:
        print_json(out, indent=2, sort_keys=True)
        return 0
    for line in before:
        print(line)
    header = f"{'source':<12} {'documents':>10} {'tokens':>12} {'samples/epoch':>14} {'padding':>8}"
    if step is not None:
        print(
            f"at step {step} (data step {out['data_step']}, position {out['position']}), weights "
            f"{', '.join(out['weights_at_step'])}; layout {kind} seq_len={seq_len}"
        )
        header += f" {'samples':>10} {'epochs':>8} {'tokens used':>12} {'token share':>12} {'asked':>7}"
        if "split" in out:
            header += f" {'trained':>12} {'skipped':>10}"
    print(header)
    for row in out["sources"]:
        line = (
            f"{row['name']:<12} {row['documents']:>10,} {row['tokens_in_corpus']:>12,} {row['samples_per_epoch']:>14,} "
            f"{100 * row['padding_fraction']:>7.2f}%"
        )
        if step is not None:
            line += (
                f" {row['samples']:>10,} {row['epochs']:>8.3f} {row['tokens']:>12,} {100 * row['token_share']:>11.2f}% "
                f"{100 * row['expected_share']:>6.2f}%"
            )
            if "split" in out:
                line += f" {row['trained_tokens']:>12,} {row['skipped_tokens']:>10,}"
            line += "  (upsampled)" if row["upsampled"] else ""
        print(line)
    if "split" in out:
        _print_split(out["split"])
    print_redactions(redactions, step, labels)
    return 0


def _print_split(split: dict[str, Any]) -> None:
    """The trained/skipped line of :func:`~detsampler.verify.trained_and_skipped`."""
    ranges = ", ".join(f"{a}..{b}" for a, b in split["skipped"]["data_steps"])
    trained, skipped = split["trained"], split["skipped"]
    what = (
        f"skipped {fmt_int(skipped['tokens'])} tokens ({fmt_int(skipped['samples'])} samples, data steps {ranges}:"
        " never trained on)"
        if ranges
        else "skipped nothing (no skip range before it)"
    )
    print(
        f"before step {split['step']}: trained {fmt_int(trained['tokens'])} tokens ({fmt_int(trained['samples'])}"
        f" samples, {trained['steps']} steps); {what}"
    )


def _kinds(text: str) -> list[str]:
    kinds = [k.strip() for k in text.split(",") if k.strip()]
    for k in kinds:
        if k not in LAYOUT_KINDS:
            raise ValueError(f"--kinds: got {k!r}, allowed kinds are {LAYOUT_KINDS}")
    return kinds


def _audited_layout(args: argparse.Namespace, kinds: Sequence[str]) -> Any:
    """The layout config of the ``--redact`` audit trail: ``--kind`` when given, else the one kind ``--kinds`` names
    (its ``--overlong`` applied as the table applies it), else the default ``--kind``."""
    if "kind" in getattr(args, "explicit", ()):
        return layout_config(args)
    return layout_config(args, kinds[0] if len(kinds) == 1 else args.kind)


def _instance_filter(text: str) -> Any:
    """``--instance-filter max_period=13,min_period=1,max_count=32`` (any of them; empty: OLMo-core's defaults)."""
    from detsampler.filter import RepetitionFilter

    values: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or key.strip() not in ("max_period", "min_period", "max_count") or not value.strip().isdigit():
            raise ValueError(
                f"--instance-filter: got {item!r}, expected max_period=N, min_period=N or max_count=N (N >= 1)"
            )
        values[key.strip()] = int(value)
    return RepetitionFilter(**values)


def index_stats(args: argparse.Namespace, index: Any, kinds: Sequence[str]) -> dict[str, Any]:
    """The index's document and token counts, and per layout kind :func:`~detsampler.verify.layout_stats` (with the
    trained/skipped split at ``--step`` when skip ranges lie before it); with ``--filter-steps``, what the instance
    filter masks over those steps (:func:`detsampler.loader.dataset.instance_filter_counts`, a full read)."""
    out = document_stats(index.lengths)
    counts = index.loss_mask_counts() if hasattr(index, "loss_mask_counts") else None
    if counts is not None:
        out["loss_mask"] = counts
    out["layouts"] = {}
    steps = getattr(args, "filter_steps", None)
    config = _instance_filter(getattr(args, "instance_filter", "")) if steps is not None else None
    media = is_media(index)
    if media:  # one layout: best fit on two axes
        media_layout_config(args, kinds)
        out["images"] = _image_stats(index)
        kinds = ["bestfit"]
    for k in kinds:
        layout = layout_for(index, args) if media else index.layout(layout_config(args, k))
        ordered, documents = layout.config.epoch_order, [index.num_documents]
        plan = plan_from_args(args, layout.num_samples, epoch_ids=ordered, layout=layout, documents=documents)
        out["layouts"][k] = _layout_row(layout, plan, args.step, split=None)
        if media:
            described = layout.describe()
            out["layouts"][k].update({key: described[key] for key in ("llm_fill", "vision_fill", "dropped_documents")})
            out["layouts"][k]["max_patches"] = layout.media_config.max_patches
        if config is not None:
            from detsampler.loader.dataset import instance_filter_counts

            row = instance_filter_counts(index, layout, plan, range(steps[0], steps[1]), config)
            out["layouts"][k]["instance_filter"] = {**config.to_dict(), **row}
    return out


def _image_stats(index: Any) -> dict[str, Any]:
    """A media index's images: how many, by format, and their LLM tokens and vision patches (read from its records)."""
    from detsampler.media.index import FORMAT_CODES

    rows = index.image_rows(np.arange(index.num_images))
    formats = {name: int((rows["format"] == code).sum()) for name, code in FORMAT_CODES.items()}
    return {"count": index.num_images, "formats": formats, "tokens": int(rows["tokens"].sum()),
            "patches": int(rows["patches"].sum()), "bytes": int(rows["size"].sum())}  # fmt: skip


def _layout_row(layout: Any, plan: Plan, step: int | None, split: bool | None) -> dict[str, Any]:
    row = layout_stats(layout, plan, step)
    if split is None:
        split = step is not None and any(a < plan.data_step(step) for a, _ in plan.skip_steps or ())
    if step is not None and split:
        row["split"] = trained_and_skipped(plan, [layout], step)
    return row


def _print_index_stats(out: dict[str, Any], seq_len: int, global_batch_size: int, step: int | None) -> None:
    dt = out["document_tokens"]
    print_rows(
        [
            ("documents", f"{fmt_int(out['documents'])} ({out['empty_documents']} empty)"),
            (
                "tokens",
                f"{fmt_int(out['tokens'])} (+{fmt_int(out['documents'])} EOS = {fmt_int(out['tokens_with_eos'])})",
            ),
            ("tokens/document", f"min {dt['min']}, median {dt['median']:.0f}, mean {dt['mean']:.1f}, max {dt['max']}"),
            *([("loss mask", fmt_loss_mask(out["loss_mask"]))] if "loss_mask" in out else []),
            *([("images", _fmt_images(out["images"]))] if "images" in out else []),
            ("seq_len", seq_len),
            *[("max_patches", row["max_patches"]) for row in out["layouts"].values() if "max_patches" in row],
            ("global batch size", global_batch_size),
        ]
    )
    split = step is not None and any("split" in row for row in out["layouts"].values())
    header = f"{'layout':<9} {'samples/epoch':>14} {'padding':>8} {'dropped':>8} {'steps/epoch':>12}"
    media = any("vision_fill" in row for row in out["layouts"].values())
    if media:
        header += f" {'LLM fill':>9} {'vision fill':>12}"
    if step is not None:
        header += f" {'epochs@' + str(step):>12}"
    if split:
        header += f" {'trained tokens':>15} {'skipped tokens':>15}"
    print(header)
    for k, row in out["layouts"].items():
        line = (
            f"{k:<9} {row['samples_per_epoch']:>14,} {100 * row['padding_fraction']:>7.2f}% {row['dropped_tokens']:>8,}"
            f" {row['steps_per_epoch']:>12.1f}"
        )
        if media:
            line += f" {100 * row['llm_fill']:>8.2f}% {100 * row['vision_fill']:>11.2f}%"
        if step is not None:
            line += f" {row['epochs_at_step']:>12.4f}"
        if split and "split" in row:
            line += f" {row['split']['trained']['tokens']:>15,} {row['split']['skipped']['tokens']:>15,}"
        print(line)
    for k, row in out["layouts"].items():
        if "overlong" in row:
            what = "truncated" if row["overlong"] == "truncate" else "dropped"
            print(
                f"{k}: overlong={row['overlong']}: {fmt_int(row['examples_' + what])} documents longer than seq_len"
                f" {what}, {fmt_int(row['dropped_tokens'])} tokens never served"
            )
    for k, row in out["layouts"].items():
        counts = row.get("instance_filter")
        if counts is not None:
            print(
                f"{k}: instance filter (max_period {counts['max_period']}, min_period {counts['min_period']},"
                f" max_count {counts['max_count']}) over steps {counts['first_step']}:{counts['stop_step']}:"
                f" {fmt_int(counts['flagged_samples'])} of {fmt_int(counts['samples'])} samples flagged,"
                f" {fmt_int(counts['flagged_loss_tokens'])} of {fmt_int(counts['loss_tokens'])} loss tokens masked"
            )
    if split and len(out["layouts"]) == 1:
        _print_split(next(iter(out["layouts"].values()))["split"])


def _fmt_images(images: dict[str, Any]) -> str:
    formats = ", ".join(f"{n:,} {name}" for name, n in images["formats"].items() if n)
    return (
        f"{fmt_int(images['count'])}" + (f" ({formats})" if formats else "") + f": {fmt_int(images['tokens'])} LLM"
        f" tokens, {fmt_int(images['patches'])} vision patches, {fmt_int(images['bytes'])} bytes"
    )


def _cmd_stats_checkpoint(args: argparse.Namespace) -> int:
    """The stats of what a checkpoint records: its layout (or mixture) and plan, at ``--step`` (default: the
    checkpoint's), always with the trained/skipped split."""
    audit = open_audit(args)
    record = audit.record
    kind = audit.layouts[0].config.kind
    if "kinds" in getattr(args, "explicit", ()) and _kinds(args.kinds) != [kind]:
        raise ValueError(f"checkpoint {audit.where}: --kinds {args.kinds} contradicts its layout {kind}; drop --kinds")
    step = record.step if args.step is None else args.step
    where = {
        "checkpoint": {
            "path": audit.where,
            "step": record.step,
            "framework": record.framework,
            "data_fingerprint": record.fingerprint.hash,
        }
    }
    after = after_checkpoint(record, step)
    if after is not None:
        where["checkpoint"]["after"] = [record.step, step]
    before = [  # printed once everything is computed: a refusal prints nothing
        f"checkpoint {audit.where}: saved at step {record.step}"
        + (f" by {record.framework}" if record.framework else "")
        + f", data fingerprint {record.fingerprint.hash} (checked against the reopened index"
        + ("es" if len(audit.layouts) > 1 else "")
        + f"); at step {step}",
        *([after] if after is not None else []),
    ]
    indexes = [p.index for p in audit.prepared]
    if audit.labels is not None:
        return _report_mixture(
            args,
            indexes,
            audit.layouts,
            audit.plan,
            audit.labels,
            step,
            split=True,
            extra=where,
            instance_filter=record.instance_filter(),
            before=before,
        )
    out = document_stats(indexes[0].lengths)
    out["layouts"] = {kind: _layout_row(audit.layouts[0], audit.plan, step, split=True)}
    out.update(where)
    redactions = redaction_rows(audit.plan, audit.layouts[0], step, indexes, record.instance_filter())
    if redactions:
        out["redactions"] = redactions
    if args.json:
        print_json(out, indent=2, sort_keys=True)
        return 0
    schedule = audit.plan.fingerprint()["batch_size_schedule"]
    for line in before:
        print(line)
    _print_index_stats(out, audit.layouts[0].config.seq_len, schedule[-1][1], step)
    print_redactions(redactions, step)
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    """Print the stats of the index (or the mixture, or what ``--checkpoint`` records), as a table or ``--json``."""
    config = mixture_config(args)
    if getattr(args, "filter_steps", None) is not None and (args.checkpoint is not None or config is not None):
        raise ValueError("--filter-steps counts over one index (--data), not a --checkpoint or a mixture")
    if args.checkpoint is not None:
        return _cmd_stats_checkpoint(args)
    if config is not None:
        return _cmd_stats_mixture(args, config)
    prepared = prepare(args)
    kinds = _kinds(args.kinds)
    out = index_stats(args, prepared.index, kinds)
    redactions = []
    if getattr(args, "redactions", None):  # the audit trail over the --kind layout (the one kind --kinds names)
        if is_media(prepared.index):
            layout = layout_for(prepared.index, args)
        else:
            layout = prepared.index.layout(_audited_layout(args, kinds))
        plan = plan_from_args(args, layout.num_samples, layout=layout, documents=[prepared.index.num_documents])
        redactions = redaction_rows(plan, layout, args.step, [prepared.index])
        out["redactions"] = redactions
    if args.json:
        print_json(out, indent=2, sort_keys=True)
        return 0
    _print_index_stats(out, args.seq_len, args.global_batch_size, args.step)
    print_redactions(redactions, args.step)
    return 0
