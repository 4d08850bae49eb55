"""``detsampler build --shard I --num-shards N | --shard auto | --finalize | --sharded``: a sharded index's tasks."""

from __future__ import annotations

import argparse
import os

from detsampler.cli.report import fmt_int, print_json, print_rows, rel

__all__ = ["cmd_build_sharded"]


def _task(args: argparse.Namespace) -> tuple[int, int] | None:
    """(task, number of tasks) of ``--shard``/``--num-shards``; ``auto`` reads torchrun's ``RANK``/``WORLD_SIZE``."""
    if args.shard is None:
        return None
    if args.shard == "auto":
        if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
            raise ValueError("--shard auto reads $RANK and $WORLD_SIZE (set by torchrun); they are not set")
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    try:
        task = int(args.shard)
    except ValueError:
        raise ValueError(f"--shard must be an integer or 'auto', got {args.shard!r}") from None
    if args.num_shards is None or args.num_shards < 1:
        raise ValueError(f"--shard {task} needs --num-shards N >= 1, got {args.num_shards!r}")
    return task, args.num_shards


def _sources(args: argparse.Namespace) -> tuple[str | None, tuple[str, str] | None]:
    """(the text files' ``--data``, the pre-tokenized ``(KIND, PATH)`` of ``--data KIND:PATH`` or ``--from``)."""
    from detsampler.index.sources import is_source_spec, parse_source_spec

    data, source = args.data, tuple(args.source) if args.source is not None else None
    if is_source_spec(data):
        if source is not None:
            raise ValueError("give the pre-tokenized files once: --data KIND:PATH or --from KIND PATH")
        data, source = None, parse_source_spec(data)
    if data is None and source is None:
        raise ValueError(
            "a sharded build needs --data (a directory of input files, one shard each, or KIND:PATH of pre-tokenized "
            "files) and/or --from KIND PATH"
        )
    if data is not None and args.tokenizer is None:
        raise ValueError("tokenizing --data into shards needs --tokenizer")
    if data is not None and source is not None and args.add_eos is None:  # refused before anything is built
        raise ValueError(
            "text shards read a virtual EOS by default and pre-tokenized files their stored one, and a sharded index "
            "reads one or the other: pass --add-eos real (the text shards store an EOS, as Megatron-style files do) "
            "or --add-eos virtual (the pre-tokenized documents hold no EOS)"
        )
    return data, source


def cmd_build_sharded(args: argparse.Namespace) -> int:
    """Build this task's shards (and, with ``--finalize`` or ``--sharded``, the manifest); print what was done.
    Pre-tokenized files (``--data KIND:PATH`` or ``--from KIND PATH``, alone or after the text files of ``--data``) are
    shards as they are: nothing is built for them."""
    from detsampler.index.format import default_cache_dir

    if getattr(args, "loss_policy", None) is not None:  # NOTE: a shard would store no mask and train on every token
        raise ValueError(
            "--loss-policy (chat data) is not supported by a sharded build (--shard, --finalize, --sharded): build one"
            " index (detsampler build without them)"
        )
    from detsampler.index.shards import (
        build_shards,
        build_shards_ray,
        complete,
        input_files,
        shard_tasks,
        sharded_root,
        source_files,
    )
    from detsampler.text.load import load_tokenizer
    from detsampler.text.policy import SpecialTokens

    data, source = _sources(args)
    files = input_files(data) if data is not None else []
    sources = [(source[0], p) for p in source_files(*source)] if source is not None else []
    if source is not None and args.tokenizer is None:
        from detsampler.index.sources import no_tokenizer

        raise no_tokenizer(*source)
    tokenizer = load_tokenizer(args.tokenizer) if args.tokenizer is not None else None
    policy = SpecialTokens(add_bos=args.add_bos, add_eos=args.add_eos or "virtual")
    cache = args.cache_dir if args.cache_dir is not None else default_cache_dir()
    if "://" in str(cache):  # NOTE: else a local directory named "s3:" would be created and built into
        raise ValueError(
            f"--cache-dir {str(cache)!r}: a sharded build writes to a local or shared directory; build it there, then"
            " upload it with `detsampler push DIR URL` (its shards, then its manifest)"
        )
    root = sharded_root(cache, files, tokenizer, args.text_column, args.store_tokens, policy, sources)
    task = _task(args)
    todo = shard_tasks(len(files), *task) if task else (list(range(len(files))) if args.sharded else [])
    if todo and args.engine == "ray":
        try:
            build_shards_ray(files, tokenizer, root, todo, args.text_column, args.num_proc, args.store_tokens, policy)
        except Exception as exc:  # a task's failure: report the task's own error, not Ray's coloured remote traceback
            cause = getattr(exc, "cause", None)
            if type(exc).__name__.startswith("RayTaskError") and isinstance(cause, Exception):
                raise cause from None
            raise
    elif todo:
        build_shards(files, tokenizer, root, todo, args.text_column, args.num_proc, args.store_tokens, True, policy)
        print_rows([("sharded index", rel(str(root))), ("shards built", f"{todo} of {len(files)}")])
    elif task and not files:
        print_rows([("sharded index", rel(str(root))), ("shards built", "none: pre-tokenized files are not built")])
    report: dict = {"path": str(root), "num_files": len(files), "shards_built": todo, "manifest": None}
    # the last task to finish writes the manifest (no separate, serial --finalize step is needed; it only checks)
    if args.finalize or args.sharded or (todo and complete(root, len(files))):
        report.update(_finalize(args, root, files, sources, tokenizer))
    if args.json:
        print_json(report, indent=2, sort_keys=True)
    return 0


def _finalize(args: argparse.Namespace, root, files: list, sources: list, tokenizer) -> dict:
    """Write the manifest (text shards, then the pre-tokenized files) and print the index (and its layout); returns
    ``{"manifest": the index's summary, "layout": its path and samples (with --layout)}`` for ``--json``."""
    from detsampler.index.shards import finalize, source_entries

    entries = []
    if sources:
        options = {"tokenizer": tokenizer, "eos": "virtual" if args.add_eos == "virtual" else "real"}
        for kind in dict.fromkeys(k for k, _ in sources):
            entries += source_entries(root, kind, [p for k, p in sources if k == kind], **options)
    index = finalize(root, files, tokenizer, entries)
    print_rows(
        [
            ("sharded index", rel(str(root))),
            (
                "shards",
                f"{len(index.shards)}" + (f" ({len(files)} tokenized, {len(entries)} pre-tokenized)" * bool(entries)),
            ),
            ("documents", fmt_int(index.num_documents)),
            ("tokens", fmt_int(index.num_tokens)),
            ("fingerprint", index.fingerprint),
        ]
    )
    done: dict = {"manifest": index.summary()}
    if args.layout:
        from detsampler.cli.inputs import show_progress
        from detsampler.cli.options import layout_config

        layout = index.layout(layout_config(args), num_proc=args.num_proc, progress=show_progress())
        print_rows([("layout", rel(str(layout.path))), ("samples", fmt_int(layout.num_samples))])
        done["layout"] = {"path": str(layout.path), "num_samples": int(layout.num_samples)}
    return done
