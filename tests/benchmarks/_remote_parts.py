"""Benchmark 17's issue-37 parts (see :mod:`tests.benchmarks.bench_remote`): the data (a 3-source mixture of OLMo
``.npy`` files of 24, 16 and 10 MB, a Megatron ``.bin/.idx`` of 24 MB, the corpus as a sharded index of 3 shards),
the loop over each from local disk and from the bucket with prefetch, a node of 2 ranks x 4 DataLoader workers with
and without the node-shared cache (bytes and GETs counted by a recording proxy), a fresh process's first batch, and
the peers' S3 readers on the mixture.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import os
import struct
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["first_batch", "make_data", "node_run", "open_data", "peer_rows", "run_issue37", "upload"]

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".cache" / "bench"  # tests.benchmarks.bench_loader's (not imported: a first-batch process stays light)
VOCAB = 8000
DATA = CACHE / "issue37"
EOS = 2
SIZES_MB = (24, 16, 10)  # the OLMo mixture's token files (uint32)
MEGATRON_MB = 24  # uint16
SEQ_LEN, MICRO_BATCH = 2048, 8
MIB = 1 << 20


def _documents(num_tokens: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Random ids in ``[3, VOCAB)``, documents of ~700 tokens (geometric), each ending in ``EOS``: (tokens, ends)."""
    rng = np.random.default_rng(seed)
    lengths = np.maximum(rng.geometric(1 / 700, size=num_tokens // 350), 2)
    ends = np.cumsum(lengths)
    ends = np.append(ends[ends < num_tokens], num_tokens)
    tokens = rng.integers(3, VOCAB, size=num_tokens, dtype=np.int64)
    tokens[ends - 1] = EOS
    return tokens, ends


def make_data(tokenizer_path: str) -> dict:
    """The benchmark's local files under ``DATA`` (made once, reused): the OLMo mixture, the Megatron file, the sharded
    index of the corpus. Returns their paths."""
    DATA.mkdir(parents=True, exist_ok=True)
    olmo = []
    for k, mb in enumerate(SIZES_MB):
        path = DATA / f"olmo/part-{k}.npy"
        olmo.append(path)
        if path.exists():
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        tokens, ends = _documents(mb * 250_000, seed=k)
        tokens.astype(np.uint32).tofile(path)
        with gzip.open(path.with_name(f"part-{k}.csv.gz"), "wt") as f:
            f.writelines(f"{s},{e}\n" for s, e in zip(np.append(0, ends[:-1]), ends))
    prefix = DATA / "megatron/corpus_text_document"
    if not Path(f"{prefix}.bin").exists():
        prefix.parent.mkdir(parents=True, exist_ok=True)
        tokens, ends = _documents(MEGATRON_MB * 500_000, seed=7)
        tokens.astype(np.uint16).tofile(f"{prefix}.bin")
        lengths = np.diff(np.append(0, ends))
        with open(f"{prefix}.idx", "wb") as f:  # Megatron-LM's MMIDIDX layout (one sequence per document)
            f.write(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 8, len(ends), len(ends) + 1))
            f.write(lengths.astype(np.int32).tobytes())
            f.write((np.append(0, ends[:-1]) * 2).astype(np.int64).tobytes())
            f.write(np.arange(len(ends) + 1, dtype=np.int64).tobytes())
    return {"olmo": olmo, "megatron": prefix, "sharded": _sharded(tokenizer_path)}


def _sharded(tokenizer_path: str) -> Path:
    """The benchmark corpus (its first 1,200 files) in 3 parts, built as a sharded index with its concat layout."""
    from detsampler.cli import main
    from detsampler.index.sharded import ShardedIndex
    from detsampler.layout import LayoutConfig
    from detsampler.text.corpus import default_corpus

    cache = DATA / "sharded-cache"
    found = sorted(cache.glob("sharded-*"))
    if not found:
        parts = DATA / "sharded-parts"
        parts.mkdir(parents=True, exist_ok=True)
        texts = default_corpus(max_documents=1200)["text"]
        for j in range(3):
            (parts / f"part-{j}.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts[j::3]))
        args = ["build", "--data", str(parts), "--tokenizer", tokenizer_path, "--cache-dir", str(cache)]
        assert main([*args, "--sharded", "--quiet"]) == 0
        found = sorted(cache.glob("sharded-*"))
    ShardedIndex.open(found[0]).layout(LayoutConfig(kind="concat", seq_len=SEQ_LEN, seed=0))
    return found[0]


def upload(paths: dict, bucket: str) -> dict:
    """The files pushed to ``bucket``: their URLs (OLMo token files, the Megatron prefix, the sharded index)."""
    from detsampler.index.push import push
    from detsampler.storage import store_for

    store = store_for(bucket)
    olmo = []
    for path in paths["olmo"]:
        for f in (path, path.with_name(path.name.replace(".npy", ".csv.gz"))):
            store.put(f"{bucket}/olmo/{f.name}", f)
        olmo.append(f"{bucket}/olmo/{path.name}")
    prefix = paths["megatron"]
    for suffix in (".bin", ".idx"):
        store.put(f"{bucket}/megatron/{prefix.name}{suffix}", Path(f"{prefix}{suffix}"))
    sharded = f"{bucket}/sharded/{paths['sharded'].name}"
    push(paths["sharded"], sharded)
    return {"olmo": olmo, "megatron": f"{bucket}/megatron/{prefix.name}", "sharded": sharded}


def open_data(kind: str, where: dict, prefetch=None):
    """``(dataset, plan)`` of ``kind`` (``mixture``, ``megatron``, ``sharded``) at ``where`` (local paths or URLs), with
    ``prefetch`` when given (the plan's micro batches: 8 x 2,048, one rank, seed 0)."""
    from detsampler.index.sharded import ShardedIndex
    from detsampler.index.sources import open_source
    from detsampler.layout import LayoutConfig
    from detsampler.loader import PackedDataset
    from detsampler.loader.mixture_dataset import MixtureDataset
    from detsampler.mixture import MixtureConfig
    from detsampler.plan import Plan

    config = LayoutConfig(kind="concat", seq_len=SEQ_LEN, seed=0)
    ahead = {} if prefetch is None else {"prefetch": prefetch}
    if kind == "mixture":
        sources = [open_source("olmo", str(p), eos_id=EOS) for p in where["olmo"]]
        layouts = [s.layout(config) for s in sources]
        mixture = MixtureConfig(weights=list(SIZES_MB), seed=0).build(layouts)
        plan = Plan(source=mixture, seed=0, global_batch_size=MICRO_BATCH, micro_batch_size=MICRO_BATCH)
        datasets = [PackedDataset(s, lay) for s, lay in zip(sources, layouts)]
        return MixtureDataset(datasets, mixture, **({**ahead, "plan": plan} if ahead else {})), plan
    if kind == "index":
        from detsampler.index import TokenIndex

        index = TokenIndex.open(str(where["index"]))
    elif kind == "megatron":
        index = open_source("megatron", str(where["megatron"]), eos_id=EOS)
    else:
        index = ShardedIndex.open(str(where["sharded"]))
    layout = index.layout(config)
    plan = Plan(layout.num_samples, seed=0, global_batch_size=MICRO_BATCH, micro_batch_size=MICRO_BATCH)
    return PackedDataset(index, layout, **({**ahead, "plan": plan} if ahead else {})), plan


# -- a node of ranks and workers, counted by a recording proxy


def node_run(urls: dict, endpoint: str, node_cache: str | None, steps: int, ranks: int = 2, workers: int = 4) -> dict:
    """Run ``ranks`` processes of ``workers`` forkserver DataLoader workers each over the OLMo mixture at ``urls``
    (``steps`` steps of world size ``ranks``), prefetching with (``node_cache``) or without the node-shared cache;
    returns each rank's batch hashes and its wall time."""
    env = {**os.environ, "AWS_ENDPOINT_URL": endpoint, "LOCAL_WORLD_SIZE": str(ranks)}
    procs = []
    for rank in range(ranks):
        args = [json.dumps(urls["olmo"]), node_cache or "-", str(rank), str(ranks), str(workers), str(steps)]
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "tests.benchmarks._remote_node_child", *args],
                cwd=ROOT,
                env={**env, "LOCAL_RANK": str(rank)},
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    out = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=1800)
        if proc.returncode:
            raise RuntimeError(f"a rank failed: {stderr[-2000:]}")
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return {"hashes": [o["hashes"] for o in out], "seconds": max(o["seconds"] for o in out)}


