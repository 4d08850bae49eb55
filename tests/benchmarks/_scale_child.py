"""One contender of benchmark 7 in a fresh interpreter: build its index over the synthetic corpus in ``data`` (cold, or
from its warm cache for a resume), take its first micro batch at ``step``, then read random micro batches.

Reads its arguments as JSON on stdin: ``contender``, ``data`` (a directory written by ``bench_scale.write_corpus``),
``step``, ``cold`` (remove the contender's cache first), ``random_batches``; prints one JSON line: ``first_batch_s``
(from nothing built in this process to the first micro batch at ``step`` in hand), ``rss_growth`` (peak resident size
reached meanwhile minus the size before; the peak mark is reset through ``/proc/self/clear_refs``), ``cache_bytes``
(what the contender wrote to disk for its index), ``random_tokens_per_s`` (input tokens of random micro batches read one
by one).
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np

from tests.benchmarks import peers
from tests.benchmarks._sampler_child import _reset_peak, _status_bytes
from tests.benchmarks.common import peak_rss_bytes

SEQ_LEN = 2048
MICRO_BATCH = 8
WEIGHTS = [0.5, 0.3, 0.2]  # the mixture rows: three sources over the same documents


def _meta(data: Path) -> dict:
    return json.loads((data / "meta.json").read_text())


def _det_index(data: Path):
    """detsampler's TokenIndex over the same files: stored lengths exclude the EOS, which detsampler keeps virtual."""
    from detsampler.index import TokenIndex

    meta = _meta(data)
    lengths = np.load(data / "det_lengths.npy", mmap_mode="r")
    offsets = np.load(data / "det_offsets.npy", mmap_mode="r")
    tokens = np.memmap(data / "corpus.bin", dtype=np.uint16, mode="r")
    index_meta = {
        "num_documents": len(lengths),
        "num_tokens": int(meta["num_tokens"]),
        "tokenizer": {"vocab_size": meta["vocab"], "eos_id": meta["eos_id"], "pad_id": meta["eos_id"]},
        "store_tokens": True,
        "text_column": "text",
        "cache_key": f"bench-scale-{len(lengths)}",
    }
    return TokenIndex(data / "det", index_meta, lengths, offsets, tokens)


def _detsampler(data: Path, kind: str, cold: bool):
    """(first micro batch at step k, random micro batch reader) for a detsampler layout or a three-source mixture."""
    from detsampler import DeterministicBatchSampler, LayoutConfig, Mixture, Plan
    from detsampler.loader.dataset import PackedDataset
    from detsampler.loader.mixture_dataset import MixtureDataset

    if cold:
        shutil.rmtree(data / "det" / "layouts", ignore_errors=True)
    (data / "det").mkdir(exist_ok=True)
    index = _det_index(data)
    layout = index.layout(LayoutConfig(kind="bestfit" if kind == "bestfit" else "concat", seq_len=SEQ_LEN))
    ds = PackedDataset(index, layout)
    if kind == "mixture":
        mixture = Mixture([layout, layout, layout], WEIGHTS, seed=0)
        ds = MixtureDataset([ds, ds, ds], mixture)
        plan = Plan(source=mixture, seed=0, global_batch_size=MICRO_BATCH, micro_batch_size=MICRO_BATCH)
    else:
        plan = Plan(len(ds), seed=0, global_batch_size=MICRO_BATCH, micro_batch_size=MICRO_BATCH)

    def batch(step: int):
        ids = next(iter(DeterministicBatchSampler(plan, rank=0, start_step=step, stop_step=step + 1)))
        return ds.__getitems__(ids)

    return batch, batch, (data / "det").glob("**/*")


