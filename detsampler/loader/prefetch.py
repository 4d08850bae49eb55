"""Exact lookahead prefetch of what a plan reads from an object store: the blocks of the next micro batches are fetched
before they are read, into a bounded cache that evicts by next use (Belady).

A :class:`~detsampler.loader.PackedDataset` (one index, a pre-tokenized source, a sharded index) or a
:class:`~detsampler.loader.mixture_dataset.MixtureDataset` (every source of a mixture: one prefetcher over all their
reads, one budget, one cache) given ``prefetch=PrefetchConfig(...)`` and the ``plan`` makes one :class:`Prefetcher`
per process (in each DataLoader worker, on its first batch: threads and clients never travel in a pickle). What it
fetches are byte ranges of objects (:mod:`detsampler.loader.fetched`): an index's blocks are CRC-checked against its
chunk sums, a pre-tokenized file's by size and ETag; a media index's images in a bucket are the byte ranges its objects
plan themselves (``ranges_of``: :mod:`detsampler.media.reads`), each image's CRC-32 checked when the batch reads it
(:meth:`~detsampler.loader.PackedDataset.reading` holds the micro batch's blocks while its images are read).

A micro batch from :class:`~detsampler.loader.DeterministicBatchSampler` says where the plan puts it
(:class:`~detsampler.loader.sampler.PlannedIds`), so the worker knows every micro batch it reads after it (every
``num_workers``-th of its rank: :func:`detsampler.reads.plan_reads`, per source). A planner thread computes their
reads (spans, document starts, token ranges: the sources' small arrays are read there, ahead of time) and admits them
in order while the distinct blocks of the admitted micro batches fit in ``budget_bytes``; each admitted micro batch's
blocks that are neither held nor being fetched go to a pool of ``threads`` in one ranged read per object, adjacent
blocks coalesced into one range, into a :class:`~detsampler.storage.caches.BeladyCache` of ``cache_bytes`` told every
admitted micro batch's blocks. Reading a micro batch waits only for its own blocks and uses the spans planned for it.
The planner never holds more than ``max_micro_batches_ahead`` micro batches planned and not yet read (a corpus smaller
than the budget would otherwise be planned ahead without end); it stops, and is joined, on :meth:`Prefetcher.close`,
when its dataset is collected and at interpreter exit.

Guarantees: the batches are the ones read without prefetch, byte for byte (the same spans, the same token ranges, every
block checked on arrival); the cache never holds more than ``cache_bytes``; a micro batch the prefetcher did not
plan (a jump: a restored sampler) restarts the lookahead from it, and one whose ids differ from the plan's, or that the
plan has not (another rank or micro step: the sampler reads another plan), turns prefetch off with a warning (read on
demand); a failed fetch surfaces as the store's
:class:`~detsampler.storage.StorageError` (after its retries) when a micro batch that needs it is read, never as a hang.
A plan that reads more blocks at once than ``cache_bytes`` holds (one micro batch's, or those of the micro batches
fetched ahead) thrashes, blocks dropped before they are read and fetched again: said once per prefetcher in a warning
naming the need and the cap, counted in :class:`PrefetchStats` (``over_cap``, ``peak_need_bytes``,
``peak_window_bytes``). Not refused: whether a micro batch fits depends on where the plan puts its samples.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
import weakref
from collections import Counter, deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from detsampler.loader.fetched import Fetched, OwnRanges, fetched, in_object_store, own_ranges
from detsampler.plan import Plan
from detsampler.reads import PlannedReads, Readable, plan_reads
from detsampler.storage import BlockedObject, BlockKey, NodeCache
from detsampler.storage.caches import BeladyCache
from detsampler.storage.node_cache import NEVER_USED

__all__ = ["PrefetchConfig", "PrefetchStats", "Prefetcher", "Target", "make_prefetcher", "target_of"]

log = logging.getLogger("detsampler.prefetch")
_CHUNK_BYTES = 1 << 16  # the index's checksum chunk: a block holds whole chunks
_PLAN_BATCHES = 8  # micro batches planned per planner call (one plan call, one locate)
_RUNS_PER_FETCH = 4  # runs of adjacent blocks per fetch call: a micro batch's scattered spans go out on several threads


@dataclass(frozen=True, kw_only=True)
class PrefetchConfig:
    """How far ahead to fetch and how much to hold, per process (each DataLoader worker has its own).

    ``budget_bytes``: the blocks of the micro batches fetched ahead (the number of micro batches follows from it, at
    least one ahead of the one read); ``cache_bytes``: the Belady cache's hard cap, at least ``budget_bytes``;
    ``threads``: concurrent ranged reads; ``block_bytes``: the unit fetched and held, a multiple of the 64 KiB checksum
    chunk (small blocks fetch fewer bytes a sample does not use; each request costs a round trip), at most
    ``cache_bytes``; ``max_micro_batches_ahead``: the most micro batches planned and not yet read (their spans and the
    cache's record of their uses are held in RAM), whatever ``budget_bytes`` allows.

    ``node_cache``: a directory shared by the processes of one node (local disk, or ``/dev/shm``), through which every
    block is fetched once per node (:class:`~detsampler.storage.NodeCache`: file locks and atomic renames, every entry
    checked before it is served, keys bound to each object's content; a directory this process cannot write is refused
    when the dataset is made: :meth:`node`); ``node_cache_bytes``: its cap, given with it (at least one entry: the
    larger block unit and its header), its entries evicted by next use over the node's plan (the ranks of this node:
    ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE`` as torchrun sets them, else this rank alone).

    ``source_block_bytes``: the unit fetched of a pre-tokenized file (its format records no checksums, so no chunk
    binds it: any multiple of 4 KiB, at most ``cache_bytes``; None: ``block_bytes``). A finer unit fetches fewer bytes
    a sample does not use, in as many requests (a sample's span is one range either way)."""

    budget_bytes: int = 64 << 20
    cache_bytes: int = 128 << 20
    threads: int = 8
    block_bytes: int = 1 << 16
    max_micro_batches_ahead: int = 128
    node_cache: str | None = None
    node_cache_bytes: int | None = None
    source_block_bytes: int | None = None

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
        unit = self.source_block_bytes
        if unit is not None and (
            isinstance(unit, bool) or not isinstance(unit, (int, np.integer)) or unit < 1 or unit % 4096
        ):
            raise ValueError(f"PrefetchConfig.source_block_bytes must be a multiple of 4096 (or None), got {unit!r}")
        if unit is not None and unit > self.cache_bytes:
            raise ValueError(
                f"PrefetchConfig.source_block_bytes ({unit}) must be <= cache_bytes ({self.cache_bytes}): a block"
                " larger than the cache is never held"
            )
        self._check_node_cache()

    def node(self) -> NodeCache | None:
        """This process's :class:`~detsampler.storage.NodeCache` at ``node_cache`` (its directories made), or None
        without one; a path that cannot hold it (a file, a read-only directory) raises one line naming it."""
        return None if self.node_cache is None else NodeCache(self.node_cache, self.node_cache_bytes)

    def _check_node_cache(self) -> None:
        if self.node_cache is None:
            if self.node_cache_bytes is not None:
                raise ValueError("PrefetchConfig.node_cache_bytes is the cap of a node_cache: give node_cache (a path)")
            return
        if not isinstance(self.node_cache, str) or not self.node_cache:
            raise ValueError(f"PrefetchConfig.node_cache must be a directory path (a string), got {self.node_cache!r}")
        cap, block = self.node_cache_bytes, max(self.block_bytes, self.source_block_bytes or 0)
        entry = block + NodeCache.ENTRY_HEADER_BYTES  # NOTE: a cap of one block held no entry: nothing was published
        if isinstance(cap, bool) or not isinstance(cap, (int, np.integer)) or cap < entry:
            raise ValueError(
                f"PrefetchConfig.node_cache_bytes must be an integer >= {entry} (a block of {block} bytes and its"
                f" entry's header) with a node_cache, got {cap!r}"
            )


@dataclass
class PrefetchStats:
    """What one process's prefetcher did. ``served``: micro batches read from the plan; ``unplanned``: read on demand;
    ``fetched_bytes`` / ``requests``: what its arrays fetched (ahead and on demand), ``used_bytes``: the token bytes
    the served micro batches read; ``wait_s``: time reads waited for their blocks; ``first_batch_bytes``: fetched when
    the first micro batch was read (a fresh start's cost); ``cache``: the Belady cache's counts. ``planned``: micro
    batches the planner planned in all; ``ahead``: planned and not yet read now; ``peak_ahead``: the most ever (never
    above ``max_micro_batches_ahead``). ``sources``: the plan's sources it reads for; ``objects``: the objects it
    fetches from; ``node``: the node-shared cache's counts in this process (``hits``: blocks it served, ``fetched``:
    blocks this process fetched for the node), None without one. ``fetched_bytes`` counts the store's bytes only.

    What the plan needs of the cache at once: ``peak_need_bytes``, the most bytes of distinct blocks one micro batch
    read; ``over_cap``: the micro batches read whose blocks alone exceed ``cache_bytes`` (some of them are dropped
    before they are read and fetched again); ``peak_window_bytes``: the most bytes of distinct blocks the micro batches
    fetched ahead (admitted, not yet read) needed at once. Either above ``cache_bytes`` is said once, in a warning."""

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
    sources: int = 0
    objects: int = 0
    node: dict | None = None
    peak_need_bytes: int = 0
    over_cap: int = 0
    peak_window_bytes: int = 0

    @property
    def amplification(self) -> float | None:
        """Read amplification: the bytes fetched from the store per byte the served micro batches used (None before
        any was used). At least the verification unit's share: a sample's span costs the whole 64 KiB blocks holding
        it; a node cache's hits fetch nothing."""
        return self.fetched_bytes / self.used_bytes if self.used_bytes else None


@dataclass(frozen=True)
class Target:
    """One source of the plan's samples as a prefetcher reads it: ``readable`` (its layout, offsets, lengths, EOS) and
    ``arrays``, what a batch read reads by token position (its tokens, then its loss mask or None); ``own``: objects in
    an object store that plan their own byte ranges from the plan's sample ids (``ranges_of``: a media index's images
    in a bucket, :mod:`detsampler.media.reads`), so only of a plan over this source's layout alone."""

    readable: Readable
    arrays: list[Any]
    kind: str = ""  # a pre-tokenized source's format (its blocks have no checksums), else ""
    own: list[Any] = field(default_factory=list)  # objects that plan their own ranges (a media index's images)


@dataclass
class _Planned:
    """One planned micro batch: its use number ``t`` in the cache, where it is, what it reads: per source
    ``reads[s]`` (its spans, document starts and lengths, or None without a sample of that source), the block keys,
    and per object (its number) the blocks it holds while the micro batch is read."""

    t: int
    position: tuple[int, int]
    ids: np.ndarray
    reads: list[Any]
    keys: list[BlockKey]
    key_bytes: list[int]
    used_bytes: int
    holds: dict[int, list[int]]
    need_bytes: int = 0  # the bytes of its distinct blocks: what the cache must hold while it is read


class Prefetcher:
    """The lookahead of one process (see the module doc) over ``targets``, the plan's sources (one, or a mixture's:
    ``split`` maps the plan's ids to (source, the source's id)); their arrays in an object store are read through one
    cache (:func:`~detsampler.loader.fetched.fetched`), the others as they are, and so are the objects of a target
    that plan their own ranges (``ranges_of``: a media index's images in a bucket, :attr:`own`)."""

    def __init__(
        self,
        targets: list[Target],
        plan: Plan,
        config: PrefetchConfig,
        *,
        split: Any = None,
        worker: int = 0,
        num_workers: int = 1,
    ) -> None:
        self.config, self.plan, self.targets, self._split = config, plan, targets, split
        self.worker, self.num_workers = worker, num_workers
        self.cache = BeladyCache(config.cache_bytes)
        self.node = config.node()
        units = (config.block_bytes, config.source_block_bytes or config.block_bytes)
        self.fetched: list[list[Fetched | None]] = [
            [None if a is None else fetched(a, units, self.cache, self.node) for a in t.arrays] for t in targets
        ]
        self.own: list[list[OwnRanges]] = [
            [own_ranges(o, config.block_bytes, self.cache) for o in t.own] for t in targets
        ]
        self.objects: list[BlockedObject] = [o for per in self.fetched for f in per if f is not None for o in f.objects]
        self.objects += [o for per in self.own for f in per for o in f.objects]
        self._number = {id(o): k for k, o in enumerate(self.objects)}
        for target, per in zip(targets, self.fetched):  # what checks a block of a format without checksums: say it
            for obj in (o for f in per if f is not None for o in f.objects if o._check is None):
                how = f"by size and ETag ({obj.etag})" if obj.etag else "by size only: its server sends no strong ETag"
                log.info(
                    "prefetch: %s: the %s format records no checksums: its blocks are checked %s",
                    obj.url,
                    target.kind or "source's",
                    how,
                )
        self._say_unshared()
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
        self._said_over_cap = False  # a plan that needs more than the cache holds at once is said once
        self.stats = PrefetchStats(sources=len(targets), objects=len(self.objects))
        if self.node is not None:
            self.node.ranking = self._node_ranking
        self._pid = os.getpid()
        self._planner = threading.Thread(target=self._run, name="detsampler-planner", daemon=True)
        self._planner.start()
        _LIVE.add(self)

    def _say_unshared(self) -> None:
        """One line per object the node cache cannot hold (nothing names its content across processes): with a node
        cache given, an object fetched by each process for itself is said, never silent."""
        if self.node is None:
            return
        for obj in self.objects:
            if obj._node is None:
                why = "its server sends no strong ETag" if obj._check is None else "no identity"
                if any(obj is o for per in self.own for f in per for o in f.objects):
                    why = "an image source: its images are checked by their CRC-32s as they are read"
                log.info(
                    "prefetch: %s: the node cache does not hold its blocks (%s: nothing names its content across"
                    " processes): this process fetches its own",
                    obj.url,
                    why,
                )

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
        for number, blocks in head.holds.items():  # each block got once (Belady's use), held while it is read
            self.objects[number].hold(blocks)
        self.stats.wait_s += time.perf_counter() - start
        return head

    def readers(self, source: int) -> list[Any]:
        """Source ``source``'s readers of its arrays through this prefetcher (``read(starts, stops)``; None: an array
        read as it is, not in an object store, or absent)."""
        return [None if f is None else f.reader() for f in self.fetched[source]]

    def done(self, head: _Planned) -> None:
        """Micro batch ``head`` was read: its blocks leave the window, more micro batches may be admitted."""
        for number in head.holds:
            self.objects[number].release()
        with self._cond:
            if self._window and self._window[0] is head:
                self._window.popleft()
                self._release(head)
            self.stats.served += 1
            self.stats.used_bytes += head.used_bytes
            self.stats.peak_need_bytes = max(self.stats.peak_need_bytes, head.need_bytes)
            self.stats.over_cap += head.need_bytes > self.config.cache_bytes
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
        self.stats.node = None if self.node is None else self.node.stats()
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
        return sum(o.fetched_bytes for o in self.objects), sum(o.requests for o in self.objects)

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
            " blocks of %d bytes%s, %d threads)",
            rank,
            self.worker,
            self.num_workers,
            "starts" if first else "restarts",
            *where,
            self.config.cache_bytes,
            "none" if not len(self.cache) else f"{self.cache.held_bytes} bytes",
            self.config.budget_bytes,
            self.config.block_bytes,
            "" if self.config.source_block_bytes is None else f" ({self.config.source_block_bytes} of a source's file)",
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
        """The next ``count`` micro batches of this worker from ``cursor`` (outside the lock: reads the sources' small
        arrays)."""
        reads = plan_reads(
            self.plan,
            [t.readable for t in self.targets],
            rank,
            cursor,
            count,
            stride=self.num_workers,
            stop_step=stop_step,
            split=self._split,
        )
        out = []
        for i, (keys, key_bytes, used_bytes, holds) in enumerate(self._keys(reads)):
            batches = [src.batch(i) for src in reads.sources]
            position, ids = reads.positions[i], reads.sample_ids[i]
            need = sum(dict(zip(keys, key_bytes)).values())  # distinct blocks (an object named twice counts once)
            out.append(_Planned(-1, position, ids, batches, keys, key_bytes, used_bytes, holds, need))
        return out, reads.next_position

    def _node_ranking(self) -> Callable[[str], int]:
        """The next use, over this node's plan, of each node-cache entry (by its name): every rank of the node from the
        micro batch read now, ``max_micro_batches_ahead`` micro batches each, in step order (the ranks of a node
        read a step together). Asked by the node cache once per eviction round."""
        with self._cond:
            head = self._window[0].position if self._window else self._cursor
            anchor = self._anchor
        if head is None or anchor is None:
            return lambda h: NEVER_USED
        first: dict[str, int] = {}
        for k, rank in enumerate(node_ranks(anchor[0], self.plan.world_size)):
            reads = plan_reads(
                self.plan,
                [t.readable for t in self.targets],
                rank,
                head,
                self.config.max_micro_batches_ahead,
                stop_step=anchor[1],
                split=self._split,
            )
            for (step, micro), (_, _, _, holds) in zip(reads.positions, self._keys(reads)):
                t = (step << 28) | (micro << 12) | k  # step order; a node's ranks read a step together
                for number, blocks in holds.items():
                    obj = self.objects[number]
                    if obj.identity is None:  # never in the node cache
                        continue
                    for b in blocks:
                        h = NodeCache.key(obj.identity, obj.url, obj.block_bytes, b)
                        if first.get(h, NEVER_USED) > t:
                            first[h] = t
        return lambda h: first.get(h, NEVER_USED)

    def _keys(self, reads: PlannedReads) -> list[tuple[list[BlockKey], list[int], int, dict[int, list[int]]]]:
        """Per micro batch: its block keys and their sizes, the bytes its reads use, the blocks of each object."""
        keys: list[list[BlockKey]] = [[] for _ in reads.positions]
        sizes: list[list[int]] = [[] for _ in reads.positions]
        holds: list[dict[int, list[int]]] = [{} for _ in reads.positions]
        used = np.zeros(len(reads), dtype=np.int64)
        found = [
            array.blocks(src.starts, src.stops, src.span_offsets)
            for src, per_array in zip(reads.sources, self.fetched)
            for array in per_array
            if array is not None
        ]
        found += [own.blocks(reads) for per in self.own for own in per]  # their ranges from the plan's sample ids
        for obj, bounds, blocks, used_bytes in (one for per_array in found for one in per_array):
            number, bb, listed = self._number[id(obj)], obj.block_bytes, blocks.tolist()
            nbytes = (np.minimum((blocks + 1) * bb, obj.size) - blocks * bb).tolist()
            used += used_bytes
            for i in np.flatnonzero(np.diff(bounds)).tolist():
                a, b = int(bounds[i]), int(bounds[i + 1])
                keys[i].extend((obj.url, blk) for blk in listed[a:b])
                sizes[i].extend(nbytes[a:b])
                holds[i].setdefault(number, []).extend(listed[a:b])
        return list(zip(keys, sizes, used.tolist(), holds))

    def held(self, source: int = 0) -> dict[str, BlockedObject]:
        """The objects of source ``source`` that plan their own ranges (a media index's image sources), by URL: while
        a micro batch :meth:`take` returned is read, its blocks of them are held there (read them through these)."""
        return {own.url: own.source for own in self.own[source]}

    def _admit(self) -> None:
        """Move pending micro batches into the window while the budget allows; fetch what they lack. Lock held."""
        while self._pending and self._has_room():
            planned = self._pending.popleft()
            planned.t = self._next_t
            self._next_t += 1
            self.cache.add_use(planned.t, planned.keys)
            self._window.append(planned)
            lacking: set[BlockKey] = set()
            for key, size in zip(planned.keys, planned.key_bytes):
                self._refs[key] += 1
                if self._refs[key] == 1:
                    self._window_bytes += size
                if key not in self.cache and key not in self._inflight:
                    lacking.add(key)
            self.stats.peak_window_bytes = max(self.stats.peak_window_bytes, self._window_bytes)
            self._say_over_cap(planned)
            for number, held in planned.holds.items():
                obj = self.objects[number]
                blocks = [b for b in dict.fromkeys(held) if (obj.url, b) in lacking]
                if not blocks:
                    continue
                for b in blocks:
                    lacking.discard((obj.url, b))  # an object named twice (a source listed twice) fetches it once
                for group in _groups(sorted(blocks), _RUNS_PER_FETCH):
                    if not self._submit(obj, group):
                        return

    def _say_over_cap(self, planned: _Planned) -> None:
        """Once per prefetcher (each process has its own), when the blocks the plan reads at once exceed the cache:
        ``planned``'s own (every config that reads it thrashes), or those of the micro batches fetched ahead with it
        (the window just grown by ``planned``). Blocks are then dropped before they are read and fetched again: right,
        bounded, and slow, so it is said, with the cap that would hold them. Lock held."""
        cap = self.config.cache_bytes
        if self._said_over_cap or max(planned.need_bytes, self._window_bytes) <= cap:
            return
        self._said_over_cap = True
        if planned.need_bytes > cap:
            step, micro = planned.position
            what, need = f"the micro batch at step {step} micro step {micro} reads", planned.need_bytes
            dropped = "its blocks are"
        else:
            (step, micro), count = self._window[0].position, len(self._window)
            what = f"the {count} micro batches fetched ahead from step {step} micro step {micro} read"
            need, dropped = self._window_bytes, "blocks fetched ahead are"
        log.warning(
            "prefetch: rank %s worker %d of %d: %s %d bytes of blocks at once, more than the cache holds (cache_bytes"
            " %d): %s dropped before they are read and fetched again; give PrefetchConfig(cache_bytes >= %d)",
            self._anchor[0] if self._anchor else "?",
            self.worker,
            self.num_workers,
            what,
            need,
            cap,
            dropped,
            need,
        )

    def _submit(self, obj: BlockedObject, blocks: list[int]) -> bool:
        """Fetch ``blocks`` of ``obj`` on the pool (lock held); False when the pool is shut down (close, or the
        interpreter exits: reads are then on demand)."""
        try:
            future = self._pool.submit(obj.fetch, blocks)
        except RuntimeError:
            self._closed = True
            self._cond.notify_all()
            return False
        for b in blocks:
            self._inflight[(obj.url, b)] = future
        future.add_done_callback(lambda f, keys=[(obj.url, b) for b in blocks]: self._landed(f, keys))
        return True

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


def _groups(blocks: list[int], runs: int) -> list[list[int]]:
    """Sorted ``blocks`` cut into groups of at most ``runs`` runs of adjacent blocks, in order: each group is one fetch
    (one call of ranged reads), so that a micro batch of many scattered spans is fetched by several threads at once
    (a store may run one call's ranges a few at a time)."""
    out: list[list[int]] = []
    count = runs
    for b in blocks:
        if out and b == out[-1][-1] + 1:
            out[-1].append(b)
            continue
        if count == runs:
            out.append([b])
            count = 1
        else:
            out[-1].append(b)
            count += 1
    return out


def node_ranks(rank: int, world_size: int) -> range:
    """The ranks of ``rank``'s node: ``LOCAL_WORLD_SIZE`` consecutive ranks from ``rank - LOCAL_RANK`` (torchrun's
    layout), else ``rank`` alone."""
    try:
        local, size = int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
    except (KeyError, ValueError):
        return range(rank, rank + 1)
    first = max(0, rank - local)
    return range(first, min(world_size, first + size))


def target_of(index: Any, layout: Any, *, own: list[Any] | None = None) -> Target:
    """The :class:`Target` of one index (a ``TokenIndex``, a ``TokenSource``, a ``ShardedIndex``, a media index) and
    its layout; ``own``: objects that plan their own ranges over the plan of this layout (a media index's images)."""
    readable = Readable(layout, index.offsets, index.lengths, bool(getattr(index, "eos_stored", False)))
    kind = getattr(index, "kind", "")
    arrays = [index.tokens, getattr(index, "loss_mask", None)]
    return Target(readable, arrays, kind if isinstance(kind, str) else "", list(own or []))


def make_prefetcher(
    targets: list[Target], plan: Plan, config: PrefetchConfig, *, split: Any = None, where: str = ""
) -> Prefetcher | None:
    """This process's prefetcher over ``targets`` (its DataLoader worker's number from torch's worker info), or None
    when nothing they read lies in an object store: then one line says that prefetch does nothing here (and why: the
    data is local, or an index that stores no tokens is tokenized on the fly)."""
    if not any(in_object_store(a) for t in targets for a in t.arrays if a is not None) and not any(
        t.own for t in targets
    ):
        if all(t.arrays[0] is None for t in targets):  # NOTE: a lengths-only index in a bucket said nothing
            log.info(
                "prefetch: %s stores no tokens (they are tokenized on the fly from the dataset): nothing is fetched,"
                " prefetch does nothing here",
                where,
            )
        else:
            log.info("prefetch: %s is local (memory-mapped): nothing is fetched, prefetch does nothing here", where)
        return None
    from torch.utils.data import get_worker_info

    info = get_worker_info()
    worker, num_workers = (0, 1) if info is None else (info.id, info.num_workers)
    return Prefetcher(targets, plan, config, split=split, worker=worker, num_workers=num_workers)


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
