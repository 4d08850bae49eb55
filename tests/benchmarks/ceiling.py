"""Benchmark 3's ceiling: the fastest way to copy a batch's token bytes out of the index's memory map, three ways.

All three read the raw memory map of the index's ``tokens.npy`` (``np.load(..., mmap_mode="r")``: no chunk checksums,
no wrapper; page cache warm: every pass reads the same bytes again) for the same batches that detsampler's concat rows
deliver, and write ``MICRO_BATCH x (seq_len + 1)`` tokens per batch into a buffer of the stored dtype (no int64
widening, no labels, position or document ids, no tensors, no DataLoader):

- ``memcpy``: one contiguous copy of as many bytes, starting where the batch's first span starts (``np.copyto``);
- ``slice copy``: a Python loop over the batch's spans, one slice copy each (EOS written in place of the virtual one);
- ``vectorized gather``: expand the spans to addresses, one fancy-index gather, EOS set by mask.

Each is timed over all batches, ``repeats`` times; the ceiling is the fastest median. The spread (min and max over the
repeats) is reported beside it.

Beside the copies, :func:`dataloader_floor` times what torch's ``DataLoader`` alone costs per batch: a dataset whose
``__getitems__`` hands over one batch made in advance (the four int64 fields, as detsampler yields them), so no loader
that delivers through a DataLoader can be faster than that floor; :func:`fields_write_floor` times the write of those
four fields alone (one block copy), what any loader yielding them pays whether or not a DataLoader carries them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

__all__ = [
    "CeilingRun",
    "ReadyBatches",
    "ceiling_runs",
    "dataloader_floor",
    "fields_write_floor",
    "gather_copy",
    "raw_tokens",
    "slice_copy",
    "span_addresses",
    "span_pieces",
    "stage_times",
]


@dataclass(frozen=True)
class CeilingRun:
    name: str
    median: float  # tokens/s
    low: float
    high: float


def raw_tokens(index) -> np.ndarray:
    """The index's stored tokens as the raw read-only memory map of their ``.npy`` file (the file the checked array
    wraps), or the array itself when it is a plain numpy array already."""
    tokens = index.tokens
    if isinstance(tokens, np.ndarray):
        return tokens
    path = getattr(tokens, "path", None)
    if path is None:
        raise TypeError(f"cannot find the file behind {type(tokens).__name__}: the ceiling needs the raw memory map")
    raw = np.load(path, mmap_mode="r", allow_pickle=False)
    if raw.dtype != tokens.dtype or raw.shape != tokens.shape:
        raise ValueError(f"{path} holds {raw.shape} {raw.dtype}, the index reads {tokens.shape} {tokens.dtype}")
    return raw


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


def span_pieces(spans, offsets: np.ndarray, lengths: np.ndarray) -> list[tuple[int, int, bool]]:
    """Per span: (its first address in the flat token array, its number of positions, whether it ends at the EOS)."""
    begin = (offsets[spans.doc_ids] + spans.starts).tolist()
    size = (spans.stops - spans.starts).tolist()
    at_eos = (spans.stops == lengths[spans.doc_ids] + 1).tolist()
    return list(zip(begin, size, at_eos))


def slice_copy(tokens: np.ndarray, pieces: list[tuple[int, int, bool]], eos_id: int, out: np.ndarray) -> np.ndarray:
    """The spans' tokens, one slice copy per span, into ``out`` (the EOS written where a span reaches it)."""
    p = 0
    for s, n, eos in pieces:
        m = n - 1 if eos else n
        out[p : p + m] = tokens[s : s + m]
        if eos:
            out[p + m] = eos_id
        p += n
    return out[:p]


def gather_copy(tokens: np.ndarray, spans, offsets: np.ndarray, lengths: np.ndarray, eos_id: int) -> np.ndarray:
    """The spans' tokens by one fancy-index gather (EOS set by mask)."""
    addr, eos = span_addresses(spans, offsets, lengths)
    got = tokens[addr]
    got[eos] = eos_id
    return got


