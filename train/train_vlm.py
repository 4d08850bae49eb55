"""Train a tiny Qwen2-VL (built from its config, random weights: nothing downloaded) with FSDP2 on an interleaved
image-text corpus, resuming by step number.

    torchrun --standalone --nproc-per-node 2 -m train.train_vlm --run-dir runs/vlm --resume auto
    python -m train.train_vlm --run-dir runs/vlm --resume auto          # one process

The corpus (``train/vlm_corpus.py``: webdataset shards of Pillow images and text, a BPE with Qwen2-VL's image tokens)
and its media index are made once; each step reads its global batch through :class:`detsampler.loader.vlm.VLMDataset`
in DataLoader workers (transformers' Qwen2-VL image processor, seeded flip/brightness augmentation keyed by (seed,
epoch, document, item), Qwen2-VL's rope positions). A checkpoint holds the model, optimizer, LR schedule and the data
fingerprint (index, two-axis layout with the count function's identity, plan, augmentation): resuming needs only its
step, on any number of ranks (the same global batch) and workers. Each logged step carries the sample hash and a hash
of the whole global batch's contents, pixels included, per sample in global order (the same on any world size).

Options that map one to one onto the library's configuration (their defaults: the text corpus on local disk):

- ``--chat {assistant,last_turn,all}``: the corpus as chat conversations (``train/vlm_corpus.py``'s
  :func:`~train.vlm_corpus.write_vlm_chat_corpus`: webdataset shards of ``KEY.json`` and numbered images, a tokenizer
  with Qwen2-VL's chat template) built with ``ChatConfig(policy=...)``: the stored loss mask keeps that policy's tokens,
  the labels are -100 elsewhere. The checkpoint's data fingerprint records the policy; a resume with another is refused.
- ``--shards URL``: the webdataset shards under that prefix (``s3://``, ``gs://``, ``az://`` or ``file://``; every
  ``*.tar`` object, in name order) instead of the generated corpus's (text, or conversations with ``--chat``); the
  tokenizer is still the generated one. Over a bucket, DataLoader workers start by ``forkserver`` (the store's client
  does not survive a fork once this process used it).
- ``--prefetch JSON``: a JSON object of :class:`~detsampler.loader.PrefetchConfig` fields (``'{}'``: its defaults):
  each process that reads batches fetches the blocks of its next micro batches' images ahead, in a bounded cache (over
  local shards it does nothing: they are read in place).
"""

from __future__ import annotations

if __name__ == "__main__":  # NOTE: before torch is imported (seconds), so that a launcher killed meanwhile is noticed
    from train.guard import exit_with_launcher

    exit_with_launcher()

import argparse
import dataclasses
import hashlib
import json
import multiprocessing
import os
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from detsampler import DataFingerprint, Plan, check_resume
from detsampler.hashing import sample_hash
from detsampler.loader import DeterministicBatchSampler, PrefetchConfig
from detsampler.loader.dataset import collate_micro_batch
from detsampler.loader.vlm import FlipJitter, VLMDataset
from detsampler.media import MediaLayoutConfig, Qwen2VLCounts
from train import checkpoint as ckpt
from train.metrics import MetricsLog

__all__ = [
    "COUNTS",
    "batch_hashes",
    "build_data",
    "build_index",
    "listed_shards",
    "main",
    "prefetch_config",
    "tiny_qwen2_vl",
]

ROOT = Path(__file__).resolve().parent.parent
COUNTS = Qwen2VLCounts(min_pixels=4 * 28 * 28, max_pixels=64 * 28 * 28)  # at most 256 patches, 64 tokens an image
AUGMENT = {"kind": "FlipJitter", "flip": 0.5, "brightness": 0.2, "seed": 0}
CHAT_POLICIES = ("assistant", "last_turn", "all")  # ChatConfig's policies for a messages column
LISTABLE = ("file", "s3", "gs", "gcs", "az", "abfs", "abfss")  # the schemes whose prefixes a store lists