def _megatron(data: Path, kind: str, cold: bool):
    meta = _meta(data)
    cache = data / f"megatron-cache-{kind}"
    if cold:
        shutil.rmtree(cache, ignore_errors=True)
    samples = int(meta["num_tokens"] + meta["num_documents"]) // SEQ_LEN - 1
    prefix = data / "corpus"
    if kind == "blend":
        ds = peers.megatron_blended_dataset(
            [prefix] * 3, WEIGHTS, samples, SEQ_LEN, meta["vocab"], meta["eos_id"], cache
        )
    else:
        ds = peers.megatron_gpt_dataset(prefix, samples, SEQ_LEN, meta["vocab"], meta["eos_id"], cache)

    def batch(step: int):
        return [ds[step * MICRO_BATCH + j] for j in range(MICRO_BATCH)]

    return batch, batch, cache.glob("**/*")


def _olmo(data: Path, kind: str, cold: bool):
    meta = _meta(data)
    work = data / "olmo-work"
    if cold:
        shutil.rmtree(work, ignore_errors=True)
    work.mkdir(exist_ok=True)
    ds = peers.olmo_fsl_dataset([data / "corpus.bin"], SEQ_LEN, meta["vocab"], meta["eos_id"], meta["eos_id"], work)
    loader = peers.olmo_fsl_loader(ds, MICRO_BATCH * SEQ_LEN, work)

    def resume(step: int):
        """The trainer's path: load a state dict that has ``step`` batches processed, reshuffle, take the next batch."""
        state = loader.state_dict()
        state.update(batches_processed=step, tokens_processed=step * MICRO_BATCH * SEQ_LEN, epoch=1)
        loader.load_state_dict(state)
        loader.reshuffle(epoch=1)
        return next(iter(loader))

    def random(step: int):
        return loader[step]  # its random access to a batch of the current epoch

    return resume, random, work.glob("**/*")


CONTENDERS = {
    "detsampler concat": lambda d, c: _detsampler(d, "concat", c),
    "detsampler bestfit": lambda d, c: _detsampler(d, "bestfit", c),
    "detsampler Mixture (3 sources)": lambda d, c: _detsampler(d, "mixture", c),
    "Megatron GPTDataset": lambda d, c: _megatron(d, "gpt", c),
    "Megatron BlendedDataset (3 sources)": lambda d, c: _megatron(d, "blend", c),
    "OLMo-core NumpyFSLDataset + NumpyFSLDataLoader": lambda d, c: _olmo(d, "fsl", c),
}


def _preload() -> None:
    """Import every contender's modules before the clock starts (an import is not part of an index build); a peer that
    is not installed fails its own run later, not the others'."""
    import contextlib
    import importlib

    for module in (
        "megatron.core.datasets.blended_megatron_dataset_builder",
        "megatron.core.datasets.gpt_dataset",
        "olmo_core.data",
        "torch.distributed",
        "detsampler.loader.dataset",
        "detsampler.loader.mixture_dataset",
    ):
        with contextlib.suppress(ImportError):
            importlib.import_module(module)


def run(contender: str, data: Path, step: int, cold: bool, random_batches: int) -> dict:
    import torch

    peers._quiet()
    _preload()
    # one thread, as in a DataLoader worker: torch's intra-op threads on 2 shared cores only add contention
    torch.set_num_threads(1)
    before = _status_bytes("VmRSS")
    reset = _reset_peak()
    t0 = time.perf_counter()
    first_batch, batch, cache_files = CONTENDERS[contender](data, cold)
    first_batch(step)
    first = time.perf_counter() - t0
    peak = _status_bytes("VmHWM") if reset else peak_rss_bytes()
    cache_bytes = sum(p.stat().st_size for p in cache_files if p.is_file())
    rng = np.random.default_rng(1)
    steps = rng.integers(0, max(1, step * 2), random_batches)
    t0 = time.perf_counter()
    for s in steps:
        batch(int(s))
    elapsed = time.perf_counter() - t0
    return {
        "first_batch_s": first,
        "rss_growth": (peak or 0) - (before or 0),
        "cache_bytes": cache_bytes,
        "random_tokens_per_s": random_batches * MICRO_BATCH * SEQ_LEN / elapsed if random_batches else None,
    }


def main() -> None:
    args = json.loads(sys.stdin.read())
    out = run(args["contender"], Path(args["data"]), int(args["step"]), bool(args["cold"]), int(args["random_batches"]))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
