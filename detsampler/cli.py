"""The ``detsampler`` command: train a tokenizer, build an index, and explain, verify and summarize a plan over it.

Options map one to one onto the library's dataclasses:

- index options -> :class:`detsampler.prepare.IndexConfig` (``--data``, ``--text-column``, ``--tokenizer``, ``--vocab-size``,
  ``--cache-dir``, ``--num-proc``, ``--store-tokens/--no-store-tokens``, ``--max-documents``);
- layout options -> :class:`detsampler.layout.LayoutConfig` (``--kind``, ``--seq-len``, ``--layout-seed`` for its ``seed``,
  ``--window-docs``);
- plan options -> :class:`detsampler.plan.Plan` (``--seed``, ``--global-batch-size``, ``--micro-batch-size``,
  ``--world-size``, ``--batch-size-schedule``, ``--skip-steps``); the plan's ``num_samples`` is the layout's;
- mixture options -> :class:`detsampler.mixture.MixtureConfig` (``--mixture-data`` for its ``sources``,
  ``--mixture-weights``, ``--mixture-schedule``, ``--mixture-seed``, ``--mixture-names``). With ``--mixture-data``, each source
  is indexed like ``--data`` (the other index options are shared, and so is the tokenizer: ``--tokenizer``, or else the
  default one trained on the standard library), cut by the same layout options, and the plan draws from their mixture.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import fields
from typing import Any, Sequence

import numpy as np

from detsampler.layout import LAYOUT_KINDS, LayoutConfig
from detsampler.mixture import Mixture, MixtureConfig
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
    "skip_steps": ("Plan", "skip_steps"),
    "mixture_data": ("MixtureConfig", "sources"),
    "mixture_weights": ("MixtureConfig", "weights"),
    "mixture_schedule": ("MixtureConfig", "schedule"),
    "mixture_seed": ("MixtureConfig", "seed"),
    "mixture_names": ("MixtureConfig", "names"),
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


def _skip_ranges(text: str) -> list[tuple[int, int]]:
    try:
        rows = [tuple(int(x) for x in part.split(":")) for part in text.split(",") if part.strip()]
    except ValueError:
        rows = []
    if not rows or any(len(r) != 2 for r in rows):
        raise argparse.ArgumentTypeError(f"expected FIRST:LAST[,FIRST:LAST...] (inclusive data steps), e.g. 100:199, got {text!r}")
    return rows  # type: ignore[return-value]


def _csv(text: str) -> list[str]:
    items = [x.strip() for x in text.split(",")]
    if not text.strip() or not all(items):
        raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {text!r}")
    return items


def _weights_entry(text: str) -> tuple[int, list[str]]:
    step, sep, weights = text.partition(":")
    try:
        first = int(step)
    except ValueError:
        first = -1
    if not sep or first < 1 or not weights.strip():
        raise argparse.ArgumentTypeError(f"expected FIRST_STEP:W,W,... with FIRST_STEP >= 1, e.g. 5000:0.4,0.2,0.4, got {text!r}")
    return first, _csv(weights)


def _add_mixture_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("mixture (MixtureConfig)")
    g.add_argument("--mixture-data", type=_csv, default=None, metavar="PATH,PATH,...",
                   help="MixtureConfig.sources: draw from a mixture of these corpora (each indexed like --data) instead of --data")
    g.add_argument("--mixture-weights", type=_csv, default=None, metavar="W,W,...",
                   help="MixtureConfig.weights: one weight per source from step 0 (numbers or fractions such as 1/3)")
    g.add_argument("--mixture-schedule", type=_weights_entry, action="append", default=None, metavar="STEP:W,W,...",
                   help="MixtureConfig.schedule: weights from data step STEP on (repeat the option for more entries)")
    g.add_argument("--mixture-seed", type=int, default=0, help="MixtureConfig.seed: interleaving and source shuffles (default: %(default)s)")
    g.add_argument("--mixture-names", type=_csv, default=None, metavar="NAME,NAME,...",
                   help="MixtureConfig.names: labels of the sources in reports (default: their paths)")


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
    g.add_argument("--skip-steps", type=_skip_ranges, default=None, metavar="A:B[,A:B...]",
                   help="data steps A..B (inclusive) never trained on: training step s reads the s-th data step outside them")


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
    _add_mixture_options(show)
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
    _add_mixture_options(verify)
    verify.add_argument("--steps", type=_step_range, required=True, metavar="A:B", help="steps A .. B-1")

    stats = sub.add_parser("stats", help="documents, tokens, samples per epoch per layout, padding, epochs at a step",
                           description="Corpus and index counts, and per layout kind: samples per epoch, padding fraction, "
                                       "dropped tokens, steps per epoch and the epoch reached at --step.")
    _add_index_options(stats)
    _add_layout_options(stats)
    _add_plan_options(stats)
    _add_mixture_options(stats)
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


def _plan(args: argparse.Namespace, num_samples: int | Mixture) -> Plan:
    return Plan(
        num_samples,
        seed=args.seed,
        global_batch_size=args.global_batch_size,
        micro_batch_size=args.micro_batch_size,
        world_size=args.world_size,
        batch_size_schedule=args.batch_size_schedule,
        skip_steps=args.skip_steps,
    )


def _mixture_config(args: argparse.Namespace) -> MixtureConfig | None:
    """The mixture options as a MixtureConfig, or None without --mixture-data."""
    if args.mixture_data is None:
        for dest in ("mixture_weights", "mixture_schedule", "mixture_names"):
            if getattr(args, dest) is not None:
                raise ValueError(f"--{dest.replace('_', '-')} needs --mixture-data (the sources of the mixture)")
        return None
    if args.data is not None:
        raise ValueError("give either --data (one corpus) or --mixture-data (a mixture), not both")
    if args.mixture_weights is None:
        raise ValueError("--mixture-data needs --mixture-weights, one weight per source")
    return MixtureConfig(sources=args.mixture_data, weights=args.mixture_weights, schedule=args.mixture_schedule or (),
                         seed=args.mixture_seed, names=args.mixture_names)


def _prepare_sources(args: argparse.Namespace, config: MixtureConfig) -> list:
    """One prepared index per mixture source, all with the same tokenizer."""
    from dataclasses import replace

    from detsampler.corpus import default_tokenizer
    from detsampler.prepare import prepare_index

    index_config = _index_config(args)
    tokenizer = index_config.tokenizer
    if tokenizer is None:
        tokenizer = default_tokenizer(index_config.cache_path, vocab_size=index_config.vocab_size).path
    return [prepare_index(replace(index_config, data=src, tokenizer=str(tokenizer)), progress=sys.stderr.isatty())
            for src in config.sources]


def _mixture_plan(args: argparse.Namespace, config: MixtureConfig, kind: str | None = None):
    """(prepared sources, their layouts, the plan over their mixture)."""
    prepared = _prepare_sources(args, config)
    layouts = [p.index.layout(_layout_config(args, kind)) for p in prepared]
    return prepared, layouts, _plan(args, config.build(layouts))


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


def _fmt_weights(weights) -> str:
    return ", ".join(str(w) for w in weights)


def cmd_show(args: argparse.Namespace) -> int:
    from detsampler.locate import locate

    config = _mixture_config(args)
    if config is None:
        prepared = [_prepare(args)]
        layouts = [prepared[0].index.layout(_layout_config(args))]
        plan = _plan(args, layouts[0].num_samples)
        labels = None
    else:
        prepared, layouts, plan = _mixture_plan(args, config)
        labels = config.labels
    layout = layouts[0]
    step = args.step
    ranks = range(plan.world_size) if args.rank is None else [args.rank]
    micro_steps = range(plan.num_micro_steps(step)) if args.micro_step is None else [args.micro_step]
    data = f" (data step {plan.data_step(step)})" if plan.data_step(step) != step else ""
    if labels is None:
        where_from = f"epoch {plan.epoch(step)}"
        per_epoch = f"{layout.num_samples} samples per epoch"
    else:
        weights = plan.stream.weights_at(plan.consumed(step))
        where_from = f"mixture of {len(labels)} sources, weights {_fmt_weights(weights)}"
        per_epoch = "samples per epoch " + ", ".join(f"{n}: {lay.num_samples}" for n, lay in zip(labels, layouts))
    print(
        f"step {step}{data}: {where_from}, global batch {plan.batch_size(step)} samples at positions "
        f"[{plan.consumed(step)}, {plan.consumed(step) + plan.batch_size(step)}), {plan.num_micro_steps(step)} micro step(s) "
        f"x {plan.world_size} rank(s) x {plan.micro_batch_size}; layout {layout.config.kind} seq_len={layout.config.seq_len}, "
        f"{per_epoch}"
    )
    for a in micro_steps:
        for r in ranks:
            loc = locate(plan, layouts if labels is not None else layout, step, rank=r, micro_step=a)
            print(f"rank {r} micro step {a}:")
            for i in range(len(loc.sample_ids)):
                spans = loc.spans.sample(i)
                ntok = sum(e - s for _, s, e in spans)
                k = 0 if loc.sources is None else int(loc.sources[i])
                source = "" if labels is None else f"source {labels[k]}  source sample {int(loc.source_sample_ids[i])}  "
                epoch = "epoch" if labels is None else "source epoch"
                print(f"  position {int(loc.positions[i])}  sample {int(loc.sample_ids[i])}  {source}{epoch} "
                      f"{int(loc.epochs[i])}  {ntok} positions in {len(spans)} span(s)")
                src = prepared[k]
                has_path = "path" in src.dataset.column_names
                for doc, s, e in spans:
                    n = int(src.index.lengths[doc])
                    where = f"doc {doc}" + (f" ({src.dataset[int(doc)]['path']})" if has_path else "")
                    eos = " + EOS" if e > n else ""
                    print(f"    {where}  tokens [{s}, {min(e, n)}) of {n}{eos}")
                    if args.decode:
                        print(f"      {_span_text(src, doc, s, e, args.max_chars)}")
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


def verify_mixture_plan(plan: Plan, start: int, stop: int, chunk: int = 1 << 16) -> dict:
    """:func:`verify_plan` for a plan over a mixture: the same checks, per source and per source epoch (each source's
    positions ``p_k`` of the range must be exactly ``[served_k(first), served_k(last))``)."""
    mixture = plan.stream
    first, last = plan.consumed(start), plan.consumed(stop)
    position_problems = []
    for step in range(start, stop):
        parts = [plan.micro_batch_positions(step, a, r) for a in range(plan.num_micro_steps(step)) for r in range(plan.world_size)]
        if not np.array_equal(np.sort(np.concatenate(parts)), plan.step_positions(step)):
            position_problems.append(step)
    # the positions of training steps [start, stop): the data steps they read, without the skipped ones
    spans = []
    for step in range(start, stop):
        lo = plan.consumed(step)
        if spans and spans[-1][1] == lo:
            spans[-1][1] = lo + plan.batch_size(step)
        else:
            spans.append([lo, lo + plan.batch_size(step)])
    counts: dict[tuple[int, int], np.ndarray] = {}
    for lo, hi in spans:
        for c0 in range(lo, hi, chunk):
            look = mixture.lookup(np.arange(c0, min(hi, c0 + chunk), dtype=np.int64))
            for k in np.unique(look.source).tolist():
                mine = look.source == k
                for e in np.unique(look.source_epoch[mine]).tolist():
                    c = counts.setdefault((k, e), np.zeros(mixture.sizes[k], dtype=np.int64))
                    c += np.bincount(look.source_sample[mine & (look.source_epoch == e)], minlength=mixture.sizes[k])
    served_first, served_last = mixture.served(first), mixture.served(last)
    sources = []
    for k, n in enumerate(mixture.sizes):
        rows = []
        for (kk, e), c in sorted(counts.items()):
            if kk != k:
                continue
            lo, hi = max(int(served_first[k]), e * n), min(int(served_last[k]), (e + 1) * n)
            complete = lo == e * n and hi == (e + 1) * n and not spans[1:]
            seen = int((c > 0).sum())
            rows.append({"epoch": e, "positions": int(c.sum()), "distinct_samples": seen,
                         "duplicates": int((c[c > 1] - 1).sum()), "gaps": (n - seen) if complete else None,
                         "coverage": seen / n, "complete": complete})
        sources.append({"source": k, "num_samples": n, "served": [int(served_first[k]), int(served_last[k])], "epochs": rows})
    ok = not position_problems and all(r["duplicates"] == 0 and not r["gaps"] for src in sources for r in src["epochs"])
    return {"steps": [start, stop], "positions": [first, last], "ok": ok, "position_problems": position_problems,
            "sources": sources}


def cmd_verify(args: argparse.Namespace) -> int:
    config = _mixture_config(args)
    if config is not None:
        return _cmd_verify_mixture(args, config)
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


def _cmd_verify_mixture(args: argparse.Namespace, config: MixtureConfig) -> int:
    _, layouts, plan = _mixture_plan(args, config)
    a, b = args.steps
    report = verify_mixture_plan(plan, a, b)
    print(f"verify steps {a}..{b - 1}: {b - a} steps x {plan.world_size} rank(s), positions [{report['positions'][0]}, "
          f"{report['positions'][1]}), {layouts[0].config.kind} layouts, mixture of {len(layouts)} sources")
    if report["position_problems"]:
        print(f"  micro batches do not partition steps {report['position_problems'][:10]}")
    for name, src in zip(config.labels, report["sources"]):
        print(f"  source {name}: {src['num_samples']} samples per epoch, source positions [{src['served'][0]}, {src['served'][1]})")
        for r in src["epochs"]:
            gaps = "n/a (partial epoch)" if r["gaps"] is None else r["gaps"]
            print(f"    epoch {r['epoch']}: {r['positions']} positions, {r['distinct_samples']} distinct samples "
                  f"({100 * r['coverage']:.2f}% of the epoch), duplicates {r['duplicates']}, gaps {gaps}"
                  + (", complete" if r["complete"] else ""))
    print("OK: no duplicates, no gaps" if report["ok"] else "FAILED: duplicates or gaps found")
    return 0 if report["ok"] else 1


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


def _cmd_stats_mixture(args: argparse.Namespace, config: MixtureConfig) -> int:
    prepared, layouts, plan = _mixture_plan(args, config)
    out = mixture_stats(plan, config.labels, args.step)
    for row, p in zip(out["sources"], prepared):
        row.update({"documents": p.index.num_documents, "tokens_in_corpus": p.index.num_tokens})
    out["layout"] = {"kind": args.kind, "seq_len": args.seq_len}
    if args.json:
        print(json.dumps(out, indent=2, sort_keys=True))
        return 0
    header = f"{'source':<12} {'documents':>10} {'tokens':>12} {'samples/epoch':>14} {'padding':>8}"
    if args.step is not None:
        print(f"at step {args.step} (data step {out['data_step']}, position {out['position']}), weights "
              f"{', '.join(out['weights_at_step'])}; layout {args.kind} seq_len={args.seq_len}")
        header += f" {'samples':>10} {'epochs':>8} {'tokens used':>12} {'token share':>12} {'asked':>7}"
    print(header)
    for row in out["sources"]:
        line = (f"{row['name']:<12} {row['documents']:>10,} {row['tokens_in_corpus']:>12,} {row['samples_per_epoch']:>14,} "
                f"{100 * row['padding_fraction']:>7.2f}%")
        if args.step is not None:
            line += (f" {row['samples']:>10,} {row['epochs']:>8.3f} {row['tokens']:>12,} {100 * row['token_share']:>11.2f}% "
                     f"{100 * row['expected_share']:>6.2f}%" + ("  (upsampled)" if row["upsampled"] else ""))
        print(line)
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    config = _mixture_config(args)
    if config is not None:
        return _cmd_stats_mixture(args, config)
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
