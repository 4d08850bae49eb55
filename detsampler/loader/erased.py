"""The labels of erased documents (:mod:`detsampler.index.erase`), masked where a batch is read: an erased document's
stored tokens are the index's pad id, kept only so that every length, hence every sample, stays in place; none of them
is ever a trained target again, and no label of another document targets one.

Invariant: with ``erased`` the index's erased documents, every label at a position whose input token belongs to one
of them is -100, and so is every label whose target (the next position's token) does: under ``concat`` the label at the
position before an erased document (its predecessor's end, which predicts the erased document's first token), the
sample's last position included. Nothing else in the batch changes. ``output="tokens"`` has no labels: its ``loss_mask``
(added when absent) is False at the same targets.

The instance filter (:mod:`detsampler.filter`) reads the sample's input tokens, the erased documents' pad ids among
them: :func:`erased_positions` marks where they are, and the read path passes those positions to the filter as
invalid (they equal nothing, as padding does), so that a run of 32 pad ids flags no sample and the verdict never
depends on the erased positions.
"""

from __future__ import annotations

import numpy as np
import torch

from detsampler.ranges import concat_ranges
from detsampler.spans import Spans

__all__ = ["erased_positions", "mask_erased"]


def erased_positions(spans: Spans, erased: np.ndarray, width: int) -> np.ndarray | None:
    """Bool ``[len(spans), width]``: True at the positions of each sample (its first ``width``, a sample's spans laid
    end to end from position 0) that belong to one of the ``erased`` documents; None when no span of the batch is one
    of theirs (the common case, decided on the spans alone). Vectorized over the erased spans: no loop per sample."""
    if not len(erased) or not spans.doc_ids.size:
        return None
    hit = np.isin(spans.doc_ids, erased)
    if not hit.any():
        return None
    length = spans.stops - spans.starts
    per_sample = np.diff(spans.offsets)
    cum = np.zeros(length.size + 1, dtype=np.int64)
    np.cumsum(length, out=cum[1:])
    begin = cum[:-1] - np.repeat(cum[spans.offsets[:-1]], per_sample)  # each span's first column in its sample
    row = np.repeat(np.arange(len(spans), dtype=np.int64), per_sample)
    first, stop = np.minimum(begin[hit], width), np.minimum(begin[hit] + length[hit], width)
    columns, _ = concat_ranges(first, stop - first)
    grid = np.zeros((len(spans), width), dtype=bool)
    grid[np.repeat(row[hit], stop - first), columns] = True
    return grid


def mask_erased(
    batch: dict[str, torch.Tensor], spans: Spans, erased: np.ndarray, labels_cross_documents: bool, sample_len: int
) -> dict[str, torch.Tensor]:
    """``batch`` (a PackedDataset read of the samples ``spans`` locates) with the erased documents' labels masked, in
    place (module doc); ``erased``: sorted document ids; returns ``batch``."""
    if not len(erased):
        return batch
    if "tokens" in batch:
        grid = erased_positions(spans, erased, sample_len)
        if grid is None:
            keep = torch.ones((len(spans), sample_len - 1), dtype=torch.bool)
        else:
            keep = torch.from_numpy(~(grid[:, :-1] | grid[:, 1:]))
        batch["loss_mask"] = batch["loss_mask"] & keep if "loss_mask" in batch else keep
        return batch
    docs = batch["document_ids"].numpy()
    hit = np.isin(docs, erased)
    if labels_cross_documents:  # a label's target is the next position's token, the sample's last one included
        last = spans.doc_ids[np.asarray(spans.offsets[1:], dtype=np.int64) - 1]
        following = np.concatenate([docs[:, 1:], np.asarray(last, dtype=np.int64)[:, None]], axis=1)
        hit |= np.isin(following, erased)
    np.putmask(batch["labels"].numpy(), hit, -100)
    if "loss_mask" in batch:
        batch["loss_mask"].masked_fill_(torch.from_numpy(hit), False)
    return batch
