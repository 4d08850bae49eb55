"""Child process of benchmark 1 for the contenders that hold an epoch's permutation in memory (run one at a time).

Reads JSON on stdin and prints one JSON line:
- ``{"contender": "skip", "n": N, "batch": B, "marks": [k...], "budget": s}``: a plain shuffled DataLoader iterated from
  the start; the elapsed time when batch ``k`` arrives is what a trainer that resumes at step k by skipping k batches
  waits.
  Iteration stops at the time budget; the rate after the first batch is reported for extrapolation.
- ``{"contender": "torchdata", "n": N, "batch": B, "offset": o}``: a fresh ``StatefulDataLoader(shuffle=True)`` restored
  from a state_dict that says ``o`` samples of the current epoch were consumed; the time to its first batch.
- ``{"contender": "accelerate", "n": N, "batch": B, "offset": o}``: accelerate's ``skip_first_batches`` over a fresh
  ``DataLoader(shuffle=True)``, skipping the ``o // B`` batches of the current epoch; the time to its first batch.
"""

from __future__ import annotations

import json
import logging
import sys
import time
import warnings

import torch
from torch.utils.data import DataLoader, Dataset

from tests.benchmarks.common import peak_rss_bytes

__all__ = ["CheapDataset", "torchdata_state"]


class CheapDataset(Dataset):
    """A map-style dataset whose sample ``i`` is ``i``: the loader's own cost is all that is measured."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


def skip_run(n: int, batch: int, marks: list[int], budget: float) -> dict:
    marks_left = sorted(marks)
    seen: dict[str, float] = {}
    t0 = time.perf_counter()
    loader = DataLoader(CheapDataset(n), batch_size=batch, shuffle=True, generator=torch.Generator().manual_seed(0))
    first = None
    i = -1
    for i, _ in enumerate(loader):
        now = time.perf_counter() - t0
        if i == 0:
            first = now
        if marks_left and i == marks_left[0]:
            seen[str(marks_left.pop(0))] = now
        if now > budget or not marks_left:
            break
    elapsed = time.perf_counter() - t0
    rate = i / (elapsed - first) if i > 0 else None
    return {
        "first": first,
        "marks": seen,
        "batches": i + 1,
        "elapsed": elapsed,
        "rate": rate,
        "peak_rss": peak_rss_bytes(),
    }


def torchdata_state(n_template: int, batch: int, offset: int) -> dict:
    """A real StatefulDataLoader state_dict (after one batch, on a small dataset) with its counters set to ``offset``
    samples.

    Only the consumed counts change; the generator state is the one the loader saved (any generator state costs the
    same).
    """
    from torchdata.stateful_dataloader import StatefulDataLoader

    loader = StatefulDataLoader(
        CheapDataset(n_template), batch_size=batch, shuffle=True, generator=torch.Generator().manual_seed(0)
    )
    next(iter(loader))
    state = loader.state_dict()
    batches = offset // batch
    state["_num_yielded"] = batches
    state["_sampler_iter_yielded"] = batches
    state["_sampler_iter_state"]["samples_yielded"] = offset
    state["_sampler_iter_state"]["sampler_iter_state"]["yielded"] = offset
    return state


def torchdata_restore(n: int, batch: int, offset: int) -> dict:
    from torchdata.stateful_dataloader import StatefulDataLoader

    state = torchdata_state(1000, batch, offset)
    t0 = time.perf_counter()
    loader = StatefulDataLoader(
        CheapDataset(n), batch_size=batch, shuffle=True, generator=torch.Generator().manual_seed(0)
    )
    loader.load_state_dict(state)
    first = next(iter(loader))
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "first": first[:2].tolist(), "peak_rss": peak_rss_bytes()}


def accelerate_skip(n: int, batch: int, offset: int) -> dict:
    from accelerate import skip_first_batches

    t0 = time.perf_counter()
    loader = skip_first_batches(
        DataLoader(CheapDataset(n), batch_size=batch, shuffle=True), num_batches=offset // batch
    )
    next(iter(loader))
    return {"seconds": time.perf_counter() - t0, "peak_rss": peak_rss_bytes()}


def main() -> None:
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    args = json.loads(sys.stdin.read())
    if args["contender"] == "skip":
        out = skip_run(int(args["n"]), int(args["batch"]), [int(k) for k in args["marks"]], float(args["budget"]))
    elif args["contender"] == "torchdata":
        out = torchdata_restore(int(args["n"]), int(args["batch"]), int(args["offset"]))
    elif args["contender"] == "accelerate":
        out = accelerate_skip(int(args["n"]), int(args["batch"]), int(args["offset"]))
    else:
        raise ValueError(f"contender must be 'skip', 'torchdata' or 'accelerate', got {args['contender']!r}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
