"""Exact lookahead prefetch of an index in an object store: the blocks of the next micro batches are fetched before
they are read, into a bounded cache that evicts by next use (Belady).

A :class:`~detsampler.loader.PackedDataset` given ``prefetch=PrefetchConfig(...)`` and the ``plan`` makes one
:class:`Prefetcher` per process (in each DataLoader worker, on its first batch: threads and clients never travel in a
pickle). A micro batch from :class:`~detsampler.loader.DeterministicBatchSampler` says where the plan puts it
(:class:`~detsampler.loader.sampler.PlannedIds`), so the worker knows every micro batch it reads after it
(:func:`detsampler.reads.worker_reads`: every ``num_workers``-th of its rank). A planner thread computes their reads
(spans, document starts, token ranges: the index's small arrays are read there, ahead of time) and admits them in order
while the distinct blocks of the admitted micro batches fit in ``budget_bytes``; each admitted micro batch's blocks
that are neither held nor being fetched go to a pool of ``threads`` in one ranged read per array, adjacent blocks
coalesced into one range, into a :class:`~detsampler.storage.caches.BeladyCache` of ``cache_bytes`` told every
admitted micro batch's blocks. Reading a micro batch waits only for its own blocks and uses the spans planned for it.
The planner never holds more than ``max_micro_batches_ahead`` micro batches planned and not yet read (a corpus smaller
than the budget would otherwise be planned ahead without end); it stops, and is joined, on :meth:`Prefetcher.close`,
when its dataset is collected and at interpreter exit.

Guarantees: the batches are the ones read without prefetch, byte for byte (the same spans, the same token ranges, every
block CRC-checked on arrival); the cache never holds more than ``cache_bytes``; a micro batch the prefetcher did not
plan (a jump: a restored sampler) restarts the lookahead from it, and one whose ids differ from the plan's, or that the
plan has not (another rank or micro step: the sampler reads another plan), turns prefetch off with a warning (read on
demand); a failed fetch surfaces as the store's
:class:`~detsampler.storage.StorageError` (after its retries) when a micro batch that needs it is read, never as a hang.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
import weakref
from collections import Counter, deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from detsampler.layout import Layout
from detsampler.plan import Plan
from detsampler.reads import range_blocks, worker_reads
from detsampler.storage import BlockKey
from detsampler.storage.caches import BeladyCache

__all__ = ["PrefetchConfig", "PrefetchStats", "Prefetcher"]

log = logging.getLogger("detsampler.prefetch")
_CHUNK_BYTES = 1 << 16  # the index's checksum chunk: a block holds whole chunks
_PLAN_BATCHES = 8  # micro batches planned per planner call (one plan call, one locate)


@dataclass(frozen=True, kw_only=True)
class PrefetchConfig:
    """How far ahead to fetch and how much to hold, per process (each DataLoader worker has its own).

    ``budget_bytes``: the blocks of the micro batches fetched ahead (the number of micro batches follows from it, at
    least one ahead of the one read); ``cache_bytes``: the Belady cache's hard cap, at least ``budget_bytes``;
    ``threads``: concurrent ranged reads; ``block_bytes``: the unit fetched and held, a multiple of the 64 KiB checksum
    chunk (small blocks fetch fewer bytes a sample does not use; each request costs a round trip), at most
    ``cache_bytes``; ``max_micro_batches_ahead``: the most micro batches planned and not yet read (their spans and the
    cache's record of their uses are held in RAM), whatever ``budget_bytes`` allows."""

    budget_bytes: int = 64 << 20
    cache_bytes: int = 128 << 20
    threads: int = 8
    block_bytes: int = 1 << 16
    max_micro_batches_ahead: int = 128

    def __post_init__(self) -> None:
        for name in ("budget_bytes", "cache_bytes", "threads", "block_bytes", "max_micro_batches_ahead"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"PrefetchConfig.{name} must be an integer >= 1, got {value!r}")
        if self.block_bytes % _CHUNK_BYTES:
            raise ValueError(f"PrefetchConfig.block_bytes must be a multiple of {_CHUNK_BYTES}, got {self.block_bytes}")
        if self.cache_bytes < self.budget_bytes:
            raise ValueError(
                f"PrefetchConfig.cache_bytes ({self.cache_bytes}) must be >= budget_bytes ({self.budget_bytes}): the"
                " cache holds what is fetched ahead"
            )
        if self.cache_bytes < self.block_bytes:
            raise ValueError(
                f"PrefetchConfig.cache_bytes ({self.cache_bytes}) must be >= block_bytes ({self.block_bytes}): a block"
                " larger than the cache is never held, so every read would fetch it again"
            )


@dataclass
class PrefetchStats:
    """What one process's prefetcher did. ``served``: micro batches read from the plan; ``unplanned``: read on demand;
    ``fetched_bytes`` / ``requests``: what its arrays fetched (ahead and on demand), ``used_bytes``: the token bytes
    the served micro batches read; ``wait_s``: time reads waited for their blocks; ``first_batch_bytes``: fetched when
    the first micro batch was read (a fresh start's cost); ``cache``: the Belady cache's counts. ``planned``: micro
    batches the planner planned in all; ``ahead``: planned and not yet read now; ``peak_ahead``: the most ever (never
    above ``max_micro_batches_ahead``)."""

    served: int = 0
    unplanned: int = 0
    planned: int = 0
    ahead: int = 0
    peak_ahead: int = 0
    fetched_bytes: int = 0
    requests: int = 0
    used_bytes: int = 0
    wait_s: float = 0.0
    first_batch_bytes: int | None = None
    cache: dict = field(default_factory=dict)


@dataclass
class _Planned:
    """One planned micro batch: its use number ``t`` in the cache, where it is, what it reads."""

    t: int
    position: tuple[int, int]
    ids: np.ndarray
    reads: Any  # (spans, doc_starts, doc_lengths)
    keys: list[BlockKey]
    key_bytes: list[int]
    used_bytes: int


class Prefetcher:
    """The lookahead of one process (see the module doc): ``arrays`` are the index's remote arrays read by token
    position (the tokens, and a chat index's loss mask), each a :class:`~detsampler.index.checksums.VerifiedArray`,
    and objects that plan their own ranges (``ranges_of``: a media index's images in a bucket)."""

    def __init__(
        self,
        arrays: list[Any],
        offsets: Any,
        lengths: Any,
        layout: Layout,
        plan: Plan,
        config: PrefetchConfig,
        *,
        eos_stored: bool,
        worker: int = 0,
        num_workers: int = 1,
    ) -> None:
        self.config, self.plan, self.layout = config, plan, layout
        self.worker, self.num_workers = worker, num_workers
        self._offsets, self._lengths, self._eos_stored = offsets, lengths, eos_stored
        self.cache = BeladyCache(config.cache_bytes)
        self.arrays = [a.reblocked(config.block_bytes, self.cache) for a in arrays]
        self._pool = ThreadPoolExecutor(config.threads, thread_name_prefix="detsampler-prefetch")
        self._cond = threading.Condition()
        self._window: deque[_Planned] = deque()  # admitted, not yet read; the head is read next
        self._pending: deque[_Planned] = deque()  # planned, waiting for budget
        self._refs: Counter[BlockKey] = Counter()  # admitted micro batches reading each key
        self._window_bytes = 0  # bytes of the distinct keys of the window
        self._inflight: dict[BlockKey, Future] = {}
        self._anchor: tuple[int, int | None] | None = None  # (rank, stop_step) of the current lookahead
        self._cursor: tuple[int, int] | None = None  # the next position to plan; None: the plan ends
        self._generation = 0  # bumped when the lookahead restarts: a planner result of an older one is dropped
        self._next_t = 0
        self._error: BaseException | None = None
        self._closed = False
        self._off = False  # the sampler reads another plan: every micro batch is read on demand
        self.stats = PrefetchStats()
        self._pid = os.getpid()
        self._planner = threading.Thread(target=self._run, name="detsampler-planner", daemon=True)
        self._planner.start()
        _LIVE.add(self)

    # -- the reader's side
    def take(self, ids: Any) -> _Planned | None:
        """The planned reads of micro batch ``ids`` once its blocks are held, or None when it is not the plan's (read
        it on demand). Raises what its blocks' fetch raised."""
        where = getattr(ids, "step", None), getattr(ids, "micro_step", None)
        if where[0] is None or self._off:
            self.stats.unplanned += 1
            return None
        start = time.perf_counter()
        rank, stop_step = int(ids.rank), getattr(ids, "stop_step", None)
        with self._cond:
            if self._restarts_at(where, rank, stop_step):
                not_the_plans = self._not_the_plans(ids, where, rank)
                if not_the_plans is not None:
                    self._turn_off(where, rank, not_the_plans)
                    return None
            head = self._head_at(where, rank, stop_step)
        if head is None or not np.array_equal(head.ids, np.asarray(ids, dtype=np.int64)):
            self._unplanned(where, head)
            return None
        self.cache.advance(head.t)
        for future in {id(f): f for f in map(self._inflight.get, head.keys) if f is not None}.values():
            future.result()  # a failed fetch raises here: the store's StorageError (after its retries)
        for array in self.arrays:  # each block got once (Belady's use), held while the micro batch is read
            source = array._array.source
            source.hold(b for url, b in head.keys if url == source.url)
        self.stats.wait_s += time.perf_counter() - start
        return head

    def done(self, head: _Planned) -> None:
        """Micro batch ``head`` was read: its blocks leave the window, more micro batches may be admitted."""
        for array in self.arrays:
            array._array.source.release()
        with self._cond:
            if self._window and self._window[0] is head:
                self._window.popleft()
                self._release(head)
            self.stats.served += 1
            self.stats.used_bytes += head.used_bytes
            if self.stats.first_batch_bytes is None:
                self.stats.first_batch_bytes = self._fetched()[0]
                log.info(
                    "prefetch: rank %s worker %d of %d read its first micro batch (step %d, micro step %d) after"
                    " fetching %d bytes in %d requests, from an empty cache",
                    self._anchor[0] if self._anchor else "?",
                    self.worker,
                    self.num_workers,
                    *head.position,
                    self.stats.first_batch_bytes,
                    self._fetched()[1],
                )
            self._admit()
            self._cond.notify_all()

    def summary(self) -> PrefetchStats:
        """The stats now (fetched bytes, the micro batches ahead and the cache's counts brought up to date)."""
        self.stats.fetched_bytes, self.stats.requests = self._fetched()
        self.stats.cache = self.cache.stats()
        with self._cond:
            self.stats.ahead = len(self._window) + len(self._pending)
        return self.stats

    def close(self) -> None:
        """Stop the planner and wait for it and the fetches under way (idempotent; a no-op in a forked child, which
        has none of the parent's threads). Reads after it are on demand."""
        if os.getpid() != self._pid:
            return
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._pool.shutdown(wait=True, cancel_futures=True)
        if self._planner is not threading.current_thread():
            self._planner.join(timeout=60)
        _LIVE.discard(self)

    @property
    def closed(self) -> bool:
        return self._closed

    # -- internals
    def _fetched(self) -> tuple[int, int]:
        sources = [a._array.source for a in self.arrays]
        return sum(s.fetched_bytes for s in sources), sum(s.requests for s in sources)

    def _restarts_at(self, where: tuple[int, int], rank: int, stop_step: int | None) -> bool:
        """Whether the micro batch at ``where`` is not the one coming next (the lookahead restarts). Lock held."""
        coming = self._window[0].position if self._window else self._pending[0].position if self._pending else None
        return self._anchor != (rank, stop_step) or (coming != where and not (coming is None and self._cursor == where))

    def _not_the_plans(self, ids: Any, where: tuple[int, int], rank: int) -> str | None:
        """Why micro batch ``ids`` at ``where`` of ``rank`` is not the dataset's plan's there, or None when it is."""
        try:
            want = self.plan.micro_batch(*where, rank)
        except ValueError as exc:  # a rank or micro step the plan has not
            return str(exc)
        if not np.array_equal(want, np.asarray(ids, dtype=np.int64)):
            return f"its ids {np.asarray(ids).tolist()[:4]}... differ from the plan's {want.tolist()[:4]}..."
        return None

    def _head_at(self, where: tuple[int, int], rank: int, stop_step: int | None) -> _Planned | None:
        """The window's head once it is the micro batch at ``where`` (restarting the lookahead there when it is not
        coming); None when the plan has no micro batch there or the prefetcher is closed. Called with the lock held."""
        if self._restarts_at(where, rank, stop_step):
            self._restart(where, rank, stop_step)
        while not self._window:
            if self._closed:
                return None
            if self._error is not None:
                error, self._error = self._error, None
                self._anchor = None  # the next read starts the lookahead again
                raise error
            if self._cursor is None and not self._pending:
                return None
            self._cond.wait(timeout=1.0)
        head = self._window[0]
        return head if head.position == where else None

    def _restart(self, where: tuple[int, int], rank: int, stop_step: int | None) -> None:
        first = self._anchor is None and self._next_t == 0
        self._generation += 1
        for planned in [*self._window]:
            self._release(planned)
        self._window.clear()
        self._pending.clear()
        self.cache.forget_future()
        self._anchor, self._cursor, self._error = (rank, stop_step), where, None
        log.info(
            "prefetch: rank %d worker %d of %d %s at step %d micro step %d (cache %d bytes, %s held; budget %d bytes,"
            " blocks of %d bytes, %d threads)",
            rank,
            self.worker,
            self.num_workers,
            "starts" if first else "restarts",
            *where,
            self.config.cache_bytes,
            "none" if not len(self.cache) else f"{self.cache.held_bytes} bytes",
            self.config.budget_bytes,
            self.config.block_bytes,
            self.config.threads,
        )
        self._cond.notify_all()

    def _unplanned(self, where: tuple[int, int], head: _Planned | None) -> None:
        if head is None:
            self.stats.unplanned += 1
            return
        with self._cond:
            self._turn_off(where, self._anchor[0] if self._anchor else -1, "its ids differ from the plan's")

    def _turn_off(self, where: tuple[int, int], rank: int, why: str) -> None:
        """Every micro batch from now on is read on demand (the sampler reads another plan), said once. Lock held."""
        self.stats.unplanned += 1
        self._off = True
        self._anchor = None
        self._generation += 1
        self._cond.notify_all()
        log.warning(
            "prefetch: the micro batch at step %d micro step %d of rank %d is not the one the dataset's plan puts there"
            " (%s): the sampler reads another plan, so every micro batch is read on demand, without prefetch",
            *where,
            rank,
            why,
        )

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed and not self._wants_plan():
                    self._cond.wait()
                if self._closed:
                    return
                generation, cursor, (rank, stop_step) = self._generation, self._cursor, self._anchor
                count = min(_PLAN_BATCHES, self._places_ahead())
            try:
                planned = self._plan(cursor, rank, stop_step, count)
            except BaseException as exc:  # a failing store: the reader raises it
                with self._cond:
                    if generation == self._generation:
                        self._error, self._cursor = exc, None
                        self._cond.notify_all()
                continue
            with self._cond:
                if self._closed:
                    return
                if generation != self._generation:
                    continue
                self._cursor = planned[1]
                self._pending.extend(planned[0])
                self.stats.planned += len(planned[0])
                self.stats.peak_ahead = max(self.stats.peak_ahead, len(self._window) + len(self._pending))
                self._admit()
                self._cond.notify_all()

    def _places_ahead(self) -> int:
        """How many more micro batches may be planned now (the bound less those planned and not yet read)."""
        return self.config.max_micro_batches_ahead - len(self._window) - len(self._pending)

    def _wants_plan(self) -> bool:
        return (
            self._anchor is not None
            and self._cursor is not None
            and self._error is None
            and not self._pending
            and self._has_room()
            and self._places_ahead() > 0
        )

    def _has_room(self) -> bool:
        return self._window_bytes < self.config.budget_bytes or len(self._window) < 2

    def _plan(
        self, cursor: tuple[int, int], rank: int, stop_step: int | None, count: int
    ) -> tuple[list[_Planned], Any]:
        """The next ``count`` micro batches of this worker from ``cursor`` (outside the lock: reads the index's small
        arrays)."""
        reads = worker_reads(
            self.plan,
            self.layout,
            self._offsets,
            self._lengths,
            rank,
            cursor,
            count,
            stride=self.num_workers,
            stop_step=stop_step,
            eos_stored=self._eos_stored,
        )
        per_array = []
        for array in self.arrays:
            remote = array._array
            starts, stops, groups = _element_ranges(array, reads)
            bounds, blocks = range_blocks(
                starts,
                stops,
                groups,
                itemsize=remote.dtype.itemsize,
                data_offset=remote.offset,
                block_bytes=remote.source.block_bytes,
            )
            sizes = np.minimum((blocks + 1) * remote.source.block_bytes, remote.source.size) - blocks * (
                remote.source.block_bytes
            )
            used = np.concatenate([[0], np.cumsum(stops - starts)])[groups] * remote.dtype.itemsize
            per_array.append((remote.source.url, bounds, blocks.tolist(), sizes.tolist(), np.diff(used).tolist()))
        out = []
        for i in range(len(reads)):
            keys, key_bytes, used_bytes = [], [], 0
            for url, bounds, blocks, sizes, used in per_array:
                a, b = int(bounds[i]), int(bounds[i + 1])
                keys.extend((url, blk) for blk in blocks[a:b])
                key_bytes.extend(sizes[a:b])
                used_bytes += int(used[i])
            out.append(
                _Planned(-1, reads.positions[i], reads.sample_ids[i], reads.batch(i), keys, key_bytes, used_bytes)
            )
        return out, reads.next_position

    def _admit(self) -> None:
        """Move pending micro batches into the window while the budget allows; fetch what they lack. Lock held."""
        while self._pending and self._has_room():
            planned = self._pending.popleft()
            planned.t = self._next_t
            self._next_t += 1
            self.cache.add_use(planned.t, planned.keys)
            self._window.append(planned)
            lacking: dict[str, list[int]] = {}
            for key, size in zip(planned.keys, planned.key_bytes):
                self._refs[key] += 1
                if self._refs[key] == 1:
                    self._window_bytes += size
                if key not in self.cache and key not in self._inflight:
                    lacking.setdefault(key[0], []).append(key[1])
            for array in self.arrays:
                source = array._array.source
                blocks = lacking.get(source.url)
                if blocks:
                    try:
                        future = self._pool.submit(source.fetch, blocks)
                    except RuntimeError:  # the pool is shut down (close, or the interpreter exits): read on demand
                        self._closed = True
                        self._cond.notify_all()
                        return
                    for b in blocks:
                        self._inflight[(source.url, b)] = future
                    future.add_done_callback(lambda f, keys=[(source.url, b) for b in blocks]: self._landed(f, keys))

    def _landed(self, future: Future, keys: list[BlockKey]) -> None:
        with self._cond:
            for key in keys:
                if self._inflight.get(key) is future:
                    del self._inflight[key]

    def _release(self, planned: _Planned) -> None:
        for key, size in zip(planned.keys, planned.key_bytes):
            self._refs[key] -= 1
            if not self._refs[key]:
                del self._refs[key]
                self._window_bytes -= size


def _element_ranges(array: Any, reads: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(starts, stops, groups)``: the element ranges each planned micro batch reads of ``array`` (micro batch ``i``:
    ranges ``groups[i]:groups[i + 1]``): the token ranges of ``reads``, or the array's own when it plans them
    (``array.ranges_of(reads)``: a media index's images, by byte, :mod:`detsampler.media.reads`)."""
    own = getattr(array, "ranges_of", None)
    return own(reads) if own is not None else (reads.starts, reads.stops, reads.span_offsets)


_LIVE: weakref.WeakSet[Prefetcher] = weakref.WeakSet()  # this process's prefetchers not closed yet


@atexit.register
def _close_all() -> None:
    """Stop every prefetcher still running when the interpreter exits.

    NOTE: the planner is a daemon thread; left running into the interpreter's teardown, a daemon thread is stopped
    wherever it is, which in a process that also runs native code in other threads (torch's, gloo's) can abort it
    ("terminate called without an active exception"). atexit runs after the thread pools' workers were joined and
    before that teardown."""
    for prefetcher in list(_LIVE):
        prefetcher.close()