def prefetch_config(text: str) -> PrefetchConfig:
    """``--prefetch``: a JSON object of :class:`PrefetchConfig` fields (``{}``: its defaults), each passed as is."""
    allowed = sorted(f.name for f in dataclasses.fields(PrefetchConfig))
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        example = '{"block_bytes": 65536}'
        raise argparse.ArgumentTypeError(f"{text!r} is not JSON ({exc}); give an object of PrefetchConfig fields,"
                                         f" e.g. '{example}' ({', '.join(allowed)})") from None  # fmt: skip
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"got {type(value).__name__} {value!r}, not an object of PrefetchConfig"
                                         f" fields ({', '.join(allowed)}; '{{}}' for its defaults)")  # fmt: skip
    unknown = sorted(set(value) - set(allowed))
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown PrefetchConfig field(s) {unknown}; its fields are {allowed}")
    try:
        return PrefetchConfig(**value)
    except (TypeError, ValueError) as exc:
        raise argparse.ArgumentTypeError(" ".join(str(exc).split())) from None


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m train.train_vlm", description=__doc__.split("\n")[0])
    p.add_argument("--run-dir", required=True)
    p.add_argument("--resume", default="auto", choices=["auto", "none"])
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--every", type=int, default=8, help="checkpoint every this many steps")
    p.add_argument("--global-batch-size", type=int, default=8)
    p.add_argument("--micro-batch-size", type=int, default=2, help="per rank")
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--max-patches", type=int, default=1024)
    p.add_argument("--num-workers", type=int, default=1)
    p.add_argument("--corpus", default=str(ROOT / ".cache" / "vlm-corpus"))
    p.add_argument("--documents", type=int, default=400)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--chat", choices=CHAT_POLICIES, default=None,
                   help="the corpus as chat conversations under this loss policy (ChatConfig.policy);"
                        " default: text")  # fmt: skip
    p.add_argument("--shards", metavar="URL", default=None,
                   help="read the webdataset shards under this prefix (s3://, gs://, az://, file://: every *.tar in"
                        " name order) instead of the generated corpus's")  # fmt: skip
    p.add_argument("--prefetch", metavar="JSON", type=prefetch_config, default=None,
                   help="prefetch each micro batch's image blocks ahead: a JSON object of PrefetchConfig fields ('{}':"
                        " its defaults, e.g. '{\"block_bytes\": 65536, \"threads\": 4}'); default: off")  # fmt: skip
    return p.parse_args(argv)


def setup() -> tuple[int, int]:
    """torch.distributed over gloo (torchrun's env, or a one-process group); deterministic CPU kernels."""
    # NOTE: the model returns its output as a view; nothing here changes it in place (the loss reads a copy)
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
    if "RANK" not in os.environ:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})  # fmt: skip
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    return dist.get_rank(), dist.get_world_size()


def listed_shards(url: str) -> list[str]:
    """Every ``*.tar`` object under the prefix ``url`` (a bucket's, or a local directory's), in name order: URLs in a
    bucket, paths on local disk. None there, or a prefix no store lists, is a ValueError naming ``url``."""
    from detsampler.storage import store_for
    from detsampler.storage.urls import parse_location

    try:
        scheme = parse_location(url).scheme
    except ValueError as exc:
        raise ValueError(f"--shards {url!r}: {exc}") from None
    if scheme not in LISTABLE:
        raise ValueError(f"--shards {url!r}: a {scheme}:// location cannot be listed; give a prefix of"
                         f" {', '.join(s + '://' for s in LISTABLE)} shards")  # fmt: skip
    found = store_for(url).list(url)
    shards = sorted(name for name in found if name.endswith(".tar"))
    if not shards:
        some = ", ".join(found[:3]) + (", ..." if len(found) > 3 else "")
        listed = f"{len(found)} other object(s)" + (f": {some}" if found else "")
        raise ValueError(f"--shards {url!r}: no *.tar object under it ({listed}); give the prefix the webdataset"
                         " shards were written under")  # fmt: skip
    return shards


def _corpus(args: argparse.Namespace) -> tuple[list, Any, Path]:
    """The shards (the generated corpus's, or ``--shards``'), the tokenizer and the media index's cache directory;
    text, or conversations under ``--chat``."""
    from train.vlm_corpus import make_vlm_chat_tokenizer, make_vlm_tokenizer, write_vlm_chat_corpus, write_vlm_corpus

    root = Path(args.corpus) / "chat" if args.chat else Path(args.corpus)
    if args.shards is None:
        shards, tokenizer = (write_vlm_chat_corpus if args.chat else write_vlm_corpus)(args.corpus, args.documents)
    else:
        shards = listed_shards(args.shards)
        tokenizer = (make_vlm_chat_tokenizer if args.chat else make_vlm_tokenizer)(root / "tokenizer")
    return shards, tokenizer, root / "cache"


