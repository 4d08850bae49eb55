"""Pinned outputs of the mapping: users rely on them across versions.

If one of these fails, the mapping changed. If that was on purpose, bump ``MAPPING_VERSION`` (detsampler/version.py),
keep the old version computable and add pins for the new one in the same commit: every cache and checkpoint fingerprint
then changes with it, so resuming an old run under the new mapping fails loudly instead of silently reading other data.
The pins of an old version never change: a run started on it resumes exactly (``Plan(..., mapping_version=1)``).
"""

from __future__ import annotations

import numpy as np

from detsampler import MAPPING_VERSION, LayoutConfig, Plan, make_layout, permute
from detsampler.keys import stable_hash64
from detsampler.version import MAPPING_VERSIONS


def test_mapping_version():
    assert MAPPING_VERSION == 2
    assert MAPPING_VERSIONS == (1, 2, 3)  # 3: the balanced plan's (tests/test_balance.py)


def test_pinned_hash_and_permutation():
    assert stable_hash64("a", 1) == 4743243401550993662
    assert permute(np.arange(8), 1000, 12345).tolist() == [133, 601, 432, 512, 898, 524, 47, 842]  # the keyed sort
    assert permute(np.arange(8), 10**6, 12345).tolist() == [
        535266,
        94573,
        579096,
        238939,
        14298,
        448395,
        356741,
        508138,
    ]
    assert permute(np.array([0, 1, 2**41]), 2**42 + 7, 12345).tolist() == [2489372792195, 2908304626110, 682393012405]


def test_pinned_permutation_version_1():
    assert permute(np.arange(8), 1000, 12345, version=1).tolist() == [382, 406, 629, 648, 548, 296, 365, 849]


def test_pinned_plan():
    plan = Plan(10**6, 2024, 16, 2, 4)
    assert plan.micro_batch(0, 0, 0).tolist() == [648654, 495883]
    assert plan.micro_batch(10**9, 1, 3).tolist() == [369100, 69426]
    assert plan.fingerprint()["mapping_version"] == MAPPING_VERSION


def test_pinned_plan_version_1():
    """Version 1's orders and fingerprint, exactly as the first release computed them: its runs resume unchanged."""
    plan = Plan(10**6, 2024, 16, 2, 4, mapping_version=1)
    assert plan.micro_batch(0, 0, 0).tolist() == [960902, 866288]
    assert plan.micro_batch(10**9, 1, 3).tolist() == [663265, 599137]
    assert plan.fingerprint() == {
        "mapping_version": 1,
        "stream": {"kind": "epochs", "num_samples": 10**6, "seed": 2024},
        "seed": 2024,
        "batch_size_schedule": [[0, 16]],
    }


def test_pinned_plan_version_3():
    """The balanced plan: which rank reads which of a step's samples, dealt by the cost model (its ids, per step, are
    version 2's)."""
    from detsampler.balance import Balance, CostModel

    layout = make_layout(LayoutConfig(kind="bestfit", seq_len=64, seed=1), (np.arange(300) * 37) % 151)
    cost = CostModel(attention=1 / 64, linear=1.0, fixed=0.0)
    plan = Plan(layout.num_samples, 2024, 16, 2, 4, balance=Balance(layout, cost))
    assert layout.num_samples == 356
    assert plan.slot_order(0).tolist() == [0, 11, 1, 12, 2, 15, 3, 14, 4, 13, 5, 9, 7, 8, 10, 6]
    assert plan.micro_batch(0, 0, 0).tolist() == [68, 211]
    assert plan.micro_batch(0, 1, 3).tolist() == [214, 257]
    assert plan.micro_batch(10**9, 1, 3).tolist() == [186, 254]
    assert sorted(plan.global_batch(7)) == sorted(Plan(layout.num_samples, 2024, 16, 2, 4).global_batch(7))
    assert permute(np.arange(8), 1000, 12345, version=3).tolist() == permute(np.arange(8), 1000, 12345).tolist()


def test_pinned_layouts():
    """The same in every mapping version (the document order is version 1's permutation)."""
    lengths = np.arange(20)
    concat = make_layout(LayoutConfig(kind="concat", seq_len=8, seed=3), lengths)
    assert concat.locate(np.array([0, 5])).sample(1) == [(7, 3, 8), (17, 0, 4)]
    bestfit = make_layout(LayoutConfig(kind="bestfit", seq_len=8, seed=3, window_docs=4), lengths)
    assert bestfit.num_samples == 29
    assert bestfit.locate(np.array([0, 5])).sample(1) == [(12, 8, 13)]
