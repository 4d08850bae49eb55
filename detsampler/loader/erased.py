"""The labels of erased documents (:mod:`detsampler.index.erase`), masked where a batch is read: an erased document's
stored tokens are the index's pad id, kept only so that every length, hence every sample, stays in place; none of them
is ever a trained target again, and no label of another document targets one.

Invariant: with ``erased`` the index's erased documents, every label at a position whose input token belongs to one
of them is -100, and so is every label whose target (the next position's token) does: under ``concat`` the label at the
position before an erased document (its predecessor's end, which predicts the erased document's first token), the
sample's last position included. Nothing else in the batch changes. ``output="tokens"`` has no labels: its ``loss_mask``
(added when absent) is False at the same targets.
"""

from __future__ import annotations

import numpy as np
import torch

from detsampler.spans import Spans

__all__ = ["mask_erased"]


def _document_grid(spans: Spans, sample_len: int) -> np.ndarray:
    """The document of every position of each sample (``[B, sample_len]``; -1 where no span is: padding)."""
    grid = np.full((len(spans), sample_len), -1, dtype=np.int64)
    for i in range(len(spans)):  # NOTE: a handful of spans per sample; tokens output is concat's, spans end to end
        lo, hi = int(spans.offsets[i]), int(spans.offsets[i + 1])
        docs = np.repeat(spans.doc_ids[lo:hi], spans.stops[lo:hi] - spans.starts[lo:hi])[:sample_len]
        grid[i, : len(docs)] = docs
    return grid


def mask_erased(
    batch: dict[str, torch.Tensor], spans: Spans, erased: np.ndarray, labels_cross_documents: bool, sample_len: int
) -> dict[str, torch.Tensor]:
    """``batch`` (a PackedDataset read of the samples ``spans`` locates) with the erased documents' labels masked, in
    place (module doc); ``erased``: sorted document ids; returns ``batch``."""
    if not len(erased):
        return batch
    if "tokens" in batch:
        grid = _document_grid(spans, sample_len)
        keep = torch.from_numpy(~(np.isin(grid[:, :-1], erased) | np.isin(grid[:, 1:], erased)))
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
