"""Issue 22's open-time target, measured once (not part of ``make test`` or ``make bench``): opening a remote index of
10^8 documents and locating its first micro batch in < 1 s and < 100 MB, without downloading O(documents).

A lengths-only synthetic index (:func:`detsampler.index.synthetic.synthetic_index`, int32 lengths, mean 1,000 tokens)
and its persisted ``concat`` layout (``seq_len`` 2,048, seed 0) are built under ``--work`` (reused when there), pushed
(:func:`detsampler.index.push.push_index`) to moto's S3 server on loopback (``tests/s3_server.py``, run in this
process), then a fresh child process (``--child URL``), with everything it needs imported before its baseline, times
``TokenIndex.open(URL)``, ``index.layout(config)`` (the pushed layout) and ``layout.locate`` of the plan's first micro
batch (``Plan(layout.num_samples, seed=0, global_batch_size=8, micro_batch_size=8)``, step 0). It counts what the
object store returned (every ``ObjectStore`` call and the bytes of its answers, wrapped in the child) and its resident
memory growth (VmRSS after minus before; the peak: VmHWM after a reset of the kernel's mark, minus the baseline).

Usage: ``python -m tests.benchmarks.remote_open_scale [--documents 100000000] [--work DIR] [--servers moto,http]
[--repeat N]`` (``--repeat``: that many fresh processes through the range server, in turn); prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

SEQ_LEN, MICRO_BATCH = 2048, 8


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _child(url: str) -> dict:
    import obstore  # noqa: F401  (imported before the baseline: the client library is not the open's cost)

    from detsampler.index import TokenIndex
    from detsampler.layout import LayoutConfig
    from detsampler.plan import Plan
    from detsampler.storage import ObjectStore

    counts: dict = {"requests": 0, "bytes": 0, "calls": {}, "objects": {}}

    def counted(name, real):
        def call(self, *args, **kwargs):
            out = real(self, *args, **kwargs)
            counts["requests"] += 1
            counts["calls"][name] = counts["calls"].get(name, 0) + 1
            got = sum(len(b) for b in out) if name == "read_ranges" else len(out[0]) if name == "read_head" else 0
            counts["bytes"] += got
            key = str(args[0]).rsplit("/", 2 if "/layouts/" in str(args[0]) else 1)[-1]
            counts["objects"][key] = counts["objects"].get(key, 0) + got
            return out

        return call

    for name in ("size", "read_ranges", "read_head", "exists", "list"):
        setattr(ObjectStore, name, counted(name, getattr(ObjectStore, name)))
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
    before = _status_kb("VmRSS")
    t0 = time.perf_counter()
    index = TokenIndex.open(url)
    t_open = time.perf_counter()
    layout = index.layout(LayoutConfig(kind="concat", seq_len=SEQ_LEN, seed=0))
    t_layout = time.perf_counter()
    plan = Plan(layout.num_samples, seed=0, global_batch_size=MICRO_BATCH, micro_batch_size=MICRO_BATCH)
    ids = plan.micro_batch(0, 0, 0)
    spans = layout.locate(ids)
    t_locate = time.perf_counter()
    after, peak = _status_kb("VmRSS"), _status_kb("VmHWM")
    seen = json.loads(json.dumps(counts))  # what the open and the locate fetched, before the probe below
    probe = {}  # the server's cost of one 64 KiB ranged GET, by the size of the object it is cut from
    store = ObjectStore()
    for name in ("lengths.sums.npy", "lengths.npy", f"{str(layout.path)[len(url) + 1 :]}/ends.npy"):
        size = store.size(f"{url}/{name}")
        t = time.perf_counter()
        store.read_ranges(f"{url}/{name}", [(size // 2, min(size, size // 2 + (1 << 16)))])
        probe[name.rsplit("/", 1)[-1]] = {"object_bytes": size, "seconds": time.perf_counter() - t}
    return {
        "url": url,
        "num_documents": index.num_documents,
        "num_tokens": index.num_tokens,
        "num_samples": layout.num_samples,
        "layout": str(layout.path),
        "first_micro_batch": [int(i) for i in ids],
        "spans": int(spans.doc_ids.size),
        "open_s": t_open - t0,
        "layout_s": t_layout - t_open,
        "locate_s": t_locate - t_layout,
        "total_s": t_locate - t0,
        "requests": seen["requests"],
        "calls": seen["calls"],
        "fetched_bytes": seen["bytes"],
        "fetched_by_object": seen["objects"],
        "rss_growth_bytes": (after - before) * 1024,
        "peak_growth_bytes": (peak - before) * 1024,
        "one_ranged_get": probe,
    }


def _run_child(url: str) -> dict:
    child = subprocess.run(
        [sys.executable, "-m", "tests.benchmarks.remote_open_scale", "--child", url],
        env=dict(os.environ),
        capture_output=True,
        text=True,
        check=False,
    )
    if child.returncode:
        raise SystemExit(f"the child failed:\n{child.stderr[-4000:]}")
    return json.loads(child.stdout.strip().splitlines()[-1])


def _sizes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--documents", type=int, default=100_000_000)
    parser.add_argument("--work", default=".cache/remote-open-scale")
    parser.add_argument("--servers", default="moto,http", help="comma-separated: moto (S3), http (range server)")
    parser.add_argument("--repeat", type=int, default=1, help="fresh processes opening through the range server")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    servers = set(args.servers.split(","))
    if args.child:
        result = _child(args.child)
        print(json.dumps(result))
        return result

    from detsampler.index.push import push_index
    from detsampler.index.synthetic import synthetic_index
    from detsampler.layout import LayoutConfig
    from tests.more_servers import range_http_server
    from tests.s3_server import create_bucket, moto_server

    work = Path(args.work) / f"docs-{args.documents}"
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    index = synthetic_index(work, args.documents, progress=True)
    t_index = time.perf_counter()
    index.layout(LayoutConfig(kind="concat", seq_len=SEQ_LEN, seed=0), progress=True)
    t_layout = time.perf_counter()
    result: dict = {}
    if "moto" in servers:
        with moto_server() as (endpoint, _server):
            bucket = create_bucket(endpoint, "open-scale")
            url = f"{bucket}/scale/{index.path.name}"
            pushed = push_index(index.path, url)
            result["push_s"] = time.perf_counter() - t_layout
            result.update(_run_child(url), pushed_objects=pushed.objects, pushed_bytes=pushed.num_bytes)
    if "http" in servers:
        with range_http_server(work) as http:  # the same files, served by ranges read from disk: O(range) per request
            url = f"{http}/{index.path.name}"
            result["http_range_server"] = [_run_child(url) for _ in range(args.repeat)]
    result.update(
        index_bytes=_sizes(index.path),
        build_index_s=t_index - t0,
        build_layout_s=t_layout - t_index,
        free_disk_after=shutil.disk_usage(work).free,
    )
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
