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


# -- the instance filter (issue 24): part of the data a run trains on


def _filtered(instance_filter) -> DataFingerprint:
    layout = make_layout(LayoutConfig(kind="bestfit", seq_len=16, seed=0, window_docs=8), LENGTHS)
    plan = Plan(layout.num_samples, seed=0, global_batch_size=4, micro_batch_size=2)
    return DataFingerprint.of("idx-a", layout, plan, instance_filter=instance_filter)


def test_no_instance_filter_leaves_the_fingerprint_and_its_hash_as_they_were():
    plain = _filtered(None)
    assert plain == _fingerprint() and plain.hash == _fingerprint().hash
    assert "instance_filter" not in plain.to_dict()


def test_a_resume_with_another_instance_filter_or_none_is_refused():
    from detsampler.filter import RepetitionFilter

    on, strict = _filtered(RepetitionFilter()), _filtered(RepetitionFilter(max_count=8))
    assert on.to_dict()["instance_filter"] == {"kind": "repetition", "max_period": 13, "min_period": 1, "max_count": 32}
    assert len({on.hash, strict.hash, _filtered(None).hash}) == 3
    saved = json.loads(json.dumps(on.to_dict()))  # as a checkpoint stores it
    assert DataFingerprint.from_dict(saved) == on
    check_resume(saved, _filtered(RepetitionFilter()), 3)
    with pytest.raises(ValueError, match=r"changes the instance filter: instance_filter.max_count: 32 -> 8"):
        check_resume(saved, strict, 3)
    with pytest.raises(
        ValueError, match=r"changes the instance filter: instance_filter.kind: 'repetition' -> '<absent>'"
    ):
        check_resume(saved, _filtered(None), 3)
    with pytest.raises(
        ValueError, match=r"changes the instance filter: instance_filter.kind: '<absent>' -> 'repetition'"
    ):
        check_resume(_filtered(None), on, 0)
    with pytest.raises(ValueError, match="instance_filter must be a RepetitionFilter"):
        _filtered("repetition")


def test_a_record_with_an_instance_filter_is_audited(capsys, small_index, tmp_path):
    """The record keeps the filter; ``--checkpoint`` reopens the data with it (its fingerprint matches)."""
    from detsampler.cli import main
    from detsampler.filter import RepetitionFilter
    from detsampler.record import DataRecord

    layout = small_index.layout(LayoutConfig(kind="bestfit", seq_len=64))
    plan = Plan(layout.num_samples, seed=0, global_batch_size=8, micro_batch_size=2)
    record = DataRecord.of(4, small_index, layout, plan, instance_filter=RepetitionFilter(max_count=4))
    record.save(tmp_path)
    assert DataRecord.load(tmp_path).fingerprint.instance_filter["max_count"] == 4
    assert main(["verify", "--checkpoint", str(tmp_path)]) == 0
    assert "OK: no duplicates, no gaps" in capsys.readouterr().out
