"""The plan: a pure map from (seed, epoch, step, rank, micro step, worker) to sample ids.

The stream: global position ``g`` (counted from the start of training) belongs to epoch ``g // N`` and reads sample
``permute(g % N, N, key(seed, epoch), mapping_version)``, where N is the number of samples per epoch. Epochs follow each
other with nothing dropped or repeated, whatever N and the batch size.

Mapping versions: ``Plan(..., mapping_version=v)`` computes the permutations of version ``v`` (every sample order: the
epochs here and a mixture's sources); the default is the current :data:`~detsampler.version.MAPPING_VERSION`, and
version
1 stays computable so that a run started on it resumes exactly. The fingerprint records it.

The steps: step ``s`` takes positions ``[consumed(s), consumed(s) + B(s))``, with ``B(s)`` the global batch size of step
``s`` and ``consumed(s)`` the sum of ``B`` over earlier steps. Within a step, micro step ``a`` and data-parallel rank
``r`` take the ``micro_batch_size`` positions starting at ``a * world_size * micro_batch_size + r * micro_batch_size``.

Balance: ``Plan(..., balance=Balance(layout, cost))`` (mapping version 3) keeps each step's positions and deals them
to the (micro step, rank, row) slots by their samples' modeled cost (:mod:`detsampler.balance`) instead of in position
order: the step's samples are the same, only which rank reads which changes. Slot ``k`` of step ``s`` reads position
``consumed(s) + order_s[k]``, ``order_s`` a pure function of the step's samples, their spans, the world size and the
micro batch size; without balance ``order_s[k] = k``.

Skip ranges: ``skip_steps=[(a, b), ...]`` (inclusive, in *data* steps: the steps of the stream above) name data that is
never trained on. Training step ``s`` reads data step ``d(s)``, the ``s``-th data step (from 0) that lies in no range,
and takes its batch size; without ranges ``d(s) = s`` and nothing changes. Every data step outside the ranges reads
exactly the same samples whatever the ranges (tests/test_skip.py).

Invariants (tests/test_plan.py):
- the micro batches of all ranks and micro steps of a step partition the step's positions;
- the set of a step's sample ids depends on neither ``world_size`` nor ``micro_batch_size`` (elastic resume);
- each epoch is keyed on its own, so extending a run never changes steps already defined;
- computing step ``s`` costs O(B(s)) time and memory, whatever ``s``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property, lru_cache
from typing import Protocol

import numpy as np

from detsampler.balance import Balance, balanced_order, sample_costs
from detsampler.checks import check_int, check_positive_int, is_int
from detsampler.keys import stable_hash64, subkeys
from detsampler.permutation import check_mapping_version, permute, permute_within
from detsampler.redaction import Redaction, check_redaction_sources, normalize_redactions
from detsampler.schedule import parse_step_schedule
from detsampler.version import BALANCED_MAPPING_VERSION, MAPPING_VERSION

__all__ = [
    "MAX_GLOBAL_BATCH_SIZE",
    "MAX_STEP",
    "EpochStream",
    "Plan",
    "SampleStream",
    "data_step",
    "normalize_skip_steps",
]

# NOTE: sample positions are int64: step * global_batch_size must fit with room to spare. 2**40 steps of 2**22 samples
# (1.1e12 steps, 4.2M samples per step) is beyond any run, and their product 2**62 stays below 2**63.
MAX_STEP = 2**40
MAX_GLOBAL_BATCH_SIZE = 2**22
_CACHED_ORDERS = 4  # a balanced plan keeps the slot orders of its last few data steps (the sampler asks step by step)


class SampleStream(Protocol):
    """An endless stream of sample ids: position ``g`` reads ``sample_ids(g)``."""

    num_samples: int

    def with_step_positions(self, consumed: Callable[[int], int]) -> SampleStream:
        """This stream placed on a plan's steps: ``consumed(d)`` is the position where data step ``d`` starts (a stream
        whose order does not depend on steps returns itself)."""

    def with_mapping_version(self, version: int) -> SampleStream:
        """This stream drawing its permutations from mapping version ``version``; a ValueError if it was built for
        another."""

    def sample_ids(self, positions: np.ndarray) -> np.ndarray:
        """Sample ids at global positions ``positions`` (int64 array)."""

    def epochs(self, positions: np.ndarray) -> np.ndarray:
        """The epoch each position belongs to."""

    def describe(self) -> dict:
        """What fixes the stream, for fingerprints."""


@dataclass(frozen=True)
class EpochStream:
    """Epoch after epoch of ``num_samples`` samples, each epoch a fresh keyed permutation.

    ``epoch_ids``: the ids carry their epoch, ``epoch * num_samples + sample`` (for a layout whose document order
    changes each epoch, ``LayoutConfig(epoch_order=True)``, where a sample's tokens depend on its epoch); they stay
    below ``2**63`` since positions are below ``2**62``. False: ids in ``[0, num_samples)``, as before the option.
    """

    num_samples: int
    seed: int
    mapping_version: int = MAPPING_VERSION
    epoch_ids: bool = False

    def __post_init__(self) -> None:
        check_int(self.num_samples, "num_samples (int64 sample ids)", minimum=1, maximum=2**62)
        object.__setattr__(self, "seed", check_int(self.seed, "seed"))
        check_mapping_version(self.mapping_version)
        if not isinstance(self.epoch_ids, (bool, np.bool_)):
            raise ValueError(f"epoch_ids must be True or False, got {self.epoch_ids!r}")
        object.__setattr__(self, "epoch_ids", bool(self.epoch_ids))

    @cached_property
    def base_key(self) -> int:
        return stable_hash64("epoch-shuffle", self.seed)

    def epoch_key(self, epoch: np.ndarray | int) -> np.ndarray:
        """The permutation key of ``epoch`` (elementwise)."""
        return subkeys(self.base_key, epoch)

    def _scalar_epoch_key(self, epoch: int) -> int:
        return _epoch_key_int(self.base_key, epoch)

    def epochs(self, positions: np.ndarray) -> np.ndarray:
        return np.asarray(positions, dtype=np.int64) // self.num_samples

    def sample_ids(self, positions: np.ndarray) -> np.ndarray:
        positions = np.asarray(positions, dtype=np.int64)
        n = self.num_samples
        if positions.size:
            first, last = int(positions.min()) // n, int(positions.max()) // n
            if first == last and first >= 0:  # the usual case: one epoch, one key, indices within [0, n) already
                within = positions.reshape(-1) - first * n
                ids = permute_within(within, n, self._scalar_epoch_key(first), self.mapping_version)
                if self.epoch_ids:
                    ids += first * n
                return ids.reshape(positions.shape)
        epochs = positions // n
        ids = permute(positions - epochs * n, n, self.epoch_key(epochs), self.mapping_version)
        return ids + epochs * n if self.epoch_ids else ids

    def describe(self) -> dict:
        out = {"kind": "epochs", "num_samples": int(self.num_samples), "seed": self.seed}
        if self.epoch_ids:  # only when set: plans without it keep their fingerprint
            out["epoch_ids"] = True
        return out

    def with_step_positions(self, consumed: Callable[[int], int]) -> EpochStream:
        return self

    def with_mapping_version(self, version: int) -> EpochStream:
        return replace(self, mapping_version=version)


def normalize_skip_steps(skip_steps: Sequence[tuple[int, int]] | None) -> tuple[tuple[int, int], ...]:
    """Skip ranges sorted by start; raises ValueError for a negative, reversed or overlapping range."""
    if skip_steps is None:
        return ()
    if isinstance(skip_steps, (str, bytes)) or not isinstance(skip_steps, Sequence):
        raise ValueError(f"skip_steps must be a list of (first, last) data steps, got {skip_steps!r}")
    rows = []
    for entry in skip_steps:
        if isinstance(entry, (str, bytes)) or not isinstance(entry, Sequence) or len(entry) != 2:
            raise ValueError(f"skip_steps entries must be (first, last) pairs of data steps, got {entry!r}")
        a, b = entry
        for v in (a, b):
            if not is_int(v):
                raise ValueError(f"skip_steps entries must be pairs of integers, got {entry!r}")
        if a < 0:
            raise ValueError(f"skip_steps range ({a}, {b}) is negative: data steps are >= 0")
        if b < a:
            raise ValueError(f"skip_steps range ({a}, {b}) is reversed: need first <= last (both inclusive)")
        if b > MAX_STEP:
            raise ValueError(f"skip_steps range ({a}, {b}) ends after the last possible data step 2**40 = {MAX_STEP}")
        rows.append((int(a), int(b)))
    rows.sort()
    for (a0, b0), (a1, b1) in zip(rows, rows[1:]):
        if a1 <= b0:
            raise ValueError(
                f"skip_steps ranges ({a0}, {b0}) and ({a1}, {b1}) overlap: give each skipped data step once"
            )
    return tuple(rows)


def data_step(skip_steps: Sequence[tuple[int, int]], step: int) -> int:
    """``d(step)``: the ``step``-th data step (from 0) that lies in none of the sorted, disjoint
    ``skip_steps`` ranges."""
    d = int(step)
    for a, b in skip_steps:
        if a > d:
            break
        d += b - a + 1
    return d


@lru_cache(maxsize=1024)
def _epoch_key_int(base_key: int, epoch: int) -> int:
    return int(subkeys(base_key, epoch))


def _check_step(step: int, name: str = "step") -> int:
    if not is_int(step):
        raise TypeError(f"{name} must be an integer, got {type(step).__name__}")
    if step < 0:
        raise ValueError(f"{name} must be >= 0, got {step}")
    if step > MAX_STEP:
        raise ValueError(f"{name} must be <= 2**40 = {MAX_STEP} (int64 sample positions), got {step}")
    return int(step)


@dataclass(frozen=True)
class Plan:
    """Which samples every rank reads at every step. Pure: every method is a function of its arguments and the fields.

    Give either ``num_samples``, the number of samples per epoch (a layout's ``num_samples``: the plan draws them epoch
    by epoch, each epoch a keyed permutation), or ``source=``, a :class:`SampleStream` such as a
    :class:`~detsampler.mixture.Mixture`. ``batch_size_schedule``, when given, is a list of ``(first_step,
    global_batch_size)`` starting at step 0 (a ramp-up, say); its last size must equal ``global_batch_size``.
    ``world_size`` is the data-parallel degree: tensor-, pipeline- and context-parallel peers of one data-parallel rank
    read the same batches. ``skip_steps`` lists inclusive ranges of data steps never to train on (module docstring). The
    batch-size schedule, a mixture's weight schedule and the skip ranges are all in data steps, which equal training
    steps before the first skip range.

    ``redactions`` (:class:`~detsampler.redaction.Redaction` entries, in *training* steps; over a mixture each names
    its ``source``) change no sample: they are held for the fingerprint and for
    :func:`~detsampler.redaction.redaction_mask`, which masks the redacted documents' labels at the steps in force.

    ``epoch_ids`` (with ``num_samples``): sample ids carry their epoch, ``epoch * num_samples + sample``: set it when
    the layout has ``epoch_order`` (its samples differ from epoch to epoch); :func:`~detsampler.locate.check_compatible`
    refuses a plan and a layout that disagree. A mixture qualifies the ids of its own ``epoch_order`` sources.

    ``balance`` (:class:`~detsampler.balance.Balance`): each step's samples dealt to (rank, micro step) by their modeled
    cost, mapping version 3 (the default when given; another version is refused). None: position order.

    ``seed`` keys the epoch shuffles of ``num_samples``; with ``source=`` it is unused (a mixture is keyed by its own
    seed),
    and :func:`~detsampler.resume.check_resume` lets a resume change it.

    ``plan.stream`` is what the plan reads: the :class:`EpochStream` of ``num_samples``, or ``source`` placed on the
    plan's
    steps (``source.with_step_positions``: a mixture's weight schedule is given in steps, the stream needs positions).
    """

    num_samples: int | None = None
    seed: int = 0
    global_batch_size: int = None  # type: ignore[assignment]  # required: checked in __post_init__
    micro_batch_size: int = None  # type: ignore[assignment]  # required: checked in __post_init__
    world_size: int = 1
    batch_size_schedule: Sequence[tuple[int, int]] | None = None
    skip_steps: Sequence[tuple[int, int]] | None = None
    source: SampleStream | None = field(default=None, kw_only=True)
    mapping_version: int = field(default=None, kw_only=True)  # type: ignore[assignment]  # None: 2, or 3 balanced
    redactions: Sequence[Redaction] | None = field(default=None, kw_only=True)
    epoch_ids: bool = field(default=False, kw_only=True)
    balance: Balance | None = field(default=None, kw_only=True)
    stream: SampleStream = field(init=False, repr=False, compare=False)
    _schedule: tuple[tuple[int, int, int], ...] = field(init=False, repr=False, compare=False)
    _skips: tuple[tuple[int, int], ...] = field(init=False, repr=False, compare=False)
    _orders: dict[int, np.ndarray] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "seed", check_int(self.seed, "seed"))
        for name in ("global_batch_size", "micro_batch_size", "world_size"):
            check_int(getattr(self, name), name, minimum=1, maximum=MAX_GLOBAL_BATCH_SIZE)
        object.__setattr__(self, "mapping_version", self._checked_version())
        object.__setattr__(self, "_orders", {})
        object.__setattr__(self, "stream", self._unplaced_stream())
        schedule = self._normalized_schedule()
        for _, size in schedule:
            self._check_divisible(size)
        first_consumed, rows = 0, []
        for i, (first_step, size) in enumerate(schedule):
            if i:
                prev_step, prev_size = schedule[i - 1]
                first_consumed += (first_step - prev_step) * prev_size
            rows.append((first_step, size, first_consumed))
        object.__setattr__(self, "_schedule", tuple(rows))
        object.__setattr__(
            self, "batch_size_schedule", tuple(schedule) if self.batch_size_schedule is not None else None
        )
        skips = normalize_skip_steps(self.skip_steps)
        object.__setattr__(self, "_skips", skips)
        object.__setattr__(self, "skip_steps", skips if self.skip_steps is not None else None)
        redactions = normalize_redactions(self.redactions)
        # NOTE: a mixture's document ids are per source: there each entry names its source, over one index none does
        redactions = check_redaction_sources(redactions, self.stream)
        object.__setattr__(self, "redactions", redactions or None)
        object.__setattr__(self, "stream", self.stream.with_step_positions(self.data_consumed))
        if self.balance is not None:
            self.balance.check(self.stream)

    def _checked_version(self) -> int:
        """The mapping version: 3 for a balanced plan, else 2 unless given; a version that contradicts balance=
        is refused."""
        balanced = self.balance is not None
        if balanced and not isinstance(self.balance, Balance):
            raise ValueError(f"balance must be a Balance or None, got {type(self.balance).__name__}")
        if self.mapping_version is None:
            return BALANCED_MAPPING_VERSION if balanced else MAPPING_VERSION
        version = check_mapping_version(self.mapping_version)
        if balanced and version != BALANCED_MAPPING_VERSION:
            raise ValueError(
                f"a balanced plan is mapping version {BALANCED_MAPPING_VERSION} (it deals each step's samples to ranks"
                f" by cost), got mapping_version={version}: leave mapping_version out, or resume a version {version}"
                " run without balance"
            )
        if not balanced and version == BALANCED_MAPPING_VERSION:
            raise ValueError(
                f"mapping version {BALANCED_MAPPING_VERSION} is the balanced plan's: give balance=Balance(layout),"
                f" or mapping_version={MAPPING_VERSION}"
            )
        return version

    def _unplaced_stream(self) -> SampleStream:
        if self.source is not None:
            if isinstance(self.source, (int, np.integer)):
                raise ValueError(
                    f"source must be a sample stream such as a Mixture; pass a count as num_samples={self.source}"
                )
            if self.num_samples is not None:
                raise ValueError(f"give num_samples or source, not both (got num_samples={self.num_samples!r})")
            if self.epoch_ids:
                raise ValueError(
                    "epoch_ids is for a plan over num_samples: a mixture qualifies the ids of its epoch_order sources"
                    " itself (leave epoch_ids False)"
                )
            return self.source.with_mapping_version(self.mapping_version)
        if self.num_samples is None or isinstance(self.num_samples, (bool, int, np.integer)):
            n = check_positive_int(self.num_samples, "num_samples")
            return EpochStream(n, self.seed, self.mapping_version, self.epoch_ids)
        raise ValueError(
            f"num_samples must be an integer >= 1, got {type(self.num_samples).__name__}; pass a stream such as a "
            "Mixture as Plan(source=..., ...)"
        )

    def _normalized_schedule(self) -> list[tuple[int, int]]:
        if self.batch_size_schedule is None:
            return [(0, int(self.global_batch_size))]
        size = lambda value, label: check_int(value, label, minimum=1, maximum=MAX_GLOBAL_BATCH_SIZE)
        schedule = list(parse_step_schedule(self.batch_size_schedule, size, "batch_size_schedule"))
        if schedule[-1][0] > MAX_STEP:
            raise ValueError(f"batch_size_schedule steps must be <= 2**40 = {MAX_STEP}, got {schedule[-1][0]}")
        if schedule[-1][1] != self.global_batch_size:
            raise ValueError(
                f"the last batch_size_schedule size ({schedule[-1][1]}) must equal global_batch_size"
                f" ({self.global_batch_size})"
            )
        return schedule

    def _check_divisible(self, size: int) -> None:
        per_micro_step = self.world_size * self.micro_batch_size
        if size % per_micro_step:
            raise ValueError(
                f"global batch size {size} is not divisible by world_size * micro_batch_size = "
                f"{self.world_size} * {self.micro_batch_size} = {per_micro_step}"
            )

    def _check_rank(self, rank: int) -> int:
        if not is_int(rank) or not 0 <= rank < self.world_size:
            raise ValueError(f"Got rank {rank!r}, allowed ranks are in [0, {self.world_size})")
        return int(rank)

    # -- steps -> positions
    # ------------------------------------------------------------------------------------------------

    def data_step(self, step: int) -> int:
        """``d(step)``: the data step that training step ``step`` reads (``step`` itself without skip ranges)."""
        return data_step(self._skips, _check_step(step))

    def data_consumed(self, data_step: int) -> int:
        """The global position where data step ``data_step`` starts (all data steps before it, skipped or not)."""
        first_step, size, first_consumed = self._segment(data_step)
        return first_consumed + (int(data_step) - first_step) * size

    def _trained(self, step: int) -> int:
        """Samples read by training steps before ``step``: its position minus the samples of the ranges before it."""
        d = self.data_step(step)
        skipped = sum(self.data_consumed(b + 1) - self.data_consumed(a) for a, b in self._skips if b < d)
        return self.data_consumed(d) - skipped

    def _segment(self, step: int) -> tuple[int, int, int]:
        step = _check_step(step)
        i = len(self._schedule) - 1
        while self._schedule[i][0] > step:
            i -= 1
        return self._schedule[i]

    def batch_size(self, step: int) -> int:
        """The global batch size of ``step`` (samples): that of the data step it reads."""
        return self._segment(self.data_step(step))[1]

    def consumed(self, step: int) -> int:
        """Samples consumed by all steps before ``step``: the global position where ``step`` starts.

        With skip ranges this counts the skipped data too (it is the position in the data stream of data step
        ``d(step)``).
        """
        return self.data_consumed(self.data_step(step))

    def num_micro_steps(self, step: int) -> int:
        """Gradient-accumulation micro steps in ``step``."""
        return self.batch_size(step) // (self.world_size * self.micro_batch_size)

    def epoch(self, step: int) -> int:
        """The epoch of the first sample of ``step``."""
        return self.consumed(step) // self.stream.num_samples

    def step_positions(self, step: int) -> np.ndarray:
        """The global positions of ``step``, in slot order: micro-step-major, then rank, then row (a balanced plan: a
        permutation of the positions ``[consumed(step), consumed(step) + batch_size(step))``; else those in order)."""
        start = self.consumed(step)
        order = self.slot_order(step)
        return start + order if order is not None else np.arange(start, start + self.batch_size(step), dtype=np.int64)

    def micro_batch_positions(self, step: int, micro_step: int, rank: int) -> np.ndarray:
        """The global positions that ``rank`` reads at ``micro_step`` of ``step``."""
        start = self._micro_batch_starts(step, micro_step, rank, 1)[0][0]
        positions = np.arange(start, start + self.micro_batch_size, dtype=np.int64)
        return self._balanced(positions, step) if self.balance is not None else positions

    # -- balance: which of a step's positions each slot reads
    # ------------------------------------------------------------------------------

    def slot_order(self, step: int) -> np.ndarray | None:
        """None without balance; else the balanced order of training step ``step`` (read-only int64): slot ``k =
        (micro_step * world_size + rank) * micro_batch_size + row`` reads position ``consumed(step) + order[k]``. A pure
        function of the step's samples, their spans, ``world_size`` and ``micro_batch_size``
        (:func:`~detsampler.balance.balanced_order`); O(B log B) per step, the last few steps' orders kept."""
        if self.balance is None:
            return None
        d = self.data_step(step)
        order = self._orders.get(d)
        if order is None:
            first_step, size, first_consumed = self._segment(d)
            start = first_consumed + (d - first_step) * size
            costs = sample_costs(self.balance, self.stream, np.arange(start, start + size, dtype=np.int64))
            order = balanced_order(costs, self.world_size, self.micro_batch_size)
            order.setflags(write=False)
            if len(self._orders) >= _CACHED_ORDERS:
                self._orders.clear()  # NOTE: bounded memory, whatever the number of steps
            self._orders[d] = order
        return order

    def by_position(self, step: int, values: np.ndarray) -> np.ndarray:
        """``values`` given per slot of ``step`` (micro-step-major, then rank, then row, as ``global_batch``), put in
        position order: the same for every ``world_size`` and ``micro_batch_size`` (without balance: ``values``)."""
        order = self.slot_order(step)
        if order is None:
            return values
        out = np.empty_like(values)
        out[order] = values
        return out

    def _balanced(self, positions: np.ndarray, step: int) -> np.ndarray:
        """Positions of ``step`` in position order (the unbalanced plan's slots) -> the positions their slots read."""
        consumed = self.consumed(step)
        return consumed + self.slot_order(step)[positions - consumed]  # type: ignore[index]

    def _micro_batch_starts(
        self, step: int, micro_step: int, rank: int, count: int, stop_step: int | None = None
    ) -> tuple[list[int], list[tuple[int, int]]]:
        """The first positions of up to ``count`` consecutive micro batches of ``rank`` from ``(step, micro_step)`` on,
        in the order a sampler yields them (the micro steps of a step, then the next step), none at or after
        ``stop_step``; and their ``(step, micro_step)`` followed by the one after the last (one more entry)."""
        rank = self._check_rank(rank)
        micro_step, step = _check_step(micro_step, "micro_step"), _check_step(step)
        per_micro_step = self.world_size * self.micro_batch_size
        starts: list[int] = []
        where: list[tuple[int, int]] = []
        while len(starts) < count and (stop_step is None or step < stop_step) and not (starts and step > MAX_STEP):
            d = data_step(self._skips, step)
            first_step, size, first_consumed = self._segment(d)
            micro_steps = size // per_micro_step
            if micro_step >= micro_steps:
                raise ValueError(
                    f"Got micro_step {micro_step}, allowed micro steps of step {step} are in [0, {micro_steps})"
                )
            consumed = first_consumed + (d - first_step) * size + rank * self.micro_batch_size
            for a in range(micro_step, min(micro_steps, micro_step + count - len(starts))):
                starts.append(consumed + a * per_micro_step)
                where.append((step, a))
            step, micro_step = (step, where[-1][1] + 1) if where[-1][1] + 1 < micro_steps else (step + 1, 0)
        where.append((step, micro_step))
        return starts, where

    def micro_batches_from(
        self, step: int, micro_step: int, rank: int, count: int, stop_step: int | None = None
    ) -> tuple[np.ndarray, list[tuple[int, int]]]:
        """Up to ``count`` consecutive micro batches of ``rank`` from micro step ``micro_step`` of ``step`` on (the
        micro steps of a step, then those of the next), none at or after ``stop_step``: their sample ids
        ``[k, micro_batch_size]`` (row ``i`` equals ``micro_batch(*where[i], rank)``) and ``where``, their ``(step,
        micro_step)`` followed by the position after the last (``k + 1`` entries). One stream call for all ``k``."""
        starts, where = self._micro_batch_starts(step, micro_step, rank, count, stop_step)
        positions = np.add.outer(np.array(starts, dtype=np.int64), np.arange(self.micro_batch_size, dtype=np.int64))
        if self.balance is not None:
            steps = np.array([w[0] for w in where[:-1]], dtype=np.int64)
            for s in np.unique(steps).tolist():
                positions[steps == s] = self._balanced(positions[steps == s], s)
        return self.stream.sample_ids(positions.reshape(-1)).reshape(len(starts), self.micro_batch_size), where

    # -- positions -> sample ids
    # -------------------------------------------------------------------------------------------

    def global_batch(self, step: int) -> np.ndarray:
        """The sample ids of the whole of ``step``; as a set, independent of ``world_size`` and ``micro_batch_size``."""
        return self.stream.sample_ids(self.step_positions(step))

    def micro_batch(self, step: int, micro_step: int, rank: int) -> np.ndarray:
        """The sample ids that ``rank`` reads at ``micro_step`` of ``step``."""
        return self.stream.sample_ids(self.micro_batch_positions(step, micro_step, rank))

    def worker_micro_batches(
        self, step: int, rank: int, worker: int, num_workers: int, start_step: int = 0
    ) -> list[int]:
        """The micro steps of ``step`` that DataLoader worker ``worker`` fetches for ``rank`` after a start at
        ``start_step``.

        A DataLoader hands the i-th batch of its batch sampler to worker ``i % num_workers``; the sampler yields the
        micro batches of ``start_step``, ``start_step + 1``, ... in order, so the assignment is a pure function of these
        arguments.
        """
        self._check_rank(rank)
        if num_workers < 1 or not 0 <= worker < num_workers:
            raise ValueError(
                f"Got worker {worker} of num_workers {num_workers}; need num_workers >= 1, worker in [0, num_workers)"
            )
        start_step, step = _check_step(start_step, "start_step"), _check_step(step)
        if step < start_step:
            raise ValueError(f"step {step} comes before start_step {start_step}")
        before = self.micro_steps_between(start_step, step)
        return [a for a in range(self.num_micro_steps(step)) if (before + a) % num_workers == worker]

    def micro_steps_between(self, start_step: int, stop_step: int) -> int:
        """Micro batches the sampler yields for steps ``[start_step, stop_step)`` (per rank)."""
        per_micro = self.world_size * self.micro_batch_size
        if not self._skips:
            return (self.consumed(stop_step) - self.consumed(start_step)) // per_micro
        return (self._trained(stop_step) - self._trained(start_step)) // per_micro

    # -- identity
    # ----------------------------------------------------------------------------------------------------------

    def with_world(self, world_size: int, micro_batch_size: int | None = None) -> Plan:
        """The same stream cut for another data-parallel degree (and micro batch size): the elastic-resume plan."""
        return replace(self, world_size=world_size, micro_batch_size=micro_batch_size or self.micro_batch_size)

    def fingerprint(self) -> dict:
        """What fixes the data of every step: neither ``world_size`` nor ``micro_batch_size``, which may change on
        resume (a balanced plan deals a step's samples anew for them: the step's set stays)."""
        out = {
            "mapping_version": self.mapping_version,
            "stream": self.stream.describe(),
            "seed": self.seed,
            "batch_size_schedule": [list(row[:2]) for row in self._schedule],
        }
        if self._skips:  # only when present, so that plans without skip ranges keep their fingerprint
            out["skip_steps"] = [list(r) for r in self._skips]
        if self.redactions:  # likewise: plans without redactions keep their fingerprint
            out["redactions"] = [r.to_list() for r in self.redactions]
        if self.balance is not None:  # likewise (and the mapping version is 3)
            out["balance"] = self.balance.describe()
        return out
