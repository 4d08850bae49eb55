"""``detsampler where``: which steps, micro steps, ranks and rows read a document (``--doc ID``, ``--path FILE``,
``--sha256 HEX``, the sha256 of its text or chat row, or ``--id-column C --id X``, the row whose column C holds X),
with the token span each read: the reverse of ``show``, computed by :func:`detsampler.where.where` without a scan.

Invariant: every line printed is a (step, rank, micro step) that ``detsampler show`` prints the document for, with the
same span (tests/test_where.py proves the library call equal to a scan of ``locate``).
"""

from __future__ import annotations

import argparse
from typing import Any

from detsampler.cli.checkpoint import open_audit
from detsampler.cli.inputs import mixture_plan, prepare
from detsampler.cli.options import is_media, layout_for, mixture_config, plan_from_args
from detsampler.cli.report import image_line, print_json

__all__ = ["cmd_where"]


def _paths(dataset: Any) -> list[str] | None:
    if dataset is None or "path" not in dataset.column_names:
        return None
    return [str(p) for p in dataset["path"]]


def _by_content_hash(args: argparse.Namespace, prepared: Any) -> int:
    """The document whose content has the sha256 ``--sha256`` (:mod:`detsampler.content`: a text's, or a chat row's
    canonical JSON)."""
    from detsampler.content import content_columns, documents_by_content

    index = prepared.index
    if is_media(index):  # its build recorded each document's content hash (text or messages, images' sha256s)
        found = index.documents_by_content([args.sha256])
        if len(found) > 1:
            raise ValueError(f"--sha256 names {len(found)} documents with equal content ({found[:10]}): give --doc ID")
        return found[0]
    column = getattr(index, "text_column", None) or args.text_column
    dataset = prepared.dataset
    if dataset is None:
        raise ValueError(
            "--sha256 needs the corpus's text (its text column): pass --data with the corpus the index was built from"
        )
    columns = content_columns(column, getattr(index, "chat", None))
    found = documents_by_content(dataset, [args.sha256], columns)
    if len(found) > 1:
        equal = "text" if isinstance(columns, str) else "rows"
        raise ValueError(f"--sha256 names {len(found)} documents with equal {equal} ({found[:10]}): give --doc ID")
    return found[0]


def _by_id(args: argparse.Namespace, prepared: Any) -> int:
    """The document whose ``--id-column`` value is ``--id`` (:func:`detsampler.content.documents_by_id`)."""
    from detsampler.content import documents_by_id

    if prepared.dataset is None:
        raise ValueError(
            f"--id needs the corpus's column {args.id_column!r}: pass --data with the corpus the index was built from"
        )
    found = documents_by_id(prepared.dataset, args.id_column, [args.id])
    if len(found) > 1:
        raise ValueError(
            f"--id {args.id!r} names {len(found)} documents ({found[:10]}) in column {args.id_column!r}: give --doc ID"
        )
    return found[0]


def _document(args: argparse.Namespace, prepared: Any) -> int:
    """``--doc``, the document whose text has the sha256 ``--sha256``, the one whose ``--id-column`` holds ``--id``,
    or the document whose ``path`` is ``--path`` (exactly, else the one path ending with it)."""
    if args.doc is not None:
        return args.doc
    if args.sha256 is not None:
        return _by_content_hash(args, prepared)
    if args.id is not None:
        return _by_id(args, prepared)
    paths = _paths(prepared.dataset)
    if paths is None:
        raise ValueError("--path needs a corpus whose documents are files (a path column): pass --doc ID instead")
    exact = [i for i, p in enumerate(paths) if p == args.path]
    found = exact or [i for i, p in enumerate(paths) if p.endswith("/" + args.path.lstrip("/"))]
    if len(found) != 1:
        raise ValueError(
            f"--path {args.path!r} names {'no document' if not found else f'{len(found)} documents'} of the corpus"
            + ("" if not found else f" ({', '.join(paths[i] for i in found[:3])}): give more of the path")
        )
    return found[0]


def _source(args: argparse.Namespace, labels: Any) -> int | None:
    if labels is None:
        if args.source is not None:
            raise ValueError("--source is for a mixture (--mixture-data, or a checkpoint that trained on one)")
        return None
    if args.source is None:
        raise ValueError(f"the plan reads a mixture: name the document's source with --source ({', '.join(labels)})")
    if args.source in labels:
        return list(labels).index(args.source)
    if args.source.isdigit() and int(args.source) < len(labels):
        return int(args.source)
    raise ValueError(f"Got --source {args.source!r}, allowed sources are {', '.join(labels)} (or 0..{len(labels) - 1})")


