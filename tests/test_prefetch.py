"""Exact lookahead prefetch (issue 22 item 4): the future reads of the plan, the Belady and LRU block caches, and the
prefetching PackedDataset against moto's real S3 server on loopback.

The Belady cache's hits on known traces equal an exhaustive search over every policy that holds the blocks of the
micro batch being read (so no such policy told the same future misses less) and a brute-force rendering of its rule; no
cache ever holds more than its cap; prefetched batches equal the local ones byte for byte (concat and bestfit, 0 and 2
DataLoader workers); a resume on a fresh process with an empty cache fetches and says how much; a server that fails
mid-prefetch is a StorageError naming the object.
"""

from __future__ import annotations

import logging
import re
import shutil
import time
import weakref
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from detsampler.gather import token_ranges
from detsampler.index import TokenIndex
from detsampler.index.push import push_index
from detsampler.layout import LayoutConfig
from detsampler.loader import DeterministicBatchSampler, PackedDataset, PlannedIds, PrefetchConfig, collate_micro_batch
from detsampler.plan import Plan
from detsampler.reads import range_blocks, worker_reads, worker_start
from detsampler.storage import BlockedObject, StorageError, open_npy
from detsampler.storage.caches import NEVER, BeladyCache, LRUCache
from tests.index_copies import copy_with_layouts
from tests.more_servers import fault_proxy
from tests.s3_server import create_bucket, moto_server

KIB = 1024
CONFIGS = [LayoutConfig(kind="concat", seq_len=64, seed=1), LayoutConfig(kind="bestfit", seq_len=128, seed=3)]
# small: the cache holds 4 of the index's 7 blocks of 64 KiB, so blocks are evicted and fetched again
TIGHT = PrefetchConfig(budget_bytes=192 * KIB, cache_bytes=256 * KIB, threads=2)


def npy_bytes(arr: np.ndarray) -> bytes:
    import io

    buf = io.BytesIO()
    np.save(buf, arr)
    return buf.getvalue()


# -- the future reads (numpy core)


@given(st.lists(st.lists(st.tuples(st.integers(0, 200_000), st.integers(0, 3000)), max_size=5), max_size=6))
@example([[(65_472, 64)], [], [(0, 0), (1, 1)]])  # a range across a block boundary; an empty group; an empty range
def test_range_blocks_are_exactly_the_blocks_a_read_of_each_group_fetches(tmp_path_factory, groups):
    path = tmp_path_factory.mktemp("blocks") / "a.npy"
    if not path.exists():
        path.write_bytes(npy_bytes(np.arange(210_000, dtype=np.int64)))
    arr = open_npy(BlockedObject(str(path), path.stat().st_size, block_bytes=64 * KIB))
    flat = [(min(a, 209_999), min(min(a, 209_999) + n, 210_000)) for g in groups for a, n in g]
    starts = np.array([a for a, _ in flat], dtype=np.int64)
    stops = np.array([b for _, b in flat], dtype=np.int64)
    offsets = np.cumsum([0] + [len(g) for g in groups])
    bounds, blocks = range_blocks(starts, stops, offsets, itemsize=8, data_offset=arr.offset, block_bytes=64 * KIB)
    assert len(bounds) == len(groups) + 1
    for i in range(len(groups)):
        lo, hi = offsets[i], offsets[i + 1]
        want = arr.block_keys(starts[lo:hi], stops[lo:hi])  # RemoteArray's: exactly the blocks its read fetches
        assert [(arr.source.url, b) for b in blocks[bounds[i] : bounds[i + 1]].tolist()] == want


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.kind)
@pytest.mark.parametrize("num_workers", [1, 3])
def test_worker_reads_are_what_each_of_the_workers_micro_batches_reads(small_index, config, num_workers):
    layout = small_index.layout(config)
    plan = Plan(layout.num_samples, seed=5, global_batch_size=12, micro_batch_size=2, world_size=2)
    rank, start_step = 1, 3
    for worker in range(num_workers):
        position = worker_start(plan, rank, start_step, worker, num_workers)
        reads = worker_reads(
            plan, layout, small_index.offsets, small_index.lengths, rank, position, 7, stride=num_workers
        )
        everything, where = plan.micro_batches_from(start_step, 0, rank, 7 * num_workers + worker)
        assert (
            reads.positions == where[worker::num_workers][:7] and reads.next_position == where[worker + 7 * num_workers]
        )
        for i, (step, micro_step) in enumerate(reads.positions):  # each micro batch: what a read of it computes
            ids = plan.micro_batch(step, micro_step, rank)
            np.testing.assert_array_equal(reads.sample_ids[i], ids)
            np.testing.assert_array_equal(reads.sample_ids[i], everything[worker + i * num_workers])
            spans, doc_starts, doc_lengths = reads.batch(i)
            want = layout.locate(ids)
            for name in ("offsets", "doc_ids", "starts", "stops"):
                np.testing.assert_array_equal(getattr(spans, name), getattr(want, name))
            np.testing.assert_array_equal(doc_starts, np.asarray(small_index.offsets[want.doc_ids]))
            src, n = token_ranges(want, doc_starts, np.asarray(small_index.lengths[want.doc_ids]), False)
            lo, hi = reads.span_offsets[i], reads.span_offsets[i + 1]
            np.testing.assert_array_equal(reads.starts[lo:hi], src)
            np.testing.assert_array_equal(reads.stops[lo:hi], src + n)
            assert np.array_equal(doc_lengths, np.asarray(small_index.lengths[want.doc_ids]))


