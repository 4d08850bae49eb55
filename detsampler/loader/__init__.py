"""The torch adapters: what a ``torch.utils.data.DataLoader`` needs, over the numpy core and the index.

- :mod:`~detsampler.loader.sampler`: :class:`DeterministicBatchSampler`, a rank's micro batches from any step;
- :mod:`~detsampler.loader.dataset`: :class:`PackedDataset`, a map-style dataset of packed samples over a token index;
- :mod:`~detsampler.loader.mixture_dataset`: :class:`MixtureDataset`, the same over a mixture of sources;
- :mod:`~detsampler.loader.prefetch`: :class:`PrefetchConfig` and the exact lookahead prefetcher of an index in an
  object store;
- :mod:`~detsampler.loader.calibrate`: the balanced plan's cost model, fitted by timing attention masked per document.

(Named ``loader``, not ``torch``: a sub-package called ``torch`` would read as the real one in every traceback and
``from . import torch``.)
"""

from __future__ import annotations

from detsampler.loader.dataset import PackedDataset, collate_micro_batch
from detsampler.loader.mixture_dataset import MixtureDataset
from detsampler.loader.prefetch import PrefetchConfig
from detsampler.loader.sampler import DeterministicBatchSampler, PlannedIds

__all__ = [
    "DeterministicBatchSampler",
    "MixtureDataset",
    "PackedDataset",
    "PlannedIds",
    "PrefetchConfig",
    "collate_micro_batch",
]
