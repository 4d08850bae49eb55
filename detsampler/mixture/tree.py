"""The routing tree of one mixture segment: global positions -> (source, position in that source), integers only.

Invariants (see :mod:`detsampler.mixture`, "Routing" and "Bound"): the sources of positive weight, in a seeded order,
are the leaves of a balanced binary tree; a node of weight ``T`` whose left child weighs ``a`` sends its ``q``-th
position left iff ``L(q + 1) > L(q)`` with ``L(q) = floor((q * a + r) / T)`` and a seeded phase ``r`` in ``[0, T)``;
every value stays below ``2**62`` in int64 (``a, r < T <= MAX_DENOMINATOR``). :func:`leaf_counts` is the closed form of
what :func:`route` does to a prefix of positions.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from detsampler.keys import stable_hash64

__all__ = ["RouteNode", "build_tree", "leaf_bounds", "leaf_counts", "leaf_path", "route", "unroute"]


@dataclass(frozen=True)
class RouteNode:
    """A node of a segment's routing tree: ``leaf`` is a source index, or ``-1`` for an inner node."""

    weight: int
    leaf: int = -1
    left: RouteNode | None = None
    right: RouteNode | None = None
    phase: int = 0


def build_tree(ints: tuple[int, ...], seed: int, first_step: int) -> RouteNode:
    """The routing tree of integer weights ``ints`` for the segment starting at ``first_step``."""
    # The sources of positive weight, in a seeded order (so that the interleaving pattern itself depends on the seed).
    active = sorted(
        (k for k, c in enumerate(ints) if c > 0), key=lambda k: stable_hash64("mixture-order", seed, first_step, k)
    )

    def build(ks: list[int]) -> RouteNode:
        if len(ks) == 1:
            return RouteNode(weight=ints[ks[0]], leaf=ks[0])
        mid = len(ks) // 2
        left, right = build(ks[:mid]), build(ks[mid:])
        weight = left.weight + right.weight
        phase = stable_hash64("mixture-phase", seed, first_step, *ks) % weight
        return RouteNode(weight=weight, left=left, right=right, phase=phase)

    return build(active)


def _left_count(q: np.ndarray, node: RouteNode) -> np.ndarray:
    """``L(q) = floor((q * a + r) / T)`` in int64 without overflow (``a, r < T <= 2**30``)."""
    a, t = node.left.weight, node.weight
    return (q // t) * a + ((q % t) * a + node.phase) // t


def route(node: RouteNode, idx: np.ndarray, q: np.ndarray, out_source: np.ndarray, out_pos: np.ndarray) -> None:
    """Send positions ``idx`` (the ``q``-th positions of ``node``) down to the leaves: fills source
    and leaf position."""
    if node.leaf >= 0:
        out_source[idx] = node.leaf
        out_pos[idx] = q
        return
    lq = _left_count(q, node)
    go_left = _left_count(q + 1, node) > lq
    route(node.left, idx[go_left], lq[go_left], out_source, out_pos)
    right = ~go_left
    route(node.right, idx[right], q[right] - lq[right], out_source, out_pos)


def leaf_counts(node: RouteNode, n: int, out: list[int]) -> None:
    """How many of a segment's first ``n`` positions each source gets (exact, Python ints)."""
    if node.leaf >= 0:
        out[node.leaf] += n
        return
    left = (n * node.left.weight + node.phase) // node.weight
    leaf_counts(node.left, left, out)
    leaf_counts(node.right, n - left, out)


def leaf_bounds(node: RouteNode, path: tuple[int, ...], out: list[Fraction]) -> None:
    """The per-source bound ``sum_i w_k / W(u_i) = sum_i c_k / T(u_i)`` over the nodes below the root (the mixture
    module's docstring)."""
    if node.leaf >= 0:
        out[node.leaf] = sum((Fraction(node.weight, t) for t in path), Fraction(0))
        return
    leaf_bounds(node.left, path + (node.left.weight,), out)
    leaf_bounds(node.right, path + (node.right.weight,), out)


def leaf_path(node: RouteNode, leaf: int) -> list[tuple[RouteNode, bool]] | None:
    """The inner nodes from the root down to leaf ``leaf``, each with True where the path goes left; None when the
    source is not a leaf of this tree (weight 0 in the segment)."""
    if node.leaf >= 0:
        return [] if node.leaf == leaf else None
    for child, is_left in ((node.left, True), (node.right, False)):
        below = leaf_path(child, leaf)
        if below is not None:
            return [(node, is_left), *below]
    return None


def unroute(path: list[tuple[RouteNode, bool]], q: int) -> int:
    """The inverse of :func:`route`: the root position whose route ends as the ``q``-th position of the leaf at the end
    of ``path`` (exact, Python ints). A node of weight ``T``, left weight ``a`` and phase ``r`` sends its ``p``-th
    position left iff ``L(p + 1) > L(p)``, ``L(p) = floor((p * a + r) / T)``; so the left child's ``q``-th position is
    the smallest ``p`` with ``L(p + 1) >= q + 1``, ``p = ceil(((q + 1) T - r) / a) - 1``, and the right child's (``R(p)
    = p - L(p) = ceil((p b - r) / T)``, ``b = T - a``) the smallest ``p`` with ``R(p + 1) >= q + 1``, ``p = floor((q T
    + r) / b)``."""
    for node, is_left in reversed(path):
        t, a, r = node.weight, node.left.weight, node.phase
        q = -((r - (q + 1) * t) // a) - 1 if is_left else (q * t + r) // (t - a)
    return q
