"""The ``COMPLETE`` marker of a checkpoint: the sha256 of every file the checkpoint holds, verified before a load.

``COMPLETE`` is JSON: ``{"step": s, "files": {name: {"size": bytes, "sha256": hex}}}`` over every other file of the
checkpoint directory (DCP shards ``__R_I.distcp``, DCP ``.metadata``, ``data_fingerprint.json``). It is written last,
after those files are fsynced; :func:`verify_checkpoint` recomputes every hash and names the first difference.

What the hashes protect: a checkpoint is loaded only when every file it had when it was written is present with the same
bytes, so a flipped byte, a truncated or deleted shard, a replaced ``.metadata`` or a file copied in from another
checkpoint is refused before DCP reads anything. DCP's ``.metadata`` is a pickle, and unpickling runs code: with the
hashes a ``.metadata`` is unpickled only when it is byte for byte the one this trainer wrote. They do not protect
against anyone who can write the directory and rewrite ``COMPLETE`` as well (the hashes are not signed): load
checkpoints only from directories you trust.

Cost: one read of the checkpoint at save (each rank hashes the shard files it wrote) and one at resume (the files split
over the ranks); sha256 ran at 0.38 GB/s on one core of the 2-core CI machine (in memory, while other tests ran), so a
rank hashes a 4 GB shard in about 10 s.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

__all__ = ["COMPLETE", "CheckpointCorrupt", "file_digests", "read_complete", "verify_checkpoint", "write_complete"]

COMPLETE = "COMPLETE"
_CHUNK = 8 << 20


class CheckpointCorrupt(ValueError):
    """A checkpoint's files differ from what its ``COMPLETE`` marker records (or it has no usable marker)."""


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def file_digests(directory: Path, names: list[str]) -> dict[str, dict[str, Any]]:
    """``{name: {"size", "sha256"}}`` of the files ``names`` of ``directory``."""
    return {n: {"size": (directory / n).stat().st_size, "sha256": sha256_file(directory / n)} for n in sorted(names)}


def checkpoint_files(directory: Path) -> list[str]:
    """The names of the files a checkpoint directory holds, ``COMPLETE`` left out."""
    return sorted(p.name for p in directory.iterdir() if p.is_file() and p.name != COMPLETE)


def write_complete(directory: Path, step: int, digests: dict[str, dict[str, Any]]) -> None:
    """Write ``COMPLETE`` (fsynced) recording ``digests``, which must cover every file of ``directory``."""
    missing = sorted(set(checkpoint_files(directory)) - set(digests))
    if missing:
        raise RuntimeError(f"checkpoint {directory}: files {missing} were not hashed")
    with open(directory / COMPLETE, "w") as f:
        f.write(json.dumps({"step": int(step), "files": digests}, indent=1, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_complete(directory: Path) -> dict:
    """The parsed ``COMPLETE`` of ``directory``; CheckpointCorrupt when it is missing, unreadable or
    has no file hashes."""
    try:
        text = (directory / COMPLETE).read_text()
    except OSError as exc:
        raise CheckpointCorrupt(f"its {COMPLETE} marker cannot be read ({exc.strerror or exc})") from None
    try:
        record = json.loads(text)
    except json.JSONDecodeError:
        record = None
    if (
        not isinstance(record, dict)
        or not isinstance(record.get("files"), dict)
        or not isinstance(record.get("step"), int)
    ):
        raise CheckpointCorrupt(
            f"its {COMPLETE} marker records no file hashes (written by an older trainer, or damaged)"
        )
    return record


def verify_files(directory: Path, record: dict, names: list[str]) -> str | None:
    """The first problem among ``names`` of ``record["files"]`` (a missing file, another size or sha256), or None."""
    for name in names:
        want = record["files"][name]
        path = directory / name
        if not path.is_file():
            return f"{name} is missing"
        size = path.stat().st_size
        if size != want.get("size"):
            return f"{name} has {size} bytes, {want.get('size')} were written"
        if sha256_file(path) != want.get("sha256"):
            return f"{name} has other bytes than were written (sha256 differs)"
    return None


def verify_checkpoint(directory: Path, part: int = 0, parts: int = 1) -> None:
    """Raise CheckpointCorrupt naming the first difference between ``directory`` and its ``COMPLETE`` record.

    Files are checked ``part`` of ``parts`` at a time (``sorted(files)[part::parts]``), so that ranks can split the
    work;
    every call checks that the marker is readable and that no recorded file is missing.
    """
    record = read_complete(directory)
    names = sorted(record["files"])
    for name in names:
        if not (directory / name).is_file():
            raise CheckpointCorrupt(f"{name} is missing")
    if ".metadata" not in record["files"]:
        raise CheckpointCorrupt("its COMPLETE marker does not record DCP's .metadata")
    problem = verify_files(directory, record, names[part::parts])
    if problem is not None:
        raise CheckpointCorrupt(problem)
