"""Checking that a resumed run trains, before the resume step, on exactly what the checkpointed run trained on.

What fixes the data of every step is a :class:`DataFingerprint`: the identity of the index (or indexes, for a mixture),
the layout (its kind, ``seq_len``, seed, window and corpus counts), the plan (mapping version, stream, seed, batch
schedule, skip ranges, redactions, balance) and the instance filter, when there is one. Save
``DataFingerprint.of(...).to_dict()`` with a checkpoint and call :func:`check_resume` with it on resume.

A run may be resumed with a different ``world_size`` or ``micro_batch_size`` (elastic resume), with new batch-size or
mixture schedule entries at or after the resume step, with new skip ranges that start at or after the data step the
resume reads, and with redactions from the resume step on (per source, over a mixture). Any other change (another
index, another layout, another seed, batch sizes or weights before the resume, redactions before it, another instance
filter or none) is refused by :func:`check_resume` with a ValueError that says what changed.

All steps of the batch-size schedule, of the mixture schedule and of the skip ranges are *data* steps; the past is the
data steps before ``d(resume_step)`` of the checkpointed plan.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

from detsampler.checks import check_int
from detsampler.filter import RepetitionFilter
from detsampler.plan import Plan, data_step, normalize_skip_steps
from detsampler.redaction import normalize_redactions

__all__ = ["DataFingerprint", "check_resume", "erasures_added", "fingerprint_changes"]


@dataclass(frozen=True)
class DataFingerprint:
    """What fixes the data stream of every step: ``index`` (the index's identity string; for a mixture, its sources'
    identities joined by ``,``), ``layout`` (``Layout.describe()``; for a mixture ``{"mixture": [describe() per
    source]}``) and ``plan`` (``Plan.fingerprint()``, which holds the mapping version). None of them holds the number of
    ranks, the micro batch size or the number of workers, which may change on resume. ``instance_filter``: the
    instance filter's ``{"kind": ..., fields}`` (:meth:`detsampler.filter.RepetitionFilter.describe`), or None (no
    filter: then absent from the JSON form and the hash, which are those of fingerprints before filters existed).

    Invariant: two fingerprints have the same :attr:`hash` exactly when their JSON forms are equal.
    """

    index: str
    layout: dict
    plan: dict
    instance_filter: dict | None = None

    def __post_init__(self) -> None:
        if self.instance_filter is not None and not isinstance(self.instance_filter, dict):
            got = type(self.instance_filter).__name__
            raise ValueError(f"DataFingerprint.instance_filter must be a dict or None, got {got}")
        if not isinstance(self.index, str) or not self.index:
            raise ValueError(f"DataFingerprint.index must be a non-empty identity string, got {self.index!r}")
        for name in ("layout", "plan"):
            if not isinstance(getattr(self, name), dict):
                raise ValueError(f"DataFingerprint.{name} must be a dict, got {type(getattr(self, name)).__name__}")
        if "stream" not in self.plan:
            raise ValueError("DataFingerprint.plan must be a Plan.fingerprint() dict (it has no 'stream')")
        # JSON round trips turn tuples into lists: hold the JSON form, so that saved and current compare equal.
        for name in ("layout", "plan", "instance_filter"):
            object.__setattr__(self, name, json.loads(json.dumps(getattr(self, name), sort_keys=True, default=str)))

    @classmethod
    def of(cls, index: Any, layout: Any, plan: Plan, instance_filter: Any = None) -> DataFingerprint:
        """The fingerprint of ``plan`` over ``layout`` of ``index``, read through ``instance_filter``.

        ``index``: the index's identity (a string, or an object with a ``fingerprint`` string such as ``TokenIndex``),
        or a sequence of them for a mixture; ``layout``: a layout (with ``describe()``) or, for a mixture, one per
        source; ``instance_filter``: the :class:`~detsampler.filter.RepetitionFilter` every source is read through,
        or None.
        """
        if not isinstance(plan, Plan):
            raise ValueError(f"plan must be a Plan, got {type(plan).__name__}")
        described = _describe_filter(instance_filter)
        if isinstance(index, (list, tuple)):
            layouts = list(layout) if isinstance(layout, (list, tuple)) else None
            if layouts is None or len(layouts) != len(index):
                raise ValueError("a mixture's fingerprint needs one layout per index")
            return cls(
                ",".join(_identity(i) for i in index),
                {"mixture": [lay.describe() for lay in layouts]},
                plan.fingerprint(),
                described,
            )
        return cls(_identity(index), layout.describe(), plan.fingerprint(), described)

    def _body(self) -> dict:
        body = {"index": self.index, "layout": self.layout, "plan": self.plan}
        if self.instance_filter is not None:
            body["instance_filter"] = self.instance_filter
        return body

    def to_dict(self) -> dict:
        """The JSON form, with the hash under ``"hash"`` (what a checkpoint saves)."""
        return {**self._body(), "hash": self.hash}

    @classmethod
    def from_dict(cls, saved: dict) -> DataFingerprint:
        """The fingerprint saved by :meth:`to_dict` (its ``hash`` is recomputed, and must match when present)."""
        if not isinstance(saved, dict) or not {"index", "layout", "plan"} <= set(saved):
            keys = sorted(saved) if isinstance(saved, dict) else type(saved).__name__
            raise ValueError(f"a saved DataFingerprint needs the keys index, layout and plan, got {keys}")
        fp = cls(saved["index"], saved["layout"], saved["plan"], saved.get("instance_filter"))
        if "hash" in saved and saved["hash"] != fp.hash:
            raise ValueError(
                f"the saved DataFingerprint's hash {saved['hash']!r} does not match its content ({fp.hash})"
            )
        return fp

    @property
    def hash(self) -> str:
        body = json.dumps(self._body(), sort_keys=True, default=str)
        return hashlib.sha256(body.encode()).hexdigest()[:16]


def _describe_filter(instance_filter: Any) -> dict | None:
    if instance_filter is None:
        return None
    if not isinstance(instance_filter, RepetitionFilter):
        got = type(instance_filter).__name__
        raise ValueError(f"instance_filter must be a RepetitionFilter or None, got {got}")
    return instance_filter.describe()


def _identity(index: Any) -> str:
    """An index's identity: a string, its ``data_identity`` (a TokenIndex: with its erasures), else its
    ``fingerprint``."""
    value = index
    if not isinstance(index, str):
        value = getattr(index, "data_identity", None) or getattr(index, "fingerprint", None)
    if not isinstance(value, str) or not value:
        raise ValueError(f"index must be an identity string or have a string 'fingerprint', got {type(index).__name__}")
    return value


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: value}


def fingerprint_changes(saved: DataFingerprint | dict, current: DataFingerprint | dict) -> list[str]:
    """Human-readable differences ``key: saved -> current`` between two fingerprints (``hash`` left out)."""
    flat = [
        {k: v for k, v in _flatten(f.to_dict() if isinstance(f, DataFingerprint) else f).items() if k != "hash"}
        for f in (saved, current)
    ]
    a, b = flat
    return [
        f"{k}: {a.get(k, '<absent>')!r} -> {b.get(k, '<absent>')!r}"
        for k in sorted(set(a) | set(b))
        if a.get(k) != b.get(k)
    ]


def _as_fingerprint(value: DataFingerprint | dict, name: str) -> DataFingerprint:
    if isinstance(value, DataFingerprint):
        return value
    if isinstance(value, dict):
        return DataFingerprint.from_dict(value)
    hint = " (a Plan alone does not name the index and layout: pass DataFingerprint.of(index, layout, plan))"
    raise ValueError(
        f"{name} must be a DataFingerprint or its to_dict(), got {type(value).__name__}"
        + (hint if isinstance(value, Plan) else "")
    )


def check_resume(old: DataFingerprint | dict, new: DataFingerprint | dict, resume_step: int) -> None:
    """Raise ValueError unless ``new`` reads what ``old`` read at every training step before ``resume_step``.

    ``old`` is the checkpointed run's fingerprint (or its saved ``to_dict()``, JSON round trips allowed), ``new`` the
    resuming run's. The index and the layout must be the same; the index may have been erased since (its identity
    extended by erasure records only: :func:`erasures_added`; the documents and lengths are the same). Allowed plan
    changes: another ``world_size``/``micro_batch_size`` (a balanced plan deals each step anew: its samples stay);
    another plan ``seed`` when the plan reads a source stream (a mixture, keyed by its own seed: the plan's is unused);
    batch-size schedule (ramp) entries and mixture schedule entries whose step is at or after ``d(resume_step)``; skip
    ranges starting at or after ``d(resume_step)``; removing or changing entries and ranges that lie there too;
    redactions whose ``from_step`` (a training step) is ``>= resume_step``, added or brought forward (a redaction the
    checkpoint records is never dropped or postponed: refused). The balance (on, off, its cost model) may not change.

    Args:
        old: the checkpointed run's :class:`DataFingerprint`, or its saved ``to_dict()``.
        new: the resuming run's fingerprint (``DataFingerprint.of(index, layout, plan)``).
        resume_step: the training step the resumed run starts at (the checkpoint's step).

    Raises:
        ValueError: naming what changed, when the resumed run would read other data before ``resume_step``.
    """
    check_int(resume_step, "resume_step", minimum=0)
    before, after = _as_fingerprint(old, "old"), _as_fingerprint(new, "new")
    if before.hash == after.hash:
        return
    for name in ("index", "layout"):
        if name == "index" and erasures_added(before.index, after.index) is not None:
            continue  # the same documents, some erased since: every length, hence every sample, in place
        if getattr(before, name) != getattr(after, name):
            changes = [c for c in fingerprint_changes(before, after) if c.startswith(name)]
            raise ValueError(
                f"resuming at step {resume_step} changes the {name}: {'; '.join(changes)}; this would change data"
                " already trained on"
            )
    if before.instance_filter != after.instance_filter:
        changes = [c for c in fingerprint_changes(before, after) if c.startswith("instance_filter")]
        raise ValueError(
            f"resuming at step {resume_step} changes the instance filter: {'; '.join(changes)}; a run reads every step"
            " through one filter (its record, stats and audits name it): keep the checkpoint's, or start a new run"
        )
    _check_plan(before.plan, after.plan, int(resume_step))


_ERASURES = re.compile(r"^(\+erasure:[0-9a-f]+)*$")


def erasures_added(old: str, new: str) -> list[str] | None:
    """The erasure records (their ids) by which index identity ``new`` extends ``old`` (a mixture's identities joined
    by commas: each source's); None unless ``new`` is exactly ``old`` with erasures appended (another index, an erasure
    removed or reordered)."""
    olds, news = str(old).split(","), str(new).split(",")
    if len(olds) != len(news):
        return None
    added: list[str] = []
    for a, b in zip(olds, news):
        if not b.startswith(a) or not _ERASURES.match(b[len(a) :]):
            return None
        added += [part for part in b[len(a) :].split("+erasure:") if part]
    return added


def _normalized(value: Any) -> Any:
    """JSON round trips turn tuples into lists: compare in that form."""
    if isinstance(value, (list, tuple)):
        return [_normalized(v) for v in value]
    if isinstance(value, dict):
        return {k: _normalized(v) for k, v in value.items()}
    return value


def _check_batch_schedule(old: list, new: list, boundary: int, resume_step: int) -> None:
    """Every data step before ``boundary`` must keep its batch size (so its positions): entries from there may change.

    The sizes are compared, not the entries: a redundant entry (the size already in force) changes nothing.
    """

    def size_at(entries: list, step: int) -> int:
        return next(size for first, size in reversed(entries) if first <= step)

    for step in sorted({e[0] for e in old + new if e[0] < boundary}):
        if size_at(old, step) != size_at(new, step):
            raise ValueError(
                f"the batch_size_schedule changes the past: data step {step} (before data step {boundary}, where"
                f" training step {resume_step} resumes) has {size_at(old, step)} samples in the checkpoint and"
                f" {size_at(new, step)} in the new plan; this would change data already trained on: change batch sizes"
                f" only by entries at step >= {boundary}"
            )


def _check_plan(old_plan: dict, new_plan: dict, resume_step: int) -> None:
    """The plan part of :func:`check_resume` (``Plan.fingerprint()`` dicts)."""
    before, after = _normalized(old_plan), _normalized(new_plan)
    old_skips = normalize_skip_steps([tuple(r) for r in before.get("skip_steps", [])])
    boundary = data_step(old_skips, int(resume_step))  # data steps < boundary are the past

    if before.get("balance") != after.get("balance"):
        raise ValueError(
            f"resuming at step {resume_step} changes the plan's balance from {before.get('balance')!r} to"
            f" {after.get('balance')!r}: every step keeps its samples, but the steps already trained would be audited"
            " (show, where) with another assignment of their samples to ranks than the one trained; resume with the"
            " checkpoint's balance, or start a new run"
        )
    if before.get("mapping_version") != after.get("mapping_version"):
        raise ValueError(
            f"resuming at step {resume_step} changes the mapping version from {before.get('mapping_version')!r} to "
            f"{after.get('mapping_version')!r}, which reorders every epoch; resume with Plan(..., mapping_version="
            f"{before.get('mapping_version')!r}) (the trainer and the CLI read it from the checkpoint)"
        )
    # The plan's seed keys only the epoch shuffles of ``num_samples``; a source stream (a mixture) has its own seed.
    unused = {"seed"} if before["stream"].get("kind") != "epochs" and after["stream"].get("kind") != "epochs" else set()
    free = {"stream", "skip_steps", "batch_size_schedule", "redactions"}
    for key in sorted((set(before) | set(after)) - free - unused):
        if before.get(key) != after.get(key):
            raise ValueError(
                f"resuming at step {resume_step} changes the plan's {key}: the checkpoint has {before.get(key)!r}, the"
                f" new plan {after.get(key)!r}; this would change data already trained on"
            )

    _check_batch_schedule(
        before.get("batch_size_schedule", []), after.get("batch_size_schedule", []), boundary, resume_step
    )
    old_stream, new_stream = before["stream"], after["stream"]
    if old_stream.get("kind") == "mixture" and new_stream.get("kind") == "mixture":
        rest = lambda d: {k: v for k, v in d.items() if k != "schedule"}
        if rest(old_stream) != rest(new_stream):
            changed = sorted(
                k for k in set(rest(old_stream)) | set(rest(new_stream)) if old_stream.get(k) != new_stream.get(k)
            )
            raise ValueError(
                f"resuming at step {resume_step} changes the mixture's {', '.join(changed)}: only its weights schedule"
                " may change, by entries at or after the resume step"
            )
        past_old = [e for e in old_stream["schedule"] if e[0] < boundary]
        past_new = [e for e in new_stream["schedule"] if e[0] < boundary]
        if past_old != past_new:
            diff = next(
                (a, b) for a, b in zip(past_old + [None] * len(past_new), past_new + [None] * len(past_old)) if a != b
            )
            raise ValueError(
                f"the mixture weights schedule changes the past: before data step {boundary} (where training step"
                f" {resume_step} resumes) the checkpoint has entry {diff[0]!r} and the new plan {diff[1]!r}; write the"
                f" change as a schedule entry at step >= {boundary}"
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
        what = " and ".join(([f"adds {added}"] if added else []) + ([f"removes {removed}"] if removed else []))
        raise ValueError(
            f"skip_steps {what}, which lies in the past of the resume: training step {resume_step} resumes at data step"
            f" {boundary}, so new ranges must start at data step >= {boundary} and earlier ranges must stay as trained"
        )
    _check_redactions(before.get("redactions", []), after.get("redactions", []), resume_step)


def _check_redactions(old: list, new: list, resume_step: int) -> None:
    """Redactions are in training steps: those in force before ``resume_step`` masked what was trained, so they must
    stay as they are; entries from ``resume_step`` on may be added, or brought forward (they change no sample), but a
    document the checkpoint redacts from step ``f >= resume_step`` must stay redacted from a step ``<= f``: a recorded
    takedown is never dropped or postponed by a resume that forgot it (``allow_data_change`` is the explicit way). Over
    a mixture, entries are per source (``[from_step, [documents], source]``): the rule holds for each."""
    old_entries, new_entries = normalize_redactions(old), normalize_redactions(new)
    past_old = [r.to_list() for r in old_entries if r.from_step < resume_step]
    past_new = [r.to_list() for r in new_entries if r.from_step < resume_step]
    if past_old != past_new:
        added = [r for r in past_new if r not in past_old]
        removed = [r for r in past_old if r not in past_new]
        what = " and ".join(([f"adds {added}"] if added else []) + ([f"removes {removed}"] if removed else []))
        form = "[from_step, [documents], source]" if len((added or removed)[0]) == 3 else "[from_step, [documents]]"
        raise ValueError(
            f"redactions {what} (as {form}), before training step {resume_step} where the run"
            f" resumes: those steps were trained without it; redact from step >= {resume_step}"
        )
    redacted = {(r.source, d): r.from_step for r in new_entries for d in r.documents}
    dropped = [
        (r.source, d, r.from_step)
        for r in old_entries
        for d in r.documents
        if r.from_step >= resume_step and redacted.get((r.source, d), r.from_step + 1) > r.from_step
    ]
    if dropped:
        source, doc, step = dropped[0]
        of = "" if source is None else f" of source {source}"
        now = redacted.get((source, doc))
        how = "drops" if now is None else f"postpones to step {now}"
        raise ValueError(
            f"resuming at step {resume_step} {how} the redaction of document {doc}{of} from step {step}"
            f" ({len(dropped)} document(s) in all): the checkpoint records it, and a recorded takedown stays in force;"
            f" keep it (from a step <= {step}), or resume with allow_data_change (--allow-data-change) to drop it"
        )
