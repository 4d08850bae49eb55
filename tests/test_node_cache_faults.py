"""Issue 37's node-shared cache, reviewed (review 37): a directory that cannot hold it is refused by name when the
dataset is made; a filesystem that fills up under it serves the fetched blocks unpublished, said once; a ledger torn
by a power cut is recounted, so the cap holds; a cap that holds no entry is refused; several processes filling one
directory at once never hold more than its cap.

Real processes against moto's S3 server on loopback (``tests.s3_server``) where a run reads a bucket; the cache alone
where only the directory is under test."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from detsampler.index import TokenIndex
from detsampler.index.sources import open_source
from detsampler.loader import DeterministicBatchSampler, PackedDataset, PrefetchConfig
from detsampler.plan import Plan
from detsampler.storage import NodeCache
from tests._node_cache_child import CONFIG
from tests.more_servers import range_http_server
from tests.test_bucket_opens import _source_files
from tests.test_node_cache import ROOT, STEPS, _local_hashes, pushed  # noqa: F401 (pushed: a fixture)

KIB = 1024
BLOCK = 64 * KIB


def _prefetch(directory: Path, cap: int = 64 << 20) -> PrefetchConfig:
    return PrefetchConfig(
        budget_bytes=128 * KIB, cache_bytes=128 * KIB, node_cache=str(directory), node_cache_bytes=cap
    )


def _names(n: int) -> dict[int, str]:
    return {b: NodeCache.key("identity", "s3://bucket/object", BLOCK, b) for b in range(n)}


def _blocks(n: int) -> dict[int, bytes]:
    return {b: bytes([b % 251]) * BLOCK for b in range(n)}


@pytest.mark.parametrize("what", ["a file", "a file inside it"])
def test_a_node_cache_path_that_is_no_directory_is_refused_naming_it_when_the_dataset_is_made(pushed, tmp_path, what):
    # before: accepted; the first batch (in each DataLoader worker) died with NotADirectoryError from pathlib's mkdir
    local, url = pushed
    remote = TokenIndex.open(url)
    layout = remote.layout(CONFIG)
    plan = Plan(layout.num_samples, seed=4, global_batch_size=8, micro_batch_size=4)
    path = tmp_path / "node"
    if what == "a file":
        path.write_text("not a directory\n")
    else:
        (path / "v1").mkdir(parents=True)
        (path / "v1" / "blocks").write_text("not a directory\n")
    blocking = path if what == "a file" else path / "v1" / "blocks"
    with pytest.raises(
        ValueError, match=rf"^node cache {str(path)!r}: cannot hold the cache \({str(blocking)!r} is no"
    ) as err:
        PackedDataset(remote, layout, prefetch=_prefetch(path), plan=plan)
    assert "\n" not in str(err.value) and str(err.value).endswith(
        "give a directory on local disk or /dev/shm that this process can write"
    )


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through a directory's mode bits")
def test_a_read_only_node_cache_directory_is_refused_naming_it(tmp_path):
    # before: accepted; the first fetch died with PermissionError creating a stripe's lock file
    path = tmp_path / "node"
    NodeCache(path, 1 << 20)
    for sub in [path / "v1" / s for s in ("blocks", "locks", "tmp")] + [path / "v1", path]:
        sub.chmod(0o555)
    try:
        with pytest.raises(ValueError, match=rf"^node cache {str(path)!r}: .*give a directory"):
            NodeCache(path, 1 << 20)
    finally:
        for sub in [path, path / "v1"] + [path / "v1" / s for s in ("blocks", "locks", "tmp")]:
            sub.chmod(0o755)


def _limit_file_size() -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (32 * KIB, 32 * KIB))  # no entry fits (a 64 KiB block and its header)


def test_a_full_filesystem_under_the_node_cache_serves_the_blocks_unpublished_and_says_it_once(pushed, tmp_path):
    # before: the rank died with "OSError: [Errno 27] File too large" from its first publish, its partial temporary
    # file left behind (a full disk's ENOSPC took the same path)
    local, url = pushed
    cache = tmp_path / "node"
    env = {**os.environ, "DETSAMPLER_CACHE": str(tmp_path / "cache")}
    args = [url, "index", str(cache), str(64 << 20), "0", "1", "0", str(STEPS)]
    proc = subprocess.run(
        [sys.executable, "-m", "tests._node_cache_child", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, preexec_fn=_limit_file_size,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1])["hashes"] == _local_hashes(local, world=1)[0]
    lines = [line for line in proc.stderr.splitlines() if "node cache" in line]
    assert len(lines) == 1 and f"node cache {str(cache / 'v1')!r}: an entry could not be written (" in lines[0], lines
    assert "blocks are served without being published" in lines[0]
    assert not list((cache / "v1" / "tmp").iterdir()) and not list((cache / "v1" / "blocks").rglob("*.blk"))


@pytest.mark.parametrize("ledger", ["", "-1000000", "12 34"])
def test_a_torn_or_edited_ledger_is_recounted_and_the_cap_holds(tmp_path, ledger):
    # before: an empty ledger (a power cut after its rename, no fsync) was read as 0 bytes held, and so was "-1000000"
    # as less than nothing: a cap of 4 entries held 8 (525,272 bytes for 262,944)
    cap = 4 * (BLOCK + 200)
    names, blocks = _names(8), _blocks(8)
    NodeCache(tmp_path, cap).fetch([0, 1, 2, 3], names, lambda want: {b: blocks[b] for b in want})
    (tmp_path / "v1" / "ledger").write_text(ledger)
    again = NodeCache(tmp_path, cap)
    got = again.fetch([4, 5, 6, 7], names, lambda want: {b: blocks[b] for b in want})
    assert all(got[b] == blocks[b] for b in range(4, 8))
    held = again.held_bytes()
    assert held <= cap and int((tmp_path / "v1" / "ledger").read_text()) == held


@pytest.mark.parametrize(
    ("fields", "allowed"),
    [
        ({}, r"node_cache_bytes must be an integer >= 65792 \(a block of 65536 bytes and its entry's header\)"),
        ({"source_block_bytes": 1 << 20}, r">= 1048832 \(a block of 1048576 bytes and its entry's header\)"),
    ],
)
def test_a_node_cache_cap_that_holds_no_entry_is_refused(tmp_path, fields, allowed):
    # before: accepted (a cap of one block), and no entry was ever published: every block bypassed in every process,
    # the node cache silently doing nothing
    with pytest.raises(ValueError, match=allowed):
        PrefetchConfig(
            budget_bytes=1 << 20, cache_bytes=2 << 20, node_cache=str(tmp_path), node_cache_bytes=BLOCK, **fields
        )
    fits = 1 << 20 if fields else BLOCK
    node = NodeCache(tmp_path, fits + NodeCache.ENTRY_HEADER_BYTES)
    node.fetch([0], {0: "a" * 64}, lambda want: {0: b"\0" * fits})
    assert node.published == 1


def _fill(directory: str, cap: int, seed: int, out) -> None:
    import random

    node, names, blocks = NodeCache(directory, cap), _names(24), _blocks(24)
    rng, peak = random.Random(seed), 0

    def read(want: list[int]) -> dict[int, bytes]:
        nonlocal peak
        peak = max(peak, node.held_bytes())
        return {b: blocks[b] for b in want}

    for _ in range(30):
        want = sorted(rng.sample(range(24), 4))
        got = node.fetch(want, names, read)
        assert all(got[b] == blocks[b] for b in want)
    out.put((peak, node.published, node.evicted))


def test_processes_filling_one_node_cache_at_once_never_hold_more_than_its_cap(tmp_path):
    cap = 6 * (BLOCK + 200)
    context = multiprocessing.get_context("forkserver")
    out = context.Queue()
    procs = [context.Process(target=_fill, args=(str(tmp_path), cap, seed, out)) for seed in range(3)]
    for p in procs:
        p.start()
    got = [out.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    node = NodeCache(tmp_path, cap)
    assert max(peak for peak, _, _ in got) <= cap and node.held_bytes() <= cap
    assert sum(evicted for _, _, evicted in got) > 0


def test_a_source_whose_server_sends_no_strong_etag_says_the_node_cache_does_not_hold_it(tmp_path, monkeypatch, caplog):
    # before: node_cache accepted and silently unused (no identity names such an object's content: its node counts all
    # 0), the prefetcher's lines saying nothing of it
    monkeypatch.setenv("DETSAMPLER_CACHE", str(tmp_path / "cache"))
    path = _source_files("nanogpt", tmp_path / "data", num_docs=6000)
    with range_http_server(tmp_path / "data") as server:
        url = f"{server}/{path.name}"
        remote, local = open_source("nanogpt", url, eos_id=7), open_source("nanogpt", path, eos_id=7)
        layout = remote.layout(CONFIG)
        plan = Plan(layout.num_samples, seed=4, global_batch_size=8, micro_batch_size=4)
        dataset = PackedDataset(remote, layout, prefetch=_prefetch(tmp_path / "node"), plan=plan)
        want = PackedDataset(local, local.layout(CONFIG))
        with caplog.at_level(logging.INFO, logger="detsampler.prefetch"):
            for ids in DeterministicBatchSampler(plan, 0, stop_step=STEPS):
                batch = dataset.get_batch(ids)
                assert all(torch.equal(batch[k], v) for k, v in want.get_batch(ids).items())
        stats = dataset.prefetch_stats().node
        dataset.close()
    lines = [r.getMessage() for r in caplog.records if "node cache" in r.getMessage()]
    assert lines == [
        f"prefetch: {url}: the node cache does not hold its blocks (its server sends no strong ETag: nothing names its"
        " content across processes): this process fetches its own"
    ]
    assert stats["fetched"] == stats["hits"] == 0


def test_the_trainer_names_its_node_cache_and_says_what_it_served_and_fetched(pushed, small_tokenizer, tmp_path):
    # before: the trainer's lines said nothing of the node cache (its reads line, its summary): a run on a fresh node
    # and one resumed over a warm cache printed alike but for the bytes, with no word of where the blocks came from
    from train.config import load_config
    from train.data import build_pipeline

    _, url = pushed
    node = tmp_path / "node"
    summaries = []
    for _ in range(2):  # a fresh node, then a run over the cache the first one filled
        cfg = tmp_path / "c.toml"
        cfg.write_text(
            f'[data]\nseq_len = 64\nglobal_batch_size = 4\nmicro_batch_size = 2\ncache_dir = "{tmp_path}"\n'
            f'source = "{url}"\ntokenizer = "{small_tokenizer.path}"\n'
            f'prefetch = {{node_cache = "{node}", node_cache_bytes = {64 << 20}}}\n'
        )
        pipe = build_pipeline(load_config(cfg).data, world_size=1)
        assert len(list(pipe.loader(pipe.sampler(0, 0, 6), pin_memory=False, persistent_workers=False))) == 12
        shared = f", node cache {str(node)!r} of at most {64 << 20:,} bytes shared by the node"
        assert pipe.reads_line().endswith(shared)
        summaries.append(pipe.prefetch_summary())
        pipe.close()
    first, second = (s.split("; node cache ")[1] for s in summaries)
    assert first.startswith("0 blocks served from it, ") and not first.startswith("0 blocks served from it, 0 fetched")
    assert second.endswith(", 0 fetched from the store for it") and not second.startswith("0 blocks")
    assert "fetched 0 bytes in 0 ranged reads" in summaries[1]
