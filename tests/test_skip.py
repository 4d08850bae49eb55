"""Skip ranges: training step s reads data step d(s), skipped data never appears, ranges compose,
bad input is refused."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from detsampler import Mixture, Plan
from detsampler.plan import data_step
from detsampler.resume import DataFingerprint
from detsampler.resume import check_resume as check_fingerprints
from tests.strategies import integer_weights, seeds, skip_ranges


def check_resume(old, new, resume_step):
    """The library's check over two fingerprints that differ only in their plans (one index, one layout)."""

    def fp(plan):
        return DataFingerprint("index", {"kind": "concat"}, plan if isinstance(plan, dict) else plan.fingerprint())

    check_fingerprints(fp(old), fp(new), resume_step)


_BATCH_SCHEDULES = [None, [(0, 4), (3, 8)], [(0, 8), (10, 4), (20, 8)]]


def _plan(stream, seed, skips=None, schedule=None, world_size=2, micro_batch_size=2) -> Plan:
    data = {"num_samples": stream} if isinstance(stream, int) else {"source": stream}
    return Plan(
        **data,
        seed=seed,
        global_batch_size=8,
        micro_batch_size=micro_batch_size,
        world_size=world_size,
        batch_size_schedule=schedule,
        skip_steps=skips,
    )


def _d_brute(skips, step: int) -> int:
    """The step-th data step (from 0) in no range, by counting."""
    skipped = {x for a, b in skips for x in range(a, b + 1)}
    free = (x for x in range(10**6) if x not in skipped)
    for _ in range(step):
        next(free)
    return next(free)


# -- property 4
# ----------------------------------------------------------------------------------------------------------


@given(
    skips=skip_ranges(),
    seed=seeds,
    schedule=st.sampled_from(_BATCH_SCHEDULES),
    num_samples=st.integers(3, 60),
    mixture=st.booleans(),
    data=st.data(),
)
def test_training_step_reads_data_step_d_and_skipped_data_never_appears(
    skips, seed, schedule, num_samples, mixture, data
):
    if mixture:
        sizes = data.draw(st.lists(st.integers(1, 30), min_size=2, max_size=3))
        stream = Mixture(
            sizes, [(0, data.draw(integer_weights(len(sizes)))), (7, data.draw(integer_weights(len(sizes))))], seed
        )
    else:
        stream = num_samples
    plain, skipping = _plan(stream, seed, schedule=schedule), _plan(stream, seed, skips, schedule=schedule)
    num_steps = 40
    seen_positions = []
    for s in range(num_steps):
        d = skipping.data_step(s)
        assert d == _d_brute(skips, s) == data_step(skipping.skip_steps, s)
        assert (skipping.step_positions(s) == plain.step_positions(d)).all()
        assert (skipping.global_batch(s) == plain.global_batch(d)).all()
        assert skipping.batch_size(s) == plain.batch_size(d)
        parts = [skipping.micro_batch(s, a, r) for a in range(skipping.num_micro_steps(s)) for r in range(2)]
        assert (np.concatenate(parts) == plain.global_batch(d)).all()
        seen_positions.append(skipping.step_positions(s))
    seen = np.concatenate(seen_positions)
    for a, b in skips:  # the positions of skipped data steps are never read
        if b < skipping.data_step(num_steps - 1):
            lo, hi = plain.consumed(a), plain.consumed(b + 1)
            assert not ((seen >= lo) & (seen < hi)).any()
    # micro_steps_between counts only what is trained: what the sampler yields
    assert skipping.micro_steps_between(0, num_steps) * 4 == sum(skipping.batch_size(s) for s in range(num_steps))
    assert skipping.micro_steps_between(3, 17) == sum(skipping.num_micro_steps(s) for s in range(3, 17))


@given(a=st.integers(0, 30), length=st.integers(1, 6), seed=seeds)
def test_one_range_shifts_by_its_length(a, length, seed):
    b = a + length - 1
    plan = _plan(50, seed, [(a, b)])
    for s in range(a + 10):
        assert plan.data_step(s) == (s if s < a else s + (b - a + 1))


