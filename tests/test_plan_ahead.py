"""Planning a chunk of micro batches in one stream call (``Plan.micro_batches_from``, what the sampler does) gives
exactly the micro batches ``Plan.micro_batch`` gives one at a time, in the sampler's order."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from detsampler.loader.sampler import DeterministicBatchSampler
from detsampler.mixture import Mixture
from detsampler.plan import Plan
from tests.strategies import integer_weights, plans, skip_ranges


def _after(plan: Plan, step: int, micro_step: int) -> tuple[int, int]:
    micro_step += 1
    return (step + 1, 0) if micro_step == plan.num_micro_steps(step) else (step, micro_step)


def _check_chunk(plan: Plan, rank: int, step: int, micro_step: int, count: int, stop_step: int | None) -> None:
    ids, where = plan.micro_batches_from(step, micro_step, rank, count, stop_step)
    assert len(where) == len(ids) + 1 and ids.shape == (len(ids), plan.micro_batch_size)
    position = (step, micro_step)
    for i, row in enumerate(ids):
        assert where[i] == position
        assert row.tolist() == plan.micro_batch(*position, rank).tolist()
        position = _after(plan, *position)
    assert where[-1] == position
    expected = count if stop_step is None else min(count, plan.micro_steps_between(step, stop_step) - micro_step)
    assert len(ids) == expected


@given(plan=plans(schedule=True), skips=skip_ranges(), data=st.data())
def test_chunk_equals_micro_batches(plan, skips, data):
    plan = Plan(
        plan.stream.num_samples,
        plan.seed,
        plan.global_batch_size,
        plan.micro_batch_size,
        plan.world_size,
        plan.batch_size_schedule,
        skips,
    )
    step = data.draw(st.integers(0, 40))
    micro_step = data.draw(st.integers(0, plan.num_micro_steps(step) - 1))
    stop_step = data.draw(st.one_of(st.none(), st.integers(step + 1, step + 8)))
    count = data.draw(st.integers(1, 20))
    _check_chunk(plan, data.draw(st.integers(0, plan.world_size - 1)), step, micro_step, count, stop_step)


@given(weights=integer_weights(), seed=st.integers(0, 2**64 - 1), data=st.data())
def test_chunk_equals_micro_batches_of_a_mixture(weights, seed, data):
    sizes = data.draw(st.lists(st.integers(1, 60), min_size=len(weights), max_size=len(weights)))
    plan = Plan(source=Mixture(sizes, weights, seed), global_batch_size=12, micro_batch_size=3, world_size=2)
    _check_chunk(
        plan, data.draw(st.integers(0, 1)), data.draw(st.integers(0, 30)), 1, data.draw(st.integers(1, 9)), None
    )


def test_chunk_over_large_epochs_equals_micro_batches():
    """Above the small-domain shuffle (n > 1024) a chunk goes through the numpy network and one micro batch through
    Python ints, over epoch boundaries (one key per epoch): the same values."""
    plan = Plan(1500, seed=7, global_batch_size=64, micro_batch_size=8, world_size=2)
    for start in (0, 20, 40):
        _check_chunk(plan, 1, start, 2, 64, None)


def test_sampler_restored_mid_chunk_yields_the_plan():
    plan = Plan(1500, seed=3, global_batch_size=16, micro_batch_size=4, world_size=2)
    sampler = DeterministicBatchSampler(plan, rank=1, stop_step=200)
    it = iter(sampler)
    [next(it) for _ in range(5)]
    state = it.state_dict()
    [next(it) for _ in range(7)]
    it.load_state_dict(state)
    got = [next(it) for _ in range(300)]
    step, micro_step = 2, 1
    assert state == {"step": step, "samples_in_step": micro_step * 8}
    for ids in got:
        assert ids == plan.micro_batch(step, micro_step, 1).tolist()
        step, micro_step = _after(plan, step, micro_step)
    assert len(list(it)) == (200 - step) * 2 - micro_step
