"""An index's arrays in an object store: each read by blocks (:mod:`detsampler.storage`), every block checked
against the array's chunk CRC-32s as it arrives.

Invariant: every byte of a remote array that a reader uses comes from a block whose chunks matched the recorded
``*.sums.npy`` in this process (:func:`block_check`; a block met in a shared cache that this array did not put there is
checked on first use, by :class:`~detsampler.storage.BlockedObject`); opening costs one request for the array's first
block with the object's size (:func:`first_block`).
"""

from __future__ import annotations

import hashlib
import logging
import zlib
from collections.abc import Callable
from pathlib import Path
from tokenize import TokenError

import numpy as np

from detsampler.index.format import CHUNK_BYTES, ChecksumError, TokenIndexError
from detsampler.storage import (
    DEFAULT_BLOCK_BYTES,
    BlockCache,
    BlockedObject,
    NodeCache,
    ObjectNotFoundError,
    RemoteArray,
    RemotePath,
    open_npy,
    store_for,
)

__all__ = ["block_check", "first_block", "handed_over", "handover", "open_remote", "read_in_full", "reblocked"]

logger = logging.getLogger("detsampler")

FULL_READ_BLOCKS = 16  # blocks fetched per request by a full read (16 MiB held at a time)
PROGRESS_BYTES = 1 << 30  # a full read logs its progress every this many bytes


def first_block(f: Path | RemotePath, cache: BlockCache | None = None) -> tuple[bytes | None, int | None]:
    """A local file: (None, its size or None); an object: its first block and its size in one request, or its size
    alone when ``cache`` holds that block already ((None, None) when it does not exist)."""
    if not isinstance(f, RemotePath):
        return None, (f.stat().st_size if f.is_file() else None)
    try:
        if cache is not None and cache.get((f.url, 0)) is not None:
            return None, store_for(f.url).size(f.url)
        return store_for(f.url).read_head(f.url, DEFAULT_BLOCK_BYTES)
    except ObjectNotFoundError:
        return None, None


