"""``detsampler push DIR URL``: upload a built index and its persisted layouts to an object store
(:func:`detsampler.index.push.push`: objects first, seals last; a sharded index: its shards, then its manifest)."""

from __future__ import annotations

import argparse
from pathlib import Path

from detsampler.checks import check_local_path
from detsampler.index.push import push
from detsampler.index.sharded import MANIFEST

__all__ = ["cmd_push"]


def cmd_push(args: argparse.Namespace) -> int:
    result = push(args.directory, args.url)
    seal = "manifest.json" if (Path(check_local_path(args.directory, "push")) / MANIFEST).is_file() else "meta.json"
    kept = f"; {result.unchanged} sealed records were there already, identical" if result.unchanged else ""
    if not result.exclusive:
        kept += (
            "; the store does not enforce create-only writes: the claim, the objects' ETags and the seal were read"
            " back, so a concurrent push to this prefix is detected, not excluded"
        )
    print(f"pushed {result.objects} objects ({result.num_bytes:,} bytes) to {result.url}, {seal} last{kept}")
    return 0
