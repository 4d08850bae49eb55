"""The compute-balanced plan: the same samples every step, dealt to (rank, micro step) by their modeled cost."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from detsampler import LayoutConfig, Mixture, Plan, make_layout
from detsampler.balance import Balance, CostModel, balanced_order
from detsampler.spans import Spans
from tests.strategies import balanced_plans, step_costs


def reference_order(costs: np.ndarray, world_size: int, micro_batch_size: int) -> list[int]:
    """The module docstring's assignment, written naively: each sample, heaviest first, to the least loaded rank that is
    not full, then each rank's samples to its micro batches alike, each rank's micro batches heaviest first."""

    def lpt(items: list[int], bins: int, capacity: int) -> tuple[list[list[int]], list[float]]:
        loads, held = [0.0] * bins, [[] for _ in range(bins)]
        for i in items:
            b = min((b for b in range(bins) if len(held[b]) < capacity), key=lambda b: (loads[b], b))
            held[b].append(i)
            loads[b] += c[i]
        return held, loads

    c = costs.tolist()
    micro_steps = len(c) // (world_size * micro_batch_size)
    per_rank, _ = lpt(sorted(range(len(c)), key=lambda i: (-c[i], i)), world_size, micro_steps * micro_batch_size)
    slots = [[None] * world_size for _ in range(micro_steps)]
    for r, mine in enumerate(per_rank):
        cells, loads = lpt(mine, micro_steps, micro_batch_size)
        for new, a in enumerate(sorted(range(micro_steps), key=lambda a: (-loads[a], a))):
            slots[new][r] = cells[a]
    return [i for row in slots for cell in row for i in cell]


def all_micro_batches(plan: Plan, step: int) -> np.ndarray:
    return np.concatenate(
        [plan.micro_batch(step, a, r) for a in range(plan.num_micro_steps(step)) for r in range(plan.world_size)]
    )


# -- the assignment
# ------------------------------------------------------------------------------------------------------------


@given(case=step_costs())
@example(case=(np.zeros(1), 1, 1))
@example(case=(np.arange(24, dtype=np.float64), 3, 2))
def test_balanced_order_equals_the_naive_model(case):
    costs, world_size, micro_batch_size = case
    order = balanced_order(costs, world_size, micro_batch_size)
    assert order.tolist() == reference_order(costs, world_size, micro_batch_size)
    assert sorted(order.tolist()) == list(range(len(costs)))  # a permutation: every sample once


def test_balanced_order_is_a_pure_function_of_its_arguments():
    costs = np.random.default_rng(5).pareto(1.5, 4096)
    first = balanced_order(costs, 64, 2)
    np.testing.assert_array_equal(balanced_order(costs.copy(), 64, 2), first)
    assert not np.array_equal(balanced_order(costs, 32, 2), first)


def test_balance_brings_a_long_tailed_step_close_to_the_mean():
    """128 lognormal costs over 16 ranks: position order leaves the most expensive rank 50% above the mean, the
    balanced order within 2%."""
    costs = np.random.default_rng(0).lognormal(0, 0.8, 128)
    order = balanced_order(costs, 16, 2)
    by_rank = lambda o: costs[o].reshape(4, 16, 2).sum(axis=(0, 2))
    plain, balanced = by_rank(np.arange(128)), by_rank(order)
    assert plain.max() / plain.mean() > 1.4
    assert balanced.max() / balanced.mean() < 1.02
    cells = costs[order].reshape(4, 16, 2).sum(axis=2)  # each rank's micro batches come heaviest first
    assert all((np.diff(cells[:, r]) <= 0).all() for r in range(16))


@pytest.mark.parametrize(
    "costs, world_size, micro_batch_size, message",
    [
        (np.zeros(6), 4, 1, r"a step of 6 samples does not split into world_size \* micro_batch_size = 4 \* 1"),
        (np.zeros(0), 1, 1, "a step of 0 samples"),
    ],
)
def test_balanced_order_refuses_a_step_that_does_not_split(costs, world_size, micro_batch_size, message):
    with pytest.raises(ValueError, match=message):
        balanced_order(costs, world_size, micro_batch_size)


# -- the cost model
# ------------------------------------------------------------------------------------------------------------


def test_cost_is_attention_times_squares_plus_linear_times_tokens_plus_fixed():
    spans = Spans(np.array([0, 2, 2, 3]), np.array([0, 1, 2]), np.array([0, 5, 0]), np.array([3, 9, 10]))
    costs = CostModel(attention=0.5, linear=2.0, fixed=1.0).costs(spans)
    assert costs.tolist() == [0.5 * (9 + 16) + 2.0 * 7 + 1.0, 1.0, 0.5 * 100 + 2.0 * 10 + 1.0]  # the middle: empty
    assert CostModel.tokens().costs(spans).tolist() == [7.0, 0.0, 10.0]
    huge = Spans(np.array([0, 2]), np.array([0, 1]), np.array([0, 0]), np.array([2**30, 2**30 + 1]))
    with pytest.raises(ValueError, match=r"a sample of 2147483649 tokens: the cost model takes at most 2\*\*31"):
        CostModel().costs(huge)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(attention=-1.0), r"CostModel.attention must be a finite number >= 0, got -1.0"),
        (dict(linear=float("nan")), r"CostModel.linear must be a finite number >= 0, got nan"),
        (dict(fixed=True), r"CostModel.fixed must be a finite number >= 0, got True"),
        (dict(fixed="1"), r"CostModel.fixed must be a finite number >= 0, got '1'"),
        (dict(attention=0, linear=0), "both 0: every sample would cost the same"),
    ],
)
def test_bad_cost_models_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        CostModel(**kwargs)


# -- the plan
# ------------------------------------------------------------------------------------------------------------------


def unbalanced(plan: Plan) -> Plan:
    return Plan(plan.stream.num_samples, plan.seed, plan.global_batch_size, plan.micro_batch_size, plan.world_size)


@given(case=balanced_plans(), num_epochs=st.integers(1, 3))
def test_every_sample_once_per_epoch_and_each_step_is_the_unbalanced_plans(case, num_epochs):
    """A step may hold the end of one epoch and the start of the next, dealt together: each sample's epoch is its
    position's."""
    plan, layout = case
    other = unbalanced(plan)
    n = plan.stream.num_samples
    num_steps = -(-n * num_epochs // plan.global_batch_size)
    ids, epochs = [], []
    for s in range(num_steps):
        step_ids = all_micro_batches(plan, s)
        np.testing.assert_array_equal(np.sort(step_ids), np.sort(other.global_batch(s)))  # the same global batch
        np.testing.assert_array_equal(step_ids, plan.global_batch(s))  # in slot order
        positions = plan.step_positions(s)
        np.testing.assert_array_equal(np.sort(positions), other.step_positions(s))
        np.testing.assert_array_equal(plan.stream.sample_ids(positions), step_ids)
        ids.append(step_ids)
        epochs.append(positions // n)
    ids, epochs = np.concatenate(ids), np.concatenate(epochs)
    for epoch in range(num_epochs):
        np.testing.assert_array_equal(np.sort(ids[epochs == epoch]), np.arange(n))


@given(case=balanced_plans(), step=st.integers(0, 30), data=st.data())
def test_another_world_size_reads_the_same_global_batches(case, step, data):
    plan, layout = case
    gbs = plan.global_batch_size
    world_size = data.draw(st.sampled_from([w for w in range(1, gbs + 1) if gbs % w == 0]))
    micro = data.draw(st.sampled_from([m for m in range(1, gbs // world_size + 1) if gbs % (world_size * m) == 0]))
    other = plan.with_world(world_size, micro)
    np.testing.assert_array_equal(np.sort(all_micro_batches(other, step)), np.sort(all_micro_batches(plan, step)))
    assert other.fingerprint() == plan.fingerprint()
    one = plan.with_world(1)
    np.testing.assert_array_equal(np.sort(one.global_batch(step)), np.sort(plan.global_batch(step)))


@given(case=balanced_plans(), step=st.integers(0, 30))
def test_the_balance_is_a_pure_function_of_plan_layout_and_step(case, step):
    """A fresh plan over a fresh layout of the same documents, asked for other steps first, deals the step alike."""
    plan, layout = case
    twin_layout = make_layout(layout.config, np.array(layout.lengths))
    twin = Plan(
        plan.stream.num_samples,
        plan.seed,
        plan.global_batch_size,
        plan.micro_batch_size,
        plan.world_size,
        balance=Balance(twin_layout, plan.balance.cost),
    )
    for s in (step + 7, step + 1, 0, step + 3, step + 2, step + 5):  # fill and clear the cache of recent steps
        twin.slot_order(s)
    np.testing.assert_array_equal(twin.slot_order(step), plan.slot_order(step))
    costs = plan.balance.cost.costs(layout.locate(unbalanced(plan).global_batch(step)))
    np.testing.assert_array_equal(plan.slot_order(step), balanced_order(costs, plan.world_size, plan.micro_batch_size))
    assert len(twin._orders) <= 4  # memory does not grow with the steps asked


@given(case=balanced_plans(), step=st.integers(0, 20), data=st.data())
def test_micro_batches_ahead_equal_micro_batch(case, step, data):
    """The sampler's read-ahead (``micro_batches_from``, across step boundaries) reads what ``micro_batch`` names."""
    plan, _ = case
    rank = data.draw(st.integers(0, plan.world_size - 1))
    micro_step = data.draw(st.integers(0, plan.num_micro_steps(step) - 1))
    ids, where = plan.micro_batches_from(step, micro_step, rank, data.draw(st.integers(1, 9)))
    for row, (s, a) in zip(ids, where):
        np.testing.assert_array_equal(row, plan.micro_batch(s, a, rank))


def test_the_balanced_plan_is_version_3_and_records_its_cost_model():
    layout = make_layout(LayoutConfig(kind="bestfit", seq_len=16), np.arange(1, 60))
    cost = CostModel(attention=0.125, linear=1.0, fixed=2.0)
    plan = Plan(layout.num_samples, 3, 8, 2, 2, balance=Balance(layout, cost))
    assert plan.mapping_version == 3
    assert plan.fingerprint() == {
        "mapping_version": 3,
        "stream": {"kind": "epochs", "num_samples": layout.num_samples, "seed": 3},
        "seed": 3,
        "batch_size_schedule": [[0, 8]],
        "balance": {"algorithm": "lpt", "cost": {"attention": 0.125, "linear": 1.0, "fixed": 2.0}},
    }
    assert Plan(layout.num_samples, 3, 8, 2, 2).fingerprint()["mapping_version"] == 2  # no balance: unchanged
    assert plan.with_world(4, 1).balance == plan.balance


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(mapping_version=2), r"a balanced plan is mapping version 3 .*got mapping_version=2"),
        (dict(mapping_version=1), r"got mapping_version=1"),
        (dict(balance=None, mapping_version=3), r"mapping version 3 is the balanced plan's: give balance="),
        (dict(balance=CostModel()), r"balance must be a Balance or None, got CostModel"),
        (dict(num_samples=7), r"Balance's layout 0 has \d+ samples but the plan draws 7 from it"),
    ],
)
def test_bad_balanced_plans_are_refused(kwargs, message):
    layout = make_layout(LayoutConfig(kind="document", seq_len=8), np.arange(1, 30))
    args = dict(num_samples=layout.num_samples, global_batch_size=4, micro_batch_size=2, balance=Balance(layout))
    with pytest.raises(ValueError, match=message):
        Plan(**(args | kwargs))


def test_balance_needs_a_layout():
    with pytest.raises(ValueError, match="Balance needs the layout whose spans give the costs.*got int"):
        Balance(12)
    with pytest.raises(ValueError, match="Balance.cost must be a CostModel, got dict"):
        Balance(make_layout(LayoutConfig(seq_len=4), np.arange(1, 9)), {"attention": 1.0})


def test_a_balanced_mixture_costs_each_sample_in_its_own_source():
    rng = np.random.default_rng(1)
    layouts = [
        make_layout(LayoutConfig(kind="bestfit", seq_len=64), rng.integers(1, 200, 300)),
        make_layout(LayoutConfig(kind="document", seq_len=64), rng.integers(1, 90, 200)),
    ]
    mixture = Mixture(layouts, [0.5, 0.5], seed=2)
    cost = CostModel(attention=1 / 16)
    plan = Plan(source=mixture, global_batch_size=16, micro_batch_size=2, world_size=4, balance=Balance(layouts, cost))
    plain = Plan(source=mixture, global_batch_size=16, micro_batch_size=2, world_size=4)
    look = mixture.lookup(plain.step_positions(5))
    costs = np.empty(16)
    for k in (0, 1):
        idx = np.flatnonzero(look.source == k)
        costs[idx] = cost.costs(layouts[k].locate(look.source_sample[idx]))
    np.testing.assert_array_equal(plan.slot_order(5), balanced_order(costs, 4, 2))
    np.testing.assert_array_equal(np.sort(plan.global_batch(5)), np.sort(plain.global_batch(5)))
    assert Plan(source=mixture, global_batch_size=16, micro_batch_size=2, balance=Balance(mixture)).mapping_version == 3
    with pytest.raises(ValueError, match="Balance has 1 layouts but the plan draws from 2 source"):
        Plan(source=mixture, global_batch_size=16, micro_batch_size=2, balance=Balance(layouts[0]))


def test_locate_reads_the_balanced_slots_and_refuses_another_layout():
    from detsampler import locate

    lengths = np.random.default_rng(3).integers(1, 300, 400)
    layout = make_layout(LayoutConfig(kind="bestfit", seq_len=128), lengths)
    plan = Plan(layout.num_samples, 0, 16, 2, 4, balance=Balance(layout))
    one = locate(plan, layout, step=9, rank=3, micro_step=1)
    np.testing.assert_array_equal(one.sample_ids, plan.micro_batch(9, 1, 3))
    assert one.spans.sample(1) == layout.locate(plan.micro_batch(9, 1, 3)).sample(1)
    np.testing.assert_array_equal(locate(plan, layout, step=9).positions, plan.step_positions(9))
    twin = make_layout(LayoutConfig(kind="bestfit", seq_len=128), lengths)
    np.testing.assert_array_equal(locate(plan, twin, step=9).sample_ids, plan.global_batch(9))  # an equal layout
    other = make_layout(LayoutConfig(kind="bestfit", seq_len=128, seed=1), lengths)
    with pytest.raises(ValueError, match="the plan balances by the spans of another layout than the one given"):
        locate(plan, other, step=9)


def test_verify_passes_a_balanced_plan_and_its_mixture():
    """verify checks that the micro batches read exactly each step's positions, in whatever slots the balance puts
    them (it compared them in position order before the balance existed)."""
    from detsampler.verify import verify_mixture_plan, verify_plan

    rng = np.random.default_rng(4)
    layout = make_layout(LayoutConfig(kind="bestfit", seq_len=64), rng.integers(1, 200, 300))
    plan = Plan(layout.num_samples, 1, 24, 3, 4, balance=Balance(layout, CostModel(attention=0.5)))
    assert not np.array_equal(plan.step_positions(0), np.sort(plan.step_positions(0)))  # dealt out of order
    report = verify_plan(plan, 0, 3 * layout.num_samples // 24)
    assert report["ok"] and not report["position_problems"]
    assert [row["complete"] for row in report["epochs"]][:2] == [True, True]
    mixture = Mixture(
        [layout, make_layout(LayoutConfig(kind="document", seq_len=64), rng.integers(1, 90, 50))], [3, 1], 0
    )
    mixed = Plan(source=mixture, global_batch_size=24, micro_batch_size=3, world_size=4, balance=Balance(mixture))
    assert verify_mixture_plan(mixed, 0, 40)["ok"]


def test_by_position_puts_a_steps_slots_back_in_position_order():
    """What the trainer and `detsampler show` hash: the same for every cut, balanced or not."""
    layout = make_layout(LayoutConfig(kind="bestfit", seq_len=64), np.random.default_rng(6).integers(1, 200, 300))
    plan = Plan(layout.num_samples, 0, 24, 2, 4, balance=Balance(layout))
    plain = Plan(layout.num_samples, 0, 24, 2, 4)
    for step in (0, 3):
        want = plain.global_batch(step)
        for cut in (plan, plan.with_world(1, 24), plan.with_world(2, 3)):
            np.testing.assert_array_equal(cut.by_position(step, cut.global_batch(step)), want)
        assert plain.by_position(step, want) is want
