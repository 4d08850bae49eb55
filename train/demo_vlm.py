"""``make demo-vlm``: a tiny Qwen2-VL trained on a local image-text corpus; killed and resumed, then resumed on one
rank.

    python -m train.demo_vlm [--steps 24] [--every 8] [--kill-at 14] [--out runs/demo-vlm]

1. Writes the corpus (``python -m train.vlm_corpus``: 400 documents, 0 to 3 Pillow images each of 16² to 320² pixels in
   area, aspect ratios up to 8:1, EXIF orientations, JPEG/PNG/WebP, in webdataset shards; a BPE with Qwen2-VL's image
   tokens) and builds its media index (each image's header read, its tokens counted by Qwen2-VL's ``smart_resize``).
2. Run A: ``torchrun --standalone --nproc-per-node 2 -m train.train_vlm`` for STEPS steps, 1 DataLoader worker a rank.
3. Run B: the same, SIGKILLed (every process) just before step KILL_AT, resumed with ``--resume auto`` and 2 workers.
4. Run C: one rank, 0 workers, resumed from run A's checkpoint of step 2 * EVERY (the same global batch of 8).
5. Compares every step: A and B must agree on the sample hash, the hash of the whole global batch (input ids, labels,
   rope positions, image grids and pixel values) and the loss, bit for bit; A and C on the sample and batch hashes bit
   for bit, the loss within 1e-5 (one rank sums the batch in another order than two). Exits 1 otherwise.
"""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from train.compare import compare_runs, echo_filter, print_comparison
from train.demo import parse_demo_args
from train.launch import run_training
from train.metrics import read_metrics

__all__ = ["main"]

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / ".cache" / "vlm-corpus"
C_TOLERANCE = 1e-5


