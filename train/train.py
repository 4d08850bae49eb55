"""Train the Llama-style model with FSDP2, resuming by step number.

Commands::

    python -m train.train --config train/configs/tiny.toml --run-dir runs/tiny                 # one process
    torchrun --standalone --nproc-per-node 2 -m train.train --config train/configs/tiny.toml \\
        --run-dir runs/tiny --resume auto                                                       # 2 CPU ranks (gloo)
    torchrun --standalone --nproc-per-node 8 -m train.train --config train/configs/gpu.toml \\
        --run-dir runs/gpu --resume auto                                                        # GPUs (NCCL, bf16)

Options: ``--set section.key=value`` (repeatable) overrides the TOML; ``--resume auto`` (the newest complete checkpoint,
else a fresh start), ``none`` (fresh; refused when the run already has checkpoints) or a checkpoint directory;
``--allow-data-change`` resumes although the data fingerprint differs; ``--stop-at STEP`` trains up to (not including)
STEP, saves a checkpoint there and exits (the LR schedule still spans ``schedule.steps``).

The data of step s is a pure function of the plan, so resuming at checkpoint step s restarts the batch sampler at s and
nothing else: with the same number of ranks, on CPU with deterministic algorithms, every later loss is bit-identical to
the one of an uninterrupted run. With another number of ranks (same global batch) the step's samples are the same and
the losses agree up to float reduction order. The loss of a step is the token-mean over the whole global batch (sum over
ranks and micro steps, divided by the global number of label tokens that are not -100: with an SFT loss mask, the
unmasked ones), so it does not depend on how the batch is split (:func:`global_label_counts`).
"""

from __future__ import annotations

if __name__ == "__main__":  # NOTE: before torch is imported (seconds), so that a launcher killed meanwhile is noticed
    from train.guard import exit_with_launcher

    exit_with_launcher()

import argparse
import json
import logging
import math
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

from detsampler.cli import show_library_log
from detsampler.cli.parser import non_negative_int
from detsampler.loader.redact import redact_step
from detsampler.plan import Plan
from detsampler.redaction import Blocklist
from detsampler.version import BALANCED_MAPPING_VERSION, MAPPING_VERSION
from train import checkpoint as ckpt
from train.config import DataConfig, TrainConfig, config_to_dict, load_config
from train.data import DataPipeline, ThreadPrefetcher, TimedIterator, build_pipeline, step_token_hashes
from train.metrics import MetricsLog, sample_hash
from train.model import Transformer
from train.rundir import ResumeChoice, RunDirLocked, RunLock, choose_checkpoint, settle

__all__ = ["Runtime", "global_label_counts", "main", "parse_args", "train"]


