"""The plan: every sample once per epoch across ranks and steps, world-size independence, ramps,
extension, O(1) seek."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from detsampler.plan import Plan
from tests.strategies import plans, seeds


def all_micro_batches(plan: Plan, step: int) -> np.ndarray:
    return np.concatenate(
        [plan.micro_batch(step, a, r) for a in range(plan.num_micro_steps(step)) for r in range(plan.world_size)]
    )


@given(plan=plans(), num_epochs=st.integers(min_value=1, max_value=3))
@example(plan=Plan(1, 0, 1, 1, 1), num_epochs=3)
@example(plan=Plan(3, 0, 8, 2, 4), num_epochs=2)  # world size larger than the epoch
def test_every_sample_once_per_epoch_across_ranks_and_steps(plan, num_epochs):
    n = plan.stream.num_samples
    total = n * num_epochs
    num_steps = -(-total // plan.global_batch_size)
    ids = np.concatenate([all_micro_batches(plan, s) for s in range(num_steps)])
    positions = np.concatenate([plan.step_positions(s) for s in range(num_steps)])
    np.testing.assert_array_equal(positions, np.arange(len(positions)))  # no gap, no overlap between steps
    for epoch in range(num_epochs):
        np.testing.assert_array_equal(np.sort(ids[epoch * n : (epoch + 1) * n]), np.arange(n))


@given(plan=plans(), step=st.integers(min_value=0, max_value=50))
def test_micro_batches_partition_the_step_in_order(plan, step):
    np.testing.assert_array_equal(all_micro_batches(plan, step), plan.global_batch(step))


@given(plan=plans(), step=st.integers(min_value=0, max_value=50), data=st.data())
def test_step_data_does_not_depend_on_world_size_or_micro_batch(plan, step, data):
    gbs = plan.global_batch_size
    world_size = data.draw(st.sampled_from([w for w in range(1, gbs + 1) if gbs % w == 0]))
    micro = data.draw(st.sampled_from([m for m in range(1, gbs // world_size + 1) if gbs % (world_size * m) == 0]))
    other = plan.with_world(world_size, micro)
    np.testing.assert_array_equal(other.global_batch(step), plan.global_batch(step))
    np.testing.assert_array_equal(np.sort(all_micro_batches(other, step)), np.sort(all_micro_batches(plan, step)))
    assert other.fingerprint() == plan.fingerprint()


@given(plan=plans(schedule=True))
def test_batch_size_ramp_never_duplicates_or_skips_a_position(plan):
    num_steps = 30
    positions = np.concatenate([plan.step_positions(s) for s in range(num_steps)])
    np.testing.assert_array_equal(positions, np.arange(plan.consumed(num_steps)))
    for s in range(num_steps):
        assert len(plan.step_positions(s)) == plan.batch_size(s)
        assert plan.num_micro_steps(s) * plan.world_size * plan.micro_batch_size == plan.batch_size(s)


def test_ramp_consumed_is_exact():
    plan = Plan(1000, 0, 32, 2, 2, batch_size_schedule=[(0, 8), (3, 16), (5, 32)])
    assert [plan.consumed(s) for s in range(8)] == [0, 8, 16, 24, 40, 56, 88, 120]
    assert [plan.num_micro_steps(s) for s in (0, 3, 5)] == [2, 4, 8]


@given(seed=seeds, n=st.integers(min_value=1, max_value=100), gbs=st.integers(min_value=1, max_value=16))
def test_extending_a_run_changes_no_step_already_defined(seed, n, gbs):
    """Each epoch is keyed on its own: a step's data does not depend on how long the run is, or on later epochs."""
    plan = Plan(n, seed, gbs, 1, 1)
    first = [plan.global_batch(s) for s in range(10)]
    again = Plan(n, seed, gbs, 1, 1)
    later = [again.global_batch(s) for s in range(40)]  # computing far steps first changes nothing
    for s in range(10):
        np.testing.assert_array_equal(first[s], later[s])


def test_epochs_are_shuffled_independently():
    plan = Plan(1000, 3, 1000, 1, 1)
    a, b = plan.global_batch(0), plan.global_batch(1)
    assert sorted(a) == sorted(b) and not np.array_equal(a, b)
    assert plan.epoch(0) == 0 and plan.epoch(1) == 1


def test_a_step_across_an_epoch_boundary():
    plan = Plan(10, 1, 4, 2, 1)
    ids = plan.global_batch(2)  # positions 8..11: epoch 0's last two, epoch 1's first two
    np.testing.assert_array_equal(ids[:2], Plan(10, 1, 10, 1, 1).global_batch(0)[8:10])
    np.testing.assert_array_equal(ids[2:], Plan(10, 1, 10, 1, 1).global_batch(1)[:2])


def test_far_steps_cost_constant_memory():
    plan = Plan(10**8, 0, 1024, 4, 8)
    plan.micro_batch(10**12, 3, 5)  # warm up
    tracemalloc.start()
    for step in (0, 10**6, 10**12):
        ids = plan.micro_batch(step, 3, 5)
        assert ids.shape == (4,) and ((ids >= 0) & (ids < 10**8)).all()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 1_000_000
    assert plan.epoch(10**12) == 10**12 * 1024 // 10**8


