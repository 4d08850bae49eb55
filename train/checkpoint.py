"""Checkpoints with ``torch.distributed.checkpoint``: atomic directories, the last K kept, resume by step number.

Layout of a checkpoint root::

    ROOT/step_00000008/      a complete checkpoint: DCP files, .metadata, data_fingerprint.json, COMPLETE
    ROOT/.tmp-step_00000010/ one being written (or left by a killed run): never read, removed at the next start

Every rank writes its shards into the temporary directory with ``dcp.save``; then rank 0 writes the human-readable
``data_fingerprint.json`` and the ``COMPLETE`` marker and renames the directory into place. A directory named ``step_N``
that holds ``COMPLETE`` is therefore whole; the newest complete checkpoint is the one with the highest N.

Content: ``model`` and ``optim`` (sharded, from ``get_state_dict``; DCP reshards them when the number of ranks changes),
``scheduler`` (the LR scheduler's state as JSON) and ``meta`` = ``{"step": s, "data": fingerprint JSON}``. DCP keeps the
non-tensor values of rank 0 only; step and fingerprint are the same on every rank, so that loses nothing. ``step`` is the
next step to train: the batch sampler restarts there, and there is no other data-loader state.

Tests kill the training processes at named points: with ``DETSAMPLER_TEST_KILL_POINT=during_save:8`` (the shards of
step 8 written by every rank, its DCP ``.metadata`` not yet) or ``after_save:8`` (after the rename), rank 0 prints
``DETSAMPLER_KILL_POINT <point>`` and sleeps so that the test can SIGKILL the process group at that moment;
``before_step:S`` does the same when step S's data has been loaded, before it is trained (train.train).
"""

from __future__ import annotations

import hashlib
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
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from detsampler.atomic import atomic_write, fsync_dir

__all__ = [
    "COMPLETE",
    "DataFingerprintError",
    "checkpoint_step",
    "complete_checkpoints",
    "data_fingerprint",
    "fingerprint_changes",
    "kill_point",
    "latest_checkpoint",
    "load_checkpoint",
    "read_meta",
    "remove_incomplete",
    "save_checkpoint",
]

COMPLETE = "COMPLETE"
FINGERPRINT_FILE = "data_fingerprint.json"
KILL_POINT_ENV = "DETSAMPLER_TEST_KILL_POINT"
_NAME = re.compile(r"^step_(\d{8,})$")


class DataFingerprintError(ValueError):
    """The checkpoint was trained on another data stream than the configuration describes."""


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def kill_point(name: str, step: int) -> None:
    """On rank 0, when ``$DETSAMPLER_TEST_KILL_POINT == f"{name}:{step}"``: print a marker line and sleep (for a test's kill)."""
    if os.environ.get(KILL_POINT_ENV) == f"{name}:{step}" and _rank() == 0:
        print(f"DETSAMPLER_KILL_POINT {name}:{step}", flush=True)
        sys.stdout.flush()
        time.sleep(3600)


# -- the data fingerprint ----------------------------------------------------------------------------------------------------


def data_fingerprint(index_fingerprint: str, layout: dict, plan: dict) -> dict:
    """What fixes the data stream of every step, with its hash under ``"hash"``.

    ``layout`` is the layout's ``describe()`` (kind, seq_len, seed, window_docs and corpus counts), ``plan`` is
    ``Plan.fingerprint()`` (mapping version, stream, seed, batch schedule). Neither holds the number of ranks, the micro
    batch size or the number of workers, which may change on resume.
    """
    body = {"index": index_fingerprint, "layout": layout, "plan": plan}
    text = json.dumps(body, sort_keys=True, default=str)
    return {**json.loads(text), "hash": hashlib.sha256(text.encode()).hexdigest()[:16]}


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: value}


