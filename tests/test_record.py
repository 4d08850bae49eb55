"""The data record a checkpoint saves (detsampler.record): JSON round trips, the index reopened from its location, the
plan rebuilt exactly (or refused), and resume checks through the record."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from detsampler.index.locations import open_location
from detsampler.layout import LayoutConfig
from detsampler.mixture import MixtureConfig
from detsampler.plan import Plan
from detsampler.record import RECORD_FILE, DataRecord, index_location, read_record, record_sha256
from detsampler.resume import DataFingerprint


def test_a_single_index_record_round_trips_and_rebuilds_its_plan(small_index, tmp_path):
    layout = small_index.layout(LayoutConfig(kind="bestfit", seq_len=32, seed=7))
    plan = Plan(layout.num_samples, seed=3, global_batch_size=8, micro_batch_size=2, world_size=2, skip_steps=[(4, 5)])
    record = DataRecord.of(9, small_index, layout, plan, framework="test")
    path = record.save(tmp_path)
    assert path.name == RECORD_FILE
    loaded = DataRecord.load(tmp_path)
    assert loaded == record and loaded.to_dict() == json.loads(path.read_text())
    (reopened,) = [open_location(loc) for loc in loaded.indexes]
    assert reopened.fingerprint == small_index.fingerprint
    assert loaded.layout_configs() == [LayoutConfig(kind="bestfit", seq_len=32, seed=7)]
    rebuilt = loaded.plan(reopened.layout(loaded.layout_configs()[0]).num_samples, world_size=4, micro_batch_size=1)
    assert rebuilt.fingerprint() == plan.fingerprint()
    for step in range(6):
        assert np.array_equal(rebuilt.global_batch(step), plan.global_batch(step))
    with pytest.raises(ValueError, match="no longer gives its plan"):
        loaded.plan(layout.num_samples + 1)


def test_a_mixture_record_names_each_source(small_index):
    layouts = [small_index.layout(LayoutConfig(kind=k, seq_len=16)) for k in ("concat", "document")]
    mixture = MixtureConfig(weights=(1, 3), schedule=((5, (1, 1)),), seed=2).build(layouts)
    plan = Plan(source=mixture, seed=0, global_batch_size=4, micro_batch_size=2, world_size=1)
    record = DataRecord.of(2, [small_index, small_index], layouts, plan, names=["a", "b"])
    loaded = DataRecord.from_json(record.to_json())
    assert loaded.is_mixture and loaded.names == ("a", "b") and len(loaded.indexes) == 2
    assert [c.kind for c in loaded.layout_configs()] == ["concat", "document"]


def test_resume_checks_go_through_the_library(small_index):
    layout = small_index.layout(LayoutConfig(seq_len=32))
    plan = Plan(layout.num_samples, seed=0, global_batch_size=8, micro_batch_size=2, world_size=2)
    record = DataRecord.of(5, small_index, layout, plan)
    record.check_resume(DataFingerprint.of(small_index, layout, plan.with_world(1, 8)))
    with pytest.raises(ValueError, match="changes the plan's seed"):
        record.check_resume(
            DataFingerprint.of(
                small_index, layout, Plan(layout.num_samples, seed=99, global_batch_size=8, micro_batch_size=8)
            )
        )


def test_a_foreign_or_future_record_is_refused(small_index, tmp_path):
    layout = small_index.layout(LayoutConfig(seq_len=32))
    saved = DataRecord.of(
        0, small_index, layout, Plan(layout.num_samples, seed=0, global_batch_size=8, micro_batch_size=8)
    ).to_dict()
    with pytest.raises(ValueError, match="not a detsampler data record"):
        DataRecord.from_dict({**saved, "format": "other"})
    with pytest.raises(ValueError, match="reads version 1"):
        DataRecord.from_dict({**saved, "version": 2})
    with pytest.raises(ValueError, match="no detsampler data record"):
        DataRecord.load(tmp_path)
    assert index_location(small_index) == {"kind": "index", "path": str(small_index.path.resolve())}


# -- issue 31: a record is bound to its checkpoint (its seal, the checkpoint's step, the checkpoint's own hashes)
# --------------------------------------------------------------------------------------------------------------


def _saved(small_index, directory, step=15):
    layout = small_index.layout(LayoutConfig(seq_len=32))
    plan = Plan(layout.num_samples, seed=0, global_batch_size=8, micro_batch_size=2, world_size=2)
    return DataRecord.of(step, small_index, layout, plan, framework="test").save(directory)


@pytest.mark.parametrize(("field", "edited"), [("step", 17), ("world_size", 4), ("micro_batch_size", 4)])
def test_a_hand_edited_record_fails_its_seal(small_index, tmp_path, field, edited):
    """Issue 31: step 15 -> 17 (or another world size, micro batch) edited in the JSON was read as written."""
    path = _saved(small_index, tmp_path)
    saved = json.loads(path.read_text())
    path.write_text(json.dumps({**saved, field: edited}, indent=2))
    with pytest.raises(ValueError, match=re.escape(f"{path}: the data record fails its seal (record_sha256): it was")):
        DataRecord.load(tmp_path)


def test_a_truncated_record_names_its_file(small_index, tmp_path):
    path = _saved(small_index, tmp_path)
    path.write_text(path.read_text()[:200])
    truncated = r"not valid JSON \(.*line \d+ column \d+\): the file is truncated"
    with pytest.raises(ValueError, match=rf"{re.escape(str(path))}: {truncated}"):
        DataRecord.load(path)


def test_a_record_is_bound_to_the_step_its_checkpoint_states(small_index, tmp_path):
    """A whole valid record (re-sealed, or copied from another checkpoint) whose step is not the checkpoint's."""
    path = _saved(small_index, tmp_path, step=17)
    step = r"the record's step 17 is not this checkpoint's step 15 \(COMPLETE\)"
    with pytest.raises(ValueError, match=rf"{re.escape(str(path))}: {step}"):
        read_record(path.read_text(), str(path), steps={"COMPLETE": 15})
    assert read_record(path.read_text(), str(path), steps={"COMPLETE": 17}).step == 17
    with pytest.raises(ValueError, match=r"samples_in_step 0 is not this checkpoint's 4 \(the state\)"):
        read_record(path.read_text(), "x", steps={"the state": 17}, samples_in_step=("the state", 4))


