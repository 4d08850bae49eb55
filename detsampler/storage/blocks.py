"""One remote object read by fixed-size blocks: the unit that is fetched, checked, cached and evicted.

Block ``b`` of an object is its bytes ``[b * block_bytes, (b + 1) * block_bytes)`` (the last block may be shorter);
``block_bytes`` is a multiple of the index's 64 KiB checksum chunk, so a block holds whole chunks and is checked once,
when it arrives, by the ``check`` its owner gives (the chunk CRC-32s: :mod:`detsampler.index.checksums`). A block that
fails its check as it arrives is fetched again, once: bytes corrupted in transit pass the second time (the block is
used, and a warning says it was recovered); a stored object that is itself wrong fails again, and ``check`` (told
``again=True``) raises its error.

Invariants: every byte :meth:`BlockedObject.read` returns comes from a block that passed ``check`` in this process (a
block met in a shared :class:`BlockCache` that this object did not put there is checked on first use); without a
cache, at most ``recent_blocks`` blocks are kept (the most recently used), so memory is bounded whatever the object's
size or the number of reads; all blocks one read lacks are fetched in one :meth:`RangeReader.read_ranges` call, each
run of adjacent blocks as one range (the store runs the ranges in parallel, and is asked not to merge ranges that are
not adjacent: no byte between them is fetched). The object is safe to read from several threads (a prefetcher's and the
reader's): its bookkeeping is under a lock, made anew in a forked child (a parent's thread may hold the parent's).
"""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Protocol, runtime_checkable

import numpy as np

from detsampler.storage.store import RangeReader, store_for

__all__ = ["DEFAULT_BLOCK_BYTES", "RECENT_BLOCKS", "BlockCache", "BlockKey", "BlockedObject"]

log = logging.getLogger("detsampler.storage")
BlockKey = tuple[str, int]  # (object url, block number)
DEFAULT_BLOCK_BYTES = 1 << 20  # 16 checksum chunks: a ranged GET's latency dominates below ~1 MiB on S3
RECENT_BLOCKS = 8  # without a cache: the blocks kept (8 MiB per array): a batch reads an array in one or two calls
_CHUNK_BYTES = 1 << 16  # detsampler.index.checksums.CHUNK_BYTES (that module is above this one)


@runtime_checkable
class BlockCache(Protocol):
    """A bounded store of fetched blocks (an LRU, or the exact lookahead's Belady cache), shared by many objects."""

    def get(self, key: BlockKey) -> bytes | None: ...

    def put(self, key: BlockKey, data: bytes) -> None: ...


