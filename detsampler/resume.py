"""Checking that a resumed plan trains, before the resume step, on exactly what the checkpointed run trained on.

A run may be resumed with a different ``world_size`` or ``micro_batch_size`` (elastic resume), with new mixture schedule
entries at or after the resume step, and with new skip ranges that start at or after the data step the resume reads. Any
other change to what fixes the data (the fingerprint of :meth:`detsampler.plan.Plan.fingerprint`) changes the past and is
refused by :func:`check_resume` with a ValueError that says what changed.

All steps of the mixture schedule and of the skip ranges are *data* steps; the past is the data steps before
``d(resume_step)`` of the checkpointed plan.
"""

from __future__ import annotations

from typing import Any

from detsampler.checks import check_int
from detsampler.plan import Plan, data_step, normalize_skip_steps

__all__ = ["check_resume"]


def _fingerprint(plan_or_fingerprint: Plan | dict, name: str) -> dict:
    if isinstance(plan_or_fingerprint, Plan):
        return plan_or_fingerprint.fingerprint()
    if isinstance(plan_or_fingerprint, dict) and "stream" in plan_or_fingerprint:
        return plan_or_fingerprint
    raise ValueError(f"{name} must be a Plan or a Plan.fingerprint() dict, got {type(plan_or_fingerprint).__name__}")


def _normalized(value: Any) -> Any:
    """JSON round trips turn tuples into lists: compare in that form."""
    if isinstance(value, (list, tuple)):
        return [_normalized(v) for v in value]
    if isinstance(value, dict):
        return {k: _normalized(v) for k, v in value.items()}
    return value


def check_resume(old: Plan | dict, new: Plan, resume_step: int) -> None:
    """Raise ValueError unless ``new`` reads what ``old`` read at every training step before ``resume_step``.

    ``old`` is the checkpointed run's plan or its ``fingerprint()`` (as saved, JSON round trips allowed). Allowed: another
    ``world_size``/``micro_batch_size``; mixture schedule entries whose step is at or after ``d(resume_step)``; skip ranges
    starting at or after ``d(resume_step)``; removing or changing entries and ranges that lie there too.
    """
    check_int(resume_step, "resume_step", minimum=0)
    before, after = _normalized(_fingerprint(old, "old")), _normalized(_fingerprint(new, "new"))
    old_skips = normalize_skip_steps([tuple(r) for r in before.get("skip_steps", [])])
    boundary = data_step(old_skips, int(resume_step))  # data steps < boundary are the past

    for key in sorted((set(before) | set(after)) - {"stream", "skip_steps"}):
        if before.get(key) != after.get(key):
            raise ValueError(
                f"resuming at step {resume_step} changes the plan's {key}: the checkpoint has {before.get(key)!r}, the new "
                f"plan {after.get(key)!r}; this would change data already trained on"
            )

    old_stream, new_stream = before["stream"], after["stream"]
    if old_stream.get("kind") == "mixture" and new_stream.get("kind") == "mixture":
        rest = lambda d: {k: v for k, v in d.items() if k != "schedule"}  # noqa: E731
        if rest(old_stream) != rest(new_stream):
            changed = sorted(k for k in set(rest(old_stream)) | set(rest(new_stream)) if old_stream.get(k) != new_stream.get(k))
            raise ValueError(
                f"resuming at step {resume_step} changes the mixture's {', '.join(changed)}: only its weights schedule may "
                "change, by entries at or after the resume step"
            )
        past_old = [e for e in old_stream["schedule"] if e[0] < boundary]
        past_new = [e for e in new_stream["schedule"] if e[0] < boundary]
        if past_old != past_new:
            diff = next((a, b) for a, b in zip(past_old + [None] * len(past_new), past_new + [None] * len(past_old)) if a != b)
            raise ValueError(
                f"the mixture weights schedule changes the past: before data step {boundary} (where training step "
                f"{resume_step} resumes) the checkpoint has entry {diff[0]!r} and the new plan {diff[1]!r}; write the change as "
                f"a schedule entry at step >= {boundary}"
            )
    elif old_stream != new_stream:
        raise ValueError(
            f"resuming at step {resume_step} changes the data stream: the checkpoint has {old_stream!r}, the new plan "
            f"{new_stream!r}"
        )

    new_skips = normalize_skip_steps([tuple(r) for r in after.get("skip_steps", [])])
    past_old_skips = [r for r in old_skips if r[0] < boundary]
    past_new_skips = [r for r in new_skips if r[0] < boundary]
    if past_old_skips != past_new_skips:
        added = [r for r in past_new_skips if r not in past_old_skips]
        removed = [r for r in past_old_skips if r not in past_new_skips]
        what = f"adds {added}" if added else f"removes {removed}"
        raise ValueError(
            f"skip_steps {what}, which lies in the past of the resume: training step {resume_step} resumes at data step "
            f"{boundary}, so new ranges must start at data step >= {boundary} and earlier ranges must stay as trained"
        )
