"""Benchmark 1: time to the first batch after resuming at step k, with 1e8 samples per epoch and 8 samples a batch.

Every contender builds its loader afresh (as a restarted job does), over the same cheap map-style dataset (sample i is
i),
with ``num_workers=0``, one rank; the clock runs from building the loader to holding the first batch of step k.
- detsampler: ``DataLoader(batch_sampler=DeterministicBatchSampler(plan, rank=0, start_step=k))``, median of interleaved
  repeats.
- plain DataLoader(shuffle=True) that skips k batches (what a trainer without loader state does): one pass from the
start
  in a fresh process, read at batch k; where k is past the time budget the time is extrapolated from the measured rate
  (one epoch start, i.e. one ``randperm(N).tolist()``, per 1e8 samples, plus k batches at the measured rate).
- torchdata ``StatefulDataLoader(shuffle=True)`` restored from its ``state_dict``: the state dict is a real one whose
  consumed-sample counters are set to step k. Restoring re-runs ``randperm(N).tolist()`` and then calls ``next()`` once
  per consumed sample of the epoch. It is run for real at the largest in-epoch offset in a fresh process; the other
  steps are modelled from that run and a per-sample skip cost measured at N = 1e6 (labelled).
- Hugging Face ``datasets`` ``IterableDataset`` restored from its ``state_dict`` (the path torchtitan uses): a
  generator-backed dataset of 64 shards (1,562,500 examples each), fed to a DataLoader. Its state is (shard, example in
  shard, epoch); restoring skips whole shards without reading them, then regenerates and drops the examples before the
  offset within the shard. It keeps no global shuffle. Real restores at every k. torchtitan's
  ``HuggingFaceTextDataLoader`` restores exactly this state plus its token buffers (docs/comparison.md [TT2]).
- Grain ``MapDataset.range(N).shuffle(seed).repeat().batch(8)`` through ``to_iter_dataset(ReadOptions(num_threads=0))``
  (no read-ahead: the quickest to a first batch), its iterator's ``set_state({"next_index": k})``: O(1) random access,
  real restores at every k.
- accelerate ``skip_first_batches(DataLoader(shuffle=True), num_batches)``, skipping the in-epoch batches before k: run
  for real in a fresh process at the epoch start (steps 0 and 1e9) and at step 1e6; step 1e3 is modelled from those two
  runs (labelled). It skips batches of sample ids without reading samples, after the epoch's ``randperm(N).tolist()``.
Megatron's and OLMo-core's resume (a stored index read at the consumed-sample offset) are measured in benchmark 7, at
the sizes where their index builds fit. Step 1e9 is 8e9 samples: epoch 80, offset 0 within the epoch (1e9 is a multiple
of 1e8), which the state-dict contenders hold as "epoch start".
"""

from __future__ import annotations

import copy
import logging
import statistics
import time
import warnings

from torch.utils.data import DataLoader

from detsampler import Plan
from detsampler.loader.sampler import DeterministicBatchSampler
from tests.benchmarks._resume_child import CheapDataset
from tests.benchmarks.common import BenchResult, Table, Verdict, fmt_seconds, ratio_column, run_child

__all__ = ["main"]

N = 10**8
BATCH = 8
STEPS = (0, 10**3, 10**6, 10**9)
SKIP_BUDGET = 55.0  # seconds for the skipping contender's one pass (its epoch start alone takes ~10-25 s at N = 1e8)
DET_REPEATS = 41
HF_SHARDS = 64
HF_REPEATS = 3
TARGET_RATIO = 1.2


def _label(step: int) -> str:
    return "0" if step == 0 else f"1e{len(str(step)) - 1}" if str(step).strip("0") == "1" else f"{step:,}"


def _offset(step: int) -> tuple[int, int]:
    """(epoch, samples consumed within the epoch) before ``step``."""
    return divmod(step * BATCH, N)


# -- detsampler
# ------------------------------------------------------------------------------------------------------------


