"""Child process of benchmark 2: build one sampler for one N, take its first index, report time and peak RSS as JSON.

Reads ``{"contender": "detsampler" | "distributed", "n": N, "world_size": W}`` on stdin. Everything both contenders import
is imported before the baseline is taken, so the reported growth is the sampler's own.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np
import torch
from torch.utils.data import DistributedSampler

from detsampler import Plan
from detsampler.sampler import DeterministicBatchSampler
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
        plan = Plan(n, seed=0, global_batch_size=MICRO_BATCH * world_size, micro_batch_size=MICRO_BATCH, world_size=world_size)
        return next(iter(DeterministicBatchSampler(plan, rank=0)))[0]
    if contender == "distributed":
        sampler = DistributedSampler(_Sized(n), num_replicas=world_size, rank=0, shuffle=True, seed=0)
        return next(iter(sampler))
    raise ValueError(f"contender must be 'detsampler' or 'distributed', got {contender!r}")


def main() -> None:
    args = json.loads(sys.stdin.read())
    np.arange(10).sum(), torch.zeros(1)  # warm what both contenders touch
    baseline = peak_rss_bytes()
    t0 = time.perf_counter()
    index = first_index(args["contender"], int(args["n"]), int(args["world_size"]))
    seconds = time.perf_counter() - t0
    peak = peak_rss_bytes()
    print(json.dumps({"seconds": seconds, "peak_rss": peak, "baseline_rss": baseline, "growth": peak - baseline, "index": int(index)}))


if __name__ == "__main__":
    main()
