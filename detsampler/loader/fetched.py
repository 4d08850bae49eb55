"""What a prefetcher fetches: the arrays a batch read reads by token position (a source's tokens, its loss mask), each
seen as byte ranges of objects.

:func:`fetched` turns one such array into a :class:`Fetched` read through the prefetcher's cache at its block size, or
None when nothing of it lies in an object store (a memory map). Three shapes:

- an index's array in a store (a :class:`~detsampler.index.checksums.VerifiedArray` over a remote ``.npy``): one
  object, each block CRC-checked against the index's chunk sums as it arrives;
- a pre-tokenized source's token file in a store (a bare :class:`~detsampler.storage.RemoteArray`: its format records
  no checksums): one object, each block checked by its size and the object's ETag (every read asks for the version the
  source was opened at: ``If-Match``);
- a sharded index's array (a :class:`~detsampler.index.sharded.ShardedArray`): one object per shard in a store, the
  element ranges of a read sent to the shard holding them;
- an object that plans its own byte ranges (:class:`OwnRanges`: a media index's image source in a store,
  ``ranges_of(reads)``): read unchecked by blocks, each image's CRC-32 checked when the batch reads it.

Invariant: :meth:`Fetched.blocks` lists, per group of element ranges, exactly the blocks of each object that a read of
those ranges through :meth:`Fetched.reader` gets (:func:`detsampler.reads.range_blocks`, per object); the reader
returns what a batch read reads the ranges from (``gather.pack_fields``'s ``read``). :meth:`OwnRanges.blocks` lists
the blocks of the ranges the object plans for each micro batch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from detsampler.index.checksums import VerifiedArray
from detsampler.index.sharded import ShardedArray
from detsampler.reads import range_blocks
from detsampler.storage import BlockCache, BlockedObject, NodeCache, RemoteArray

__all__ = ["Fetched", "OwnRanges", "fetched", "in_object_store", "own_ranges"]

# (object, CSR bounds per group, the blocks, the bytes of the object each group's ranges use)
Blocks = tuple[BlockedObject, np.ndarray, np.ndarray, np.ndarray]


class Fetched:
    """One array read by element position through a prefetcher's cache (see the module doc)."""

    def __init__(self, parts: list[Any], bases: np.ndarray | None, array: Any) -> None:
        self._parts, self._bases, self._array = parts, bases, array  # bases: a sharded array's element bases
        self.objects = [_remote(p).source for p in parts if p is not None]

    def blocks(self, starts: np.ndarray, stops: np.ndarray, range_offsets: np.ndarray) -> list[Blocks]:
        """The blocks each group of element ranges ``[starts, stops)`` reads, per object (CSR as
        :func:`~detsampler.reads.range_blocks`), with the bytes of it the group's ranges use."""
        if self._bases is None:
            return [_blocks(self._parts[0], starts, stops, range_offsets)]
        groups = len(range_offsets) - 1
        group = np.repeat(np.arange(groups, dtype=np.int64), np.diff(range_offsets))
        some = stops > starts
        shard = np.searchsorted(self._bases, starts, side="right") - 1
        out = []
        for k, part in enumerate(self._parts):
            mine = some & (shard == k)
            if part is None or not mine.any():
                continue
            offsets = np.zeros(groups + 1, dtype=np.int64)
            np.cumsum(np.bincount(group[mine], minlength=groups), out=offsets[1:])
            base = int(self._bases[k])
            out.append(_blocks(part, starts[mine] - base, stops[mine] - base, offsets))
        return out

    def reader(self) -> Callable[[np.ndarray, np.ndarray], Any]:
        """``read(starts, stops)``: what a batch read reads the ranges from (their chunks checked, where checked)."""
        array = self._array
        return getattr(array, "checked_ranges", None) or (lambda starts, stops: array)


class OwnRanges:
    """An object in a store that plans its own byte ranges (``ranges_of(reads)``, by byte: a media index's images in a
    bucket, :mod:`detsampler.media.reads`), read through a prefetcher's cache: ``source`` its
    :class:`~detsampler.storage.BlockedObject` (no block check: each image's CRC-32 is checked when it is read)."""

    def __init__(self, obj: Any) -> None:
        self._obj, self.url, self.source = obj, obj.url, obj.source
        self.objects = [obj.source]

    def blocks(self, reads: Any) -> list[Blocks]:
        """The blocks each planned micro batch of ``reads`` (the plan's sample ids) reads of this object, with the
        bytes of it its ranges use (as :meth:`Fetched.blocks`)."""
        starts, stops, groups = self._obj.ranges_of(reads)
        return [_blocks(self._obj, np.asarray(starts, np.int64), np.asarray(stops, np.int64), groups)]


def own_ranges(obj: Any, block_bytes: int, cache: BlockCache) -> OwnRanges:
    """``obj`` (it has ``ranges_of`` and ``reblocked(block_bytes, cache)``) read by blocks of ``block_bytes`` through
    ``cache``."""
    return OwnRanges(obj.reblocked(block_bytes, cache))


def _remote(part: Any) -> RemoteArray:
    return part._array if isinstance(part, VerifiedArray) else part


def _blocks(part: Any, starts: np.ndarray, stops: np.ndarray, range_offsets: np.ndarray) -> Blocks:
    remote = _remote(part)
    groups = len(range_offsets) - 1
    group = np.repeat(np.arange(groups, dtype=np.int64), np.diff(range_offsets))
    used = np.bincount(group, weights=np.maximum(stops - starts, 0), minlength=groups) * remote.dtype.itemsize
    bounds, blocks = range_blocks(
        starts,
        stops,
        range_offsets,
        itemsize=remote.dtype.itemsize,
        data_offset=remote.offset,
        block_bytes=remote.source.block_bytes,
    )
    return remote.source, bounds, blocks, used.astype(np.int64)


def _reblocked(array: Any, units: tuple[int, int], cache: BlockCache, node: NodeCache | None) -> Any | None:
    """``array`` read by blocks through ``cache`` (and ``node``): of ``units[0]`` bytes for an index's checked array,
    ``units[1]`` for a pre-tokenized file's; None when it is not in an object store."""
    if isinstance(array, VerifiedArray):
        return array.reblocked(units[0], cache, node)
    if isinstance(array, RemoteArray):
        return array.reblocked(units[1] if array.source._check is None else units[0], cache, node)
    return None


def fetched(array: Any, units: tuple[int, int], cache: BlockCache, node: NodeCache | None = None) -> Fetched | None:
    """``array`` (an array a batch read reads by token position) as a :class:`Fetched` through ``cache`` (and the
    node-shared cache ``node``), read by blocks of ``units`` (an index's, a pre-tokenized file's), or None when no
    part of it lies in an object store."""
    if isinstance(array, ShardedArray):
        parts = [_reblocked(p, units, cache, node) for p in array._parts]
        if all(p is None for p in parts):
            return None
        mixed = [new if new is not None else old for new, old in zip(parts, array._parts)]
        read = ShardedArray(mixed, array._bases, array._add, array._tail, array.dtype)
        return Fetched(parts, np.asarray(array._bases, dtype=np.int64), read)
    part = _reblocked(array, units, cache, node)
    return None if part is None else Fetched([part], None, part)


def in_object_store(array: Any) -> bool:
    """Whether any part of ``array`` is read from an object store."""
    if isinstance(array, ShardedArray):
        return any(in_object_store(p) for p in array._parts)
    return isinstance(array, RemoteArray) or bool(getattr(array, "in_object_store", False))