def _detsampler_first_batch(plan: Plan, dataset: CheapDataset, step: int) -> float:
    t0 = time.perf_counter()
    loader = DataLoader(dataset, batch_sampler=DeterministicBatchSampler(plan, rank=0, start_step=step), num_workers=0)
    next(iter(loader))
    return time.perf_counter() - t0


def detsampler_times() -> dict[int, float]:
    plan = Plan(N, seed=0, global_batch_size=BATCH, micro_batch_size=BATCH)
    dataset = CheapDataset(N)
    times: dict[int, list[float]] = {k: [] for k in STEPS}
    for k in STEPS:  # warm-up
        _detsampler_first_batch(plan, dataset, k)
    for _ in range(DET_REPEATS):
        for k in STEPS:
            times[k].append(_detsampler_first_batch(plan, dataset, k))
    return {k: statistics.median(v) for k, v in times.items()}


# -- Hugging Face datasets
# -------------------------------------------------------------------------------------------------


def _hf_examples(shards: list[int], shard_size: int):
    for s in shards:
        base = s * shard_size
        for i in range(shard_size):
            yield {"x": base + i}


def _hf_dataset():
    from datasets import IterableDataset

    return IterableDataset.from_generator(
        _hf_examples, gen_kwargs={"shards": list(range(HF_SHARDS)), "shard_size": N // HF_SHARDS}
    )


def _hf_state(step: int) -> dict:
    """A real IterableDataset state_dict (after one batch) with its position set to step ``step``."""
    ds = _hf_dataset()
    next(iter(DataLoader(ds, batch_size=BATCH)))
    state = copy.deepcopy(ds.state_dict())
    epoch, offset = _offset(step)
    shard_size = N // HF_SHARDS
    state["epoch"] = epoch
    state["examples_iterable"]["shard_idx"], state["examples_iterable"]["shard_example_idx"] = divmod(
        offset, shard_size
    )
    return state


def _hf_first_batch(state: dict) -> tuple[float, int]:
    t0 = time.perf_counter()
    ds = _hf_dataset()
    ds.load_state_dict(copy.deepcopy(state))
    batch = next(iter(DataLoader(ds, batch_size=BATCH)))
    return time.perf_counter() - t0, int(batch["x"][0])


def hf_times() -> tuple[dict[int, float], dict[int, int]]:
    logging.getLogger("datasets").setLevel(logging.ERROR)
    states = {k: _hf_state(k) for k in STEPS}
    times: dict[int, list[float]] = {k: [] for k in STEPS}
    first: dict[int, int] = {}
    for _ in range(HF_REPEATS):
        for k in STEPS:
            seconds, first[k] = _hf_first_batch(states[k])
            times[k].append(seconds)
    return {k: statistics.median(v) for k, v in times.items()}, first


# -- torchdata
# -------------------------------------------------------------------------------------------------------------


def torchdata_skip_cost() -> float | None:
    """Seconds per consumed sample that a StatefulDataLoader restore replays, measured at N = 1e6 (offsets 0 and 1e6 -
    8)."""
    small = 10**6
    args = {"contender": "torchdata", "n": small, "batch": BATCH}
    at0 = [run_child("tests.benchmarks._resume_child", {**args, "offset": 0}, 120) for _ in range(3)]
    at_end = [run_child("tests.benchmarks._resume_child", {**args, "offset": small - BATCH}, 120) for _ in range(3)]
    if None in at0 or None in at_end:
        return None
    t0 = statistics.median(r["seconds"] for r in at0)
    t1 = statistics.median(r["seconds"] for r in at_end)
    return max(t1 - t0, 0.0) / (small - BATCH)


def torchdata_times(per_sample: float | None) -> tuple[dict[int, float | None], dict[int, str], dict | None]:
    """The real restore at the largest in-epoch offset and the others modelled from it; how each was got."""
    real_step = max(STEPS, key=lambda k: _offset(k)[1])
    real = run_child(
        "tests.benchmarks._resume_child",
        {"contender": "torchdata", "n": N, "batch": BATCH, "offset": _offset(real_step)[1]},
        240,
    )
    times: dict[int, float | None] = {}
    how: dict[int, str] = {}
    for k in STEPS:
        if k == real_step:
            times[k], how[k] = (
                (real["seconds"], "measured") if real else (None, "failed: killed (memory?) or past 240 s")
            )
        elif real and per_sample is not None:
            fixed = real["seconds"] - _offset(real_step)[1] * per_sample
            times[k], how[k] = fixed + _offset(k)[1] * per_sample, "modelled"
        else:
            times[k], how[k] = None, "not measured"
    return times, how, real


# -- Grain and accelerate
# --------------------------------------------------------------------------------------------------


def _grain_first_batch(step: int) -> float:
    import grain

    t0 = time.perf_counter()
    ds = grain.MapDataset.range(N).shuffle(seed=0).repeat().batch(BATCH)
    it = iter(ds.to_iter_dataset(grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)))
    it.set_state({"next_index": step})
    next(it)
    return time.perf_counter() - t0