def test_worker_reads_stop_at_the_plans_stop_step(small_index):
    layout = small_index.layout(CONFIGS[0])
    plan = Plan(layout.num_samples, seed=0, global_batch_size=4, micro_batch_size=2)
    reads = worker_reads(plan, layout, small_index.offsets, small_index.lengths, 0, (2, 1), 10, stride=2, stop_step=5)
    assert reads.positions == [(2, 1), (3, 1), (4, 1)] and reads.next_position is None
    assert worker_start(plan, 0, 0, 1, 2) == (0, 1)


# -- the caches


def drive(cache, trace: list[list[int]], size: int = 1) -> int:
    """Read ``trace`` (micro batch ``t`` reads blocks ``trace[t]``) through ``cache`` on demand: at each micro batch,
    get its blocks, then put the missing ones (as a BlockedObject does); returns the hits."""
    if isinstance(cache, BeladyCache):
        for t, keys in enumerate(trace):
            cache.add_use(t, [("x", k) for k in keys])
    for t, keys in enumerate(trace):
        if isinstance(cache, BeladyCache):
            cache.advance(t)
        missing = [k for k in keys if cache.get(("x", k)) is None]
        for k in missing:
            cache.put(("x", k), bytes(size))
    return cache.hits


def optimum(trace: list[list[int]], cap: int) -> int:
    """The most hits of any policy over ``trace`` (``cap`` blocks of one size): at each miss it may hold the block,
    evicting any held one (when full), or not hold it; by exhaustive search over those choices (memoized on the blocks
    held before each micro batch)."""
    from functools import cache

    @cache
    def best(t: int, held: frozenset) -> int:
        if t == len(trace):
            return 0
        batch = set(trace[t])
        outcomes: set[frozenset] = set()

        def admit(missing: list[int], held: frozenset) -> None:
            if not missing:
                outcomes.add(held)
                return
            k, rest = missing[0], missing[1:]
            if len(held) < cap:  # holding one more never costs a hit: it can be evicted at any later choice
                admit(rest, held | {k})
                return
            admit(rest, held)
            for v in held:
                admit(rest, (held - {v}) | {k})

        admit(sorted(batch - held), held)
        return len(batch & held) + max(best(t + 1, after) for after in outcomes)

    return best(0, frozenset())


def belady_reference(trace: list[list[int]], cap: int) -> int:
    """The cache's rule written out by brute force (blocks of one size, ``cap`` of them): the blocks of micro batch
    ``t`` are got, then the missing ones offered, when every block read at ``t`` has been read (so its next use is after
    ``t``); next uses found by scanning the trace at every choice."""

    def next_use(k: int, t: int) -> int:
        return next((u for u in range(t + 1, len(trace)) if k in trace[u]), NEVER)

    held: list[int] = []
    hits = 0
    for t, keys in enumerate(trace):
        missing = [k for k in keys if k not in held]
        hits += len(keys) - len(missing)
        for k in missing:
            if len(held) < cap:
                held.append(k)
                continue
            victim = max(held, key=lambda h: next_use(h, t))
            if next_use(k, t) < next_use(victim, t) or next_use(k, t) == NEVER == next_use(victim, t):
                held.remove(victim)
                held.append(k)
    return hits