def node_plan_blocks(local_paths: list[Path], steps: int, ranks: int, block_bytes: int) -> tuple[int, int, int]:
    """From the plan alone (:func:`detsampler.reads.plan_reads`): the bytes of the distinct blocks of ``block_bytes``
    of the OLMo token files that the node's ranks read in ``steps`` steps, the distinct token bytes they use, and the
    bytes the micro batches' blocks add up to (each micro batch's blocks counted once: what a process with no cache
    across micro batches would fetch)."""
    from detsampler.index.sources import open_source
    from detsampler.layout import LayoutConfig
    from detsampler.mixture import MixtureConfig
    from detsampler.plan import Plan
    from detsampler.reads import Readable, plan_reads, range_blocks

    config = LayoutConfig(kind="concat", seq_len=SEQ_LEN, seed=0)
    sources = [open_source("olmo", str(p), eos_id=EOS) for p in local_paths]
    layouts = [s.layout(config) for s in sources]
    mixture = MixtureConfig(weights=list(SIZES_MB), seed=0).build(layouts)
    plan = Plan(
        source=mixture, seed=0, global_batch_size=MICRO_BATCH * ranks, micro_batch_size=MICRO_BATCH, world_size=ranks
    )
    readables = [Readable(lay, s.offsets, s.lengths, True) for s, lay in zip(sources, layouts)]
    blocks: list[set[int]] = [set() for _ in sources]
    used: list[list[tuple[int, int]]] = [[] for _ in sources]
    per_micro = 0
    for rank in range(ranks):
        reads = plan_reads(plan, readables, rank, (0, 0), steps, stop_step=steps, split=mixture.split_ids)
        for k, (src, source) in enumerate(zip(reads.sources, sources)):
            size = source.tokens.size * 4
            bounds, got = range_blocks(
                src.starts, src.stops, src.span_offsets, itemsize=4, data_offset=0, block_bytes=block_bytes
            )
            blocks[k].update(got.tolist())
            per_micro += int(sum(min((b + 1) * block_bytes, size) - b * block_bytes for b in got.tolist()))
            used[k] += list(zip((4 * src.starts).tolist(), (4 * src.stops).tolist()))
    distinct = 0
    for k, source in enumerate(sources):
        size = source.tokens.size * 4
        distinct += sum(min((b + 1) * block_bytes, size) - b * block_bytes for b in blocks[k])
    return distinct, sum(_union(r) for r in used), per_micro


