"""The batch sampler over a balanced plan, in a real DataLoader: resume at any step, on another world size, and the
mid-step states that only the cut that saved them can name."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from detsampler import LayoutConfig, Plan, make_layout
from detsampler.balance import Balance, CostModel
from detsampler.loader.sampler import DeterministicBatchSampler
from tests.strategies import balanced_plans
from tests.test_sampler import run


@settings(max_examples=10)
@given(case=balanced_plans(), data=st.data())
def test_a_resumed_dataloader_yields_the_uninterrupted_balanced_batches(case, data):
    plan, _ = case
    num_steps = data.draw(st.integers(1, 6))
    resume = data.draw(st.integers(0, num_steps))
    num_workers = data.draw(st.sampled_from([0, 2]))
    rank = data.draw(st.integers(0, plan.world_size - 1))
    full = run(plan, rank, 0, num_steps, num_workers)
    resumed = run(plan, rank, resume, num_steps, num_workers)
    assert [s for s, _ in resumed] == list(range(resume, num_steps))
    for (step, got), (_, want) in zip(resumed, full[resume:]):
        np.testing.assert_array_equal(got[:, 0], want[:, 0])
        plan_ids = np.concatenate([plan.micro_batch(step, a, rank) for a in range(plan.num_micro_steps(step))])
        np.testing.assert_array_equal(got[:, 0], plan_ids)


@settings(max_examples=10)
@given(case=balanced_plans(), data=st.data())
def test_a_resume_on_another_world_size_reads_the_same_global_batches(case, data):
    """World size W -> any divisor of the batch (1 included): each step's samples, all ranks together, are the same."""
    plan, _ = case
    gbs = plan.global_batch_size
    world_size = data.draw(st.sampled_from([w for w in range(1, gbs + 1) if gbs % w == 0]))
    other = plan.with_world(world_size, 1)
    resume = data.draw(st.integers(0, 4))
    for step in range(resume, resume + 3):
        before = np.concatenate([run(plan, r, step, step + 1, 0)[0][1][:, 0] for r in range(plan.world_size)])
        after = np.concatenate([run(other, r, step, step + 1, 0)[0][1][:, 0] for r in range(world_size)])
        np.testing.assert_array_equal(np.sort(before), np.sort(after))


def _plan(world_size: int, micro_batch_size: int) -> Plan:
    layout = make_layout(LayoutConfig(kind="bestfit", seq_len=64), np.random.default_rng(2).integers(1, 300, 300))
    balance = Balance(layout, CostModel(attention=0.5))
    return Plan(layout.num_samples, 0, 12, micro_batch_size, world_size, balance=balance)


def test_a_mid_step_state_records_its_cut_and_resumes_only_on_it():
    """4 of step 1's 12 samples consumed at world size 2: which 4 depends on how the step was dealt, so the state names
    the cut, resumes on it, and is refused on another (at a step boundary any cut resumes)."""
    plan = _plan(2, 2)
    samplers = [DeterministicBatchSampler(plan, r) for r in range(2)]
    its = [iter(s) for s in samplers]
    for it in its:
        for _ in range(4):
            next(it)
    state = samplers[0].state_dict()
    assert state == {"step": 1, "samples_in_step": 4, "world_size": 2, "micro_batch_size": 2}
    rest = sorted(i for it in its for _ in range(2) for i in next(it))
    again = [DeterministicBatchSampler(plan, r) for r in range(2)]
    for sampler in again:
        sampler.load_state_dict(state)
    resumed = [iter(s) for s in again]
    assert sorted(i for it in resumed for _ in range(2) for i in next(it)) == rest
    with pytest.raises(
        ValueError, match=r"mid-step 1 of a balanced plan dealt for world_size, micro_batch_size = 2, 2"
    ):
        DeterministicBatchSampler(plan.with_world(1, 4), 0).load_state_dict(state)
    with pytest.raises(ValueError, match=r"dealt for world_size, micro_batch_size = None, None"):
        DeterministicBatchSampler(plan, 0).load_state_dict({"step": 1, "samples_in_step": 4})
    fresh = DeterministicBatchSampler(plan.with_world(1, 4), 0)
    fresh.load_state_dict({"step": 2, "samples_in_step": 0})
    assert fresh.state_dict() == {"step": 2, "samples_in_step": 0}
