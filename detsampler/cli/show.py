"""``detsampler show``: which documents and token offsets each rank reads at a step (and micro step), optionally with
the decoded text — the tool for explaining a loss spike at step S.

Invariant: what is printed is what :func:`detsampler.locate.locate` computes for that (step, rank, micro step), the same
call the data loader's batches come from.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from detsampler.cli.checkpoint import open_audit
from detsampler.cli.inputs import mixture_plan, prepare
from detsampler.cli.options import is_media, layout_for, mixture_config, plan_from_args
from detsampler.cli.report import fmt_weights, image_line
from detsampler.hashing import sample_hash
from detsampler.layout import Layout
from detsampler.plan import Plan

if TYPE_CHECKING:
    from detsampler.index.prepare import Prepared

__all__ = ["cmd_show"]


def _rendered_chat(prepared: Prepared, doc: int) -> tuple[np.ndarray, np.ndarray]:
    """Chat document ``doc`` rendered on the fly (an index without stored tokens): its stored ids and loss mask."""
    from detsampler.text.chat import render_examples

    index, chat = prepared.index, prepared.index.chat
    rows = prepared.dataset.with_format(None).select_columns(list(chat.columns))[[int(doc)]]
    ids, masks = render_examples(prepared.tokenizer, rows, int(doc), chat, chat.chat_template)
    policy, tok = index.special_tokens, prepared.tokenizer
    return policy.apply(ids, tok.bos_id, tok.eos_id)[1], policy.apply(masks, 0, int(chat.eos_trained), np.uint8)[1]


def _span_mask(prepared: Prepared, doc: int, start: int, stop: int) -> np.ndarray | None:
    """The loss mask of positions ``[start, stop)`` of chat document ``doc`` (1: that token is trained); None for plain
    text."""
    index = prepared.index
    chat = getattr(index, "chat", None)
    if chat is None:
        return None
    n, eos_stored = int(index.lengths[doc]), index.eos_stored
    if index.loss_mask is not None:
        base = int(index.offsets[doc])
        values = np.asarray(index.loss_mask[base + start : base + min(stop, n + int(eos_stored))])
    else:
        values = _rendered_chat(prepared, doc)[1][start : min(stop, n + int(eos_stored))]
    if stop > n and not eos_stored:
        values = np.append(values, np.uint8(chat.eos_trained))
    return values


def _redacted_from(plan: Plan, step: int, doc: int, source: int | None) -> int | None:
    """The ``from_step`` of the redaction that masks document ``doc`` (of mixture source ``source``) at training step
    ``step``, or None: a redacted document's labels are all -100 there (:func:`detsampler.redaction.redaction_mask`)."""
    for r in plan.redactions or ():
        if r.from_step <= step and r.source == source and int(doc) in r.documents:
            return r.from_step
    return None


def _trained_ranges(mask: np.ndarray, start: int) -> str:
    """``[a, b), ...``: the runs of trained positions of ``mask`` (positions from ``start``)."""
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(np.int8), [0]])))
    runs = edges.reshape(-1, 2) + start
    return ", ".join(f"[{a}, {b})" for a, b in runs.tolist()) or "none"


def _decode(tokenizer: Any, ids: list[int], image_id: int | None) -> str:
    """``ids`` decoded; each run of an image's tokens (a media index's ``image_id``) written once with its length,
    ``<|image_pad|>x64``, not 64 times."""
    if not ids:
        return ""
    if image_id is None or image_id not in ids:
        return tokenizer.decode(ids)
    values = np.asarray(ids)
    edges = np.flatnonzero(np.diff(values == image_id)) + 1
    parts = []
    for run in np.split(values, edges):
        if run[0] == image_id:
            parts.append(f"{tokenizer.decode([image_id])}x{len(run)}")
        else:
            parts.append(tokenizer.decode(run.tolist()))
    return "".join(parts)


