"""The permutation's statistics against a uniform random permutation, with thresholds calibrated on numpy's.

Every statistic is a z-score (tests/permutation_battery.py); numpy's ``Generator.permutation`` passes the same battery
at the same sizes (``test_numpy_passes_the_battery``), so ``|z| < 5`` is fair, and version 1 fails it
(``test_version_1_fails_the_battery``), so the battery can fail. The keys are those the plan uses: consecutive epoch
keys.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from detsampler.permutation import permute
from detsampler.plan import EpochStream
from tests.permutation_battery import (
    Z_LIMIT,
    avalanche_z,
    cycles_z,
    epoch_pairs_z,
    fixed_points_z,
    four_point_z,
    numpy_rows,
    orders_z,
    parity_z,
)


def rows(k: int, n: int, version: int = 2, seed: int = 7, first_epoch: int = 0) -> np.ndarray:
    """The permutations of epochs ``first_epoch .. first_epoch + k - 1`` of a plan with ``seed`` over ``n`` samples."""
    keys = EpochStream(n, seed).epoch_key(np.arange(first_epoch, first_epoch + k))
    return permute(np.tile(np.arange(n), k), n, np.repeat(keys, n), version).reshape(k, n)


def assert_within(**z: float) -> None:
    bad = {name: round(v, 2) for name, v in z.items() if not abs(v) < Z_LIMIT}
    assert not bad, f"|z| >= {Z_LIMIT}: {bad}"


@pytest.mark.parametrize("n", [3, 5, 6, 7])
def test_every_order_is_reachable_and_equally_likely(n):
    cells = math.factorial(n)
    z, seen = orders_z(rows(20 * cells, n))
    assert seen == cells  # 20 draws per order: a uniform family misses one with probability about cells * e**-20
    assert_within(orders=z)


def test_orders_of_eight_are_uniform():
    """Version 1 reaches 1344 of the 40320 orders of ``range(8)`` (an affine family), with a chi-square z above 4e4."""
    z, seen = orders_z(rows(10 * 40320, 8))
    assert seen > 40000  # uniform: about 40320 * (1 - e**-10) = 40318 seen
    assert_within(orders=z)


@pytest.mark.parametrize("n", [2, 3, 64, 1023, 1024, 1025, 4096, 4097])
def test_parity_fixed_points_and_cycles_are_those_of_a_random_permutation(n):
    """Parity in particular: an XOR Feistel network gives every key the parity of ``n`` (1023: odd, 1024: even)."""
    r = rows(2000 if n <= 1025 else 300, n)
    assert_within(parity=parity_z(r), fixed_points=fixed_points_z(r) if n > 1 else 0.0, cycles=cycles_z(r))


@pytest.mark.parametrize("n", [8, 16, 128, 1024, 2048])
def test_no_four_point_differential(n):
    """``P[x] ^ P[x^a] ^ P[x^b] ^ P[x^a^b] == 0`` as often as for a random permutation (always, for an affine map)."""
    assert_within(four_point=four_point_z(rows(4000 if n <= 128 else 1000, n)))


@pytest.mark.parametrize("n", [16, 1000, 1024, 1025, 3000])
def test_avalanche(n):
    """Flipping input bit i flips output bit j as often as for a random permutation, for every (i, j)."""
    assert_within(avalanche=avalanche_z(rows(3000 if n <= 1024 else 1500, n)))


@pytest.mark.parametrize("n", [10, 1000, 1025, 5000])
def test_consecutive_epochs_are_independent(n):
    """Epoch e + 1 agrees with epoch e at a Poisson(1) number of positions and is uncorrelated with it."""
    r = rows(1001, n)
    agree, corr = epoch_pairs_z(r[:-1], r[1:])
    assert_within(agreements=agree, correlation=corr)


def test_numpy_passes_the_battery():
    """The calibration: numpy's permutation, at the sizes above, stays within the same limit."""
    for n in (7, 8):
        assert_within(orders=orders_z(numpy_rows(10 * math.factorial(n), n))[0])
    for n in (64, 1023, 1024, 1025):
        r = numpy_rows(2000, n)
        agree, corr = epoch_pairs_z(r[:-1], r[1:])
        assert_within(
            parity=parity_z(r),
            fixed_points=fixed_points_z(r),
            cycles=cycles_z(r),
            avalanche=avalanche_z(r),
            agreements=agree,
            correlation=corr,
        )
    for n in (8, 16, 128, 1024):
        assert_within(four_point=four_point_z(numpy_rows(4000, n)))


def test_version_1_fails_the_battery():
    """The flaws of version 1 that version 2 fixes (kept for resuming old runs): the battery sees them."""
    assert orders_z(rows(10 * 40320, 8, version=1))[1] == 1344
    assert parity_z(rows(400, 1024, version=1)) == -math.sqrt(400)  # every key even
    assert parity_z(rows(400, 1023, version=1)) > Z_LIMIT  # (nearly) every key odd
    assert four_point_z(rows(4000, 128, version=1)) > Z_LIMIT
