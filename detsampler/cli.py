"""The ``detsampler`` command: train a tokenizer, build an index, and explain, verify and summarize a plan over it.

Options map one to one onto the library's dataclasses:

- index options -> :class:`detsampler.prepare.IndexConfig` (``--data``, ``--text-column``, ``--tokenizer``, ``--vocab-size``,
  ``--cache-dir``, ``--num-proc``, ``--store-tokens/--no-store-tokens``, ``--max-documents``);
- layout options -> :class:`detsampler.layout.LayoutConfig` (``--kind``, ``--seq-len``, ``--layout-seed`` for its ``seed``,
  ``--window-docs``);
- plan options -> :class:`detsampler.plan.Plan` (``--seed``, ``--global-batch-size``, ``--micro-batch-size``,
  ``--world-size``, ``--batch-size-schedule``); the plan's ``num_samples`` is the layout's.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import fields
from typing import Any, Sequence

import numpy as np

from detsampler.layout import LAYOUT_KINDS, LayoutConfig
from detsampler.plan import Plan

__all__ = ["main", "build_parser", "OPTION_FIELDS"]

# option dest -> (dataclass, field): the one-to-one map the parser is built from (tests check it covers every field)
OPTION_FIELDS: dict[str, tuple[str, str]] = {
    "data": ("IndexConfig", "data"),
    "text_column": ("IndexConfig", "text_column"),
    "tokenizer": ("IndexConfig", "tokenizer"),
    "vocab_size": ("IndexConfig", "vocab_size"),
    "cache_dir": ("IndexConfig", "cache_dir"),
    "num_proc": ("IndexConfig", "num_proc"),
    "store_tokens": ("IndexConfig", "store_tokens"),
    "max_documents": ("IndexConfig", "max_documents"),
    "kind": ("LayoutConfig", "kind"),
    "seq_len": ("LayoutConfig", "seq_len"),
    "layout_seed": ("LayoutConfig", "seed"),
    "window_docs": ("LayoutConfig", "window_docs"),
    "seed": ("Plan", "seed"),
    "global_batch_size": ("Plan", "global_batch_size"),
    "micro_batch_size": ("Plan", "micro_batch_size"),
    "world_size": ("Plan", "world_size"),
    "batch_size_schedule": ("Plan", "batch_size_schedule"),
}


def _schedule(text: str) -> list[tuple[int, int]]:
    try:
        rows = [tuple(int(x) for x in part.split(":")) for part in text.split(",") if part.strip()]
    except ValueError:
        rows = []
    if not rows or any(len(r) != 2 for r in rows):
        raise argparse.ArgumentTypeError(f"expected FIRST_STEP:SIZE[,FIRST_STEP:SIZE...], e.g. 0:8,100:16, got {text!r}")
    return rows  # type: ignore[return-value]


def _step_range(text: str) -> tuple[int, int]:
    try:
        a, b = (int(x) for x in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected A:B (steps A .. B-1), got {text!r}") from None
    if a < 0 or b <= a:
        raise argparse.ArgumentTypeError(f"expected 0 <= A < B, got {text!r}")
    return a, b


def _add_index_options(p: argparse.ArgumentParser) -> None:
    from detsampler.prepare import IndexConfig

    d = IndexConfig()
    g = p.add_argument_group("index (IndexConfig)")
    g.add_argument("--data", default=d.data, metavar="PATH",
                   help="corpus: a text/json/jsonl/parquet file, a directory of them, or a save_to_disk directory "
                        "(default: the running interpreter's standard library sources)")
    g.add_argument("--text-column", default=d.text_column, help="column holding the documents (default: %(default)s)")
    g.add_argument("--tokenizer", default=d.tokenizer, metavar="MODEL",
                   help="sentencepiece .model file (default: train a BPE model of --vocab-size pieces on the corpus once, cached)")
    g.add_argument("--vocab-size", type=int, default=d.vocab_size, help="vocabulary of the default tokenizer (default: %(default)s)")
    g.add_argument("--cache-dir", default=d.cache_dir, metavar="DIR",
                   help="where tokenizers and indexes are cached (default: $DETSAMPLER_CACHE or ./.cache/detsampler)")
    g.add_argument("--num-proc", type=int, default=d.num_proc, help="tokenizer processes for a build (default: %(default)s)")
    g.add_argument("--store-tokens", action=argparse.BooleanOptionalAction, default=d.store_tokens,
                   help="store the tokens (default), or only counts and offsets, tokenizing samples on the fly")
    g.add_argument("--max-documents", type=int, default=d.max_documents, metavar="N", help="use only the first N documents")


def _add_layout_options(p: argparse.ArgumentParser) -> None:
    d = LayoutConfig()
    g = p.add_argument_group("layout (LayoutConfig)")
    g.add_argument("--kind", choices=LAYOUT_KINDS, default=d.kind, help="how documents are cut into samples (default: %(default)s)")
    g.add_argument("--seq-len", type=int, default=d.seq_len, help="input tokens per sample (default: %(default)s)")
    g.add_argument("--layout-seed", type=int, default=d.seed, help="LayoutConfig.seed: the document order (default: %(default)s)")
    g.add_argument("--window-docs", type=int, default=d.window_docs, help="bestfit: documents packed together (default: %(default)s)")


def _add_plan_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("plan (Plan)")
    g.add_argument("--seed", type=int, default=0, help="Plan.seed: the per-epoch shuffle (default: %(default)s)")
    g.add_argument("--global-batch-size", type=int, default=8, help="samples per step, all ranks (default: %(default)s)")
    g.add_argument("--micro-batch-size", type=int, default=2, help="samples per rank per micro step (default: %(default)s)")
    g.add_argument("--world-size", type=int, default=1, help="data-parallel ranks (default: %(default)s)")
    g.add_argument("--batch-size-schedule", type=_schedule, default=None, metavar="S:B[,S:B...]",
                   help="global batch size ramp: FIRST_STEP:SIZE pairs from step 0; the last SIZE must equal --global-batch-size")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="detsampler",
        description="Deterministic, resumable LLM data loading: build a token index and inspect the plan over it.",
        epilog="Every option maps onto one field of IndexConfig, LayoutConfig or Plan; `detsampler COMMAND --help` lists them.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    tok = sub.add_parser("tokenizer", help="tokenizer tools", description="Tokenizer tools.")
    tok_sub = tok.add_subparsers(dest="tokenizer_command", required=True, metavar="ACTION")
    train = tok_sub.add_parser("train", help="train a BPE sentencepiece model", description=(
        "Train a BPE sentencepiece model (byte fallback, identity normalization, '\\n' a piece; unk 0, bos 1, eos 2, pad 3)."))
    train.add_argument("--input", nargs="+", required=True, metavar="FILES_OR_DIR", help="text files or directories (read recursively)")
    train.add_argument("--vocab-size", type=int, required=True, metavar="N", help="number of pieces (>= 300)")
    train.add_argument("--out", required=True, metavar="PATH", help="where to write the .model file")

    build = sub.add_parser("build", help="build (or open) the index and print its summary",
                           description="Build the token index of the corpus (or open the cached one) and print its summary.")
    _add_index_options(build)
    build.add_argument("--verify-tokens", action="store_true", help="also check the token file's sha256 when opening")
    build.add_argument("--json", action="store_true", help="print the summary as JSON")

    show = sub.add_parser("show", help="what a rank reads at a step: documents, token offsets, optionally text",
                          description="Which documents and token offsets each rank reads at a step (and micro step), "
                                      "with the decoded text on --decode: the tool for explaining a loss spike at step S.")
    _add_index_options(show)
    _add_layout_options(show)
    _add_plan_options(show)
    show.add_argument("--step", type=int, required=True, help="the training step")
    show.add_argument("--rank", type=int, default=None, help="one data-parallel rank (default: all)")
    show.add_argument("--micro-step", type=int, default=None, help="one micro step of the step (default: all)")
    show.add_argument("--decode", action="store_true", help="print each span's decoded text")
    show.add_argument("--max-chars", type=int, default=160, help="--decode: characters of text per span (default: %(default)s, 0 = all)")

    verify = sub.add_parser("verify", help="check a range of steps across all ranks: no duplicates, no gaps",
                            description="Recompute the plan for steps A..B-1 on every rank and micro step and check that the "
                                        "micro batches partition each step, no sample repeats within an epoch, and every "
                                        "epoch the range covers completely reads every sample; print epoch coverage.")
    _add_index_options(verify)
    _add_layout_options(verify)
    _add_plan_options(verify)
    verify.add_argument("--steps", type=_step_range, required=True, metavar="A:B", help="steps A .. B-1")

    stats = sub.add_parser("stats", help="documents, tokens, samples per epoch per layout, padding, epochs at a step",
                           description="Corpus and index counts, and per layout kind: samples per epoch, padding fraction, "
                                       "dropped tokens, steps per epoch and the epoch reached at --step.")
    _add_index_options(stats)
    _add_layout_options(stats)
    _add_plan_options(stats)
    stats.add_argument("--step", type=int, default=None, help="report the epoch reached at this step")
    stats.add_argument("--kinds", default=",".join(LAYOUT_KINDS), help="layout kinds to report (default: %(default)s)")
    stats.add_argument("--json", action="store_true", help="print the stats as JSON")
    return parser


# -- shared helpers --------------------------------------------------------------------------------------------------------


def _index_config(args: argparse.Namespace):
    from detsampler.prepare import IndexConfig

    return IndexConfig(**{f.name: getattr(args, f.name) for f in fields(IndexConfig)})


def _layout_config(args: argparse.Namespace, kind: str | None = None) -> LayoutConfig:
    return LayoutConfig(kind=kind or args.kind, seq_len=args.seq_len, seed=args.layout_seed, window_docs=args.window_docs)


def _plan(args: argparse.Namespace, num_samples: int) -> Plan:
    return Plan(
        num_samples,
        seed=args.seed,
        global_batch_size=args.global_batch_size,
        micro_batch_size=args.micro_batch_size,
        world_size=args.world_size,
        batch_size_schedule=args.batch_size_schedule,
    )


def _prepare(args: argparse.Namespace, verify_tokens: bool = False):
    from detsampler.index import TokenIndex
    from detsampler.prepare import prepare_index

    prepared = prepare_index(_index_config(args), progress=sys.stderr.isatty())
    if verify_tokens:
        TokenIndex.open(prepared.index.path, verify_tokens=True)
    return prepared


def _print_rows(rows: Sequence[tuple[str, Any]]) -> None:
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")


def _rel(path: str) -> str:
    """``path`` relative to the current directory when it lies under it."""
    from pathlib import Path

    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _fmt_int(n: int) -> str:
    return f"{n:,}"


# -- commands --------------------------------------------------------------------------------------------------------------


def cmd_tokenizer_train(args: argparse.Namespace) -> int:
    from detsampler.tokenizer import train_tokenizer

    tok = train_tokenizer(args.input, args.vocab_size, args.out)
    _print_rows([("model", tok.path), ("sha256", tok.sha256), ("vocab_size", tok.vocab_size), ("eos_id", tok.eos_id), ("pad_id", tok.pad_id)])
    return 0


def cmd_build(args: argparse.Namespace) -> int:
    prepared = _prepare(args, verify_tokens=args.verify_tokens)
    summary = prepared.index.summary()
    summary["tokenizer_path"] = prepared.tokenizer.path
    if args.json:
        print(json.dumps(summary, indent=2, sort_keys=True))
        return 0
    build = summary["build"]
    _print_rows([
        ("index", _rel(summary["path"])),
        ("documents", _fmt_int(summary["num_documents"])),
        ("tokens", f"{_fmt_int(summary['num_tokens'])} (+{_fmt_int(summary['num_documents'])} EOS)"),
        ("token dtype", summary["token_dtype"] + ("" if summary["store_tokens"] else " (not stored: tokenized on the fly)")),
        ("text column", summary["text_column"]),
        ("dataset fingerprint", summary["dataset_fingerprint"]),
        ("tokenizer", f"{_rel(summary['tokenizer_path'])} (sha256 {summary['tokenizer_sha256'][:16]}..., vocab {summary['vocab_size']}, "
                      f"eos {summary['eos_id']}, pad {summary['pad_id']})"),
        ("index fingerprint", summary["fingerprint"]),
        ("built in", f"{build.get('seconds')} s, {_fmt_int(int(build.get('tokens_per_second', 0)))} tokens/s, "
                     f"num_proc={build.get('num_proc')}"),
    ])
    return 0


def _span_text(prepared, doc: int, start: int, stop: int, max_chars: int) -> str:
    index = prepared.index
    n = int(index.lengths[doc])
    stop_tok = min(stop, n)
    if index.tokens is not None:
        ids = np.asarray(index.tokens[int(index.offsets[doc]) + start : int(index.offsets[doc]) + stop_tok]).tolist()
    else:
        text = prepared.dataset[int(doc)][index.text_column]
        ids = prepared.tokenizer.encode_batch([text])[0][start:stop_tok]
    text = prepared.tokenizer.decode(ids) if ids else ""
    if stop > n:
        text += "<EOS>"
    if max_chars and len(text) > max_chars:
        text = text[: max_chars // 2] + " [...] " + text[-(max_chars - max_chars // 2) :]
    return repr(text)


def cmd_show(args: argparse.Namespace) -> int:
    from detsampler.locate import locate

    prepared = _prepare(args)
    index = prepared.index
    layout = index.layout(_layout_config(args))
    plan = _plan(args, layout.num_samples)
    step = args.step
    ranks = range(plan.world_size) if args.rank is None else [args.rank]
    micro_steps = range(plan.num_micro_steps(step)) if args.micro_step is None else [args.micro_step]
    has_path = "path" in prepared.dataset.column_names
    print(
        f"step {step}: epoch {plan.epoch(step)}, global batch {plan.batch_size(step)} samples at positions "
        f"[{plan.consumed(step)}, {plan.consumed(step) + plan.batch_size(step)}), {plan.num_micro_steps(step)} micro step(s) "
        f"x {plan.world_size} rank(s) x {plan.micro_batch_size}; layout {layout.config.kind} seq_len={layout.config.seq_len}, "
        f"{layout.num_samples} samples per epoch"
    )
    for a in micro_steps:
        for r in ranks:
            loc = locate(plan, layout, step, rank=r, micro_step=a)
            print(f"rank {r} micro step {a}:")
            for i in range(len(loc.sample_ids)):
                spans = loc.spans.sample(i)
                ntok = sum(e - s for _, s, e in spans)
                print(f"  position {int(loc.positions[i])}  sample {int(loc.sample_ids[i])}  epoch {int(loc.epochs[i])}  "
                      f"{ntok} positions in {len(spans)} span(s)")
                for doc, s, e in spans:
                    n = int(index.lengths[doc])
                    where = f"doc {doc}" + (f" ({prepared.dataset[int(doc)]['path']})" if has_path else "")
                    eos = " + EOS" if e > n else ""
                    print(f"    {where}  tokens [{s}, {min(e, n)}) of {n}{eos}")
                    if args.decode:
                        print(f"      {_span_text(prepared, doc, s, e, args.max_chars)}")
    return 0


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
        parts = [plan.micro_batch_positions(step, a, r) for a in range(plan.num_micro_steps(step)) for r in range(plan.world_size)]
        positions = np.concatenate(parts)
        if not np.array_equal(np.sort(positions), plan.step_positions(step)):
            position_problems.append(step)
        pending.append(positions)
        if len(pending) >= 1024:
            flush()
    flush()
    epochs_report = []
    for e in sorted(counts):
        c = counts[e]
        lo, hi = max(first, e * n), min(last, (e + 1) * n)
        complete = lo == e * n and hi == (e + 1) * n
        seen = int((c > 0).sum())
        epochs_report.append({
            "epoch": e,
            "positions": hi - lo,
            "distinct_samples": seen,
            "duplicates": int((c[c > 1] - 1).sum()),
            "gaps": (n - seen) if complete else None,
            "coverage": seen / n,
            "complete": complete,
        })
    ok = not position_problems and all(r["duplicates"] == 0 and not r["gaps"] for r in epochs_report)
    return {"steps": [start, stop], "positions": [first, last], "num_samples": n, "ok": ok,
            "position_problems": position_problems, "epochs": epochs_report}


def cmd_verify(args: argparse.Namespace) -> int:
    prepared = _prepare(args)
    layout = prepared.index.layout(_layout_config(args))
    plan = _plan(args, layout.num_samples)
    a, b = args.steps
    report = verify_plan(plan, a, b)
    print(f"verify steps {a}..{b - 1}: {b - a} steps x {plan.world_size} rank(s), positions [{report['positions'][0]}, "
          f"{report['positions'][1]}), {layout.config.kind} layout of {layout.num_samples} samples per epoch")
    if report["position_problems"]:
        print(f"  micro batches do not partition steps {report['position_problems'][:10]}")
    for r in report["epochs"]:
        gaps = "n/a (partial epoch)" if r["gaps"] is None else r["gaps"]
        print(f"  epoch {r['epoch']}: {r['positions']} positions, {r['distinct_samples']} distinct samples "
              f"({100 * r['coverage']:.2f}% of the epoch), duplicates {r['duplicates']}, gaps {gaps}"
              + (", complete" if r["complete"] else ""))
    print("OK: no duplicates, no gaps" if report["ok"] else "FAILED: duplicates or gaps found")
    return 0 if report["ok"] else 1


def cmd_stats(args: argparse.Namespace) -> int:
    prepared = _prepare(args)
    index = prepared.index
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    for k in kinds:
        if k not in LAYOUT_KINDS:
            raise ValueError(f"--kinds: got {k!r}, allowed kinds are {LAYOUT_KINDS}")
    lengths = np.asarray(index.lengths)
    out: dict[str, Any] = {
        "documents": index.num_documents,
        "tokens": index.num_tokens,
        "tokens_with_eos": index.num_tokens + index.num_documents,
        "empty_documents": int((lengths == 0).sum()),
        "document_tokens": {"min": int(lengths.min()), "median": float(np.median(lengths)), "mean": float(lengths.mean()),
                            "max": int(lengths.max())},
        "layouts": {},
    }
    for k in kinds:
        layout = index.layout(_layout_config(args, k))
        plan = _plan(args, layout.num_samples)
        d = layout.describe()
        row = {"samples_per_epoch": layout.num_samples, "padding_fraction": d["padding_fraction"],
               "dropped_tokens": d["dropped_tokens"], "steps_per_epoch": layout.num_samples / plan.global_batch_size}
        if args.step is not None:
            row["epochs_at_step"] = plan.consumed(args.step) / layout.num_samples
            row["epoch_at_step"] = plan.epoch(args.step)
        out["layouts"][k] = row
    if args.json:
        print(json.dumps(out, indent=2, sort_keys=True))
        return 0
    dt = out["document_tokens"]
    _print_rows([
        ("documents", f"{_fmt_int(out['documents'])} ({out['empty_documents']} empty)"),
        ("tokens", f"{_fmt_int(out['tokens'])} (+{_fmt_int(out['documents'])} EOS = {_fmt_int(out['tokens_with_eos'])})"),
        ("tokens/document", f"min {dt['min']}, median {dt['median']:.0f}, mean {dt['mean']:.1f}, max {dt['max']}"),
        ("seq_len", args.seq_len),
        ("global batch size", args.global_batch_size),
    ])
    header = f"{'layout':<9} {'samples/epoch':>14} {'padding':>8} {'dropped':>8} {'steps/epoch':>12}"
    if args.step is not None:
        header += f" {'epochs@' + str(args.step):>12}"
    print(header)
    for k, row in out["layouts"].items():
        line = (f"{k:<9} {row['samples_per_epoch']:>14,} {100 * row['padding_fraction']:>7.2f}% {row['dropped_tokens']:>8,} "
                f"{row['steps_per_epoch']:>12.1f}")
        if args.step is not None:
            line += f" {row['epochs_at_step']:>12.4f}"
        print(line)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """The ``detsampler`` entry point. Bad input is reported as ``detsampler: error: ...`` with exit status 2."""
    parser = build_parser()
    args = parser.parse_args(argv)
    commands = {"build": cmd_build, "show": cmd_show, "verify": cmd_verify, "stats": cmd_stats}
    try:
        if args.command == "tokenizer":
            return cmd_tokenizer_train(args)
        return commands[args.command](args)
    except ValueError as exc:  # every bad input is a ValueError naming what is wrong
        parser.exit(2, f"detsampler: error: {exc}\n")
    return 0  # pragma: no cover


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
