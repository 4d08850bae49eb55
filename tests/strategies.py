"""Hypothesis strategies shared by the core's property tests; each shrinks toward small sizes."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from detsampler.plan import Plan

seeds = st.integers(min_value=0, max_value=2**64 - 1)
domain_sizes = st.one_of(
    st.integers(min_value=1, max_value=300),
    st.sampled_from([2**k + d for k in range(1, 13) for d in (-1, 0, 1)]),
)


@st.composite
def doc_lengths(draw, max_docs: int = 40, max_len: int = 60) -> np.ndarray:
    """Per-document token counts, empty documents included."""
    lengths = draw(st.lists(st.integers(min_value=0, max_value=max_len), min_size=1, max_size=max_docs))
    return np.array(lengths, dtype=np.int64)


@st.composite
def plans(draw, max_samples: int = 200, schedule: bool = False) -> Plan:
    """A plan with arbitrary samples per epoch, world size, micro batch size and accumulation (and
    optionally a ramp)."""
    num_samples = draw(st.integers(min_value=1, max_value=max_samples))
    world_size = draw(st.integers(min_value=1, max_value=4))
    micro_batch_size = draw(st.integers(min_value=1, max_value=4))
    per_micro = world_size * micro_batch_size
    accum = draw(st.integers(min_value=1, max_value=3))
    global_batch_size = per_micro * accum
    ramp = None
    if schedule:
        sizes = draw(st.lists(st.integers(min_value=1, max_value=3), min_size=1, max_size=3))
        starts = sorted(draw(st.sets(st.integers(min_value=1, max_value=20), min_size=len(sizes), max_size=len(sizes))))
        ramp = [(0, per_micro)] + [(s, per_micro * k) for s, k in zip(starts, sizes)]
        global_batch_size = ramp[-1][1]
    return Plan(num_samples, draw(seeds), global_batch_size, micro_batch_size, world_size, ramp)


def steps_per_epoch(plan: Plan) -> int:
    """Whole steps that fit in one epoch (at least 1), for constant-batch plans."""
    return max(1, plan.stream.num_samples // plan.global_batch_size)


# -- mixtures and skip ranges (tests/test_mixture.py, tests/test_skip.py)
# -------------------------------------------------


@st.composite
def integer_weights(draw, num_sources: int | None = None, max_weight: int = 20) -> list[int]:
    """Non-negative integer weights, at least one positive."""
    k = num_sources if num_sources is not None else draw(st.integers(1, 6))
    weights = draw(st.lists(st.integers(0, max_weight), min_size=k, max_size=k))
    if not any(weights):
        weights[draw(st.integers(0, k - 1))] = draw(st.integers(1, max_weight))
    return weights


@st.composite
def weight_schedules(draw, num_sources: int, max_entries: int = 3, max_step: int = 12) -> list[tuple[int, list[int]]]:
    """A weights schedule ``[(0, w0), (s1, w1), ...]`` with strictly increasing steps."""
    steps = sorted(draw(st.sets(st.integers(1, max_step), max_size=max_entries - 1)))
    return [(s, draw(integer_weights(num_sources))) for s in [0, *steps]]


@st.composite
def skip_ranges(draw, max_step: int = 30, max_ranges: int = 3, max_len: int = 4) -> list[tuple[int, int]]:
    """Disjoint inclusive ranges of data steps, in increasing order."""
    ranges, start = [], draw(st.integers(0, max_step // 3))
    for _ in range(draw(st.integers(0, max_ranges))):
        a = start + draw(st.integers(0, max_step // 3))
        b = a + draw(st.integers(0, max_len - 1))
        ranges.append((a, b))
        start = b + 1
    return ranges


# -- balanced plans (tests/test_balance.py)
# ------------------------------------------------------------------------------------------------


@st.composite
def step_costs(draw, max_world: int = 24) -> tuple[np.ndarray, int, int]:
    """A step's sample costs (ties and zeros included) with a world size and micro batch size that split it; the world
    size reaches above 16 (balanced_order's numpy path) only when drawn."""
    world_size = draw(st.one_of(st.integers(1, 4), st.integers(1, max_world)))
    micro_batch_size = draw(st.integers(1, 3))
    micro_steps = draw(st.integers(1, 4))
    size = world_size * micro_batch_size * micro_steps
    values = st.one_of(st.integers(0, 5).map(float), st.floats(0, 1e6, allow_nan=False, allow_infinity=False))
    costs = draw(st.lists(values, min_size=size, max_size=size))
    return np.array(costs, dtype=np.float64), world_size, micro_batch_size


@st.composite
def balanced_plans(draw, max_docs: int = 40) -> tuple[Plan, object]:
    """A balanced plan and its layout: any layout kind over short documents, any cost model, world size, micro batch
    size and accumulation (shrinking toward one rank, one micro step)."""
    from detsampler.balance import Balance, CostModel
    from detsampler.layout import LayoutConfig, make_layout

    kind = draw(st.sampled_from(["bestfit", "document", "concat"]))
    seq_len, lengths = draw(st.integers(2, 24)), draw(doc_lengths(max_docs))
    if kind == "concat":  # at least one whole sample: seq_len + 1 tokens
        lengths += 1
        seq_len = min(seq_len, int(lengths.sum()) + len(lengths) - 1)
    layout = make_layout(LayoutConfig(kind=kind, seq_len=seq_len, seed=draw(seeds)), lengths)
    attention = draw(st.sampled_from([0.0, 1 / 64, 0.25, 4.0]))
    cost = CostModel(attention=attention, linear=draw(st.sampled_from([1.0, 0.5] if attention else [1.0])))
    world_size = draw(st.integers(1, 4))
    micro_batch_size = draw(st.integers(1, 3))
    accum = draw(st.integers(1, 3))
    gbs = world_size * micro_batch_size * accum
    plan = Plan(layout.num_samples, draw(seeds), gbs, micro_batch_size, world_size, balance=Balance(layout, cost))
    return plan, layout
