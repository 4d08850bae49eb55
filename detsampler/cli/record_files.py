"""Finding the data record a checkpoint saved, in each trainer's own form (the ``--checkpoint PATH`` of ``show``,
``verify`` and ``stats``).

PATH is one of: a directory holding ``detsampler_data.json`` (a :class:`~detsampler.record.DataRecord`: the trainer's
``step_NNNNNNNN`` checkpoints, a Hugging Face ``checkpoint-N``); a run directory (its newest ``step_NNNNNNNN``
checkpoint, under ``checkpoints/`` or itself, that holds a record and its ``COMPLETE`` marker; else its newest
``checkpoint-N`` holding a record: a Hugging Face ``output_dir``); a Lightning ``.ckpt`` file (the entry whose dict
holds ``"data_record"``); a torchtitan DCP checkpoint directory (``.metadata``; the ``"data_record"`` of its
``"dataloader"`` state). torch is imported only for the last two.

Invariant: a record is returned only as :func:`~detsampler.record.read_record` checked it against its checkpoint (its
seal; the step the checkpoint states: a trainer's or Hugging Face directory name, ``COMPLETE`` and
``trainer_state.json``, a Lightning state's ``step`` and ``global_step`` (an int or a 0-d integer tensor; a state
that states neither is refused: Lightning writes both), a DCP ``dataloader.step`` and torchtitan's
``train_state.step``; the sha256 ``COMPLETE`` or ``trainer_state.json`` records of its file); anything else is one
ValueError naming the path and what was expected.
"""

from __future__ import annotations

import json
import re
import sys
import warnings
from pathlib import Path
from typing import Any

from detsampler.cli.report import rel
from detsampler.record import RECORD_FILE, DataRecord, read_record

__all__ = ["find_record"]

_STEP_DIR = re.compile(r"^step_(\d{8,})$")
_HF_DIR = re.compile(r"^checkpoint-(\d+)$")
# the trainer's marker of a whole checkpoint (train.integrity.COMPLETE: the library never imports the trainer)
_COMPLETE = "COMPLETE"


