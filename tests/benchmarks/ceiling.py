"""Benchmark 3's ceiling: the fastest way to copy a batch's token bytes out of the index's memory map, three ways.

All three read the index's own ``tokens`` memory map (page cache warm: every pass reads the same bytes again) for the
same batches that detsampler's concat rows deliver, and write ``MICRO_BATCH x (seq_len + 1)`` tokens per batch into a
buffer of the stored dtype (no int64 widening, no labels, position or document ids, no tensors, no DataLoader):

- ``memcpy``: one contiguous copy of as many bytes, starting where the batch's first span starts (``np.copyto``);
- ``slice copy``: a Python loop over the batch's spans, one slice copy each (EOS written in place of the virtual one);
- ``vectorized gather``: expand the spans to addresses, one fancy-index gather, EOS set by mask.

Each is timed over all batches, ``repeats`` times; the ceiling is the fastest median. The spread (min and max over the
repeats) is reported beside it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

__all__ = ["CeilingRun", "ceiling_runs", "span_addresses"]


@dataclass(frozen=True)
class CeilingRun:
    name: str
    median: float  # tokens/s
    low: float
    high: float


def span_addresses(spans, offsets: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per token position of ``spans``: its address in the flat token array, and whether it is a document's EOS."""
    n = (spans.stops - spans.starts).astype(np.int64)
    span_of = np.repeat(np.arange(n.size), n)
    pos = spans.starts[span_of] + np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n)
    doc = spans.doc_ids[span_of]
    eos = pos == lengths[doc]
    return np.where(eos, 0, offsets[doc] + pos), eos


def _rates(fn, repeats: int, tokens: int) -> tuple[float, float, float]:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    rates = tokens / np.asarray(times)
    return float(np.median(rates)), float(rates.min()), float(rates.max())


def ceiling_runs(index, batches: list, per_batch: int, timed_tokens: int, repeats: int = 7) -> list[CeilingRun]:
    """The three copies of ``batches`` (a list of Spans) from ``index.tokens``; ``per_batch`` positions each."""
    tokens, eos_id = index.tokens, index.eos_id
    offsets = np.asarray(index.offsets, dtype=np.int64)
    lengths = np.asarray(index.lengths, dtype=np.int64)
    out = np.empty(per_batch, dtype=tokens.dtype)
    starts = [min(int(offsets[b.doc_ids[0]] + b.starts[0]), tokens.size - per_batch) for b in batches]
    pieces = []
    for b in batches:
        begin = (offsets[b.doc_ids] + b.starts).tolist()
        size = (b.stops - b.starts).tolist()
        at_eos = (b.stops == lengths[b.doc_ids] + 1).tolist()
        pieces.append(list(zip(begin, size, at_eos)))

    def memcpy() -> None:
        for s in starts:
            np.copyto(out, tokens[s : s + per_batch])

    def slice_copy() -> None:
        for spans in pieces:
            p = 0
            for s, n, eos in spans:
                m = n - 1 if eos else n
                out[p : p + m] = tokens[s : s + m]
                if eos:
                    out[p + m] = eos_id
                p += n

    def gather() -> None:
        for b in batches:
            addr, eos = span_addresses(b, offsets, lengths)
            got = tokens[addr]
            got[eos] = eos_id

    runs = []
    for name, fn in (("memcpy of the same bytes", memcpy), ("per-span slice copy loop", slice_copy), ("vectorized gather", gather)):
        fn()  # warm the page cache and the code path
        runs.append(CeilingRun(name, *_rates(fn, repeats, timed_tokens)))
    return runs
