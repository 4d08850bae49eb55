"""accelerate's prepare() shards any batch sampler across processes; detsampler's micro batches are already a rank's
share, so the naive use would keep 1/W of them. It is refused with a message, and the integration's helper prepares
without it."""

from __future__ import annotations

import pytest
from accelerate.data_loader import prepare_data_loader
from torch.utils.data import DataLoader

from detsampler import DeterministicBatchSampler, Plan
from tests.test_sampler_state import Ids, flat_micro_batches

PLAN = Plan(100, seed=0, global_batch_size=8, micro_batch_size=2, world_size=2)


def test_naive_prepare_with_two_processes_is_refused():
    sampler = DeterministicBatchSampler(PLAN, rank=1, stop_step=3)
    naive = prepare_data_loader(DataLoader(Ids(100), batch_sampler=sampler), num_processes=2, process_index=1)
    with pytest.raises(RuntimeError, match=r"would keep 1 of every 2 of rank 1's micro batches .*integrations\.hf"):
        next(iter(naive))


def test_unsharded_prepare_passes_every_micro_batch_through():
    from detsampler.integrations.hf import unshard

    sampler = DeterministicBatchSampler(PLAN, rank=1, stop_step=3)
    prepared = unshard(
        prepare_data_loader(DataLoader(Ids(100), batch_sampler=sampler), num_processes=2, process_index=1)
    )
    assert [mb.tolist() for mb in prepared] == flat_micro_batches(PLAN, 1, 0, 3)
