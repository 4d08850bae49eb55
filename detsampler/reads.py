"""The future reads of the plan: which ranges of the flat token array, and so which storage blocks, each micro batch of
one rank and one DataLoader worker reads, in the order that worker reads them. Pure (numpy), vectorized over samples.

A DataLoader hands the micro batches of a rank's batch sampler to its workers in turn, so worker ``w`` of ``W`` reads
every ``W``-th one: from the position ``(step, micro_step)`` of one of its micro batches, its next ones are ``W``,
``2W``, ... micro batches later in the rank's order (:meth:`~detsampler.plan.Plan.micro_batches_from`).
:func:`worker_reads` lists ``count`` of them with everything a batch read needs besides the tokens themselves (the
samples' spans, where each document's tokens start, their lengths) and the element ranges it reads of the tokens:
exactly :func:`detsampler.gather.token_ranges`, which the batch read itself calls. :func:`range_blocks` maps ranges to
the distinct blocks of a stored array each micro batch touches, the unit a prefetcher fetches and a cache holds.

:func:`plan_reads` does the same for a plan over a mixture (or one index): each micro batch's samples are split by
source (``Mixture.split_ids``), and each source's reads are listed in the order a
:class:`~detsampler.loader.mixture_dataset.MixtureDataset` reads them (its rows of the micro batch, ascending).

Invariants (tests/test_prefetch.py, tests/test_prefetch_everywhere.py): micro batch ``i`` of :func:`worker_reads`
(and of :func:`plan_reads`, source by source) has the sample ids, spans and ranges that reading
``plan.micro_batch(*positions[i], rank)`` computes; :func:`range_blocks` gives, per micro batch, exactly the blocks a
read of its ranges fetches (:meth:`~detsampler.storage.RemoteArray.block_keys`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from detsampler.gather import token_ranges
from detsampler.layout import Layout, Spans
from detsampler.plan import Plan
from detsampler.ranges import concat_ranges

__all__ = [
    "MicroBatchReads",
    "PlannedReads",
    "Readable",
    "SourceReads",
    "plan_reads",
    "range_blocks",
    "worker_reads",
    "worker_start",
]


@dataclass(frozen=True)
class MicroBatchReads:
    """The reads of ``k`` micro batches of one rank and worker, in the order the worker reads them.

    ``positions[i]`` is micro batch ``i``'s ``(step, micro_step)`` and ``sample_ids[i]`` its samples; ``spans`` holds
    the spans of all ``k * micro_batch_size`` samples in that order, and per span ``doc_starts`` (where its document's
    tokens start in the flat array), ``doc_lengths`` and the range ``[starts, stops)`` of the flat array it reads
    (empty for a virtual EOS alone). ``span_offsets[i]:span_offsets[i + 1]`` are micro batch ``i``'s spans.
    ``next_position`` is the worker's micro batch after the last one, or None when the plan ends (``stop_step``) before
    it."""

    positions: list[tuple[int, int]]
    sample_ids: np.ndarray
    spans: Spans
    doc_starts: np.ndarray
    doc_lengths: np.ndarray
    starts: np.ndarray
    stops: np.ndarray
    span_offsets: np.ndarray
    next_position: tuple[int, int] | None

    def __len__(self) -> int:
        return len(self.positions)

    def batch(self, i: int) -> tuple[Spans, np.ndarray, np.ndarray]:
        """Micro batch ``i``'s spans, document starts and document lengths (views)."""
        m = self.sample_ids.shape[1]
        lo, hi = int(self.span_offsets[i]), int(self.span_offsets[i + 1])
        sp = self.spans
        spans = Spans(sp.offsets[i * m : (i + 1) * m + 1] - lo, sp.doc_ids[lo:hi], sp.starts[lo:hi], sp.stops[lo:hi])
        return spans, self.doc_starts[lo:hi], self.doc_lengths[lo:hi]


def worker_start(plan: Plan, rank: int, start_step: int, worker: int, num_workers: int) -> tuple[int, int] | None:
    """The position of the first micro batch worker ``worker`` of ``num_workers`` reads when a rank's batch sampler
    starts at ``start_step`` (None: the plan has fewer micro batches)."""
    if num_workers < 1 or not 0 <= worker < num_workers:
        raise ValueError(f"Got worker {worker} of num_workers {num_workers}; need num_workers >= 1, worker in [0, W)")
    ids, where = plan.micro_batches_from(start_step, 0, rank, worker + 1)
    return where[worker] if len(ids) > worker else None