@given(
    skips=skip_ranges(max_ranges=4), seed=seeds, cut=st.integers(0, 4), world=st.sampled_from([(1, 8), (4, 2), (2, 1)])
)
def test_ranges_given_at_different_resumes_compose(skips, seed, cut, world):
    """A run that adds ranges at successive resumes trains exactly on what one plan with all ranges trains on."""
    final = _plan(40, seed, skips)
    trained, step = [], 0
    for i in range(len(skips) + 1):
        plan = _plan(40, seed, skips[:i]).with_world(*world) if i % 2 else _plan(40, seed, skips[:i])
        # resume just before the next range starts (in training steps), and add it then
        stop = 45 if i == len(skips) else max(step, _training_step_before(plan, skips[i][0]))
        if i:
            check_resume(_plan(40, seed, skips[: i - 1]), plan, step)
        trained += [np.sort(plan.global_batch(s)) for s in range(step, stop)]
        step = stop
    for s, got in enumerate(trained):
        assert (got == np.sort(final.global_batch(s))).all()
    # every data step outside the ranges is exactly what it was without any range
    plain = _plan(40, seed)
    for s in range(45):
        assert (final.global_batch(s) == plain.global_batch(final.data_step(s))).all()


def _training_step_before(plan: Plan, first_skipped: int) -> int:
    """The first training step whose data step is >= first_skipped (the latest resume that may add that range)."""
    s = 0
    while plan.data_step(s) < first_skipped:
        s += 1
    return s


def test_plans_without_ranges_are_unchanged():
    plain, empty = _plan(37, 3, schedule=_BATCH_SCHEDULES[1]), _plan(37, 3, [], schedule=_BATCH_SCHEDULES[1])
    assert plain.fingerprint() == empty.fingerprint() and "skip_steps" not in plain.fingerprint()
    for s in range(20):
        assert plain.data_step(s) == s and plain.consumed(s) == plain.data_consumed(s)
        assert (plain.global_batch(s) == empty.global_batch(s)).all()
    assert _plan(37, 3, [(2, 3)]).fingerprint()["skip_steps"] == [[2, 3]]


def test_sampler_yields_the_data_steps_of_the_training_steps():
    pytest.importorskip("torch")
    from detsampler import DeterministicBatchSampler

    plan = _plan(30, 1, [(2, 4)])
    sampler = DeterministicBatchSampler(plan, rank=1, start_step=1, stop_step=5)
    length = len(sampler)
    got = list(sampler)
    assert len(got) == length == 4 * plan.num_micro_steps(0)
    plain = _plan(30, 1)
    expected = [plain.micro_batch(d, a, 1).tolist() for d in (1, 5, 6, 7) for a in range(plain.num_micro_steps(d))]
    assert got == expected


# -- bad input
# -----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("skips", "match"),
    [
        ([(3, 5), (5, 8)], "overlap"),
        ([(10, 12), (0, 10)], "overlap"),
        ([(4, 4), (4, 4)], "overlap"),
        ([(5, 3)], "reversed"),
        ([(-1, 3)], "negative"),
        ([(1, 2, 3)], "pairs"),
        ([(1.0, 2)], "integers"),
        ("1-2", "list of"),
    ],
)
def test_bad_skip_ranges_are_clear_errors(skips, match):
    with pytest.raises(ValueError, match=match):
        _plan(20, 0, skips)


def test_skip_ranges_in_the_past_of_the_resume_are_refused():
    old = _plan(20, 0, [(2, 3)])
    assert old.data_step(5) == 7
    check_resume(old, _plan(20, 0, [(2, 3), (7, 9)]), 5)  # starts at the resume's data step: allowed
    check_resume(old.fingerprint(), _plan(20, 0, [(2, 3), (12, 12)]), 5)
    with pytest.raises(ValueError, match="lies in the past of the resume"):
        check_resume(old, _plan(20, 0, [(2, 3), (6, 9)]), 5)
    with pytest.raises(ValueError, match="lies in the past of the resume"):
        check_resume(old, _plan(20, 0), 5)  # dropping a range that was already applied
    with pytest.raises(ValueError, match="lies in the past of the resume"):
        check_resume(old, _plan(20, 0, [(1, 3)]), 5)
    with pytest.raises(ValueError, match="resume_step must be"):
        check_resume(old, old, -1)
