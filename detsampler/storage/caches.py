"""Bounded block caches: :class:`BeladyCache`, which evicts the block needed furthest in the future (it is told the
future), and :class:`LRUCache`, which evicts the least recently used one. Both implement
:class:`~detsampler.storage.blocks.BlockCache`, so :class:`~detsampler.storage.blocks.BlockedObject` reads through
either, and both are thread-safe (a prefetcher's threads put while the reader gets).

Invariant (both): ``held_bytes``, the bytes of the blocks held, is never above ``cap_bytes`` — after every call, and at
every instant in between (a block is admitted only once the evictions have made room for it; a block larger than the
cap is never held). ``peak_bytes`` records the largest ``held_bytes`` ever reached, so a test checks the cap exactly.

Time in the Belady cache is the index of a *use*: the future is given as uses ``(t, keys)`` (use ``t`` reads blocks
``keys``: a prefetcher's micro batch ``t``, which gets each of its blocks once), :meth:`BeladyCache.advance` says which
use is being read now. The next use of a block is the first known use that has not read it yet: ``now`` until it is
got (or put) during use ``now``, then a later one (infinite when no known use reads it). Rule (Belady's MIN, with
bypass): to admit a block, evict the held block with the furthest next use, unless the newcomer's own next use is
further still (or equally far and finite): then the newcomer is not held (bypass). Among blocks of unknown (infinite)
next use, the least recently used goes first, and a newcomer of unknown use displaces them (with no future known at
all, the cache is an LRU). With every use known and blocks of one size, no policy told the same future has more hits
(tests/test_prefetch.py checks the hits against an exhaustive search over every policy, and against a brute-force
rendering of the rule).
"""

from __future__ import annotations

import heapq
import threading
from collections import OrderedDict, deque
from collections.abc import Iterable

from detsampler.storage.blocks import BlockKey

__all__ = ["NEVER", "BeladyCache", "LRUCache"]

NEVER = 1 << 62  # the next use of a block no known use reads


class _Counts:
    """What a cache counts: ``hits`` and ``misses`` of :meth:`get`, blocks ``admitted``, ``evicted`` and ``bypassed``
    (offered by :meth:`put`, not held), ``held_bytes`` now and ``peak_bytes``."""

    def __init__(self, cap_bytes: int) -> None:
        if isinstance(cap_bytes, bool) or not isinstance(cap_bytes, int) or cap_bytes < 0:
            raise ValueError(f"Got cap_bytes={cap_bytes!r}, it must be an integer >= 0")
        self.cap_bytes = cap_bytes
        self.held_bytes = self.peak_bytes = 0
        self.hits = self.misses = self.admitted = self.evicted = self.bypassed = 0
        self._lock = threading.Lock()

    def stats(self) -> dict[str, int]:
        """The counts, and the number of blocks held."""
        with self._lock:
            names = ("cap_bytes", "held_bytes", "peak_bytes", "hits", "misses", "admitted", "evicted", "bypassed")
            return {**{n: getattr(self, n) for n in names}, "blocks": len(self)}

    def __len__(self) -> int:
        raise NotImplementedError


class LRUCache(_Counts):
    """At most ``cap_bytes`` of blocks; the least recently used (got or put) is evicted first."""

    def __init__(self, cap_bytes: int) -> None:
        super().__init__(cap_bytes)
        self._blocks: OrderedDict[BlockKey, bytes] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, key: BlockKey) -> bool:
        return key in self._blocks

    def get(self, key: BlockKey) -> bytes | None:
        with self._lock:
            data = self._blocks.get(key)
            if data is None:
                self.misses += 1
                return None
            self.hits += 1
            self._blocks.move_to_end(key)
            return data

    def put(self, key: BlockKey, data: bytes) -> None:
        with self._lock:
            if key in self._blocks:
                self._blocks.move_to_end(key)
                return
            if len(data) > self.cap_bytes:
                self.bypassed += 1
                return
            while self.held_bytes + len(data) > self.cap_bytes:
                _, old = self._blocks.popitem(last=False)
                self.held_bytes -= len(old)
                self.evicted += 1
            self._blocks[key] = data
            self.held_bytes += len(data)
            self.admitted += 1
            self.peak_bytes = max(self.peak_bytes, self.held_bytes)


