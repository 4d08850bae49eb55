"""Pinned outputs of the mapping: users rely on them across versions.

If one of these fails, the mapping changed. If that was on purpose, bump ``MAPPING_VERSION`` (detsampler/version.py) and
update the pins in the same commit: every cache and checkpoint fingerprint then changes with it, so resuming an old run
under the new mapping fails loudly instead of silently reading other data.
"""

from __future__ import annotations

import numpy as np

from detsampler import MAPPING_VERSION, LayoutConfig, Plan, make_layout, permute
from detsampler.keys import stable_hash64


def test_mapping_version():
    assert MAPPING_VERSION == 1


def test_pinned_hash_and_permutation():
    assert stable_hash64("a", 1) == 4743243401550993662
    assert permute(np.arange(8), 1000, 12345).tolist() == [382, 406, 629, 648, 548, 296, 365, 849]


def test_pinned_plan():
    plan = Plan(10**6, 2024, 16, 2, 4)
    assert plan.micro_batch(0, 0, 0).tolist() == [960902, 866288]
    assert plan.micro_batch(10**9, 1, 3).tolist() == [663265, 599137]
    assert plan.fingerprint()["mapping_version"] == MAPPING_VERSION


def test_pinned_layouts():
    lengths = np.arange(20)
    concat = make_layout(LayoutConfig(kind="concat", seq_len=8, seed=3), lengths)
    assert concat.locate(np.array([0, 5])).sample(1) == [(7, 3, 8), (17, 0, 4)]
    bestfit = make_layout(LayoutConfig(kind="bestfit", seq_len=8, seed=3, window_docs=4), lengths)
    assert bestfit.num_samples == 29
    assert bestfit.locate(np.array([0, 5])).sample(1) == [(12, 8, 13)]
