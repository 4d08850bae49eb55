"""Hypothesis strategies shared by the property tests."""

from __future__ import annotations

from hypothesis import strategies as st

__all__ = ["integer_weights", "seeds", "skip_ranges", "weight_schedules"]

seeds = st.integers(min_value=0, max_value=2**32)


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
