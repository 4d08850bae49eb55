"""Issue 37, the node-shared cache: the ranks and DataLoader workers of one node read through one bounded directory, so
each block is fetched from the store once per node; a process killed while filling it leaves nothing that is served,
a damaged entry is fetched again, two runs sharing the directory never serve each other's blocks, and the cap holds.

Real processes (ranks as subprocesses, their DataLoader workers started by forkserver) against moto's S3 server behind
the recording proxy (``tests.more_servers``), which counts every byte answered."""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch

from detsampler.index import TokenIndex
from detsampler.index.push import push_index
from detsampler.index.sources import open_source
from detsampler.loader import DeterministicBatchSampler, PackedDataset, PrefetchConfig
from detsampler.plan import Plan
from detsampler.reads import range_blocks, worker_reads
from detsampler.storage import NodeCache
from detsampler.storage.node_cache import NEVER_USED
from tests._node_cache_child import CONFIG
from tests.index_copies import copy_with_layouts
from tests.more_servers import fault_proxy
from tests.test_bucket_opens import _source_files, _upload

ROOT = Path(__file__).resolve().parents[1]
KIB = 1024
BLOCK = 64 * KIB
STEPS = 6


@pytest.fixture(scope="module")
def pushed(small_index, s3_bucket, tmp_path_factory):
    """``(local, url)``: the small index with its concat layout, pushed (under a prefix of its own: a module that
    imports this fixture pushes its own copy)."""
    root = tmp_path_factory.mktemp("node")
    local = copy_with_layouts(small_index, root, [CONFIG])
    url = f"{s3_bucket}/node/{root.name}/{local.path.name}"
    push_index(local.path, url)
    return local, url


@pytest.fixture
def source(s3_bucket, tmp_path, monkeypatch):
    """``(local, url)``: a nanoGPT file of 37 blocks of 64 KiB, uploaded, opened once from the bucket so that every
    later open (the ranks', their workers') reads no token byte (its identity recorded, its scan cached)."""
    monkeypatch.setenv("DETSAMPLER_CACHE", str(tmp_path / "cache"))
    path = _source_files("nanogpt", tmp_path / "data", num_docs=60_000, seed=3)
    url = f"{s3_bucket}/node-source/{tmp_path.name}"
    _upload(tmp_path / "data", url)
    open_source("nanogpt", f"{url}/{path.name}", eos_id=7)
    return open_source("nanogpt", path, eos_id=7), f"{url}/{path.name}"


