"""The GPU check (issue 26): ``make demo``'s kill-and-resume comparison on a real GPU, with its speed measured.

    python -m train.gpu_check [--device cuda|cpu|auto] [--steps N] [--every E] [--kill-at K] [--set KEY=VALUE ...]
                              [--loss-tolerance T] [--budget-s S] [--out runs/gpu_check] [--json PATH]

``scripts/gpu_check.sh`` runs it on the GPU machine under a timeout of its own. With ``--device cuda`` it trains
``train/configs/gpu.toml`` (~134M parameters with the default 32k tokenizer, bf16 through FSDP2's mixed precision
policy, NCCL, ``--nproc`` ranks: 1 by default) for 160 steps instead of 300; the config uses no ``torch.compile``, so
neither does the check. With ``--device cpu`` (the fallback that the tests run) it trains ``train/configs/tiny.toml``
(gloo, fp32) for a few steps. In both:

1. builds (or opens, when cached) the tokenizer and the token index of the config's data: by default the running
   interpreter's standard library;
2. run A: STEPS steps, uninterrupted, with ``data.prefetch_batches=0`` (the data wait of a step is then the loader's);
3. run B: the same command with ``data.prefetch_batches=2``, SIGKILLed (every process) just before step KILL_AT, then
   the same command with ``--resume auto``;
4. compares every step: the plan's sample hash, the hash of the tokens trained on, the loss (bit for bit unless
   ``--loss-tolerance``). Every run sets ``runtime.deterministic=true`` and ``runtime.strict_determinism=true``:
   ``torch.use_deterministic_algorithms(True, warn_only=False)`` and, on CUDA, ``CUBLAS_WORKSPACE_CONFIG=:4096:8``
   (docs/design.md, section 6). Should an operation of the model have no deterministic implementation on the device
   (run A then fails at once with torch's error), run A is trained again with ``warn_only=True`` and the losses are
   compared within ``--fallback-tolerance`` (the data still exactly); the report says so;
5. reports, into ``--json`` (default ``$OUT/gpu_check.json`` when ``$OUT`` is set, else ``OUT/gpu_check.json``) and a
   text summary beside it (``gpu_check.txt``): tokens/s, an MFU estimate (CUDA), peak GPU memory, the data wait per
   step with ``prefetch_batches`` 0 (run A) and 2 (run B), the comparison, and any warning of torch about an operation
   without a deterministic implementation. Copies both runs' ``metrics.jsonl`` beside the JSON.

Exit status: 0 when every step agrees; 1 on any mismatch; 2 when a run fails or the time budget (``--budget-s``, each
run's timeout is what is left of it) runs out; the JSON is written in every case.

``--inject-mismatch loss`` (resume run B with twice the learning rate) or ``data`` (resume it on another seed) makes a
mismatch on purpose: the tests use it to see the check fail.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from train.compare import ROOT, compare_runs, print_comparison, run_logged
from train.metrics import RunMetrics, read_metrics

__all__ = ["PEAK_BF16_FLOPS", "determinism_error", "main", "model_flops", "summarize_wait"]

CONFIGS = {"cuda": ROOT / "train" / "configs" / "gpu.toml", "cpu": ROOT / "train" / "configs" / "tiny.toml"}
# steps, checkpoint every, kill before
SIZES = {"cuda": (160, 80, 120), "cpu": (8, 4, 6)}
# Dense bf16 tensor-core peak of the SXM parts, by NVIDIA's datasheets (H100 and H200: 989.4 TFLOP/s without
# sparsity); matched against torch.cuda.get_device_name. Other devices: pass --peak-tflops.
PEAK_BF16_FLOPS = {"H200": 989.4e12, "H100": 989.4e12, "A100": 312e12}
NONDETERMINISTIC = ("does not have a deterministic implementation", "non-deterministic", "nondeterministic")


def _versions() -> dict[str, Any]:
    import importlib.metadata as md

    out: dict[str, Any] = {"python": platform.python_version()}
    for name in ("torch", "numpy", "datasets", "pyarrow", "tokenizers", "sentencepiece", "fsspec", "dill"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = None
    return out


def _device_info(device: str) -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {"kind": device, "cuda_available": torch.cuda.is_available()}
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        info.update(
            name=torch.cuda.get_device_name(0),
            count=torch.cuda.device_count(),
            memory_gib=round(props.total_memory / 2**30, 1),
            capability=f"{props.major}.{props.minor}",
            cuda=torch.version.cuda,
        )
        try:
            version = torch.cuda.nccl.version()
            info["nccl"] = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
        except Exception as exc:  # reported, never fatal: NCCL is the trainer's to fail on
            info["nccl"] = f"unknown ({type(exc).__name__})"
    info["cpus"] = os.cpu_count()
    return info


def model_flops(model_cfg: Any, vocab_size: int, seq_len: int) -> dict[str, Any]:
    """Parameters of the model, and its training FLOPs per token: ``6 * N + 12 * n_layers * dim * seq_len``, N the
    parameters that multiply (all but the input embedding, unless tied), the second term attention's scores and
    weighted sum (forward and backward, the causal half not discounted; PaLM's appendix B)."""
    import torch

    from train.model import Transformer

    cfg = model_cfg if model_cfg.vocab_size else replace(model_cfg, vocab_size=vocab_size)
    with torch.device("meta"):
        model = Transformer(cfg)
    params = sum(p.numel() for p in model.parameters())
    matmul = params if cfg.tie_embeddings else params - cfg.vocab_size * cfg.dim
    per_token = 6 * matmul + 12 * cfg.n_layers * cfg.dim * seq_len
    return {
        "params": params,
        "matmul_params": matmul,
        "flops_per_token": per_token,
        "formula": "6 * matmul_params + 12 * n_layers * dim * seq_len",
    }


def _stats(values: Sequence[float | None]) -> dict[str, Any] | None:
    v = sorted(float(x) for x in values if x is not None)
    if not v:
        return None
    pick = lambda q: v[min(len(v) - 1, int(q * (len(v) - 1) + 0.5))]
    return {"n": len(v), "mean": sum(v) / len(v), "median": pick(0.5), "p95": pick(0.95), "max": v[-1]}


def _steady(run: RunMetrics, skip: int = 2) -> list[dict]:
    """The step records of ``run`` without the first ``skip`` steps of each attempt (a process's first steps include
    its loader's start and the first use of each kernel)."""
    firsts = [0, *(int(e["step"]) for e in run.resumes)]
    return [r for s, r in sorted(run.steps.items()) if not any(f <= s < f + skip for f in firsts)]


def summarize_wait(run: RunMetrics) -> dict[str, Any] | None:
    """The data wait per step (ms) over the steady steps of ``run``."""
    return _stats([r.get("data_wait_ms") for r in _steady(run)])


def _speed(run: RunMetrics, positions_per_step: int, flops: dict[str, Any], peak: float | None, nproc: int) -> dict:
    steady = _steady(run)
    step_ms = _stats([r.get("step_ms") for r in steady])
    label_tps = _stats([r.get("tokens_per_s") for r in steady])
    out: dict[str, Any] = {
        "step_ms": step_ms,
        "label_tokens_per_s": None if label_tps is None else label_tps["median"],
        "tokens_per_s": None,
        "mfu": None,
        "peak_mem_gib": max((r["peak_mem_gib"] for r in run.steps.values() if "peak_mem_gib" in r), default=None),
    }
    if step_ms is not None and step_ms["median"] > 0:
        tps = positions_per_step / (step_ms["median"] / 1000)
        out["tokens_per_s"] = tps
        if peak:
            out["mfu"] = flops["flops_per_token"] * tps / (peak * nproc)
    return out


def determinism_error(lines: Sequence[str]) -> bool:
    """Whether a failed run's output shows torch refusing an operation that has no deterministic implementation."""
    return any("Error" in line and "deterministic" in line for line in lines)


def _default_json(out_dir: Path) -> Path:
    env = os.environ.get("OUT")
    return Path(env) / "gpu_check.json" if env else out_dir / "gpu_check.json"


def _summary(report: dict[str, Any]) -> str:
    """The short text summary of a report."""
    lines = [f"GPU CHECK {report['status'].upper()}: {report['verdict']}"]
    dev = report.get("device", {})
    cfg = report.get("config", {})
    lines.append(
        f"  device: {dev.get('name', dev.get('kind'))} x{cfg.get('nproc')} | {cfg.get('precision')} | "
        f"deterministic={cfg.get('deterministic')}, strict={cfg.get('strict_determinism')} | "
        f"torch.compile: {cfg.get('compile')} | torch "
        f"{report.get('versions', {}).get('torch')}"
    )
    model = report.get("model")
    if model:
        lines.append(
            f"  model: {model['params'] / 1e6:.1f}M params, {model['flops_per_token'] / 1e9:.3f} GFLOP/token; "
            f"{cfg.get('steps')} steps of {cfg.get('global_batch_size')} x {cfg.get('seq_len')} tokens"
        )
    cmp = report.get("comparison")
    if cmp:
        n = cmp["steps"]
        loss = "bit-identical" if cmp["loss_tolerance"] == 0 else f"within {cmp['loss_tolerance']:g}"
        lines.append(
            f"  comparison: sample hashes equal {cmp['sample_hashes_equal']}/{n}, trained tokens equal "
            f"{cmp['tokens_equal']}/{n}, losses {loss} {cmp['losses_equal']}/{n} (max |diff| "
            f"{cmp['max_abs_loss_diff']:.3g}); B killed before step {cfg.get('kill_at')}, resumed at "
            f"{cmp['resumed_at']}"
        )
    speed = report.get("speed")
    if speed:
        a = speed["A"]
        mfu = "n/a" if a["mfu"] is None else f"{100 * a['mfu']:.1f}%"
        mem = "n/a" if a["peak_mem_gib"] is None else f"{a['peak_mem_gib']:.2f} GiB"
        tps = "n/a" if a["tokens_per_s"] is None else f"{a['tokens_per_s']:,.0f}"
        step = "n/a" if a["step_ms"] is None else f"{a['step_ms']['median']:.1f} ms"
        lines.append(f"  speed (run A): {tps} tokens/s, step {step}, MFU {mfu}, peak memory {mem}")
    waits = report.get("data_wait_ms")
    if waits:
        for key, label in (("prefetch_0", "prefetch_batches=0 (A)"), ("prefetch_2", "prefetch_batches=2 (B)")):
            w = waits.get(key)
            if w:
                lines.append(
                    f"  data wait, {label}: mean {w['mean']:.2f} ms, median {w['median']:.2f}, p95 {w['p95']:.2f}, "
                    f"max {w['max']:.2f} per step ({w['n']} steps)"
                )
    warns = report.get("nondeterministic_op_warnings") or []
    lines.append(f"  warnings about non-deterministic operations: {len(warns)}")
    lines.extend(f"    {w}" for w in warns)
    t = report.get("time_s", {})
    lines.append("  time: " + ", ".join(f"{k} {v:.0f}s" for k, v in t.items()))
    if report.get("error"):
        lines.append(f"  error: {report['error']}")
    return "\n".join(lines)


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m train.gpu_check", description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto", help="auto: cuda when available")
    p.add_argument("--config", default=None, help="default: train/configs/gpu.toml (cuda), tiny.toml (cpu)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    p.add_argument("--nproc", type=int, default=1, help="ranks (torchrun --nproc-per-node)")
    p.add_argument("--steps", type=int, default=None, help="default 160 (cuda), 8 (cpu)")
    p.add_argument("--every", type=int, default=None, help="checkpoint every this many steps: 80 (cuda), 4 (cpu)")
    p.add_argument("--kill-at", type=int, default=None, help="SIGKILL run B before this step: 120 (cuda), 6 (cpu)")
    p.add_argument("--loss-tolerance", type=float, default=0.0, help="absolute; 0: bit-identical losses")
    p.add_argument(
        "--fallback-tolerance",
        type=float,
        default=1e-2,
        help="absolute loss tolerance when an operation has no deterministic implementation on the device",
    )
    p.add_argument("--budget-s", type=float, default=450.0, help="wall time for the whole check")
    p.add_argument("--peak-tflops", type=float, default=None, help="dense bf16 peak per GPU (default: by name)")
    p.add_argument("--out", default=str(ROOT / "runs" / "gpu_check"))
    p.add_argument("--json", default=None, help="default: $OUT/gpu_check.json, else OUT/gpu_check.json")
    p.add_argument("--inject-mismatch", choices=("loss", "data"), default=None, help=argparse.SUPPRESS)
    p.add_argument("--verbose", action="store_true", help="show all of the runs' output")
    args = p.parse_args(argv)
    steps, every, kill_at = SIZES["cuda" if args.device == "cuda" else "cpu"]
    if args.device == "auto":
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
        steps, every, kill_at = SIZES[args.device]
    args.steps = args.steps or steps
    args.every = args.every or every
    args.kill_at = args.kill_at or kill_at
    if not args.every <= args.kill_at < args.steps:
        p.error(f"need every ({args.every}) <= kill-at ({args.kill_at}) < steps ({args.steps})")
    if args.loss_tolerance < 0:
        p.error("--loss-tolerance must be >= 0")
    return args


def _terminated(signum: int, frame: Any) -> None:
    # NOTE: raised where the main thread is, inside run_training's loop too, whose `finally` then kills the run's
    # processes (they live in a session of their own, out of the timeout's reach); the report is still written.
    raise SystemExit(f"gpu_check: terminated by signal {signum} (the timeout of scripts/gpu_check.sh?)")


def _config_report(config: Path, overrides: list[str], args: argparse.Namespace, cfg: Any, bf16: bool) -> dict:
    """What the report says of the configuration the two runs train with."""
    return {
        "path": str(config.relative_to(ROOT) if config.is_relative_to(ROOT) else config),
        "overrides": overrides,
        "nproc": args.nproc,
        "steps": args.steps,
        "checkpoint_every": args.every,
        "kill_at": args.kill_at,
        "deterministic": cfg.runtime.deterministic,
        "strict_determinism": cfg.runtime.strict_determinism,
        "precision": "bf16" if bf16 else "fp32",
        "compile": False,  # train.train has no torch.compile option
        "seq_len": cfg.data.seq_len,
        "global_batch_size": cfg.data.global_batch_size,
        "micro_batch_size": cfg.data.micro_batch_size,
        "num_workers": cfg.data.num_workers,
        "layout": cfg.data.layout,
    }


def _peak_flops(peak_tflops: float | None, device_name: str) -> tuple[float | None, str]:
    """A GPU's dense bf16 peak (FLOP/s) and where it comes from: ``--peak-tflops``, else the datasheet of the device
    named, else None ("unknown device")."""
    if peak_tflops:
        return peak_tflops * 1e12, "--peak-tflops"
    match = [k for k in PEAK_BF16_FLOPS if k in device_name]
    if not match:
        return None, "unknown device: pass --peak-tflops"
    return PEAK_BF16_FLOPS[match[0]], f"datasheet dense bf16 of the {match[0]}"


def _comparison_report(cmp: Any, steps: int, tolerance: float, resumed: list[int], retrained: Any) -> dict:
    """The counts of the step-by-step comparison of the two runs."""
    return {
        "steps": steps,
        "sample_hashes_equal": cmp.count(3),
        "tokens_equal": cmp.count(4),
        "losses_equal": cmp.count(5),
        "loss_tolerance": tolerance,
        "max_abs_loss_diff": cmp.max_loss_diff,
        "bad_steps": cmp.bad,
        "resumed_at": resumed,
        "retrained_steps": retrained,
    }


def _step_rows(cmp: Any) -> list[dict]:
    """Per step: both runs' sample hash and loss, and whether they agree."""
    return [
        {
            "step": step,
            "sample_hash": [None if ra is None else ra["sample_hash"], None if rb is None else rb["sample_hash"]],
            "loss": [None if ra is None else ra["loss"], None if rb is None else rb["loss"]],
            "same": bool(s and t and loss),
        }
        for step, ra, rb, s, t, loss in cmp.rows
    ]


def _write_report(report: dict[str, Any], json_path: Path, runs: dict[str, Path]) -> str:
    """Write the report (JSON, its text summary beside it, each run's metrics.jsonl copied as metrics_<run>.jsonl);
    returns the summary."""
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(report, indent=1, allow_nan=False) + "\n")
    text = _summary(report)
    json_path.with_suffix(".txt").write_text(text + "\n")
    for name, run_dir in runs.items():
        if (run_dir / "metrics.jsonl").exists():
            shutil.copyfile(run_dir / "metrics.jsonl", json_path.parent / f"metrics_{name}.jsonl")
    return text