def find_record(path: str | Path, option: str = "--checkpoint") -> tuple[DataRecord, str]:
    """The data record of the checkpoint at ``path`` and where it was read (a path, and how). A warning of the read (a
    record saved before seals) is one ``detsampler: warning: ...`` line on stderr. ``option``: the option that gave
    ``path``, which its refusals name (``--against`` was refused as ``--checkpoint``)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UserWarning)
        try:
            found = _find_record(Path(path))
        except ValueError as exc:
            text = str(exc)
            if option == "--checkpoint" or not text.startswith("--checkpoint"):
                raise
            raise ValueError(option + text[len("--checkpoint") :]) from None
    for warning in caught:
        print(f"detsampler: warning: {warning.message}", file=sys.stderr)
    return found


def _find_record(p: Path) -> tuple[DataRecord, str]:
    if not p.exists():
        raise ValueError(f"--checkpoint: no such file or directory: {str(p)!r}")
    if p.is_file():
        if p.name == RECORD_FILE:
            return DataRecord.load(p), rel(str(p))
        return _from_torch_file(p), f"{rel(str(p))} (torch checkpoint)"
    if (p / RECORD_FILE).is_file():
        return DataRecord.load(p), rel(str(p))
    if (p / "data_fingerprint.json").is_file():
        raise ValueError(
            f"--checkpoint {str(p)!r} is a trainer checkpoint written before detsampler saved its data record"
            f" ({RECORD_FILE}): audit it with the options of its run (--mapping-version {p} reads its mapping version)"
        )
    if (p / ".metadata").is_file():
        return _from_dcp(p), f"{rel(str(p))} (DCP checkpoint, 'dataloader' state)"
    latest = _latest_step_dir(p)
    if latest is not None:
        which = "newest complete checkpoint" if _STEP_DIR.match(latest.name) else "newest checkpoint"
        return DataRecord.load(latest), f"{rel(str(latest))} (the {which} of {rel(str(p))})"
    raise ValueError(
        f"--checkpoint {str(p)!r} holds no detsampler data record: expected a directory with {RECORD_FILE} (a"
        " trainer's step_NNNNNNNN, a Hugging Face checkpoint-N), a run directory with complete step_NNNNNNNN"
        " checkpoints, a Lightning .ckpt file or a torchtitan DCP checkpoint directory (.metadata); checkpoints"
        " written before detsampler saved its record hold none"
    )


def _latest_step_dir(root: Path) -> Path | None:
    """The newest checkpoint of a run directory: a ``step_NNNNNNNN`` directory under ``root/checkpoints`` (else
    ``root``) holding a record and ``COMPLETE`` (the trainer's), else a ``checkpoint-N`` directory of ``root`` holding a
    record (a Hugging Face ``output_dir``)."""
    for base in (root / "checkpoints", root):
        if not base.is_dir():
            continue
        found = [
            (int(m.group(1)), d)
            for d in base.iterdir()
            if (m := _STEP_DIR.match(d.name)) and (d / RECORD_FILE).is_file() and (d / _COMPLETE).is_file()
        ]
        if found:
            return max(found)[1]
    found = [
        (int(m.group(1)), d) for d in root.iterdir() if (m := _HF_DIR.match(d.name)) and (d / RECORD_FILE).is_file()
    ]
    return max(found)[1] if found else None


def _holders_of_record(value: Any, path: tuple[str, ...] = ()) -> list[tuple[dict, tuple[str, ...]]]:
    """Every dict in the nested dicts (and lists) of ``value`` that holds ``"data_record"``, with its keys, in order."""
    if len(path) > 6:
        return []
    if isinstance(value, dict):
        if "data_record" in value:
            return [(value, path)]
        items = [(str(k), v) for k, v in value.items()]
    elif isinstance(value, (list, tuple)):
        items = [(str(i), v) for i, v in enumerate(value)]
    else:
        return []
    return [found for key, item in items for found in _holders_of_record(item, (*path, key))]


def _holder_of_record(value: Any, where: Path) -> tuple[dict, tuple[str, ...]] | None:
    """The one entry of ``value`` holding ``"data_record"`` (several holding one equal record are one), or None.

    NOTE: the first one found was taken: a callback holding another run's record before the datamodule's was audited
    as that run."""
    found = _holders_of_record(value)
    records = {json.dumps(h["data_record"], sort_keys=True, default=str) for h, _ in found}
    if len(records) > 1:
        at = ", ".join(".".join(keys) or "top level" for _, keys in found)
        raise ValueError(
            f"--checkpoint {str(where)!r} holds {len(found)} different data records (at {at}): which one is the run's"
            " is not known; keep the DetsamplerDataModule entry's"
        )
    return found[0] if found else None


def _step_of(value: Any, what: str, where: str) -> int:
    """A step (or count) a torch checkpoint states: an int, or a 0-d integer tensor read as its integer; any other
    value is refused (a tensor step was ignored, so any record passed beside it)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if type(value).__name__ == "Tensor" and getattr(value, "ndim", None) == 0:
        import torch

        if not value.is_floating_point() and not value.is_complex() and value.dtype != torch.bool:
            return int(value.item())
    raise ValueError(f"{where}: {what} is {value!r}, not a step (an integer, or a 0-d integer tensor)")


def _state_binding(holder: dict, prefix: str, where: str) -> tuple[dict[str, int], tuple[str, int] | None]:
    """The step (and samples into it) an integration's state states beside its record (``{"step": s, ...}``)."""
    steps = {f"{prefix}step": _step_of(holder["step"], "step", where)} if "step" in holder else {}
    samples = holder.get("samples_in_step")
    if "samples_in_step" in holder:
        return steps, (f"{prefix}samples_in_step", _step_of(samples, "samples_in_step", where))
    return steps, None


def _as_record(saved: Any, where: str, steps: dict[str, int], samples: tuple[str, int] | None) -> DataRecord:
    if isinstance(saved, (str, bytes, dict)):
        return read_record(saved, where, steps=steps, samples_in_step=samples)
    raise ValueError(f"{where}: 'data_record' is a {type(saved).__name__}, expected a DataRecord's JSON or dict")


def _from_torch_file(path: Path) -> DataRecord:
    """A Lightning ``.ckpt`` (any ``torch.save`` file): the datamodule entry holding ``"data_record"``, bound to its
    ``"step"`` and to Lightning's ``global_step``."""
    import torch

    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # a file torch cannot read: a pickle of other objects, not a checkpoint at all
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        first = first.split(". ")[0]  # NOTE: torch's advice to load it with weights_only=False is not ours to give
        raise ValueError(f"--checkpoint {str(path)!r} is not a checkpoint torch.load reads: {first}") from None
    found = _holder_of_record(saved, path)
    if found is None:
        keys = sorted(map(str, saved)) if isinstance(saved, dict) else type(saved).__name__
        raise ValueError(
            f"--checkpoint {str(path)!r} holds no 'data_record' (top-level keys {keys}); a Lightning checkpoint holds"
            " one in its DetsamplerDataModule entry"
        )
    holder, keys = found
    where = f"{path} ({'.'.join(keys) or 'top level'})"
    steps, samples = _state_binding(holder, "", where)
    if isinstance(saved, dict) and "global_step" in saved:  # Lightning's own step, beside the datamodule's state
        steps["global_step"] = _step_of(saved["global_step"], "global_step", where)
    if not steps:
        # NOTE: a hand-made state with neither was read bound to nothing; Lightning writes both in every checkpoint
        raise ValueError(
            f"{where}: the checkpoint states no step (no 'step' beside its data record, no 'global_step'; a checkpoint"
            " Lightning saves holds both), so nothing shows the record is the one it saved"
        )
    return _as_record(holder["data_record"], where, steps, samples)


def _from_dcp(path: Path) -> DataRecord:
    """A DCP checkpoint directory: read only the ``dataloader`` state's ``data_record`` and the steps beside it (its
    ``step`` and ``samples_in_step``, torchtitan's ``train_state.step``), with no process group."""
    import torch.distributed.checkpoint as dcp

    keys = list(dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata)
    wanted = [k for k in keys if k.endswith("data_record")]
    wanted.sort(key=lambda k: (k != "dataloader.data_record", not k.startswith("dataloader"), k))
    if not wanted:
        raise ValueError(
            f"--checkpoint {str(path)!r} is a DCP checkpoint without a 'dataloader.data_record' (its keys include"
            f" {sorted(keys)[:8]}); a torchtitan run saves one with the DetsamplerDataLoader"
        )
    key = wanted[0]
    prefix = key[: -len("data_record")]
    beside = [k for k in (f"{prefix}step", f"{prefix}samples_in_step", "train_state.step") if k in keys]
    values = _dcp_values(path, [key, *beside])
    steps = {k: v for k, v in values.items() if k != key and k.endswith(".step") and isinstance(v, int)}
    samples = values.get(f"{prefix}samples_in_step")
    samples_in_step = (f"{prefix}samples_in_step", samples) if isinstance(samples, int) else None
    return _as_record(values[key], f"{path} ({key})", steps, samples_in_step)


def _dcp_values(path: Path, keys: list[str]) -> dict[str, Any]:
    """The non-tensor entries ``keys`` (dotted) of a DCP checkpoint, read without a process group."""
    import torch.distributed.checkpoint as dcp

    state: dict[str, Any] = {}
    for key in keys:
        node = state
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = ""
    with warnings.catch_warnings():  # "torch.distributed is disabled ...": no process group is the intent here
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(state, checkpoint_id=str(path), no_dist=True)
    values = {}
    for key in keys:
        node = state
        for part in key.split("."):
            node = node[part]
        values[key] = node
    return values
