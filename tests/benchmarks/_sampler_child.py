"""Child process of benchmark 2: build one sampler for one N, take its first index, report time and peak RSS as JSON.

Reads ``{"contender": "detsampler" | "distributed", "n": N, "world_size": W}`` on stdin. Everything both contenders
import is imported before the baseline is taken, so the reported growth is the sampler's own: on Linux the kernel's
peak-RSS mark is reset (``/proc/self/clear_refs``) just before the sampler is built, and growth is the peak reached
while building it and taking its first index minus the resident size at the reset. Where that reset is unavailable, the
process's peak since start (``ru_maxrss``) is used instead, which hides growth smaller than the import-time peak.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np
import torch
from torch.utils.data import DistributedSampler

from detsampler import Plan
from detsampler.loader.sampler import DeterministicBatchSampler
from tests.benchmarks.common import peak_rss_bytes

MICRO_BATCH = 8


class _Sized:
    """A dataset of which DistributedSampler needs only the length."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n


def first_index(contender: str, n: int, world_size: int) -> int:
    if contender == "detsampler":
        plan = Plan(
            n, seed=0, global_batch_size=MICRO_BATCH * world_size, micro_batch_size=MICRO_BATCH, world_size=world_size
        )
        return next(iter(DeterministicBatchSampler(plan, rank=0)))[0]
    if contender == "distributed":
        sampler = DistributedSampler(_Sized(n), num_replicas=world_size, rank=0, shuffle=True, seed=0)
        return next(iter(sampler))
    raise ValueError(f"contender must be 'detsampler' or 'distributed', got {contender!r}")


def _status_bytes(field: str) -> int | None:
    """A ``VmRSS`` / ``VmHWM`` line of /proc/self/status, in bytes (None where there is no such file)."""
    try:
        for line in open("/proc/self/status"):
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _reset_peak() -> bool:
    """Reset the kernel's peak-RSS mark of this process (Linux >= 4.0); False where that is not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return _status_bytes("VmHWM") is not None
    except OSError:
        return False


def main() -> None:
    args = json.loads(sys.stdin.read())
    np.arange(10).sum(), torch.zeros(1)  # warm what both contenders touch
    reset = _reset_peak()
    baseline = _status_bytes("VmRSS") if reset else peak_rss_bytes()
    t0 = time.perf_counter()
    index = first_index(args["contender"], int(args["n"]), int(args["world_size"]))
    seconds = time.perf_counter() - t0
    peak = _status_bytes("VmHWM") if reset else peak_rss_bytes()
    print(
        json.dumps(
            {
                "seconds": seconds,
                "peak_rss": peak_rss_bytes(),
                "baseline_rss": baseline,
                "growth": max(peak - baseline, 0),
                "index": int(index),
                "peak_reset": reset,
            }
        )
    )


if __name__ == "__main__":
    main()