def _union(ranges: list[tuple[int, int]]) -> int:
    """The bytes covered by byte ranges ``[a, b)``."""
    total, end = 0, -1
    for a, b in sorted(r for r in ranges if r[1] > r[0]):
        if a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total


# -- a fresh process's first batch


_FIRST = """
import sys, time
import torch
from tests.benchmarks._remote_parts import open_data
from detsampler.loader import PrefetchConfig, DeterministicBatchSampler, collate_micro_batch
where = {where!r}
prefetch = PrefetchConfig(budget_bytes=4 << 20, cache_bytes=8 << 20) if {prefetch!r} else None
dataset, plan = open_data({kind!r}, where, prefetch)
loader = torch.utils.data.DataLoader(dataset, batch_sampler=DeterministicBatchSampler(plan, 0, stop_step=2),
    collate_fn=collate_micro_batch, num_workers=1, multiprocessing_context="forkserver")
batch = next(iter(loader))
print("first", flush=True)
"""


def first_batch(kind: str, where: dict, endpoint: str | None, cache: Path, prefetch: bool) -> float:
    """Seconds from a fresh process's start to its first micro batch (its index opened, one forkserver worker)."""
    env = {**os.environ, "DETSAMPLER_CACHE": str(cache)}
    if endpoint:
        env["AWS_ENDPOINT_URL"] = endpoint
    code = _FIRST.format(where=where, prefetch=prefetch, kind=kind)
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline().strip()
    seconds = time.perf_counter() - t0
    proc.wait(timeout=600)
    if line != "first":
        raise RuntimeError(f"the first-batch process printed {line!r} (exit {proc.returncode})")
    return seconds