@dataclass(frozen=True)
class Runtime:
    """The process's place in the job and the device it computes on."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    device: torch.device
    param_dtype: torch.dtype

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"


class _Parser(argparse.ArgumentParser):
    """Usage errors are raised (one line, printed by rank 0 only), not printed by every rank."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise ValueError(f"{self.prog}: {message} (see --help)")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = _Parser(prog="python -m train.train", description=__doc__.split("\n")[0])
    p.add_argument("--config", default=None, help="TOML file (train/configs/tiny.toml, train/configs/gpu.toml)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    p.add_argument("--run-dir", required=True, help="where metrics.jsonl, config.json and checkpoints/ go")
    p.add_argument("--resume", default="auto", help="auto | none | PATH of a checkpoint directory")
    p.add_argument("--allow-data-change", action="store_true", help="resume even if the data fingerprint differs")
    p.add_argument(
        "--stop-at", type=non_negative_int, default=None, help="stop before this step (saving a checkpoint there)"
    )
    return p.parse_args(argv)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def setup_runtime(cfg: TrainConfig) -> Runtime:
    """Initialise torch.distributed (torchrun's env, or a one-process group) and choose device and precision."""
    if "RANK" not in os.environ:  # a single process without torchrun
        os.environ.update(
            {
                "RANK": "0",
                "WORLD_SIZE": "1",
                "LOCAL_RANK": "0",
                "LOCAL_WORLD_SIZE": "1",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(_free_port()),
            }
        )
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    ckpt.kill_point("before_init", 0)
    want = cfg.runtime.device
    use_cuda = want == "cuda" or (want == "auto" and torch.cuda.is_available())
    if use_cuda and not torch.cuda.is_available():
        raise ValueError("runtime.device='cuda' but no CUDA device is available; use 'auto' or 'cpu'")
    if use_cuda:
        if cfg.runtime.deterministic:
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before CUDA initialises
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        dist.init_process_group("cpu:gloo,cuda:nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
        torch.set_num_threads(cfg.runtime.threads or max(1, (os.cpu_count() or 1) // local_world))
    precision = cfg.runtime.mixed_precision
    bf16 = precision == "bf16" or (precision == "auto" and use_cuda)
    if cfg.runtime.deterministic:
        torch.use_deterministic_algorithms(True, warn_only=use_cuda and not cfg.runtime.strict_determinism)
        torch.backends.cudnn.benchmark = False
    return Runtime(rank, world, local_rank, local_world, device, torch.bfloat16 if bf16 else torch.float32)


def build_model(cfg: TrainConfig, vocab_size: int, rt: Runtime) -> Transformer:
    """The model, initialised from ``model.init_seed`` (the same on every rank), sharded with FSDP2 per block and at the
    root."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    model_cfg = cfg.model if cfg.model.vocab_size else replace(cfg.model, vocab_size=vocab_size)
    if model_cfg.vocab_size < vocab_size:
        raise ValueError(f"model.vocab_size ({model_cfg.vocab_size}) is smaller than the tokenizer's ({vocab_size})")
    torch.manual_seed(model_cfg.init_seed)
    model = Transformer(model_cfg).to(rt.device)
    mesh = init_device_mesh(rt.device.type, (rt.world_size,))
    mp = MixedPrecisionPolicy(param_dtype=rt.param_dtype, reduce_dtype=torch.float32)
    for block in model.layers:
        fully_shard(block, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    return model


def lr_factor(cfg: TrainConfig, step: int) -> float:
    """Multiplier of the peak learning rate at ``step``: linear warmup, then cosine/linear/constant to min_lr_ratio."""
    sched = cfg.schedule
    if step < sched.warmup_steps:
        return (step + 1) / sched.warmup_steps
    if sched.decay == "constant":
        return 1.0
    span = max(1, sched.steps - sched.warmup_steps)
    progress = min(1.0, (step - sched.warmup_steps) / span)
    shape = 0.5 * (1 + math.cos(math.pi * progress)) if sched.decay == "cosine" else 1 - progress
    return sched.min_lr_ratio + (1 - sched.min_lr_ratio) * shape


def build_optimizer(
    cfg: TrainConfig, model: torch.nn.Module, rt: Runtime
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW (no weight decay on norms) and the warmup/decay schedule as a LambdaLR."""
    o = cfg.optimizer
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": o.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=o.lr,
        betas=(o.beta1, o.beta2),
        eps=o.eps,
        foreach=None if rt.is_cuda else False,
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(cfg, s))
    return optimizer, scheduler


def apply_optimizer_config(cfg: TrainConfig, optimizer: torch.optim.Optimizer, scheduler: Any) -> list[str]:
    """Make the restored optimizer and scheduler use ``cfg.optimizer`` (a checkpoint restores its own hyperparameters);
    returns the changes ``optimizer.KEY: saved -> configured``, so that what is recorded is what is used."""
    o = cfg.optimizer
    wanted = [
        {"lr": o.lr, "betas": (o.beta1, o.beta2), "eps": o.eps, "weight_decay": o.weight_decay},
        {"lr": o.lr, "betas": (o.beta1, o.beta2), "eps": o.eps, "weight_decay": 0.0},
    ]
    changes: list[str] = []
    saved_lr = scheduler.base_lrs[0]
    if saved_lr != o.lr:
        changes.append(f"optimizer.lr: {saved_lr!r} -> {o.lr!r}")
    for group, want in zip(optimizer.param_groups, wanted):
        for key in ("betas", "eps", "weight_decay"):
            have = tuple(group[key]) if key == "betas" else group[key]
            if have != want[key]:
                if group is optimizer.param_groups[0] or key != "weight_decay":
                    changes.append(f"optimizer.{key}: {have!r} -> {want[key]!r}")
                group[key] = want[key]
        group["initial_lr"] = o.lr
    scheduler.base_lrs = [o.lr for _ in optimizer.param_groups]
    factor = lr_factor(cfg, scheduler.last_epoch)
    for group in optimizer.param_groups:
        group["lr"] = o.lr * factor
    scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]
    return sorted(set(changes))


def _all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def global_label_counts(micro_batches: Sequence[dict[str, torch.Tensor]], rt: Runtime) -> tuple[Tensor, Tensor]:
    """``(tokens, positions)`` of the step's whole global batch (every rank, every micro batch), float64 scalars:
    ``tokens`` the labels that count in the loss (not -100: neither masked by a loss mask, nor at an example's end, nor
    on padding), ``positions`` the positions that hold a document token (``document_ids >= 0``). One all-reduce of
    both, before any backward pass: every rank divides its loss sum by the same global ``tokens``, so the step's loss
    and gradient do not depend on the world size or on how the masked tokens fall on the ranks (a mean per rank or per
    micro batch would weight a token by its rank's or micro batch's count)."""
    local = torch.stack(
        [
            torch.stack([(mb["labels"] != -100).sum(), (mb["document_ids"] >= 0).sum()]).to(torch.float64)
            for mb in micro_batches
        ]
    ).sum(dim=0)
    counts = _all_reduce_sum(local.to(rt.device))
    return counts[0], counts[1]


def _global_token_hash(local: np.ndarray, rt: Runtime, plan: Plan, step: int) -> str:
    """Hash of the per-sample token hashes of the whole step, in global position order (the slots, micro step, rank,
    row, put in position order: a balanced plan deals them out of it), the same for any number of ranks."""
    t = torch.from_numpy(local.view(np.int64).copy())
    if rt.is_cuda:
        t = t.to(rt.device)
    gathered = [torch.empty_like(t) for _ in range(rt.world_size)]
    dist.all_gather(gathered, t)
    per_rank = np.stack([g.cpu().numpy() for g in gathered])  # [world, micro_steps, micro_batch]
    return sample_hash(plan.by_position(step, per_rank.transpose(1, 0, 2).reshape(-1)))


def log(rt: Runtime, text: str) -> None:
    if rt.rank == 0:
        print(text, flush=True)


def _data_config(config: DataConfig, meta: dict | None) -> DataConfig:
    """``config`` with its mapping version settled: as configured, else the checkpoint's (a run resumes on the version
    it started on), else the current one (3 for a balanced plan, else 2). A resume keeps the checkpoint's balance."""
    if config.mapping_version:
        return config
    balanced = config.balance is not None
    if meta is None:
        return replace(config, mapping_version=BALANCED_MAPPING_VERSION if balanced else MAPPING_VERSION)
    version = ckpt.saved_mapping_version(meta["data"])
    if (version == BALANCED_MAPPING_VERSION) != balanced:
        was = "balanced" if version == BALANCED_MAPPING_VERSION else "not balanced"
        wanted = BALANCED_MAPPING_VERSION if balanced else MAPPING_VERSION
        raise ckpt.DataFingerprintError(
            f"the checkpoint's run was {was} (mapping version {version}) but [data] balance is"
            f" {'on' if balanced else 'off'}: resume with the checkpoint's setting, or change it on purpose with"
            f" --allow-data-change and data.mapping_version = {wanted}"
        )
    return replace(config, mapping_version=version)


def train(
    cfg: TrainConfig,
    run_dir: str | Path,
    resume: str = "auto",
    allow_data_change: bool = False,
    stop_at: int | None = None,
) -> None:
    """Train ``cfg.schedule.steps`` steps (or up to ``stop_at``) in ``run_dir``, resuming as ``resume`` says."""
    rt = setup_runtime(cfg)
    run_dir = Path(run_dir)
    ckpt_dir = Path(cfg.checkpoint.dir) if cfg.checkpoint.dir else run_dir / "checkpoints"
    lock = None
    try:
        lock = _lock_run_dir(rt, run_dir, ckpt_dir)
        choice = choose_checkpoint(resume, ckpt_dir)  # nothing is moved before the resume is accepted (_run)
        resume_path = choice.path
        meta = ckpt.read_meta(resume_path) if resume_path is not None else None
        if meta is not None:
            ckpt.read_record(resume_path, meta)  # the record beside the meta must be this checkpoint's (issue 31)
        data = build_pipeline(_data_config(cfg.data, meta), rt.world_size, rt.rank)
        fingerprint = data.fingerprint()
        start_step = 0
        if meta is not None:
            if not allow_data_change:
                ckpt.check_fingerprint(resume_path, meta["data"], fingerprint, resume_step=meta["step"])
            start_step = meta["step"]
        _run(cfg, rt, run_dir, ckpt_dir, data, fingerprint, choice, start_step, stop_at)
    finally:
        if lock is not None:
            lock.release()
        if dist.is_initialized():
            dist.destroy_process_group()


def _log_loss_mask(rt: Runtime, data: DataPipeline) -> None:
    """SFT data: the share of the index's tokens its loss mask trains, and what the layout did to over-long examples."""
    counts = data.index.loss_mask_counts() if data.sources is None and getattr(data.index, "chat", None) else None
    if counts is None:
        return
    trained, masked = counts["trained_tokens"], counts["masked_tokens"]
    described = data.layout.describe()
    overlong = described.get("overlong", "split")
    cut = {k: v for k, v in described.items() if k in ("examples_truncated", "examples_dropped")}
    log(
        rt,
        f"data: loss mask (policy {counts['policy']}): {trained:,} of {trained + masked:,} tokens trained "
        f"({trained / max(1, trained + masked):.1%}), the other labels -100 | overlong {overlong}"
        + "".join(f", {v} {k.replace('_', ' ')}" for k, v in cut.items()),
    )


def _lock_run_dir(rt: Runtime, run_dir: Path, ckpt_dir: Path) -> RunLock | None:
    """Rank 0 locks the run directory and the checkpoint directory (what is written: another trainer's
    ``checkpoint.dir`` may name it) before anything is touched; every rank learns whether it could."""
    lock, problem = None, None
    if rt.rank == 0:
        try:
            lock = RunLock([run_dir, ckpt_dir])
        except (RunDirLocked, OSError) as exc:
            problem = str(exc)
    box = [problem]
    dist.broadcast_object_list(box, src=0)
    if box[0] is not None:
        raise RunDirLocked(box[0])
    return lock


def _run(
    cfg: TrainConfig,
    rt: Runtime,
    run_dir: Path,
    ckpt_dir: Path,
    data: DataPipeline,
    fingerprint: dict,
    choice: ResumeChoice,
    start_step: int,
    stop_at: int | None,
) -> None:
    resume_path = choice.path
    model = build_model(cfg, data.vocab_size, rt)
    optimizer, scheduler = build_optimizer(cfg, model, rt)
    changes: list[str] = []
    if resume_path is not None:
        ckpt.load_checkpoint(resume_path, model, optimizer, scheduler)
        changes = apply_optimizer_config(cfg, optimizer, scheduler)
    settle(choice, ckpt_dir, lambda text: log(rt, text))  # the resume is accepted: now the checkpoint dir may change
    end_step = cfg.schedule.steps if stop_at is None else min(stop_at, cfg.schedule.steps)
    metrics = MetricsLog(run_dir, enabled=rt.rank == 0)
    if rt.rank == 0:
        (run_dir / "config.json").write_text(json.dumps(config_to_dict(cfg), indent=2) + "\n")
    event = {
        "time": time.time(),
        "world_size": rt.world_size,
        "micro_batch_size": data.plan.micro_batch_size,
        "num_workers": cfg.data.num_workers,
        "data_fingerprint": fingerprint["hash"],
    }
    if resume_path is None:
        metrics.write({"event": "start", "step": 0, **event})
    else:
        metrics.write(
            {
                "event": "resumed_from",
                "step": start_step,
                "checkpoint": str(resume_path),
                "optimizer_changes": changes,
                **event,
            }
        )
        if changes:
            log(rt, f"applied on resume (the checkpoint had other values): {'; '.join(changes)}")
    n_params = sum(p.numel() for p in model.parameters())
    log(
        rt,
        f"model: {n_params / 1e6:.2f}M params, vocab {data.vocab_size}, {cfg.model.n_layers} layers, "
        f"dim {cfg.model.dim} | device {rt.device.type} x{rt.world_size}, {str(rt.param_dtype).replace('torch.', '')}",
    )
    samples = (
        f"{data.layout.num_samples} samples"
        if data.sources is None
        else "a mixture of " + " + ".join(str(lay.num_samples) for _, lay in data.sources) + " samples"
    )
    log(
        rt,
        f"data: {data.layout.describe()['kind']} layout, {samples} of seq_len {cfg.data.seq_len}, "
        f"global batch {cfg.data.global_batch_size} = {rt.world_size} ranks x {data.plan.micro_batch_size} x "
        f"{data.plan.num_micro_steps(start_step)} micro steps | fingerprint {fingerprint['hash']}",
    )
    if data.plan.balance is not None:
        c = data.plan.balance.cost
        log(
            rt,
            f"data: balanced (mapping version 3): each step's samples dealt to ranks by cost = {c.attention!r} *"
            f" sum(len^2) + {c.linear!r} * tokens + {c.fixed!r}",
        )
    reads = data.reads_line()
    if reads is not None:
        log(rt, reads)
    _log_loss_mask(rt, data)
    for r in data.plan.redactions or ():  # what the run masks, said once (its audit: detsampler stats --checkpoint)
        shown = ", ".join(map(str, r.documents[:8])) + (" ..." if len(r.documents) > 8 else "")
        of = "" if r.source is None else f" of source {cfg.data.mixture_config().labels[r.source]}"
        log(rt, f"data: redacted from step {r.from_step}: {len(r.documents)} document(s){of} [{shown}] (labels masked)")
    log(
        rt,
        f"{'resuming from ' + str(resume_path) + ' at' if resume_path else 'starting at'} step {start_step}, "
        f"training to step {end_step}",
    )
    if start_step >= end_step:
        metrics.close()
        return

    sampler = data.sampler(rt.rank, start_step, end_step)
    blocklist = Blocklist(data.plan.redactions) if data.plan.redactions else None
    loader = data.loader(sampler, pin_memory=rt.is_cuda, persistent_workers=rt.is_cuda)
    # NOTE: a reader thread keeps the next micro batches ready while the model computes (torch releases the GIL); the
    # order, hence the data, is the DataLoader's.
    prefetch = ThreadPrefetcher(loader, cfg.data.prefetch_batches) if cfg.data.prefetch_batches else None
    batches = TimedIterator(prefetch or loader, time.perf_counter)
    model.train()
    t_last = time.perf_counter()
    if rt.is_cuda:
        torch.cuda.reset_peak_memory_stats(rt.device)
    for step, micro_batches in sampler.steps(batches):
        waited = batches.take_wait()
        ckpt.kill_point("before_step", step)
        micro_batches = [{k: v.to(rt.device, non_blocking=True) for k, v in mb.items()} for mb in micro_batches]
        if blocklist is not None:  # labels of redacted documents -> -100; inputs and every other label unchanged
            redact_step(micro_batches, step, blocklist, data.plan, rt.rank)  # a mixture's rows: by their source
        global_tokens, global_positions = global_label_counts(micro_batches, rt)
        # NOTE: FSDP averages the gradients over the ranks, hence world_size / global_tokens: the gradient is that of
        # (sum of the token losses of the global batch) / global_tokens, however the masked tokens fall on the ranks.
        scale = rt.world_size / global_tokens.clamp(min=1).to(torch.float32)
        loss_sum = torch.zeros((), dtype=torch.float64, device=rt.device)
        for a, mb in enumerate(micro_batches):
            model.set_requires_gradient_sync(a == len(micro_batches) - 1)
            logits = model(mb["input_ids"], mb["position_ids"], mb["document_ids"] if data.masked_attention else None)
            loss = F.cross_entropy(
                logits.flatten(0, 1).float(), mb["labels"].flatten(), ignore_index=-100, reduction="sum"
            )
            (loss * scale).backward()
            loss_sum += loss.detach().to(torch.float64)
        grad_norm = None
        if cfg.optimizer.grad_clip > 0:
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optimizer.grad_clip, foreach=False)
            if hasattr(grad_norm, "full_tensor"):
                grad_norm = grad_norm.full_tensor()
        lr = optimizer.param_groups[0]["lr"]
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        _all_reduce_sum(loss_sum)
        step_loss = float(loss_sum / global_tokens)
        token_hash = _global_token_hash(step_token_hashes(micro_batches), rt, data.plan, step)
        now = time.perf_counter()
        elapsed, t_last = now - t_last, now
        record = {
            "event": "step",
            "step": step,
            "loss": step_loss,
            "lr": lr,
            "tokens_per_s": float(global_tokens) / elapsed,
            "data_wait_ms": 1000 * waited,
            "step_ms": 1000 * elapsed,
            "tokens": int(global_tokens),
            "positions": int(global_positions),
            "sample_hash": sample_hash(data.plan.by_position(step, data.plan.global_batch(step))),
            "tokens_hash": token_hash,
            "grad_norm": None if grad_norm is None else float(grad_norm),
            "world_size": rt.world_size,
        }
        if rt.is_cuda:
            record["peak_mem_gib"] = torch.cuda.max_memory_allocated(rt.device) / 2**30
        metrics.write(record)
        if step % cfg.runtime.log_every == 0 or step + 1 == end_step:
            log(
                rt,
                f"step {step:5d} | loss {step_loss:.4f} | lr {lr:.2e} | {record['tokens_per_s']:9.0f} tok/s | "
                f"data wait {record['data_wait_ms']:6.1f} ms | samples {record['sample_hash']}",
            )
        next_step = step + 1
        if next_step % cfg.checkpoint.every == 0 or (next_step == end_step and cfg.checkpoint.save_final):
            path = ckpt.save_checkpoint(
                ckpt_dir,
                next_step,
                model,
                optimizer,
                scheduler,
                fingerprint,
                cfg.checkpoint.keep,
                extra={"world_size": rt.world_size},
                record=data.data_record(next_step) if rt.rank == 0 else None,
            )
            log(rt, f"checkpoint {path} (resumes at step {next_step})")
            t_last = time.perf_counter()
    if prefetch is not None:
        prefetch.close()
    summary = data.prefetch_summary()
    if summary is not None:
        log(rt, summary)
    data.close()
    metrics.close()
    log(rt, f"done at step {end_step}")


def main(argv: Sequence[str] | None = None) -> int:
    """Train; a bad configuration, a refused resume or a locked run directory exits with status 2 and one line on
    stderr,
    printed by rank 0 only (every rank meets the same error)."""
    rank0 = os.environ.get("RANK", "0") == "0"
    try:
        args = parse_args(argv)
        show_library_log(logging.INFO if rank0 else logging.WARNING)
        cfg = load_config(args.config, args.overrides)
        train(cfg, args.run_dir, args.resume, args.allow_data_change, args.stop_at)
    except (ValueError, OSError) as e:
        if rank0:
            print(f"error: {_one_line(e)}", file=sys.stderr, flush=True)
        return 2
    return 0


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.filename is not None:
        return f"{exc.strerror or type(exc).__name__}: {exc.filename}"
    return " ".join(str(exc).split()) or type(exc).__name__


if __name__ == "__main__":
    sys.exit(main())
