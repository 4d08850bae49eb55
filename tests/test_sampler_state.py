"""The sampler's state names the next micro batch not yet consumed, however it is driven (issue 10, item 1).

Driven directly (plain iteration), through ``.steps()``, and through torchdata's real ``StatefulDataLoader`` with 0 and
2 workers (whose prefetching runs the sampler ahead of consumption): a restored sampler or loader yields exactly the
next unconsumed micro batch, mid-step included. ``stop_step`` is absolute, and bad states are refused, never coerced.
"""

from __future__ import annotations

import copy
import gc
import multiprocessing
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, Dataset
from torchdata.stateful_dataloader import StatefulDataLoader

from detsampler.loader.sampler import DeterministicBatchSampler
from detsampler.plan import Plan
from tests.strategies import plans


class Ids(Dataset):
    """Sample i is i: a loader's batch is the tensor of its sample ids."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


def flat_micro_batches(plan: Plan, rank: int, start_step: int, stop_step: int) -> list[list[int]]:
    """The uninterrupted sequence of ``rank``'s micro batches, straight from the plan."""
    return [
        plan.micro_batch(s, a, rank).tolist()
        for s in range(start_step, stop_step)
        for a in range(plan.num_micro_steps(s))
    ]


def position_after(plan: Plan, start_step: int, consumed: int) -> dict[str, int]:
    """The state after ``consumed`` micro batches from ``start_step``: the step and its samples already taken by all
    ranks."""
    step = start_step
    while consumed >= plan.num_micro_steps(step):
        consumed -= plan.num_micro_steps(step)
        step += 1
    return {"step": step, "samples_in_step": consumed * plan.world_size * plan.micro_batch_size}


PLAN = Plan(200, seed=3, global_batch_size=12, micro_batch_size=2, world_size=2)  # 3 micro steps per step


# -- plain iteration ---------------------------------------------------------------------------------------------------


@settings(max_examples=20)
@given(plan=plans(max_samples=60), data=st.data())
def test_plain_iteration_state_follows_every_micro_batch(plan, data):
    rank = data.draw(st.integers(min_value=0, max_value=plan.world_size - 1))
    start = data.draw(st.integers(min_value=0, max_value=3))
    consumed = data.draw(st.integers(min_value=0, max_value=8))
    want = flat_micro_batches(plan, rank, start, start + consumed + 1)
    sampler = DeterministicBatchSampler(plan, rank, start_step=start)
    it = iter(sampler)
    for k in range(consumed):
        assert next(it) == want[k]
        assert sampler.state_dict() == it.state_dict() == position_after(plan, start, k + 1)
    restored = DeterministicBatchSampler(plan, rank)
    restored.load_state_dict(copy.deepcopy(sampler.state_dict()))
    assert next(iter(restored)) == want[consumed]


def test_a_new_iteration_continues_where_the_last_one_stopped():
    sampler = DeterministicBatchSampler(PLAN, 1, start_step=2, stop_step=5)
    want = flat_micro_batches(PLAN, 1, 2, 5)
    got = []
    for mb in sampler:
        got.append(mb)
        if len(got) == 4:
            break
    got += list(sampler)
    assert got == want
    assert sampler.state_dict() == {"step": 5, "samples_in_step": 0}
    assert list(sampler) == [] and len(sampler) == 0


def test_states_are_equal_on_every_rank():
    states = []
    for rank in range(PLAN.world_size):
        sampler = DeterministicBatchSampler(PLAN, rank)
        it = iter(sampler)
        for _ in range(5):
            next(it)
        states.append(sampler.state_dict())
    assert states == [{"step": 1, "samples_in_step": 8}] * PLAN.world_size


# -- stop_step is absolute --------------------------------------------------------------------------------------------


def test_stop_step_is_absolute_across_load_state_dict():
    sampler = DeterministicBatchSampler(PLAN, 0, start_step=2, stop_step=6)
    assert len(sampler) == 4 * 3
    sampler.load_state_dict({"step": 4})
    assert sampler.stop_step == 6
    assert len(sampler) == 2 * 3
    assert list(sampler) == flat_micro_batches(PLAN, 0, 4, 6)
    sampler.load_state_dict({"step": 5, "samples_in_step": 4})
    assert len(sampler) == 2
    assert list(sampler) == flat_micro_batches(PLAN, 0, 5, 6)[1:]


def test_stop_step_before_start_step_is_refused():
    with pytest.raises(ValueError, match="stop_step 2 comes before start_step 3"):
        DeterministicBatchSampler(PLAN, 0, start_step=3, stop_step=2)
    sampler = DeterministicBatchSampler(PLAN, 0, stop_step=4)
    with pytest.raises(ValueError, match="step 5 is past stop_step 4"):
        sampler.load_state_dict({"step": 5})


