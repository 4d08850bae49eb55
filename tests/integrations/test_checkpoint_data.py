"""What every integration saves of its data and checks on resume (detsampler.integrations.checkpoint): the index and
layout come from a PackedDataset or a MixtureDataset of them, or are given; without them the integration refuses to
start (allow_data_change=True: a warning, and nothing saved or checked)."""

from __future__ import annotations

import pytest
import torch

from detsampler import LayoutConfig, PackedDataset, Plan
from detsampler.integrations.checkpoint import CheckpointData
from detsampler.loader.mixture_dataset import MixtureDataset
from detsampler.mixture import MixtureConfig
from detsampler.resume import DataFingerprint


def test_a_mixture_dataset_records_each_source(small_index):
    layouts = [small_index.layout(LayoutConfig(kind=k, seq_len=16)) for k in ("concat", "bestfit")]
    mixture = MixtureConfig(weights=(1, 3), seed=2).build(layouts)
    dataset = MixtureDataset([PackedDataset(small_index, lay) for lay in layouts], mixture)
    plan = Plan(source=mixture, seed=0, global_batch_size=4, micro_batch_size=2, world_size=1)
    data = CheckpointData(dataset, plan, framework="test")
    record = data.record(7, plan)
    assert record.is_mixture and len(record.indexes) == 2 and record.step == 7
    assert [c.kind for c in record.layout_configs()] == ["concat", "bestfit"]
    data.check(record.to_dict(), 7, "here")  # the same run

    def resumed(mix):
        return CheckpointData(dataset, Plan(source=mix, seed=0, global_batch_size=4, micro_batch_size=4), framework="t")

    later = MixtureConfig(weights=(1, 3), schedule=((9, (1, 1)),), seed=2).build(layouts)  # new weights ahead
    resumed(later).check(record, 7, "here")
    past = MixtureConfig(weights=(1, 3), schedule=((3, (1, 1)),), seed=2).build(layouts)  # new weights in the past
    with pytest.raises(ValueError, match="refusing to resume from here: the mixture weights schedule changes the past"):
        resumed(past).check(record, 7, "here")


def test_other_datasets_need_their_index_and_layout(small_index):
    layout = small_index.layout(LayoutConfig(kind="bestfit", seq_len=16))
    plan = Plan(layout.num_samples, seed=0, global_batch_size=4, micro_batch_size=4)
    plain = torch.utils.data.TensorDataset(torch.zeros(layout.num_samples, 16))
    with pytest.raises(ValueError, match="not a PackedDataset or MixtureDataset: pass index= and layout="):
        CheckpointData(plain, plan, framework="t")
    with pytest.raises(ValueError, match="pass both index= and layout="):
        CheckpointData(plain, plan, framework="t", index=small_index)
    given = CheckpointData(plain, plan, framework="t", index=small_index, layout=layout)
    assert given.fingerprint == DataFingerprint.of(small_index, layout, plan)
    with pytest.warns(UserWarning, match="allow_data_change=True: checkpoints record no data"):
        unknown = CheckpointData(plain, plan, framework="t", allow_data_change=True)
    assert unknown.record(3, plan) is None
    unknown.check(None, 3, "here")  # nothing to check against: warned at construction
