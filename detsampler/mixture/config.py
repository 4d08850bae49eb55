"""The configuration of a data mixture (the TOML ``[mixture]`` table, the CLI's mixture options):
:class:`MixtureConfig`.

Invariant: a MixtureConfig that constructs is one :meth:`MixtureConfig.build` turns into a
:class:`~detsampler.mixture.stream.Mixture`
without a weight or schedule error: every weight list and step is checked here, with the same messages.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from detsampler.checks import check_int
from detsampler.mixture.stream import Mixture, Source
from detsampler.mixture.weights import as_weight_list, normalize_weights, parse_schedule

__all__ = ["MixtureConfig"]


def _schedule_rows(schedule: Any) -> list[tuple[Any, Any]]:
    """The schedule entries as ``(first_step, weights)`` pairs: TOML tables ``{step, weights}`` or pairs, checked for
    shape."""
    rows = []
    for i, entry in enumerate(schedule):
        if isinstance(entry, dict):
            unknown = set(entry) - {"step", "weights"}
            if unknown or "step" not in entry or "weights" not in entry:
                raise ValueError(f"schedule entry {i} must have exactly the keys step and weights, got {sorted(entry)}")
            entry = (entry["step"], entry["weights"])
        if isinstance(entry, (str, bytes)) or not isinstance(entry, Sequence) or len(entry) != 2:
            raise ValueError(f"schedule entry {i} must be (first_step, weights), got {entry!r}")
        weights = as_weight_list(entry[1], f"schedule entry {i} weights")
        rows.append((entry[0], tuple(weights) if isinstance(weights, Sequence) else weights))
    return rows


def _checked_names(names: Any, num_sources: int) -> tuple[str, ...]:
    """``names`` as a tuple: one distinct non-empty string per source."""
    if isinstance(names, (str, bytes)) or not isinstance(names, Sequence):
        raise ValueError(f"names must be a list of strings, one per source, got {names!r}")
    out = tuple(names)
    if len(out) != num_sources or not all(isinstance(n, str) and n for n in out):
        raise ValueError(f"names must be one non-empty string per source ({num_sources}), got {names!r}")
    if len(set(out)) != len(out):
        raise ValueError(f"names must be distinct, got {out!r}")
    return out


def _checked_sources(sources: Any, num_sources: int) -> tuple[str, ...]:
    """``sources`` as a tuple: one non-empty path per weight."""
    srcs = tuple(sources) if not isinstance(sources, (str, bytes)) else None
    if srcs is None or len(srcs) != num_sources or not all(isinstance(x, str) and x for x in srcs):
        raise ValueError(f"sources must be one non-empty path per weight ({num_sources}), got {sources!r}")
    return srcs


@dataclass(frozen=True, kw_only=True)
class MixtureConfig:
    """A mixture as configured (a TOML ``[mixture]`` table): weights from step 0, later schedule entries, seed, names.

    ``weights``: one number (or fraction string such as ``"1/3"``) per source; ``schedule``: ``(first_step, weights)``
    entries after step 0, strictly increasing (data steps); ``names``: labels of the sources, for reports; ``sources``:
    the data of each source (a local corpus path, what ``IndexConfig.data`` takes), for the tools that build the
    indexes. In TOML::

        [mixture] sources = ["data/web", "data/code", "data/books"] names = ["web", "code", "books"] weights = [0.7,
        0.2, 0.1] schedule = [{step = 5000, weights = [0.4, 0.2, 0.4]}]
    """

    weights: tuple[Any, ...]
    schedule: tuple[tuple[int, tuple[Any, ...]], ...] = ()
    seed: int = 0
    names: tuple[str, ...] | None = None
    sources: tuple[str, ...] | None = (
        None  # where each source's documents are (the CLI's and trainer's IndexConfig.data)
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "weights", as_weight_list(self.weights, "weights"))
        if isinstance(self.weights, (str, bytes)) or not isinstance(self.weights, Sequence) or not self.weights:
            raise ValueError(f"weights must be a non-empty list of numbers, one per source, got {self.weights!r}")
        object.__setattr__(self, "weights", tuple(self.weights))
        if (
            self.sources is not None
            and not isinstance(self.sources, (str, bytes))
            and isinstance(self.sources, Sequence)
        ):
            normalize_weights(self.weights, len(self.sources))  # the count first: "one weight per source (N)"
        rows = _schedule_rows(self.schedule)
        object.__setattr__(self, "schedule", tuple(rows))
        if rows and rows[0][0] == 0:
            raise ValueError("schedule entries start after step 0: the weights at step 0 are `weights`")
        check_int(self.seed, "seed")
        if self.names is not None:
            object.__setattr__(self, "names", _checked_names(self.names, len(self.weights)))
        if self.sources is not None:
            object.__setattr__(self, "sources", _checked_sources(self.sources, len(self.weights)))
        normalize_weights(self.weights, len(self.weights))
        for i, (step, ws) in enumerate(rows):
            normalize_weights(ws, len(self.weights), f"schedule entry {i} (step {step}) weights")
        parse_schedule(self.weights_schedule(), len(self.weights))  # and the steps

    @property
    def num_sources(self) -> int:
        return len(self.weights)

    @property
    def labels(self) -> tuple[str, ...]:
        """``names``, else the sources' paths, else ``source0, source1, ...``."""
        return self.names or self.sources or tuple(f"source{k}" for k in range(self.num_sources))

    def weights_schedule(self) -> list[tuple[int, list[Any]]]:
        """``[(0, weights), *schedule]``: what :class:`Mixture` takes as ``weights``."""
        return [(0, list(self.weights))] + [
            (int(s) if isinstance(s, numbers.Integral) else s, list(w)) for s, w in self.schedule
        ]

    def build(self, sources: Sequence[Source | int]) -> Mixture:
        """The mixture of ``sources`` (layouts, in the order of ``weights``)."""
        if len(sources) != self.num_sources:
            raise ValueError(f"the mixture config has {self.num_sources} weights but got {len(sources)} sources")
        return Mixture(list(sources), self.weights_schedule(), self.seed)