# -- strict input ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "error", "match"),
    [
        ({"step": 2.7}, TypeError, "step must be an integer, got float"),
        ({"step": 2.0}, TypeError, "step must be an integer, got float"),
        ({"step": True}, TypeError, "step must be an integer, got bool"),
        ({"step": "3"}, TypeError, "step must be an integer, got str"),
        ({"step": -1}, ValueError, "step must be >= 0, got -1"),
        ({"step": 1, "samples_in_step": 1.5}, TypeError, "samples_in_step must be an integer, got float"),
        (
            {"step": 1, "samples_in_step": 3},
            ValueError,
            "samples_in_step 3 of step 1 is not a whole number of micro steps",
        ),
        ({"step": 1, "samples_in_step": 12}, ValueError, r"samples_in_step 12 of step 1 must be < its batch size 12"),
        ({}, ValueError, "missing 'step'"),
        ({"step": 1, "epoch": 0}, ValueError, r"unknown keys \['epoch'\]"),
        ([("step", 1)], TypeError, "state must be a dict"),
    ],
)
def test_load_state_dict_refuses_bad_states(state, error, match):
    sampler = DeterministicBatchSampler(PLAN, 0, start_step=3)
    with pytest.raises(error, match=match):
        sampler.load_state_dict(state)
    assert sampler.state_dict() == {"step": 3, "samples_in_step": 0}  # nothing half-applied


def test_constructor_refuses_floats():
    with pytest.raises(TypeError, match="start_step must be an integer, got float"):
        DeterministicBatchSampler(PLAN, 0, start_step=1.0)
    with pytest.raises(TypeError, match="stop_step must be an integer, got float"):
        DeterministicBatchSampler(PLAN, 0, stop_step=4.0)


# -- elastic -----------------------------------------------------------------------------------------------------------


def test_mid_step_state_resumes_on_another_world_size():
    """4 of the 12 samples of step 1 were consumed at world size 2; world size 1 with micro batch 4 continues with the
    rest."""
    samplers = [DeterministicBatchSampler(PLAN, r) for r in range(2)]
    its = [iter(s) for s in samplers]
    for it in its:
        for _ in range(4):
            next(it)
    state = samplers[0].state_dict()
    assert state == {"step": 1, "samples_in_step": 4}
    rest_at_2 = sorted(i for it in its for _ in range(2) for i in next(it))
    other = PLAN.with_world(1, 4)
    fresh = DeterministicBatchSampler(other, 0)
    fresh.load_state_dict(state)
    it = iter(fresh)
    rest_at_1 = sorted(next(it) + next(it))
    assert rest_at_1 == rest_at_2
    assert fresh.state_dict() == {"step": 2, "samples_in_step": 0}
    with pytest.raises(ValueError, match="not a whole number of micro steps"):
        DeterministicBatchSampler(PLAN.with_world(1, 3), 0).load_state_dict({"step": 1, "samples_in_step": 4})


# -- .steps() ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("num_workers", [0, 2])
def test_steps_state_is_the_consumed_step_while_a_dataloader_prefetches(num_workers):
    sampler = DeterministicBatchSampler(PLAN, 1, start_step=2, stop_step=8)
    loader = DataLoader(
        Ids(200), batch_sampler=sampler, num_workers=num_workers, prefetch_factor=4 if num_workers else None
    )
    for step, micro_batches in sampler.steps(loader):
        assert [mb.tolist() for mb in micro_batches] == flat_micro_batches(PLAN, 1, step, step + 1)
        assert sampler.state_dict() == {"step": step + 1, "samples_in_step": 0}
        if step == 4:
            break
    assert sampler.state_dict() == {"step": 5, "samples_in_step": 0}
    assert [s for s, _ in sampler.steps(DataLoader(Ids(200), batch_sampler=sampler))] == [5, 6, 7]


# -- torchdata's StatefulDataLoader ------------------------------------------------------------------------------------


def stateful_loader(sampler: DeterministicBatchSampler, num_workers: int) -> StatefulDataLoader:
    return StatefulDataLoader(Ids(200), batch_sampler=sampler, num_workers=num_workers)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_stateful_dataloader_resumes_at_the_next_unconsumed_micro_batch(num_workers):
    """Checkpoints after 0, 1, 4 (mid-step), 6 (a step boundary) and 7 micro batches, restored into fresh loaders."""
    want = flat_micro_batches(PLAN, 0, 1, 7)
    sampler = DeterministicBatchSampler(PLAN, 0, start_step=1, stop_step=7)
    loader = stateful_loader(sampler, num_workers)
    states = {0: copy.deepcopy(loader.state_dict())}
    for k, mb in enumerate(loader, start=1):
        assert mb.tolist() == want[k - 1]
        if k in (1, 4, 6, 7):
            states[k] = copy.deepcopy(loader.state_dict())
        if k == 7:
            break
    for k, state in states.items():
        fresh = DeterministicBatchSampler(PLAN, 0, stop_step=7)
        restored = stateful_loader(fresh, num_workers)
        restored.load_state_dict(state)
        got = [mb.tolist() for mb in restored]
        assert got == want[k:], f"restored after {k} micro batches"
        if num_workers:  # the workers ran the sampler ahead: its own state is not what the loader returned
            with pytest.raises(RuntimeError, match="StatefulDataLoader with num_workers=2"):
                fresh.state_dict()
        else:
            assert fresh.state_dict() == {"step": 7, "samples_in_step": 0}


