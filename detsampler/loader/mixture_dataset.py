"""The torch adapter for mixtures: one map-style dataset over the sources' datasets, indexed by global sample id."""

from __future__ import annotations

import os
import weakref
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

    With ``prefetch=PrefetchConfig(...)`` and the ``plan`` over ``mixture`` the batch sampler reads (each source's
    dataset a ``PackedDataset``), one prefetcher per process reads ahead every source's micro batches in an object
    store, with one budget and one cache for all (:mod:`detsampler.loader.prefetch`); the batches are the same, byte
    for byte. :meth:`prefetch_stats` says what this process's prefetcher did.
    """

    def __init__(self, datasets: Sequence[Any], mixture: Mixture, *, prefetch: Any = None, plan: Any = None) -> None:
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
        _check_prefetch(prefetch, plan, mixture, self.datasets)
        self.prefetch, self.plan = prefetch, plan
        self._prefetcher: tuple[int, Any] | None = None  # (pid, its prefetcher): made in each process

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_prefetcher": None}  # threads and clients never travel: each process makes its own

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
        lookahead = self._lookahead()
        planned = None if lookahead is None else lookahead.take(indices)
        parts, wheres = [], []
        try:
            for k in np.unique(source):
                where = np.flatnonzero(source == k)
                ds = self.datasets[int(k)]
                local = sample[where]
                if planned is not None:  # the spans planned for source k's rows, its tokens through the prefetcher
                    from detsampler.loader.dataset import MicroBatch

                    ahead = (planned.reads[int(k)], lookahead.readers(int(k)))
                    parts.append(MicroBatch(ds._read_batch(local, ahead)))
                else:
                    local = local.tolist()
                    parts.append(ds.__getitems__(local) if hasattr(ds, "__getitems__") else [ds[i] for i in local])
                wheres.append(where)
        finally:
            if planned is not None:
                lookahead.done(planned)
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

    # -- prefetch
    def _lookahead(self) -> Any:
        """This process's prefetcher over every source (made on its first batch), or None."""
        if self.prefetch is None:
            return None
        made = self._prefetcher
        if made is None or made[0] != os.getpid() or getattr(made[1], "closed", 0):
            from detsampler.loader.prefetch import make_prefetcher, target_of

            targets = [target_of(ds.index, ds.layout) for ds in self.datasets]
            where = ", ".join(str(ds.index.path) for ds in self.datasets)
            prefetcher = make_prefetcher(targets, self.plan, self.prefetch, split=self.mixture.split_ids, where=where)
            if prefetcher is not None:  # NOTE: its threads hold the prefetcher, not this dataset
                weakref.finalize(self, _close, weakref.ref(prefetcher))
            self._prefetcher = (os.getpid(), prefetcher)
        return self._prefetcher[1]

    def prefetch_stats(self) -> Any:
        """What this process's prefetcher did (None without prefetch, before the first batch, or when no source is in
        an object store)."""
        made = self._prefetcher[1] if self._prefetcher and self._prefetcher[0] == os.getpid() else None
        return None if made is None else made.summary()

    def close(self) -> None:
        """Stop this process's prefetcher (its threads, after the fetches under way)."""
        if self._prefetcher and self._prefetcher[0] == os.getpid() and self._prefetcher[1] is not None:
            self._prefetcher[1].close()


def _close(ref: weakref.ref) -> None:
    made = ref()
    if made is not None:
        made.close()


def _check_prefetch(prefetch: Any, plan: Any, mixture: Mixture, datasets: list[Any]) -> None:
    """Refuse a prefetch setting that could not read this mixture's micro batches ahead (naming why)."""
    if prefetch is None:
        if plan is not None:
            raise ValueError(
                "plan= is what prefetch reads ahead: give prefetch=PrefetchConfig(...) with it, or neither"
            )
        return
    from detsampler.loader.prefetch import PrefetchConfig
    from detsampler.plan import Plan

    if not isinstance(prefetch, PrefetchConfig):
        raise TypeError(f"prefetch must be a PrefetchConfig or None, got {type(prefetch).__name__}")
    if not isinstance(plan, Plan):
        raise ValueError(
            "prefetch reads ahead the micro batches of the plan: pass plan= (the Plan over this mixture the batch"
            f" sampler reads), got {type(plan).__name__}"
        )
    stream = plan.stream
    if getattr(stream, "sizes", None) != mixture.sizes or stream.num_samples != mixture.num_samples:
        raise ValueError(
            f"the plan draws from {stream.num_samples} samples ({getattr(stream, 'num_sources', 1)} source(s)), the"
            f" mixture has {mixture.num_samples} over {mixture.num_sources} sources: prefetch needs the plan over"
            " this mixture"
        )
    for k, ds in enumerate(datasets):
        if not hasattr(ds, "_read_batch") or getattr(ds.index, "tokens", None) is None:
            raise ValueError(
                f"datasets[{k}] is not a PackedDataset over stored tokens ({type(ds).__name__}): prefetch reads ahead"
                " the stored tokens of each source's PackedDataset"
            )
    prefetch.node()  # a node cache's path that cannot hold it: refused here, not in each worker's first batch


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