class BeladyCache(_Counts):
    """At most ``cap_bytes`` of blocks, evicted by next use (see the module doc): :meth:`add_use` tells it the future,
    :meth:`advance` the present."""

    def __init__(self, cap_bytes: int) -> None:
        super().__init__(cap_bytes)
        self._blocks: dict[BlockKey, bytes] = {}
        self._uses: dict[BlockKey, deque[int]] = {}  # each key's known uses >= now, ascending
        self._use_keys: deque[tuple[int, list[BlockKey]]] = deque()  # the known uses in order: (t, keys)
        self._now = 0
        self._touched: dict[BlockKey, int] = {}  # each held key's last get or put (a counter): recency among NEVER
        self._clock = 0
        self._heap: list[tuple[int, int, BlockKey]] = []  # (-next use, last touch, key); stale entries skipped

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, key: BlockKey) -> bool:
        return key in self._blocks

    @property
    def now(self) -> int:
        return self._now

    def next_use(self, key: BlockKey) -> int:
        """The first known use ``>= now`` that reads ``key`` (:data:`NEVER` when none does)."""
        with self._lock:
            return self._next(key)

    def add_use(self, t: int, keys: Iterable[BlockKey]) -> None:
        """Use ``t`` reads blocks ``keys``; uses are added in increasing order, none before ``now``."""
        with self._lock:
            if t < self._now or (self._use_keys and t <= self._use_keys[-1][0]):
                last = self._use_keys[-1][0] if self._use_keys else None
                raise ValueError(f"Got use {t}: uses are added in increasing order from now={self._now} (last {last})")
            keys = list(dict.fromkeys(keys))
            self._use_keys.append((t, keys))
            for key in keys:
                uses = self._uses.setdefault(key, deque())
                uses.append(t)
                if len(uses) == 1 and key in self._blocks:  # its next use was NEVER: now t
                    self._push(key)

    def advance(self, t: int) -> None:
        """Use ``t`` is being read now: uses before it are past (``t`` never decreases)."""
        with self._lock:
            if t < self._now:
                raise ValueError(f"Got use {t}, before the present use {self._now}: time does not go back")
            self._now = t
            while self._use_keys and self._use_keys[0][0] < t:
                _, keys = self._use_keys.popleft()
                for key in keys:
                    uses = self._uses.get(key)
                    if not uses or uses[0] >= t:  # consumed already, by a get or a put
                        continue
                    while uses and uses[0] < t:
                        uses.popleft()
                    if not uses:
                        del self._uses[key]
                    if key in self._blocks:
                        self._push(key)

    def forget_future(self) -> None:
        """Drop every known use (a reader that jumped elsewhere): every held block's next use becomes NEVER."""
        with self._lock:
            held = [k for k in self._uses if k in self._blocks]
            self._uses.clear()
            self._use_keys.clear()
            for key in held:
                self._push(key)

    def get(self, key: BlockKey) -> bytes | None:
        with self._lock:
            self._consume(key)
            data = self._blocks.get(key)
            if data is None:
                self.misses += 1
                return None
            self.hits += 1
            if self._next(key) == NEVER:  # recency matters only among blocks of unknown use
                self._push(key)
            return data

    def put(self, key: BlockKey, data: bytes) -> None:
        with self._lock:
            self._consume(key)
            if key in self._blocks:
                return
            size, mine = len(data), self._next(key)
            if size > self.cap_bytes:
                self.bypassed += 1
                return
            while self.held_bytes + size > self.cap_bytes:
                victim, theirs = self._furthest()
                if mine < theirs or (mine == theirs == NEVER):
                    self._evict(victim)
                else:  # the newcomer is needed no sooner than every held block: not held
                    self.bypassed += 1
                    return
            self._blocks[key] = data
            self.held_bytes += size
            self.admitted += 1
            self.peak_bytes = max(self.peak_bytes, self.held_bytes)
            self._push(key)

    # -- internals (called with the lock held)
    def _consume(self, key: BlockKey) -> None:
        """``key`` is read by the present use: its next use is a later one."""
        uses = self._uses.get(key)
        if uses and uses[0] == self._now:
            uses.popleft()
            if not uses:
                del self._uses[key]
            if key in self._blocks:
                self._push(key)

    def _next(self, key: BlockKey) -> int:
        uses = self._uses.get(key)
        return uses[0] if uses else NEVER

    def _push(self, key: BlockKey) -> None:
        self._clock += 1
        self._touched[key] = self._clock
        heapq.heappush(self._heap, (-self._next(key), self._clock, key))
        if len(self._heap) > 4 * len(self._blocks) + 64:  # stale entries: rebuild, so the heap stays O(blocks held)
            self._heap = [(-self._next(k), self._touched[k], k) for k in self._blocks]
            heapq.heapify(self._heap)

    def _furthest(self) -> tuple[BlockKey, int]:
        """The held block with the furthest next use (the least recently touched among equals)."""
        while True:
            neg, touched, key = self._heap[0]
            if key in self._blocks and self._touched[key] == touched and -neg == self._next(key):
                return key, -neg
            heapq.heappop(self._heap)

    def _evict(self, key: BlockKey) -> None:
        self.held_bytes -= len(self._blocks.pop(key))
        del self._touched[key]
        self.evicted += 1