TRACE = [[0, 1], [2], [0], [3, 1], [0, 2], [4], [1], [3], [0, 4], [2], [1, 3], [0]]


@given(
    st.lists(st.lists(st.integers(0, 5), min_size=1, max_size=3, unique=True), min_size=1, max_size=9),
    st.integers(1, 4),
)
@example(TRACE, 2)
def test_belady_hits_equal_the_optimum_and_a_brute_force_reference(trace, cap):
    want = belady_reference(trace, cap)
    assert drive(BeladyCache(cap), trace) == want == optimum(trace, cap)
    assert drive(LRUCache(cap), trace) <= want


def test_belady_hits_on_a_known_trace():
    # 3 blocks held: Belady keeps what is read soonest; LRU loses a block read again after 3 others
    assert drive(BeladyCache(3), TRACE) == belady_reference(TRACE, 3) == optimum(TRACE, 3) == 9
    assert drive(LRUCache(3), TRACE) == 4
    long = [[int(k)] for k in np.random.default_rng(0).integers(0, 40, 3000)]  # (too long for the exhaustive search)
    assert drive(BeladyCache(10), long) == belady_reference(long, 10) == 1687
    assert drive(LRUCache(10), long) == 761


@given(st.lists(st.tuples(st.sampled_from(["get", "put", "advance"]), st.integers(0, 12), st.integers(0, 70))))
def test_no_cache_ever_holds_more_than_its_cap(ops):
    cap = 100
    for cache in (BeladyCache(cap), LRUCache(cap)):
        if isinstance(cache, BeladyCache):
            for t in range(0, 40):
                cache.add_use(t, [("x", (t * 7 + j) % 13) for j in range(3)])
        sizes, t, held = {}, 0, []
        for op, key, size in ops:
            if op == "get":
                cache.get(("x", key))
            elif op == "put":
                before = ("x", key) in cache
                cache.put(("x", key), bytes(size))
                if not before and ("x", key) in cache:
                    sizes[key] = size
            elif isinstance(cache, BeladyCache):
                t = min(t + key, 39)
                cache.advance(t)
            held = [k for k in range(13) if ("x", k) in cache]
            assert cache.held_bytes == sum(sizes[k] for k in held) <= cap
        assert cache.peak_bytes <= cap and cache.stats()["blocks"] == len(held)


def test_a_belady_cache_takes_uses_in_order_and_time_forward():
    cache = BeladyCache(10)
    cache.add_use(3, [("x", 1)])
    with pytest.raises(ValueError, match="Got use 2: uses are added in increasing order"):
        cache.add_use(2, [("x", 1)])
    cache.advance(3)
    with pytest.raises(ValueError, match="Got use 1, before the present use 3"):
        cache.advance(1)
    with pytest.raises(ValueError, match="Got cap_bytes=-1"):
        LRUCache(-1)


# -- the prefetching dataset against moto's S3 server


@pytest.fixture(scope="module")
def pushed(small_index, s3_bucket, tmp_path_factory):
    """``(local, url)``: a copy of the small index with its concat and bestfit layouts persisted, pushed."""
    local = copy_with_layouts(small_index, tmp_path_factory.mktemp("prefetch"), CONFIGS)
    url = f"{s3_bucket}/prefetch/{local.path.name}"
    push_index(local.path, url)
    return local, url