def cmd_where(args: argparse.Namespace) -> int:
    """Print (or ``--json``) every read of the document by ``--steps A:B``."""
    from detsampler.where import document_samples, where

    if (args.id is None) != (args.id_column is None):
        raise ValueError(
            "--id needs --id-column (the dataset's column that holds the ids)"
            if args.id_column is None
            else "--id-column needs --id (the value that names the document)"
        )
    if sum(x is not None for x in (args.doc, args.path, args.sha256, args.id)) != 1:
        raise ValueError("where needs one of --doc ID, --path FILE, --sha256 HEX or --id-column C --id X")
    config = mixture_config(args) if args.checkpoint is None else None
    trained_to = None  # the checkpoint's step: reads from it on are the plan's, not trained by the checkpoint
    if args.checkpoint is not None:
        audit = open_audit(args, corpus=any(x is not None for x in (args.path, args.sha256, args.id)))
        prepared, layouts, plan, labels = audit.prepared, audit.layouts, audit.plan, audit.labels
        if args.steps is None and audit.record.step == 0:
            raise ValueError(f"checkpoint {audit.where} was saved at step 0: no step was trained; pass --steps A:B")
        steps = (0, audit.record.step) if args.steps is None else args.steps
        trained_to = audit.record.step
    else:
        if args.steps is None:
            raise ValueError("where needs --steps A:B (or --checkpoint PATH: every step it trained)")
        steps = args.steps
        if config is None:
            prepared = [prepare(args)]
            layouts = [layout_for(prepared[0].index, args)]
            plan = plan_from_args(
                args, layouts[0].num_samples, layout=layouts[0], documents=[prepared[0].index.num_documents]
            )
            labels = None
        else:
            prepared, layouts, plan = mixture_plan(args, config)
            labels = config.labels
    k = _source(args, labels)
    doc = _document(args, prepared[k or 0])
    layout = layouts[k or 0]
    reads = where(plan, layouts if labels is not None else layout, doc, range(*steps), source=k)
    samples = document_samples(layout, doc)
    length = int(prepared[k or 0].index.lengths[doc])
    paths = _paths(prepared[k or 0].dataset)
    out = {
        "doc": doc,
        "path": paths[doc] if paths is not None else None,
        "source": None if labels is None else labels[k],
        "length": length,
        "layout": {"kind": layout.config.kind, "seq_len": layout.config.seq_len}
        | ({"epoch_order": True} if getattr(layout.config, "epoch_order", False) else {}),
        "samples": samples.sample_ids.tolist(),
        "steps": list(steps),
        "skip_steps": [list(r) for r in plan.skip_steps or ()],
        "reads": [r._asdict() for r in reads],
    }
    index = prepared[k or 0].index
    if is_media(index):
        out["images"] = index.document_images(doc)
    redacted_from = next((r.from_step for r in plan.redactions or () if doc in r.documents and r.source == k), None)
    if redacted_from is not None:  # its labels are masked at the reads from that step on (nothing else moves)
        out["redacted_from"] = redacted_from
    if trained_to is not None:
        out["checkpoint"] = {"step": trained_to}
    if args.json:
        print_json(out)
        return 0
    name = f"doc {doc}" + (f" ({out['path']})" if out["path"] else "")
    name += f" of source {out['source']}" if k is not None else ""
    held = ", ".join(map(str, out["samples"][:8])) + (" ..." if len(out["samples"]) > 8 else "")
    print(
        f"{name}: {length} tokens + EOS, in {len(out['samples'])} sample(s) of layout {layout.config.kind}"
        f" seq_len={layout.config.seq_len}"
        + (f" [{held}]" if held else " (none: it lies in the dropped tail)")
        + (" in epoch 0 (a new document order each epoch: its samples move)" if "epoch_order" in out["layout"] else "")
    )
    if "images" in out:
        print(f"its images: {len(out['images'])}")
        for im in out["images"]:
            print(f"  {image_line(im)}")
    skipped = " (reads by data steps in skip ranges left out)" if plan.skip_steps else ""
    if redacted_from is not None:
        skipped += f"; redacted from step {redacted_from} (labels masked there on)"
    if trained_to is not None and steps[1] > trained_to:
        after = sum(r.step >= trained_to for r in reads)
        skipped += (
            f"; {after} of them at steps {max(steps[0], trained_to)}..{steps[1] - 1}, after the checkpoint's step"
            f" {trained_to}: planned, not trained by it"
        )
    print(f"read {len(reads)} time(s) by steps {steps[0]}..{steps[1] - 1}{skipped}:")
    epoch, sample = ("source epoch", "source sample") if k is not None else ("epoch", "sample")
    for r in reads:
        eos = " + EOS" if r.stop > length else ""
        print(
            f"  step {r.step}  micro step {r.micro_step}  rank {r.rank}  row {r.row}: tokens [{r.start},"
            f" {min(r.stop, length)}){eos} at row offset {r.offset}  (position {r.position}, {sample} {r.sample_id},"
            f" {epoch} {r.epoch})"
            + ("  redacted" if redacted_from is not None and r.step >= redacted_from else "")
            + ("  after the checkpoint: not trained by it" if trained_to is not None and r.step >= trained_to else "")
        )
    return 0
