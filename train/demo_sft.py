"""``make demo-sft``: supervised fine-tuning on a local chat corpus, an interrupted and resumed run against an
uninterrupted one, and the step's loss recomputed over the unmasked tokens.

    python -m train.demo_sft [--steps 12] [--every 4] [--kill-at 10] [--out runs/demo-sft]

1. Writes the chat corpus and its tokenizer (``python -m train.chat_corpus``: 600 conversations, a 400-piece BPE with
   a chat template that marks assistant turns) where ``train/configs/sft.toml`` reads them, ``.cache/sft-chat``, and
   builds the index (cached under ``.cache/detsampler``): each conversation rendered with the template, its loss mask
   (``assistant``: only what the assistant says is trained) stored beside the tokens.
2. Run A: ``torchrun --standalone --nproc-per-node 2 -m train.train --config train/configs/sft.toml --run-dir
   OUT/uninterrupted`` for STEPS steps, uninterrupted.
3. Run B: the same into OUT/interrupted, SIGKILLed (every process) just before step KILL_AT, then resumed with
   ``--resume auto`` from its newest complete checkpoint.
4. Prints, step by step, the masked fraction of the step's positions, whether the sample hash, the hash of the trained
   batches (input ids, labels and loss mask) and the loss agree bit for bit; then recomputes the loss of the resumed
   step from its checkpoint over the 2 ranks' unmasked labels (the global token mean, as logged) beside what a mean per
   rank would have been. Exits 1 if any step disagrees.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from train.compare import compare_runs, print_comparison, run_logged
from train.demo import parse_demo_args
from train.metrics import RunMetrics, read_metrics

if TYPE_CHECKING:  # NOTE: the demo imports torch (via train.data) only once it has printed its first line
    from train.config import TrainConfig
    from train.data import DataPipeline

__all__ = ["main"]

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "train" / "configs" / "sft.toml"
CHAT_DIR = ROOT / ".cache" / "sft-chat"  # what sft.toml's data.source and data.tokenizer name


def _run(label: str, args: list[str], kill_point: str | None = None, verbose: bool = False) -> float:
    return run_logged(label, args, nproc=2, kill_point=kill_point, verbose=verbose, what="demo-sft")


def _print_masks(a: RunMetrics, b: RunMetrics, steps: int) -> None:
    """Per step: the global batch's unmasked labels, its document positions, the share of those positions whose label is
    -100 (masked by the policy, or an example's last token), and both runs' batch hashes."""
    head = f"{'step':>4}  {'trained':>7} / {'positions':<9} {'masked':>6}  {'batch hash A':>12}  {'batch hash B':>12}"
    print(f"      {head}")
    for s in range(steps):
        ra, rb = a.steps.get(s), b.steps.get(s)
        if ra is None or rb is None:
            continue
        masked = 1 - ra["tokens"] / max(1, ra["positions"])
        print(
            f"      {s:>4}  {ra['tokens']:>7} / {ra['positions']:<9} {masked:>6.1%}  {ra['tokens_hash']:>12}  "
            f"{rb['tokens_hash']:>12}"
        )


def _recompute(data: DataPipeline, cfg: TrainConfig, run_dir: Path, step: int, logged: float) -> bool:
    """The loss of ``step`` from the checkpoint saved before it, over the global batch's unmasked labels."""
    from train.recompute import checkpoint_model, loss_means, masked_loss_sums, step_batches

    model = checkpoint_model(cfg, data.vocab_size, run_dir / "checkpoints" / f"step_{step:08d}")
    means = loss_means(masked_loss_sums(model, step_batches(data, step), data.masked_attention))
    print(
        f"      step {step} recomputed from checkpoint step_{step:08d}: unmasked labels per rank {list(means.counts)};"
        f" sum of their losses / {sum(means.counts)} = {means.global_mean:.15f} (logged {logged:.15f});"
        f" a mean per rank would give {means.rank_mean:.15f}"
    )
    return abs(means.global_mean - logged) <= 1e-5


def main(argv: Sequence[str] | None = None) -> int:
    args, run_a, run_b = parse_demo_args(
        argv, "python -m train.demo_sft", "SFT: interrupted+resumed vs uninterrupted", 12, 4, 10,
        str(ROOT / "runs" / "demo-sft"),
    )  # fmt: skip
    settings = [f"schedule.steps={args.steps}", f"checkpoint.every={args.every}", "runtime.log_every=4", *args.set]
    common = ["--config", str(CONFIG)] + [x for item in settings for x in ("--set", item)]
    t_start = time.monotonic()

    print(f"[1/4] chat corpus, tokenizer and index -> {CHAT_DIR} (nothing downloaded)", flush=True)
    from train.chat_corpus import write_chat_corpus
    from train.config import load_config
    from train.data import build_pipeline

    write_chat_corpus(CHAT_DIR)
    cfg = load_config(CONFIG, settings)
    data = build_pipeline(cfg.data, world_size=2)
    counts, described = data.index.loss_mask_counts(), data.layout.describe()
    trained, masked = counts["trained_tokens"], counts["masked_tokens"]
    print(
        f"      {data.index.num_documents} conversations, {trained + masked:,} tokens with their EOS; loss mask "
        f"(policy {counts['policy']}): {trained:,} trained, {masked:,} masked ({masked / (trained + masked):.1%}); "
        f"{described['num_samples']} bestfit samples of {described['seq_len']} tokens, "
        f"{described.get('examples_truncated', 0)} over-long conversations truncated",
        flush=True,
    )
    t_index = time.monotonic() - t_start

    print(f"[2/4] run A: {args.steps} SFT steps on 2 CPU ranks (torchrun, gloo), uninterrupted -> {run_a}", flush=True)
    t_a = _run("A", common + ["--run-dir", str(run_a), "--resume", "none"], verbose=args.verbose)
    last = args.kill_at // args.every * args.every
    print(
        f"[3/4] run B: the same, SIGKILLed just before step {args.kill_at} (last checkpoint: step {last}), then resumed"
        f" with --resume auto -> {run_b}",
        flush=True,
    )
    b_args = common + ["--run-dir", str(run_b), "--resume", "auto"]
    t_b = _run("B", b_args, kill_point=f"before_step:{args.kill_at}", verbose=args.verbose)
    t_b += _run("B", b_args, verbose=args.verbose)

    print("[4/4] comparison, step by step (batch hash: input ids, labels and loss mask of every row of both ranks)")
    a, b = read_metrics(run_a), read_metrics(run_b)
    resumed = [int(e["step"]) for e in b.resumes]
    _print_masks(a, b, args.steps)
    cmp = compare_runs(a, b, args.steps)
    print_comparison(cmp, resumed)
    print(
        f"      run B: killed before step {args.kill_at}, resumed from the checkpoint of step"
        f" {resumed[0] if resumed else '?'}; {b.superseded} logged steps of the killed attempt were trained again"
    )
    at = resumed[0] if resumed else last
    same_loss = at in b.steps and _recompute(data, cfg, run_b, at, b.steps[at]["loss"])
    print(
        f"      time: corpus + index {t_index:.0f}s, run A {t_a:.0f}s, run B {t_b:.0f}s, total"
        f" {time.monotonic() - t_start:.0f}s"
    )
    if cmp.bad or not same_loss:
        print(f"DEMO-SFT FAILED: steps {cmp.bad} differ between the runs, or the recomputed loss differs", flush=True)
        return 1
    print(
        "DEMO-SFT OK: the killed and resumed SFT run trained on exactly the same batches (loss masks included), with"
        " exactly the same losses, each the mean over the global batch's unmasked tokens.",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