def build_index(args: argparse.Namespace) -> Any:
    """The media index of the corpus (its chat policy's mask with ``--chat``), built once, then opened from cache."""
    from detsampler.media.build import build_media_index
    from detsampler.media.sources import webdataset_source
    from detsampler.text.chat import ChatConfig

    shards, tokenizer, cache = _corpus(args)
    chat = None if args.chat is None else ChatConfig(policy=args.chat)
    source = webdataset_source(shards, cache_dir=cache, messages_extension="json" if args.chat else None)
    return build_media_index(source, tokenizer, COUNTS, cache_dir=cache, chat=chat)


def _in_bucket(args: argparse.Namespace) -> bool:
    from detsampler.storage import is_remote

    return args.shards is not None and is_remote(args.shards)


def worker_start_method(args: argparse.Namespace) -> str | None:
    """How DataLoader workers start: ``forkserver`` (``spawn`` where there is none) over shards in a bucket (the
    store's client does not survive a fork once this process used it), else the platform's default (None)."""
    if not _in_bucket(args):
        return None
    return "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"


def reads_line(args: argparse.Namespace, num_shards: int) -> str | None:
    """One line on how the shards are read when they are ``--shards`` or prefetched, else None."""
    if args.shards is None and args.prefetch is None:
        return None
    corpus = Path(args.corpus).resolve() / ("chat" if args.chat else "") / "shards"
    where = f"{args.shards.rstrip('/')}/" if args.shards else f"{corpus}/"
    fetch = "no prefetch"
    if args.prefetch is not None and not _in_bucket(args):
        fetch = "--prefetch does nothing: local shards are read in place"
    elif args.prefetch is not None:
        c = args.prefetch
        fetch = (f"images prefetched: budget {c.budget_bytes:,} B, cache {c.cache_bytes:,} B, {c.threads} threads,"
                 f" {c.block_bytes:,} B blocks")  # fmt: skip
    by = "the training process" if args.num_workers == 0 else f"each of {args.num_workers} DataLoader workers"
    started = "" if args.num_workers == 0 else f" started by {worker_start_method(args) or 'the platform default'}"
    return f"reads {num_shards} shards at {where} ({fetch}) in {by}{started}"


