"""What ``LayoutConfig(epoch_order=True)`` costs, side by side with the same layout without it (not a numbered
benchmark: ``run_all`` does not discover it).

A synthetic lengths-only index (``detsampler.index.synthetic``, mean length 1,000 tokens) is cut by ``concat`` and
``document`` at seq_len 2,048 (persisted beside the index, opened as memory maps) and read by a plan of global batch 512
(8 ranks x micro batch 4 x 16 micro steps). Measured, each after a warm-up pass:

- ``locate`` of a whole step (``locate(plan, layout, step)``), median over ``--steps`` steps of epoch 1 (the option on:
  epoch 1's directory, built before; off: the one layout);
- ``layout.locate`` of one micro batch of 4 sample ids (what a DataLoader worker does per batch), median over 2,000;
  (off and on alternate over 3 rounds, the best median of each kept);
- building one epoch's directory (``build_layout(..., epoch=e)``): seconds and bytes on disk, against the layout's own;
- ``where`` of one document over the steps of three epochs (the option on: with those epochs' directories there, and
  with none there, each then built).

Usage: ``python -m tests.benchmarks.epoch_order_costs [--docs N] [--steps S]``.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]


def _median_ms(fn, args: list) -> float:
    for a in args[:20]:
        fn(a)
    times = []
    for a in args:
        t = time.perf_counter()
        fn(a)
        times.append(time.perf_counter() - t)
    return 1e3 * statistics.median(times)


def _bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.iterdir() if f.is_file())


def main(argv: list[str] | None = None) -> None:
    from detsampler.index.layouts import build_layout, epoch_dirs, layout_dir
    from detsampler.index.synthetic import synthetic_index
    from detsampler.layout import LayoutConfig
    from detsampler.locate import locate
    from detsampler.plan import Plan
    from detsampler.where import where

    p = argparse.ArgumentParser()
    p.add_argument("--docs", type=int, default=1_000_000)
    p.add_argument("--steps", type=int, default=200)
    args = p.parse_args(argv)
    index = synthetic_index(ROOT / ".cache" / "bench" / "epoch_order", args.docs, mean_length=1000, seed=0)
    print(f"index: {index.num_documents:,} documents, {index.num_tokens:,} tokens")
    rng = np.random.default_rng(0)
    for kind in ("concat", "document"):
        off_config = LayoutConfig(kind=kind, seq_len=2048, seed=1)
        on_config = replace(off_config, epoch_order=True)
        t = time.perf_counter()
        off = index.layout(off_config)
        base_s = time.perf_counter() - t
        on = index.layout(on_config)
        for path in epoch_dirs(index, off_config).values():  # a cold start: no epoch directory
            shutil.rmtree(path)
        t = time.perf_counter()
        build_layout(index, off_config, epoch=1)
        epoch_s = time.perf_counter() - t
        n = off.num_samples
        plans = {
            "off": Plan(n, seed=2, global_batch_size=512, micro_batch_size=4, world_size=8),
            "on": Plan(n, seed=2, global_batch_size=512, micro_batch_size=4, world_size=8, epoch_ids=True),
        }
        first = n // 512 + 1  # the first whole step of epoch 1
        steps = list(range(first, first + args.steps))
        # NOTE: off and on alternate, 3 rounds, the best median of each kept: a shared machine's load falls on both
        step_ms, micro_ms = {"off": 1e9, "on": 1e9}, {"off": 1e9, "on": 1e9}
        ids = list(rng.integers(0, n, size=(2000, 4)))
        for _ in range(3):
            for k, lay in (("off", off), ("on", on)):
                step_ms[k] = min(step_ms[k], _median_ms(lambda s: locate(plans[k], lay, s), steps))
                shift = n if k == "on" else 0  # epoch 1's ids under epoch_order
                micro_ms[k] = min(micro_ms[k], _median_ms(lambda i: lay.locate(i + shift), ids))
        on.wait_ahead()
        stop = 3 * n // 512
        docs = rng.integers(0, index.num_documents, size=5).tolist()
        where_ms = {}
        for name, plan, lay in (("off", plans["off"], off), ("on", plans["on"], on)):
            t = time.perf_counter()
            for d in docs:
                where(plan, lay, d, range(stop))
            where_ms[name] = 1e3 * (time.perf_counter() - t) / len(docs)
        for path in epoch_dirs(index, off_config).values():
            shutil.rmtree(path)
        cold = index.layout(on_config)
        t = time.perf_counter()
        where(plans["on"], cold, docs[0], range(stop))
        cold_ms = 1e3 * (time.perf_counter() - t)
        base_bytes = _bytes(layout_dir(index, off_config))
        epoch_bytes = _bytes(layout_dir(index, off_config, 1))
        print(f"\n{kind} (seq_len 2048, {n:,} samples per epoch; layout opened/built in {base_s:.1f} s)")
        print("| measure | epoch_order off | epoch_order on | on / off |")
        print("|---|---|---|---|")
        for label, pair in (
            ("locate, one step of 512 samples (ms, median)", step_ms),
            ("layout.locate, a micro batch of 4 (ms, median)", micro_ms),
            ("where, one document, 3 epochs, epochs built (ms)", where_ms),
        ):
            print(f"| {label} | {pair['off']:.3f} | {pair['on']:.3f} | {pair['on'] / pair['off']:.2f}x |")
        print(f"| where, one document, 3 epochs, none built (ms) | - | {cold_ms:.0f} | - |")
        print(f"| one epoch's directory: build (s) / bytes | - | {epoch_s:.2f} / {epoch_bytes:,} | - |")
        print(f"| the layout's own directory: bytes | {base_bytes:,} | (shared: epoch 0) | - |")


if __name__ == "__main__":
    main()