def test_the_sampler_says_where_each_micro_batch_is(small_index):
    import pickle

    plan = Plan(100, seed=0, global_batch_size=4, micro_batch_size=2, world_size=2)
    ids = next(iter(DeterministicBatchSampler(plan, 1, start_step=3, stop_step=9)))
    assert isinstance(ids, PlannedIds) and ids == plan.micro_batch(3, 0, 1).tolist()
    back = pickle.loads(pickle.dumps(ids))
    assert (back, back.step, back.micro_step, back.rank, back.stop_step) == (ids, 3, 0, 1, 9)


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.kind)
def test_prefetched_batches_equal_the_local_ones_byte_for_byte(pushed, config, num_workers):
    local, url = pushed
    remote = TokenIndex.open(url)
    layout = remote.layout(config)
    plan = Plan(layout.num_samples, seed=7, global_batch_size=16, micro_batch_size=4, world_size=2)
    want = PackedDataset(local, local.layout(config))
    got = PackedDataset(remote, layout, prefetch=TIGHT, plan=plan)
    sampler = DeterministicBatchSampler(plan, 1, start_step=2, stop_step=14)
    context = "forkserver" if num_workers else None  # the parent read the bucket: a forked worker is refused
    loader = torch.utils.data.DataLoader(
        got,
        batch_sampler=sampler,
        num_workers=num_workers,
        collate_fn=collate_micro_batch,
        multiprocessing_context=context,
    )
    count = 0
    for (step, micro_step), batch in zip([(s, a) for s in range(2, 14) for a in range(2)], loader):
        ref = want.get_batch(plan.micro_batch(step, micro_step, 1))
        assert batch.keys() == ref.keys() and all(torch.equal(batch[k], ref[k]) for k in ref)
        count += 1
    assert count == 24
    if num_workers == 0:  # this process read them: every one from the plan, the cache within its cap
        stats = got.prefetch_stats()
        assert stats.served == 24 and stats.unplanned == 0
        assert stats.cache["peak_bytes"] <= TIGHT.cache_bytes and stats.cache["hits"] > 0
        got.close()


def test_a_worker_forked_after_the_parent_read_the_bucket_is_refused_not_hung(pushed):
    # obstore's runtime does not survive fork: the worker's first request waited forever (its blocks are not held, so
    # it reads the bucket: with prefetch, 64 KiB blocks fetched anew)
    local, url = pushed
    remote = TokenIndex.open(url)
    layout = remote.layout(CONFIGS[0])
    plan = Plan(layout.num_samples, seed=0, global_batch_size=4, micro_batch_size=4)
    dataset = PackedDataset(remote, layout, prefetch=TIGHT, plan=plan)
    loader = torch.utils.data.DataLoader(
        dataset,
        batch_sampler=DeterministicBatchSampler(plan, 0, stop_step=2),
        num_workers=1,
        collate_fn=collate_micro_batch,
        multiprocessing_context="fork",
    )
    with pytest.raises(StorageError, match="was forked from process .* multiprocessing_context='forkserver'"):
        next(iter(loader))


def test_a_resume_on_a_fresh_process_with_an_empty_cache_fetches_and_says_so(pushed, caplog):
    local, url = pushed
    config = CONFIGS[0]
    layout = local.layout(config)
    plan = Plan(layout.num_samples, seed=11, global_batch_size=4, micro_batch_size=4)
    sampler = DeterministicBatchSampler(plan, 0, stop_step=20)
    sampler.load_state_dict({"step": 12})  # what a checkpoint at step 12 restores
    remote = TokenIndex.open(url)  # a fresh node: nothing held
    big = PrefetchConfig(budget_bytes=1 << 20, cache_bytes=1 << 20, threads=2)  # room for every block: none twice
    dataset = PackedDataset(remote, remote.layout(config), prefetch=big, plan=plan)
    with caplog.at_level(logging.INFO, logger="detsampler.prefetch"):
        batches = list(torch.utils.data.DataLoader(dataset, batch_sampler=sampler, collate_fn=collate_micro_batch))
        dataset.close()  # waits for the fetches under way
    want = PackedDataset(local, layout)
    assert len(batches) == 8
    for step, batch in zip(range(12, 20), batches):
        assert all(torch.equal(batch[k], v) for k, v in want.get_batch(plan.micro_batch(step, 0, 0)).items())
    stats = dataset.prefetch_stats()
    source = dataset._prefetcher[1].objects[0]  # the tokens, read by 64 KiB blocks
    fetched = int(source._from_cache_ok.sum())  # the distinct blocks fetched and checked
    sizes = [min((b + 1) * source.block_bytes, source.size) - b * source.block_bytes for b in range(source.num_blocks)]
    assert stats.fetched_bytes == sum(s for b, s in enumerate(sizes) if source._from_cache_ok[b])  # none twice
    assert fetched >= 1 and stats.first_batch_bytes > 0 and stats.served == 8 and stats.cache["misses"] == 0
    lines = [r.getMessage() for r in caplog.records if r.name == "detsampler.prefetch"]
    assert lines[0].startswith("prefetch: rank 0 worker 0 of 1 starts at step 12 micro step 0 (cache 1048576 bytes,")
    assert (
        f"read its first micro batch (step 12, micro step 0) after fetching {stats.first_batch_bytes} bytes"
        in (lines[1])
    )