def test_worker_assignment_follows_round_robin_from_the_start_step():
    plan = Plan(1000, 0, 12, 2, 2)  # 3 micro steps per step
    assert [plan.worker_micro_batches(5, 0, w, 2, start_step=5) for w in range(2)] == [[0, 2], [1]]
    assert [plan.worker_micro_batches(6, 0, w, 2, start_step=5) for w in range(2)] == [[1], [0, 2]]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(num_samples=0), "num_samples must be an integer >= 1"),
        (
            dict(global_batch_size=10, micro_batch_size=3),
            r"global batch size 10 is not divisible by world_size \* micro_batch_size = 1 \* 3 = 3",
        ),
        (dict(world_size=0), "world_size must be an integer >= 1, got 0"),
        (dict(batch_size_schedule=[(1, 4)]), "batch_size_schedule must start at step 0"),
        (dict(batch_size_schedule=[(0, 2), (5, 4), (3, 4)]), "strictly increasing, got step 3 after step 5"),
        (
            dict(batch_size_schedule=[(0, 2), (5, 8)]),
            r"last batch_size_schedule size \(8\) must equal global_batch_size \(4\)",
        ),
        (dict(batch_size_schedule=[(0, 3), (5, 4)], micro_batch_size=2), "global batch size 3 is not divisible"),
    ],
)
def test_bad_plan_arguments(kwargs, message):
    args = dict(num_samples=100, seed=0, global_batch_size=4, micro_batch_size=1, world_size=1) | kwargs
    with pytest.raises(ValueError, match=message):
        Plan(**args)


def test_bad_step_rank_and_micro_step():
    plan = Plan(100, 0, 8, 2, 2)
    with pytest.raises(ValueError, match="step must be >= 0, got -1"):
        plan.global_batch(-1)
    with pytest.raises(ValueError, match=r"Got rank 2, allowed ranks are in \[0, 2\)"):
        plan.micro_batch(0, 0, 2)
    with pytest.raises(ValueError, match=r"Got micro_step 2, allowed micro steps of step 0 are in \[0, 2\)"):
        plan.micro_batch(0, 2, 0)


def test_mapping_version_is_chosen_recorded_and_kept_on_resume():
    """Version 1 stays computable (its exact orders: tests/test_pinned.py); a resume may not change the version."""
    from detsampler import DataFingerprint, check_resume
    from detsampler.version import MAPPING_VERSION

    def fp(plan):  # one index and one layout: only the plans differ
        return DataFingerprint("index", {"kind": "concat"}, plan.fingerprint())

    v1, v2 = Plan(1000, 3, 8, 2, mapping_version=1), Plan(1000, 3, 8, 2)
    assert v2.mapping_version == MAPPING_VERSION == 2
    assert (v1.fingerprint()["mapping_version"], v2.fingerprint()["mapping_version"]) == (1, 2)
    assert not np.array_equal(v1.global_batch(0), v2.global_batch(0))
    check_resume(fp(v1).to_dict(), fp(v1.with_world(2, 2)), 5)
    with pytest.raises(ValueError, match=r"changes the mapping version from 1 to 2.*Plan\(\.\.\., mapping_version=1\)"):
        check_resume(fp(v1), fp(v2), 5)
    with pytest.raises(ValueError, match=r"Got mapping version 4, allowed mapping versions are \(1, 2, 3\)"):
        Plan(1000, 3, 8, 2, mapping_version=4)
    with pytest.raises(ValueError, match=r"mapping version 3 is the balanced plan's"):  # tests/test_balance.py
        Plan(1000, 3, 8, 2, mapping_version=3)


@settings(max_examples=40)
@given(
    resume=st.integers(min_value=0, max_value=12),
    old=st.lists(st.tuples(st.integers(1, 14), st.sampled_from([4, 8, 12])), max_size=3),
    new=st.lists(st.tuples(st.integers(1, 14), st.sampled_from([4, 8, 12])), max_size=3),
)
def test_a_batch_ramp_may_change_only_ahead_of_the_resume(resume, old, new):
    """check_resume accepts a changed batch_size_schedule exactly when every step before the resume reads the same
    samples (compared against the plans themselves)."""
    from detsampler import DataFingerprint, check_resume

    def plan(entries):
        rows = sorted(dict([(0, 8), *entries]).items())
        return Plan(1000, seed=3, global_batch_size=rows[-1][1], micro_batch_size=4, batch_size_schedule=rows)

    a, b = plan(old), plan(new)
    same_past = all(np.array_equal(a.global_batch(s), b.global_batch(s)) for s in range(resume)) and (
        a.consumed(resume) == b.consumed(resume)
    )
    fp = lambda p: DataFingerprint("index", {"kind": "concat"}, p.fingerprint())
    if same_past:
        check_resume(fp(a), fp(b), resume)
    else:
        with pytest.raises(ValueError, match="batch_size_schedule changes the past"):
            check_resume(fp(a), fp(b), resume)
