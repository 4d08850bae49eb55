"""The batch sampler in a real torch DataLoader: resume at step k equals the uninterrupted run, with 0 or 2 workers."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, Dataset, get_worker_info

from detsampler.loader.sampler import DeterministicBatchSampler
from detsampler.plan import Plan
from tests.strategies import plans


class EchoDataset(Dataset):
    """Sample i is (i, the id of the worker that fetched it): lets a test see what each worker read."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        info = get_worker_info()
        return torch.tensor([i, -1 if info is None else info.id])


def run(plan: Plan, rank: int, start_step: int, stop_step: int, num_workers: int) -> list[tuple[int, np.ndarray]]:
    sampler = DeterministicBatchSampler(plan, rank, start_step=start_step, stop_step=stop_step)
    loader = DataLoader(EchoDataset(plan.stream.num_samples), batch_sampler=sampler, num_workers=num_workers)
    return [(step, torch.cat(batches).numpy()) for step, batches in sampler.steps(loader)]


@settings(max_examples=10)
@given(plan=plans(max_samples=60), data=st.data())
def test_resumed_dataloader_yields_the_uninterrupted_batches(plan, data):
    num_steps = data.draw(st.integers(min_value=1, max_value=6))
    resume = data.draw(st.integers(min_value=0, max_value=num_steps))
    num_workers = data.draw(st.sampled_from([0, 2]))
    rank = data.draw(st.integers(min_value=0, max_value=plan.world_size - 1))
    full = run(plan, rank, 0, num_steps, num_workers)
    resumed = run(plan, rank, resume, num_steps, num_workers)
    assert [s for s, _ in resumed] == list(range(resume, num_steps))
    for (s, got), (_, want) in zip(resumed, full[resume:]):
        np.testing.assert_array_equal(got[:, 0], want[:, 0])
    # The batches are the plan's, micro step by micro step; workers took them round-robin from the resume step.
    for step, got in resumed:
        want = np.concatenate([plan.micro_batch(step, a, rank) for a in range(plan.num_micro_steps(step))])
        np.testing.assert_array_equal(got[:, 0], want)
        if num_workers:
            per_micro = got[:, 1].reshape(plan.num_micro_steps(step), plan.micro_batch_size)
            for worker in range(num_workers):
                expected = plan.worker_micro_batches(step, rank, worker, num_workers, start_step=resume)
                assert sorted(np.flatnonzero(per_micro[:, 0] == worker).tolist()) == expected
                assert (per_micro == per_micro[:, :1]).all()  # a micro batch is fetched by one worker


@settings(max_examples=10)
@given(plan=plans(max_samples=60), data=st.data())
def test_resume_on_another_world_size_continues_the_same_global_batches(plan, data):
    gbs = plan.global_batch_size
    world_size = data.draw(st.sampled_from([w for w in range(1, gbs + 1) if gbs % w == 0]))
    other = plan.with_world(world_size, 1)
    resume = data.draw(st.integers(min_value=0, max_value=4))
    for step in range(resume, resume + 3):
        before = np.concatenate([run(plan, r, step, step + 1, 0)[0][1][:, 0] for r in range(plan.world_size)])
        after = np.concatenate([run(other, r, step, step + 1, 0)[0][1][:, 0] for r in range(world_size)])
        np.testing.assert_array_equal(np.sort(before), np.sort(after))


def test_state_dict_names_the_next_step_and_round_trips():
    plan = Plan(100, 0, 4, 2, 1)
    sampler = DeterministicBatchSampler(plan, 0, start_step=3)
    assert sampler.state_dict() == {"step": 3, "samples_in_step": 0}
    loader = DataLoader(EchoDataset(100), batch_sampler=sampler)
    for step, _ in sampler.steps(loader):
        assert sampler.state_dict() == {"step": step + 1, "samples_in_step": 0}
        if step == 6:
            break
    state = sampler.state_dict()
    fresh = DeterministicBatchSampler(plan, 0)
    fresh.load_state_dict(state)
    first = next(iter(DataLoader(EchoDataset(100), batch_sampler=fresh)))
    np.testing.assert_array_equal(first[:, 0].numpy(), plan.micro_batch(7, 0, 0))


def test_length_and_errors():
    plan = Plan(100, 0, 8, 2, 2)
    assert len(DeterministicBatchSampler(plan, 1, start_step=2, stop_step=7)) == 5 * 2
    with pytest.raises(TypeError, match="endless"):
        len(DeterministicBatchSampler(plan, 0))
    with pytest.raises(ValueError, match=r"Got rank 2, allowed ranks are in \[0, 2\)"):
        DeterministicBatchSampler(plan, 2)
    with pytest.raises(ValueError, match="start_step must be >= 0"):
        DeterministicBatchSampler(plan, 0, start_step=-1)
