"""The run directory: one trainer at a time, ranks that die with their launcher, and which checkpoint a run resumes
from.

- :class:`RunLock`: rank 0 holds an exclusive ``flock`` on ``RUN_DIR/.lock`` and on the checkpoint directory's
  ``.lock`` (what is written: a second trainer whose ``checkpoint.dir`` is the first one's checkpoints is refused too)
  for the whole run; a second trainer on the same directory is refused before it touches anything. The kernel drops the
  lock when the process dies, however it dies.
- :func:`train.guard.exit_with_launcher`: ranks end when their launcher (torchrun) dies.
- :func:`choose_checkpoint`: the checkpoint of ``--resume``, verified against its ``COMPLETE`` record; with ``auto``, a
  checkpoint that fails is passed over for the next older one; ``--resume PATH`` of an older checkpoint passes over the
  newer ones. Nothing is moved until the resume is accepted (the data fingerprint matches, the checkpoint loads): then
  :func:`settle` moves the passed-over checkpoints aside (never deleting them; so that a later ``auto`` cannot jump
  back onto them), as it does a ``step_N`` directory without ``COMPLETE``, saying so in one line each.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch.distributed as dist

from train import checkpoint as ckpt
from train.integrity import read_complete

__all__ = ["ResumeChoice", "RunDirLocked", "RunLock", "choose_checkpoint", "move_aside", "settle"]

LOCK_FILE = ".lock"


class RunDirLocked(ValueError):
    """Another trainer holds the run directory."""


class RunLock:
    """Exclusive, non-blocking ``flock`` on ``DIR/.lock`` for each directory; released by
    :meth:`release` or by death."""

    def __init__(self, directories: list[Path]) -> None:
        self._fds: list[int] = []
        for directory in dict.fromkeys(Path(d).resolve() for d in directories):
            directory.mkdir(parents=True, exist_ok=True)
            fd = os.open(directory / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "another process"
                os.close(fd)
                self.release()
                raise RunDirLocked(
                    f"{directory} is in use by another trainer ({holder}); wait for it to finish, or use another"
                    " --run-dir (checkpoint.dir)"
                ) from None
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()} on {os.uname().nodename}\n".encode(), 0)
            self._fds.append(fd)

    def release(self) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds.clear()


def move_aside(checkpoints: list[Path], root: Path, why: str) -> Path | None:
    """Move ``checkpoints`` into ``root/<why>-<UTC time>/`` (a name no checkpoint search looks into). Returns it."""
    if not checkpoints:
        return None
    target = root / f"{why}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{os.getpid()}"
    target.mkdir(parents=True, exist_ok=True)
    for path in checkpoints:
        os.rename(path, target / path.name)
    return target


def _is_rank0() -> bool:
    return not dist.is_initialized() or dist.get_rank() == 0


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


@dataclass
class ResumeChoice:
    """The checkpoint a run resumes from (None: a fresh start) and what :func:`settle` does to the checkpoint directory
    once the resume is accepted (the data fingerprint matches, the checkpoint loads): ``aside`` are ``(checkpoints,
    why, line)`` moves, ``line`` saying in one line where they went (the text ``{target}`` in it is replaced by the
    directory they were moved to)."""

    path: Path | None
    aside: list[tuple[list[Path], str, str]] = field(default_factory=list)


def choose_checkpoint(resume: str, ckpt_dir: Path) -> ResumeChoice:
    """The verified checkpoint to resume from, or None for a fresh start (collective: every rank calls it); nothing in
    ``ckpt_dir`` changes here, so that a resume refused later (other data, another model) leaves the run as it was.

    ``resume``: ``none`` (refused when ``ckpt_dir`` holds checkpoints), ``auto`` (the newest that verifies; those that
    do not are to be moved aside, one line each; refused when some exist and none verifies: then they are moved aside
    at once, so that ``--resume none`` can start over) or a checkpoint directory (refused unless it verifies; the newer
    checkpoints of ``ckpt_dir`` are to be moved aside). A ``step_N`` directory without ``COMPLETE`` (a partial copy) is
    to be moved aside in every case.
    """
    aside = [
        (
            [p],
            "rejected",
            f"checkpoint {p} has no {ckpt.COMPLETE} marker (a partial copy, or a save that did not finish); moved aside"
            " to {target}",
        )
        for p in ckpt.incomplete_checkpoints(ckpt_dir)
    ]
    if resume == "none":
        if ckpt.complete_checkpoints(ckpt_dir):
            raise ValueError(
                f"--resume none but {ckpt_dir} already holds checkpoints; use --resume auto or a new --run-dir"
            )
        return ResumeChoice(None, aside)
    if resume == "auto":
        return _newest_verified(ckpt_dir, aside)
    path = Path(resume)
    if not (path / ckpt.COMPLETE).is_file():
        raise ValueError(f"--resume {resume!r}: not a complete checkpoint directory (no {ckpt.COMPLETE} marker)")
    problem = ckpt.verify(path)
    if problem is not None:
        raise ckpt.CheckpointCorrupt(f"--resume {resume!r}: the checkpoint fails verification: {problem}")
    step = read_complete(path)["step"]
    newer = [
        c
        for c in ckpt.complete_checkpoints(ckpt_dir)
        if ckpt.checkpoint_step(c) > step and c.resolve() != path.resolve()
    ]
    if newer:
        names = ", ".join(c.name for c in newer)
        aside.append(
            (
                newer,
                "abandoned",
                f"rewinding to step {step}: moved the newer checkpoints {names} aside to {{target}} (not deleted)",
            )
        )
    return ResumeChoice(path, aside)


def settle(choice: ResumeChoice, ckpt_dir: Path, say: Callable[[str], None]) -> None:
    """Once the resume of ``choice`` is accepted, before anything is trained or written (collective): rank 0 removes
    the temporary directories of interrupted saves and makes the moves of ``choice.aside``, one line each."""
    if _is_rank0():
        for p in ckpt.remove_incomplete(ckpt_dir):
            say(f"removed incomplete checkpoint {p}")
        for paths, why, line in choice.aside:
            say(line.replace("{target}", str(move_aside(paths, ckpt_dir, why))))
    _barrier()


def _newest_verified(ckpt_dir: Path, aside: list[tuple[list[Path], str, str]]) -> ResumeChoice:
    candidates = ckpt.complete_checkpoints(ckpt_dir)[::-1]
    rejected: list[str] = []
    for i, path in enumerate(candidates):
        problem = ckpt.verify(path)
        if problem is None:
            return ResumeChoice(path, aside)
        rejected.append(f"{path.name}: {problem}")
        nxt = f"falling back to {candidates[i + 1].name}" if i + 1 < len(candidates) else "no older checkpoint left"
        line = f"checkpoint {path} fails verification ({problem}); moved aside to {{target}}; {nxt}"
        aside.append(([path], "rejected", line))
    if rejected:  # the refusal's advice (--resume none) needs them out of the way: the one move before acceptance
        if _is_rank0():
            move_aside(candidates, ckpt_dir, "rejected")
        _barrier()
        raise ckpt.CheckpointCorrupt(
            f"no checkpoint under {ckpt_dir} verifies ({'; '.join(rejected)}); they were moved aside, not deleted: "
            "start over with --resume none, or resume one explicitly with --resume PATH"
        )
    return ResumeChoice(None, aside)
