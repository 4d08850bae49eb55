"""Rewriting an object with a few byte ranges changed, and a conditional PUT: what an erasure of stored tokens needs
(:mod:`detsampler.index.erase`), beside :mod:`detsampler.storage.store`'s surface.

Invariants: :func:`patch_object` leaves every byte outside ``patches`` as it was and the size unchanged; a local
file is patched in place (``fsync`` before it returns: a crash leaves some patches written, which the caller's journal
finishes), an object is written again whole, streamed block by block from its own ranged reads (memory: one block),
and becomes visible only once the upload completes. :func:`put_if_unchanged` replaces an object only while its ETag is
the one read before (S3's ``If-Match``), else raises :class:`ConflictError`: a concurrent writer is never overwritten.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path

from detsampler.atomic import atomic_write
from detsampler.storage.store import LocalStore, StorageError, _obstore, store_for
from detsampler.storage.urls import parse_location

__all__ = ["ConflictError", "e_tag_of", "patch_object", "put_if_unchanged"]

_BLOCK_BYTES = 8 << 20


class ConflictError(StorageError):
    """An object changed between the read and a conditional write of it (another writer)."""


def _patched_blocks(url: str, size: int, patches: Mapping[int, bytes], block_bytes: int) -> Iterator[bytes]:
    """The object's bytes, ``block_bytes`` at a time, with each ``patches[offset]`` written over ``offset``."""
    store = store_for(url)
    ordered = sorted(patches.items())
    for start in range(0, size, block_bytes):
        stop = min(start + block_bytes, size)
        block = bytearray(store.read_ranges(url, [(start, stop)])[0])
        for offset, data in ordered:
            lo, hi = max(offset, start), min(offset + len(data), stop)
            if lo < hi:
                block[lo - start : hi - start] = data[lo - offset : hi - offset]
        yield bytes(block)


def patch_object(url: str, size: int, patches: Mapping[int, bytes], block_bytes: int = _BLOCK_BYTES) -> None:
    """Write each ``patches[offset]`` (bytes) over the object or file at ``url`` (``size`` bytes), nothing else."""
    if any(offset < 0 or offset + len(data) > size for offset, data in patches.items()):
        raise ValueError(f"{url}: a patch reaches outside its {size} bytes")
    store = store_for(url)
    if isinstance(store, LocalStore):
        with open(Path(url), "r+b") as f:
            for offset, data in sorted(patches.items()):
                f.seek(offset)
                f.write(data)
            f.flush()
            os.fsync(f.fileno())
        return
    loc = parse_location(url)
    try:
        # NOTE: a writer fed block by block (a multipart upload past its buffer): obstore's put cannot pull from a
        # generator that itself reads the store (one runtime inside another)
        with _obstore().open_writer(store._client(loc), loc.key, buffer_size=block_bytes) as writer:
            for block in _patched_blocks(url, size, patches, block_bytes):
                writer.write(block)
    except StorageError:
        raise
    except Exception as exc:
        raise store._fail(url, "PUT (rewritten)", exc) from None


def put_if_unchanged(url: str, data: bytes, e_tag: str | None) -> None:
    """Replace the object at ``url`` with ``data`` only while its ETag is ``e_tag`` (read with its content); a local
    file is written atomically (its writers hold the index's lock)."""
    store = store_for(url)
    if isinstance(store, LocalStore):
        atomic_write(Path(url), data)
        return
    loc = parse_location(url)
    try:
        mode = {"e_tag": e_tag} if e_tag else "overwrite"
        _obstore().put(store._client(loc), loc.key, data, mode=mode)
    except Exception as exc:
        if type(exc).__name__ == "PreconditionError":
            raise ConflictError(
                f"{url}: changed since it was read (another writer: a push or an erasure of the same index); nothing"
                " was replaced: run the command again"
            ) from None
        raise store._fail(url, "conditional PUT", exc) from None


def e_tag_of(url: str) -> str | None:
    """The object's ETag (None for a local file)."""
    store = store_for(url)
    return None if isinstance(store, LocalStore) else store.version(url)[1]
