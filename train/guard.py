"""Ranks that end with their launcher: under torchrun, a rank whose torchrun is killed exits instead of training on, or
waiting in a rendezvous, forever. Imports nothing slow, so that ``train.train`` arms it before importing torch."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

__all__ = ["exit_with_launcher"]


def exit_with_launcher(poll_s: float = 0.5) -> threading.Thread | None:
    """Under torchrun (``$TORCHELASTIC_RUN_ID``), end this rank when its parent, the launcher, is gone.

    Two mechanisms: on Linux the kernel sends SIGKILL at the parent's death (``PR_SET_PDEATHSIG``; torchrun starts its
    ranks from its main thread), which works even while the rank is blocked in C++ holding the GIL (a rendezvous); and a
    daemon thread polls the parent elsewhere, taking the rank's process group (its DataLoader workers) with it. Returns
    the thread, or None outside torchrun.
    """
    if "TORCHELASTIC_RUN_ID" not in os.environ:
        return None
    parent = os.getppid()
    _set_parent_death_signal()
    if os.getppid() != parent or parent == 1:  # the launcher died before the signal was armed (we were reparented)
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        print(
            f"rank {os.environ.get('RANK', '?')}: the launcher (pid {parent}) is gone; exiting",
            file=sys.stderr,
            flush=True,
        )
        if (
            os.getpgid(0) == os.getpid()
        ):  # our own process group (torchrun starts each rank in one): take its workers too
            os.killpg(os.getpid(), signal.SIGKILL)
        os._exit(1)

    thread = threading.Thread(target=watch, name="launcher-watchdog", daemon=True)
    thread.start()
    return thread


def _set_parent_death_signal() -> None:
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    pr_set_pdeathsig = 1
    try:
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):  # no prctl: the polling thread remains
        pass