def main(argv: Sequence[str] | None = None) -> int:
    t_start = time.monotonic()
    args = _parse(argv)
    previous = signal.signal(signal.SIGTERM, _terminated)
    out = Path(args.out)
    json_path = Path(args.json) if args.json else _default_json(out)
    run_a, run_b = out / "uninterrupted", out / "interrupted"
    for d in (run_a, run_b):
        shutil.rmtree(d, ignore_errors=True)
    config = Path(args.config) if args.config else CONFIGS[args.device]
    overrides = [
        f"runtime.device={args.device!r}",
        "runtime.deterministic=true",
        "runtime.strict_determinism=true",
        f"schedule.steps={args.steps}",
        f"checkpoint.every={args.every}",
        "checkpoint.keep=2",
        f"runtime.log_every={max(1, args.steps // 10)}",
        *args.overrides,
    ]
    times: dict[str, float] = {}
    report: dict[str, Any] = {
        "status": "failed",
        "verdict": "did not finish",
        "versions": _versions(),
        "error": None,
        "time_s": times,
    }
    warnings: list[str] = []
    code = 2
    try:
        import torch

        from train.config import load_config
        from train.data import build_pipeline

        if args.device == "cuda" and not torch.cuda.is_available():
            raise SystemExit("gpu_check: --device cuda, but torch sees no CUDA device")
        report["device"] = {"kind": args.device}
        cfg = load_config(config, overrides)
        precision = cfg.runtime.mixed_precision
        bf16 = precision == "bf16" or (precision == "auto" and args.device == "cuda")
        report["config"] = _config_report(config, overrides, args, cfg, bf16)
        print(f"[1/4] tokenizer and token index ({config.name}; cached after the first time)", flush=True)
        t0 = time.monotonic()
        data = build_pipeline(cfg.data, world_size=args.nproc)
        times["index"] = time.monotonic() - t0
        print(
            f"      {data.index.num_documents} documents, {data.index.num_tokens:,} tokens, vocabulary "
            f"{data.vocab_size}; {data.layout.num_samples:,} samples of {cfg.data.seq_len} tokens "
            f"({data.layout.config.kind} layout) in {times['index']:.0f}s",
            flush=True,
        )
        # NOTE: after the index build, whose worker processes are forked: none of them inherits a CUDA context
        report["device"] = _device_info(args.device)
        flops = model_flops(cfg.model, data.vocab_size, cfg.data.seq_len)
        report["model"] = flops
        peak = None
        if args.device == "cuda" and bf16:
            peak, source = _peak_flops(args.peak_tflops, report["device"]["name"])
            report["peak_flops_per_gpu"] = {"value": peak, "source": source}

        tolerance = args.loss_tolerance
        common = ["--config", str(config)]
        for item in overrides:
            common += ["--set", item]

        def remaining() -> float:
            left = args.budget_s - (time.monotonic() - t_start)
            if left < 5:
                raise SystemExit(f"gpu_check: the time budget of {args.budget_s:.0f}s is spent")
            return left

        label = f"{args.nproc} {'GPU' if args.device == 'cuda' else 'CPU'} rank{'s' if args.nproc > 1 else ''}"
        ranks = "torchrun and its rank" if args.nproc == 1 else f"torchrun and its {args.nproc} ranks"
        run = dict(nproc=args.nproc, verbose=args.verbose, what="gpu_check", ranks=ranks, keep=warnings)
        print(f"[2/4] run A: {args.steps} steps on {label}, prefetch_batches=0, uninterrupted -> {run_a}", flush=True)
        a_args = ["--set", "data.prefetch_batches=0", "--run-dir", str(run_a), "--resume", "none"]
        seen = len(warnings)
        try:
            times["run_a"] = run_logged("A", common + a_args, timeout=remaining(), **run)
        except SystemExit:
            if not determinism_error(warnings[seen:]):
                raise
            # An operation of the model has no deterministic implementation on this device: train with torch's
            # warnings instead (use_deterministic_algorithms(True, warn_only=True)) and compare the losses within
            # the fallback tolerance; the data must still be exactly the same (docs/design.md, section 6).
            tolerance = max(tolerance, args.fallback_tolerance)
            common += ["--set", "runtime.strict_determinism=false"]
            overrides.append("runtime.strict_determinism=false")  # the report's list
            report["config"]["strict_determinism"] = False
            print(
                f"      an operation has no deterministic implementation here: run A again with warn_only=True, "
                f"losses compared within {tolerance:g}",
                flush=True,
            )
            shutil.rmtree(run_a, ignore_errors=True)
            times["run_a"] = run_logged("A", common + a_args, timeout=remaining(), **run)
        print(
            f"[3/4] run B: prefetch_batches=2, killed with SIGKILL just before step {args.kill_at} (last checkpoint:"
            f" step {args.kill_at // args.every * args.every}), then resumed with --resume auto -> {run_b}",
            flush=True,
        )
        # Run B trains kill_at steps, then again from the last checkpoint to the end, in two launches: stop now, with
        # the numbers, rather than at the timeout, when run A's pace says that it cannot finish in time.
        last = args.kill_at // args.every * args.every
        need = times["run_a"] * (args.kill_at + args.steps - last) / args.steps
        if need > remaining():
            raise SystemExit(
                f"gpu_check: run B would take about {need:.0f}s at run A's pace ({times['run_a']:.0f}s for "
                f"{args.steps} steps), more than the {remaining():.0f}s left of the budget; pass fewer --steps"
            )
        b_args = common + ["--set", "data.prefetch_batches=2", "--run-dir", str(run_b), "--resume", "auto"]
        times["run_b"] = run_logged("B", b_args, kill_point=f"before_step:{args.kill_at}", timeout=remaining(), **run)
        if args.inject_mismatch == "loss":
            b_args += ["--set", f"optimizer.lr={2 * cfg.optimizer.lr!r}"]
        elif args.inject_mismatch == "data":
            b_args += ["--set", f"data.seed={cfg.data.seed + 1}", "--allow-data-change"]
        times["run_b"] += run_logged("B", b_args, timeout=remaining(), **run)

        print("[4/4] comparison, step by step", flush=True)
        a, b = read_metrics(run_a), read_metrics(run_b)
        resumed = [int(e["step"]) for e in b.resumes]
        cmp = compare_runs(a, b, args.steps, tolerance)
        print_comparison(cmp, resumed)
        report["comparison"] = _comparison_report(cmp, args.steps, tolerance, resumed, b.superseded)
        report["steps"] = _step_rows(cmp)
        positions = cfg.data.global_batch_size * cfg.data.seq_len
        report["speed"] = {key: _speed(m, positions, flops, peak, args.nproc) for key, m in (("A", a), ("B", b))}
        report["data_wait_ms"] = {"prefetch_0": summarize_wait(a), "prefetch_2": summarize_wait(b)}
        if cmp.bad:
            report["status"], code = "mismatch", 1
            report["verdict"] = f"steps {cmp.bad} differ between the uninterrupted and the killed-and-resumed run"
        else:
            report["status"], code = "ok", 0
            report["verdict"] = "the killed and resumed run trained on exactly the same data, with " + (
                "exactly the same losses" if tolerance == 0 else f"losses within {tolerance:g}"
            )
    except SystemExit as exc:  # a run failed (run_logged) or the budget ran out
        report["error"] = str(exc.code)
        report["verdict"] = "a run failed or the time budget ran out"
    except Exception as exc:  # reported in the JSON; the exit status says it failed
        report["error"] = f"{type(exc).__name__}: {exc}"
        report["verdict"] = "the check itself failed"
    report["nondeterministic_op_warnings"] = sorted(
        {w.strip() for w in warnings if any(k in w for k in NONDETERMINISTIC)}
    )[:10]
    times["total"] = time.monotonic() - t_start
    text = _write_report(report, json_path, {"A": run_a, "B": run_b})
    print(text, flush=True)
    print(f"      report: {json_path}", flush=True)
    signal.signal(signal.SIGTERM, previous)
    return code


if __name__ == "__main__":
    sys.exit(main())
