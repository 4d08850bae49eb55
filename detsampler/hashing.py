"""The per-step sample hash: a short hash of a step's global sample ids, which the trainer logs per step and
``detsampler show`` prints, so that a logged step can be matched to its documents.

Invariant: ``sample_hash(plan.global_batch(step))`` depends only on the step's sample ids in global position order, so
it is the same for any number of ranks, micro batch size or DataLoader workers.
"""

from __future__ import annotations

import hashlib

import numpy as np

__all__ = ["sample_hash"]


def sample_hash(sample_ids: np.ndarray) -> str:
    """A short hash of a step's global sample ids in position order (the same for any number of ranks; a balanced
    plan's slots are put back in position order first, ``Plan.by_position``)."""
    return hashlib.sha256(np.ascontiguousarray(sample_ids, dtype="<i8").tobytes()).hexdigest()[:12]
