"""Deterministic data mixtures: global position -> (source, position in that source) by a pure function, no blending
index.

Weights. Each weight list is turned into exact integers ``c_k`` with ``D = sum(c_k)``: the weights are read as exact
fractions (a float by its shortest decimal form, a string such as ``"1/3"`` as written), scaled by the least common
denominator and reduced. Only when that ``D`` would exceed ``2**30`` are they quantized (largest remainder) to ``D =
2**30``;
``describe()`` always records the exact fractions ``c_k / D`` that are used. Floating point never enters the mapping.

Routing. The sources of positive weight, in a seeded order, are the leaves of a balanced binary tree (split in halves by
count). A node of integer weight ``T`` (the sum of its leaves' ``c_k``) whose left child weighs ``a`` sends its ``q``-th
position (counted among the positions that reached the node) to the left iff ``L(q + 1) > L(q)``, with

    L(q) = floor((q * a + r) / T),   r = hash(seed, first step, node) mod T   (a seeded phase in [0, T)),

and the position becomes the left child's ``L(q)``-th, or the right child's ``(q - L(q))``-th. ``L`` is a Beatty
sequence: the left child's share of any prefix of ``n`` node positions is ``L(n)``, within ``(-1, 1)`` of ``n * a / T``,
and its slots are spread evenly (never in runs longer than needed) with a seeded shift. Evaluated with integer
arithmetic only.

Bound (tests/test_mixture.py, property 1). Let leaf ``k`` hang at depth ``h_k`` under nodes ``u_1 .. u_{h_k}`` below the
root (``u_{h_k}`` is the leaf) and let ``W(u)`` be a node's share of the total weight. Over every prefix of ``n``
positions of a segment, the count ``N_k(n)`` served by source ``k`` satisfies

    |N_k(n) - n * w_k| < sum_{i=1..h_k} w_k / W(u_i)  <=  h_k  <=  ceil(log2 m),

``m`` being the number of sources of positive weight (so < 1 for two sources, < 2 for three or four; a lone source of
positive weight, at depth 0, is served exactly ``n`` times). Proof sketch: with
``e(v) = N_v(n) - n W(v)`` and ``N_c = floor((N_v a + r) / T)`` for a left child ``c`` (``N_v - N_c`` for a right one),
``e(c) = e(v) * W(c) / W(v) + delta`` with ``|delta| < 1``; the root has ``e = 0``; unrolling gives the sum.
Across schedule segments the bound holds within each segment, from its start (over several segments the errors add).

Sources. Source ``k`` (``N_k`` samples) serves its positions ``p_k = 0, 1, 2, ...`` in order: epoch ``p_k // N_k`` and
sample ``permute(p_k % N_k, N_k, key(seed, k, epoch))``; a source smaller than its share is upsampled by whole epochs
(see :meth:`Mixture.report`), never by repeating a sample within one of its epochs. The global sample id of (source
``k``,
sample ``i``) is ``offset_k + i`` with ``offset_k`` the total ``num_samples`` of the sources before ``k``.

Epoch-ordered sources. A source whose layout has ``epoch_order`` (a new document order each epoch: its samples depend
on the epoch) is served with ids that carry its epoch ``e``: its sample ``i`` of epoch ``e`` is ``e * N_k + i`` within
the source and ``e * M + offset_k + i`` globally (``M`` the total ``num_samples``): :meth:`Mixture.split_ids` inverts
both. Other sources' ids are unchanged, and so is every id of a mixture without such a source.

Schedules. ``weights`` may be a list of ``(first_step, weights)`` entries, steps of the data stream (the training steps
when no skip range lies before them), strictly increasing from 0. A :class:`~detsampler.plan.Plan` places each entry at
the global position where its step starts (:meth:`Mixture.with_step_positions`). At a boundary every source continues
from the position it reached: ``p_k`` always counts exactly the earlier positions served by source ``k``, whatever the
schedule.

Cost: a batch of ``B`` positions costs O(B * depth + number of sources + number of segments it touches); memory O(B).

Code: weights and schedules are read in :mod:`detsampler.mixture.weights`, the routing tree is
:mod:`detsampler.mixture.tree`, the configuration in :mod:`detsampler.mixture.config`; this module holds
:class:`Mixture`.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Any, NamedTuple, Protocol

import numpy as np

from detsampler.checks import check_int, is_int
from detsampler.keys import stable_hash64, subkeys
from detsampler.mixture.tree import RouteNode, build_tree, leaf_bounds, leaf_counts, leaf_path, route, unroute
from detsampler.mixture.weights import parse_schedule
from detsampler.permutation import MAX_DOMAIN, check_mapping_version, permute
from detsampler.version import MAPPING_VERSION

__all__ = ["Mixture", "MixtureLookup", "Source"]


class Source(Protocol):
    """Anything with a number of samples per epoch: a layout, or a plain int."""

    num_samples: int


class MixtureLookup(NamedTuple):
    """Where each global position of a mixture comes from (int64 arrays shaped like the positions)."""

    source: np.ndarray  # source index k
    source_position: np.ndarray  # p_k: the position in source k's own stream
    source_epoch: np.ndarray  # p_k // N_k
    source_sample: np.ndarray  # the sample within source k
    global_id: np.ndarray  # offset_k + source_sample


def _frozen(value: Any) -> Any:
    """Lists as tuples, recursively: equal configurations compare (and hash) equal whatever sequence type was used."""
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        return tuple(_frozen(v) for v in value)
    return value


MAX_POSITION = 1 << 62  # global positions are below it: every routing value (q + 1, q * a / T, p_k) then fits in int64
MAX_SOURCE_SAMPLES = MAX_DOMAIN  # a source's epochs are permutations of at most 2**62 samples


def _source_sizes(sources: Any) -> list[int]:
    """``num_samples`` of each source (a layout or an int), each in ``[1, 2**62]``, all together below ``2**63``: global
    sample ids ``offset_k + i`` are int64."""
    if isinstance(sources, (str, bytes)) or not isinstance(sources, Sequence) or not sources:
        raise ValueError(f"sources must be a non-empty list of layouts (or sample counts), got {sources!r}")
    sizes = []
    for k, src in enumerate(sources):
        n = src if isinstance(src, numbers.Integral) else getattr(src, "num_samples", None)
        if not is_int(n) or n < 1:
            raise ValueError(f"sources[{k}] must have num_samples >= 1 (a layout or an int), got {src!r}")
        if n > MAX_SOURCE_SAMPLES:
            raise ValueError(
                f"sources[{k}] has {int(n)} samples; a source holds at most 2**62 (its epochs are permutations)"
            )
        sizes.append(int(n))
    if sum(sizes) > (1 << 63) - 1:
        raise ValueError(
            f"the sources hold {sum(sizes)} samples in all; at most 2**63 - 1, so that global ids fit in int64"
        )
    return sizes


def _placed_positions(step_positions: Any, num_entries: int) -> tuple[int, ...] | None:
    """The global position of each schedule entry: as given (checked), ``(0,)`` for a single entry, else None
    (unplaced)."""
    if step_positions is None:
        return (0,) if num_entries == 1 else None
    positions = tuple(int(p) for p in step_positions)
    if (
        len(positions) != num_entries
        or positions[0] != 0
        or any(b < a for a, b in zip(positions, positions[1:]))
        or positions[-1] > MAX_POSITION
    ):
        raise ValueError(
            f"step_positions must be a non-decreasing position for each of the {num_entries} schedule entries, starting"
            f" at 0 and at most 2**62, got {positions}"
        )
    return positions


def _segment_starts(
    trees: Sequence[RouteNode], positions: tuple[int, ...] | None, num_sources: int
) -> tuple[tuple[int, ...], ...]:
    """Per segment, the position ``p_k`` each source has reached where the segment starts (empty when unplaced)."""
    starts: list[tuple[int, ...]] = []
    if positions is not None:
        reached = [0] * num_sources
        for j, tree in enumerate(trees):
            starts.append(tuple(reached))
            if j + 1 < len(positions):
                leaf_counts(tree, positions[j + 1] - positions[j], reached)
    return tuple(starts)


@dataclass(frozen=True)
class Mixture:
    """A weighted, seeded, low-discrepancy blend of sources; implements the ``SampleStream`` protocol of the plan.

    ``sources``: layouts (or ints), each with its own ``num_samples``; ``weights``: one non-negative number per source,
    or a schedule ``[(first_step, weights), ...]`` starting at step 0. ``num_samples`` is the total over sources (the
    size of the global id space, for reporting). Every method is a pure function of its arguments and the fields.
    """

    sources: Sequence[Source | int]
    weights: Any
    seed: int
    step_positions: tuple[int, ...] | None = None  # global position of each schedule entry, set by a Plan
    mapping_version: int | None = None  # of the source permutations, set by a Plan; None: the current MAPPING_VERSION
    sizes: tuple[int, ...] = field(init=False, repr=False, compare=False)
    offsets: tuple[int, ...] = field(init=False, repr=False, compare=False)
    schedule: tuple[tuple[int, tuple[int, ...]], ...] = field(init=False, repr=False, compare=False)
    _trees: tuple[RouteNode, ...] = field(init=False, repr=False, compare=False)
    _starts: tuple[tuple[int, ...], ...] = field(init=False, repr=False, compare=False)
    epoch_ordered: tuple[bool, ...] = field(init=False, repr=False, compare=False)  # per source: ids carry the epoch

    def __post_init__(self) -> None:
        sizes = _source_sizes(self.sources)
        check_int(self.seed, "seed")
        object.__setattr__(self, "sources", tuple(self.sources))
        object.__setattr__(self, "weights", _frozen(self.weights))
        object.__setattr__(self, "sizes", tuple(sizes))
        object.__setattr__(self, "offsets", tuple(int(x) for x in np.cumsum([0] + sizes[:-1])))
        if self.mapping_version is not None:
            object.__setattr__(self, "mapping_version", check_mapping_version(self.mapping_version))
        schedule = parse_schedule(self.weights, len(sizes))
        object.__setattr__(self, "schedule", schedule)
        object.__setattr__(self, "_trees", tuple(build_tree(ints, int(self.seed), step) for step, ints in schedule))
        positions = _placed_positions(self.step_positions, len(schedule))
        object.__setattr__(self, "step_positions", positions)
        object.__setattr__(self, "_starts", _segment_starts(self._trees, positions, len(sizes)))
        ordered = tuple(bool(getattr(getattr(src, "config", None), "epoch_order", False)) for src in self.sources)
        object.__setattr__(self, "epoch_ordered", ordered)

    # -- the SampleStream protocol
    # ---------------------------------------------------------------------------------------

    @property
    def num_samples(self) -> int:
        """The total number of samples over all sources (global ids are in ``[0, num_samples)``)."""
        return int(sum(self.sizes))

    @property
    def num_sources(self) -> int:
        return len(self.sizes)

    def sample_ids(self, positions: np.ndarray) -> np.ndarray:
        return self.lookup(positions).global_id

    def epochs(self, positions: np.ndarray) -> np.ndarray:
        """The epoch of each position *in its own source*."""
        source, pos = self._locate(positions)
        return pos // np.asarray(self.sizes, dtype=np.int64)[source]

    def describe(self) -> dict:
        sources = []
        for src, n in zip(self.sources, self.sizes):
            entry: dict[str, Any] = {"num_samples": n}
            if hasattr(src, "describe"):
                entry["layout"] = src.describe()
            sources.append(entry)
        return {
            "kind": "mixture",
            "seed": int(self.seed),
            "sources": sources,
            "schedule": [[step, [str(Fraction(c, sum(ints))) for c in ints]] for step, ints in self.schedule],
        }

    # -- placing a step schedule
    # -----------------------------------------------------------------------------------------

    def with_step_positions(self, consumed: Callable[[int], int]) -> Mixture:
        """This mixture with each schedule entry placed at ``consumed(first_step)``, the position
        where its step starts."""
        return replace(self, step_positions=tuple(int(consumed(step)) for step, _ in self.schedule))

    def with_mapping_version(self, version: int) -> Mixture:
        """This mixture drawing its source permutations from mapping version ``version`` (the plan's)."""
        if self.mapping_version not in (None, version):
            raise ValueError(
                f"this Mixture was built for mapping version {self.mapping_version} but the Plan asks for {version}: "
                f"give the version once, as Plan(..., mapping_version={self.mapping_version})"
            )
        return replace(self, mapping_version=version)

    @property
    def version(self) -> int:
        """The mapping version of the source permutations."""
        return MAPPING_VERSION if self.mapping_version is None else self.mapping_version

    # -- lookups
    # ---------------------------------------------------------------------------------------------------------

    def _check_placed(self) -> None:
        if self.step_positions is None:
            raise ValueError(
                "this Mixture has a weights schedule over steps: use it through a Plan (Plan(source=mixture, ...)),"
                " which places each entry at the position where its step starts"
            )

    def _locate(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(source k, position p_k in source k) of each global position."""
        self._check_placed()
        g = np.asarray(positions)
        if g.dtype.kind not in "iu":
            raise TypeError(f"positions must be integers, got dtype {g.dtype}")
        if g.size and (g.min() < 0 or g.max() >= MAX_POSITION):
            bad = int(g.flat[np.flatnonzero((g.reshape(-1) < 0) | (g.reshape(-1) >= MAX_POSITION))[0]])
            raise ValueError(f"Got position {bad}, allowed positions are in [0, 2**62)")
        g = g.astype(np.int64)
        flat = g.reshape(-1)
        source = np.empty(flat.shape, dtype=np.int64)
        pos = np.empty(flat.shape, dtype=np.int64)
        bounds = np.asarray(self.step_positions, dtype=np.int64)
        segment = np.searchsorted(bounds, flat, side="right") - 1
        for j in np.unique(segment) if len(bounds) > 1 else [0]:
            idx = np.flatnonzero(segment == j) if len(bounds) > 1 else np.arange(flat.size)
            leaf_pos = np.empty(idx.shape, dtype=np.int64)
            leaf_src = np.empty(idx.shape, dtype=np.int64)
            route(self._trees[j], np.arange(idx.size), flat[idx] - bounds[j], leaf_src, leaf_pos)
            source[idx] = leaf_src
            pos[idx] = leaf_pos + np.asarray(self._starts[j], dtype=np.int64)[leaf_src]
        return source.reshape(g.shape), pos.reshape(g.shape)

    def sources_of(self, positions: np.ndarray) -> np.ndarray:
        """The source index of each global position."""
        return self._locate(positions)[0]

    def lookup(self, positions: np.ndarray) -> MixtureLookup:
        """Source, source position, source epoch, source sample and global sample id of each global position."""
        source, pos = self._locate(positions)
        sizes = np.asarray(self.sizes, dtype=np.int64)
        epoch = pos // sizes[source]
        sample = np.empty_like(pos)
        for k in np.unique(source):  # a loop over sources, vectorized within each
            sel = source == k
            n = self.sizes[k]
            e, within = epoch[sel], pos[sel] - epoch[sel] * n
            key = subkeys(self.source_key(int(k)), e)
            sample[sel] = permute(within, n, key if e.min() != e.max() else int(key.flat[0]), self.version)
        global_id = sample + np.asarray(self.offsets, dtype=np.int64)[source]
        if any(self.epoch_ordered):
            qualified = np.asarray(self.epoch_ordered, dtype=bool)[source]
            e = np.where(qualified, epoch, 0)
            if e.size and int(e.max()) >= ((1 << 63) - 1) // self.num_samples - 1:
                raise ValueError(
                    f"source epoch {int(e.max())} times the mixture's {self.num_samples} samples overflows int64"
                    " sample ids (an epoch_order source's ids carry its epoch)"
                )
            global_id = global_id + e * self.num_samples
            sample = sample + e * sizes[source]
        return MixtureLookup(source, pos, epoch, sample, global_id)

    def global_positions(self, source: int, source_positions: np.ndarray) -> np.ndarray:
        """The inverse of :meth:`_locate` for one source: the global position at which source ``source`` serves each of
        its positions ``source_positions`` (int64; each must be served, i.e. below ``served(p)[source]`` for some
        reachable ``p``). Source position ``p`` lies in the segment ``j`` with ``starts[j][k] <= p < starts[j+1][k]``,
        is the ``(p - starts[j][k])``-th position of its leaf there, and :func:`~detsampler.mixture.tree.unroute`
        climbs the segment's tree to the root. O(tree depth) Python int operations per position."""
        self._check_placed()
        k = int(source)
        if not 0 <= k < self.num_sources:
            raise ValueError(f"Got source {source!r}, allowed sources are in [0, {self.num_sources})")
        starts = np.asarray([row[k] for row in self._starts], dtype=np.int64)
        p = np.asarray(source_positions, dtype=np.int64).reshape(-1)
        segment = np.searchsorted(starts, p, side="right") - 1
        paths = {}
        out = []
        for pos, j in zip(p.tolist(), segment.tolist()):
            if j not in paths:
                paths[j] = leaf_path(self._trees[j], k)
            if pos < 0 or paths[j] is None:
                raise ValueError(f"source {k} never serves its position {pos}")
            out.append(self.step_positions[j] + unroute(paths[j], pos - int(starts[j])))
        return np.asarray(out, dtype=np.int64)

    def source_key(self, source: int) -> int:
        """The base key of source ``source``'s epoch permutations."""
        return stable_hash64("mixture-source", int(self.seed), int(source))

    def split_ids(self, global_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(source, sample within the source) of global sample ids; for an epoch-ordered source the sample carries its
        epoch (``e * N_k + i`` from ``e * M + offset_k + i``, module doc)."""
        ids = np.asarray(global_ids, dtype=np.int64)
        m = self.num_samples
        epoch, rest = np.divmod(ids, m)
        offsets = np.asarray(self.offsets, dtype=np.int64)
        source = np.searchsorted(offsets, rest, side="right") - 1
        plain = (epoch > 0) & ~np.asarray(self.epoch_ordered, dtype=bool)[source]
        if ids.size and (ids.min() < 0 or plain.any()):
            bad = int(ids[ids < 0][0]) if ids.min() < 0 else int(ids[plain][0])
            raise ValueError(
                f"Got global sample id {bad}, allowed global sample ids are in [0, {m})"
                + (" (or e * M + offset_k + i for an epoch_order source k)" if any(self.epoch_ordered) else "")
            )
        return source, rest - offsets[source] + epoch * np.asarray(self.sizes, dtype=np.int64)[source]

    # -- reporting
    # -------------------------------------------------------------------------------------------------------

    def served(self, position: int) -> np.ndarray:
        """How many of the global positions ``[0, position)`` each source served (exact; O(segments + sources))."""
        self._check_placed()
        check_int(position, "position", minimum=0, maximum=MAX_POSITION)
        j = int(np.searchsorted(np.asarray(self.step_positions), int(position), side="right")) - 1
        counts = list(self._starts[j])
        leaf_counts(self._trees[j], int(position) - self.step_positions[j], counts)
        return np.asarray(counts, dtype=np.int64)

    def expected_served(self, position: int) -> list[Fraction]:
        """What the weights ask of positions ``[0, position)``: per source, the sum over segments of length x weight."""
        self._check_placed()
        out = [Fraction(0)] * self.num_sources
        bounds = list(self.step_positions) + [None]
        for j, (_, ints) in enumerate(self.schedule):
            lo, hi = bounds[j], bounds[j + 1]
            length = max(0, min(int(position), hi if hi is not None else int(position)) - lo)
            for k, c in enumerate(ints):
                out[k] += Fraction(length * c, sum(ints))
        return out

    def weights_at(self, position: int) -> list[Fraction]:
        """The weights in force at global position ``position``."""
        self._check_placed()
        j = int(np.searchsorted(np.asarray(self.step_positions), int(position), side="right")) - 1
        ints = self.schedule[j][1]
        return [Fraction(c, sum(ints)) for c in ints]

    def discrepancy_bounds(self, segment: int = 0) -> list[Fraction]:
        """Per source, the bound ``b_k`` with ``|N_k(n) - n w_k| < b_k`` over every prefix of the
        segment (0 if unused)."""
        if (
            isinstance(segment, bool)
            or not isinstance(segment, numbers.Integral)
            or not 0 <= segment < len(self._trees)
        ):
            raise ValueError(f"Got segment {segment!r}, allowed segments are in [0, {len(self._trees)})")
        out = [Fraction(0)] * self.num_sources
        leaf_bounds(self._trees[int(segment)], (), out)
        return out

    def report(self, position: int, tokens: bool = True, chunk: int = 1 << 16) -> list[dict]:
        """Per source, what global positions ``[0, position)`` drew: samples, epochs, upsampling, and tokens.

        ``tokens`` (sources that are layouts only, else None) counts the input tokens of the samples served: whole
        epochs from the layout's totals (``num_samples * seq_len`` for concat, every position once for document and
        bestfit), the current partial epoch by locating its served samples, ``chunk`` at a time (so O(chunk) memory,
        O(N_k) time).
        """
        served = self.served(position)
        expected = self.expected_served(position)
        counted = [self._tokens_served(k, int(s), chunk) if tokens else None for k, s in enumerate(served.tolist())]
        total_tokens = sum(t for t in counted if t is not None) if all(t is not None for t in counted) else None
        rows = []
        for k, (n, s) in enumerate(zip(self.sizes, served.tolist())):
            rows.append(
                {
                    "source": k,
                    "num_samples": n,
                    "served": s,
                    "share": s / position if position else 0.0,
                    "expected_share": float(expected[k] / position) if position else 0.0,
                    "epochs": s / n,
                    "upsampled": s > n,
                    "tokens": counted[k],
                    "token_share": counted[k] / total_tokens if total_tokens else None,
                }
            )
        return rows

    def _tokens_served(self, k: int, served: int, chunk: int) -> int | None:
        layout = self.sources[k]
        if not hasattr(layout, "locate") or not hasattr(layout, "config"):
            return None
        n, seq_len = self.sizes[k], int(layout.config.seq_len)
        full, rest = divmod(served, n)
        per_epoch = int(layout.tokens_per_epoch)
        total = full * per_epoch
        key = int(subkeys(self.source_key(k), full))
        qualify = full * n if self.epoch_ordered[k] else 0  # the partial epoch's samples (module doc)
        for lo in range(0, rest, chunk):
            ids = permute(np.arange(lo, min(rest, lo + chunk), dtype=np.int64), n, key, self.version)
            total += int(np.minimum(layout.locate(ids + qualify).num_tokens, seq_len).sum())
        return total