def block_check(url: str, sums: np.ndarray, what: str, block_bytes: int) -> Callable[..., None]:
    """The check of a fetched block: the CRC-32 of each chunk it holds against ``sums`` (a ChecksumError naming the
    object, the chunk and its bytes; ``again=True``: the block failed when fetched a second time too, so the stored
    object itself is wrong, which the error says — a block corrupted in transit passes the second time)."""
    per_block = block_bytes // CHUNK_BYTES
    name = url.rsplit("/", 1)[-1]

    def check(block: int, data: bytes, again: bool = False) -> None:
        view = memoryview(data)
        for k in range(-(-len(data) // CHUNK_BYTES)):
            c, lo = block * per_block + k, k * CHUNK_BYTES
            got = zlib.crc32(view[lo : lo + CHUNK_BYTES])
            if c >= len(sums) or got != int(sums[c]):
                start, recorded = block * block_bytes + lo, f"{int(sums[c]):08x}" if c < len(sums) else "none"
                reads = " on both of two reads" if again else ""
                cause = (
                    "the stored object itself is wrong (edited or replaced after it was written), not a transfer error"
                    if again
                    else "the object was edited or replaced after it was written"
                )
                raise ChecksumError(
                    f"{what}: {name} chunk {c} (bytes {start}..{start + len(view[lo : lo + CHUNK_BYTES]) - 1}) fails"
                    f" its checksum{reads} (crc32 {got:08x}, recorded {recorded}): {cause}",
                    RemotePath(url),
                )

    return check


def open_remote(
    f: RemotePath,
    size: int,
    sums: np.ndarray,
    what: str,
    cache: BlockCache | None = None,
    head: bytes | None = None,
) -> RemoteArray:
    """The ``.npy`` object ``f`` read by blocks, each checked against ``sums`` as it arrives (``head``: its first
    block, fetched already)."""
    try:
        return open_npy(_checked_source(f.url, size, sums, what, cache, head))
    except (ValueError, EOFError, SyntaxError, TokenError) as exc:
        if isinstance(exc, ChecksumError):
            raise
        why = " ".join(str(exc).split())
        raise TokenIndexError(f"{what}: {f.name} is not a readable .npy object ({type(exc).__name__}: {why})") from None


def _checked_source(
    url: str, size: int, sums: np.ndarray, what: str, cache: BlockCache | None, head: bytes | None
) -> BlockedObject:
    """The object ``url`` read by blocks, each checked against ``sums`` (``head``: its block 0, checked as taken)."""
    identity = f"crc32:{hashlib.sha256(np.ascontiguousarray(sums).tobytes()).hexdigest()[:32]}:{size}"
    source = BlockedObject(url, size, check=block_check(url, sums, what, DEFAULT_BLOCK_BYTES), cache=cache,
                           identity=identity)  # fmt: skip
    if head is not None and size:
        source.seed(0, head)
    return source


def handover(array: RemoteArray) -> tuple:
    """What another process (a DataLoader worker) needs to read ``array`` without asking the store anything again:
    the object's URL and size, the array's dtype, length and data offset (its ``.npy`` header, parsed and checked
    here), and its block 0 when this process still holds it (else None). Arguments of :func:`handed_over` after
    ``sums, what``."""
    source = array.source
    head = source._recent.get(0) if source.block_bytes == DEFAULT_BLOCK_BYTES else None
    return source.url, source.size, array.dtype.str, len(array), array.offset, head


def handed_over(
    sums: np.ndarray, what: str, url: str, size: int, dtype: str, length: int, offset: int, head: bytes | None
) -> RemoteArray:
    """The array :func:`handover` described, in this process, with no request: read by blocks as the opener read it,
    each block (``head`` too, as it is taken) checked against ``sums``, the checksums the opener fetched and checked
    against its record; an object changed since is refused as its blocks are read."""
    return RemoteArray(_checked_source(url, size, sums, what, None, head), np.dtype(dtype), length, offset)


def reblocked(
    array: RemoteArray,
    sums: np.ndarray,
    what: str,
    block_bytes: int,
    cache: BlockCache | None,
    node: NodeCache | None = None,
) -> RemoteArray:
    """The same remote array read by blocks of ``block_bytes`` (a multiple of the chunk) through ``cache``, each block
    checked against ``sums`` as it arrives: what a prefetcher reads through (it fetches and caches at its own grain)."""
    check = block_check(array.source.url, sums, what, block_bytes)
    source = array.source.reblocked(block_bytes, cache, check, node)
    return RemoteArray(source, array.dtype, len(array), array.offset)


def read_in_full(array: RemoteArray, sums: np.ndarray, what: str) -> str:
    """Fetch every block of ``array``'s object anew (from the store: never from a cache), check each chunk against
    ``sums`` as it arrives (a ChecksumError names the first that fails) and return the sha256 of the whole object.

    The full check of an audit (``verify --tokens``): memory is :data:`FULL_READ_BLOCKS` blocks whatever the object's
    size (blocks are hashed and dropped, never kept, so no cache is filled); for an object of more than one block, one
    line is logged when it starts and one every :data:`PROGRESS_BYTES`."""
    url, size = array.source.url, array.source.size
    source = BlockedObject(url, size, check=block_check(url, sums, what, DEFAULT_BLOCK_BYTES), recent_blocks=1)
    if size > DEFAULT_BLOCK_BYTES:  # long work: say what is read (a small file is read in one request)
        logger.info("verify: reading %s in full (%s bytes)", url, f"{size:,}")
    h, done, logged = hashlib.sha256(), 0, 0
    for first in range(0, source.num_blocks, FULL_READ_BLOCKS):
        got = source.fetch(range(first, min(first + FULL_READ_BLOCKS, source.num_blocks)))
        for b in sorted(got):
            h.update(got[b])
            done += len(got[b])
        if done - logged >= PROGRESS_BYTES and done < size:
            logged = done
            logger.info("verify: %s: %s of %s bytes checked (%.0f%%)", url, f"{done:,}", f"{size:,}", 100 * done / size)
    return h.hexdigest()