def grain_times() -> dict[int, float]:
    for k in STEPS:  # warm-up
        _grain_first_batch(k)
    times: dict[int, list[float]] = {k: [] for k in STEPS}
    for _ in range(HF_REPEATS * 3):
        for k in STEPS:
            times[k].append(_grain_first_batch(k))
    return {k: statistics.median(v) for k, v in times.items()}


def accelerate_times() -> tuple[dict[int, float | None], dict[int, str]]:
    runs = {}
    for k in (0, 10**6):
        runs[k] = run_child(
            "tests.benchmarks._resume_child",
            {"contender": "accelerate", "n": N, "batch": BATCH, "offset": _offset(k)[1]},
            240,
        )
    times: dict[int, float | None] = {}
    how: dict[int, str] = {}
    for k in STEPS:
        offset = _offset(k)[1]
        if offset == 0 and runs[0]:
            times[k], how[k] = runs[0]["seconds"], "measured" if k == 0 else "measured (the epoch-start run)"
        elif runs.get(k):
            times[k], how[k] = runs[k]["seconds"], "measured"
        elif runs[0] and runs[10**6]:
            per_sample = (runs[10**6]["seconds"] - runs[0]["seconds"]) / _offset(10**6)[1]
            times[k], how[k] = runs[0]["seconds"] + offset * per_sample, "modelled"
        else:
            times[k], how[k] = None, "failed: killed (memory?) or past 240 s"
    return times, how


def _or_reason(measure, how: dict | None = None) -> tuple[dict, dict]:
    """``measure()``'s times (and how each was got), or, when the peer cannot run here, why, in every row."""
    try:
        out = measure()
    except Exception as exc:
        reason = f"could not run: {type(exc).__name__}: {str(exc)[:100]}"
        return {k: None for k in STEPS}, {k: reason for k in STEPS}
    return (out, how) if how is not None else out


# -- plain DataLoader that skips
# -------------------------------------------------------------------------------------------


def skip_times() -> tuple[dict[int, float | None], dict[int, str], dict | None]:
    run = run_child(
        "tests.benchmarks._resume_child",
        {"contender": "skip", "n": N, "batch": BATCH, "marks": list(STEPS), "budget": SKIP_BUDGET},
        SKIP_BUDGET + 120,
    )
    times: dict[int, float | None] = {}
    how: dict[int, str] = {}
    for k in STEPS:
        if run is None:
            times[k], how[k] = None, "failed"
        elif str(k) in run["marks"]:
            times[k], how[k] = run["marks"][str(k)], "measured"
        else:
            epoch_starts = (
                k * BATCH // N
            )  # further randperm(N).tolist() calls, each costing about the first batch's time
            times[k] = run["first"] * (1 + epoch_starts) + k / run["rate"]
            how[k] = f"> {fmt_seconds(run['elapsed'])} budget; extrapolated from {run['rate']:.3g} batches/s"
    return times, how, run


