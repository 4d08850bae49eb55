"""The shared foundations of every tier: integer checks, step schedules, atomic writes (detsampler.checks, .schedule,
.atomic)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from detsampler.atomic import atomic_write
from detsampler.checks import check_int, check_positive_int
from detsampler.schedule import parse_step_schedule, value_at


@pytest.mark.parametrize("value", [True, False, 2.0, 2.7, "3", None, np.float32(1.0), [1]])
def test_check_int_refuses_what_is_not_an_integer(value):
    with pytest.raises(ValueError, match=r"n must be an integer, got"):
        check_int(value, "n")


@pytest.mark.parametrize("value", [0, 5, np.int64(7), np.uint8(3), 2**70])
def test_check_int_returns_a_python_int(value):
    got = check_int(value, "n", minimum=0)
    assert got == int(value) and type(got) is int


def test_check_int_bounds_name_what_is_allowed():
    with pytest.raises(ValueError, match=r"^n must be an integer >= 1, got 0$"):
        check_positive_int(0, "n")
    with pytest.raises(ValueError, match=r"^n must be an integer <= 9, got 10$"):
        check_int(10, "n", minimum=0, maximum=9)


def test_step_schedule_is_checked_and_read():
    schedule = parse_step_schedule([(0, 4), (3, 8), (10, 16)], check_positive_int, "sizes")
    assert schedule == ((0, 4), (3, 8), (10, 16))
    assert [value_at(schedule, s) for s in (0, 2, 3, 9, 10, 10**12)] == [4, 4, 8, 8, 16, 16]
    for bad, message in [
        ([], "non-empty list"),
        ("0:4", "non-empty list"),
        ([(1, 4)], "must start at step 0"),
        ([(0, 4), (3, 8), (3, 16)], "strictly increasing, got step 3 after step 3"),
        ([(0, 4), (-1, 8)], "entry 1: the first step must be an integer >= 0"),
        ([(0.0, 4)], "entry 0: the first step must be an integer"),
        ([(0, 4, 5)], "entry 0 must be a \\(first_step, value\\) pair"),
        ([(0, 0)], "sizes entry 0 \\(step 0\\) must be an integer >= 1"),
    ]:
        with pytest.raises(ValueError, match=message):
            parse_step_schedule(bad, check_positive_int, "sizes")


def test_atomic_write_replaces_whole_and_leaves_nothing_on_failure(tmp_path, monkeypatch):
    target = tmp_path / "meta.json"
    atomic_write(target, "first\n")
    atomic_write(target, b"second\n")
    assert target.read_bytes() == b"second\n"

    def failing_replace(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError, match="No space left"):
        atomic_write(target, "third\n")
    assert target.read_bytes() == b"second\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["meta.json"]  # no temporary file left behind


def test_concat_ranges_expands_each_range_in_order_with_csr_offsets():
    from detsampler.ranges import concat_ranges

    values, offsets = concat_ranges(np.array([5, 0, 9, 2]), np.array([3, 0, 1, 2]))
    assert values.tolist() == [5, 6, 7, 9, 2, 3] and values.dtype == np.int64
    assert offsets.tolist() == [0, 3, 3, 4, 6]
    values, offsets = concat_ranges(np.zeros(0, np.int64), np.zeros(0, np.int64))
    assert values.size == 0 and offsets.tolist() == [0]
