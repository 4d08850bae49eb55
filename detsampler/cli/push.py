"""``detsampler push DIR URL``: upload a built index and its persisted layouts to an object store
(:func:`detsampler.index.push.push_index`: objects first, seals last)."""

from __future__ import annotations

import argparse

from detsampler.index.push import push_index

__all__ = ["cmd_push"]


def cmd_push(args: argparse.Namespace) -> int:
    result = push_index(args.directory, args.url)
    kept = f"; {result.unchanged} sealed records were there already, identical" if result.unchanged else ""
    print(f"pushed {result.objects} objects ({result.num_bytes:,} bytes) to {result.url}, meta.json last{kept}")
    return 0