class BlockedObject:
    """The bytes of the object ``url`` (``size`` bytes), fetched by blocks (see the module invariants).

    ``check(block, data, again=False)`` raises a ``ValueError`` when ``data`` is not block ``block``'s bytes
    (``again``: the block was fetched a second time and failed again). ``fetched_bytes`` and ``requests`` count what
    this object fetched (for logs and the benchmark); ``refetched`` the blocks fetched again after a failed check."""

    def __init__(
        self,
        url: str,
        size: int,
        *,
        block_bytes: int = DEFAULT_BLOCK_BYTES,
        check: Callable[..., None] | None = None,
        cache: BlockCache | None = None,
        reader: RangeReader | None = None,
        recent_blocks: int = RECENT_BLOCKS,
    ) -> None:
        if block_bytes <= 0 or block_bytes % _CHUNK_BYTES:
            raise ValueError(f"Got block_bytes={block_bytes}, it must be a positive multiple of {_CHUNK_BYTES}")
        if recent_blocks < 1:
            raise ValueError(f"Got recent_blocks={recent_blocks}, it must be >= 1")
        self.url, self.size, self.block_bytes = url, int(size), int(block_bytes)
        self.num_blocks = -(-self.size // self.block_bytes)
        self._check, self._cache = check, cache
        self._reader = reader if reader is not None else store_for(url)
        self._recent: OrderedDict[int, bytes] = OrderedDict()
        self._recent_cap = recent_blocks
        self._from_cache_ok = np.zeros(self.num_blocks, dtype=bool)  # 1 byte per block: bounded by the object
        self._lock_pid, self._lock_obj = -1, threading.Lock()
        self._held: dict[int, bytes] = {}  # blocks one read of many pieces holds (hold), served before the cache
        self.fetched_bytes = 0
        self.requests = 0
        self.refetched = 0

    @property
    def _lock(self) -> threading.Lock:
        # NOTE: a forked DataLoader worker inherits the parent's lock in whatever state a parent thread left it
        if self._lock_pid != os.getpid():
            self._lock_pid, self._lock_obj = os.getpid(), threading.Lock()
        return self._lock_obj

    def seed(self, block: int, data: bytes) -> None:
        """Take ``block``'s bytes fetched by the caller (e.g. with the object's size, in one request): checked, then
        kept as if this object had fetched them."""
        if len(data) != self.block_range(block)[1] - self.block_range(block)[0]:
            raise ValueError(f"{self.url}: block {block} is {len(data)} bytes, not {self.block_range(block)}")
        with self._lock:
            self.fetched_bytes += len(data)
        data = self._checked({block: data})[block]
        with self._lock:
            self._keep(block, data)

    def block_range(self, block: int) -> tuple[int, int]:
        """The byte range ``[start, end)`` of ``block``."""
        return block * self.block_bytes, min((block + 1) * self.block_bytes, self.size)

    def blocks(self, numbers: Iterable[int]) -> dict[int, bytes]:
        """Blocks ``numbers`` (each in ``[0, num_blocks)``), the missing ones fetched in one ranged read."""
        want = sorted(set(numbers))
        if want and (want[0] < 0 or want[-1] >= self.num_blocks):
            bad = want[0] if want[0] < 0 else want[-1]
            raise IndexError(f"{self.url}: Got block {bad}, allowed blocks are in [0, {self.num_blocks})")
        out: dict[int, bytes] = {}
        missing: list[int] = []
        with self._lock:
            for b in want:
                data = self._lookup(b)
                if data is None:
                    missing.append(b)
                else:
                    out[b] = data
        if self._cache is not None:  # a block another reader put in the shared cache is checked on first use
            for b in [b for b in out if not self._from_cache_ok[b]]:
                self._check_block(b, out[b])
        if missing:
            out.update(self.fetch(missing))
        return out

    def hold(self, numbers: Iterable[int]) -> None:
        """Get blocks ``numbers`` now (once each: from the cache, else fetched) and serve them from this object until
        :meth:`release`: a read of many pieces (a micro batch's spans) then asks the cache once per block."""
        got = self.blocks(numbers)
        with self._lock:
            self._held = got

    def release(self) -> None:
        with self._lock:
            self._held = {}

    def fetch(self, numbers: Iterable[int]) -> dict[int, bytes]:
        """Fetch blocks ``numbers`` now (whatever is kept), in one :meth:`RangeReader.read_ranges` call, each run of
        adjacent blocks as one range; check each, keep it (in the cache when there is one, else among the recent
        blocks) and return them. A prefetcher calls this ahead of the read that will want them."""
        want = sorted(set(numbers))
        if not want:
            return {}
        out = self._checked(self._read(want))
        with self._lock:
            for block, data in out.items():
                self._keep(block, data)
        return out

    def _read(self, want: list[int]) -> dict[int, bytes]:
        """Blocks ``want`` (sorted, distinct) as the store returns them, in one ranged read, unchecked."""
        runs = _runs(want)
        ranges = [(self.block_range(a)[0], self.block_range(b)[1]) for a, b in runs]
        got = self._reader.read_ranges(self.url, ranges, coalesce_bytes=0)
        out: dict[int, bytes] = {}
        for (a, b), data in zip(runs, got):
            view, base = memoryview(data), self.block_range(a)[0]
            for block in range(a, b + 1):
                lo, hi = self.block_range(block)
                out[block] = bytes(view[lo - base : hi - base]) if a != b else bytes(data)
        with self._lock:
            self.requests += 1
            self.fetched_bytes += sum(len(d) for d in out.values())
        return out

    def _checked(self, got: dict[int, bytes]) -> dict[int, bytes]:
        """``got``, fetched blocks, once each has passed ``check``: a block that fails is fetched again, once; it is
        used when it passes then (corrupted in transit: recovered, said in a warning), else ``check`` raises."""
        if self._check is None:
            return got
        failed = []
        for block, data in got.items():
            try:
                self._check(block, data)
            except ValueError:
                failed.append(block)
        if not failed:
            return got
        again = self._read(failed)
        with self._lock:
            self.refetched += len(failed)
        for block in failed:
            self._check(block, again[block], again=True)  # the stored object itself is wrong: its error
            lo, hi = self.block_range(block)
            log.warning(
                "storage: %s: block %d (bytes %d..%d) failed its checksum as fetched and passed when fetched again:"
                " corrupted in transit, recovered",
                self.url,
                block,
                lo,
                hi - 1,
            )
            got[block] = again[block]
        return got

    def read(self, start: int, end: int) -> bytes:
        """The bytes ``[start, end)`` of the object."""
        if not 0 <= start <= end <= self.size:
            raise IndexError(f"{self.url}: Got bytes [{start}, {end}), allowed are within [0, {self.size})")
        if end == start:
            return b""
        first, last = start // self.block_bytes, (end - 1) // self.block_bytes
        got = self.blocks(range(first, last + 1))
        joined = b"".join(got[b] for b in range(first, last + 1))
        base = first * self.block_bytes
        return joined[start - base : end - base]

    def _lookup(self, b: int) -> bytes | None:
        """Block ``b`` if kept (called with the lock held; a shared cache's block is checked by the caller)."""
        data = self._held.get(b)
        if data is not None:
            return data
        data = self._recent.get(b)
        if data is not None:
            self._recent.move_to_end(b)
            return data
        if self._cache is None:
            return None
        return self._cache.get((self.url, b))

    def _check_block(self, b: int, data: bytes) -> None:
        if self._check is not None:
            self._check(b, data)
        self._from_cache_ok[b] = True

    def _keep(self, b: int, data: bytes) -> None:
        if self._cache is not None:
            self._cache.put((self.url, b), data)
            self._from_cache_ok[b] = True
            return
        self._recent[b] = data
        self._recent.move_to_end(b)
        while len(self._recent) > self._recent_cap:
            self._recent.popitem(last=False)


def _runs(blocks: list[int]) -> list[tuple[int, int]]:
    """The runs ``(first, last)`` of adjacent numbers of sorted, distinct ``blocks``."""
    arr = np.asarray(blocks, dtype=np.int64)
    cut = np.flatnonzero(np.diff(arr) != 1) + 1
    firsts = arr[np.concatenate([[0], cut])]
    lasts = arr[np.concatenate([cut - 1, [len(arr) - 1]])]
    return list(zip(firsts.tolist(), lasts.tolist()))