def _run(label: str, nproc: int, args: list[str], kill_point: str | None = None, verbose: bool = False) -> float:
    """``train.train_vlm ARGS`` on ``nproc`` ranks (torchrun), killed at ``kill_point`` when given; returns seconds."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc), "-m",
           "train.train_vlm", *args]  # fmt: skip
    result = run_training(cmd, kill_point=kill_point, cwd=ROOT, echo=echo_filter(label, verbose), timeout=1800)
    if kill_point is not None:
        if result.killed_at != kill_point:
            raise SystemExit(f"demo-vlm: run {label} ended (exit {result.returncode}) before reaching {kill_point}")
        print(f"  {label} | >>> SIGKILL sent to every process of the run at {kill_point}", flush=True)
    elif result.returncode != 0:
        raise SystemExit(f"demo-vlm: run {label} failed with exit code {result.returncode}")
    return result.seconds


def _describe_corpus(steps: int) -> None:
    """Build (or open) the corpus and its index; print what they hold."""
    import numpy as np

    from detsampler.media import MediaLayoutConfig
    from detsampler.media.build import build_media_index
    from detsampler.media.index import FORMAT_CODES
    from detsampler.media.sources import webdataset_source
    from train.train_vlm import COUNTS, parse_args
    from train.vlm_corpus import write_vlm_corpus

    defaults = parse_args(["--run-dir", "-"])
    shards, tokenizer = write_vlm_corpus(CORPUS, defaults.documents)
    cache = CORPUS / "cache"
    index = build_media_index(webdataset_source(shards, cache_dir=cache), tokenizer, COUNTS, cache_dir=cache)
    rows = index.image_rows(np.arange(index.num_images))
    formats = {name: int((rows["format"] == code).sum()) for name, code in FORMAT_CODES.items()}
    turned = int((rows["orientation"] != 1).sum())
    config = MediaLayoutConfig(seq_len=defaults.seq_len, max_patches=defaults.max_patches, window_docs=256)
    layout = index.layout(config)
    d = layout.describe()
    print(f"      {index.num_documents} documents in {len(shards)} webdataset shards, {index.num_images} images"
          f" ({', '.join(f'{n} {k}' for k, n in formats.items())}; {turned} with an EXIF rotation or flip), sizes"
          f" {int(rows['width'].min())}..{int(rows['width'].max())} x {int(rows['height'].min())}.."
          f"{int(rows['height'].max())} px -> {int(rows['tokens'].min())}..{int(rows['tokens'].max())} tokens each",
          flush=True)  # fmt: skip
    print(f"      {d['num_samples']} samples of {d['seq_len']} tokens and at most {defaults.max_patches} vision"
          f" patches: LLM-token fill {d['llm_fill']:.2%}, vision fill {d['vision_fill']:.2%}; {steps} steps of"
          f" {defaults.global_batch_size} samples", flush=True)  # fmt: skip


def _compare_c(a, c, start: int, steps: int) -> list[int]:
    """Steps ``start .. steps - 1``: the same samples and batch contents bit for bit, the loss within tolerance."""
    print(f"      {'step':>4}  {'batch hash A':>12}  {'batch hash C':>12}  {'loss A':>18}  {'loss C':>18}  same?")
    bad = []
    for s in range(start, steps):
        ra, rc = a.steps.get(s), c.steps.get(s)
        ok = ra is not None and rc is not None and ra["sample_hash"] == rc["sample_hash"]
        ok = ok and ra["tokens_hash"] == rc["tokens_hash"] and abs(ra["loss"] - rc["loss"]) <= C_TOLERANCE
        bad += [] if ok else [s]
        if ra is not None and rc is not None:
            print(f"      {s:>4}  {ra['tokens_hash']:>12}  {rc['tokens_hash']:>12}  {ra['loss']:>18.15f} "
                  f" {rc['loss']:>18.15f}  {'yes' if ok else 'NO'}")  # fmt: skip
    return bad


def main(argv: Sequence[str] | None = None) -> int:
    args, run_a, run_b = parse_demo_args(
        argv, "python -m train.demo_vlm", "a tiny Qwen2-VL: interrupted+resumed vs uninterrupted, 2 ranks -> 1", 24,
        8, 14, str(ROOT / "runs" / "demo-vlm"),
    )  # fmt: skip
    run_c = Path(args.out) / "one-rank"
    shutil.rmtree(run_c, ignore_errors=True)
    common = ["--steps", str(args.steps), "--every", str(args.every), "--corpus", str(CORPUS)]
    t_start = time.monotonic()
    print("[1/5] corpus (webdataset shards of Pillow images and text) and its media index", flush=True)
    _describe_corpus(args.steps)
    t_index = time.monotonic() - t_start
    print(f"[2/5] run A: {args.steps} steps on 2 CPU ranks x 1 worker, uninterrupted -> {run_a}", flush=True)
    t_a = _run("A", 2, [*common, "--run-dir", str(run_a), "--resume", "none"], verbose=args.verbose)
    print(f"[3/5] run B: the same, killed with SIGKILL just before step {args.kill_at}, then resumed with --resume auto"
          f" on 2 ranks x 2 workers -> {run_b}", flush=True)  # fmt: skip
    b_args = [*common, "--run-dir", str(run_b), "--resume", "auto"]
    t_b = _run("B", 2, b_args, kill_point=f"before_step:{args.kill_at}", verbose=args.verbose)
    t_b += _run("B", 2, [*b_args, "--num-workers", "2"], verbose=args.verbose)
    resume_c = 2 * args.every
    print(f"[4/5] run C: 1 rank x 0 workers, resumed from run A's checkpoint of step {resume_c} -> {run_c}", flush=True)
    shutil.copytree(run_a / "checkpoints" / f"step_{resume_c:08d}", run_c / "checkpoints" / f"step_{resume_c:08d}")
    t_c = _run("C", 1, [*common, "--run-dir", str(run_c), "--resume", "auto", "--num-workers", "0",
                        "--micro-batch-size", "4"], verbose=args.verbose)  # fmt: skip
    print("[5/5] comparison, step by step: A against B (killed, resumed)", flush=True)
    a, b, c = read_metrics(run_a), read_metrics(run_b), read_metrics(run_c)
    resumed = [int(e["step"]) for e in b.resumes]
    cmp = compare_runs(a, b, args.steps)
    print_comparison(cmp, resumed)
    print(f"      A against C (1 rank, resumed at step {resume_c} from A's checkpoint of 2 ranks):")
    bad_c = _compare_c(a, c, resume_c, args.steps)
    print(f"      time: corpus + index {t_index:.0f}s, run A {t_a:.0f}s, run B {t_b:.0f}s, run C {t_c:.0f}s, total"
          f" {time.monotonic() - t_start:.0f}s")  # fmt: skip
    if cmp.bad or bad_c:
        print(f"DEMO FAILED: steps {cmp.bad} differ between A and B, steps {bad_c} between A and C", flush=True)
        return 1
    print("DEMO OK: every step's global batch (pixels included) and loss are bit-identical after the kill and resume;"
          " on 1 rank the same global batches, the losses within 1e-5.", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
