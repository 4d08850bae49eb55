"""The data of the multi-process integration tests: a PackedDataset (bestfit, 8 tokens) of a real index, whose batches
also carry their sample ids, so that each run records which samples it trained."""

from __future__ import annotations

import torch
from torch.utils.data import Dataset

from detsampler import LayoutConfig, PackedDataset, Plan
from detsampler.index.reader import TokenIndex
from detsampler.layout import make_layout

SEQ_LEN = 8


class Tagged(PackedDataset):
    """A PackedDataset whose batches hold ``sample_ids`` besides the four fields."""

    def get_batch(self, sample_ids):
        return {**super().get_batch(sample_ids), "sample_ids": torch.as_tensor(sample_ids, dtype=torch.long)}


def data(index_dir: str, kind: str = "bestfit") -> Tagged:
    index = TokenIndex.open(index_dir)
    return Tagged(index, make_layout(LayoutConfig(kind=kind, seq_len=SEQ_LEN), index.lengths))


def plan_of(dataset: Dataset, seed: int, micro_batch_size: int = 2) -> Plan:
    """The plan of the runs (re-cut for each run's processes and accumulation)."""
    return Plan(len(dataset), seed=seed, global_batch_size=8, micro_batch_size=micro_batch_size)
