"""Where a micro batch's microseconds go: ``PackedDataset.get_batch`` (stored tokens, ``output="fields"``) run step
by step, each step timed, for benchmarks 3, 14 and 15's stage tables.

:func:`staged_batch` makes the calls ``get_batch`` makes (``PackedDataset._fields_batch`` and
:func:`detsampler.gather.pack_fields`), in the same order, with a clock read between steps; its batch equals
``get_batch``'s (tests/test_bench_harness.py), so the table cannot drift from the code it times. :func:`stage_table`
interleaves it pass by pass with the whole ``get_batch`` (and any other callables given), best of ``repeats`` passes
each, and returns µs per micro batch. The clock is the reading thread's CPU time (``time.thread_time``), less the
clock's own cost per reading: on a machine shared with other processes, wall time per step mostly measures how often
the step was preempted (a sum of per-step best wall times came out at half the whole read's best), while CPU time
measures the step.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np

__all__ = ["FIELD_STAGES", "MASK_STAGES", "stage_table", "staged_batch"]

FIELD_STAGES = (
    "locate",
    "documents",
    "cells",
    "chunk checks",
    "token join",
    "block + tensors",
    "input ids",
    "labels",
    "document ids",
    "position ids",
    "padding",
)
MASK_STAGES = ("mask read + join", "loss_mask tensor", "instance filter", "redaction")


CLOCK = time.thread_time


def _clock_cost(samples: int = 2000) -> float:
    """Seconds one reading of :data:`CLOCK` costs (the best of five rounds)."""
    best = float("inf")
    for _ in range(5):
        t0 = CLOCK()
        for _ in range(samples):
            CLOCK()
        best = min(best, (CLOCK() - t0) / samples)
    return best


class _Laps:
    """Adds the CPU time since the last lap, less one clock reading, to ``acc[name]``."""

    cost = 0.0

    def __init__(self, acc: dict[str, float]) -> None:
        self.acc, self.t = acc, CLOCK()

    def __call__(self, name: str) -> None:
        now = CLOCK()
        self.acc[name] = self.acc.get(name, 0.0) + max(now - self.t - self.cost, 0.0)
        self.t = now


def staged_batch(dataset, ids: np.ndarray, acc: dict[str, float], redact: Callable | None = None) -> dict:
    """``dataset.get_batch(ids)`` step by step (a stored-token index, ``output="fields"``, no prefetch), each step's
    seconds added to ``acc``; ``redact(batch)`` (optional) is timed as ``"redaction"`` after it."""
    import torch

    from detsampler import gather
    from detsampler.cells import lay_out
    from detsampler.loader.dataset import _new_block

    lap = _Laps(acc)
    spans = dataset.layout.locate(np.asarray(ids, dtype=np.int64))
    lap("locate")
    doc_starts, doc_lengths, read, read_mask = dataset._token_source(spans.doc_ids)
    lap("documents")
    layout, index = dataset.layout, dataset.index
    cells = lay_out(spans, layout.sample_len, doc_starts, doc_lengths, dataset._eos_stored)
    lap("cells")
    flat = read(cells.src, cells.src + cells.reads)
    lap("chunk checks")
    mask = None
    if read_mask is not None:
        chat = dataset._chat
        eos = int(chat.eos_trained if chat is not None else index.loss_mask_eos)
        mask = gather._mask_cells(cells, spans, read_mask, None, eos, chat is not None, True)
        lap("mask read + join")
    tokens, padded = gather._token_grid(cells, flat, index.eos_id, index.pad_id)
    lap("token join")
    block = _new_block((len(gather.FIELDS), len(spans), dataset.seq_len), np.dtype(np.int64))
    out = block.numpy()
    lap("block + tensors")
    gather._write_inputs(out[0], tokens, dataset.seq_len)
    lap("input ids")
    gather._write_labels(cells, out[1], tokens, mask)
    lap("labels")
    sliced = gather._write_documents(cells, spans.doc_ids, out[3])
    lap("document ids")
    gather._write_positions(cells, out[2], dataset.restart_position_ids)
    lap("position ids")
    pad_id = None if padded else index.pad_id
    gather._write_padding(cells, out, layout.labels_cross_documents, dataset.restart_position_ids, pad_id, sliced)
    lap("padding")
    batch = dict(zip(gather.FIELDS, block.unbind(0)))
    lap("block + tensors")
    if dataset.instance_filter is not None:
        lengths = None if layout.labels_cross_documents else spans.num_tokens
        flagged = dataset.instance_filter.flags(out[0], lengths=lengths)
        if flagged.any():
            out[1][flagged] = gather.IGNORE_INDEX
        if dataset.instance_mask:
            batch["instance_mask"] = torch.from_numpy(~flagged)
        lap("instance filter")
    if mask is not None:
        batch["loss_mask"] = torch.from_numpy(out[1] != gather.IGNORE_INDEX)
        lap("loss_mask tensor")
    if redact is not None:
        redact(batch)
        lap("redaction")
    return batch


def stage_table(
    dataset,
    batches: Sequence[np.ndarray],
    repeats: int = 9,
    others: dict[str, Callable] | None = None,
    redact: Callable | None = None,
) -> dict[str, float]:
    """µs per micro batch of each step of :func:`staged_batch` over ``batches``, of the whole ``get_batch``
    (``"get_batch"``) and of each of ``others`` (name -> callable of the sample ids), interleaved pass by pass, best of
    ``repeats`` passes each."""
    runs: dict[str, list[float]] = {}
    _Laps.cost = _clock_cost()
    whole = {"get_batch": dataset.get_batch, **(others or {})}
    for _ in range(repeats):
        acc: dict[str, float] = {}
        for ids in batches:
            staged_batch(dataset, ids, acc, redact)
        for name, seconds in acc.items():
            runs.setdefault(name, []).append(seconds)
        for name, fn in whole.items():
            t0 = CLOCK()
            for ids in batches:
                fn(ids)
            runs.setdefault(name, []).append(CLOCK() - t0)
    return {name: min(v) / len(batches) * 1e6 for name, v in runs.items()}