def test_a_server_that_fails_mid_prefetch_is_a_storage_error_naming_the_object(small_index, tmp_path, monkeypatch):
    monkeypatch.setenv("DETSAMPLER_STORAGE_MAX_RETRIES", "1")
    monkeypatch.setenv("DETSAMPLER_STORAGE_RETRY_TIMEOUT_S", "1")
    monkeypatch.setenv("DETSAMPLER_STORAGE_REQUEST_TIMEOUT_S", "2")
    dest = tmp_path / small_index.path.name
    shutil.copytree(small_index.path, dest, ignore=shutil.ignore_patterns("layouts", "*.lock"))
    local = TokenIndex.open(dest)
    local.layout(CONFIGS[0])
    with moto_server() as (endpoint, server):
        url = f"{create_bucket(endpoint, 'fails-mid-prefetch')}/{dest.name}"
        push_index(dest, url)
        remote = TokenIndex.open(url)
        layout = remote.layout(CONFIGS[0])
        plan = Plan(layout.num_samples, seed=0, global_batch_size=4, micro_batch_size=4)
        small = PrefetchConfig(budget_bytes=64 * KIB, cache_bytes=64 * KIB, threads=1)  # a block or so ahead
        dataset = PackedDataset(remote, layout, prefetch=small, plan=plan)
        batches = iter(DeterministicBatchSampler(plan, 0))
        dataset.get_batch(next(batches))
        server.stop()
        with pytest.raises(
            StorageError, match=rf"{url}/(tokens|offsets|lengths)\.npy: ranged GET of \d+ ranges failed"
        ):
            for _ in range(200):  # the blocks held run out within a few micro batches; then the failed fetch
                dataset.get_batch(next(batches))
        dataset.close()


@pytest.mark.parametrize(
    ("make", "error"),
    [
        (lambda: PrefetchConfig(budget_bytes=2 << 20, cache_bytes=1 << 20), "cache_bytes .* must be >= budget_bytes"),
        (lambda: PrefetchConfig(block_bytes=1000), "block_bytes must be a multiple of 65536"),
        (lambda: PrefetchConfig(threads=0), "threads must be an integer >= 1, got 0"),
        (lambda: PrefetchConfig(max_micro_batches_ahead=0), "max_micro_batches_ahead must be an integer >= 1, got 0"),
        (  # issue 31: a 16 MiB block with a 2 MiB cache was never held: 2.7 GB fetched for 60 micro batches
            lambda: PrefetchConfig(budget_bytes=1 << 20, cache_bytes=2 << 20, block_bytes=16 << 20),
            r"cache_bytes \(2097152\) must be >= block_bytes \(16777216\): a block larger than the cache is never held",
        ),
        (  # issue 37: the node-shared cache's cap goes with its directory, and holds a block at least
            lambda: PrefetchConfig(node_cache_bytes=1 << 30),
            r"node_cache_bytes is the cap of a node_cache: give node_cache \(a path\)",
        ),
        (
            lambda: PrefetchConfig(node_cache="/dev/shm/x"),
            r"node_cache_bytes must be an integer >= 65792 \(a block of 65536 bytes and its entry's header\) with a"
            r" node_cache, got None",
        ),
    ],
)
def test_bad_prefetch_settings_are_refused_by_name(make, error):
    with pytest.raises(ValueError, match=error):
        make()


def test_prefetch_without_the_plan_or_with_another_layouts_plan_is_refused(small_index):
    layout = small_index.layout(CONFIGS[0])
    with pytest.raises(ValueError, match="prefetch reads ahead the micro batches of the plan: pass plan="):
        PackedDataset(small_index, layout, prefetch=PrefetchConfig())
    other = Plan(layout.num_samples + 1, global_batch_size=4, micro_batch_size=4)
    with pytest.raises(ValueError, match=f"the plan draws from {layout.num_samples + 1} samples, the layout has"):
        PackedDataset(small_index, layout, prefetch=PrefetchConfig(), plan=other)


# -- issue 31: the planner's bound, a clean stop, a sampler over another plan


def _wait_until(done, what: str) -> None:
    """Wait (not a timed assertion: a liveness bound) until ``done()`` holds."""
    for _ in range(6000):
        if done():
            return
        time.sleep(0.01)
    raise AssertionError(f"never happened: {what}")