# -- the peers' S3 readers on the mixture


def peer_rows(urls: list[str], reads, steps: int) -> list[tuple[str, float]]:
    """(name, seconds per micro batch) of OLMo-core's ``get_bytes_range`` and megatron-core's ``_S3BinReader`` reading
    each span of ``steps`` micro batches of the mixture (``reads``: :func:`detsampler.reads.plan_reads`), in order."""
    spans: list[list[tuple[int, int, int]]] = [[] for _ in range(steps)]
    for k, src in enumerate(reads.sources):
        for i in range(steps):
            lo, hi = int(src.span_offsets[i]), int(src.span_offsets[i + 1])
            spans[i] += [(k, a, b) for a, b in zip(src.starts[lo:hi].tolist(), src.stops[lo:hi].tolist()) if b > a]
    out = []
    try:
        from olmo_core import io as olmo_io
        from olmo_core.io import get_bytes_range

        olmo_io._get_s3_client.cache_clear()  # its client keeps the endpoint it was made with (an earlier proxy's)
        t0 = time.perf_counter()
        for micro in spans:
            for k, a, b in micro:
                get_bytes_range(urls[k], 4 * a, 4 * (b - a))
        out.append(("OLMo-core get_bytes_range (one GET per span)", (time.perf_counter() - t0) / steps))
    except Exception as exc:  # pragma: no cover - reported, not hidden
        out.append((f"OLMo-core: failed ({type(exc).__name__}: {str(exc)[:120]})", float("nan")))
    try:
        from megatron.core.datasets.indexed_dataset import _S3BinReader
        from megatron.core.datasets.object_storage_utils import ObjectStorageConfig

        for chunk in (256 * MIB, MIB):
            config = ObjectStorageConfig(path_to_idx_cache=str(CACHE), bin_chunk_nbytes=chunk)
            readers = [_S3BinReader(u, config) for u in urls]
            t0 = time.perf_counter()
            for micro in spans:
                for k, a, b in micro:
                    readers[k].read(np.uint32, b - a, 4 * a)
            out.append(
                (
                    f"megatron-core _S3BinReader (bin_chunk_nbytes {chunk // MIB} MiB)",
                    (time.perf_counter() - t0) / steps,
                )
            )
    except Exception as exc:  # pragma: no cover - reported, not hidden
        out.append((f"megatron-core: failed ({type(exc).__name__}: {str(exc)[:120]})", float("nan")))
    return out


def batch_hash(batch: dict) -> str:
    return hashlib.sha256(b"".join(v.numpy().tobytes() for v in batch.values())).hexdigest()


# -- the parts, run against one moto server


