"""A statistical battery for families of permutations of ``range(n)``, as z-scores against a uniform random permutation.

Each statistic is computed over ``K`` permutations (rows of a ``K x n`` matrix) and returned as a z-score: how many
standard deviations its total lies from the exact expectation for uniformly random permutations (or, for the order
counts, Pearson's chi-square standardized). numpy's ``Generator.permutation`` is the reference: run through the same
battery (:func:`numpy_rows`) its z-scores are those of a standard normal, so ``|z| < 5`` is a threshold that a uniform
random permutation fails with probability about 6e-7 per statistic (tests/test_permutation_stats.py runs both).
"""

from __future__ import annotations

import math

import numpy as np

__all__ = [
    "Z_LIMIT",
    "avalanche_z",
    "cycles",
    "cycles_z",
    "epoch_pairs_z",
    "fixed_points_z",
    "four_point_z",
    "numpy_rows",
    "orders_z",
    "parity_z",
]

Z_LIMIT = 5.0


def numpy_rows(k: int, n: int, seed: int = 0) -> np.ndarray:
    """``k`` permutations of ``range(n)`` from numpy's Generator: the reference the thresholds are calibrated on."""
    rng = np.random.default_rng(seed)
    return np.argsort(rng.random((k, n)), axis=1)


def cycles(rows: np.ndarray) -> np.ndarray:
    """The number of cycles of each row, by pointer doubling: each element ends labelled with the least of its cycle."""
    k, n = rows.shape
    label = np.broadcast_to(np.arange(n), (k, n)).copy()
    jump = rows.copy()
    for _ in range(max(1, (n - 1).bit_length())):
        label = np.minimum(label, np.take_along_axis(label, jump, axis=1))
        jump = np.take_along_axis(jump, jump, axis=1)
    return (label == np.arange(n)).sum(axis=1)


def fixed_points_z(rows: np.ndarray) -> float:
    """Fixed points: 1 per permutation on average, variance 1 (n >= 2)."""
    k, n = rows.shape
    return float(((rows == np.arange(n)).sum() - k) / math.sqrt(k))


def _harmonic(n: int, power: int = 1) -> float:
    return float(np.sum(1.0 / np.arange(1, n + 1, dtype=np.float64) ** power))


def cycles_z(rows: np.ndarray) -> float:
    """Cycle count: mean ``H_n``, variance ``H_n - H_n^(2)``."""
    k, n = rows.shape
    mean, var = _harmonic(n), _harmonic(n) - _harmonic(n, 2)
    return float((cycles(rows).sum() - k * mean) / math.sqrt(k * var))


def parity_z(rows: np.ndarray) -> float:
    """Odd permutations: half of them (n >= 2)."""
    k, n = rows.shape
    odd = ((n - cycles(rows)) % 2).sum()
    return float((odd - k / 2) / math.sqrt(k / 4))


def orders_z(rows: np.ndarray) -> tuple[float, int]:
    """(standardized chi-square of the counts of the ``n!`` orders, the number of orders seen); for small ``n``."""
    k, n = rows.shape
    cells = math.factorial(n)
    codes = (rows * (n ** np.arange(n))).sum(axis=1)
    counts = np.unique(codes, return_counts=True)[1]
    expected = k / cells
    chi2 = float(((counts - expected) ** 2).sum() / expected + (cells - counts.size) * expected)
    return (chi2 - (cells - 1)) / math.sqrt(2 * (cells - 1)), int(counts.size)


def avalanche_z(rows: np.ndarray) -> float:
    """The largest |z| over (input bit i, output bit j) of how often flipping input bit i flips output bit j.

    For a uniform permutation two distinct inputs get two distinct uniform outputs, so output bit j differs with
    probability ``2 c (n - c) / (n (n - 1))``, ``c`` the number of values below ``n`` with bit j set.
    """
    k, n = rows.shape
    bits = max(1, (n - 1).bit_length())
    values = np.arange(n)
    worst = 0.0
    for i in range(bits):
        x = values[(values ^ (1 << i)) < n]
        x = x[x < (x ^ (1 << i))]  # each pair once
        diff = rows[:, x] ^ rows[:, x ^ (1 << i)]
        for j in range(bits):
            c = int(((values >> j) & 1).sum())
            p = 2 * c * (n - c) / (n * (n - 1))
            if p in (0.0, 1.0):
                continue
            total = diff.size
            flips = int(((diff >> j) & 1).sum())
            worst = max(worst, abs(flips - total * p) / math.sqrt(total * p * (1 - p)))
    return worst


def four_point_z(rows: np.ndarray, samples_per_row: int = 64, seed: int = 0) -> float:
    """How often ``P[x] ^ P[x^a] ^ P[x^b] ^ P[x^a^b] == 0`` for random distinct ``a, b`` (``n`` a power of two): an
    affine map always gives 0, a uniform permutation with probability ``1 / (n - 3)`` (the fourth image is uniform among
    the ``n - 3`` values left, and the XOR of the first three is one of those values)."""
    k, n = rows.shape
    if n & (n - 1) or n < 8:
        raise ValueError(f"four_point_z needs n a power of two >= 8, got {n}")
    if n <= 32:  # every plane {x, x^a, x^b, x^a^b} once per row: random draws would repeat the few there are
        x, a, b = (v.reshape(-1) for v in np.meshgrid(*[np.arange(n)] * 3, indexing="ij"))
        keep = (a > 0) & (b > a) & ((x ^ a) > x) & ((x ^ b) > x) & ((x ^ a ^ b) > x) & (b != (a ^ b)) & (b < (a ^ b))
        x, a, b = (np.broadcast_to(v[keep], (k, int(keep.sum()))) for v in (x, a, b))
    else:
        rng = np.random.default_rng(seed)
        x, a, b = (rng.integers(lo, n, size=(k, samples_per_row)) for lo in (0, 1, 1))
    ok = a != b
    pick = lambda idx: np.take_along_axis(rows, idx, axis=1)
    zero = (pick(x) ^ pick(x ^ a) ^ pick(x ^ b) ^ pick(x ^ a ^ b)) == 0
    total, p = int(ok.sum()), 1 / (n - 3)
    return float((int((zero & ok).sum()) - total * p) / math.sqrt(total * p * (1 - p)))


def epoch_pairs_z(first: np.ndarray, second: np.ndarray) -> tuple[float, float]:
    """(agreements z, correlation z) of paired rows, e.g. epoch e and e + 1: independent uniform permutations agree at a
    Poisson(1) number of points and have a Pearson correlation of mean 0 and variance ``1 / (n - 1)``."""
    k, n = first.shape
    agree = float(((first == second).sum() - k) / math.sqrt(k))
    a = first - (n - 1) / 2
    b = second - (n - 1) / 2
    corr = (a * b).sum(axis=1) / (a * a).sum(axis=1)  # both rows hold the same values: equal variances
    return agree, float(corr.sum() * math.sqrt(n - 1) / math.sqrt(k))