def test_the_planner_never_plans_more_micro_batches_ahead_than_its_bound(pushed):
    # a corpus far smaller than budget_bytes: every block admitted, so bytes never bound the lookahead (before: 366k
    # micro batches planned in 30 s, RSS 265 MB -> 1.2 GB and growing)
    local, url = pushed
    remote = TokenIndex.open(url)
    layout = remote.layout(CONFIGS[0])
    plan = Plan(layout.num_samples, seed=5, global_batch_size=4, micro_batch_size=4)  # no stop_step: endless
    bound = 12
    config = PrefetchConfig(budget_bytes=64 << 20, cache_bytes=64 << 20, threads=2, max_micro_batches_ahead=bound)
    dataset = PackedDataset(remote, layout, prefetch=config, plan=plan)
    want = PackedDataset(local, local.layout(CONFIGS[0]))
    batches = iter(DeterministicBatchSampler(plan, 0))
    for _ in range(3):
        ids = next(batches)
        got = dataset.get_batch(ids)
        assert all(torch.equal(got[k], v) for k, v in want.get_batch(ids).items())
    prefetcher = dataset._prefetcher[1]
    _wait_until(lambda: prefetcher.summary().ahead == bound, "the planner reaches its bound")
    for _ in range(40):  # each read frees one place, which the planner fills again: never more
        ids = next(batches)
        got = dataset.get_batch(ids)
        assert all(torch.equal(got[k], v) for k, v in want.get_batch(ids).items())
        assert prefetcher.summary().peak_ahead <= bound
    _wait_until(lambda: prefetcher.summary().ahead == bound, "the planner fills the bound again")
    stats = dataset.prefetch_stats()
    assert (stats.served, stats.peak_ahead, stats.ahead, stats.planned) == (43, bound, bound, 43 + bound)
    dataset.close()
    assert not prefetcher._planner.is_alive()


EXITS_WHILE_PREFETCHING = """
import atexit, sys, threading

def threads_left():  # registered before detsampler is imported: runs after its exit hooks
    left = sorted(t.name for t in threading.enumerate() if t.name.startswith("detsampler") and t.is_alive())
    print("threads left at exit:", left, flush=True)

atexit.register(threads_left)

from detsampler.index import TokenIndex
from detsampler.layout import LayoutConfig
from detsampler.loader import DeterministicBatchSampler, PackedDataset, PrefetchConfig
from detsampler.plan import Plan

remote = TokenIndex.open(sys.argv[1])
layout = remote.layout(LayoutConfig(kind="concat", seq_len=64, seed=1))
plan = Plan(layout.num_samples, seed=0, global_batch_size=4, micro_batch_size=4)
config = PrefetchConfig(budget_bytes=int(sys.argv[2]), cache_bytes=max(int(sys.argv[2]), 1 << 20), threads=2)
dataset = PackedDataset(remote, layout, prefetch=config, plan=plan)
batches = iter(DeterministicBatchSampler(plan, 0))  # no stop_step: the planner never runs out
for _ in range(3):
    dataset.get_batch(next(batches))
print("read 3 micro batches; exiting without close()", flush=True)
sys.exit(0)
"""