def run_issue37(
    server_port: int, bucket: str, index_path: Path, tokenizer_path: str, args, loop, process, server_pid: int
) -> tuple[list, list, list]:
    """Benchmark 17's issue-37 tables, verdicts and notes. ``loop(dataset, plan, steps, num_workers)`` is the tiny
    training loop; ``process(args, ready)`` runs a helper process (a latency proxy, the range server) for a block;
    ``server_pid``: moto's process (its CPU time is counted)."""
    from tests.benchmarks.common import fmt_bytes
    from tests.more_servers import fault_proxy
    from tests.s3_server import free_port

    parts = set(args.parts.split(","))
    paths = make_data(tokenizer_path)
    os.environ["AWS_ENDPOINT_URL"] = f"http://127.0.0.1:{server_port}"
    urls = {**upload(paths, bucket), "index": f"{bucket}/{index_path.name}"}
    local = {"olmo": [str(p) for p in paths["olmo"]], "megatron": str(paths["megatron"])}
    local.update(sharded=str(paths["sharded"]), index=str(index_path))
    tables, verdicts, notes = [], [], []
    if "opens" in parts:
        tables.append(_opens(urls, server_port, fault_proxy))
    if "sources" in parts:
        moto = _Remote("S3 (moto)", urls, "AWS_ENDPOINT_URL", server_port, server_pid)
        tables += _sources_on_both(local, moto, paths, index_path, args, loop, process, verdicts, notes)
    for part, run in (
        ("first", lambda port: _first_batches(local, urls, port, verdicts)),
        ("peers", lambda port: _peers(local, urls, args.peer_steps)),
    ):
        if part not in parts:
            continue
        proxy_port = free_port()  # a fresh proxy per part: its connections do not pile up over the parts
        latency = [sys.executable, "-m", "tests.benchmarks._latency_proxy", str(proxy_port), str(server_port), "50"]
        with process(latency, "ready"):
            os.environ["AWS_ENDPOINT_URL"] = f"http://127.0.0.1:{proxy_port}"
            tables.append(run(proxy_port))
    if "node" in parts:
        tables.append(_node(paths, urls, server_port, args.node_steps, verdicts, fault_proxy, fmt_bytes))
    return tables, verdicts, notes


# -- each kind of data, from moto and from a store that reads only the range asked (azurite)


@dataclass
class _Remote:
    """A server the loop reads from: its ``name``, the data's ``urls`` there, the variable that points a client at it
    (``endpoint_var``), its ``port`` and ``pid`` (its CPU time is counted), and once running, its latency proxy's
    ``proxy_port`` and ``proxy_pid``."""

    name: str
    urls: dict
    endpoint_var: str
    port: int
    pid: int
    proxy_port: int = 0
    proxy_pid: int = 0

    def point(self, port: int) -> None:
        os.environ[self.endpoint_var] = f"http://127.0.0.1:{port}"


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a process and its living children have used."""
    import psutil

    total = 0.0
    try:
        proc = psutil.Process(pid)
        for p in [proc, *proc.children(recursive=True)]:
            with contextlib.suppress(psutil.NoSuchProcess):
                t = p.cpu_times()
                total += t.user + t.system
    except psutil.NoSuchProcess:
        pass
    return total


def _own_cpu_s() -> float:
    """CPU seconds of this process and its children waited for (the loop and its spawned worker, once joined)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _sources_on_both(local, moto, paths, index_path, args, loop, process, verdicts, notes) -> list:
    """The serving cost and the loop over each kind of data, against moto and (when installed) azurite, each behind
    its own latency proxy (+50 ms a request): the verdicts read the store that reads only the range asked."""
    from detsampler.index.push import push_index
    from tests.more_servers import AZURITE_BIN, azurite_server, create_container
    from tests.s3_server import free_port

    with contextlib.ExitStack() as stack:
        remotes = [moto]
        if AZURITE_BIN.exists():
            endpoint, proc = stack.enter_context(azurite_server())
            container = create_container(endpoint, "bench-remote")
            az_urls = {**upload(paths, container), "index": f"{container}/{index_path.name}"}
            push_index(index_path, az_urls["index"])
            port = int(endpoint.split(":")[2].split("/")[0])
            remotes.append(_Remote("Azure Blob (azurite)", az_urls, "AZURITE_BLOB_STORAGE_URL", port, proc.pid))
        else:
            notes.append(f"azurite is not installed ({AZURITE_BIN}): only moto's rows, and the verdicts read them")
        serve = _serving_cost(remotes)
        for r in remotes:
            r.proxy_port = free_port()
            args_ = [sys.executable, "-m", "tests.benchmarks._latency_proxy", str(r.proxy_port), str(r.port), "50"]
            r.proxy_pid = stack.enter_context(process(args_, "ready")).pid
            r.point(r.proxy_port)
        table = _sources(local, remotes, args, loop, verdicts)
        for r in remotes:
            r.point(r.port)
    return [serve, table]


