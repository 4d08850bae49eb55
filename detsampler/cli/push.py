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
    if result.shard_urls:  # NOTE: the shards go beside URL (../shards/), not under it: say where
        print(
            f"pushed {len(result.shard_urls)} shard indexes to {_where(result.shard_urls)} (each sealed by its"
            " meta.json, every file checked against it as it was read), then the manifest, its layouts and build claims"
            f" ({result.manifest_objects} objects; the claims, listed by no record, as they are) to {result.url},"
            f" {seal} last: {result.objects} objects ({result.num_bytes:,} bytes){kept}"
        )
        return 0
    print(f"pushed {result.objects} objects ({result.num_bytes:,} bytes) to {result.url}, {seal} last{kept}")
    return 0


def _where(urls: tuple[str, ...]) -> str:
    """``PARENT/`` when every URL lies in one folder, else the URLs."""
    parents = {u.rsplit("/", 1)[0] for u in urls}
    return f"{parents.pop()}/" if len(parents) == 1 else ", ".join(urls)
