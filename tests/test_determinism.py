"""Two runs with the same arguments agree bit for bit, across processes (no salted hash, no global random state)."""

from __future__ import annotations

import os
import subprocess
import sys

SCRIPT = """
import hashlib, sys, numpy as np
from detsampler import LayoutConfig, Plan, locate, make_layout
lengths = np.random.default_rng(0).integers(0, 200, size=300)
h = hashlib.sha256()
for kind in ("concat", "document", "bestfit"):
    layout = make_layout(LayoutConfig(kind=kind, seq_len=32, seed=11, window_docs=16), lengths)
    plan = Plan(layout.num_samples, 7, 24, 2, 3, batch_size_schedule=[(0, 12), (4, 24)])
    for step in list(range(12)) + [10**9]:
        for rank in range(3):
            loc = locate(plan, layout, step, rank)
            for a in (loc.sample_ids, loc.epochs, loc.spans.offsets, loc.spans.doc_ids, loc.spans.starts,
            loc.spans.stops):
                h.update(np.ascontiguousarray(a, dtype=np.int64).tobytes())
print(h.hexdigest())
"""


def digest(hash_seed: str) -> str:
    env = dict(os.environ, PYTHONHASHSEED=hash_seed)
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_two_processes_agree_bit_for_bit():
    first, second = digest("1"), digest("2")
    assert len(first) == 64 and first == second


def test_importing_the_core_does_not_import_torch():
    code = "import sys, detsampler; from detsampler import *; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
