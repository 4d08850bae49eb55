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
    """A plan with arbitrary samples per epoch, world size, micro batch size and accumulation (and optionally a ramp)."""
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
