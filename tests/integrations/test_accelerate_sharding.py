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


def test_a_plan_whose_step_is_not_one_trainer_step_is_refused_with_the_value_to_set(tmp_path):
    from transformers import TrainingArguments

    from detsampler.integrations.hf import trainer_plan

    args = TrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=2,
        gradient_accumulation_steps=3,
        use_cpu=True,
        report_to=[],
    )
    with pytest.raises(
        ValueError,
        match=r"2 processes x 2 per device x 2 micro steps: set gradient_accumulation_steps=2 " r"\(it is 3\)",
    ):
        trainer_plan(PLAN, args, num_processes=2)
    args.gradient_accumulation_steps = 4
    assert trainer_plan(PLAN, args, num_processes=1).num_micro_steps(0) == 4  # the same plan on 1 process
