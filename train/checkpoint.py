"""Checkpoints with ``torch.distributed.checkpoint``: atomic directories, the last K kept, resume by step number.

Layout of a checkpoint root::

    ROOT/step_00000008/      a complete checkpoint: DCP files, .metadata, data_fingerprint.json, detsampler_data.json,
                             COMPLETE
    ROOT/.tmp-step_00000010/ one being written (or left by a killed run): never read, removed at the next start

Every rank writes its shards into the temporary directory with ``dcp.save`` and hashes them; then rank 0 writes the
human-readable ``data_fingerprint.json``, the library's data record ``detsampler_data.json`` (what
``detsampler show --checkpoint`` reads) and the ``COMPLETE`` marker (the sha256 of every file, :mod:`train.integrity`)
and
renames the directory into place. A directory named ``step_N`` that holds ``COMPLETE`` is therefore whole; before a load
every file is checked against ``COMPLETE`` (:func:`verify`; which checkpoint a run resumes from: :mod:`train.rundir`).

Content: ``model`` and ``optim`` (sharded, from ``get_state_dict``; DCP reshards them when the number of ranks changes),
``scheduler`` (the LR scheduler's state as JSON) and ``meta`` = ``{"step": s, "data": fingerprint JSON}``. DCP keeps the
non-tensor values of rank 0 only; step and fingerprint are the same on every rank, so that loses nothing. ``step`` is
the next step to train: the batch sampler restarts there, and there is no other data-loader state.

Tests kill the training processes at named points: with ``DETSAMPLER_TEST_KILL_POINT=during_save:8`` (the shards of
step 8 written by every rank, its DCP ``.metadata`` not yet) or ``after_save:8`` (after the rename), rank 0 prints
``DETSAMPLER_KILL_POINT <point>`` and sleeps so that the test can SIGKILL the process group at that moment;
``before_step:S`` does the same when step S's data has been loaded, before it is trained, and ``before_init:0`` before
rank 0 joins the process group, so that the other ranks wait in the rendezvous (train.train).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from detsampler.atomic import atomic_write, fsync_dir
from detsampler.record import RECORD_FILE, DataRecord
from detsampler.resume import DataFingerprint, check_resume, fingerprint_changes
from train.integrity import (
    COMPLETE,
    CheckpointCorrupt,
    checkpoint_files,
    file_digests,
    verify_checkpoint,
    write_complete,
)

__all__ = [
    "COMPLETE",
    "CheckpointCorrupt",
    "CheckpointLoadError",
    "DataFingerprintError",
    "checkpoint_step",
    "complete_checkpoints",
    "data_fingerprint",
    "fingerprint_changes",
    "incomplete_checkpoints",
    "kill_point",
    "latest_checkpoint",
    "load_checkpoint",
    "read_meta",
    "read_record",
    "remove_incomplete",
    "save_checkpoint",
    "saved_mapping_version",
    "verify",
]

FINGERPRINT_FILE = "data_fingerprint.json"
KILL_POINT_ENV = "DETSAMPLER_TEST_KILL_POINT"
_NAME = re.compile(r"^step_(\d{8,})$")


class DataFingerprintError(ValueError):
    """The checkpoint was trained on another data stream than the configuration describes."""


class CheckpointLoadError(ValueError):
    """A verified checkpoint does not load (e.g. the model configuration changed)."""


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", "0"))


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def kill_point(name: str, step: int) -> None:
    """On rank 0, when ``$DETSAMPLER_TEST_KILL_POINT == f"{name}:{step}"``: print a marker line and sleep (for a test's
    kill)."""
    if os.environ.get(KILL_POINT_ENV) == f"{name}:{step}" and _rank() == 0:
        print(f"DETSAMPLER_KILL_POINT {name}:{step}", flush=True)
        sys.stdout.flush()
        time.sleep(3600)


# -- the data fingerprint
# ----------------------------------------------------------------------------------------------------


def data_fingerprint(index_fingerprint: str, layout: dict, plan: dict) -> dict:
    """The saved form of :class:`detsampler.resume.DataFingerprint` (what fixes the data stream of every step)."""
    return DataFingerprint(index_fingerprint, layout, plan).to_dict()


def saved_mapping_version(saved: dict) -> int:
    """The mapping version a checkpoint's data fingerprint records (its plan's), which a resume must keep."""
    version = saved.get("plan", {}).get("mapping_version") if isinstance(saved, dict) else None
    if isinstance(version, bool) or not isinstance(version, int):
        raise DataFingerprintError(
            f"the checkpoint's data fingerprint records no mapping version (plan: {saved.get('plan')!r})"
        )
    return version


def check_fingerprint(path: Path, saved: dict, current: dict, plan: Any = None, resume_step: int | None = None) -> None:
    """Raise DataFingerprintError naming what changed unless resuming ``current`` at ``resume_step`` continues
    ``saved``.

    The library's :func:`detsampler.resume.check_resume` decides: the index and the layout must be the same; the plan
    may change only in its future (mixture schedule entries or skip ranges at or after the resume step). Without
    ``resume_step`` the two fingerprints must hash the same. ``plan`` is accepted for compatibility and unused.
    """
    if saved.get("hash") == current.get("hash") and resume_step is None:
        return
    try:
        saved_fp, current_fp = DataFingerprint.from_dict(saved), DataFingerprint.from_dict(current)
        if resume_step is None:
            if saved_fp.hash != current_fp.hash:
                raise ValueError("differs")
            return
        check_resume(saved_fp, current_fp, resume_step)
        return
    except ValueError as exc:
        same_source = all(saved.get(k) == current.get(k) for k in ("index", "layout"))
        if same_source and resume_step is not None and str(exc) != "differs":
            raise DataFingerprintError(
                f"checkpoint {path} (step {resume_step}): {exc}. Pass --allow-data-change to resume anyway, or start a"
                " new run."
            ) from None
    changes = fingerprint_changes(saved, current) or ["(fingerprint hash differs)"]
    raise DataFingerprintError(
        f"checkpoint {path} was trained on a different data stream than this configuration: "
        + "; ".join(changes)
        + ". Resuming would not continue the same data; pass --allow-data-change to resume anyway, or start a new run."
    )


# -- finding checkpoints
# -----------------------------------------------------------------------------------------------------


def checkpoint_step(path: str | Path) -> int:
    match = _NAME.match(Path(path).name)
    if not match:
        raise ValueError(f"checkpoint directory must be named step_NNNNNNNN, got {Path(path).name!r}")
    return int(match.group(1))


def complete_checkpoints(root: str | Path) -> list[Path]:
    """Complete checkpoint directories under ``root``, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if _NAME.match(p.name) and (p / COMPLETE).is_file()]
    return sorted(found, key=checkpoint_step)