def _serving_cost(remotes: list) -> object:
    """The server's CPU time per ranged GET of 16 KiB, of a 1 MiB and of a 24 MB object (200 GETs at random offsets,
    one at a time, no proxy): a server that reads the whole object to answer a range costs in proportion to it."""
    from detsampler.storage import store_for
    from tests.benchmarks.common import Table

    rows, n, rng = [], 200, np.random.default_rng(0)
    for r in remotes:
        r.point(r.port)
        small = r.urls["olmo"][0].rsplit("/", 2)[0] + "/probe-1mib"
        store = store_for(small)
        store.put(small, bytes(MIB))
        for label, url in (("1 MiB", small), (f"{SIZES_MB[0]} MB", r.urls["olmo"][0])):
            starts = rng.integers(0, store.size(url) - (16 << 10), n).tolist()
            cpu, t0 = _cpu_s(r.pid), time.perf_counter()
            for a in starts:
                store.read_ranges(url, [(a, a + (16 << 10))], coalesce_bytes=0)
            cpu, wall = (_cpu_s(r.pid) - cpu) / n, (time.perf_counter() - t0) / n
            rows.append([r.name, label, f"{cpu * 1e3:.2f} ms", f"{wall * 1e3:.2f} ms"])
    return Table(
        f"What a ranged GET of 16 KiB costs the server ({n} GETs at random offsets, one at a time, no proxy)",
        ["server", "object", "server CPU per GET", "time per GET"],
        rows,
    )


def _sources(local: dict, remotes: list, args, loop, verdicts: list) -> object:
    """The loop over each kind from local disk and from each of ``remotes`` (+50 ms), with prefetch (a pre-tokenized
    file's blocks also at 16 KiB), and the CPU time the loop (with its worker), the server and the proxy used. The
    verdicts read the last of ``remotes`` (the store that reads only the range asked, when there is one)."""
    from detsampler.loader import PrefetchConfig
    from tests.benchmarks.common import Table, Verdict

    rows = []
    prefetch = PrefetchConfig(budget_bytes=4 * MIB, cache_bytes=8 * MIB, threads=8)
    kinds = (
        ("index", "one index (12.4 MB of tokens)"),
        ("mixture", "3 OLMo .npy files (24, 16, 10 MB)"),
        ("megatron", "a Megatron .bin (24 MB)"),
        ("sharded", "a sharded index (3 shards)"),
    )
    fine = PrefetchConfig(budget_bytes=4 * MIB, cache_bytes=8 * MIB, threads=8, source_block_bytes=16 << 10)
    for kind, label in kinds:
        here, cpu = _measured(loop, open_data(kind, local), args.steps, None)
        rows.append(_row(f"{label}, local disk", here, here, cpu, args.steps))
        runs = [("64 KiB blocks", prefetch)]
        if kind in ("mixture", "megatron"):  # a pre-tokenized file's unit may be finer: no checksum chunk binds it
            runs.append(("16 KiB source blocks", fine))
        for remote in remotes:
            for unit, ahead in runs:
                there, cpu = _measured(loop, open_data(kind, remote.urls, ahead), args.steps, remote)
                added = (there["wait"] - here["wait"]) / there["step"]
                ratio = there["tokens_per_s"] / here["tokens_per_s"]
                rows.append(_row(f"{label}, {remote.name} +50 ms, prefetch, {unit}", there, here, cpu, args.steps))
                if remote is remotes[-1] and ahead is runs[-1][1]:
                    verdicts.append(
                        Verdict(
                            f"{label} from {remote.name} at +50 ms ({unit}): the wait the network adds <= 1 point of"
                            " the step, >= 90% of local throughput",
                            added <= 0.01 and ratio >= 0.9,
                            f"added wait {100 * added:+.2f} points, {100 * ratio:.0f}% of local",
                        )
                    )
    return Table(
        f"Each kind of data through the tiny training loop, {args.steps} micro batches of 8 x 2,048, one worker,"
        " prefetch on (budget 4 MiB, cache 8 MiB); CPU time per micro batch (the warm-up's too) of the loop's"
        " process with its worker, of the server and of the latency proxy",
        ["reader", "tokens/s", "vs local", "step", "data wait", "wait share", "CPU: loop", "server", "proxy"],
        rows,
    )