def build_data(args: argparse.Namespace, world_size: int, rank: int) -> tuple[VLMDataset, Plan, dict]:
    """The corpus and its media index (made by rank 0 first, then opened by the others), the two-axis layout, the
    plan, the VLM dataset and the data fingerprint (with ``--chat``, its policy under ``"chat"``)."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    index = None
    for turn in (0, 1):
        if (rank == 0) == (turn == 0):
            index = build_index(args)
        dist.barrier()
    layout = index.layout(MediaLayoutConfig(seq_len=args.seq_len, max_patches=args.max_patches, window_docs=256))
    plan = Plan(layout.num_samples, seed=0, global_batch_size=args.global_batch_size,
                micro_batch_size=args.micro_batch_size, world_size=world_size)  # fmt: skip
    augment = FlipJitter(AUGMENT["flip"], AUGMENT["brightness"])
    processor = Qwen2VLImageProcessorPil(**COUNTS.processor_kwargs())
    dataset = VLMDataset(index, layout, processor, plan=plan, seed=AUGMENT["seed"], augment=augment, rope="qwen2_vl",
                         prefetch=args.prefetch)  # fmt: skip
    chat = {} if args.chat is None else {"chat": args.chat}  # absent for text: a text run's fingerprint unchanged
    fingerprint = {**DataFingerprint.of(index, layout, plan).to_dict(), "augment": AUGMENT, **chat}
    return dataset, plan, fingerprint


def tiny_qwen2_vl(vocab_size: int, image_token_id: int) -> torch.nn.Module:
    """A 2-layer Qwen2-VL (a 2-block vision tower) from its config, initialised from seed 0 on every rank."""
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    config = Qwen2VLConfig(
        text_config={"vocab_size": vocab_size, "bos_token_id": 0, "eos_token_id": 0, "hidden_size": 64,
                     "intermediate_size": 128, "num_hidden_layers": 2,
                     "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 4096,
                     "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]}},
        vision_config={"depth": 2, "embed_dim": 32, "hidden_size": 64, "num_heads": 4, "mlp_ratio": 2,
                       "patch_size": COUNTS.patch_size, "spatial_merge_size": COUNTS.merge_size,
                       "temporal_patch_size": COUNTS.temporal_patch_size},
        image_token_id=image_token_id, video_token_id=vocab_size - 1,  # no video: an id its mask never meets
    )  # fmt: skip
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return Qwen2VLForConditionalGeneration(config)


def shard(model: torch.nn.Module, world_size: int) -> torch.nn.Module:
    """FSDP2: each decoder layer and vision block, then the root."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world_size,))
    for block in [*model.model.language_model.layers, *model.model.visual.blocks]:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def batch_hashes(batch: dict[str, torch.Tensor]) -> list[bytes]:
    """One sha256 per sample of a micro batch: its input ids, labels, rope positions, and its images' grids and pixel
    rows (bytes): what the model trains on, whatever the world size."""
    patches = (batch["image_grid_thw"].prod(dim=1)).tolist()
    per_sample = batch["images_per_sample"].tolist()
    out, image, row = [], 0, 0
    for b, n in enumerate(per_sample):
        h = hashlib.sha256()
        for key in ("input_ids", "labels"):
            h.update(batch[key][b].numpy().tobytes())
        h.update(batch["position_ids"][:, b].numpy().tobytes())
        rows = sum(patches[image : image + n])
        h.update(batch["image_grid_thw"][image : image + n].numpy().tobytes())
        h.update(batch["pixel_values"][row : row + rows].numpy().tobytes())
        image, row = image + n, row + rows
        out.append(h.digest())
    return out


def _step_hash(micro_batches: list[dict], world_size: int) -> str:
    """The global batch's hash: every sample's, in global position order (micro step, rank, row)."""
    local = [batch_hashes(mb) for mb in micro_batches]
    gathered: list[Any] = [None] * world_size
    dist.all_gather_object(gathered, local)
    h = hashlib.sha256()
    for micro in range(len(local)):
        for rank in range(world_size):
            for digest in gathered[rank][micro]:
                h.update(digest)
    return h.hexdigest()[:12]


def _loss_sums(model: torch.nn.Module, micro_batches: list[dict], world_size: int) -> tuple[float, int]:
    """Forward and backward of every micro batch; the gradient is that of (the global batch's summed token loss) /
    (its global count of labels), however the labels fall on the ranks (FSDP averages over them)."""
    count = torch.tensor(float(sum(int((mb["labels"] != -100).sum()) for mb in micro_batches)), dtype=torch.float64)
    dist.all_reduce(count)
    scale = world_size / count.clamp(min=1).to(torch.float32)
    total = torch.zeros((), dtype=torch.float64)
    for a, mb in enumerate(micro_batches):
        model.set_requires_gradient_sync(a == len(micro_batches) - 1)
        logits = model(input_ids=mb["input_ids"], position_ids=mb["position_ids"], pixel_values=mb["pixel_values"],
                       image_grid_thw=mb["image_grid_thw"]).logits  # fmt: skip
        loss = F.cross_entropy(logits.flatten(0, 1).float(), mb["labels"].flatten(), ignore_index=-100, reduction="sum")
        (loss * scale).backward()
        total += loss.detach().to(torch.float64)
    dist.all_reduce(total)
    return float(total / count), int(count)