@pytest.mark.parametrize("num_workers", [0, 2])
def test_steps_over_a_stateful_dataloader_resume_by_loader_or_sampler_state(num_workers):
    sampler = DeterministicBatchSampler(PLAN, 1, stop_step=6)
    loader = stateful_loader(sampler, num_workers)
    for step, _ in sampler.steps(loader):
        if step == 2:
            loader_state, sampler_state = copy.deepcopy(loader.state_dict()), sampler.state_dict()
            break
    assert sampler_state == {"step": 3, "samples_in_step": 0}
    by_loader = DeterministicBatchSampler(PLAN, 1, stop_step=6)
    restored = stateful_loader(by_loader, num_workers)
    restored.load_state_dict(loader_state)
    got = [(s, [mb.tolist() for mb in mbs]) for s, mbs in by_loader.steps(restored)]
    by_sampler = DeterministicBatchSampler(PLAN, 1, stop_step=6)
    by_sampler.load_state_dict(sampler_state)
    again = [(s, [mb.tolist() for mb in mbs]) for s, mbs in by_sampler.steps(stateful_loader(by_sampler, num_workers))]
    want = [(s, flat_micro_batches(PLAN, 1, s, s + 1)) for s in range(3, 6)]
    assert got == again == want


def test_steps_after_a_mid_step_restore_yields_the_rest_of_that_step_first():
    sampler = DeterministicBatchSampler(PLAN, 0, stop_step=4)
    loader = stateful_loader(sampler, 0)
    it = iter(loader)
    for _ in range(4):  # step 0 and the first micro batch of step 1
        next(it)
    state = loader.state_dict()
    fresh = DeterministicBatchSampler(PLAN, 0, stop_step=4)
    restored = stateful_loader(fresh, 0)
    restored.load_state_dict(state)
    got = [(s, [mb.tolist() for mb in mbs]) for s, mbs in fresh.steps(restored)]
    assert got[0] == (1, flat_micro_batches(PLAN, 0, 1, 2)[1:])
    assert got[1:] == [(s, flat_micro_batches(PLAN, 0, s, s + 1)) for s in (2, 3)]


def test_steps_refuses_a_multiprocess_loader_that_snapshots_less_than_every_batch():
    sampler = DeterministicBatchSampler(PLAN, 0, stop_step=4)
    loader = StatefulDataLoader(Ids(200), batch_sampler=sampler, num_workers=1, snapshot_every_n_steps=2)
    with pytest.raises(ValueError, match="snapshot_every_n_steps=1"):
        next(sampler.steps(loader))


def test_length_counts_from_the_state():
    sampler = DeterministicBatchSampler(PLAN, 0, start_step=1, stop_step=3)
    assert len(sampler) == 6
    with pytest.raises(TypeError, match="endless"):
        len(DeterministicBatchSampler(PLAN, 0))
    it = iter(sampler)
    next(it)
    assert len(sampler) == 5
    assert len(list(it)) == 5


# -- every loop shape: the state names what was consumed, or is refused with the fix (issue 20, item 4) ---------------


def consume(loader, count: int) -> list[list[int]]:
    """The first ``count`` batches of a plain ``for batch in loader`` loop, as lists of sample ids."""
    got = []
    for batch in loader:
        got.append(batch.tolist())
        if len(got) == count:
            break
    return got


def test_a_dataloader_without_workers_consumes_what_it_yields():
    sampler = DeterministicBatchSampler(PLAN, 0, start_step=1)
    assert consume(DataLoader(Ids(200), batch_sampler=sampler), 6) == flat_micro_batches(PLAN, 0, 1, 3)
    assert sampler.state_dict() == {"step": 3, "samples_in_step": 0}


