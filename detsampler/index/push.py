"""Uploading a built index (and the layouts persisted beside it) to an object store, with the on-disk atomicity.

Order: every data object (arrays, checksum files, fences) first, smallest first; each layout's sealed ``layout.json``
after its own objects; the index's sealed ``meta.json`` last of all. An index is found by its ``meta.json`` only, so a
reader never sees a half-uploaded index: an upload killed at any moment leaves objects that nothing opens, and pushing
again completes it. A destination that already holds a different sealed record (another index under the same name) is
refused before anything is written: objects of two indexes are never mixed under one seal.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from detsampler.index.format import TokenIndexError
from detsampler.index.reader import TokenIndex
from detsampler.storage import StorageError, join, parse_location, store_for

__all__ = ["PushResult", "push", "push_index", "push_sharded"]

SEALS = ("meta.json", "layout.json")
_LOCAL_ONLY = (".verified-", ".verify.lock", ".tmp", ".lock")


@dataclass(frozen=True)
class PushResult:
    """What a push did: objects and bytes uploaded, sealed records left as they were (already there, identical)."""

    url: str
    objects: int
    num_bytes: int
    unchanged: int


def _files(directory: Path) -> list[Path]:
    """The files to upload, relative to ``directory`` (lock files, markers and temporaries stay local)."""
    out = []
    for p in sorted(directory.rglob("*")):
        rel = p.relative_to(directory)
        if p.is_file() and not any(part.startswith(".") or part.endswith(_LOCAL_ONLY) for part in rel.parts):
            out.append(rel)
    return out


def _check_destination(url: str) -> None:
    if not parse_location(url).remote:
        raise ValueError(
            f"Got destination {url!r}: push uploads to an object store URL (s3://, gs://, az://, https://)"
        )


def _upload(root: Path, url: str, seal: str, max_workers: int) -> PushResult:
    """Every file under ``root`` to ``url``: data first (smallest first), then ``layout.json`` records, ``seal`` last;
    a destination holding different sealed records is refused before anything is written."""
    store = store_for(url)
    files = _files(root)
    seals = [f for f in files if f.name in (*SEALS, seal)]
    unchanged = 0
    for rel in seals:  # refuse a conflicting destination before writing anything
        dest = join(url, *rel.parts)
        if store.exists(dest):
            if store.read_ranges(dest, [(0, store.size(dest))])[0] != (root / rel).read_bytes():
                raise TokenIndexError(
                    f"{dest} already holds a different sealed record than {str(root / rel)!r}: another index was pushed"
                    " there; push to another prefix (or delete that one first)"
                )
            unchanged += 1
    data = sorted((f for f in files if f not in seals), key=lambda f: ((root / f).stat().st_size, str(f)))
    with ThreadPoolExecutor(max_workers) as pool:
        list(pool.map(lambda rel: store.put(join(url, *rel.parts), root / rel), data))
    for rel in [*sorted((f for f in seals if f != Path(seal)), key=str), Path(seal)]:
        store.put(join(url, *rel.parts), root / rel)
    if not store.exists(join(url, seal)):  # pragma: no cover - a store that lost a completed PUT
        raise StorageError(f"{join(url, seal)}: uploaded but not found")
    return PushResult(url, len(files), sum((root / f).stat().st_size for f in files), unchanged)


def push_index(directory: str | os.PathLike, url: str, *, max_workers: int = 8) -> PushResult:
    """Upload the index at ``directory`` (a built, sealed index directory) to ``url`` (see the module doc for the order
    and the atomicity). Returns what was uploaded."""
    root = Path(directory)
    if not (root / "meta.json").is_file():
        raise TokenIndexError(f"{str(root)!r} holds no index (no meta.json): build it first (`detsampler build`)")
    _check_destination(url)
    TokenIndex.open(root)  # the seal and every file's size and checksums: never upload a damaged index
    return _upload(root, url, "meta.json", max_workers)


def push_sharded(directory: str | os.PathLike, url: str, *, max_workers: int = 8) -> PushResult:
    """Upload the sharded index at ``directory``: each shard's index to the URL its manifest entry names relative to
    ``url`` (``../shards/index-KEY``: the same bucket), each sealed by its own ``meta.json``; then the layouts beside
    the manifest; ``manifest.json`` last. Pre-tokenized shards (files, not indexes) are refused: push uploads indexes
    only."""
    from detsampler.index.sharded import MANIFEST, TOKENIZED_KIND, ShardedIndex, shard_location
    from detsampler.storage import RemotePath

    root = Path(directory)
    _check_destination(url)
    index = ShardedIndex.open(root)
    entries = index.meta["shards"]
    foreign = [e["path"] for e in entries if e["kind"] != TOKENIZED_KIND]
    if foreign:
        raise TokenIndexError(
            f"sharded index {str(root)!r} has {len(foreign)} pre-tokenized shards (first {foreign[0]!r}): push uploads "
            "indexes only"
        )
    objects = num_bytes = unchanged = 0
    for entry in entries:
        dest = shard_location(RemotePath(url), entry["path"])
        done = push_index(shard_location(root, entry["path"]), str(dest), max_workers=max_workers)
        objects, num_bytes, unchanged = objects + done.objects, num_bytes + done.num_bytes, unchanged + done.unchanged
    done = _upload(root, url, MANIFEST, max_workers)
    return PushResult(url, objects + done.objects, num_bytes + done.num_bytes, unchanged + done.unchanged)


def push(directory: str | os.PathLike, url: str, *, max_workers: int = 8) -> PushResult:
    """:func:`push_sharded` for a directory holding a sharded index's manifest, else :func:`push_index`."""
    from detsampler.index.sharded import MANIFEST

    if (Path(directory) / MANIFEST).is_file():
        return push_sharded(directory, url, max_workers=max_workers)
    return push_index(directory, url, max_workers=max_workers)
