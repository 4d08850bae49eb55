"""Benchmark 20: the compute-balanced plan (issue 34): per-rank cost, modeled and measured, and what balancing costs.

The corpus: the default corpus's token lengths (the standard library, 1,790 documents, tokenized as ``make demo``
does), tiled ``--copies`` times, plus 0.5% long documents (log-uniform between 16k and 512k tokens, seeded): a
long-tailed length distribution big enough for 8 samples per rank at 1,024 ranks and 128k tokens (a third of its
tokens lie in documents longer than 32k). Only lengths matter here (the plan and the layout read lengths; the measured
part times random activations of those span lengths).

1. Modeled: bestfit layouts at ``seq_len`` 8k, 32k, 128k; plans of ``W`` = 8, 64, 512, 1,024 ranks, micro batch 1, 8
   micro steps (8 samples per rank); over several steps, each rank's cost under the default cost model
   (``CostModel()``, calibrated on this machine), max over mean, in position order and balanced (the same samples).
2. Measured: the reference model of ``detsampler.loader.calibrate`` (the one the defaults were calibrated with: 1
   block, dim 32, 2 heads, attention masked per document), forward and backward of each sample of a step of 64 ranks x
   2 samples at 32k, on one thread, the best of 2 passes (the second in reverse order: the machine is shared); a
   sample's work is a function of its span lengths, so each distinct composition is timed once per pass (the full 32k
   pieces of long documents share one). A step's time is its slowest rank's sum; the straggler wait is the slowest
   minus the mean, in position order and balanced by the modeled cost; the same measured samples give the steps of 8,
   16 and 32 ranks (they tile the same positions). How well the model orders the samples: Spearman's rank correlation
   of modeled cost and measured time. (At 32k a sample costs up to ~10 s on one core: 128 samples is what fits.)
3. Balancing's own cost: one step's ``plan.slot_order`` (locating its samples, their costs, the assignment) and the
   assignment alone (``balanced_order``), median over fresh steps, at a global batch of 1,024 samples.
4. Padding-free SFT (``CostModel.tokens()``, ``attention = 0``): the document layout at 4,096 (each sample one piece of
   one document, of its own length), micro batches of 4: tokens per rank, max over mean.

Usage: ``python -m tests.benchmarks.bench_balance [--copies 100] [--measured-steps 1] [--passes 2] [--quick]``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from tests.benchmarks.common import BenchResult, Table, Verdict

__all__ = ["main"]

SEQ_LENS = (8192, 32768, 131072)
WORLDS = (8, 64, 512, 1024)
PER_RANK = 8


def _lengths(copies: int, seed: int = 0) -> tuple[np.ndarray, int]:
    from detsampler.index.prepare import IndexConfig, prepare_index

    stdlib = np.asarray(prepare_index(IndexConfig(num_proc=2), progress=False).index.lengths, dtype=np.int64)
    rng = np.random.default_rng(seed)
    tiled = np.tile(stdlib, copies)
    long = np.exp(rng.uniform(np.log(16_384), np.log(1 << 19), size=len(tiled) // 200)).astype(np.int64)
    return rng.permutation(np.concatenate([tiled, long])), len(long)


def _by_rank(costs: np.ndarray, order: np.ndarray | None, world: int, micro: int) -> np.ndarray:
    """Each rank's summed cost of one step, its slots ``order`` (None: position order)."""
    dealt = costs if order is None else costs[order]
    return dealt.reshape(-1, world, micro).sum(axis=(0, 2))


def _plans(layout, world: int, micro: int = 1, per_rank: int = PER_RANK, cost=None):
    from detsampler.balance import Balance, CostModel
    from detsampler.plan import Plan

    gbs = world * per_rank
    plain = Plan(layout.num_samples, 0, gbs, micro, world)
    return plain, Plan(layout.num_samples, 0, gbs, micro, world, balance=Balance(layout, cost or CostModel()))


