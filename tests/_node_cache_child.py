"""One rank of a node, for tests/test_node_cache.py: reads its micro batches of steps ``[0, STEPS)`` of an index (or
pre-tokenized source) in a bucket through ``DataLoader`` workers started by forkserver, each prefetching through the
node-shared cache, and prints one JSON line: the sha256 of every batch in order.

    python -m tests._node_cache_child URL KIND NODE_CACHE CAP_BYTES RANK WORLD_SIZE WORKERS STEPS
"""

from __future__ import annotations

import hashlib
import json
import sys

import torch

from detsampler.index.sharded import open_index
from detsampler.index.sources import open_source
from detsampler.layout import LayoutConfig
from detsampler.loader import DeterministicBatchSampler, PackedDataset, PrefetchConfig, collate_micro_batch
from detsampler.plan import Plan

CONFIG = LayoutConfig(kind="concat", seq_len=64, seed=1)
KIB = 1024


def main(argv: list[str]) -> None:
    url, kind, node_cache, cap, rank, world_size, workers, steps = argv
    index = open_index(url) if kind == "index" else open_source(kind, url, eos_id=7)
    layout = index.layout(CONFIG)
    plan = Plan(layout.num_samples, seed=4, global_batch_size=8 * int(world_size), micro_batch_size=4,
                world_size=int(world_size))  # fmt: skip
    ahead = PrefetchConfig(
        budget_bytes=128 * KIB,
        cache_bytes=128 * KIB,
        threads=2,
        node_cache=node_cache if node_cache != "-" else None,
        node_cache_bytes=int(cap) if node_cache != "-" else None,
    )
    dataset = PackedDataset(index, layout, prefetch=ahead, plan=plan)
    loader = torch.utils.data.DataLoader(
        dataset,
        batch_sampler=DeterministicBatchSampler(plan, int(rank), stop_step=int(steps)),
        num_workers=int(workers),
        collate_fn=collate_micro_batch,
        multiprocessing_context="forkserver" if int(workers) else None,
    )
    hashes = [hashlib.sha256(b"".join(v.numpy().tobytes() for v in batch.values())).hexdigest() for batch in loader]
    print(json.dumps({"hashes": hashes}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