def _measured(loop, opened: tuple, steps: int, remote) -> tuple[dict, tuple]:
    """``loop`` over ``opened`` (dataset, plan) with one worker, and the CPU seconds (loop with its worker, server,
    proxy; None for those not running) it took."""
    pids = (remote.pid, remote.proxy_pid) if remote is not None else ()
    before = (_own_cpu_s(), *(_cpu_s(p) for p in pids))
    result = loop(*opened, steps, 1)
    after = (_own_cpu_s(), *(_cpu_s(p) for p in pids))
    cpu = tuple(b - a for a, b in zip(before, after))
    return result, cpu + (None,) * (3 - len(cpu))


def _row(name: str, r: dict, local: dict, cpu: tuple = (), steps: int = 1) -> list[str]:
    """A row of the loop's table: with ``cpu`` (seconds, or None), each per micro batch of ``steps`` + 5 warm-up."""
    per = [f"{c / (steps + 5) * 1e3:.1f} ms" if c is not None else "-" for c in cpu]
    return [
        name,
        f"{r['tokens_per_s'] / 1e3:,.0f} k",
        f"{r['tokens_per_s'] / local['tokens_per_s']:.2f}x",
        f"{r['step'] * 1e3:.1f} ms",
        f"{r['wait'] * 1e3:.2f} ms",
        f"{100 * r['wait'] / r['step']:.1f}%",
        *per,
    ]


def _opens(urls: dict, server_port: int, fault_proxy) -> object:
    """Requests and bytes of a cold and a warm open of each source of the mixture (a recording proxy, +50 ms)."""
    import tempfile

    from detsampler.index.sources import open_source
    from tests.benchmarks.common import Table

    rows = []
    saved = os.environ.get("DETSAMPLER_CACHE")
    os.environ["DETSAMPLER_CACHE"] = tempfile.mkdtemp(prefix="bench-open-")
    try:
        with fault_proxy(f"http://127.0.0.1:{server_port}", hold_s=0.05) as proxy:
            os.environ["AWS_ENDPOINT_URL"] = proxy.endpoint
            for label in ("cold (empty cache)", "warm (identity recorded, scan cached)"):
                start, t0 = len(proxy.answered), time.perf_counter()
                for u in urls["olmo"]:
                    open_source("olmo", u, eos_id=EOS)
                seconds = time.perf_counter() - t0
                got = proxy.answered[start:]
                gets = [n for m, _, _, n in got if m == "GET"]
                rows.append(
                    [f"3 OLMo sources, {label}", str(len(got)), str(len(gets)), f"{sum(gets):,}", f"{seconds:.2f} s"]
                )
    finally:
        if saved is None:
            os.environ.pop("DETSAMPLER_CACHE", None)
        else:
            os.environ["DETSAMPLER_CACHE"] = saved
    return Table(
        "Opening the mixture's 3 sources one after another (+50 ms a request)",
        ["open", "requests", "GETs", "bytes fetched", "time"],
        rows,
    )


def _first_batches(local: dict, urls: dict, proxy_port: int, verdicts: list) -> object:
    """A fresh process's first batch, local and from the bucket: the first open on an empty cache once, then three
    rounds of (local, bucket) with the cache the first filled (medians: the machine is shared)."""
    import statistics
    import tempfile

    from tests.benchmarks.common import Table, Verdict

    rows, endpoint = [], f"http://127.0.0.1:{proxy_port}"
    for kind in ("mixture", "sharded", "index"):
        cache = Path(tempfile.mkdtemp(prefix="bench-first-"))
        cold = first_batch(kind, urls, endpoint, cache, True)
        here, there = [], []
        for _ in range(3):
            here.append(first_batch(kind, local, None, cache, False))
            there.append(first_batch(kind, urls, endpoint, cache, True))
        h, t = statistics.median(here), statistics.median(there)
        rows.append([kind, f"{h:.2f} s", f"{cold:.2f} s", f"{t:.2f} s", f"{t - h:+.2f} s"])
        verdicts.append(
            Verdict(
                f"{kind}: a fresh process's first batch from the bucket within 1 s of the local one",
                t - h <= 1.0,
                f"{t:.2f} s vs {h:.2f} s locally (median of 3, {t - h:+.2f} s; the first open on an empty cache"
                f" {cold:.2f} s)",
            )
        )
    return Table(
        "A fresh process's first micro batch (process start to batch, one forkserver worker; +50 ms a request)",
        ["data", "local disk", "S3, first open on the node", "S3, a later process", "S3 - local"],
        rows,
    )


