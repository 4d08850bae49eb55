"""Launching training runs as real processes (torchrun or one process), streaming their output, and killing them.

Used by ``train.demo`` and the trainer tests. A kill is real: when the run prints the marker line of a kill point (see
:func:`train.checkpoint.kill_point`), every process of the run (torchrun, its workers, which torchrun starts in sessions
of their own, and their DataLoader workers) gets SIGKILL at once.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["RunResult", "kill_tree", "process_tree", "run_training", "train_command"]

KILL_MARKER = "DETSAMPLER_KILL_POINT"


def train_command(nproc: int, args: Sequence[str], torchrun: bool = True) -> list[str]:
    """The command that runs ``python -m train.train ARGS`` on ``nproc`` local ranks (``torchrun=False``: one plain
    process)."""
    if not torchrun:
        if nproc != 1:
            raise ValueError(f"without torchrun only nproc=1 is possible, got nproc={nproc}")
        return [sys.executable, "-m", "train.train", *args]
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(nproc),
        "-m",
        "train.train",
        *args,
    ]


def process_tree(pid: int) -> list[int]:
    """``pid`` and all its descendants (from /proc), parents first."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop(0)
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def kill_tree(pid: int) -> list[int]:
    """SIGKILL ``pid`` and every descendant; returns the pids signalled."""
    pids = process_tree(pid)
    for p in pids:  # stop them all first so that nobody reacts to a peer's death
        try:
            os.kill(p, signal.SIGSTOP)
        except ProcessLookupError:
            pass
    pids = sorted(set(pids) | set(process_tree(pid)))
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return pids


@dataclass
class RunResult:
    returncode: int
    output: str
    killed_at: str | None  # the kill point's marker, when the run was killed there
    seconds: float


def run_training(
    cmd: Sequence[str],
    *,
    env: dict[str, str] | None = None,
    kill_point: str | None = None,
    cwd: str | Path | None = None,
    echo: Callable[[str], None] | None = None,
    timeout: float = 600.0,
) -> RunResult:
    """Run ``cmd``, stream its merged output to ``echo``; with ``kill_point`` (e.g. ``"after_save:4"``), SIGKILL the
    whole run as soon as it prints that kill point's marker. A run that does not end within ``timeout`` seconds is
    killed and reported with returncode -9 and no kill point."""
    full_env = dict(os.environ if env is None else env)
    full_env.pop("DETSAMPLER_TEST_KILL_POINT", None)
    if kill_point is not None:
        full_env["DETSAMPLER_TEST_KILL_POINT"] = kill_point
    root = str(Path(__file__).resolve().parent.parent)
    full_env["PYTHONPATH"] = root + (os.pathsep + full_env["PYTHONPATH"] if full_env.get("PYTHONPATH") else "")
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    t0 = time.monotonic()
    proc = subprocess.Popen(
        list(cmd),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=full_env,
        cwd=cwd,
        start_new_session=True,
        bufsize=1,
    )
    lines: list[str] = []
    killed_at = None
    timer = threading.Timer(timeout, kill_tree, args=(proc.pid,))
    timer.daemon = True
    timer.start()
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            lines.append(line)
            if echo is not None:
                echo(line.rstrip("\n"))
            if kill_point is not None and line.strip() == f"{KILL_MARKER} {kill_point}":
                kill_tree(proc.pid)
                killed_at = kill_point
                break
        proc.wait()
    finally:
        timer.cancel()
        if proc.poll() is None:
            kill_tree(proc.pid)
            proc.wait()
    return RunResult(proc.returncode, "".join(lines), killed_at, time.monotonic() - t0)
