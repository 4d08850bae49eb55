"""Per-step metrics: one JSON object per line in ``RUN_DIR/metrics.jsonl``, appended across resumes.

Records have an ``event``: ``"start"`` (a fresh run), ``"resumed_from"`` (a resume: ``step`` is the checkpoint's step,
the first step trained again) and ``"step"`` (step, loss, lr, tokens_per_s, data_wait_ms, sample_hash, tokens_hash,
tokens: the global batch's labels that count in the loss, positions: its positions that hold a document token, ...).
A killed run may have logged steps past its last checkpoint; after a resume they are trained again and logged again.
:func:`read_metrics` resolves this explicitly: a ``resumed_from`` marker at step s discards every earlier record of
steps
>= s, so each step's record is the one of the attempt that the final run state descends from.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from detsampler.hashing import sample_hash  # the library's: `detsampler show` prints the same hash

__all__ = ["MetricsLog", "RunMetrics", "read_metrics", "sample_hash", "token_row_hashes"]

METRICS_FILE = "metrics.jsonl"


_MULT = np.uint64(0x9E3779B97F4A7C15)


def token_row_hashes(tokens: np.ndarray) -> np.ndarray:
    """One uint64 hash per row of an int array [rows, seq] (vectorized polynomial hash, wrapping arithmetic)."""
    t = np.ascontiguousarray(tokens, dtype=np.int64).view(np.uint64)
    weights = np.ones(t.shape[1], dtype=np.uint64)
    with np.errstate(over="ignore"):
        if t.shape[1] > 1:
            weights[1:] = _MULT
            weights = np.cumprod(weights, dtype=np.uint64)
        return (t * weights).sum(axis=1, dtype=np.uint64) + np.uint64(t.shape[1])


def _strict(value: Any) -> Any:
    """``value`` with every non-finite float replaced by None (JSON has no NaN or Infinity)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strict(v) for v in value]
    return value


class MetricsLog:
    """Appends records to ``RUN_DIR/metrics.jsonl`` (only where ``enabled``, i.e. on rank 0), flushed per line."""

    def __init__(self, run_dir: str | Path, enabled: bool = True) -> None:
        self.path = Path(run_dir) / METRICS_FILE
        self.enabled = enabled
        self._file = None
        if enabled:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "a", buffering=1)

    def write(self, record: dict[str, Any]) -> None:
        """Append ``record`` as strict JSON: a non-finite float (a NaN loss) is written as null."""
        if self._file is not None:
            self._file.write(json.dumps(_strict(record), sort_keys=True, allow_nan=False) + "\n")
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


@dataclass
class RunMetrics:
    """A run's resolved metrics: ``steps[s]`` is the record of step s; ``resumes`` the resume events in order."""

    steps: dict[int, dict] = field(default_factory=dict)
    resumes: list[dict] = field(default_factory=list)
    discarded: list[dict] = field(default_factory=list)  # step records of killed attempts that a resume replaced

    @property
    def superseded(self) -> int:
        """How many step records of killed attempts a resume replaced (those steps were trained again)."""
        return len(self.discarded)


def read_metrics(run_dir: str | Path) -> RunMetrics:
    """The metrics of ``run_dir`` with resumes applied (see the module docstring)."""
    out = RunMetrics()
    path = Path(run_dir) / METRICS_FILE
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # a line cut short by a kill
            continue
        event = record.get("event")
        if event == "resumed_from":
            stale = sorted(s for s in out.steps if s >= record["step"])
            out.discarded.extend(out.steps.pop(s) for s in stale)
            out.resumes.append(record)
        elif event == "start":
            out.discarded.extend(out.steps[s] for s in sorted(out.steps))
            out.steps.clear()
            out.resumes.clear()
        elif event == "step":
            out.steps[int(record["step"])] = record
    return out