def _peers(local: dict, urls: dict, steps: int) -> object:
    from detsampler.reads import Readable, plan_reads
    from tests.benchmarks.common import Table

    dataset, plan = open_data("mixture", local)
    readables = [Readable(ds.layout, ds.index.offsets, ds.index.lengths, True) for ds in dataset.datasets]
    reads = plan_reads(plan, readables, 0, (0, 0), steps, split=dataset.mixture.split_ids)
    rows = [
        [name, f"{s * 1e3:,.0f} ms", f"{MICRO_BATCH * SEQ_LEN / s / 1e3:,.0f} k"]
        for name, s in peer_rows(urls["olmo"], reads, steps)
    ]
    return Table(
        f"The peers' S3 readers on the mixture at +50 ms, {steps} micro batches in the main process (no model)",
        ["reader", "per micro batch", "tokens/s"],
        rows,
    )


def _node(paths: dict, urls: dict, server_port: int, steps: int, verdicts: list, fault_proxy, fmt_bytes) -> object:
    import shutil
    import tempfile

    from tests.benchmarks.common import Table, Verdict

    distinct, used, per_micro = node_plan_blocks(paths["olmo"], steps, 2, 64 << 10)
    names = [u.rsplit("/", 1)[1] for u in urls["olmo"]]
    rows, runs = [], {}
    node_dir = Path(tempfile.mkdtemp(prefix="bench-node-", dir="/dev/shm" if Path("/dev/shm").is_dir() else None))
    try:
        with fault_proxy(f"http://127.0.0.1:{server_port}", hold_s=0.05) as proxy:
            for label, cache in (("per-process caches", None), ("node-shared cache", str(node_dir))):
                start = len(proxy.answered)
                run = node_run(urls, proxy.endpoint, cache, steps)
                got = [
                    (n, r)
                    for m, p, r, n in proxy.answered[start:]
                    if m == "GET" and p.split("?")[0].split("/")[-1] in names
                ]
                fetched = sum(n for n, _ in got)
                runs[label] = (run, fetched, len(got))
                rows.append(
                    [
                        f"2 ranks x 4 workers, {label}",
                        fmt_bytes(fetched),
                        str(len(got)),
                        f"{fetched / distinct:.2f}x",
                        f"{run['seconds']:.1f} s",
                    ]
                )
    finally:
        shutil.rmtree(node_dir, ignore_errors=True)
    same = runs["per-process caches"][0]["hashes"] == runs["node-shared cache"][0]["hashes"]
    ratio = runs["node-shared cache"][1] / distinct
    verdicts.append(
        Verdict(
            "8 processes (2 ranks x 4 workers): bytes fetched by the node / the distinct 64 KiB"
            " blocks its plan reads <= 1.1 with the node-shared cache",
            ratio <= 1.1 and same,
            f"{ratio:.3f}x with it, {runs['per-process caches'][1] / distinct:.2f}x with per-process"
            f" caches; batches identical: {same}",
        )
    )
    return Table(
        f"A node of 2 ranks x 4 forkserver workers over the OLMo mixture, {steps} steps of 2 x 8 x 2,048, +50 ms"
        " (bytes and GETs of the token files, counted by the recording proxy)",
        ["node", "bytes fetched", "GETs", "/ distinct blocks", "wall"],
        rows,
        [
            f"the node's plan reads {fmt_bytes(distinct)} of distinct 64 KiB blocks for {fmt_bytes(used)} of distinct"
            f" token bytes: the unit itself costs {distinct / used:.2f}x; each micro batch's blocks add up to"
            f" {fmt_bytes(per_micro)} ({per_micro / used:.1f}x): what a process without a cache across micro batches"
            " fetches"
        ],
    )
