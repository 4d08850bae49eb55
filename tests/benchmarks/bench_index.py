"""Index build and PackedDataset read throughput, measured side by side with raw sentencepiece encoding.

All numbers come from one run, on the same documents (the default corpus unless ``--data``) and the same cores:

- raw sentencepiece: ``Encode(texts, num_threads=1)`` and ``Encode(texts, num_threads=P)`` over every document;
- ``build_index(num_proc=P)`` from scratch (tokenize, write, fsync, checksum), in tokens/s;
- ``PackedDataset.get_batch`` over the plan's micro batches for each layout, in samples/s and tokens/s, with stored
tokens
  and on the fly (``store_tokens=False``), and through a DataLoader with the DeterministicBatchSampler;

and prints the ratios: build / raw encode, and packed read / raw encode (how much faster reading the index is than
tokenizing). Run: ``python -m tests.benchmarks.bench_index [--max-documents N] [--num-proc P]``.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Sequence

__all__ = ["main", "run"]


def _best_of(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def run(
    max_documents: int | None,
    num_proc: int,
    seq_len: int,
    micro_batch_size: int,
    micro_batches: int,
    cache_dir: str | None,
    vocab_size: int,
    repeat: int,
) -> dict:
    import torch
    from torch.utils.data import DataLoader

    from detsampler.index import build_index, default_cache_dir
    from detsampler.index.prepare import IndexConfig, load_dataset_for
    from detsampler.index.tokenize import BATCH_DOCS
    from detsampler.layout import LayoutConfig
    from detsampler.loader.dataset import PackedDataset, collate_micro_batch
    from detsampler.loader.sampler import DeterministicBatchSampler
    from detsampler.plan import Plan
    from detsampler.text.corpus import default_tokenizer

    torch.set_num_threads(1)
    cache = cache_dir or str(default_cache_dir())
    dataset = load_dataset_for(IndexConfig(max_documents=max_documents))
    tokenizer = default_tokenizer(cache, vocab_size=vocab_size)
    texts = dataset["text"]
    results: dict = {
        "documents": len(texts),
        "num_proc": num_proc,
        "cpu_count": os.cpu_count(),
        "seq_len": seq_len,
        "micro_batch_size": micro_batch_size,
    }

    # raw encode in the build's batches of documents (one huge call would mostly measure Python's GC on millions of
    # ints)
    chunks = [texts[i : i + BATCH_DOCS] for i in range(0, len(texts), BATCH_DOCS)]
    n_tokens = sum(len(doc) for chunk in chunks for doc in tokenizer.encode_batch(chunk))
    results["tokens"] = n_tokens
    raw1 = _best_of(lambda: [tokenizer.encode_batch(c, num_threads=1) for c in chunks], repeat)
    rawp = _best_of(lambda: [tokenizer.encode_batch(c, num_threads=num_proc) for c in chunks], repeat)
    results["raw_encode_tokens_per_s_1thread"] = n_tokens / raw1
    results["raw_encode_tokens_per_s"] = n_tokens / rawp

    with tempfile.TemporaryDirectory() as tmp:
        builds = []
        for i in range(repeat):
            t = time.perf_counter()
            index = build_index(
                dataset, tokenizer, cache_dir=os.path.join(tmp, f"b{i}"), num_proc=num_proc, progress=False
            )
            builds.append(time.perf_counter() - t)
        results["build_tokens_per_s"] = n_tokens / min(builds)
        lean = build_index(
            dataset,
            tokenizer,
            cache_dir=os.path.join(tmp, "lean"),
            num_proc=num_proc,
            store_tokens=False,
            progress=False,
        )
        results["layouts"] = {}
        for kind in ("concat", "document", "bestfit"):
            config = LayoutConfig(kind=kind, seq_len=seq_len)
            layout = index.layout(config)
            plan = Plan(
                layout.num_samples, seed=0, global_batch_size=micro_batch_size, micro_batch_size=micro_batch_size
            )
            batches = [plan.micro_batch(s, 0, 0) for s in range(micro_batches)]
            stored = PackedDataset(index, layout)
            fly = PackedDataset(lean, lean.layout(config), dataset=dataset, tokenizer=tokenizer)
            t_stored = _best_of(lambda: [stored.get_batch(b) for b in batches], repeat)
            n_fly = max(1, micro_batches // 8)
            t_fly = _best_of(lambda: [fly.get_batch(b) for b in batches[:n_fly]], 1)
            sampler = DeterministicBatchSampler(plan, 0, stop_step=micro_batches + 1)
            loader = iter(
                DataLoader(stored, batch_sampler=sampler, num_workers=num_proc, collate_fn=collate_micro_batch)
            )
            next(loader)  # workers started
            t = time.perf_counter()
            for _ in loader:
                pass
            t_loader = time.perf_counter() - t
            samples = micro_batches * micro_batch_size
            results["layouts"][kind] = {
                "samples_per_epoch": layout.num_samples,
                "stored_samples_per_s": samples / t_stored,
                "stored_tokens_per_s": samples * seq_len / t_stored,
                "on_the_fly_samples_per_s": n_fly * micro_batch_size / t_fly,
                "loader_samples_per_s": samples / t_loader,
            }
    return results


def report(r: dict) -> None:
    raw = r["raw_encode_tokens_per_s"]
    print(
        f"bench_index: {r['documents']:,} documents, {r['tokens']:,} tokens, num_proc={r['num_proc']} "
        f"(cpu_count={r['cpu_count']}), seq_len={r['seq_len']}, micro batch {r['micro_batch_size']}"
    )
    print(f"  raw sentencepiece encode, 1 thread      {r['raw_encode_tokens_per_s_1thread']:>14,.0f} tokens/s")
    print(f"  raw sentencepiece encode, {r['num_proc']} thread(s)   {raw:>14,.0f} tokens/s")
    print(
        f"  build_index, num_proc={r['num_proc']}           {r['build_tokens_per_s']:>14,.0f} tokens/s  ="
        f" {r['build_tokens_per_s'] / raw:.2f} x raw encode"
        f" ({r['build_tokens_per_s'] / r['raw_encode_tokens_per_s_1thread']:.2f} x 1 thread)"
    )
    print(
        f"  {'layout':<9} {'stored samples/s':>17} {'tokens/s':>14} {'x raw encode':>13} {'on-the-fly samples/s':>21} "
        f"{'DataLoader samples/s':>21}"
    )
    for kind, row in r["layouts"].items():
        print(
            f"  {kind:<9} {row['stored_samples_per_s']:>17,.0f} {row['stored_tokens_per_s']:>14,.0f} "
            f"{row['stored_tokens_per_s'] / raw:>12.1f}x {row['on_the_fly_samples_per_s']:>21,.0f} "
            f"{row['loader_samples_per_s']:>21,.0f}"
        )
    print(
        "  (x raw encode: tokens/s read from the index over tokens/s sentencepiece encodes; on the fly re-tokenizes"
        " whole documents, so it is bounded by raw encode)"
    )


def main(argv: Sequence[str] | None = None) -> dict:
    """Run the benchmark, print the table, return the numbers (for tests/benchmarks/run_all.py)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--max-documents", type=int, default=None, help="first N documents of the corpus (default: all)")
    p.add_argument(
        "--num-proc", type=int, default=min(4, os.cpu_count() or 1), help="processes / threads (default: %(default)s)"
    )
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--micro-batch-size", type=int, default=8)
    p.add_argument("--micro-batches", type=int, default=128)
    p.add_argument("--vocab-size", type=int, default=8000, help="default tokenizer's vocabulary (default: %(default)s)")
    p.add_argument(
        "--cache-dir", default=None, help="where the default tokenizer is cached (default: the detsampler cache)"
    )
    p.add_argument(
        "--repeat", type=int, default=1, help="timings are the best of this many runs (default: %(default)s)"
    )
    args = p.parse_args(argv)
    results = run(
        args.max_documents,
        args.num_proc,
        args.seq_len,
        args.micro_batch_size,
        args.micro_batches,
        args.cache_dir,
        args.vocab_size,
        args.repeat,
    )
    report(results)
    return results


if __name__ == "__main__":
    main()