@pytest.mark.parametrize("budget_bytes", [64 * KIB, 64 << 20], ids=["fetching", "all-held"])
def test_a_process_that_exits_while_the_prefetcher_runs_stops_it_and_exits_cleanly(pushed, budget_bytes):
    # before: the planner (a daemon thread) ran on through the interpreter's teardown (the trainer aborted there:
    # "terminate called without an active exception"); now an exit hook stops and joins it
    import subprocess
    import sys

    _, url = pushed
    run = subprocess.run(
        [sys.executable, "-c", EXITS_WHILE_PREFETCHING, url, str(budget_bytes)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (run.returncode, run.stderr) == (0, "")
    assert run.stdout.splitlines()[-2:] == [
        "read 3 micro batches; exiting without close()",
        "threads left at exit: []",
    ]


def _prefetching(url: str) -> tuple[weakref.ref, Any]:
    """A dataset that has read a micro batch, held by nothing but the weak reference returned, and its prefetcher."""
    remote = TokenIndex.open(url)
    layout = remote.layout(CONFIGS[0])
    plan = Plan(layout.num_samples, seed=2, global_batch_size=4, micro_batch_size=4)
    dataset = PackedDataset(remote, layout, prefetch=TIGHT, plan=plan)
    dataset.get_batch(next(iter(DeterministicBatchSampler(plan, 0))))
    return weakref.ref(dataset), dataset._prefetcher[1]


def test_a_dataset_collected_with_its_prefetcher_running_stops_it(pushed):
    import gc

    dataset, prefetcher = _prefetching(pushed[1])
    threads = [prefetcher._planner, *prefetcher._pool._threads]
    gc.collect()  # the dataset is collected (its prefetcher's threads do not hold it): its finalizer closes it
    assert dataset() is None and prefetcher.closed and not any(t.is_alive() for t in threads)


def test_a_sampler_over_another_plan_is_read_on_demand_with_a_warning(pushed, caplog):
    # before: `ValueError: Got rank 1, allowed ranks are in [0, 1)` from get_batch (the planner's error), though the
    # documents promise a warning and reads on demand
    local, url = pushed
    remote = TokenIndex.open(url)
    layout = remote.layout(CONFIGS[0])
    dataset_plan = Plan(layout.num_samples, seed=0, global_batch_size=4, micro_batch_size=4)
    sampler_plan = Plan(layout.num_samples, seed=0, global_batch_size=8, micro_batch_size=4, world_size=2)
    dataset = PackedDataset(remote, layout, prefetch=TIGHT, plan=dataset_plan)
    want = PackedDataset(local, local.layout(CONFIGS[0]))
    with caplog.at_level(logging.WARNING, logger="detsampler.prefetch"):
        for ids in DeterministicBatchSampler(sampler_plan, 1, stop_step=3):
            got = dataset.get_batch(ids)
            assert all(torch.equal(got[k], v) for k, v in want.get_batch(ids).items())
    stats = dataset.prefetch_stats()
    assert (stats.served, stats.unplanned) == (0, 3)
    assert [r.getMessage() for r in caplog.records if r.name == "detsampler.prefetch"] == [
        "prefetch: the micro batch at step 0 micro step 0 of rank 1 is not the one the dataset's plan puts there (Got"
        " rank 1, allowed ranks are in [0, 1)): the sampler reads another plan, so every micro batch is read on"
        " demand, without prefetch"
    ]
    dataset.close()


@pytest.mark.parametrize("fault", ["stall", "flip"])
def test_a_stall_or_a_corrupted_answer_mid_prefetch_is_retried_said_and_the_batches_are_the_local_ones(
    pushed, s3_endpoint, monkeypatch, caplog, fault
):
    # before: a stalled fetch waited in silence (120 s by default); a block corrupted in transit was refused as an
    # object "edited or replaced after it was written", though a second read was correct
    local, url = pushed
    monkeypatch.setenv("DETSAMPLER_STORAGE_REQUEST_TIMEOUT_S", "0.5")
    with fault_proxy(s3_endpoint) as proxy, caplog.at_level(logging.WARNING, logger="detsampler.storage"):
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        remote = TokenIndex.open(url)
        layout = remote.layout(CONFIGS[0])
        plan = Plan(layout.num_samples, seed=3, global_batch_size=4, micro_batch_size=4)
        dataset = PackedDataset(remote, layout, prefetch=TIGHT, plan=plan)
        getattr(proxy, fault)("tokens.npy")  # the prefetcher's first fetch of token blocks
        want = PackedDataset(local, local.layout(CONFIGS[0]))
        for ids in DeterministicBatchSampler(plan, 0, stop_step=12):
            got = dataset.get_batch(ids)
            assert all(torch.equal(got[k], v) for k, v in want.get_batch(ids).items())
        stats = dataset.prefetch_stats()
        dataset.close()
    assert (stats.served, stats.unplanned) == (12, 0)
    assert [f for _, path, f in proxy.seen if path.endswith("/tokens.npy") and f] == [fault]
    (line,) = [r.getMessage() for r in caplog.records if r.name == "detsampler.storage"]
    said = {
        "stall": r"ranged GET of \d+ ranges failed \(GenericError: no answer within the request timeout of 0\.5 s:"
        r" .*\); retry 1 of at most 5 in 0\.1 s, 1[01]\d\.\d s left of the 120 s allowed",
        "flip": r"block \d+ \(bytes \d+\.\.\d+\) failed its checksum as fetched and passed when fetched again:"
        r" corrupted in transit, recovered",
    }
    assert re.fullmatch(rf"storage: {url}/tokens\.npy: {said[fault]}", line), line
