"""The library's resume check sees the whole data stream: the index, the layout (config and seed) and the plan."""

from __future__ import annotations

import json

import numpy as np
import pytest

from detsampler import DataFingerprint, LayoutConfig, Plan, check_resume, make_layout

LENGTHS = np.array([5, 70, 3, 40, 18, 9, 64, 1, 33, 12] * 3, dtype=np.int64)


def _fingerprint(
    index: str = "idx-a", layout_seed: int = 0, kind: str = "bestfit", plan_seed: int = 0
) -> DataFingerprint:
    layout = make_layout(LayoutConfig(kind=kind, seq_len=16, seed=layout_seed, window_docs=8), LENGTHS)
    return DataFingerprint.of(
        index, layout, Plan(layout.num_samples, seed=plan_seed, global_batch_size=4, micro_batch_size=2)
    )


def test_a_changed_layout_seed_is_refused_although_the_plans_are_equal():
    """The fault of issue 10 item 6: the plans are equal, the layouts' spans are not."""
    a, b = _fingerprint(layout_seed=0, kind="concat"), _fingerprint(layout_seed=1, kind="concat")
    assert a.plan == b.plan
    with pytest.raises(ValueError, match=r"changes the layout: layout.seed: 0 -> 1"):
        check_resume(a, b, 3)


def test_another_index_or_layout_kind_is_refused_and_the_same_stream_passes():
    with pytest.raises(ValueError, match="changes the index: index: 'idx-a' -> 'idx-b'"):
        check_resume(_fingerprint(), _fingerprint(index="idx-b"), 3)
    with pytest.raises(ValueError, match="changes the layout"):
        check_resume(_fingerprint(), _fingerprint(kind="document"), 3)
    with pytest.raises(ValueError, match="changes the plan's seed"):
        check_resume(_fingerprint(), _fingerprint(plan_seed=1), 3)
    saved = json.loads(json.dumps(_fingerprint().to_dict()))  # as a checkpoint stores it
    check_resume(saved, _fingerprint(), 3)
    assert DataFingerprint.from_dict(saved) == _fingerprint()


def test_a_plan_alone_is_refused_with_a_hint():
    plan = Plan(30, seed=0, global_batch_size=4, micro_batch_size=2)
    with pytest.raises(ValueError, match=r"DataFingerprint.of\(index, layout, plan\)"):
        check_resume(plan, _fingerprint(), 3)


def test_a_tampered_saved_fingerprint_is_refused():
    saved = _fingerprint().to_dict()
    saved["layout"]["seed"] = 7
    with pytest.raises(ValueError, match="does not match its content"):
        check_resume(saved, _fingerprint(), 3)


def test_the_hash_is_the_trainers_historical_one():
    """Checkpoints written before the move keep resuming: the hash is sha256 of the sorted JSON body, 16 hex digits."""
    import hashlib

    fp = _fingerprint()
    body = json.dumps({"index": fp.index, "layout": fp.layout, "plan": fp.plan}, sort_keys=True, default=str)
    assert fp.hash == hashlib.sha256(body.encode()).hexdigest()[:16]
