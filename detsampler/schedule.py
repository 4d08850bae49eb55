"""Step schedules: a value that changes at given steps (a batch-size ramp, mixture weights), read one way everywhere.

Invariant: :func:`parse_step_schedule` returns ``((step_0, v_0), (step_1, v_1), ...)`` with ``step_0 == 0`` and strictly
increasing integer steps, each value passed through ``parse_value``; anything else is a ValueError that names the
schedule, the entry and what is allowed (tests/test_foundations.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from detsampler.checks import is_int

__all__ = ["parse_step_schedule", "value_at"]

V = TypeVar("V")


def parse_step_schedule(entries: Any, parse_value: Callable[[Any, str], V], name: str) -> tuple[tuple[int, V], ...]:
    """``entries`` (``(first_step, value)`` pairs) as a checked schedule.

    Args:
        entries: a non-empty sequence of ``(first_step, value)`` pairs.
        parse_value: checks and converts one value; gets the value and a label for messages.
        name: the schedule's name, for messages.

    Returns:
        The entries as ``(int step, parsed value)`` tuples, starting at step 0, steps strictly increasing.
    """
    if isinstance(entries, (str, bytes)) or not isinstance(entries, Sequence) or not entries:
        raise ValueError(f"{name} must be a non-empty list of (first_step, value) pairs, got {entries!r}")
    rows = []
    for i, entry in enumerate(entries):
        if isinstance(entry, (str, bytes)) or not isinstance(entry, Sequence) or len(entry) != 2:
            raise ValueError(f"{name} entry {i} must be a (first_step, value) pair, got {entry!r}")
        step, value = entry
        if not is_int(step) or step < 0:
            raise ValueError(f"{name} entry {i}: the first step must be an integer >= 0, got {step!r}")
        rows.append((int(step), parse_value(value, f"{name} entry {i} (step {step})")))
    if rows[0][0] != 0:
        raise ValueError(f"{name} must start at step 0, got its first entry at step {rows[0][0]}")
    for (s0, _), (s1, _) in zip(rows, rows[1:]):
        if s1 <= s0:
            raise ValueError(f"{name} steps must be strictly increasing, got step {s1} after step {s0}")
    return tuple(rows)


def value_at(schedule: Sequence[tuple[int, V]], step: int) -> V:
    """The value in force at ``step``: that of the last entry whose first step is ``<= step``."""
    value = schedule[0][1]
    for first, v in schedule:
        if first > step:
            break
        value = v
    return value
