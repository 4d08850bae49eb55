"""Review 37: a prefetch configuration whose cache cannot hold what the plan reads at once (one micro batch's blocks,
or the micro batches fetched ahead) thrashes: every block is right and memory bounded, but blocks are dropped before
they are read and fetched again (a cache of 2 blocks over a 3.3 MB Megatron file fetched 10x the file in 20 micro
batches). The prefetcher knows each micro batch's blocks from the plan: it says so once per process, in one warning
line naming the need, the cap and the setting to raise, and counts it in ``prefetch_stats()``.

Against moto's S3 server on loopback (the session's)."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from detsampler.index.sources import open_source
from detsampler.layout import LayoutConfig
from detsampler.loader import DeterministicBatchSampler, PackedDataset, PrefetchConfig
from detsampler.plan import Plan
from detsampler.reads import worker_reads
from tests.test_bucket_opens import _source_files, _upload
from tests.test_sharded_sources import EOS

KIB = 1024
BLOCK = 64 * KIB
CONFIG = LayoutConfig(kind="concat", seq_len=64, seed=1)
STEPS = 10  # 20 micro batches of 4 samples


@pytest.fixture(scope="module")
def megatron(s3_bucket, tmp_path_factory):
    """``(local, remote, plan, size)``: a 3.3 MB Megatron ``.bin`` of 80,000 short documents, uploaded; a plan of 2
    micro batches of 4 samples a step; the size of its ``.bin``."""
    root = tmp_path_factory.mktemp("thrash")
    path = _source_files("megatron", root / "data", num_docs=80000)
    url = f"{s3_bucket}/thrash"
    _upload(root / "data", url)
    local = open_source("megatron", path, eos_id=EOS)
    remote = open_source("megatron", f"{url}/{path.name}", eos_id=EOS)
    plan = Plan(local.layout(CONFIG).num_samples, seed=9, global_batch_size=8, micro_batch_size=4)
    return local, remote, plan, (root / "data" / f"{path.name}.bin").stat().st_size


def _needs(local, plan: Plan, size: int) -> list[int]:
    """The bytes of the distinct 64 KiB blocks of the ``.bin`` each of the 20 micro batches reads (by arithmetic over
    the token ranges its samples read: uint16 tokens from byte 0)."""
    reads = worker_reads(plan, local.layout(CONFIG), local.offsets, local.lengths, 0, (0, 0), 2 * STEPS)
    out = []
    for i in range(len(reads)):
        lo, hi = int(reads.span_offsets[i]), int(reads.span_offsets[i + 1])
        starts, stops = reads.starts[lo:hi], reads.stops[lo:hi]
        some = stops > starts
        first, last = starts[some] * 2 // BLOCK, (stops[some] * 2 - 1) // BLOCK
        blocks = np.unique(np.concatenate([np.arange(a, b + 1) for a, b in zip(first, last)]))
        out.append(int(np.minimum((blocks + 1) * BLOCK, size).sum() - (blocks * BLOCK).sum()))
    return out


def _run(remote, plan: Plan, ahead: PrefetchConfig, caplog) -> tuple[list[str], object]:
    """The 20 micro batches read through ``ahead``; the prefetcher's warning lines and its stats."""
    dataset = PackedDataset(remote, remote.layout(CONFIG), prefetch=ahead, plan=plan)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="detsampler.prefetch"):
        for ids in DeterministicBatchSampler(plan, 0, stop_step=STEPS):
            dataset.get_batch(ids)
    stats = dataset.prefetch_stats()
    dataset.close()
    return [r.getMessage() for r in caplog.records if r.name == "detsampler.prefetch"], stats


def test_a_cache_that_cannot_hold_one_micro_batch_says_so_once_naming_the_need_and_the_cap(megatron, caplog):
    # before: no line at all; 20 micro batches fetched 30 MB in 77 ranged reads (9x the 3.3 MB file, 396 blocks
    # bypassed) where a 4 MiB cache fetched the file once
    local, remote, plan, size = megatron
    needs = _needs(local, plan, size)
    ahead = PrefetchConfig(budget_bytes=128 * KIB, cache_bytes=128 * KIB, threads=2)
    lines, stats = _run(remote, plan, ahead, caplog)
    first = next(i for i, need in enumerate(needs) if need > ahead.cache_bytes)
    step, micro = divmod(first, 2)
    assert lines == [
        f"prefetch: rank 0 worker 0 of 1: the micro batch at step {step} micro step {micro} reads {needs[first]} bytes"
        f" of blocks at once, more than the cache holds (cache_bytes {ahead.cache_bytes}): its blocks are dropped"
        f" before they are read and fetched again; give PrefetchConfig(cache_bytes >= {needs[first]})"
    ], lines
    assert stats.served == 20 and stats.over_cap == sum(need > ahead.cache_bytes for need in needs) > 0
    assert stats.peak_need_bytes == max(needs)
    assert stats.fetched_bytes > 5 * size and stats.cache["bypassed"] > 0  # the cause: blocks fetched again


