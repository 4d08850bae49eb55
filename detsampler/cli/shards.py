"""``detsampler build --shard I --num-shards N | --shard auto | --finalize | --sharded``: a sharded index's tasks."""

from __future__ import annotations

import argparse
import os

from detsampler.cli.report import fmt_int, print_rows, rel

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


def cmd_build_sharded(args: argparse.Namespace) -> int:
    """Build this task's shards (and, with ``--finalize`` or ``--sharded``, the manifest); print what was done."""
    from detsampler.index.format import default_cache_dir
    from detsampler.index.shards import build_shards, build_shards_ray, finalize, input_files, shard_tasks, sharded_root
    from detsampler.text.tokenizer import Tokenizer

    if args.data is None or args.tokenizer is None:
        raise ValueError("a sharded build needs --data (a directory of input files: one shard each) and --tokenizer")
    files = input_files(args.data)
    tokenizer = Tokenizer.load(args.tokenizer)
    cache = args.cache_dir if args.cache_dir is not None else default_cache_dir()
    root = sharded_root(cache, files, tokenizer, args.text_column, args.store_tokens)
    task = _task(args)
    todo = shard_tasks(len(files), *task) if task else (list(range(len(files))) if args.sharded else [])
    if todo and args.engine == "ray":
        build_shards_ray(files, tokenizer, root, todo, args.text_column, args.num_proc, args.store_tokens)
    elif todo:
        build_shards(files, tokenizer, root, todo, args.text_column, args.num_proc, args.store_tokens, progress=True)
        print_rows([("sharded index", rel(str(root))), ("shards built", f"{todo} of {len(files)}")])
    if args.finalize or args.sharded:
        index = finalize(root, files, tokenizer)
        print_rows(
            [
                ("sharded index", rel(str(root))),
                ("shards", len(index.shards)),
                ("documents", fmt_int(index.num_documents)),
                ("tokens", fmt_int(index.num_tokens)),
                ("fingerprint", index.fingerprint),
            ]
        )
        if args.layout:
            from detsampler.cli.options import layout_config

            layout = index.layout(layout_config(args), num_proc=args.num_proc, progress=True)
            print_rows([("layout", rel(str(layout.path))), ("samples", fmt_int(layout.num_samples))])
    return 0
