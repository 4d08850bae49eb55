"""What ``make demo`` (``train.demo``) and the GPU check (``train.gpu_check``) share: launching a logged training run
(killed at a kill point or not) and comparing two runs step by step.

Two runs agree at a step when the plan's sample hash, the hash of the tokens the ranks trained on and the loss agree;
the loss bit for bit (``loss_tolerance=0``, the default) or within an absolute tolerance.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from train.launch import run_training, train_command
from train.metrics import RunMetrics

__all__ = ["Comparison", "compare_runs", "echo_filter", "print_comparison", "run_logged"]

ROOT = Path(__file__).resolve().parent.parent

_SHOWN = (
    "step",
    "checkpoint",
    "resuming",
    "starting",
    "removed",
    "done",
    "DETSAMPLER",
    "data:",
    "model:",
    "detsampler:",
    "Traceback",
    "error",
)


def echo_filter(prefix: str, verbose: bool, keep: list[str] | None = None) -> Callable[[str], None]:
    """A line printer for a run's output: torchrun's banner is dropped; without ``verbose`` only the trainer's own
    lines (steps, checkpoints, resumes, errors) are printed, as ``  PREFIX | line``. ``keep``, when given, collects
    every line."""

    def echo(line: str) -> None:
        if keep is not None:
            keep.append(line)
        if not line.strip() or line.startswith(("W1", "*****", "Setting OMP_NUM_THREADS")):
            return  # torchrun's banner
        if verbose or line.startswith(_SHOWN) or "Error" in line:
            print(f"  {prefix} | {line.strip()}", flush=True)

    return echo


def run_logged(
    label: str,
    args: list[str],
    *,
    nproc: int,
    kill_point: str | None = None,
    verbose: bool = False,
    timeout: float = 1800,
    what: str = "run",
    ranks: str = "torchrun and both ranks",
    keep: list[str] | None = None,
) -> float:
    """Run ``python -m train.train ARGS`` on ``nproc`` ranks under torchrun, its output filtered by
    :func:`echo_filter`; with ``kill_point``, SIGKILL every process of it there. Raises SystemExit (naming ``what``)
    when the run fails or ends before its kill point; returns the seconds it took."""
    t0 = time.monotonic()
    echo = echo_filter(label, verbose, keep)
    result = run_training(train_command(nproc, args), kill_point=kill_point, cwd=ROOT, echo=echo, timeout=timeout)
    if kill_point is not None:
        if result.killed_at != kill_point:
            raise SystemExit(f"{what}: run {label} ended (exit {result.returncode}) before reaching {kill_point}")
        print(f"  {label} | >>> SIGKILL sent to every process of the run ({ranks}) at {kill_point}", flush=True)
    elif result.returncode != 0:
        raise SystemExit(f"{what}: run {label} failed with exit code {result.returncode}")
    return time.monotonic() - t0


@dataclass
class Comparison:
    """``rows[i] = (step, record A, record B, same samples, same tokens, same loss)``; ``bad``: the steps that differ
    (or are missing in a run); ``max_loss_diff``: the largest absolute loss difference over the steps both ran."""

    steps: int
    rows: list[tuple] = field(default_factory=list)
    bad: list[int] = field(default_factory=list)
    max_loss_diff: float = 0.0
    loss_tolerance: float = 0.0

    def count(self, i: int) -> int:
        """How many steps agree on item ``i`` of a row (3: samples, 4: tokens, 5: loss)."""
        return sum(1 for r in self.rows if r[i])


def _same_loss(a: float | None, b: float | None, tolerance: float) -> bool:
    if tolerance == 0 or a is None or b is None:
        return a == b  # NOTE: a NaN loss is logged as null, so two NaN steps compare equal
    return abs(a - b) <= tolerance


def compare_runs(a: RunMetrics, b: RunMetrics, steps: int, loss_tolerance: float = 0.0) -> Comparison:
    """Compare steps ``0 .. steps-1`` of two runs' resolved metrics."""
    out = Comparison(steps, loss_tolerance=loss_tolerance)
    for step in range(steps):
        ra, rb = a.steps.get(step), b.steps.get(step)
        if ra is None or rb is None:
            out.bad.append(step)
            out.rows.append((step, ra, rb, False, False, False))
            continue
        same = (
            ra["sample_hash"] == rb["sample_hash"],
            ra["tokens_hash"] == rb["tokens_hash"],
            _same_loss(ra["loss"], rb["loss"], loss_tolerance),
        )
        if ra["loss"] is not None and rb["loss"] is not None:
            out.max_loss_diff = max(out.max_loss_diff, abs(ra["loss"] - rb["loss"]))
        if not all(same):
            out.bad.append(step)
        out.rows.append((step, ra, rb, *same))
    return out


def print_comparison(cmp: Comparison, resumed: Sequence[int]) -> None:
    """The step-by-step table (first and last steps, the steps around each resume, every differing step, and about six
    steps between), then the counts."""
    n = cmp.steps
    show = {
        0,
        n - 1,
        *[s for r in resumed for s in (r - 1, r, r + 1)],
        *cmp.bad,
        *range(0, n, max(1, n // 6)),
    }
    print(f"      {'step':>4}  {'sample hash A':>13}  {'sample hash B':>13}  {'loss A':>18}  {'loss B':>18}  same?")
    for step, ra, rb, s_same, t_same, l_same in cmp.rows:
        if step not in show:
            continue
        mark = "  <- B resumed here" if step in resumed else ""
        if ra is None or rb is None:
            print(f"      {step:>4}  missing in {'A' if ra is None else 'B'}")
            continue
        verdict = "yes" if (s_same and t_same and l_same) else "NO"
        print(
            f"      {step:>4}  {ra['sample_hash']:>13}  {rb['sample_hash']:>13}  {ra['loss']:>18.15f} "
            f" {rb['loss']:>18.15f}  {verdict}{mark}"
        )
    losses = "losses bit-identical" if cmp.loss_tolerance == 0 else f"losses within {cmp.loss_tolerance:g}"
    print(
        f"      sample hashes equal: {cmp.count(3)}/{n} steps; trained tokens equal: {cmp.count(4)}/{n}; "
        f"{losses}: {cmp.count(5)}/{n}"
    )