# -- the benchmark
# ---------------------------------------------------------------------------------------------------------


def main() -> BenchResult:
    warnings.filterwarnings("ignore")
    t_start = time.perf_counter()
    det = detsampler_times()
    hf, hf_first = hf_times()
    per_sample = torchdata_skip_cost()
    td, td_how, td_real = torchdata_times(per_sample)
    skip, skip_how, skip_run = skip_times()
    grain_t, grain_how = _or_reason(grain_times, {k: "measured" for k in STEPS})
    acc, acc_how = _or_reason(accelerate_times)

    contenders = [
        ("detsampler (start_step=k)", det, {k: "measured" for k in STEPS}),
        ("plain DataLoader, skip k batches", skip, skip_how),
        ("torchdata StatefulDataLoader, load_state_dict", td, td_how),
        ("HF datasets IterableDataset, load_state_dict", hf, {k: "measured" for k in STEPS}),
        ("Grain MapDataset iterator, set_state", grain_t, grain_how),
        ("accelerate skip_first_batches", acc, acc_how),
    ]
    tables = []
    for k in STEPS:
        epoch, offset = _offset(k)
        values = [c[1].get(k) for c in contenders]
        ratios = ratio_column(values, higher_is_better=False)
        rows = []
        for (name, _, how), v, r in zip(contenders, values, ratios):
            shown = fmt_seconds(v)
            if how[k].startswith(">"):
                shown = f"> {fmt_seconds(skip_run['elapsed'])} (extrapolated: {fmt_seconds(v)})"
            rows.append([name, shown, r, how[k]])
        peers_only = [
            (v, c[0]) for c, v in zip(contenders, values) if v is not None and not c[0].startswith("detsampler")
        ]
        strongest = min(peers_only)[1] if peers_only else "none"
        tables.append(
            Table(
                f"Resume at step {_label(k)} (epoch {epoch}, {offset:,} samples into it)",
                ["contender", "time to first batch", "time / best", "how"],
                rows,
                [f"Strongest peer: {strongest}."],
            )
        )

    ratio = det[10**9] / det[0]
    verdicts = [
        Verdict(
            f"detsampler's time at step 1e9 within {TARGET_RATIO}x of its time at step 0",
            ratio <= TARGET_RATIO,
            f"Step 0: {fmt_seconds(det[0])}, step 1e9: {fmt_seconds(det[10**9])}: {ratio:.2f}x (median of"
            f" {DET_REPEATS}).",
        )
    ]
    notes = [
        (
            f"HF IterableDataset's first sample at each step: {hf_first} (it reads in stream order: no global shuffle)."
            f" Its restore cost is bounded by one shard's {N // HF_SHARDS:,} examples whatever k, because whole shards"
            " are skipped unread; per example, this generator is far cheaper than decoding real files (a streamed JSON"
            " or Parquet shard is read up to the offset), so real corpora resume slower."
        ),
    ]
    if per_sample is not None:
        notes.append(
            f"torchdata restore replays {per_sample * 1e9:.0f} ns per consumed sample of the epoch (measured at N ="
            " 1e6), on top of regenerating the epoch's permutation (torch.randperm(N).tolist(), several times per"
            " restore)."
        )
    if td_real:
        notes.append(f"torchdata's real restore at N = 1e8 peaked at {td_real['peak_rss'] / 1e9:.1f} GB RSS.")
    if skip_run:
        notes.append(
            f"The skipping DataLoader took {fmt_seconds(skip_run['first'])} to its first batch (the epoch's"
            f" randperm(N).tolist()), then skipped at {skip_run['rate']:.3g} batches/s; it peaked at"
            f" {skip_run['peak_rss'] / 1e9:.1f} GB RSS."
        )
    return BenchResult(
        1,
        "Seek / resume cost",
        __doc__.split("\n", 2)[2].strip(),
        tables,
        verdicts,
        notes,
        time.perf_counter() - t_start,
    )


if __name__ == "__main__":
    print(main().markdown())
