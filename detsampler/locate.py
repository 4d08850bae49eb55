"""The one composed entry point: (plan, layout, step, rank, micro step) -> sample ids, epochs and token spans.

The batch sampler, the packed dataset and the CLI all go through :func:`locate` (or the two calls it composes,
``plan.micro_batch`` and ``layout.locate``), so random access and iteration cannot disagree.

For a plan over a :class:`~detsampler.mixture.Mixture`, ``layout`` is the list of the sources' layouts (or the mixture
itself, when its sources are layouts): each sample's spans come from its own source's layout, so their ``doc_ids`` are
documents of that source, and :attr:`Located.sources` names it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from detsampler.layout import Layout
from detsampler.mixture import Mixture
from detsampler.plan import Plan
from detsampler.spans import Spans, merge_spans

__all__ = ["Located", "check_compatible", "locate", "merge_spans"]


@dataclass(frozen=True)
class Located:
    """The samples one rank reads at one micro step (or a whole step), with where each one comes from."""

    step: int
    rank: int | None
    micro_step: int | None
    positions: np.ndarray  # global positions in the stream
    sample_ids: np.ndarray
    epochs: np.ndarray  # for a mixture: the epoch within each sample's source
    spans: Spans
    sources: np.ndarray | None = None  # mixture only: the source of each sample
    source_sample_ids: np.ndarray | None = None  # mixture only: the sample id within that source


def _source_layouts(mixture: Mixture, layout: Layout | Sequence[Layout] | Mixture) -> list[Layout]:
    layouts = list(layout.sources if isinstance(layout, Mixture) else layout) if not hasattr(layout, "locate") else None
    if layouts is None or len(layouts) != mixture.num_sources or not all(hasattr(x, "locate") for x in layouts):
        raise ValueError(
            f"the plan draws from a mixture of {mixture.num_sources} sources: pass their layouts (a list, one per"
            f" source, or a Mixture built over layouts), got {type(layout).__name__}"
        )
    for k, (lay, n) in enumerate(zip(layouts, mixture.sizes)):
        if lay.num_samples != n:
            raise ValueError(f"mixture source {k} has {n} samples but layout {k} has {lay.num_samples}")
    return layouts


def _check_balance_layouts(plan: Plan, layouts: Sequence[Layout]) -> None:
    """A balanced plan's costs come from its own layouts: they must describe the layouts it is read with."""
    for k, (own, given) in enumerate(zip(plan.balance.layouts, layouts)):  # type: ignore[union-attr]
        if own is not given and own.describe() != given.describe():
            raise ValueError(
                f"the plan balances by the spans of another layout than the one given (source {k}: {own.describe()}"
                f" against {given.describe()}): build Balance over the layout the plan is read with"
            )


def check_compatible(plan: Plan, layout: Layout) -> None:
    """Raise unless ``plan`` draws from exactly the samples of ``layout`` (for a mixture: of the sources' layouts), and,
    for a balanced plan, balances by that layout's spans."""
    if isinstance(plan.stream, Mixture):
        layouts = _source_layouts(plan.stream, layout)
        if plan.balance is not None:
            _check_balance_layouts(plan, layouts)
        return
    if plan.stream.num_samples != layout.num_samples:
        raise ValueError(
            f"the plan has {plan.stream.num_samples} samples per epoch but the layout has {layout.num_samples}: "
            "build the plan with num_samples=layout.num_samples"
        )
    ordered = bool(getattr(layout.config, "epoch_order", False))
    if ordered != bool(getattr(plan.stream, "epoch_ids", False)):
        raise ValueError(
            f"the layout has epoch_order={ordered} (a new document order each epoch: its samples depend on the epoch)"
            f" but the plan has epoch_ids={not ordered}: build the plan with epoch_ids={ordered}, so that its sample"
            " ids carry their epoch exactly when the layout needs it"
        )
    if plan.balance is not None:
        _check_balance_layouts(plan, [layout])


def locate(plan: Plan, layout: Layout, step: int, rank: int | None = None, micro_step: int | None = None) -> Located:
    """What ``rank`` reads at ``micro_step`` of ``step``.

    Args:
        plan: the plan (its stream may be a mixture).
        layout: the layout the plan's samples index; for a mixture, the sources' layouts (a list) or the mixture.
        step: the training step.
        rank: the data-parallel rank, or None for every rank.
        micro_step: the micro step within ``step``, or None for every micro step.

    Returns:
        The :class:`Located` samples: with ``rank`` and ``micro_step`` both None the whole global batch, in
        micro-step-major, then rank order. A pure function of its arguments (tests/test_determinism.py).
    """
    check_compatible(plan, layout)
    if rank is None and micro_step is None:
        positions = plan.step_positions(step)
    else:
        ranks = range(plan.world_size) if rank is None else [rank]
        micro_steps = range(plan.num_micro_steps(step)) if micro_step is None else [micro_step]
        positions = np.concatenate([plan.micro_batch_positions(step, a, r) for a in micro_steps for r in ranks])
    if isinstance(plan.stream, Mixture):
        layouts = _source_layouts(plan.stream, layout)
        look = plan.stream.lookup(positions)
        parts = []
        for k in np.unique(look.source):
            idx = np.flatnonzero(look.source == k)
            parts.append((idx, layouts[int(k)].locate(look.source_sample[idx])))
        spans = merge_spans(parts, len(positions))
        return Located(
            step, rank, micro_step, positions, look.global_id, look.source_epoch, spans, look.source, look.source_sample
        )
    sample_ids = plan.stream.sample_ids(positions)
    return Located(
        step, rank, micro_step, positions, sample_ids, plan.stream.epochs(positions), layout.locate(sample_ids)
    )