def ceiling_runs(index, batches: list, per_batch: int, timed_tokens: int, repeats: int = 7) -> list[CeilingRun]:
    """The three copies of ``batches`` (a list of Spans) from the raw memory map of ``index.tokens``; ``per_batch``
    positions each; ``timed_tokens`` is what one pass over ``batches`` counts as delivered."""
    tokens, eos_id = raw_tokens(index), index.eos_id
    offsets = np.asarray(index.offsets, dtype=np.int64)
    lengths = np.asarray(index.lengths, dtype=np.int64)
    out = np.empty(per_batch, dtype=tokens.dtype)
    starts = [min(int(offsets[b.doc_ids[0]] + b.starts[0]), tokens.size - per_batch) for b in batches]
    pieces = [span_pieces(b, offsets, lengths) for b in batches]

    def memcpy() -> None:
        for s in starts:
            np.copyto(out, tokens[s : s + per_batch])

    def slices() -> None:
        for p in pieces:
            slice_copy(tokens, p, eos_id, out)

    def gather() -> None:
        for b in batches:
            gather_copy(tokens, b, offsets, lengths, eos_id)

    runs = []
    for name, fn in (
        ("memcpy of the same bytes", memcpy),
        ("per-span slice copy loop", slices),
        ("vectorized gather", gather),
    ):
        fn()  # warm the page cache and the code path
        runs.append(CeilingRun(name, *_rates(fn, repeats, timed_tokens)))
    return runs


class ReadyBatches:
    """A map-style dataset whose every micro batch is one block made in advance, in shared memory: ``__getitems__``
    returns it as detsampler's :class:`~detsampler.loader.dataset.MicroBatch` (four int64 ``[B, seq_len]`` fields), so
    a DataLoader over it does nothing but its own work (a worker hands over the block's handle, as detsampler's do)."""

    def __init__(self, micro_batch: int, seq_len: int, num_samples: int) -> None:
        import torch

        from detsampler.gather import FIELDS
        from detsampler.loader.dataset import MicroBatch

        self.block = torch.zeros(
            (4, micro_batch, seq_len), dtype=torch.int64
        ).share_memory_()  # a worker sends a handle
        self.num_samples = num_samples
        self._ready = MicroBatch(dict(zip(FIELDS, self.block.unbind(0))))  # views of the block, made once

    def __len__(self) -> int:
        return self.num_samples

    def __getitems__(self, sample_ids):
        return self._ready


def dataloader_floor(batch_sampler, micro_batch: int, seq_len: int, num_workers: int, repeats: int = 5) -> float:
    """Median µs per batch that ``DataLoader(ReadyBatches, batch_sampler=..., collate_fn=collate_micro_batch)`` takes
    to hand over a batch made in advance (``batch_sampler`` is iterated afresh each pass; the first batch of each pass,
    with the workers' start, is not timed)."""
    from torch.utils.data import DataLoader

    from detsampler.loader.dataset import collate_micro_batch

    dataset = ReadyBatches(micro_batch, seq_len, 1 << 30)
    times = []
    for _ in range(repeats):
        it = iter(
            DataLoader(dataset, batch_sampler=batch_sampler(), num_workers=num_workers, collate_fn=collate_micro_batch)
        )
        next(it)
        n, t0 = 0, time.perf_counter()
        for _batch in it:
            n += 1
        times.append((time.perf_counter() - t0) / max(n, 1) * 1e6)
    return float(np.median(times))


def fields_write_floor(micro_batch: int, seq_len: int, repeats: int = 50) -> float:
    """Median µs to write one micro batch's four int64 ``[B, seq_len]`` fields (one copy of a ready ``[4, B, seq_len]``
    block into another: the bytes a loader yielding them must write, with nothing computed or read from the index)."""
    src = np.ones((4, micro_batch, seq_len), dtype=np.int64)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # fault the pages in
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t0)
    return float(np.median(times)) * 1e6


