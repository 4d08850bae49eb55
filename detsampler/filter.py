"""Deterministic instance filtering: a per-sample predicate, pure in the sample's tokens, evaluated at read time.

:class:`RepetitionFilter` is OLMo-core's repetition filter (``olmo_core.data.numpy_dataset.InstanceFilterConfig`` and
``olmo_core.data.utils.find_periodic_sequences``), with its defaults and its flags: a sample is flagged when, for some
period ``p`` in ``[min_period, max_period]``, it holds a stretch of ``max_count`` or more back-to-back repetitions of
the same ``p`` tokens (a ``p``-periodic run of at least ``max_count * p`` tokens). OLMo-core can only report a run of
3 or more repetitions, so a ``max_count`` below 3 acts as 3 there and here.

The one deliberate difference: padding (positions marked invalid, ``document_ids == -1`` in a packed sample) never
repeats, as if each padding position held a token of its own; OLMo-core's fixed-length instances have no padding, and a
padded ``document``/``bestfit`` sample would otherwise be flagged for its run of ``pad_id``. The read path marks an
erased document's positions (:mod:`detsampler.index.erase`: its tokens overwritten with ``pad_id``) invalid the same
way, so that an erasure never flags the other documents of its samples.

Nothing here changes which samples a step reads: a flagged sample is still read, its loss is masked
(:class:`detsampler.loader.dataset.PackedDataset` sets its labels to -100). Pure in the tokens, the flag of a sample id
is the same on every world size and worker count. numpy only; vectorized over the batch: one strided probe of all
periods at once (a run of ``k`` equal pairs contains four consecutive multiples of ``k // 4``) picks candidate
positions, and only the ``2k + 1`` positions around each get the exact run-length test, all in one block. The
common path (no candidate) is two gathers, one comparison, two ANDs (four hits by doubling) and an ``any``; the
padding test compares in a 16-bit type; the period check and the exact test run on the candidates only
(``tests/filter_reference.py``, the former implementation, flags the same: ``tests/test_filter.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

__all__ = ["RepetitionFilter", "repetition_flags"]

PROBE_HITS = 4  # consecutive probe hits that make a candidate: more probes, far fewer candidates for the exact test


@dataclass(frozen=True)
class RepetitionFilter:
    """OLMo-core's ``InstanceFilterConfig`` (``repetition_max_period``, ``repetition_min_period``,
    ``repetition_max_count``), with its defaults: flag a sample holding ``max_count`` or more repetitions of a unit
    of ``min_period`` .. ``max_period`` tokens."""

    max_period: int = 13
    min_period: int = 1
    max_count: int = 32

    def __post_init__(self) -> None:
        for name in ("max_period", "min_period", "max_count"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"RepetitionFilter.{name} must be an integer >= 1, got {value!r}")
            object.__setattr__(self, name, int(value))
        if self.min_period > self.max_period:
            raise ValueError(
                f"RepetitionFilter.min_period ({self.min_period}) must be <= max_period ({self.max_period})"
            )

    def flags(
        self, tokens: np.ndarray, valid: np.ndarray | None = None, lengths: np.ndarray | None = None
    ) -> np.ndarray:
        """Bool ``[B]``: which rows of ``tokens`` (``[B, L]``) are flagged (see :func:`repetition_flags`)."""
        return repetition_flags(tokens, self, valid, lengths)

    def to_dict(self) -> dict:
        return {"max_period": self.max_period, "min_period": self.min_period, "max_count": self.max_count}

    def describe(self) -> dict:
        """What a data fingerprint records: ``{"kind": "repetition", **to_dict()}``."""
        return {"kind": "repetition", **self.to_dict()}

    @classmethod
    def from_description(cls, described: dict) -> RepetitionFilter:
        """The filter :meth:`describe` described (a fingerprint's ``instance_filter``)."""
        if not isinstance(described, dict) or described.get("kind") != "repetition":
            raise ValueError(f"not a RepetitionFilter description (kind 'repetition'): {described!r}")
        return cls(**{k: v for k, v in described.items() if k != "kind"})


def repetition_flags(
    tokens: np.ndarray,
    config: RepetitionFilter | None = None,
    valid: np.ndarray | None = None,
    lengths: np.ndarray | None = None,
) -> np.ndarray:
    """Bool ``[B]``: True where row ``b`` of ``tokens`` (``[B, L]`` integers) holds, for some period ``p`` in
    ``[config.min_period, config.max_period]``, at least ``max(config.max_count, 3)`` back-to-back repetitions of ``p``
    tokens, i.e. ``tokens[b, i] == tokens[b, i - p]`` for ``(count - 1) * p`` consecutive ``i``. ``valid`` (``[B, L]``
    bool, optional): positions where it is False (padding) equal nothing; ``lengths`` (``[B]``, optional, the cheaper
    form when padding is a tail, as in a packed sample): positions ``lengths[b]`` on of row ``b`` are padding."""
    config = RepetitionFilter() if config is None else config
    x = np.asarray(tokens)
    if x.ndim != 2:
        raise ValueError(f"tokens must be [B, L], got shape {x.shape}")
    if valid is not None:
        valid = np.asarray(valid, dtype=bool)
        if valid.shape != x.shape:
            raise ValueError(f"valid must have the tokens' shape {x.shape}, got {valid.shape}")
    if lengths is not None:
        lengths = np.minimum(np.asarray(lengths, dtype=np.int64).reshape(-1, 1), x.shape[1])  # beyond: no padding
        if len(lengths) != len(x):
            raise ValueError(f"lengths must have one entry per row ({len(x)}), got {len(lengths)}")
    rows, length = x.shape
    flagged = np.zeros(rows, dtype=bool)
    probe = _probes(config, length, rows)
    if probe is None or rows == 0:
        return flagged
    at, back, fat, fback, same_period, periods_of, hits = probe
    # candidates: `hits` consecutive probes of one period that all see x[i] == x[i - p] (~900 per row)
    flat = x.reshape(-1)
    hit = flat[fat] == flat[fback]
    if valid is not None:
        vflat = valid.reshape(-1)
        hit &= vflat[fat] & vflat[fback]
    if lengths is not None:  # back < at: at inside means both are (compared in at's small integer type)
        hit &= at < lengths.astype(at.dtype, copy=False)
    run = _all_hit(hit, hits)
    if not run.any():  # the common case, and far cheaper than nonzero
        return flagged
    cand_rows, cand_probes = np.nonzero(run)
    # a window across two periods' probes is no candidate (checked here, on the few windows that all hit)
    same = same_period[cand_probes]
    if not same.all():
        cand_rows, cand_probes = cand_rows[same], cand_probes[same]
        if len(cand_rows) == 0:
            return flagged
    # the exact test, around each candidate probe i only: a run of >= k equal pairs that holds i has >= k of them in
    # [i - k, i + k], and one found there is a run of the row
    count = max(config.max_count, 3)
    p = periods_of[cand_probes][:, None]
    k = (count - 1) * p
    width = 2 * int(k.max()) + 1
    offset = np.arange(width)[None, :]
    pos = at[cand_probes][:, None] - k + offset
    inside = (pos >= p) & (pos < (length if lengths is None else lengths[cand_rows])) & (offset <= 2 * k)
    at_pos = np.where(inside, pos, p) + (cand_rows * length)[:, None]
    back_pos = at_pos - p
    eq = flat[at_pos] == flat[back_pos]
    eq &= inside
    if valid is not None:
        eq &= vflat[at_pos] & vflat[back_pos]
    # the longest run of equal pairs in each window: at j, j minus the last unequal position up to j
    last_unequal = np.maximum.accumulate(np.where(eq, -1, offset), axis=1)
    found = (offset - last_unequal).max(axis=1) >= k[:, 0]
    flagged[cand_rows[found]] = True
    return flagged


def _all_hit(hit: np.ndarray, hits: int) -> np.ndarray:
    """Bool ``[B, m - hits + 1]``: whether probes ``j .. j + hits - 1`` all hit, by doubling (a window of ``2w`` is
    two windows of ``w``): ``ceil(log2(hits))`` operations instead of ``hits - 1``."""
    run, width = hit, 1
    while width < hits:
        shift = min(width, hits - width)  # windows of `width` at j and j + shift cover j .. j + width + shift - 1
        run = run[:, : run.shape[1] - shift] & run[:, shift:]
        width += shift
    return run


@lru_cache(maxsize=64)
def _probes(config: RepetitionFilter, length: int, rows: int) -> tuple[np.ndarray, ...] | None:
    """The probe positions of every period, concatenated: ``at`` (positions ``i``), ``back`` (``i - p``), the same as
    indices into a flattened ``[rows, length]`` block, whether probe ``j + hits - 1`` is of the same period as probe
    ``j``, each probe's period, and ``hits``; None when no period has ``hits`` probes.

    A run of ``k = (count - 1) * p`` equal pairs ``(i - p, i)`` holds ``hits`` consecutive multiples of ``k // hits``
    (``hits = min(PROBE_HITS, k)`` for the shortest ``k``), so probing ``i`` at those multiples misses no flagged
    row."""
    count = max(config.max_count, 3)
    hits = min(PROBE_HITS, (count - 1) * config.min_period)
    at, back, period = [], [], []
    for p in range(config.min_period, config.max_period + 1):
        k = (count - 1) * p
        if k + p > length:
            break
        step = k // hits
        i = np.arange(-(-p // step) * step, length, step)
        at.append(i)
        back.append(i - p)
        period.append(np.full(len(i), p))
    if sum(map(len, at)) < hits:
        return None
    at_all, back_all, periods_of = np.concatenate(at), np.concatenate(back), np.concatenate(period)
    base = np.arange(0, rows * length, length, dtype=np.intp)[:, None]
    same = periods_of[hits - 1 :] == periods_of[: len(periods_of) - hits + 1]
    small = np.int16 if length <= np.iinfo(np.int16).max else np.int32  # the lengths test: ~3x faster than int64
    arrays = (at_all.astype(small), back_all, base + at_all, base + back_all, same, periods_of)
    for a in arrays:
        a.setflags(write=False)
    return (*arrays, hits)
