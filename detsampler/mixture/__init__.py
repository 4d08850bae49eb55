"""Deterministic data mixtures: exact weights, a seeded routing tree, schedules (numpy-only, above the core).

- :mod:`~detsampler.mixture.stream`: :class:`Mixture`, the pure map position -> (source, sample id);
- :mod:`~detsampler.mixture.tree`: the routing tree of Beatty splits and its discrepancy bound;
- :mod:`~detsampler.mixture.weights`: weights read as exact fractions, and weight schedules;
- :mod:`~detsampler.mixture.config`: :class:`MixtureConfig`, the TOML ``[mixture]`` table and the CLI's options.
"""

from __future__ import annotations

from detsampler.mixture.config import MixtureConfig
from detsampler.mixture.stream import Mixture, MixtureLookup, Source
from detsampler.mixture.weights import MAX_DENOMINATOR, normalize_weights

__all__ = ["MAX_DENOMINATOR", "Mixture", "MixtureConfig", "MixtureLookup", "Source", "normalize_weights"]
