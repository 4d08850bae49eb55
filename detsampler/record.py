"""What a checkpoint records of its data: a :class:`DataRecord`, the one format the trainer and every integration save
and ``detsampler show|verify|stats --checkpoint`` read.

A record holds the :class:`~detsampler.resume.DataFingerprint` (what fixes the data of every step), the step the
checkpoint resumes at, where each index opens again (``indexes``: one, or one per mixture source) and how the run was
cut (``world_size``, ``micro_batch_size``), which the fingerprint leaves out because a resume may change them.

Invariants: ``DataRecord.from_dict(r.to_dict()) == r`` through JSON; :meth:`DataRecord.plan` rebuilds a plan whose
``fingerprint()`` equals the recorded one or raises (never a plan over other data); :func:`index_location` of an index
opened by :func:`detsampler.index.locations.open_location` of that location is the same location.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from detsampler.atomic import atomic_write
from detsampler.balance import Balance, CostModel
from detsampler.checks import check_int, check_positive_int
from detsampler.filter import RepetitionFilter
from detsampler.layout import LayoutConfig
from detsampler.plan import Plan
from detsampler.resume import DataFingerprint, check_resume, fingerprint_changes
from detsampler.storage import is_remote

__all__ = ["RECORD_FILE", "RECORD_FORMAT", "RECORD_VERSION", "DataRecord", "index_location"]

RECORD_FILE = "detsampler_data.json"  # the name of a record saved in a checkpoint directory
RECORD_FORMAT = "detsampler-data-record"
RECORD_VERSION = 1


def index_location(index: Any) -> dict[str, Any]:
    """Where ``index`` opens again, as JSON: ``{"kind": "index", "path": DIR}`` for a built (or sharded) index
    directory, ``{"kind": KIND, "path": PATH, "options": {...}}`` for a pre-tokenized source (``open_source(KIND, PATH,
    **options)``). Paths are absolute (or object store URLs), so the record reads the same from any working
    directory."""
    path = getattr(index, "path", None)
    if path is None:
        raise ValueError(f"{type(index).__name__} has no path: only an opened index or source can be recorded")
    options = getattr(index, "open_options", None)
    where = str(path) if is_remote(str(path)) else str(Path(path).resolve())  # a URL is absolute already
    if isinstance(options, dict) and hasattr(index, "kind"):
        return {"kind": str(index.kind), "path": where, "options": _jsonable(options)}
    return {"kind": "index", "path": where}


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, sort_keys=True, default=str))


@dataclass(frozen=True)
class DataRecord:
    """The data of a checkpoint: ``step`` (the next step to train, where a resume starts; ``samples_in_step`` of it
    already consumed, 0 at a step boundary), ``fingerprint``, ``indexes`` (:func:`index_location` of each index: one,
    or one per mixture source in order), ``world_size`` and ``micro_batch_size`` of the run that saved it, ``names``
    (a mixture's source labels, or None) and ``framework`` (who saved it: ``train``, ``hf``, ``lightning``,
    ``torchtitan``, ...)."""

    step: int
    fingerprint: DataFingerprint
    indexes: tuple[dict, ...]
    world_size: int
    micro_batch_size: int
    samples_in_step: int = 0
    names: tuple[str, ...] | None = None
    framework: str = ""
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_int(self.step, "step", minimum=0)
        check_int(self.samples_in_step, "samples_in_step", minimum=0)
        check_positive_int(self.world_size, "world_size")
        check_positive_int(self.micro_batch_size, "micro_batch_size")
        if not isinstance(self.fingerprint, DataFingerprint):
            raise ValueError(f"fingerprint must be a DataFingerprint, got {type(self.fingerprint).__name__}")
        indexes = tuple(self.indexes)
        if not indexes or not all(isinstance(i, dict) and {"kind", "path"} <= set(i) for i in indexes):
            raise ValueError(f"indexes must be index_location() dicts, one per index, got {self.indexes!r}")
        object.__setattr__(self, "indexes", tuple(_jsonable(i) for i in indexes))
        if self.names is not None:
            object.__setattr__(self, "names", tuple(str(n) for n in self.names))
        mixture = "mixture" in self.fingerprint.layout
        if mixture != (len(self.indexes) > 1 or self.fingerprint.plan["stream"].get("kind") == "mixture"):
            raise ValueError("a mixture's record names one index per source; a single index's record names one")

    @classmethod
    def of(
        cls,
        step: int,
        index: Any,
        layout: Any,
        plan: Plan,
        *,
        framework: str = "",
        samples_in_step: int = 0,
        names: Any = None,
        extra: dict | None = None,
        instance_filter: Any = None,
    ) -> DataRecord:
        """The record of ``plan`` over ``layout`` of ``index`` (for a mixture: lists of indexes and layouts, one per
        source) at ``step``, read through ``instance_filter`` (a :class:`~detsampler.filter.RepetitionFilter`, or
        None)."""
        many = isinstance(index, (list, tuple))
        return cls(
            step=int(step),
            fingerprint=DataFingerprint.of(index, layout, plan, instance_filter),
            indexes=tuple(index_location(i) for i in (index if many else [index])),
            world_size=plan.world_size,
            micro_batch_size=plan.micro_batch_size,
            samples_in_step=int(samples_in_step),
            names=tuple(names) if names is not None else None,
            framework=framework,
            extra=dict(extra or {}),
        )

    # -- what a checkpoint holds

    def to_dict(self) -> dict:
        """The JSON form (what a checkpoint saves)."""
        return {
            "format": RECORD_FORMAT,
            "version": RECORD_VERSION,
            "framework": self.framework,
            "step": self.step,
            "samples_in_step": self.samples_in_step,
            "data_fingerprint": self.fingerprint.to_dict(),
            "indexes": list(self.indexes),
            "names": list(self.names) if self.names is not None else None,
            "world_size": self.world_size,
            "micro_batch_size": self.micro_batch_size,
            "extra": _jsonable(self.extra),
        }

    @classmethod
    def from_dict(cls, saved: Any) -> DataRecord:
        """The record saved by :meth:`to_dict`, checked (format, version, fingerprint hash)."""
        if not isinstance(saved, dict) or saved.get("format") != RECORD_FORMAT:
            got = saved.get("format") if isinstance(saved, dict) else type(saved).__name__
            raise ValueError(f"not a detsampler data record (format {got!r}, expected {RECORD_FORMAT!r})")
        if saved.get("version") != RECORD_VERSION:
            raise ValueError(
                f"data record version {saved.get('version')!r}: this detsampler reads version {RECORD_VERSION}"
            )
        return cls(
            step=saved["step"],
            fingerprint=DataFingerprint.from_dict(saved["data_fingerprint"]),
            indexes=tuple(saved["indexes"]),
            world_size=saved["world_size"],
            micro_batch_size=saved["micro_batch_size"],
            samples_in_step=saved.get("samples_in_step", 0),
            names=saved.get("names"),
            framework=saved.get("framework", ""),
            extra=saved.get("extra") or {},
        )

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str | bytes) -> DataRecord:
        return cls.from_dict(json.loads(text))

    def save(self, directory: str | Path) -> Path:
        """Write the record to ``directory/detsampler_data.json`` atomically; returns the file."""
        path = Path(directory) / RECORD_FILE
        atomic_write(path, self.to_json())
        return path

    @classmethod
    def load(cls, path: str | Path) -> DataRecord:
        """The record in ``path`` (a ``detsampler_data.json`` or a directory holding one)."""
        path = Path(path)
        path = path / RECORD_FILE if path.is_dir() else path
        try:
            return cls.from_json(path.read_text())
        except OSError as exc:
            raise ValueError(f"no detsampler data record at {str(path)!r}: {exc.strerror or exc}") from None

    # -- what a record rebuilds

    @property
    def is_mixture(self) -> bool:
        return "mixture" in self.fingerprint.layout

    def instance_filter(self) -> Any:
        """The :class:`~detsampler.filter.RepetitionFilter` the run read through, or None."""
        described = self.fingerprint.instance_filter
        return None if described is None else RepetitionFilter.from_description(described)

    def layout_configs(self) -> list[LayoutConfig]:
        """The layout config of each index (one per mixture source)."""
        described = self.fingerprint.layout["mixture"] if self.is_mixture else [self.fingerprint.layout]
        names = LayoutConfig.__dataclass_fields__
        return [LayoutConfig(**{k: v for k, v in d.items() if k in names}) for d in described]

    def plan(
        self,
        num_samples: int | None = None,
        source: Any = None,
        *,
        world_size: int | None = None,
        micro_batch_size: int | None = None,
        layout: Any = None,
    ) -> Plan:
        """The recorded plan over ``num_samples`` (a single index's layout) or ``source`` (the rebuilt mixture), cut
        for ``world_size`` x ``micro_batch_size`` (the record's by default); a balanced plan's costs come from
        ``layout`` (a mixture's: from ``source``, built over its layouts). Raises ValueError naming what differs
        unless its fingerprint is the recorded one."""
        recorded = self.fingerprint.plan
        schedule = [tuple(row) for row in recorded["batch_size_schedule"]]
        plan = Plan(
            num_samples,
            source=source,
            seed=recorded["seed"],
            global_batch_size=schedule[-1][1],
            micro_batch_size=micro_batch_size or self.micro_batch_size,
            world_size=world_size or self.world_size,
            batch_size_schedule=schedule if len(schedule) > 1 else None,
            skip_steps=[tuple(r) for r in recorded.get("skip_steps", [])] or None,
            mapping_version=recorded["mapping_version"],
            redactions=recorded.get("redactions") or None,
            epoch_ids=bool(recorded["stream"].get("epoch_ids", False)),
            balance=_balance(recorded, layout if layout is not None else source),
        )
        rebuilt = _jsonable(plan.fingerprint())
        if rebuilt != recorded:
            changes = fingerprint_changes(
                {"index": "-", "layout": {}, "plan": recorded}, {"index": "-", "layout": {}, "plan": rebuilt}
            )
            raise ValueError(f"the data the record names no longer gives its plan: {'; '.join(changes)}")
        return plan

    def check_resume(self, current: DataFingerprint | dict, resume_step: int | None = None) -> None:
        """Raise ValueError (the library's :func:`~detsampler.resume.check_resume` message) unless a run with
        fingerprint ``current`` resuming at ``resume_step`` (the record's step by default) reads what this run read."""
        check_resume(self.fingerprint, current, self.step if resume_step is None else resume_step)


def _balance(recorded: dict, layout: Any) -> Balance | None:
    """The recorded plan's balance over ``layout`` (None when it has none)."""
    if "balance" not in recorded:
        return None
    if layout is None:
        raise ValueError("the record's plan is balanced: its costs need the layout (DataRecord.plan(..., layout=))")
    return Balance(layout, CostModel(**recorded["balance"]["cost"]))
