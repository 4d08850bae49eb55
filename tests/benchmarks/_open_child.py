"""Child process of benchmark 10: open one pre-tokenized source, report the seconds and the resident-memory growth as
JSON.

Reads ``{"kind": ..., "path": ..., "options": {...}}`` on stdin. Everything the open needs is imported before the
baseline; the growth is VmRSS after the open (the source still referenced) minus VmRSS before, and the peak is VmHWM
after a reset of the kernel's peak mark (``/proc/self/clear_refs``) just before the open, minus the baseline."""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

from detsampler.index.sources import open_source


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def main() -> None:
    args = json.loads(sys.stdin.read())
    if args.get("cache_dir"):
        os.environ["DETSAMPLER_CACHE"] = args["cache_dir"]  # where an EOS scan's or a metadata parse's result is kept
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
    before = _status_kb("VmRSS")
    t0 = time.perf_counter()
    source = open_source(args["kind"], args["path"], **args.get("options", {}))
    seconds = time.perf_counter() - t0
    after, peak = _status_kb("VmRSS"), _status_kb("VmHWM")
    print(
        json.dumps(
            {
                "seconds": seconds,
                "rss_growth": (after - before) * 1024,
                "peak_growth": (peak - before) * 1024,
                "num_documents": source.num_documents,
                "num_tokens": source.num_tokens,
                "tokens_is_memmap": isinstance(source.tokens, np.memmap),
            }
        )
    )


if __name__ == "__main__":
    main()
