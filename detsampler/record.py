"""What a checkpoint records of its data: a :class:`DataRecord`, the one format the trainer and every integration save
and ``detsampler show|verify|stats --checkpoint`` read.

A record holds the :class:`~detsampler.resume.DataFingerprint` (what fixes the data of every step), the step the
checkpoint resumes at, where each index opens again (``indexes``: one, or one per mixture source) and how the run was
cut (``world_size``, ``micro_batch_size``), which the fingerprint leaves out because a resume may change them.

A record is bound to the checkpoint that holds it and is never trusted as written (docs/design.md §9, "The checkpoint
data record"): it carries a seal (``record_sha256``, the sha256 of its canonical JSON without the seal), so a hand edit
is refused; and every reader goes through :func:`read_record`, which also checks it against what the checkpoint itself
states: its step (the trainer's ``step_N`` and ``COMPLETE``, Hugging Face's ``trainer_state.json`` ``global_step``, an
integration's state step) and, where the checkpoint has its own integrity record, the sha256 of the record's bytes
recorded there (the trainer's ``COMPLETE``; Hugging Face's ``trainer_state.json``, which names it under
``stateful_callbacks``), so that a record copied from another checkpoint or run is refused. A record saved before the
seal is read with one warning.

Invariants: ``DataRecord.from_dict(r.to_dict()) == r`` through JSON; :meth:`DataRecord.plan` rebuilds a plan whose
``fingerprint()`` equals the recorded one or raises (never a plan over other data); :func:`index_location` of an index
opened by :func:`detsampler.index.locations.open_location` of that location is the same location; :func:`read_record`
returns a record only when its seal, its step and the checkpoint's integrity record agree with it, else one ValueError
naming the file (or state entry), what it holds and what the checkpoint states.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import warnings
from collections.abc import Mapping
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

__all__ = [
    "HF_STATE_KEY",
    "RECORD_FILE",
    "RECORD_FORMAT",
    "RECORD_SEAL",
    "RECORD_VERSION",
    "DataRecord",
    "index_location",
    "read_record",
    "record_sha256",
]

RECORD_FILE = "detsampler_data.json"  # the name of a record saved in a checkpoint directory
RECORD_FORMAT = "detsampler-data-record"
RECORD_VERSION = 1  # NOTE: the seal is a field version 1 readers ignore; records without it are version 1 too
RECORD_SEAL = "record_sha256"
# the entry of trainer_state.json's stateful_callbacks naming the record's sha256 (detsampler.integrations.hf writes it)
HF_STATE_KEY = "DetsamplerDataRecord"
# what a checkpoint directory states of itself: the trainer's (train.checkpoint, train.integrity: the library never
# imports the trainer) and Hugging Face's
_TRAINER_DIR = re.compile(r"^step_(\d{8,})$")
_HF_DIR = re.compile(r"^checkpoint-(\d+)$")
_COMPLETE = "COMPLETE"
_TRAINER_STATE = "trainer_state.json"
_SMALL_FILE_BYTES = 64 << 20  # the files of a checkpoint an audit hashes besides the record (not DCP's shards)


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


def _seal(saved: Mapping) -> str:
    """The sha256 of ``saved``'s canonical JSON (sorted keys, no spaces) without the seal itself."""
    body = {k: v for k, v in saved.items() if k != RECORD_SEAL}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def record_sha256(data: str | bytes) -> str:
    """The sha256 of a saved record's bytes (what a checkpoint's integrity record names)."""
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


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
        """The JSON form (what a checkpoint saves), sealed: ``record_sha256`` is the sha256 of the rest."""
        body = {
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
        return {**body, RECORD_SEAL: _seal(body)}

    @classmethod
    def from_dict(cls, saved: Any) -> DataRecord:
        """The record saved by :meth:`to_dict`, checked (format, version, its seal when it has one, fingerprint hash).
        A reader of a checkpoint calls :func:`read_record`, which also binds it to the checkpoint."""
        if not isinstance(saved, dict) or saved.get("format") != RECORD_FORMAT:
            got = saved.get("format") if isinstance(saved, dict) else type(saved).__name__
            raise ValueError(f"not a detsampler data record (format {got!r}, expected {RECORD_FORMAT!r})")
        if saved.get("version") != RECORD_VERSION:
            raise ValueError(
                f"data record version {saved.get('version')!r}: this detsampler reads version {RECORD_VERSION}"
            )
        if RECORD_SEAL in saved and saved[RECORD_SEAL] != _seal(saved):
            raise ValueError(
                f"the data record fails its seal ({RECORD_SEAL}): it was edited after it was saved (it records step"
                f" {saved.get('step')!r}, world_size {saved.get('world_size')!r}, micro_batch_size"
                f" {saved.get('micro_batch_size')!r}); a checkpoint's record is read only as written"
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
    def load(cls, path: str | Path, *, steps: Mapping[str, int] | None = None) -> DataRecord:
        """The record in ``path`` (a ``detsampler_data.json`` or a directory holding one), bound to its directory
        (:func:`read_record`): to the step its name (``step_N``, ``checkpoint-N``), ``COMPLETE`` or
        ``trainer_state.json`` states, and to the sha256 those record; ``steps``: more steps the checkpoint states
        (``{what: step}``)."""
        path = Path(path)
        path = path / RECORD_FILE if path.is_dir() else path
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise ValueError(f"no detsampler data record at {str(path)!r}: {exc.strerror or exc}") from None
        # NOTE: the directory's own name states its step: `.` (or a bare file name) from inside it names none
        stated, covered_by = _directory_binding(Path(os.path.abspath(path)).parent, str(path))
        return read_record(data, str(path), steps={**stated, **(steps or {})}, covered_by=covered_by)

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


# -- reading a record from its checkpoint: the one check every reader goes through
# --------------------------------------------------------------------------------


def read_record(
    saved: str | bytes | Mapping | DataRecord,
    where: str,
    *,
    steps: Mapping[str, int] | None = None,
    samples_in_step: tuple[str, int] | None = None,
    covered_by: tuple[str, str | None] | None = None,
) -> DataRecord:
    """The record ``saved`` (its JSON text or bytes, its dict, or a record already read) from ``where`` (the file or
    state entry every message names), bound to its checkpoint:

    - its seal must hold (a hand edit is refused); a record without one (saved before seals) is read with a warning,
      unless ``covered_by`` vouches for its bytes;
    - ``steps`` (``{what states it: step}``, e.g. ``{"COMPLETE": 15}``): each step the checkpoint states must be the
      record's; ``samples_in_step`` (``(what, n)``) likewise;
    - ``covered_by`` (``(who, sha256)``): the checkpoint's own integrity record ``who`` names the sha256 of the
      record's bytes, which must match; ``(who, None)``: ``who`` names none (a checkpoint saved before it did), then a
      sealed record is refused (it was not saved with this checkpoint).
    """
    if isinstance(saved, DataRecord):
        record = saved
    else:
        record = _parse(saved, where, covered_by)
    for what, step in (steps or {}).items():
        if int(step) != record.step:
            raise ValueError(
                f"{where}: the record's step {record.step} is not this checkpoint's step {step} ({what}): it is not the"
                " record this checkpoint saved (edited, or copied from another checkpoint)"
            )
    if samples_in_step is not None and int(samples_in_step[1]) != record.samples_in_step:
        what, samples = samples_in_step
        raise ValueError(
            f"{where}: the record's samples_in_step {record.samples_in_step} is not this checkpoint's {samples}"
            f" ({what}): it is not the record this checkpoint saved"
        )
    return record


def _parse(saved: str | bytes | Mapping, where: str, covered_by: tuple[str, str | None] | None) -> DataRecord:
    """``saved`` checked against ``covered_by``, parsed and checked by :meth:`DataRecord.from_dict`."""
    vouched = False
    if covered_by is not None and covered_by[1] is not None:
        if not isinstance(saved, (str, bytes)):
            raise TypeError(f"{where}: covered_by checks the bytes of a saved record, got a {type(saved).__name__}")
        if record_sha256(saved) != covered_by[1]:
            raise ValueError(
                f"{where}: its sha256 is not the one {covered_by[0]} records: the record was edited or replaced after"
                " the checkpoint was saved"
            )
        vouched = True
    if isinstance(saved, (str, bytes)):
        try:
            saved = json.loads(saved)
        except json.JSONDecodeError as exc:
            raise ValueError(
                f"{where}: not valid JSON ({exc.msg}: line {exc.lineno} column {exc.colno}): the file is truncated or"
                " damaged"
            ) from None
        except UnicodeDecodeError as exc:
            raise ValueError(f"{where}: not a detsampler data record: not UTF-8 text ({exc.reason})") from None
    try:
        record = DataRecord.from_dict(saved)
    except (ValueError, KeyError, TypeError) as exc:
        why = f"the field {exc} is missing" if isinstance(exc, KeyError) else str(exc)
        raise ValueError(f"{where}: {why}") from None
    sealed = RECORD_SEAL in saved
    if covered_by is not None and covered_by[1] is None and sealed:
        raise ValueError(
            f"{where}: {covered_by[0]} names no sha256 of the record, which is sealed: it was not saved with this"
            " checkpoint (copied in from another)"
        )
    if not sealed and not vouched:
        warnings.warn(
            f"{where}: the data record carries no seal ({RECORD_SEAL}; saved by a detsampler before records were"
            " sealed): read as written, its content unchecked",
            stacklevel=3,
        )
    return record


def _directory_binding(directory: Path, where: str) -> tuple[dict[str, int], tuple[str, str | None] | None]:
    """What checkpoint ``directory`` states of the record in it: ``({what: step}, covered_by)`` (:func:`read_record`).
    The trainer's ``step_N`` states its step in its name and in ``COMPLETE``, which holds the sha256 of every file (the
    record among them); a Hugging Face ``checkpoint-N`` in its name and ``trainer_state.json``'s ``global_step``, where
    the integration names the record's sha256 too (a ``checkpoint-N`` without ``trainer_state.json`` is refused: a
    Trainer always writes it)."""
    steps: dict[str, int] = {}
    for pattern in (_TRAINER_DIR, _HF_DIR):
        if match := pattern.match(directory.name):
            steps[f"its directory name {directory.name}"] = int(match.group(1))
    covered_by: tuple[str, str | None] | None = None
    if (directory / _COMPLETE).is_file():
        complete = _json_file(directory / _COMPLETE)
        entry = complete.get("files", {}).get(RECORD_FILE) if isinstance(complete.get("files"), dict) else None
        if not isinstance(complete.get("step"), int) or not isinstance(entry, dict) or "sha256" not in entry:
            raise ValueError(
                f"{where}: the checkpoint's {_COMPLETE} does not cover it (the trainer hashes every file it saves): it"
                " was added after the checkpoint was saved, or the marker is damaged"
            )
        steps[_COMPLETE] = complete["step"]
        covered_by = (_COMPLETE, str(entry["sha256"]))
        _check_small_files(directory, complete["files"], where)
    elif _TRAINER_DIR.match(directory.name) and (directory / "data_fingerprint.json").is_file():
        raise ValueError(
            f"{where}: its trainer checkpoint has no {_COMPLETE} marker (a partial copy, or a save that did not"
            " finish), so nothing shows the record is the one it saved"
        )
    if _HF_DIR.match(directory.name) and not (directory / _TRAINER_STATE).is_file():
        # NOTE: checked against its name alone, another run's record of the same step copied in passed
        raise ValueError(
            f"{where}: its Hugging Face checkpoint has no {_TRAINER_STATE} (a Trainer writes it in every"
            " checkpoint-N, naming the record's sha256), so nothing shows the record is the one this checkpoint saved"
        )
    if (directory / _TRAINER_STATE).is_file():
        state = _json_file(directory / _TRAINER_STATE)
        if isinstance(state.get("global_step"), int):
            steps[f"{_TRAINER_STATE} global_step"] = state["global_step"]
        named = _entry(state, "stateful_callbacks", HF_STATE_KEY, "args", "sha256")
        covered_by = (_TRAINER_STATE, named if isinstance(named, str) and named else None)
    return steps, covered_by


def _check_small_files(directory: Path, files: dict, where: str) -> None:
    """The files ``COMPLETE`` lists beside the record, but DCP's shards (``*.distcp``, the bulk of a checkpoint: hashed
    only by the trainer's full check before a resume), must be the ones it records: DCP's ``.metadata`` names a save id
    of its own, so a record copied in together with another checkpoint's ``COMPLETE`` is refused."""
    for name, want in sorted(files.items()):
        if name == RECORD_FILE or name.endswith(".distcp") or not isinstance(want, dict):
            continue
        path = directory / name
        if not path.is_file() or path.stat().st_size > _SMALL_FILE_BYTES:
            continue  # missing, or too large to hash for an audit: the trainer's full check names it
        if record_sha256(path.read_bytes()) != want.get("sha256"):
            raise ValueError(
                f"{where}: the checkpoint's {name} is not the one its {_COMPLETE} records (sha256 differs): the record"
                f" and {_COMPLETE} are another checkpoint's"
            )


def _entry(value: Any, *keys: str) -> Any:
    """``value[k1][k2]...``, or None where a level is missing or not a dict."""
    for key in keys:
        value = value.get(key) if isinstance(value, dict) else None
    return value


def _json_file(path: Path) -> dict:
    """The JSON object in ``path``; one ValueError naming the file otherwise."""
    try:
        saved = json.loads(path.read_bytes())
    except OSError as exc:
        raise ValueError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not valid JSON ({exc}): the file is truncated or damaged") from None
    if not isinstance(saved, dict):
        raise ValueError(f"{path}: holds a JSON {type(saved).__name__}, expected an object")
    return saved