def latest_checkpoint(root: str | Path) -> Path | None:
    """The complete checkpoint with the highest step, or None."""
    found = complete_checkpoints(root)
    return found[-1] if found else None


def incomplete_checkpoints(root: str | Path) -> list[Path]:
    """``step_N`` directories under ``root`` without ``COMPLETE`` (a partial copy: a save renames its directory into
    place only once complete), oldest first; the trainer moves them aside (:mod:`train.rundir`), never deletes them."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if _NAME.match(p.name) and p.is_dir() and not (p / COMPLETE).is_file()]
    return sorted(found, key=checkpoint_step)


def remove_incomplete(root: str | Path) -> list[Path]:
    """Delete the temporary directories (``.tmp-step_N``) left by interrupted saves (rank 0, before training). Returns
    what was removed."""
    root = Path(root)
    removed = []
    if root.is_dir():
        for p in sorted(root.iterdir()):
            if p.name.startswith(".tmp-step_"):
                shutil.rmtree(p, ignore_errors=True)
                removed.append(p)
    return removed


def _first_line(exc: BaseException) -> str:
    """``Type: first line`` of ``exc``; for DCP's CheckpointException (a BaseException wrapping each rank's error with
    its traceback), of the lowest failing rank's error."""
    failures = getattr(exc, "failures", None)
    if isinstance(exc, CheckpointException) and isinstance(failures, dict) and failures:
        inner = failures[min(failures)]  # (exception, its stack) in torch 2.x
        exc = inner[0] if isinstance(inner, tuple) and inner and isinstance(inner[0], BaseException) else inner
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def read_meta(path: str | Path) -> dict:
    """``{"step": s, "data": fingerprint}`` of a checkpoint, read from its DCP ``meta`` entry (verify it first)."""
    state: dict[str, Any] = {"meta": {"step": -1, "data": ""}}
    try:
        dcp.load(state, checkpoint_id=str(path))
    except (Exception, CheckpointException) as exc:  # CheckpointException is a BaseException
        raise CheckpointLoadError(f"checkpoint {path} cannot be read: {_first_line(exc)}") from None
    return {"step": int(state["meta"]["step"]), "data": json.loads(state["meta"]["data"])}


def read_record(path: str | Path, meta: dict) -> DataRecord | None:
    """The data record of the verified checkpoint ``path`` whose DCP meta is ``meta`` (:func:`read_meta`), read as
    every reader reads it (:meth:`DataRecord.load`: its seal, the sha256 and step ``COMPLETE`` records, the step of the
    directory's name) and bound to the meta too: its step and data fingerprint must be the meta's. None for a checkpoint
    saved before records; a ValueError naming the file otherwise (the trainer resumes from the meta, so a record that
    disagrees with it would make every later audit of this checkpoint show other data)."""
    path = Path(path)
    if not (path / RECORD_FILE).is_file():
        return None
    record = DataRecord.load(path, steps={"its DCP meta": int(meta["step"])})
    saved = meta["data"].get("hash") if isinstance(meta.get("data"), dict) else None
    if record.fingerprint.hash != saved:
        raise DataFingerprintError(
            f"{path / RECORD_FILE}: the record's data fingerprint {record.fingerprint.hash} is not the checkpoint's"
            f" {saved} (its DCP meta): it is not the record this checkpoint saved"
        )
    return record