def worker_reads(
    plan: Plan,
    layout: Layout,
    offsets: Any,
    lengths: Any,
    rank: int,
    position: tuple[int, int],
    count: int,
    *,
    stride: int = 1,
    stop_step: int | None = None,
    eos_stored: bool = False,
) -> MicroBatchReads:
    """The reads of up to ``count`` micro batches of ``rank``: the one at ``position`` and every ``stride``-th after it
    (a worker of ``stride`` DataLoader workers), none at or after ``stop_step``. ``offsets`` and ``lengths`` are the
    index's arrays (anything indexed by an int64 array: read once, for the spans' documents); ``eos_stored`` as in
    :func:`~detsampler.gather.pack_fields`. Costs one plan call for ``count * stride`` micro batches and one layout
    locate for the ``count`` read."""
    if count < 1 or stride < 1:
        raise ValueError(f"Got count={count} and stride={stride}, both must be >= 1")
    step, micro_step = position
    ids, where = plan.micro_batches_from(step, micro_step, rank, count * stride, stop_step)
    ids = ids[::stride]
    positions = where[: len(where) - 1 : stride]
    next_position = where[len(ids) * stride] if len(where) - 1 == count * stride else None
    spans = layout.locate(ids.reshape(-1))
    doc_starts = np.asarray(offsets[spans.doc_ids], dtype=np.int64).reshape(-1)
    doc_lengths = np.asarray(lengths[spans.doc_ids], dtype=np.int64).reshape(-1)
    starts, reads = token_ranges(spans, doc_starts, doc_lengths, eos_stored)
    span_offsets = spans.offsets[:: ids.shape[1]] if len(ids) else np.zeros(1, dtype=np.int64)
    return MicroBatchReads(
        positions, ids, spans, doc_starts, doc_lengths, starts, starts + reads, span_offsets, next_position
    )


