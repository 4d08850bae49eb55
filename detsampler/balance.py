"""A compute-balanced step: the same samples, spread across (rank, micro step) so that every rank's work costs the same.

With attention masked per document (bestfit and SFT packing), a sample's cost is not its token count: its attention
grows with the square of each document's length. Each step, the ranks wait at the gradient all-reduce for the one that
drew the most expensive samples. The plan knows every sample's spans, so every rank can compute the same assignment of a
step's samples to ranks and micro steps, with no communication.

The cost model (:class:`CostModel`): a sample of document spans of lengths ``l_j`` costs

    cost = attention * sum_j l_j**2 + linear * sum_j l_j + fixed,

computed from exact integer sums (a sample holds at most 2**31 tokens) with elementwise float64 operations only (each
correctly rounded), so every machine computes the same bits.

The assignment (:func:`balanced_order`), within one step of ``B = W * A * M`` samples (``W`` ranks, ``A`` micro steps
of ``M`` samples):

1. ranks: LPT (longest processing time first) with a cardinality limit. The samples, heaviest first (ties by position in
   the step), each go to the rank of least cost so far (ties: the lower rank) among those holding fewer than ``A * M``.
2. micro steps: each rank's samples, heaviest first, into its ``A`` micro batches of ``M`` the same way.
3. order: each rank's micro batches heaviest first, so that the ranks' heavy micro batches run at the same micro step
   (with FSDP the ranks also meet at every micro step's collectives).

Why LPT and not Karmarkar-Karp: side by side over 5 steps of bestfit samples from a long-tailed length distribution
(``seq_len`` 8k, 32k, 128k; 8, 64, 512 ranks; 8 samples a rank), the balanced largest-differencing method (KK with
equal cardinalities: the step's rounds of ``W`` samples merged largest difference first) reached a max/mean of 1.003
to 1.020 and LPT 1.004 to 1.015, in about the same time (0.03 to 3 ms both); on lognormal costs (sigma 0.8, 16 ranks of
8 samples), where a rank that drew a heavy sample must get the lightest ones, KK reached 1.01 to 1.77 and LPT 1.01 to
1.34: KK's merges keep one sample per rank from every round, LPT's limit lets the heavy rank wait for the tail. LPT is
a heap over ``W`` ranks: O(B log B) with the sort.

Invariants (tests/test_balance.py): the order is a permutation of the step's samples (the global batch, hence the
gradient up to summation order, is unchanged); every (rank, micro step) gets ``M`` of them; it is a pure function of
the costs, the world size and the micro batch size. LPT is a heuristic, not an optimum (and the most expensive rank can
never cost less than the step's heaviest sample): benchmark 20 measures how close to the mean it gets.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass, field
from heapq import heappop, heapreplace
from typing import Any

import numpy as np

from detsampler.spans import Spans

__all__ = ["BALANCE_ALGORITHM", "MAX_SAMPLE_TOKENS", "Balance", "CostModel", "balanced_order", "sample_costs"]

BALANCE_ALGORITHM = "lpt"  # recorded in the fingerprint: another algorithm would be another mapping version
MAX_SAMPLE_TOKENS = 2**31  # a sample's sum of squared span lengths stays below 2**62: exact in int64


def _coefficient(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value < 0:
        raise ValueError(f"CostModel.{name} must be a finite number >= 0, got {value!r}")
    return float(value)


@dataclass(frozen=True, kw_only=True)
class CostModel:
    """The modeled cost of a packed sample with attention masked per document: ``attention * sum(l**2) + linear *
    sum(l) + fixed`` over the lengths ``l`` (tokens) of its document spans.

    Only ratios matter to the balance (scaling all three changes no assignment); the defaults are in units of one
    token's linear work (``linear = 1``), calibrated on this repository's machine (docs/design.md, "A compute-balanced
    plan"). Pass coefficients measured on your own hardware (``detsampler.loader.calibrate``). ``CostModel.tokens()``
    (``attention = 0``) balances tokens: padding-free SFT, where micro batches hold different numbers of tokens.
    """

    attention: float = 0.00125
    linear: float = 1.0
    fixed: float = 0.0

    def __post_init__(self) -> None:
        for name in ("attention", "linear", "fixed"):
            object.__setattr__(self, name, _coefficient(getattr(self, name), name))
        if self.attention == 0 and self.linear == 0:
            raise ValueError(
                "CostModel.attention and CostModel.linear are both 0: every sample would cost the same, nothing to"
                " balance; give at least one of them > 0"
            )

    @classmethod
    def tokens(cls) -> CostModel:
        """Cost = tokens: per-rank token balance (padding-free SFT)."""
        return cls(attention=0.0, linear=1.0, fixed=0.0)

    def costs(self, spans: Spans) -> np.ndarray:
        """The cost of each sample of ``spans`` (float64, one per sample): a pure function of the span lengths."""
        lengths = np.asarray(spans.stops, dtype=np.int64) - np.asarray(spans.starts, dtype=np.int64)
        offsets = np.asarray(spans.offsets, dtype=np.int64)
        tokens = _sums(lengths, offsets)
        if tokens.size and int(tokens.max()) > MAX_SAMPLE_TOKENS:
            raise ValueError(f"a sample of {int(tokens.max())} tokens: the cost model takes at most 2**31 per sample")
        squares = _sums(lengths * lengths, offsets)  # <= tokens**2 <= 2**62: exact
        return (self.attention * squares.astype(np.float64) + self.linear * tokens.astype(np.float64)) + self.fixed

    def describe(self) -> dict:
        return {"attention": self.attention, "linear": self.linear, "fixed": self.fixed}


def _sums(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Exact int64 sums of ``values[offsets[i]:offsets[i+1]]`` (0 for an empty sample)."""
    out = np.zeros(len(offsets) - 1, dtype=np.int64)
    nonempty = np.flatnonzero(offsets[1:] > offsets[:-1])
    if nonempty.size:
        out[nonempty] = np.add.reduceat(values, offsets[nonempty])
    return out


def _layouts(layout: Any) -> tuple[Any, ...]:
    """One layout, or a mixture's: a list of layouts or a Mixture built over layouts (its ``sources``)."""
    if hasattr(layout, "locate"):
        return (layout,)
    sources = getattr(layout, "sources", layout)
    listed = isinstance(sources, Sequence) and not isinstance(sources, (str, bytes)) and len(sources) > 0
    if listed and all(hasattr(x, "locate") for x in sources):
        return tuple(sources)
    raise ValueError(
        "Balance needs the layout whose spans give the costs: a layout, or for a mixture the sources' layouts (a list"
        f" or a Mixture built over layouts), got {type(layout).__name__}"
    )


@dataclass(frozen=True)
class Balance:
    """``Plan(..., balance=Balance(layout, cost))``: each step's samples spread across (rank, micro step) by their
    modeled cost (:func:`balanced_order`). ``layout``: the layout the plan's samples index (for a mixture, the sources'
    layouts, a list, or the Mixture built over them); it gives each sample's spans and is identified by the data
    fingerprint's layout, so :meth:`describe` records only the algorithm and the cost model."""

    layout: Any = field(compare=False, repr=False)
    cost: CostModel = field(default_factory=CostModel)
    layouts: tuple[Any, ...] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.cost, CostModel):
            raise ValueError(f"Balance.cost must be a CostModel, got {type(self.cost).__name__}")
        object.__setattr__(self, "layouts", _layouts(self.layout))

    def check(self, stream: Any) -> None:
        """Raise unless the layouts hold exactly the samples ``stream`` draws (one layout, or one per mixture
        source)."""
        sizes = list(getattr(stream, "sizes", [stream.num_samples]))
        if len(sizes) != len(self.layouts):
            raise ValueError(
                f"Balance has {len(self.layouts)} layouts but the plan draws from {len(sizes)} source(s): give one"
                " layout per source"
            )
        for k, (lay, n) in enumerate(zip(self.layouts, sizes)):
            if int(lay.num_samples) != int(n):
                raise ValueError(f"Balance's layout {k} has {lay.num_samples} samples but the plan draws {n} from it")

    def describe(self) -> dict:
        return {"algorithm": BALANCE_ALGORITHM, "cost": self.cost.describe()}


