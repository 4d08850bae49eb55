"""Building under failure and contention: a killed build leaves nothing that opens; concurrent builders (processes, or
torch.distributed ranks) produce one index, tokenized once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from detsampler.index import TokenIndex, TokenIndexError, build_index
from detsampler.index.format import index_cache_key
from detsampler.text.corpus import default_corpus

BUILD = textwrap.dedent("""
    import json, os, pathlib, sys, time
    import detsampler.index as index_module
    import detsampler.index.build as build_module
    from detsampler.text.corpus import default_corpus
    from detsampler.text.tokenizer import Tokenizer

    model, cache, n_docs = sys.argv[1], sys.argv[2], int(sys.argv[3])
    calls = []
    real_write = build_module._write_index
    def counting_write(*args, **kwargs):  # the real build, counted
        calls.append(1)
        return real_write(*args, **kwargs)
    build_module._write_index = counting_write
    rank = 0
    if len(sys.argv) > 4:  # torch.distributed: rank, world size, rendezvous file
        import torch.distributed as dist
        rank, world = int(sys.argv[4]), int(sys.argv[5])
        dist.init_process_group("gloo", init_method="file://" + sys.argv[6], rank=rank, world_size=world)
    corpus = default_corpus(max_documents=n_docs)
    gate = os.environ.get("GATE_DIR")
    if gate:  # start building together: announce readiness, wait for "go"
        pathlib.Path(gate, f"ready-{os.getpid()}").touch()
        while not pathlib.Path(gate, "go").exists():
            time.sleep(0.002)
    if rank == 1 and not os.environ.get("ON_TIME"):  # arrive late: rank 0's index is already in place
        while not list(pathlib.Path(cache).glob("index-*/meta.json")):
            time.sleep(0.01)
    index = index_module.build_index(corpus, Tokenizer.load(model), cache_dir=cache,
                                          num_proc=int(os.environ.get("NUM_PROC", "1")), progress=False)
    if rank or len(sys.argv) > 4:  # distributed: a second build finds the index on every rank, and nobody hangs
        again = index_module.build_index(corpus, Tokenizer.load(model), cache_dir=cache, progress=False)
        assert again.path == index.path
    print(json.dumps({"rank": rank, "path": str(index.path), "built": len(calls), "num_tokens": index.num_tokens}))
    """)


def _spawn(*args: str, gate: Path | None = None, num_proc: int = 1, on_time: bool = False) -> subprocess.Popen:
    env = dict(os.environ, NUM_PROC=str(num_proc), **({"GATE_DIR": str(gate)} if gate else {}))
    if on_time:
        env["ON_TIME"] = "1"
    return subprocess.Popen(
        [sys.executable, "-c", BUILD, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )


def _wait_for(predicate, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.005)


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:  # not Linux
        return []


def _alive(pid: int) -> bool:
    try:
        return "zombie" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


@pytest.mark.parametrize("moment,num_proc", [("temp-dir-created", 1), ("tokens-half-written", 2)])
def test_killed_build_leaves_no_openable_index(tmp_path, small_tokenizer, moment, num_proc):
    n_docs = 300
    corpus = default_corpus(max_documents=n_docs)
    final = tmp_path / f"index-{index_cache_key(corpus, small_tokenizer)}"
    proc = _spawn(small_tokenizer.path, str(tmp_path), str(n_docs), num_proc=num_proc)
    temps = lambda: list(tmp_path.glob(".tmp-index-*"))
    _wait_for(lambda: temps() or proc.poll() is not None)
    if moment == "tokens-half-written":
        _wait_for(
            lambda: (
                proc.poll() is not None
                or any((t / "tokens.npy").exists() and (t / "tokens.npy").stat().st_size > 1_000_000 for t in temps())
            )
        )
    assert proc.poll() is None, "the build finished before it could be killed"
    workers = _children(proc.pid)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    # its tokenizer processes notice and exit too
    _wait_for(lambda: not any(_alive(w) for w in workers), 30)
    assert temps() and not final.exists()
    with pytest.raises(TokenIndexError, match="no index at"):
        TokenIndex.open(final)
    with pytest.raises(TokenIndexError, match="no meta.json"):
        TokenIndex.open(temps()[0])  # the half-written directory itself does not open either
    index = build_index(corpus, small_tokenizer, cache_dir=tmp_path, progress=False)
    assert index.path == final and not temps()  # the stale temporary directory was removed
    TokenIndex.open(final, dataset=corpus, tokenizer=small_tokenizer, verify_tokens=True)
    assert index.lengths.tolist() == [len(d) for d in small_tokenizer.encode_batch(corpus["text"])]


def test_two_concurrent_builders_make_one_index(tmp_path, small_tokenizer):
    gate = tmp_path / "gate"
    gate.mkdir()
    procs = [_spawn(small_tokenizer.path, str(tmp_path), "100", gate=gate) for _ in range(2)]
    _wait_for(lambda: len(list(gate.glob("ready-*"))) == 2 or any(p.poll() is not None for p in procs))
    (gate / "go").touch()
    results = []
    for p in procs:
        out, err = p.communicate(timeout=180)
        assert p.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert results[0]["path"] == results[1]["path"]
    assert sorted(r["built"] for r in results) == [0, 1]  # one tokenized, the other waited on the lock and opened
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(("index-", ".tmp-index-")) and p.is_dir()] == [
        Path(results[0]["path"]).name
    ]
    index = TokenIndex.open(results[0]["path"], verify_tokens=True)
    expected = small_tokenizer.encode_batch(default_corpus(max_documents=100)["text"])
    assert np.array_equal(index.lengths, [len(d) for d in expected])


def test_distributed_ranks_build_once(tmp_path, small_tokenizer):
    world = 2
    procs = [
        _spawn(small_tokenizer.path, str(tmp_path / "cache"), "40", str(r), str(world), str(tmp_path / "rendezvous"))
        for r in range(world)
    ]
    results = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=120)  # a rank left waiting at a barrier would hang: time out instead
            assert p.returncode == 0, err
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert {r["path"] for r in results} == {results[0]["path"]}
    assert sorted(r["built"] for r in results) == [0, 1]  # one rank built (whichever took the lock), the other opened


def test_ranks_without_a_shared_filesystem_each_build_their_own(tmp_path, small_tokenizer):
    """Issue 12: no collective around the build. Ranks whose cache directories differ (nodes without a shared
    filesystem)
    each build the index under their own lock, instead of waiting at a barrier for rank 0's build they cannot see."""
    world = 2
    procs = [
        _spawn(
            small_tokenizer.path,
            str(tmp_path / f"node{r}"),
            "40",
            str(r),
            str(world),
            str(tmp_path / "rdzv"),
            on_time=True,
        )
        for r in range(world)
    ]
    results = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, err[-2000:]
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [r["built"] for r in results] == [1, 1]
    assert Path(results[0]["path"]).name == Path(results[1]["path"]).name  # the same index, one copy per node
