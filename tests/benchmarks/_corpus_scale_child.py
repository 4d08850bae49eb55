"""Child process of benchmark 11 (and of tests/test_scale.py): open an index and one layout in a fresh interpreter, read
the first micro batch, then time more micro batches; report time, RSS growth and chunks read as JSON on stdout.

Reads ``{"index": PATH, "kind": K, "seq_len": L, "mode": "persisted" | "in_ram" | "distributed", "micro_batch": B,
"world_size": W, "repeats": R}`` on stdin. ``persisted`` opens ``index.layout(config)`` (built beforehand);
``in_ram`` is today's ``make_layout(config, index.lengths)``; ``distributed`` is ``torch.utils.data.DistributedSampler``
over the same number of samples (first index only: it has no layout). RSS growth is the peak resident size reached
while opening and reading the first micro batch minus the resident size just before (peak mark reset through
``/proc/self/clear_refs``), as in benchmark 2; memory-mapped pages read count in it.
"""

from __future__ import annotations

import json
import pickle
import statistics
import sys
import time

import numpy as np

from detsampler.index import TokenIndex
from detsampler.index import layouts as _layouts  # noqa: F401 - imported before the baseline, like everything else
from detsampler.layout import LayoutConfig, make_layout
from detsampler.locate import locate
from detsampler.permutation import unpermute
from detsampler.plan import Plan
from tests.benchmarks._sampler_child import _reset_peak, _status_bytes


def _chunks_read(index: TokenIndex, layout) -> int:
    """64 KiB chunks of the index's and the layout's files this process has read (and checked)."""
    inner = getattr(layout, "inner", layout)
    arrays = [index.lengths, index.offsets, *vars(inner).values()]
    if getattr(inner, "packing", None) is not None:
        arrays += list(vars(inner.packing).values())
    return sum(a.verified for a in arrays if hasattr(a, "verified"))


def check_concat_spans(index: TokenIndex, layout, spans, sample_ids: np.ndarray) -> bool:
    """Each concat sample is stream tokens [cL, cL + L + 1): checked through the inverse document order and the index's
    own lengths (independently of how the layout found the spans)."""
    from detsampler.keys import stable_hash64

    L, n = layout.config.seq_len, index.num_documents
    key = stable_hash64("document-order", layout.config.seed)
    ends = layout.ends
    for i, c in enumerate(sample_ids.tolist()):
        at = c * L
        for d, start, stop in spans.sample(i):
            pos = int(unpermute(np.array([d]), n, key, version=1)[0])  # layouts use version 1's order
            begin = int(ends[pos - 1]) if pos else 0
            if int(ends[pos]) - begin != int(index.lengths[d]) + 1 or begin + start != at:
                return False
            at += stop - start
        if at != c * L + L + 1:
            return False
    return True


def _first_distributed(n: int, world_size: int) -> float:
    import torch  # noqa: F401
    from torch.utils.data import DistributedSampler

    class Sized:
        def __len__(self) -> int:
            return n

    t0 = time.perf_counter()
    next(iter(DistributedSampler(Sized(), num_replicas=world_size, rank=0, shuffle=True, seed=0)))
    return time.perf_counter() - t0


def main() -> None:
    args = json.loads(sys.stdin.read())
    config = LayoutConfig(
        kind=args["kind"], seq_len=int(args["seq_len"]), window_docs=int(args.get("window_docs", 1024))
    )
    B, W = int(args.get("micro_batch", 8)), int(args.get("world_size", 8))
    if args["mode"] == "distributed":
        import torch  # noqa: F401 - imported before the baseline, as the others import numpy

        reset = _reset_peak()
        base, base_anon = _status_bytes("VmRSS"), _status_bytes("RssAnon")
        seconds = _first_distributed(int(args["num_samples"]), W)
        print(
            json.dumps(
                {
                    "open_first": seconds,
                    "growth": _status_bytes("VmHWM") - base if reset else None,
                    "anon_growth": _status_bytes("RssAnon") - base_anon,
                }
            )
        )
        return
    reset = _reset_peak()
    base, base_anon = _status_bytes("VmRSS"), _status_bytes("RssAnon")
    t0 = time.perf_counter()
    index = TokenIndex.open(args["index"])
    layout = index.layout(config) if args["mode"] == "persisted" else make_layout(config, index.lengths)
    plan = Plan(layout.num_samples, seed=0, global_batch_size=B * W, micro_batch_size=B, world_size=W)
    far = layout.num_samples // (2 * B * W)  # mid-epoch
    first = locate(plan, layout, step=far, rank=W - 1, micro_step=0)
    open_first = time.perf_counter() - t0
    growth = _status_bytes("VmHWM") - base if reset else None
    anon = _status_bytes("RssAnon") - base_anon  # private memory; the rest of the growth is mapped file pages (shared)
    chunks = _chunks_read(index, layout)
    rng = np.random.default_rng(0)
    steps = rng.integers(0, max(1, layout.num_samples // (B * W)), size=int(args.get("repeats", 50))).tolist()
    times, warm = [], []
    for timed in (times, warm):  # first pass: chunks read for the first time (checked); second: the same, all checked
        for s in steps:
            t = time.perf_counter()
            locate(plan, layout, step=s, rank=0, micro_step=0)
            timed.append(time.perf_counter() - t)
    t = time.perf_counter()
    blob = pickle.dumps(layout)
    again = pickle.loads(blob)
    again.locate(first.sample_ids)
    reopen = time.perf_counter() - t
    ok = check_concat_spans(index, layout, first.spans, first.sample_ids) if config.kind == "concat" else None
    print(
        json.dumps(
            {
                "open_first": open_first,
                "growth": growth,
                "anon_growth": anon,
                "chunks_read": chunks,
                "locate": statistics.median(times),
                "locate_warm": statistics.median(warm),
                "pickled_bytes": len(blob),
                "reopen": reopen,
                "num_samples": layout.num_samples,
                "spans_ok": ok,
            }
        )
    )


if __name__ == "__main__":
    main()