def sample_costs(balance: Balance, stream: Any, positions: np.ndarray) -> np.ndarray:
    """The modeled cost of the samples at global ``positions`` of ``stream`` (for a mixture, each from its own source's
    layout)."""
    lookup = getattr(stream, "lookup", None)
    if lookup is None:
        return balance.cost.costs(balance.layouts[0].locate(stream.sample_ids(positions)))
    found = lookup(positions)
    out = np.empty(len(positions), dtype=np.float64)
    for k in np.unique(found.source).tolist():
        idx = np.flatnonzero(found.source == k)
        out[idx] = balance.cost.costs(balance.layouts[k].locate(found.source_sample[idx]))
    return out


def _lpt(values: list[float], bins: int, capacity: int) -> tuple[list[int], list[float]]:
    """LPT with a cardinality limit: ``values`` (heaviest first), each to the bin of least load so far (ties: the lower
    bin) among those holding fewer than ``capacity``. Returns ``(bin of each value, loads)``; O(n log bins)."""
    heap = [(0.0, b) for b in range(bins)]  # sorted, hence a heap
    count, loads, out = [0] * bins, [0.0] * bins, []
    for value in values:
        load, b = heap[0]
        out.append(b)
        count[b] += 1
        loads[b] = load + value  # NOTE: one IEEE double addition, as on every machine
        if count[b] == capacity:
            heappop(heap)
        else:
            heapreplace(heap, (loads[b], b))
    return out, loads