def test_a_plain_loop_over_a_dataloader_with_workers_is_refused_with_the_fix():
    """The issue's loop: 2 steps consumed, the workers had run the sampler 2 steps further ({'step': 4})."""
    sampler = DeterministicBatchSampler(PLAN, 0)
    loader = DataLoader(Ids(200), batch_sampler=sampler, num_workers=2)
    assert consume(loader, 6) == flat_micro_batches(PLAN, 0, 0, 2)
    with pytest.raises(RuntimeError, match=r"DataLoader with num_workers=2 runs it up to 4 micro batches ahead") as e:
        sampler.state_dict()
    assert "sampler.steps(loader)" in str(e.value) and "StatefulDataLoader" in str(e.value)
    sampler.load_state_dict({"step": 2})  # a state loaded from the trainer's step is exact again
    assert sampler.state_dict() == {"step": 2, "samples_in_step": 0}
    for step, _ in sampler.steps(loader):  # and steps() over the same loader counts what it hands out
        if step == 3:
            break
    assert sampler.state_dict() == {"step": 4, "samples_in_step": 0}


def test_accelerate_reads_one_batch_ahead_so_the_state_is_refused():
    from accelerate.data_loader import prepare_data_loader

    from detsampler.integrations.hf import unshard

    sampler = DeterministicBatchSampler(PLAN, 1)
    prepared = unshard(
        prepare_data_loader(DataLoader(Ids(200), batch_sampler=sampler), num_processes=2, process_index=1)
    )
    assert consume(prepared, 3) == flat_micro_batches(PLAN, 1, 0, 1)
    assert sampler._position == (1, 1)  # one micro batch past the 3 returned: the state would skip it
    with pytest.raises(RuntimeError, match=r"iterated through accelerate\.data_loader"):
        sampler.state_dict()


def test_a_thread_that_reads_ahead_is_refused():
    from train.data import ThreadPrefetcher

    sampler = DeterministicBatchSampler(PLAN, 0)
    prefetch = ThreadPrefetcher(DataLoader(Ids(200), batch_sampler=sampler), depth=4)
    try:
        assert [next(prefetch).tolist() for _ in range(3)] == flat_micro_batches(PLAN, 0, 0, 1)
        with pytest.raises(RuntimeError, match="another thread"):
            sampler.state_dict()
    finally:
        prefetch.close()


# -- a loader that hands batches out of order (issue 31, item 5) ------------------------------------------------------


def _out_of_order(kind: str):
    """A loader over a fresh sampler that hands out batches in the order its 2 workers finish them."""
    sampler = DeterministicBatchSampler(PLAN, 0, stop_step=8)
    cls = StatefulDataLoader if kind == "stateful" else DataLoader
    return sampler, cls(Ids(200), batch_sampler=sampler, num_workers=2, in_order=False)


@pytest.mark.parametrize("loop", ["steps", "plain", "wrapped"])
@pytest.mark.parametrize("kind", ["dataloader", "stateful"])
def test_a_loader_that_hands_batches_out_of_order_is_refused(kind, loop):
    """``in_order=False`` with workers: a worker's batch that is ready first is handed out first, so ``steps()`` (which
    labels micro batches by their count) would put micro batches under steps that do not read them (59 of 120 in a run
    of 30 steps with one slow worker), and a plain loop would accumulate other steps' micro batches. Refused before any
    worker starts (issue 31 leftover: a plain loop's refusal came at the first index, after the loader had started its
    2 workers, which lived on until the half-made iterator was collected; a test once hit EBADF at a later fork): while
    the error and its traceback are still held no worker process exists, and collecting them reports nothing."""
    before = set(multiprocessing.active_children())
    unraisable: list = []
    hook, sys.unraisablehook = sys.unraisablehook, unraisable.append
    try:
        sampler, loader = _out_of_order(kind)
        start = {
            "steps": lambda: next(iter(sampler.steps(loader))),
            "plain": lambda: iter(loader),
            "wrapped": lambda: next(iter(sampler.steps(_Wrapped(loader)))),  # steps() cannot see the loader's in_order
        }[loop]
        with pytest.raises(ValueError, match=r"in_order=False\) with num_workers=2 .* in_order=True") as e:
            start()
        assert set(multiprocessing.active_children()) - before == set()  # NOTE: e (and the iterator it holds) alive
        message = str(e.value)
        del e
        gc.collect()
    finally:
        sys.unraisablehook = hook
    assert unraisable == []
    assert "\n" not in message and type(loader).__name__ in message


class _Wrapped:
    """An iterable over a loader that is not the loader (as a framework's wrapper is)."""

    def __init__(self, loader) -> None:
        self.loader = loader

    def __iter__(self):
        return iter(self.loader)


def test_in_order_false_without_workers_changes_nothing():
    """Without workers the batches come in the sampler's order whatever ``in_order`` says: accepted, and exact."""
    sampler = DeterministicBatchSampler(PLAN, 0, stop_step=4)
    loader = DataLoader(Ids(200), batch_sampler=sampler, in_order=False)
    got = [(s, [mb.tolist() for mb in mbs]) for s, mbs in sampler.steps(loader)]
    assert got == [(s, flat_micro_batches(PLAN, 0, s, s + 1)) for s in range(4)]
