"""A media index's images as the prefetcher reads them: each source object in a store (a webdataset shard in a bucket)
read by blocks, the ranges of a planned micro batch being the byte ranges of its images in that object.

:class:`MediaObject` has the surface :class:`~detsampler.loader.prefetch.Prefetcher` reads of an array (``reblocked``,
``_array.source``: a :class:`~detsampler.storage.BlockedObject`, ``dtype`` of one byte, ``offset`` 0) and
``ranges_of(reads)``: for the micro batches of :func:`detsampler.reads.worker_reads`, the images
:meth:`~detsampler.media.layout.MediaLayout.sample_images` gives their samples, in the order the batch reads them, kept
where this object holds them. So the prefetcher fetches exactly the blocks each future micro batch's images lie in,
before it is read; the objects of one index share one computation of the images per planned batch.

Invariant: the bytes read through it are the object's bytes; each image's CRC-32 is checked when the batch reads it
(:meth:`~detsampler.media.index.MediaIndex.read_images`), as without prefetch, so a prefetched batch is the batch read
without it, byte for byte (tests/test_media_bucket.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from detsampler.storage import DEFAULT_BLOCK_BYTES, BlockCache, BlockedObject

__all__ = ["MediaObject", "media_objects"]


class _Images:
    """The images of the last planned micro batches (shared by an index's objects: one layout call per plan call)."""

    def __init__(self, index: Any, layout: Any) -> None:
        self.index, self.layout = index, layout
        self._last: tuple[Any, tuple[np.ndarray, ...]] | None = None

    def of(self, reads: Any) -> tuple[np.ndarray, ...]:
        """``(group, source, offset, size)`` of every image of ``reads``' micro batches, in read order."""
        last = self._last  # NOTE: read once: a node cache's ranking plans reads in another thread than the planner
        if last is not None and last[0] is reads:
            return last[1]
        k, m = reads.sample_ids.shape if len(reads) else (0, 1)
        offsets, images = self.layout.sample_images(reads.sample_ids.reshape(-1))
        rows = self.index.image_rows(images)
        group = np.repeat(np.arange(k), np.diff(offsets[::m])) if k else np.zeros(0, np.int64)
        found = (group, rows["source"], rows["offset"], rows["size"])
        self._last = (reads, found)
        return found


class MediaObject:
    """Source ``source`` of a media index (an object at ``url`` of ``size`` bytes) read by blocks (see the module
    doc)."""

    dtype = np.dtype(np.uint8)
    offset = 0

    def __init__(
        self, images: _Images, source: int, url: str, size: int, source_object: BlockedObject | None = None
    ) -> None:
        self._images, self.source_id, self.url, self.size = images, source, url, size
        self.source = source_object

    @property
    def _array(self) -> MediaObject:
        return self  # the prefetcher reads an array's remote part as ``_array``

    def reblocked(self, block_bytes: int, cache: BlockCache | None) -> MediaObject:
        """The same object read by blocks of ``block_bytes`` through ``cache`` (no block check: each image's CRC-32
        is checked when it is read)."""
        blocked = BlockedObject(self.url, self.size, block_bytes=block_bytes, cache=cache)
        return MediaObject(self._images, self.source_id, self.url, self.size, blocked)

    def ranges_of(self, reads: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(starts, stops, groups)``: the byte ranges of this object that micro batch ``i`` of ``reads`` reads are
        ``starts[groups[i]:groups[i + 1]]`` to ``stops[...]`` (its images held here)."""
        group, source, offset, size = self._images.of(reads)
        mine = source == self.source_id
        counts = np.bincount(group[mine], minlength=len(reads))
        groups = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        return offset[mine], offset[mine] + size[mine], groups


def media_objects(index: Any, layout: Any) -> list[MediaObject]:
    """The objects in a store that ``index``'s images are read from (none when every image is on disk or in the index
    itself), each read by blocks, ready for a prefetcher over ``layout``."""
    from detsampler.storage import is_remote

    images = _Images(index, layout)
    out = []
    for source, (url, size) in enumerate(zip(index.meta["sources"], index.meta["source_sizes"])):
        if source and is_remote(url):
            out.append(MediaObject(images, source, url, int(size)).reblocked(DEFAULT_BLOCK_BYTES, None))
    return out