def fingerprint_changes(saved: dict, current: dict) -> list[str]:
    """Human-readable differences ``key: saved -> current`` between two fingerprints (``hash`` left out)."""
    a = {k: v for k, v in _flatten(saved).items() if k != "hash"}
    b = {k: v for k, v in _flatten(current).items() if k != "hash"}
    return [f"{k}: {a.get(k, '<absent>')!r} -> {b.get(k, '<absent>')!r}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


def check_fingerprint(path: Path, saved: dict, current: dict, plan: Any = None, resume_step: int | None = None) -> None:
    """Raise DataFingerprintError naming what changed unless the two fingerprints hash the same.

    With ``plan`` (the resuming run's Plan) and ``resume_step``, a changed plan is accepted when only its future changed:
    mixture schedule entries or skip ranges at or after the resume step (:func:`detsampler.resume.check_resume`); the index
    and layout must still be the same.
    """
    if saved.get("hash") == current.get("hash"):
        return
    if plan is not None and resume_step is not None and all(saved.get(k) == current.get(k) for k in ("index", "layout")):
        from detsampler.resume import check_resume

        try:
            check_resume(saved["plan"], plan, resume_step)
            return
        except ValueError as exc:
            raise DataFingerprintError(
                f"checkpoint {path} (step {resume_step}): {exc}. Pass --allow-data-change to resume anyway, or start a new run."
            ) from None
    changes = fingerprint_changes(saved, current) or ["(fingerprint hash differs)"]
    raise DataFingerprintError(
        f"checkpoint {path} was trained on a different data stream than this configuration: "
        + "; ".join(changes)
        + ". Resuming would not continue the same data; pass --allow-data-change to resume anyway, or start a new run."
    )


# -- finding checkpoints -----------------------------------------------------------------------------------------------------


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
    found = [p for p in root.iterdir() if _NAME.match(p.name) and (p / COMPLETE).is_file() and (p / ".metadata").is_file()]
    return sorted(found, key=checkpoint_step)


def latest_checkpoint(root: str | Path) -> Path | None:
    """The complete checkpoint with the highest step, or None."""
    found = complete_checkpoints(root)
    return found[-1] if found else None


def remove_incomplete(root: str | Path) -> list[Path]:
    """Delete temporary directories left by interrupted saves (rank 0, before training). Returns what was removed."""
    root = Path(root)
    removed = []
    if root.is_dir():
        for p in root.iterdir():
            if p.name.startswith(".tmp-step_") or (_NAME.match(p.name) and not (p / COMPLETE).is_file()):
                shutil.rmtree(p, ignore_errors=True)
                removed.append(p)
    return removed


def read_meta(path: str | Path) -> dict:
    """``{"step": s, "data": fingerprint}`` of a checkpoint, read from its DCP ``meta`` entry."""
    state: dict[str, Any] = {"meta": {"step": -1, "data": ""}}
    dcp.load(state, checkpoint_id=str(path))
    return {"step": int(state["meta"]["step"]), "data": json.loads(state["meta"]["data"])}


# -- save and load -----------------------------------------------------------------------------------------------------------


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
) -> Path:
    """Save a checkpoint of the state before ``step`` (collective: every rank calls it). Returns the final directory."""
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
        atomic_write(tmp / COMPLETE, f"{step}\n")
        if final.exists():  # a checkpoint of this step from an earlier, resumed attempt
            shutil.rmtree(final)
        os.rename(tmp, final)
        fsync_dir(root)
        for old in complete_checkpoints(root)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    _barrier()
    kill_point("after_save", step)
    return final


def load_checkpoint(path: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any) -> dict:
    """Load model, optimizer and scheduler state from checkpoint ``path`` in place (collective). Returns its meta."""
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state: dict[str, Any] = {"model": model_sd, "optim": optim_sd, "scheduler": "", "meta": {"step": -1, "data": ""}}
    dcp.load(state, checkpoint_id=str(path))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    scheduler.load_state_dict(json.loads(state["scheduler"]))
    return {"step": int(state["meta"]["step"]), "data": json.loads(state["meta"]["data"])}
