"""Child process of benchmark 18: open an SFT (chat) index and read the plan's first micro batch; report seconds and
resident-memory growth as JSON.

Reads ``{"path": ..., "seq_len": ..., "micro_batch_size": ...}`` on stdin. Everything the open needs is imported before
the baseline; growth is VmRSS after minus before, the peak VmHWM after a reset of the kernel's peak mark
(``/proc/self/clear_refs``) just before the open, minus the baseline; and VmRSS's two parts: RssAnon (the process's own
memory) and RssFile (pages of the page cache mapped into it: the memory-mapped files' pages it touched, mapped a whole
cached folio at a time, shared with every process of the node that maps them and reclaimable)."""

from __future__ import annotations

import json
import sys
import time

import numpy as np

from detsampler import DeterministicBatchSampler, LayoutConfig, PackedDataset, Plan
from detsampler.index import TokenIndex
from tests.benchmarks._open_child import _status_kb


def main() -> None:
    args = json.loads(sys.stdin.read())
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
    before, anon_before, file_before = _status_kb("VmRSS"), _status_kb("RssAnon"), _status_kb("RssFile")
    t0 = time.perf_counter()
    index = TokenIndex.open(args["path"])
    open_s = time.perf_counter() - t0
    open_rss = _status_kb("VmRSS")
    t1 = time.perf_counter()
    dataset = PackedDataset(index, index.layout(LayoutConfig(kind="concat", seq_len=args["seq_len"])))
    plan = Plan(
        len(dataset), seed=0, global_batch_size=args["micro_batch_size"], micro_batch_size=args["micro_batch_size"]
    )
    batch = dataset.get_batch(np.asarray(next(iter(DeterministicBatchSampler(plan, rank=0)))))
    first_s = time.perf_counter() - t1
    after, peak = _status_kb("VmRSS"), _status_kb("VmHWM")
    print(
        json.dumps(
            {
                "open_seconds": open_s,
                "open_rss_growth": (open_rss - before) * 1024,
                "first_batch_seconds": first_s,
                "rss_growth": (after - before) * 1024,
                "peak_growth": (peak - before) * 1024,
                "anon_growth": (_status_kb("RssAnon") - anon_before) * 1024,
                "file_growth": (_status_kb("RssFile") - file_before) * 1024,
                "num_documents": index.num_documents,
                "num_tokens": index.num_tokens,
                "trained_in_batch": int(batch["loss_mask"].sum()),
                "tokens_in_batch": int(batch["loss_mask"].numel()),
                "mask_is_memmap": bool(index.loss_mask.memory_mapped),
            }
        )
    )


if __name__ == "__main__":
    main()