def test_a_cache_that_holds_every_micro_batch_says_nothing_and_fetches_the_file_once(megatron, caplog):
    local, remote, plan, size = megatron
    needs = _needs(local, plan, size)
    ahead = PrefetchConfig(budget_bytes=128 * KIB, cache_bytes=4 << 20, threads=2)
    lines, stats = _run(remote, plan, ahead, caplog)
    assert lines == [] and stats.over_cap == 0 and stats.peak_need_bytes == max(needs)
    assert stats.fetched_bytes <= size and stats.cache["bypassed"] == 0


def test_micro_batches_fetched_ahead_beyond_the_cache_say_so_once_naming_what_they_need(megatron, caplog):
    # every micro batch fits the cache, but two admitted at once (the one read and the next) do not: the next one's
    # blocks are dropped as they land and fetched again when it is read. Before: no line at all
    local, remote, plan, size = megatron
    needs = _needs(local, plan, size)
    cap = -(-max(needs) // BLOCK) * BLOCK  # the largest micro batch, in whole blocks
    ahead = PrefetchConfig(budget_bytes=cap, cache_bytes=cap, threads=2)
    lines, stats = _run(remote, plan, ahead, caplog)
    assert len(lines) == 1 and stats.over_cap == 0, lines
    both = lines[0].split(" read ")[1].split(" bytes")[0]
    assert lines[0] == (
        f"prefetch: rank 0 worker 0 of 1: the 2 micro batches fetched ahead from step 0 micro step 0 read {both} bytes"
        f" of blocks at once, more than the cache holds (cache_bytes {cap}): blocks fetched ahead are dropped before"
        f" they are read and fetched again; give PrefetchConfig(cache_bytes >= {both})"
    ), lines
    assert cap < int(both) <= needs[0] + needs[1] and stats.peak_window_bytes >= int(both)
    assert stats.fetched_bytes > size  # the cause: blocks fetched again (a cache of the whole file fetches it once)


def test_the_trainers_summary_says_the_plan_needed_more_than_the_cache_holds(megatron, small_tokenizer, tmp_path):
    # before: "cache 40 hits, 221 misses, peak 131,072 of 131,072 bytes": nothing said that blocks were fetched again
    from train.config import load_config
    from train.data import build_pipeline

    local, remote, plan, size = megatron

    def summary(cache_bytes: int) -> str:
        cfg = tmp_path / "c.toml"
        cfg.write_text(
            f'[data]\nseq_len = 64\nglobal_batch_size = 8\nmicro_batch_size = 4\ncache_dir = "{tmp_path}"\n'
            f'source = "megatron:{remote.path}"\nadd_eos = "virtual"\ntokenizer = "{small_tokenizer.path}"\n'
            f"prefetch = {{budget_bytes = {128 * KIB}, cache_bytes = {cache_bytes}, threads = 2}}\n"
        )
        pipe = build_pipeline(load_config(cfg).data, world_size=1)
        assert len(list(pipe.loader(pipe.sampler(0, 0, STEPS), pin_memory=False, persistent_workers=False))) == 20
        line, stats = pipe.prefetch_summary(), pipe.dataset.prefetch_stats()
        pipe.close()
        return line, stats

    (small, stats), (large, _) = summary(128 * KIB), summary(4 << 20)
    need = max(stats.peak_need_bytes, stats.peak_window_bytes)
    assert stats.over_cap > 0 and small.endswith(
        f"; {stats.over_cap} micro batch(es) needed more blocks than the cache holds, up to {need:,} bytes at once:"
        f" blocks fetched again (raise cache_bytes to >= {need:,})"
    ), small
    assert "than the cache holds" not in large and large.endswith(" ms for blocks"), large
