"""``detsampler stats``: corpus and index counts, and per layout kind (or per mixture source) samples per epoch,
padding,
dropped tokens, steps per epoch and what a step has reached.

Invariant: every number is read from the index, the layouts and the plan; nothing is estimated.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from detsampler.cli.inputs import mixture_plan, prepare
from detsampler.cli.options import layout_config, mixture_config, plan_from_args
from detsampler.cli.report import fmt_int, print_rows
from detsampler.layout import LAYOUT_KINDS
from detsampler.mixture import MixtureConfig
from detsampler.verify import document_stats, layout_stats, mixture_stats

__all__ = ["cmd_stats", "index_stats"]


def _cmd_stats_mixture(args: argparse.Namespace, config: MixtureConfig) -> int:
    prepared, layouts, plan = mixture_plan(args, config)
    out = mixture_stats(plan, config.labels, args.step)
    for row, p in zip(out["sources"], prepared):
        row.update({"documents": p.index.num_documents, "tokens_in_corpus": p.index.num_tokens})
    out["layout"] = {"kind": args.kind, "seq_len": args.seq_len}
    if args.json:
        print(json.dumps(out, indent=2, sort_keys=True))
        return 0
    header = f"{'source':<12} {'documents':>10} {'tokens':>12} {'samples/epoch':>14} {'padding':>8}"
    if args.step is not None:
        print(
            f"at step {args.step} (data step {out['data_step']}, position {out['position']}), weights "
            f"{', '.join(out['weights_at_step'])}; layout {args.kind} seq_len={args.seq_len}"
        )
        header += f" {'samples':>10} {'epochs':>8} {'tokens used':>12} {'token share':>12} {'asked':>7}"
    print(header)
    for row in out["sources"]:
        line = (
            f"{row['name']:<12} {row['documents']:>10,} {row['tokens_in_corpus']:>12,} {row['samples_per_epoch']:>14,} "
            f"{100 * row['padding_fraction']:>7.2f}%"
        )
        if args.step is not None:
            line += (
                f" {row['samples']:>10,} {row['epochs']:>8.3f} {row['tokens']:>12,} {100 * row['token_share']:>11.2f}% "
                f"{100 * row['expected_share']:>6.2f}%" + ("  (upsampled)" if row["upsampled"] else "")
            )
        print(line)
    return 0


def _kinds(text: str) -> list[str]:
    kinds = [k.strip() for k in text.split(",") if k.strip()]
    for k in kinds:
        if k not in LAYOUT_KINDS:
            raise ValueError(f"--kinds: got {k!r}, allowed kinds are {LAYOUT_KINDS}")
    return kinds


def index_stats(args: argparse.Namespace, index: Any, kinds: Sequence[str]) -> dict[str, Any]:
    """The index's document and token counts, and per layout kind :func:`~detsampler.verify.layout_stats`."""
    out = document_stats(index.lengths)
    out["layouts"] = {}
    for k in kinds:
        layout = index.layout(layout_config(args, k))
        out["layouts"][k] = layout_stats(layout, plan_from_args(args, layout.num_samples), args.step)
    return out


def _print_index_stats(args: argparse.Namespace, out: dict[str, Any]) -> None:
    dt = out["document_tokens"]
    print_rows(
        [
            ("documents", f"{fmt_int(out['documents'])} ({out['empty_documents']} empty)"),
            (
                "tokens",
                f"{fmt_int(out['tokens'])} (+{fmt_int(out['documents'])} EOS = {fmt_int(out['tokens_with_eos'])})",
            ),
            ("tokens/document", f"min {dt['min']}, median {dt['median']:.0f}, mean {dt['mean']:.1f}, max {dt['max']}"),
            ("seq_len", args.seq_len),
            ("global batch size", args.global_batch_size),
        ]
    )
    header = f"{'layout':<9} {'samples/epoch':>14} {'padding':>8} {'dropped':>8} {'steps/epoch':>12}"
    if args.step is not None:
        header += f" {'epochs@' + str(args.step):>12}"
    print(header)
    for k, row in out["layouts"].items():
        line = (
            f"{k:<9} {row['samples_per_epoch']:>14,} {100 * row['padding_fraction']:>7.2f}% {row['dropped_tokens']:>8,}"
            f" {row['steps_per_epoch']:>12.1f}"
        )
        if args.step is not None:
            line += f" {row['epochs_at_step']:>12.4f}"
        print(line)


def cmd_stats(args: argparse.Namespace) -> int:
    """Print the stats of the index (or the mixture), as a table or ``--json``."""
    config = mixture_config(args)
    if config is not None:
        return _cmd_stats_mixture(args, config)
    prepared = prepare(args)
    kinds = _kinds(args.kinds)
    out = index_stats(args, prepared.index, kinds)
    if args.json:
        print(json.dumps(out, indent=2, sort_keys=True))
        return 0
    _print_index_stats(args, out)
    return 0