def get_batch_before(dataset, sample_ids: np.ndarray) -> dict:
    """``PackedDataset.get_batch`` as it read stored tokens before ``pack_fields``: every token address through the
    checked array (a chunk test per address), ``gather_spans``' five grids, then the fields by whole-grid masks. Equal
    output (tests/test_gather.py); timed beside the current path as benchmark 3's "before"."""
    import torch

    from detsampler.gather import FIELDS
    from tests.gather_reference import fields_from_gathered, gather_spans

    index, layout = dataset.index, dataset.layout
    spans = layout.locate(np.asarray(sample_ids, dtype=np.int64))
    starts = np.asarray(index.offsets[spans.doc_ids], dtype=np.int64)
    lengths = np.asarray(index.lengths[spans.doc_ids], dtype=np.int64)
    g = gather_spans(spans, layout.sample_len, starts, lengths, index.tokens, index.eos_id, index.pad_id)
    out = fields_from_gathered(g, dataset.seq_len, layout.labels_cross_documents, dataset.restart_position_ids)
    return dict(zip(FIELDS, torch.from_numpy(out).unbind(0)))


def get_batch_per_span(dataset, sample_ids: np.ndarray) -> dict:
    """``PackedDataset.get_batch`` with the per-span pass that issue 35's vectorized pass replaced
    (tests/pack_reference.py: a slice copy per span, a slice write per piece) in place of ``pack_fields``; the locate,
    the documents and the block as today. Equal output (tests/test_pack_pass.py); benchmark 3's "per span" row."""
    import torch

    from detsampler.gather import FIELDS
    from detsampler.loader.dataset import _new_block
    from tests.pack_reference import pack_fields_per_span

    spans = dataset.layout.locate(np.asarray(sample_ids, dtype=np.int64))
    doc_starts, doc_lengths, read, _ = dataset._token_source(spans.doc_ids)
    block = _new_block((len(FIELDS), len(spans), dataset.seq_len), np.dtype(np.int64))
    pack_fields_per_span(
        spans,
        dataset.seq_len,
        dataset.layout.sample_len,
        doc_starts,
        doc_lengths,
        read,
        eos_id=dataset.index.eos_id,
        pad_id=dataset.index.pad_id,
        eos_stored=dataset._eos_stored,
        labels_cross_documents=dataset.layout.labels_cross_documents,
        restart_position_ids=dataset.restart_position_ids,
        out=block.numpy(),
    )
    return dict(zip(FIELDS, torch.unbind(block, 0)))


class _NextMicroBatch:
    """The plan stage as the loader meets it: each call takes the next micro batch of a sampler over ``plan``, a fresh
    sampler at the start of each pass (the call with ``first``)."""

    def __init__(self, plan, first: np.ndarray) -> None:
        self.plan, self.first, self.micro_batches = plan, first, None

    def __call__(self, ids: np.ndarray) -> list[int]:
        from detsampler.loader.sampler import DeterministicBatchSampler

        if self.micro_batches is None or ids is self.first:
            self.micro_batches = iter(DeterministicBatchSampler(self.plan, rank=0))
        return next(self.micro_batches)


def stage_times(dataset, plan, batches: list[np.ndarray], repeats: int = 9, tokens_dataset=None) -> dict[str, float]:
    """µs per micro batch, best of ``repeats`` interleaved passes (tests/benchmarks/read_stages.py): the plan's sample
    ids as the loader gets them (the next micro batch of a DeterministicBatchSampler, which plans a chunk of them at a
    time), each step of ``get_batch`` (``read_stages.FIELD_STAGES``), the whole ``get_batch``, the same with the
    per-span pass (:func:`get_batch_per_span`) and as it was before ``pack_fields`` (:func:`get_batch_before`); with
    ``tokens_dataset`` (the same layout, ``output="tokens"``) its ``get_batch`` too."""
    from tests.benchmarks.read_stages import FIELD_STAGES, stage_table

    others = {
        "plan": _NextMicroBatch(plan, batches[0]),
        "get_batch per span": lambda ids: get_batch_per_span(dataset, ids),
        "get_batch before": lambda ids: get_batch_before(dataset, ids),
    }
    if tokens_dataset is not None:
        others["get_batch tokens"] = tokens_dataset.get_batch
    out = stage_table(dataset, batches, repeats, others)
    out["read + fields"] = out["get_batch"] - out["locate"]
    out["stages"] = sum(out[name] for name in FIELD_STAGES if name in out)
    return out