def _span_text(prepared: Prepared, doc: int, start: int, stop: int, max_chars: int) -> str:
    index = prepared.index
    n = int(index.lengths[doc])
    stop_tok = min(stop, n)
    if index.tokens is not None:
        ids = np.asarray(index.tokens[int(index.offsets[doc]) + start : int(index.offsets[doc]) + stop_tok]).tolist()
    elif getattr(index, "chat", None) is not None:
        ids = _rendered_chat(prepared, doc)[0][start:stop_tok].tolist()
    else:
        text = prepared.dataset[int(doc)][index.text_column]
        ids = prepared.tokenizer.encode_batch([text])[0][start:stop_tok]
    if prepared.tokenizer is None:  # a pre-tokenized source opened without --tokenizer: show the ids
        text = " ".join(map(str, ids[:64])) + (" ..." if len(ids) > 64 else "")
    else:
        text = _decode(prepared.tokenizer, ids, getattr(index, "image_token_id", None))
    if stop > n:
        text += "<EOS>"
    if max_chars and len(text) > max_chars:
        text = text[: max_chars // 2] + " [...] " + text[-(max_chars - max_chars // 2) :]
    return repr(text)


def _step_header(plan: Plan, layouts: Sequence[Layout], labels: Sequence[str] | None, step: int) -> str:
    """The step's line: its sample hash (the trainer's ``sample_hash`` of the step, as logged in metrics.jsonl), epoch
    or mixture weights, positions, the cut and the layout; a balanced plan's cost line below (:func:`_balance_line`)."""
    layout = layouts[0]
    hashed = sample_hash(plan.by_position(step, plan.global_batch(step)))
    data = f" (data step {plan.data_step(step)})" if plan.data_step(step) != step else ""
    if labels is None:
        where_from = f"epoch {plan.epoch(step)}"
        per_epoch = f"{layout.num_samples} samples per epoch"
    else:
        weights = plan.stream.weights_at(plan.consumed(step))
        where_from = f"mixture of {len(labels)} sources, weights {fmt_weights(weights)}"
        per_epoch = "samples per epoch " + ", ".join(f"{n}: {lay.num_samples}" for n, lay in zip(labels, layouts))
    header = (
        f"step {step}{data}: sample hash {hashed}, {where_from}, global batch {plan.batch_size(step)} samples at"
        " positions"
        f" [{plan.consumed(step)}, {plan.consumed(step) + plan.batch_size(step)}), {plan.num_micro_steps(step)} micro"
        f" step(s) x {plan.world_size} rank(s) x {plan.micro_batch_size}; layout {layout.config.kind}"
        f" seq_len={layout.config.seq_len}{_max_patches(layout)}, {per_epoch}"
    )
    if plan.balance is not None:  # the balanced plan's line: each rank's modeled cost
        header += "\n" + _balance_line(plan, step)
    return header


def _balance_line(plan: Plan, step: int) -> str:
    """The balanced plan's cost model and what it did to this step: each rank's modeled cost, max over mean, against
    the same samples in position order."""
    from detsampler.balance import sample_costs

    start = plan.consumed(step)
    costs = sample_costs(plan.balance, plan.stream, np.arange(start, start + plan.batch_size(step), dtype=np.int64))
    per_rank = lambda order: costs[order].reshape(-1, plan.world_size, plan.micro_batch_size).sum(axis=(0, 2))
    balanced, plain = per_rank(plan.slot_order(step)), per_rank(np.arange(len(costs)))
    c = plan.balance.cost
    return (
        f"balanced (LPT; cost = {c.attention!r} * sum(len^2) + {c.linear!r} * tokens + {c.fixed!r} per sample):"
        f" rank costs max/mean {balanced.max() / balanced.mean():.3f}, in position order"
        f" {plain.max() / plain.mean():.3f}"
    )


def _max_patches(layout: Layout) -> str:
    """`` max_patches=N`` for a media layout (its second axis), else nothing."""
    media = getattr(layout, "media_config", None)
    return "" if media is None else f" max_patches={media.max_patches}"


def _image_lines(index: Any, layout: Layout, sample_id: int) -> list[str]:
    """A media sample's images (:meth:`~detsampler.media.index.MediaIndex.sample_images`), after its spans."""
    (images,) = index.sample_images(layout, [sample_id])
    tokens, patches = sum(im["tokens"] for im in images), sum(im["patches"] for im in images)
    return [f"    images: {len(images)} ({tokens} tokens, {patches} patches)"] + [
        f"      {image_line(im)}" for im in images
    ]


def _micro_batch_lines(
    args: argparse.Namespace,
    plan: Plan,
    layouts: Sequence[Layout],
    labels: Sequence[str] | None,
    prepared: Sequence[Prepared],
    step: int,
    loc: Any,
    rank: int,
    micro_step: int,
) -> list[str]:
    """The lines of the micro batch ``loc`` (located at ``step``, ``rank``, ``micro_step``)."""
    lines = [f"rank {rank} micro step {micro_step}:"]
    for i in range(len(loc.sample_ids)):
        spans = loc.spans.sample(i)
        ntok = sum(e - s for _, s, e in spans)
        k = 0 if loc.sources is None else int(loc.sources[i])
        source = "" if labels is None else f"source {labels[k]}  source sample {int(loc.source_sample_ids[i])}  "
        epoch = "epoch" if labels is None else "source epoch"
        lines.append(
            f"  position {int(loc.positions[i])}  sample {int(loc.sample_ids[i])}  {source}{epoch} "
            f"{int(loc.epochs[i])}  {ntok} positions in {len(spans)} span(s)"
        )
        src = prepared[k]
        has_path = src.dataset is not None and "path" in src.dataset.column_names
        for doc, s, e in spans:
            n = int(src.index.lengths[doc])
            where = f"doc {doc}" + (f" ({src.dataset[int(doc)]['path']})" if has_path else "")
            eos = " + EOS" if e > n else ""
            from_step = _redacted_from(plan, step, doc, None if labels is None else k)
            erased = doc in getattr(src.index, "erased_documents", ())
            mark = "" if from_step is None else f"  redacted from step {from_step}"
            if erased:
                mark += "  erased (its stored tokens are the pad id, its labels masked)"
            lines.append(f"    {where}  tokens [{s}, {min(e, n)}) of {n}{eos}{mark}")
            mask = _span_mask(src, doc, s, e)
            if mask is not None and (from_step is not None or erased):  # every label whose input is the document's
                why = "redacted" if from_step is not None else "erased"
                lines.append(f"      trained 0 of {mask.size} tokens: none (its labels are masked: {why})")
            elif mask is not None:
                lines.append(f"      trained {int(mask.sum())} of {mask.size} tokens: {_trained_ranges(mask, s)}")
            if args.decode:
                lines.append(f"      {_span_text(src, doc, s, e, args.max_chars)}")
        if is_media(src.index):
            sample_id = loc.source_sample_ids[i] if loc.sources is not None else loc.sample_ids[i]
            lines += _image_lines(src.index, layouts[k], int(sample_id))
    return lines


def _from_checkpoint(
    args: argparse.Namespace,
) -> tuple[list, list[Layout], Plan, Sequence[str] | None, int, str]:
    """What ``--checkpoint`` records, reopened; the step: ``--step``, else the checkpoint's last trained step; and the
    checkpoint's line."""
    audit = open_audit(args, corpus=True, decode=args.decode)
    record = audit.record
    if args.step is None and record.step == 0:
        raise ValueError(f"checkpoint {audit.where} was saved at step 0: no step was trained; pass --step")
    step = record.step - 1 if args.step is None else args.step
    line = (
        f"checkpoint {audit.where}: saved at step {record.step}"
        + (f" (+{record.samples_in_step} samples)" if record.samples_in_step else "")
        + (f" by {record.framework}" if record.framework else "")
        + f", data fingerprint {record.fingerprint.hash} (checked against the reopened index"
        + ("es" if len(audit.prepared) > 1 else "")
        + ")"
        + ("" if args.step is not None else f"; showing its last trained step {step}")
    )
    return audit.prepared, audit.layouts, audit.plan, audit.labels, step, line


def cmd_show(args: argparse.Namespace) -> int:
    """Print the step's header, then each selected (micro step, rank)'s samples, spans and optionally their text.
    Every micro batch is located (and every option checked) before anything is printed: a refused ``--rank`` or
    ``--micro-step`` printed the headers first."""
    from detsampler.locate import locate

    config = mixture_config(args) if args.checkpoint is None else None
    lines = []
    if args.checkpoint is not None:
        prepared, layouts, plan, labels, step, line = _from_checkpoint(args)
        lines.append(line)
    elif args.step is None:
        raise ValueError("show needs --step S (or --checkpoint PATH, which shows the checkpoint's last trained step)")
    elif config is None:
        prepared = [prepare(args)]
        layouts = [layout_for(prepared[0].index, args)]
        plan = plan_from_args(
            args, layouts[0].num_samples, layout=layouts[0], documents=[prepared[0].index.num_documents]
        )
        labels = None
    else:
        prepared, layouts, plan = mixture_plan(args, config)
        labels = config.labels
    if args.checkpoint is None:
        step = args.step
    ranks = range(plan.world_size) if args.rank is None else [args.rank]
    micro_steps = range(plan.num_micro_steps(step)) if args.micro_step is None else [args.micro_step]
    layout = layouts if labels is not None else layouts[0]
    located = [(a, r, locate(plan, layout, step, rank=r, micro_step=a)) for a in micro_steps for r in ranks]
    lines.append(_step_header(plan, layouts, labels, step))
    for a, r, loc in located:
        lines += _micro_batch_lines(args, plan, layouts, labels, prepared, step, loc, r, a)
    print("\n".join(lines))
    return 0