# -- save and load
# -----------------------------------------------------------------------------------------------------------


class _Writer(dcp.FileSystemWriter):
    """A FileSystemWriter with the ``during_save`` kill point: on the coordinator (rank 0), after every rank has written
    its shards and before the checkpoint's ``.metadata`` is written."""

    def __init__(self, path: str, step: int) -> None:
        super().__init__(path)
        self._step = step

    def finish(self, metadata: Any, results: Any) -> None:
        kill_point("during_save", self._step)
        super().finish(metadata, results)


def save_checkpoint(
    root: str | Path,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    fingerprint: dict,
    keep: int,
    extra: dict | None = None,
    record: DataRecord | None = None,
) -> Path:
    """Save a checkpoint of the state before ``step`` (collective: every rank calls it). Returns the final directory.

    ``record`` (rank 0's is written): the library's :class:`~detsampler.record.DataRecord` of the data, saved as
    ``detsampler_data.json`` beside ``data_fingerprint.json`` and covered by ``COMPLETE``'s digests, so that
    ``detsampler show|verify|stats --checkpoint DIR`` audits the checkpoint without re-typed options."""
    root = Path(root)
    final = root / f"step_{step:08d}"
    tmp = root / f".tmp-step_{step:08d}"
    if _rank() == 0:
        root.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
    _barrier()
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {
        "model": model_sd,
        "optim": optim_sd,
        "scheduler": json.dumps(scheduler.state_dict()),
        "meta": {"step": int(step), "data": json.dumps(fingerprint, sort_keys=True)},
    }
    dcp.save(state, storage_writer=_Writer(str(tmp), step))
    if _rank() == 0:
        info = {"step": int(step), "data_fingerprint": fingerprint, **(extra or {})}
        atomic_write(tmp / FINGERPRINT_FILE, json.dumps(info, indent=2, sort_keys=True) + "\n")
        if record is not None:
            record.save(tmp)
    digests = _hash_shards(tmp)
    if _rank() == 0:
        rest = sorted(set(checkpoint_files(tmp)) - set(digests))  # .metadata, data_fingerprint.json, the record
        write_complete(tmp, step, {**digests, **file_digests(tmp, rest)})
        fsync_dir(tmp)
        if final.exists():  # a checkpoint of this step from an earlier, resumed attempt
            shutil.rmtree(final)
        os.rename(tmp, final)
        fsync_dir(root)
        for old in complete_checkpoints(root)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    _barrier()
    kill_point("after_save", step)
    return final


def _hash_shards(tmp: Path) -> dict[str, dict[str, Any]]:
    """The digests of every rank's DCP shard files (``__R_*.distcp``, R the writing rank), each rank hashing its own."""
    mine = sorted(p.name for p in tmp.glob(f"__{_rank()}_*"))
    parts: list[Any] = [None] * (dist.get_world_size() if dist.is_initialized() else 1)
    local = file_digests(tmp, mine)
    if dist.is_initialized():
        dist.all_gather_object(parts, local)
    else:
        parts = [local]
    return {k: v for part in parts for k, v in part.items()}


def verify(path: Path) -> str | None:
    """None when checkpoint ``path`` matches its ``COMPLETE`` record, else the first problem (collective: the ranks
    split the files, and all return the same answer)."""
    world = dist.get_world_size() if dist.is_initialized() else 1
    try:
        verify_checkpoint(path, _rank(), world)
        problem = None
    except CheckpointCorrupt as exc:
        problem = str(exc)
    problems: list[Any] = [problem] * world
    if dist.is_initialized():
        dist.all_gather_object(problems, problem)
    return next((p for p in problems if p is not None), None)


def load_checkpoint(path: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any) -> dict:
    """Load model, optimizer and scheduler state from checkpoint ``path`` in place (collective). Returns its meta."""
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state: dict[str, Any] = {"model": model_sd, "optim": optim_sd, "scheduler": "", "meta": {"step": -1, "data": ""}}
    try:
        dcp.load(state, checkpoint_id=str(path))
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        scheduler.load_state_dict(json.loads(state["scheduler"]))
    except (Exception, CheckpointException) as exc:  # CheckpointException is a BaseException
        raise CheckpointLoadError(f"checkpoint {path} does not load into this model: {_first_line(exc)}") from None
    return {"step": int(state["meta"]["step"]), "data": json.loads(state["meta"]["data"])}