def test_a_record_not_the_one_the_checkpoints_integrity_record_names_is_refused(small_index, tmp_path):
    path = _saved(small_index, tmp_path)
    (tmp_path / "other").mkdir()
    other = _saved(small_index, tmp_path / "other", step=16)
    with pytest.raises(ValueError, match=r"its sha256 is not the one COMPLETE records"):
        read_record(other.read_bytes(), str(path), covered_by=("COMPLETE", record_sha256(path.read_bytes())))
    assert read_record(path.read_bytes(), "x", covered_by=("COMPLETE", record_sha256(path.read_bytes()))).step == 15


def test_a_record_without_a_seal_is_read_with_a_warning(small_index, tmp_path):
    """Records saved before the seal: read (they were a release's output), one warning naming the file."""
    path = _saved(small_index, tmp_path)
    saved = json.loads(path.read_text())
    del saved["record_sha256"]
    path.write_text(json.dumps(saved))
    with pytest.warns(UserWarning, match=rf"{re.escape(str(path))}: the data record carries no seal \(record_sha256"):
        assert DataRecord.load(tmp_path).step == 15


@pytest.mark.parametrize("given", [".", "detsampler_data.json", "./detsampler_data.json"])
def test_a_checkpoint_named_from_inside_it_is_bound_to_its_own_name(small_index, tmp_path, monkeypatch, given):
    """Issue 31 (re-run): `--checkpoint .` from inside `step_00000006` read step 3's record copied in (its COMPLETE
    gone) as the checkpoint's: the name `.` states no step, and the no-COMPLETE refusal looked at that name only."""
    checkpoint = tmp_path / "step_00000006"
    checkpoint.mkdir()
    (checkpoint / "data_fingerprint.json").write_text("{}")
    path = _saved(small_index, checkpoint, step=3)
    monkeypatch.chdir(checkpoint)
    with pytest.raises(ValueError, match="its trainer checkpoint has no COMPLETE marker"):
        DataRecord.load(given)
    (checkpoint / "data_fingerprint.json").unlink()
    step = "the record's step 3 is not this checkpoint's step 6 (its directory name step_00000006)"
    with pytest.raises(ValueError, match=re.escape(step)):
        DataRecord.load(given)
    assert path.is_file()
