"""One rank of benchmark 17's node (:func:`tests.benchmarks._remote_parts.node_run`): reads its micro batches of the
OLMo mixture in a bucket through forkserver DataLoader workers, each prefetching (through the node-shared cache when
one is given), and prints one JSON line: the sha256 of each batch and the seconds it took.

    python -m tests.benchmarks._remote_node_child URLS_JSON NODE_CACHE RANK RANKS WORKERS STEPS
"""

from __future__ import annotations

import json
import sys
import time

import torch

from detsampler.index.sources import open_source
from detsampler.layout import LayoutConfig
from detsampler.loader import DeterministicBatchSampler, PackedDataset, PrefetchConfig, collate_micro_batch
from detsampler.loader.mixture_dataset import MixtureDataset
from detsampler.mixture import MixtureConfig
from detsampler.plan import Plan
from tests.benchmarks._remote_parts import EOS, MICRO_BATCH, SEQ_LEN, SIZES_MB, batch_hash


def main(argv: list[str]) -> None:
    urls, node_cache, rank, ranks, workers, steps = json.loads(argv[0]), argv[1], *map(int, argv[2:])
    t0 = time.perf_counter()
    config = LayoutConfig(kind="concat", seq_len=SEQ_LEN, seed=0)
    sources = [open_source("olmo", u, eos_id=EOS) for u in urls]
    layouts = [s.layout(config) for s in sources]
    mixture = MixtureConfig(weights=list(SIZES_MB), seed=0).build(layouts)
    plan = Plan(source=mixture, seed=0, global_batch_size=MICRO_BATCH * ranks, micro_batch_size=MICRO_BATCH,
                world_size=ranks)  # fmt: skip
    node = {} if node_cache == "-" else {"node_cache": node_cache, "node_cache_bytes": 1 << 30}
    ahead = PrefetchConfig(budget_bytes=4 << 20, cache_bytes=8 << 20, **node)
    datasets = [PackedDataset(s, lay) for s, lay in zip(sources, layouts)]
    dataset = MixtureDataset(datasets, mixture, prefetch=ahead, plan=plan)
    loader = torch.utils.data.DataLoader(
        dataset,
        batch_sampler=DeterministicBatchSampler(plan, rank, stop_step=steps),
        num_workers=workers,
        collate_fn=collate_micro_batch,
        multiprocessing_context="forkserver",
    )
    hashes = [batch_hash(batch) for batch in loader]
    print(json.dumps({"hashes": hashes, "seconds": time.perf_counter() - t0}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