def range_blocks(
    starts: np.ndarray,
    stops: np.ndarray,
    range_offsets: np.ndarray,
    *,
    itemsize: int,
    data_offset: int,
    block_bytes: int,
) -> tuple[np.ndarray, np.ndarray]:
    """The distinct blocks each group of element ranges touches, in CSR form: group ``i`` holds ranges
    ``range_offsets[i]:range_offsets[i + 1]`` and touches blocks ``blocks[out[i]:out[i + 1]]`` (ascending), where block
    ``b`` of the stored array is its bytes ``[b * block_bytes, (b + 1) * block_bytes)`` and element ``e`` lies at byte
    ``data_offset + e * itemsize``. Empty ranges touch nothing. Vectorized: no loop over groups or ranges."""
    starts, stops = np.asarray(starts, dtype=np.int64), np.asarray(stops, dtype=np.int64)
    range_offsets = np.asarray(range_offsets, dtype=np.int64)
    group = np.repeat(np.arange(len(range_offsets) - 1, dtype=np.int64), np.diff(range_offsets))
    some = stops > starts
    first = (data_offset + starts[some] * itemsize) // block_bytes
    last = (data_offset + stops[some] * itemsize - 1) // block_bytes
    blocks = concat_ranges(first, last - first + 1)[0]
    owner = np.repeat(group[some], last - first + 1)
    span = int(blocks.max()) + 1 if blocks.size else 1
    keyed = np.unique(owner * span + blocks)  # sorted by group, then block
    counts = np.bincount(keyed // span, minlength=len(range_offsets) - 1)
    out = np.zeros(len(range_offsets), dtype=np.int64)
    np.cumsum(counts, out=out[1:])
    return out, keyed % span


class Readable(NamedTuple):
    """What the reads of one source's samples need: its layout, its documents' token ``offsets`` and ``lengths``
    (anything indexed by an int64 array) and whether its EOS is stored."""

    layout: Layout
    offsets: Any
    lengths: Any
    eos_stored: bool


@dataclass(frozen=True)
class SourceReads:
    """The reads of one source over ``k`` micro batches: micro batch ``i`` holds this source's samples at its rows
    ``rows[row_offsets[i]:row_offsets[i + 1]]`` (ascending), ``sample_ids`` (the source's own ids) in that order;
    ``spans`` are theirs, in that order, with per span ``doc_starts``, ``doc_lengths`` and the range ``[starts,
    stops)`` of the flat token array it reads; ``span_offsets[i]:span_offsets[i + 1]`` are micro batch ``i``'s."""

    rows: np.ndarray
    row_offsets: np.ndarray
    sample_ids: np.ndarray
    spans: Spans
    doc_starts: np.ndarray
    doc_lengths: np.ndarray
    starts: np.ndarray
    stops: np.ndarray
    span_offsets: np.ndarray

    def batch(self, i: int) -> tuple[Spans, np.ndarray, np.ndarray] | None:
        """Micro batch ``i``'s spans, document starts and lengths of this source (views), or None when it has no
        sample of this source."""
        a, b = int(self.row_offsets[i]), int(self.row_offsets[i + 1])
        if a == b:
            return None
        lo, hi = int(self.span_offsets[i]), int(self.span_offsets[i + 1])
        sp = self.spans
        spans = Spans(sp.offsets[a : b + 1] - lo, sp.doc_ids[lo:hi], sp.starts[lo:hi], sp.stops[lo:hi])
        return spans, self.doc_starts[lo:hi], self.doc_lengths[lo:hi]


@dataclass(frozen=True)
class PlannedReads:
    """The reads of ``k`` micro batches of one rank and worker over a plan's sources: ``positions[i]`` and
    ``sample_ids[i]`` (the plan's ids) of micro batch ``i``, ``sources[s]`` the reads of source ``s``, and
    ``next_position`` as in :class:`MicroBatchReads`."""

    positions: list[tuple[int, int]]
    sample_ids: np.ndarray
    sources: list[SourceReads]
    next_position: tuple[int, int] | None

    def __len__(self) -> int:
        return len(self.positions)


def plan_reads(
    plan: Plan,
    sources: Sequence[Readable],
    rank: int,
    position: tuple[int, int],
    count: int,
    *,
    stride: int = 1,
    stop_step: int | None = None,
    split: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]] | None = None,
) -> PlannedReads:
    """The reads of up to ``count`` micro batches of ``rank`` from ``position``, every ``stride``-th (as
    :func:`worker_reads`), over the plan's ``sources``: ``split`` maps the plan's ids to (source, the source's id)
    (``Mixture.split_ids``; None: one source, its ids the plan's). One plan call, one locate per source."""
    if count < 1 or stride < 1:
        raise ValueError(f"Got count={count} and stride={stride}, both must be >= 1")
    ids, where = plan.micro_batches_from(*position, rank, count * stride, stop_step)
    ids = ids[::stride]
    positions = where[: len(where) - 1 : stride]
    next_position = where[len(ids) * stride] if len(where) - 1 == count * stride else None
    flat = ids.reshape(-1)
    which, local = (np.zeros(flat.size, np.int64), flat) if split is None else split(flat)
    per_row = max(ids.shape[1], 1) if ids.ndim == 2 else 1
    out = [_source_reads(src, local, np.flatnonzero(which == s), per_row, len(ids)) for s, src in enumerate(sources)]
    return PlannedReads(positions, ids, out, next_position)


def _source_reads(source: Readable, local: np.ndarray, mine: np.ndarray, per_row: int, k: int) -> SourceReads:
    """The reads of the samples at flat places ``mine`` (ascending) of ``k`` micro batches of ``per_row`` samples."""
    micro, rows = np.divmod(mine, per_row)
    row_offsets = np.zeros(k + 1, dtype=np.int64)
    np.cumsum(np.bincount(micro, minlength=k), out=row_offsets[1:])
    sample_ids = local[mine]
    if not mine.size:
        empty = np.zeros(0, np.int64)
        spans = Spans(np.zeros(1, np.int64), empty, empty, empty)
        return SourceReads(rows, row_offsets, sample_ids, spans, empty, empty, empty, empty, np.zeros(k + 1, np.int64))
    spans = source.layout.locate(sample_ids)
    doc_starts = np.asarray(source.offsets[spans.doc_ids], dtype=np.int64).reshape(-1)
    doc_lengths = np.asarray(source.lengths[spans.doc_ids], dtype=np.int64).reshape(-1)
    starts, reads = token_ranges(spans, doc_starts, doc_lengths, source.eos_stored)
    span_offsets = spans.offsets[row_offsets]
    return SourceReads(
        rows, row_offsets, sample_ids, spans, doc_starts, doc_lengths, starts, starts + reads, span_offsets
    )
