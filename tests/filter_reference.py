"""The instance filter's former flag computation (``detsampler.filter`` before the probe test was cut to fewer numpy
calls), kept as the reference :func:`detsampler.filter.repetition_flags` must equal flag for flag
(tests/test_filter.py) and as the "before" of benchmark 17 (``tests/benchmarks/bench_filter.py``)."""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from detsampler.filter import RepetitionFilter

__all__ = ["repetition_flags"]

PROBE_HITS = 4


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
        lengths = np.asarray(lengths, dtype=np.int64).reshape(-1, 1)
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
    if lengths is not None:  # back < at: at inside means both are
        hit &= at < lengths
    n = hit.shape[1] - hits + 1
    run = hit[:, :n] & same_period
    for d in range(1, hits):
        run &= hit[:, d : n + d]
    if not run.any():  # the common case, and far cheaper than nonzero
        return flagged
    cand_rows, cand_probes = np.nonzero(run)
    # the exact test, around each candidate probe i only: a run of >= k equal pairs that holds i has >= k of them in
    # [i - k, i + k], and one found there is a run of the row
    count = max(config.max_count, 3)
    p = periods_of[cand_probes][:, None]
    k = (count - 1) * p
    width = 2 * int(k.max()) + 1
    offset = np.arange(width)[None, :]
    pos = at[cand_probes][:, None] - k + offset
    inside = (pos >= p) & (pos < (length if lengths is None else lengths[cand_rows])) & (offset <= 2 * k)
    pos = np.where(inside, pos, p)
    row = (cand_rows * length)[:, None]
    eq = (flat[row + pos] == flat[row + pos - p]) & inside
    if valid is not None:
        eq &= vflat[row + pos] & vflat[row + pos - p]
    runs = np.zeros((len(cand_rows), width + 1), dtype=np.int32)
    np.cumsum(eq, axis=1, out=runs[:, 1:])
    ahead = np.take_along_axis(runs, np.minimum(np.arange(width + 1)[None, :] + k, width), axis=1)
    found = ((ahead - runs) == k).any(axis=1)
    flagged[cand_rows[found]] = True
    return flagged


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
    arrays = (at_all, back_all, base + at_all, base + back_all, same, periods_of)
    for a in arrays:
        a.setflags(write=False)
    return (*arrays, hits)
