"""docs/usage.md's ``remote_batches.py``: the index pushed to a bucket reads exactly the batches of the local directory
it was pushed from, and what reading it fetched.

    python docs/examples/remote_batches.py s3://my-bucket/corpora/index-KEY .cache/detsampler/index-KEY

(``tests/test_remote_index.py`` runs it against moto's S3 on loopback.)
"""

from __future__ import annotations

import sys
import time

import torch

from detsampler import LayoutConfig, PackedDataset
from detsampler.index import TokenIndex

BATCH = 8


def main(url: str, local: str) -> int:
    remote, here = TokenIndex.open(url), TokenIndex.open(local)
    config = LayoutConfig(kind="concat", seq_len=512)
    over_url, over_dir = PackedDataset(remote, remote.layout(config)), PackedDataset(here, here.layout(config))
    start, compared = time.perf_counter(), 0
    for first in range(0, len(over_dir) - BATCH + 1, BATCH):
        ids = list(range(first, first + BATCH))
        got, want = over_url.get_batch(ids), over_dir.get_batch(ids)
        if not all(torch.equal(got[key], want[key]) for key in want):
            print(f"samples {ids} differ")
            return 1
        compared += BATCH
    print(f"{remote!r}: {compared} samples equal to the local ones in {time.perf_counter() - start:.2f} s")
    source = remote.tokens._array.source  # the object's blocks, as fetched
    print(f"tokens.npy: {source.fetched_bytes:,} bytes fetched of {source.size:,} in {source.requests} ranged reads")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
