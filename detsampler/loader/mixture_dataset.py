"""The torch adapter for mixtures: one map-style dataset over the sources' datasets, indexed by global sample id."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from detsampler.checks import is_int
from detsampler.mixture import Mixture

__all__ = ["MixtureDataset"]


class MixtureDataset(Dataset):
    """``dataset[g]`` is ``datasets[k][i]`` for the global sample id ``g = offset_k + i`` of ``mixture``.

    ``datasets[k]`` is source ``k``'s map-style dataset (a ``PackedDataset`` over that source's layout, say) and must
    hold exactly ``mixture.sizes[k]`` samples. A DataLoader over it with ``batch_sampler=DeterministicBatchSampler(plan,
    rank)`` (``plan`` built over ``mixture``) reads each source's samples in that source's own keyed order. Batched
    fetches (``__getitems__``) are grouped by source and returned in the order asked.
    """

    def __init__(self, datasets: Sequence[Any], mixture: Mixture) -> None:
        if len(datasets) != mixture.num_sources:
            raise ValueError(
                f"datasets must have one dataset per mixture source ({mixture.num_sources}), got {len(datasets)}"
            )
        for k, (ds, n) in enumerate(zip(datasets, mixture.sizes)):
            if len(ds) != n:
                raise ValueError(f"datasets[{k}] has {len(ds)} samples but mixture source {k} has {n}")
        for k, ds in enumerate(datasets):
            if not _reads(ds, mixture.sources[k]):
                found = [j for j, other in enumerate(datasets) if _reads(other, mixture.sources[k])]
                where = f" (datasets[{found[0]}] reads source {k}'s)" if found else ""
                raise ValueError(
                    f"datasets[{k}] reads another layout than mixture source {k}{where}: give the datasets in the order"
                    " of the mixture's sources"
                )
        self.datasets = list(datasets)
        self.mixture = mixture

    def __len__(self) -> int:
        return self.mixture.num_samples

    def __getitem__(self, index: int) -> Any:
        if not is_int(index):
            raise ValueError(f"Got sample id {index!r} ({type(index).__name__}), sample ids must be integers")
        source, sample = self.mixture.split_ids(np.asarray([index], dtype=np.int64))
        return self.datasets[int(source[0])][int(sample[0])]

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        """The samples of ``indices`` in order. When every source returns a batched ``MicroBatch`` (``PackedDataset``
        does), so does this: one dict of ``[B, seq_len]`` tensors, the sources' rows put back in the order asked."""
        ids = np.asarray(indices)
        if ids.size and ids.dtype.kind not in "iu":
            raise ValueError(f"Got sample ids of dtype {ids.dtype}, sample ids must be integers")
        source, sample = self.mixture.split_ids(ids.astype(np.int64, copy=False))
        parts, wheres = [], []
        for k in np.unique(source):
            where = np.flatnonzero(source == k)
            ds = self.datasets[int(k)]
            local = sample[where].tolist()
            parts.append(ds.__getitems__(local) if hasattr(ds, "__getitems__") else [ds[i] for i in local])
            wheres.append(where)
        if parts and all(isinstance(getattr(p, "batch", None), dict) for p in parts):
            from detsampler.loader.dataset import MicroBatch

            order = torch.as_tensor(np.argsort(np.concatenate(wheres), kind="stable"))
            batches = _with_loss_masks([p.batch for p in parts])
            return MicroBatch({key: torch.cat([b[key] for b in batches])[order] for key in batches[0]})
        out: list[Any] = [None] * len(indices)
        for where, items in zip(wheres, parts):
            for j, item in zip(where.tolist(), items):
                out[j] = item
        return out


def _with_loss_masks(batches: list[dict]) -> list[dict]:
    """The sources' batches, each with a ``loss_mask`` when any has one (chat data mixed with plain text): a plain
    source's trains every label it has (``labels != -100``; with ``output="tokens"``, every target)."""
    if not any("loss_mask" in b for b in batches):
        return batches
    out = []
    for b in batches:
        if "loss_mask" not in b:
            b = dict(b)
            b["loss_mask"] = b["labels"] != -100 if "labels" in b else torch.ones_like(b["tokens"][:, 1:], dtype=bool)
        out.append(b)
    return out


def _reads(dataset: Any, source: Any) -> bool:
    """Whether ``dataset`` reads mixture source ``source``: the same layout object, or, for a dataset over a layout
    (``PackedDataset``) and a layout source, layouts of the same config over the same index (its fingerprint) or the
    same document lengths (in RAM). A source given as a count, or a dataset without a layout, is checked by size
    alone."""
    layout = getattr(dataset, "layout", None)
    if layout is None or layout is source or not hasattr(source, "config"):
        return True
    if layout.config != source.config or layout.num_samples != source.num_samples:
        return False
    mine, theirs = getattr(layout, "index_fingerprint", None), getattr(source, "index_fingerprint", None)
    if mine is not None or theirs is not None:
        return mine == theirs
    return layout.num_documents == source.num_documents and np.array_equal(layout.lengths, source.lengths)