def _modeled(lengths: np.ndarray, quick: bool) -> tuple[Table, list[dict]]:
    from detsampler.balance import sample_costs
    from detsampler.layout import LayoutConfig, make_layout

    rows, out = [], []
    for seq_len in SEQ_LENS:
        layout = make_layout(LayoutConfig(kind="bestfit", seq_len=seq_len), lengths)
        for world in WORLDS:
            plain, balanced = _plans(layout, world)
            steps = max(3 if quick else 6, min(60, 2**16 // plain.global_batch_size))
            before, after = [], []
            for s in range(steps):
                costs = sample_costs(balanced.balance, plain.stream, plain.step_positions(s))
                a, b = _by_rank(costs, None, world, 1), _by_rank(costs, balanced.slot_order(s), world, 1)
                before.append(a.max() / a.mean())
                after.append(b.max() / b.mean())
            row = {"seq_len": seq_len, "world": world, "steps": steps, "before": before, "after": after}
            out.append(row)
            rows.append(
                [
                    f"{seq_len // 1024}k",
                    str(world),
                    f"{layout.num_samples:,}",
                    str(steps),
                    f"{np.mean(before):.3f} (worst {max(before):.3f})",
                    f"{np.mean(after):.4f} (worst {max(after):.4f})",
                ]
            )
    table = Table(
        "Per-rank modeled cost, max / mean (8 samples per rank, bestfit; mean over steps, and the worst step)",
        ["seq_len", "ranks", "samples per epoch", "steps", "position order", "balanced"],
        rows,
    )
    return table, out


def _spearman(x: np.ndarray, y: np.ndarray) -> float:
    rx, ry = np.argsort(np.argsort(x)), np.argsort(np.argsort(y))
    return float(np.corrcoef(rx, ry)[0, 1])


def _measure(lengths: np.ndarray, steps: int, passes: int, quick: bool) -> tuple[list[Table], dict]:
    """Time each sample of ``steps`` steps of 64 ranks x 4 at 32k (module doc, part 2)."""
    import torch

    from detsampler.balance import CostModel, sample_costs
    from detsampler.layout import LayoutConfig, make_layout
    from detsampler.loader.calibrate import CalibrationConfig, ReferenceModel, time_sample

    seq_len, world, per_rank = (8192, 16, 2) if quick else (32768, 64, 2)
    layout = make_layout(LayoutConfig(kind="bestfit", seq_len=seq_len), lengths)
    plain, balanced = _plans(layout, world, per_rank=per_rank)
    positions = np.concatenate([plain.step_positions(s) for s in range(steps)])
    spans = layout.locate(plain.stream.sample_ids(positions))
    lengths_of = spans.stops - spans.starts
    pieces = [tuple(lengths_of[spans.offsets[i] : spans.offsets[i + 1]].tolist()) for i in range(len(positions))]
    distinct = sorted(set(pieces))  # NOTE: a sample's work is a function of its span lengths: time each once
    modeled = sample_costs(balanced.balance, plain.stream, positions)
    ref = CalibrationConfig()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = ReferenceModel(ref.dim, ref.n_heads, ref.n_layers)
    time_sample(model, [1024])  # warm-up
    best = dict.fromkeys(distinct, np.inf)
    t0 = time.perf_counter()
    for p in range(passes):  # NOTE: the second pass in reverse order: a load change hits both ends alike
        for lengths_i in distinct if p % 2 == 0 else distinct[::-1]:
            best[lengths_i] = min(best[lengths_i], time_sample(model, list(lengths_i)))
    seconds = np.array([best[c] for c in pieces])
    measure_s = time.perf_counter() - t0
    rows, figures = [], {}
    for w in sorted({8, 16, 32, world} & set(range(1, world + 1))):
        gbs = w * per_rank
        plain_w, balanced_w = _plans(layout, w, per_rank=per_rank)
        waits, waits_b, step_means = [], [], []
        for s in range(len(positions) // gbs):
            t = seconds[s * gbs : (s + 1) * gbs]
            a, b = _by_rank(t, None, w, 1), _by_rank(t, balanced_w.slot_order(s), w, 1)
            waits.append(a.max() - a.mean())
            waits_b.append(b.max() - b.mean())
            step_means.append(a.mean())
        cut = 1 - np.mean(waits_b) / np.mean(waits)
        figures[w] = cut
        rows.append(
            [
                str(w),
                str(len(waits)),
                f"{np.mean(step_means):.2f} s",
                f"{np.mean(waits):.2f} s ({np.mean(waits) / np.mean(step_means):.0%})",
                f"{np.mean(waits_b):.2f} s ({np.mean(waits_b) / np.mean(step_means):.0%})",
                f"{cut:.0%}",
            ]
        )
    rho = _spearman(modeled, seconds)
    per_token = CostModel().costs(spans)  # the same model: what it predicts, in seconds by a least-squares scale
    scale = float(per_token @ seconds / (per_token @ per_token))
    err = np.abs(per_token * scale - seconds) / seconds
    table = Table(
        f"Measured: forward + backward per sample, one thread, seq_len {seq_len // 1024}k, {per_rank} samples per rank"
        f" ({len(positions)} samples, best of {passes})",
        ["ranks", "steps", "mean rank time", "straggler wait, position order", "balanced", "wait cut"],
        rows,
        notes=[
            f"modeled cost against measured time over the {len(positions)} samples: Spearman rank correlation"
            f" {rho:.3f}; the model scaled to seconds by least squares is off by {np.median(err):.0%} (median) and"
            f" {err.max():.0%} (worst); measured times {seconds.min():.2f} s to {seconds.max():.2f} s per sample;"
            f" {len(distinct)} distinct span compositions among the {len(pieces)} samples, each timed (best of"
            f" {passes}); measuring took {measure_s:.0f} s"
        ],
    )
    return [table], {"cut": figures, "world": world, "seq_len": seq_len, "rho": rho}


def _timing(lengths: np.ndarray, quick: bool) -> tuple[Table, dict]:
    from detsampler.balance import balanced_order, sample_costs
    from detsampler.layout import LayoutConfig, make_layout

    layout = make_layout(LayoutConfig(kind="bestfit", seq_len=8192), lengths)
    rows, whole_ms = [], {}
    for world in (8, 64, 512):
        plain, balanced = _plans(layout, world, per_rank=1024 // world)
        steps = range(100, 110 if quick else 140)
        whole, alone = [], []
        for s in steps:  # fresh steps: nothing cached
            t0 = time.perf_counter()
            balanced.slot_order(s)
            whole.append(time.perf_counter() - t0)
            costs = sample_costs(balanced.balance, plain.stream, plain.step_positions(s))
            t0 = time.perf_counter()
            balanced_order(costs, world, 1)
            alone.append(time.perf_counter() - t0)
        whole_ms[world] = statistics.median(whole) * 1e3
        rows.append(
            [str(world), f"{statistics.median(alone) * 1e3:.3f} ms", f"{whole_ms[world]:.3f} ms", str(len(whole))]
        )
    table = Table(
        "Balancing one step of 1,024 samples (bestfit 8k; median over fresh steps)",
        ["ranks", "assignment (balanced_order)", "whole step (locate + costs + assignment)", "steps"],
        rows,
    )
    return table, whole_ms


def _sft(lengths: np.ndarray) -> Table:
    from detsampler.balance import Balance, CostModel, sample_costs
    from detsampler.layout import LayoutConfig, make_layout
    from detsampler.plan import Plan

    layout = make_layout(LayoutConfig(kind="document", seq_len=4096), lengths)
    rows = []
    for world in (8, 64, 512):
        gbs = world * 16
        plain = Plan(layout.num_samples, 0, gbs, 4, world)
        balanced = Plan(layout.num_samples, 0, gbs, 4, world, balance=Balance(layout, CostModel.tokens()))
        before, after = [], []
        for s in range(20):
            tokens = sample_costs(balanced.balance, plain.stream, plain.step_positions(s))
            a, b = _by_rank(tokens, None, world, 4), _by_rank(tokens, balanced.slot_order(s), world, 4)
            before.append(a.max() / a.mean())
            after.append(b.max() / b.mean())
        rows.append([str(world), f"{np.mean(before):.3f}", f"{np.mean(after):.4f}"])
    return Table(
        "Padding-free SFT: tokens per rank, max / mean (document layout at 4,096, 4 x 4 examples per rank, 20 steps)",
        ["ranks", "position order", "balanced (CostModel.tokens())"],
        rows,
    )


def main(argv: list[str] | None = None) -> BenchResult:
    parser = argparse.ArgumentParser(prog="bench_balance")
    parser.add_argument("--copies", type=int, default=100)
    parser.add_argument("--measured-steps", type=int, default=1)
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="a smoke run: fewer steps, 8k and 16 ranks measured")
    args = parser.parse_args(argv or [])
    t_start = time.perf_counter()
    lengths, num_long = _lengths(args.copies)
    say = lambda what: print(f"bench_balance: {what} ({time.perf_counter() - t_start:.0f} s)", flush=True)
    say(f"{len(lengths):,} documents")
    modeled, rows = _modeled(lengths, args.quick)
    say("modeled")
    timing, whole_ms = _timing(lengths, args.quick)
    sft = _sft(lengths)
    say("balancing cost and SFT tokens")
    measured, figures = _measure(lengths, args.measured_steps, args.passes, args.quick)
    say("measured")
    imbalanced = [r for r in rows if np.mean(r["before"]) > 1.2]
    worst = max((np.mean(r["after"]) for r in imbalanced), default=float("nan"))
    cut = figures["cut"][figures["world"]]
    verdicts = [
        Verdict(
            "per-rank modeled cost max/mean <= 1.02 wherever position order is above 1.2 (8k, 32k, 128k; 8 to 1,024"
            " ranks)",
            bool(imbalanced) and worst <= 1.02,
            f"{len(imbalanced)} of {len(rows)} configurations above 1.2 in position order; balanced, the worst of them"
            f" {worst:.4f} (mean over steps)",
        ),
        Verdict(
            f"the measured straggler wait cut by >= 30% at {figures['world']} ranks and {figures['seq_len'] // 1024}k",
            cut >= 0.30,
            f"cut by {cut:.0%}; modeled and measured orders agree with Spearman {figures['rho']:.3f}",
        ),
        Verdict(
            "balancing costs <= 1 ms per step at a global batch of 1,024 samples",
            max(whole_ms.values()) <= 1.0,
            "the whole step (locating the samples, their costs, the assignment): "
            + ", ".join(f"{w} ranks {ms:.3f} ms" for w, ms in whole_ms.items()),
        ),
    ]
    return BenchResult(
        number=20,
        title="A compute-balanced plan: per-rank cost, modeled and measured",
        method=__doc__.split("\n\n", 1)[1].split("\n\nUsage")[0],
        tables=[modeled, *measured, timing, sft],
        verdicts=verdicts,
        notes=[
            f"{len(lengths):,} documents ({args.copies} copies of the standard library's plus {num_long:,} long"
            f" ones), {int(lengths.sum()):,} tokens; cost model {_cost_text()}",
            "timings on 2 cores shared with other work: the ratios within a table are measured side by side",
        ],
        seconds=time.perf_counter() - t_start,
    )


def _cost_text() -> str:
    from detsampler.balance import CostModel

    c = CostModel()
    return f"attention {c.attention!r} x sum(len^2) + linear {c.linear!r} x tokens + fixed {c.fixed!r}"


if __name__ == "__main__":
    import sys

    print(main(sys.argv[1:]).markdown())
