"""The one composed entry point: (plan, layout, step, rank, micro step) -> sample ids, epochs and token spans.

The batch sampler, the packed dataset and the CLI all go through :func:`locate` (or the two calls it composes,
``plan.micro_batch`` and ``layout.locate``), so random access and iteration cannot disagree.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from detsampler.layout import Layout, Spans
from detsampler.plan import Plan

__all__ = ["Located", "locate", "check_compatible"]


@dataclass(frozen=True)
class Located:
    """The samples one rank reads at one micro step (or a whole step), with where each one comes from."""

    step: int
    rank: int | None
    micro_step: int | None
    positions: np.ndarray  # global positions in the stream
    sample_ids: np.ndarray
    epochs: np.ndarray
    spans: Spans


def check_compatible(plan: Plan, layout: Layout) -> None:
    """Raise unless ``plan`` draws from exactly the samples of ``layout``."""
    if plan.stream.num_samples != layout.num_samples:
        raise ValueError(
            f"the plan has {plan.stream.num_samples} samples per epoch but the layout has {layout.num_samples}: "
            "build the plan with num_samples=layout.num_samples"
        )


def locate(plan: Plan, layout: Layout, step: int, rank: int | None = None, micro_step: int | None = None) -> Located:
    """What ``rank`` reads at ``micro_step`` of ``step``.

    ``rank=None`` means every rank and ``micro_step=None`` every micro step; with both None this is the whole global batch,
    in micro-step-major, then rank order.
    """
    check_compatible(plan, layout)
    if rank is None and micro_step is None:
        positions = plan.step_positions(step)
    else:
        ranks = range(plan.world_size) if rank is None else [rank]
        micro_steps = range(plan.num_micro_steps(step)) if micro_step is None else [micro_step]
        positions = np.concatenate([plan.micro_batch_positions(step, a, r) for a in micro_steps for r in ranks])
    sample_ids = plan.stream.sample_ids(positions)
    return Located(step, rank, micro_step, positions, sample_ids, plan.stream.epochs(positions), layout.locate(sample_ids))