def _rank(endpoint: str, url: str, cache: str, cap: int, rank: int, world: int, workers: int, kind: str = "nanogpt"):
    env = {**os.environ, "AWS_ENDPOINT_URL": endpoint, "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(world)}
    args = [url, kind, cache, str(cap), str(rank), str(world), str(workers), str(STEPS)]
    return subprocess.Popen(
        [sys.executable, "-m", "tests._node_cache_child", *args],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _node(endpoint: str, url: str, cache: str, cap: int = 64 << 20, world: int = 2, workers: int = 2) -> list:
    ranks = [_rank(endpoint, url, cache, cap, r, world, workers) for r in range(world)]
    out = []
    for proc in ranks:
        stdout, stderr = proc.communicate(timeout=600)
        assert proc.returncode == 0, stderr[-3000:]
        out.append(json.loads(stdout.strip().splitlines()[-1])["hashes"])
    return out


def _plan(local, world: int) -> Plan:
    layout = local.layout(CONFIG)
    return Plan(layout.num_samples, seed=4, global_batch_size=8 * world, micro_batch_size=4, world_size=world)


def _local_hashes(local, world: int = 2) -> list[list[str]]:
    import hashlib

    plan, dataset = _plan(local, world), PackedDataset(local, local.layout(CONFIG))
    return [
        [
            hashlib.sha256(b"".join(v.numpy().tobytes() for v in dataset.get_batch(ids).values())).hexdigest()
            for ids in DeterministicBatchSampler(plan, rank, stop_step=STEPS)
        ]
        for rank in range(world)
    ]


def _distinct_block_bytes(local, world: int = 2) -> int:
    """The bytes of the distinct 64 KiB blocks of the token file the node's plan reads (every rank, steps
    [0, STEPS))."""
    size = local.tokens.size * local.tokens.dtype.itemsize
    return sum(min((b + 1) * BLOCK, size) - b * BLOCK for b in _distinct_blocks(local, world))


def _distinct_blocks(local, world: int = 2) -> set[int]:
    """The distinct 64 KiB blocks of the token file the node's plan reads (every rank, steps [0, STEPS))."""
    plan, layout, tokens = _plan(local, world), local.layout(CONFIG), local.tokens
    blocks: set[int] = set()
    for rank in range(world):
        reads = worker_reads(plan, layout, local.offsets, local.lengths, rank, (0, 0), 2 * STEPS, stop_step=STEPS,
                             eos_stored=local.eos_stored)  # fmt: skip
        _, got = range_blocks(reads.starts, reads.stops, np.array([0, len(reads.starts)]),
                              itemsize=tokens.dtype.itemsize, data_offset=0, block_bytes=BLOCK)  # fmt: skip
        blocks.update(got.tolist())
    return blocks


def _token_bytes(proxy, name: str, since: int = 0) -> int:
    return sum(n for m, p, _, n in proxy.answered[since:] if m == "GET" and p.split("?")[0].endswith(f"/{name}"))


def test_a_node_of_two_ranks_of_two_workers_fetches_each_block_once(source, s3_endpoint, tmp_path):
    # before: each process (each DataLoader worker of each rank) fetched its blocks for itself: 4 caches, nothing
    # shared between a node's workers or ranks
    local, url = source
    name = url.rsplit("/", 1)[1]
    want, distinct = _local_hashes(local), _distinct_block_bytes(local)
    with fault_proxy(s3_endpoint) as proxy:
        apart = _node(proxy.endpoint, url, "-")
        alone = _token_bytes(proxy, name)
        start = len(proxy.answered)
        shared = _node(proxy.endpoint, url, str(tmp_path / "node"))
        together = _token_bytes(proxy, name, start)
    assert apart == want and shared == want  # the local batches, byte for byte
    assert together == distinct  # each block the node's plan reads fetched once by the node: 1.00x
    assert alone > 1.5 * distinct  # each of the 4 processes fetched its own
    assert NodeCache(tmp_path / "node", 64 << 20).held_bytes() >= distinct


def test_a_process_killed_while_filling_the_node_cache_leaves_nothing_served(source, s3_endpoint, tmp_path):
    local, url = source
    cache = tmp_path / "node"
    with fault_proxy(s3_endpoint) as proxy:
        proxy.stall(url.rsplit("/", 1)[1], times=1000, method="GET")  # its fetches never answer: it holds their locks
        child = _rank(proxy.endpoint, url, str(cache), 64 << 20, 0, 1, 0)
        for _ in range(6000):  # a liveness bound, not a timed assertion
            if any(f == "stall" for _, _, f in proxy.seen) or child.poll() is not None:
                break
            time.sleep(0.01)
        assert child.poll() is None, child.communicate()[1][-2000:]
        (cache / "v1" / "tmp" / f"{'ab' * 32}.{child.pid}.deadbeef").write_bytes(b"DSNODE1\n" + b"\0" * 99)
        os.kill(child.pid, signal.SIGKILL)  # killed mid-fetch, and (the planted file) mid-write
        child.wait()
        proxy.disarm()
        assert not list((cache / "v1" / "blocks").rglob("*.blk"))  # nothing published
        os.environ["AWS_ENDPOINT_URL"], endpoint = proxy.endpoint, os.environ["AWS_ENDPOINT_URL"]
        try:  # the next process on the node takes the locks the kernel released, fetches and serves
            remote = open_source("nanogpt", url, eos_id=7)
            plan = _plan(local, 1)
            node = PrefetchConfig(budget_bytes=128 * KIB, cache_bytes=128 * KIB, node_cache=str(cache),
                                  node_cache_bytes=64 << 20)  # fmt: skip
            got = PackedDataset(remote, remote.layout(CONFIG), prefetch=node, plan=plan)
            want = PackedDataset(local, local.layout(CONFIG))
            for ids in DeterministicBatchSampler(plan, 0, stop_step=STEPS):
                batch = got.get_batch(ids)
                assert all(torch.equal(batch[k], v) for k, v in want.get_batch(ids).items())
            got.close()
        finally:
            os.environ["AWS_ENDPOINT_URL"] = endpoint
    assert not list((cache / "v1" / "tmp").iterdir())  # the dead writer's temporary file removed, never served
    assert list((cache / "v1" / "blocks").rglob("*.blk"))


@pytest.mark.parametrize("damage", ["bit flip", "truncated", "another block, resealed"])
def test_a_damaged_node_cache_entry_is_fetched_again_and_said(pushed, tmp_path, caplog, damage):
    local, url = pushed
    cache = tmp_path / "node"
    remote = TokenIndex.open(url)
    layout = remote.layout(CONFIG)
    plan = Plan(layout.num_samples, seed=4, global_batch_size=8, micro_batch_size=4)
    node = PrefetchConfig(budget_bytes=128 * KIB, cache_bytes=128 * KIB, node_cache=str(cache),
                          node_cache_bytes=64 << 20)  # fmt: skip
    first = PackedDataset(remote, layout, prefetch=node, plan=plan)
    for ids in DeterministicBatchSampler(plan, 0, stop_step=STEPS):
        first.get_batch(ids)
    first.close()
    entries = sorted((cache / "v1" / "blocks").rglob("*.blk"))
    assert len(entries) >= 2
    raw = entries[0].read_bytes()
    if damage == "bit flip":
        entries[0].write_bytes(raw[:-10] + bytes([raw[-10] ^ 1]) + raw[-9:])
    elif damage == "truncated":
        entries[0].write_bytes(raw[: len(raw) // 2])
    else:  # a well-formed entry (its own CRC right) holding another block's bytes: the index's chunk sums catch it
        other = entries[1].read_bytes()
        header_len = int.from_bytes(other[8:12], "little")
        data = other[12 + header_len :]
        header = json.dumps({"key": entries[0].stem, "size": len(data), "crc32": zlib.crc32(data)}).encode()
        entries[0].write_bytes(b"DSNODE1\n" + len(header).to_bytes(4, "little") + header + data)
    again = PackedDataset(TokenIndex.open(url), layout, prefetch=node, plan=plan)
    want = PackedDataset(local, local.layout(CONFIG))
    with caplog.at_level(logging.WARNING, logger="detsampler.storage"):
        for ids in DeterministicBatchSampler(plan, 0, stop_step=STEPS):
            batch = again.get_batch(ids)
            assert all(torch.equal(batch[k], v) for k, v in want.get_batch(ids).items())
    stats = again.prefetch_stats().node
    again.close()
    lines = [r.getMessage() for r in caplog.records if "node cache" in r.getMessage()]
    why = "fails the object's own check" if damage == "another block, resealed" else "fails its header or CRC-32"
    assert len(lines) == 1 and f"entry {entries[0].stem} removed (" in lines[0] and why in lines[0], lines
    assert stats["damaged"] == 1 and stats["fetched"] == 1  # that block alone fetched again; the rest served


def test_two_runs_sharing_a_node_cache_never_serve_each_others_blocks(s3_bucket, tmp_path, monkeypatch):
    # the same URL holding other bytes (a file rewritten, a new ETag): its blocks are another object's
    monkeypatch.setenv("DETSAMPLER_CACHE", str(tmp_path / "cache"))
    url = f"{s3_bucket}/node-two-runs"
    cache = tmp_path / "node"
    got = []
    for seed in (0, 1):
        path = _source_files("nanogpt", tmp_path / f"data{seed}", num_docs=6000, seed=seed)
        _upload(tmp_path / f"data{seed}", url)
        remote, local = open_source("nanogpt", f"{url}/{path.name}", eos_id=7), open_source("nanogpt", path, eos_id=7)
        layout = remote.layout(CONFIG)
        plan = Plan(layout.num_samples, seed=4, global_batch_size=8, micro_batch_size=4)
        node = PrefetchConfig(budget_bytes=128 * KIB, cache_bytes=128 * KIB, node_cache=str(cache),
                              node_cache_bytes=64 << 20)  # fmt: skip
        dataset = PackedDataset(remote, layout, prefetch=node, plan=plan)
        want = PackedDataset(local, local.layout(CONFIG))
        for ids in DeterministicBatchSampler(plan, 0, stop_step=STEPS):
            batch = dataset.get_batch(ids)
            assert all(torch.equal(batch[k], v) for k, v in want.get_batch(ids).items())
        got.append((dataset.prefetch_stats().node, len(_distinct_blocks(local, 1))))
        dataset.close()
    # every block the second run reads was fetched from the store (by it), none served from the first run's entries
    assert [fetched for (stats, _) in got for fetched in [stats["fetched"]]] == [n for _, n in got]


def test_the_node_cache_never_holds_more_than_its_cap_and_evicts_by_next_use(tmp_path):
    # the cache alone, driven by threads of one process and by a ranking: its cap at every publish, Belady's choice
    cap = 4 * (BLOCK + 200)
    node = NodeCache(tmp_path / "node", cap)
    blocks = {b: bytes([b]) * BLOCK for b in range(12)}
    names = {b: NodeCache.key("id", "s3://x/y", BLOCK, b) for b in blocks}
    peak = [0]

    def read(want: list[int]) -> dict[int, bytes]:
        peak[0] = max(peak[0], node.held_bytes())
        return {b: blocks[b] for b in want}

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(40):
            want = sorted(rng.sample(range(12), 3))
            got = node.fetch(want, names, read)
            assert all(got[b] == blocks[b] for b in want)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert max(peak[0], node.held_bytes()) <= cap and node.evicted > 0
    # next uses: block 0 soonest, then 1, 2, 3; a newcomer needed at 10 evicts the one needed furthest (3)
    fresh = NodeCache(tmp_path / "ranked", cap)
    uses = {names[b]: b for b in range(4)}
    fresh.ranking = lambda: lambda h: uses.get(h, NEVER_USED)
    fresh.fetch([0, 1, 2, 3], names, read)
    uses[names[4]] = 2.5
    fresh.fetch([4], names, read)
    held = {p.stem for p in (tmp_path / "ranked" / "v1" / "blocks").rglob("*.blk")}
    assert held == {names[b] for b in (0, 1, 2, 4)}
    uses[names[5]] = 10  # needed after every block held: not published (bypass), served to its reader all the same
    assert fresh.fetch([5], names, read)[5] == blocks[5] and fresh.bypassed == 1
    assert {p.stem for p in (tmp_path / "ranked" / "v1" / "blocks").rglob("*.blk")} == held