def _resume(args, run_dir: Path, model, optimizer, scheduler, fingerprint: dict, rank: int) -> tuple[int, Path | None]:
    latest = ckpt.latest_checkpoint(run_dir / "checkpoints") if args.resume == "auto" else None
    if latest is None:
        return 0, None
    meta = ckpt.load_checkpoint(latest, model, optimizer, scheduler)
    saved = meta["data"]
    if saved.get("augment") != fingerprint["augment"]:
        raise ValueError(f"the checkpoint's augmentation {saved.get('augment')} differs from {fingerprint['augment']}")
    if saved.get("chat") != fingerprint.get("chat"):
        was, now = _chat_flag(saved.get("chat")), _chat_flag(fingerprint.get("chat"))
        raise ValueError(f"{latest}: the checkpoint was trained with {was}, this run reads {now}: the loss"
                         f" mask of every step already trained would change; resume with {was}, or start a new"
                         " run")  # fmt: skip
    # the index's identity holds the chat policy too: check_resume refuses another one by itself
    check_resume({k: v for k, v in saved.items() if k not in ("augment", "chat")},
                 {k: v for k, v in fingerprint.items() if k not in ("augment", "chat")}, meta["step"])  # fmt: skip
    return meta["step"], latest


def _chat_flag(policy: str | None) -> str:
    return "the text corpus (no --chat)" if policy is None else f"--chat {policy}"


def train(args: argparse.Namespace) -> None:
    rank, world = setup()
    run_dir = Path(args.run_dir)
    dataset, plan, fingerprint = build_data(args, world, rank)
    model = shard(tiny_qwen2_vl(dataset.index.vocab_size, dataset.index.image_token_id), world)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0, foreach=False)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 4))
    start, resumed = _resume(args, run_dir, model, optimizer, scheduler, fingerprint, rank)
    metrics = MetricsLog(run_dir, enabled=rank == 0)
    event = {"world_size": world, "num_workers": args.num_workers, "data_fingerprint": fingerprint["hash"]}
    metrics.write({"event": "start", "step": 0, **event} if resumed is None else
                  {"event": "resumed_from", "step": start, "checkpoint": str(resumed), **event})  # fmt: skip
    if rank == 0:
        layout = dataset.layout.describe()
        print(f"{'resuming from ' + str(resumed) + ' at' if resumed else 'starting at'} step {start}, training to"
              f" step {args.steps} on {world} rank(s) x {args.num_workers} worker(s) | {layout['num_samples']} samples"
              f" of {layout['seq_len']} tokens, LLM fill {layout['llm_fill']:.3f}, vision fill"
              f" {layout['vision_fill']:.3f}{'' if args.chat is None else ' | chat policy ' + args.chat} |"
              f" fingerprint {fingerprint['hash']}", flush=True)  # fmt: skip
        line = reads_line(args, len(dataset.index.meta["sources"]) - 1)
        if line is not None:
            print(line, flush=True)
    sampler = DeterministicBatchSampler(plan, rank=rank, start_step=start, stop_step=args.steps)
    context = worker_start_method(args) if args.num_workers > 0 else None
    loader = torch.utils.data.DataLoader(dataset, batch_sampler=sampler, num_workers=args.num_workers,
                                         collate_fn=collate_micro_batch, multiprocessing_context=context)  # fmt: skip
    model.train()
    t_last = time.perf_counter()
    for step, micro_batches in sampler.steps(loader):
        ckpt.kill_point("before_step", step)
        loss, tokens = _loss_sums(model, micro_batches, world)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        now = time.perf_counter()
        images = sum(int(mb["image_grid_thw"].shape[0]) for mb in micro_batches)
        record = {"event": "step", "step": step, "loss": loss, "tokens": tokens, "step_ms": 1000 * (now - t_last),
                  "sample_hash": sample_hash(plan.global_batch(step)), "tokens_hash": _step_hash(micro_batches, world),
                  "images": images, "world_size": world}  # fmt: skip
        t_last = now
        metrics.write(record)
        if rank == 0:
            print(f"step {step:4d} | loss {loss:.4f} | samples {record['sample_hash']} | batch (pixels included)"
                  f" {record['tokens_hash']}", flush=True)  # fmt: skip
        if (step + 1) % args.every == 0 or step + 1 == args.steps:
            path = ckpt.save_checkpoint(run_dir / "checkpoints", step + 1, model, optimizer, scheduler, fingerprint,
                                        keep=10, extra={"world_size": world})  # fmt: skip
            if rank == 0:
                print(f"checkpoint {path} (resumes at step {step + 1})", flush=True)
    metrics.close()
    dist.destroy_process_group()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        train(args)
    except ValueError as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr, flush=True)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