def balanced_order(costs: np.ndarray, world_size: int, micro_batch_size: int) -> np.ndarray:
    """The step's samples by slot: ``order[(a * world_size + r) * micro_batch_size + i]`` is the index (into
    ``costs``, the step's samples' costs in position order) of row ``i`` of rank ``r``'s micro step ``a``.

    A permutation of ``range(len(costs))``, a pure function of its arguments (module doc: LPT with a cardinality limit
    to ranks, then to each rank's micro batches, heaviest first). ``len(costs)`` must be a multiple of ``world_size *
    micro_batch_size``.
    """
    costs = np.asarray(costs, dtype=np.float64)
    size, per_rank = len(costs), len(costs) // world_size
    if size == 0 or size % (world_size * micro_batch_size):
        raise ValueError(
            f"a step of {size} samples does not split into world_size * micro_batch_size = {world_size} *"
            f" {micro_batch_size} rows"
        )
    micro_steps = per_rank // micro_batch_size
    heavy = np.argsort(-costs, kind="stable")  # heaviest first, ties by position in the step
    ranks, _ = _lpt(costs[heavy].tolist(), world_size, per_rank)
    by_rank = np.argsort(np.array(ranks, dtype=np.int64), kind="stable")  # each rank's samples, heaviest first
    items = heavy[by_rank].reshape(world_size, per_rank)
    if micro_steps == 1 or micro_batch_size == 1:  # one way to fill the micro batches, already heaviest first
        return np.ascontiguousarray(items.reshape(world_size, micro_steps, micro_batch_size).transpose(1, 0, 2)).ravel()
    micro = np.empty((world_size, per_rank), dtype=np.int64)
    loads = np.empty((world_size, micro_steps), dtype=np.float64)
    for r in range(world_size):
        dealt, loads[r] = _lpt(costs[items[r]].tolist(), micro_steps, micro_batch_size)
        micro[r] = dealt
    # each rank's micro batches heaviest first (ties by micro batch), rows in dealing order within each
    rank_order = np.argsort(-loads, axis=1, kind="stable")
    slot_of_micro = np.argsort(rank_order, axis=1, kind="stable")
    key = np.take_along_axis(slot_of_micro, micro, axis=1)  # [W, per_rank]: the micro step of each item
    within = np.argsort(key, axis=1, kind="stable")  # items by micro step, dealing order kept within one
    cells = np.take_along_axis(items, within, axis=1).reshape(world_size, micro_steps, micro_batch_size)
    return np.ascontiguousarray(cells.transpose(1, 0, 2)).reshape(-1)
