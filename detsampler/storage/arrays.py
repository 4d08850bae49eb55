"""A read-only 1-D array stored as a ``.npy`` object in a remote store, read element ranges at a time by blocks.

It serves the reads an index's :class:`~detsampler.index.checksums.VerifiedArray` makes of its memory map: ``a[i]``,
``a[i:j]`` (step 1 or not), ``a[int_array]`` and ``np.asarray(a)`` (a full read), with ``shape``, ``dtype``, ``size``
and ``offset`` (where the data starts in the object, after the ``.npy`` header).

Invariant: an element is read from exactly the bytes ``[offset + i * itemsize, offset + (i + 1) * itemsize)`` of the
object, fetched through its :class:`~detsampler.storage.blocks.BlockedObject` (so checked as that module says); one
read fetches all the blocks it lacks in one ranged request. No element straddles two blocks: ``offset`` is a multiple
of the item size (``.npy`` pads its header to 64 bytes) and so is the block size.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from detsampler.ranges import concat_ranges
from detsampler.storage.blocks import BlockCache, BlockedObject, BlockKey

__all__ = ["RemoteArray", "open_npy"]


class RemoteArray:
    """``shape[0]`` elements of ``dtype`` at byte ``offset`` of ``source`` (see the module doc)."""

    def __init__(self, source: BlockedObject, dtype: np.dtype, length: int, offset: int) -> None:
        self.source, self.dtype, self.offset = source, np.dtype(dtype), int(offset)
        self.shape = (int(length),)
        if self.offset % self.dtype.itemsize or source.block_bytes % self.dtype.itemsize:
            raise ValueError(f"{source.url}: data at byte {offset} is not aligned to {self.dtype} items")
        if self.offset + self.shape[0] * self.dtype.itemsize > source.size:
            raise ValueError(f"{source.url}: {self.shape[0]} {self.dtype} items from byte {offset} exceed its size")

    @property
    def size(self) -> int:
        return self.shape[0]

    @property
    def ndim(self) -> int:
        return 1

    def __len__(self) -> int:
        return self.shape[0]

    def __repr__(self) -> str:
        return f"RemoteArray({self.source.url!r}, shape={self.shape}, dtype={self.dtype})"

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return np.asarray(self._slice(0, len(self)), dtype=dtype)

    def __getitem__(self, key: Any) -> Any:
        n = len(self)
        if isinstance(key, slice):
            lo, hi, step = key.indices(n)
            if step == 1:
                return self._slice(lo, max(lo, hi))
            return self._take(np.arange(lo, hi, step, dtype=np.int64))
        if isinstance(key, (int, np.integer)):
            i = int(key) + (n if key < 0 else 0)
            if not 0 <= i < n:
                raise IndexError(f"index {int(key)} is out of bounds for axis 0 with size {n}")
            return self._slice(i, i + 1)[0]
        idx = np.asarray(key)
        if idx.dtype.kind not in "iu":
            raise IndexError(f"only integers, slices and integer arrays index a RemoteArray, got {idx.dtype}")
        flat = idx.reshape(-1).astype(np.int64, copy=False)
        flat = np.where(flat < 0, flat + n, flat)
        if flat.size and (int(flat.min()) < 0 or int(flat.max()) >= n):
            raise IndexError(f"an index is out of bounds for axis 0 with size {n}")
        return self._take(flat).reshape(idx.shape)

    def reblocked(self, block_bytes: int, cache: BlockCache | None, node: Any = None) -> RemoteArray:
        """The same array read by blocks of ``block_bytes`` through ``cache``; for an object without a check only (a
        pre-tokenized file: its ETag is asked for at every read), a checked one is reblocked with its chunk sums
        (:func:`detsampler.index.remote.reblocked`)."""
        if self.source._check is not None:
            raise ValueError(f"{self.source.url}: a checked array is reblocked with its chunk sums, not alone")
        return RemoteArray(self.source.reblocked(block_bytes, cache, None, node), self.dtype, len(self), self.offset)

    def block_keys(self, starts: np.ndarray, stops: np.ndarray) -> list[BlockKey]:
        """The ``(url, block)`` keys a read of the element ranges ``[starts[j], stops[j])`` fetches (each once, in
        order): what an exact prefetcher asks for before the read. Empty ranges hold no block."""
        starts, stops = np.asarray(starts, dtype=np.int64).reshape(-1), np.asarray(stops, dtype=np.int64).reshape(-1)
        some = stops > starts
        if not some.any():
            return []
        bb, isz = self.source.block_bytes, self.dtype.itemsize
        first = (self.offset + starts[some] * isz) // bb
        last = (self.offset + stops[some] * isz - 1) // bb
        blocks = np.unique(concat_ranges(first, last - first + 1)[0])
        return [(self.source.url, b) for b in blocks.tolist()]

    def _slice(self, lo: int, hi: int) -> np.ndarray:
        isz = self.dtype.itemsize
        raw = self.source.read(self.offset + lo * isz, self.offset + hi * isz)
        return np.frombuffer(raw, dtype=self.dtype)

    def _take(self, idx: np.ndarray) -> np.ndarray:
        """Elements ``idx`` (in range): one vectorized gather per block they touch, from a view of the block's bytes
        (no copy of a block: a batch touches few blocks, each read in place)."""
        if not idx.size:
            return np.zeros(0, dtype=self.dtype)
        bb, isz = self.source.block_bytes, self.dtype.itemsize
        byte = self.offset + idx * isz
        block = byte // bb
        first, last = int(block.min()), int(block.max())
        if first == last:  # one block (the common case of a document's tokens): no grouping at all
            view = np.frombuffer(self.source.blocks([first])[first], dtype=self.dtype)
            return view[(byte - first * bb) // isz]
        numbers, inverse, counts = np.unique(block, return_inverse=True, return_counts=True)
        got = self.source.blocks(numbers.tolist())
        order = np.argsort(inverse.reshape(-1), kind="stable")
        out = np.empty(idx.size, dtype=self.dtype)
        at = 0
        for b, n in zip(numbers.tolist(), counts.tolist()):
            mine = order[at : at + n]
            out[mine] = np.frombuffer(got[b], dtype=self.dtype)[(byte[mine] - b * bb) // isz]
            at += n
        return out


def open_npy(source: BlockedObject) -> RemoteArray:
    """The 1-D ``.npy`` array held by ``source``: its header read from block 0 (``ValueError`` when it is not a 1-D,
    C-ordered, non-object ``.npy`` header)."""
    import io

    head = io.BytesIO(source.read(0, min(source.size, source.block_bytes)))
    version = np.lib.format.read_magic(head)
    if version == (1, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(head)
    else:
        shape, fortran, dtype = np.lib.format.read_array_header_2_0(head)
    if len(shape) != 1 or fortran or dtype.hasobject:
        raise ValueError(f"{source.url}: a 1-D C-ordered array of numbers was expected, got shape {shape} of {dtype}")
    return RemoteArray(source, dtype, shape[0], head.tell())
