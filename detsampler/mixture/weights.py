"""Exact integer mixture weights: weight lists (numbers, or fraction strings such as ``"1/3"``) to integers ``c_k``, and
weight schedules to ``(first_step, integers)`` rows.

Invariants (see :mod:`detsampler.mixture`, "Weights"): a weight is read as an exact fraction (a float by its shortest
decimal form); the integers are proportional to the weights, with ``gcd == 1`` and ``sum <= MAX_DENOMINATOR``, quantized
(largest remainder, ties to the lower index) only when exact integers would sum to more. Floating point never enters
the mapping.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

import numpy as np

from detsampler.schedule import parse_step_schedule

__all__ = ["MAX_DENOMINATOR", "as_weight_list", "normalize_weights", "parse_schedule"]

MAX_DENOMINATOR = 1 << 30  # integer weights sum to at most this: every product in the routing fits in int64


def _as_fraction(value: Any, where: str) -> Fraction:
    if isinstance(value, bool):
        raise ValueError(f"{where} must be a number, got {value!r}")
    if isinstance(value, str):
        try:
            frac = Fraction(value.strip())
        except (ValueError, ZeroDivisionError):
            raise ValueError(f"{where} must be a number such as 0.25 or '1/3', got {value!r}") from None
        return frac
    if isinstance(value, (Fraction, numbers.Integral)):
        return Fraction(int(value)) if isinstance(value, numbers.Integral) else value
    if isinstance(value, numbers.Real):
        f = float(value)
        if not math.isfinite(f):
            raise ValueError(f"{where} must be finite, got {value!r}")
        if isinstance(
            value, np.floating
        ):  # the shortest decimal that reads back in its own precision: float32 0.1 is 1/10
            return Fraction(np.format_float_positional(value, unique=True, trim="0"))
        return Fraction(repr(f))  # the shortest decimal that reads back as this float: 0.1 is 1/10
    raise ValueError(f"{where} must be a number, got {type(value).__name__} {value!r}")


def _quantize(fracs: list[Fraction], total: Fraction, weights: Sequence[Any], name: str) -> tuple[int, ...]:
    """Largest-remainder quantization of ``fracs`` to ``MAX_DENOMINATOR`` (ties to the lower index),
    reduced by the gcd."""
    num_sources = len(fracs)
    scaled = [f / total * MAX_DENOMINATOR for f in fracs]
    floors = [math.floor(s) for s in scaled]
    order = sorted(range(num_sources), key=lambda k: (-(scaled[k] - floors[k]), k))
    for k in order[: MAX_DENOMINATOR - sum(floors)]:
        floors[k] += 1
    for k, (f, c) in enumerate(zip(fracs, floors)):
        if f > 0 and c == 0:
            raise ValueError(f"{name}[{k}] = {weights[k]!r} is below 2**-30 of the total: too small to be served")
    g = math.gcd(*floors)
    return tuple(c // g for c in floors)


def normalize_weights(weights: Sequence[Any], num_sources: int, name: str = "weights") -> tuple[int, ...]:
    """Exact integer weights ``c_k`` (``gcd == 1``, ``sum <= MAX_DENOMINATOR``) proportional to ``weights``.

    Raises ValueError for a wrong count, a negative, non-finite or non-numeric weight, or all weights zero.
    """
    weights = as_weight_list(weights, name)
    if isinstance(weights, (str, bytes)) or not isinstance(weights, Sequence):
        raise ValueError(f"{name} must be a list of {num_sources} numbers, got {weights!r}")
    if len(weights) != num_sources:
        raise ValueError(
            f"{name} must have one weight per source ({num_sources}), got {len(weights)}: {list(weights)!r}"
        )
    fracs = [_as_fraction(w, f"{name}[{k}]") for k, w in enumerate(weights)]
    for k, f in enumerate(fracs):
        if f < 0:
            raise ValueError(f"{name}[{k}] must be >= 0, got {weights[k]!r}")
    total = sum(fracs, Fraction(0))
    if total == 0:
        raise ValueError(f"{name} must not all be zero, got {list(weights)!r}")
    denominator = math.lcm(*(f.denominator for f in fracs))
    ints = [int(f * denominator) for f in fracs]
    g = math.gcd(*ints)
    ints = [c // g for c in ints]
    if sum(ints) <= MAX_DENOMINATOR:
        return tuple(ints)
    # Too fine to route exactly: largest-remainder quantization to MAX_DENOMINATOR (ties to the lower index).
    return _quantize(fracs, total, weights, name)


def as_weight_list(weights: Any, where: str) -> Any:
    """A 1-D numpy array of weights as a list of its elements (numpy scalars kept, so float32 reads as float32)."""
    if isinstance(weights, np.ndarray):
        if weights.ndim != 1:
            raise ValueError(
                f"{where} must be one weight per source or a schedule [(first_step, weights), ...], "
                f"got a {weights.ndim}-D array of shape {weights.shape}"
            )
        return list(weights)
    return weights


def parse_schedule(weights: Any, num_sources: int) -> tuple[tuple[int, tuple[int, ...]], ...]:
    """``weights`` as a schedule of ``(first_step, integer weights)``: a plain list of numbers is ``[(0, weights)]``.

    Weight lists may be 1-D numpy arrays (the weights of a schedule entry too)."""
    weights = as_weight_list(weights, "weights")
    if isinstance(weights, Sequence) and not isinstance(weights, (str, bytes)):
        weights = [
            (
                (e[0], as_weight_list(e[1], f"weights schedule entry {i}"))
                if isinstance(e, Sequence) and not isinstance(e, (str, bytes)) and len(e) == 2
                else e
            )
            for i, e in enumerate(weights)
        ]
    is_schedule = (
        isinstance(weights, Sequence)
        and not isinstance(weights, (str, bytes))
        and len(weights) > 0
        and all(
            isinstance(e, Sequence)
            and not isinstance(e, (str, bytes))
            and len(e) == 2
            and isinstance(e[1], Sequence)
            and not isinstance(e[1], (str, bytes))
            for e in weights
        )
    )
    if not is_schedule:
        return ((0, normalize_weights(weights, num_sources)),)
    return parse_step_schedule(
        weights, lambda ws, label: normalize_weights(ws, num_sources, label), "the weights schedule"
    )
