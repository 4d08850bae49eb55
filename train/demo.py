"""``make demo``: an interrupted and resumed run against an uninterrupted one, compared step by step.

    python -m train.demo [--steps 60] [--every 10] [--kill-at 35] [--out runs/demo]

1. Builds (once, then cached under $DETSAMPLER_CACHE, else .cache/detsampler) the default tokenizer and the token index
   over the default corpus, this interpreter's standard library: no download.
2. Run A: the tiny model (train/configs/tiny.toml) for STEPS steps on 2 CPU ranks, uninterrupted:
   ``torchrun --standalone --nproc-per-node 2 -m train.train --config train/configs/tiny.toml --run-dir
   OUT/uninterrupted``
3. Run B: the same command into OUT/interrupted, SIGKILLed (every process of it) when it is about to train step KILL_AT,
   a few steps after its last checkpoint; then the same command again with ``--resume auto``, which resumes from the
   newest complete checkpoint and trains the lost steps again.
4. Prints, step by step, whether the sample hash (the plan's global sample ids), the hash of the tokens the ranks
actually
   trained on, and the loss (bit for bit) agree; writes the loss plot with the resume point marked to OUT/loss.png.
   Exits 1 if any step disagrees.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from train.compare import compare_runs, print_comparison, run_logged
from train.metrics import read_metrics

__all__ = ["main"]

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "train" / "configs" / "tiny.toml"


def _run(label: str, args: list[str], kill_point: str | None = None, verbose: bool = False) -> float:
    return run_logged(label, args, nproc=2, kill_point=kill_point, verbose=verbose, what="demo")


def parse_demo_args(
    argv: Sequence[str] | None, prog: str, description: str, steps: int, every: int, kill_at: int, out: str
) -> tuple[argparse.Namespace, Path, Path]:
    """A demo's arguments (the defaults given) and its two run directories, emptied: run A (uninterrupted) and run B
    (killed before ``--kill-at``, after its first checkpoint, then resumed)."""
    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument("--steps", type=int, default=steps)
    p.add_argument("--every", type=int, default=every, help="checkpoint every this many steps")
    p.add_argument("--kill-at", type=int, default=kill_at, help="SIGKILL run B just before this step")
    p.add_argument("--out", default=out)
    p.add_argument("--verbose", action="store_true", help="show all of the runs' output")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="a configuration override for both runs (repeatable), e.g. --set data.balance=true",
    )
    args = p.parse_args(argv)
    if not 0 < args.kill_at < args.steps:
        p.error(f"--kill-at must be in (0, {args.steps}), got {args.kill_at}")
    if args.kill_at < args.every:
        p.error(f"--kill-at ({args.kill_at}) must come after the first checkpoint (step {args.every})")
    run_a, run_b = Path(args.out) / "uninterrupted", Path(args.out) / "interrupted"
    for d in (run_a, run_b):
        shutil.rmtree(d, ignore_errors=True)
    return args, run_a, run_b


def main(argv: Sequence[str] | None = None) -> int:
    args, run_a, run_b = parse_demo_args(
        argv, "python -m train.demo", "interrupted+resumed vs uninterrupted training", 60, 10, 35,
        str(ROOT / "runs" / "demo"),
    )  # fmt: skip
    out = Path(args.out)
    common = [
        "--config",
        str(CONFIG),
        "--set",
        f"schedule.steps={args.steps}",
        "--set",
        f"checkpoint.every={args.every}",
        "--set",
        "data.num_proc=2",
        "--set",
        "runtime.log_every=5",
        *(x for item in args.set for x in ("--set", item)),
    ]
    t_start = time.monotonic()

    print(
        "[1/4] tokenizer and token index over the default corpus (the standard library; cached after the first time)",
        flush=True,
    )
    from train.config import load_config
    from train.data import build_pipeline

    t0 = time.monotonic()
    data = build_pipeline(load_config(CONFIG, ["data.num_proc=2", *args.set]).data, world_size=2)
    t_index = time.monotonic() - t0
    print(
        f"      {data.index.num_documents} documents, {data.index.num_tokens:,} tokens, vocabulary {data.vocab_size}; "
        f"{data.layout.num_samples:,} samples of {data.layout.config.seq_len} tokens ({data.layout.config.kind}"
        " layout)",
        flush=True,
    )

    print(f"[2/4] run A: {args.steps} steps on 2 CPU ranks (torchrun, gloo), uninterrupted -> {run_a}", flush=True)
    t_a = _run("A", common + ["--run-dir", str(run_a), "--resume", "none"], verbose=args.verbose)

    print(
        f"[3/4] run B: the same, killed with SIGKILL just before step {args.kill_at} (last checkpoint: step "
        f"{args.kill_at // args.every * args.every}), then resumed with --resume auto -> {run_b}",
        flush=True,
    )
    t_b = _run(
        "B",
        common + ["--run-dir", str(run_b), "--resume", "auto"],
        kill_point=f"before_step:{args.kill_at}",
        verbose=args.verbose,
    )
    t_b += _run("B", common + ["--run-dir", str(run_b), "--resume", "auto"], verbose=args.verbose)

    print("[4/4] comparison, step by step", flush=True)
    a, b = read_metrics(run_a), read_metrics(run_b)
    resumed = [int(e["step"]) for e in b.resumes]
    cmp = compare_runs(a, b, args.steps)
    bad = cmp.bad
    print_comparison(cmp, resumed)
    print(
        f"      run B: killed before step {args.kill_at}, resumed from the checkpoint of step"
        f" {resumed[0] if resumed else '?'}; {b.superseded} logged steps of the killed attempt were trained again"
    )

    from train.plot import plot_runs

    png = plot_runs(
        [run_a, run_b],
        out / "loss.png",
        title="tiny model, 2 CPU ranks: uninterrupted vs killed + resumed",
        labels=["A: uninterrupted", "B: SIGKILLed, resumed"],
    )
    print(f"      plot: {png}")
    print(
        f"      time: tokenizer + index {t_index:.0f}s, run A {t_a:.0f}s, run B {t_b:.0f}s, total"
        f" {time.monotonic() - t_start:.0f}s"
    )
    if bad:
        print(f"DEMO FAILED: steps {bad} differ between the runs", flush=True)
        return 1
    print(
        "DEMO OK: the killed and resumed run trained on exactly the same data, with exactly the same losses.",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
