"""torchtitan's own classes over detsampler: the loader is a ``BaseDataLoader`` built from its ``Config`` as
torchtitan's trainer builds it, iterated as its training loop does, checkpointed with DCP under "dataloader" and resumed
at another dp degree (which torchtitan's own loader refuses): each global batch equals the uninterrupted run's."""

from __future__ import annotations

import sys

import pytest

if sys.version_info < (3, 11):  # torchtitan 0.3.0 requires Python >= 3.11; the test extra installs it from there on
    pytest.skip("torchtitan needs Python >= 3.11", allow_module_level=True)

import torch.distributed.checkpoint as dcp
from torchtitan.components.dataloader import BaseDataLoader

from detsampler.integrations.torchtitan import DetsamplerDataLoader

SEQ_LEN, GLOBAL_BATCH, LOCAL_BATCH = 32, 8, 2


def build(index_paths, dp_world_size, dp_rank, **config):
    """What torchtitan's trainer calls: ``config.dataloader.build(...)`` with its runtime arguments."""
    paths = [str(p) for p in index_paths]
    cfg = DetsamplerDataLoader.Config(index_paths=paths, global_batch_size=GLOBAL_BATCH, **config)
    return cfg.build(
        dp_world_size=dp_world_size,
        dp_rank=dp_rank,
        tokenizer=None,
        seq_len=SEQ_LEN,
        local_batch_size=LOCAL_BATCH,
        snapshot_every_n_steps=1,
    )


def train_steps(loaders, num_steps):
    """Per step, the sorted rows (input tokens) of all ranks' micro batches, drawn as torchtitan's loop draws them:
    ``global_batch / (local_batch * dp)`` micro batches per rank and step from one long-lived iterator per rank."""
    iterators = [iter(loader) for loader in loaders]
    accumulation = GLOBAL_BATCH // (LOCAL_BATCH * len(loaders))
    steps = []
    for _ in range(num_steps):
        rows = []
        for it in iterators:
            for _ in range(accumulation):
                inputs, labels = next(it)
                assert set(inputs) == {"input"} and labels.shape == inputs["input"].shape == (LOCAL_BATCH, SEQ_LEN)
                rows += [tuple(r) for r in inputs["input"].tolist()]
        steps.append(sorted(rows))
    return steps


def test_checkpoint_at_dp_2_resumes_at_dp_1_and_4_with_the_same_global_batches(small_index, tmp_path):
    full = train_steps([build([small_index.path], 2, r) for r in range(2)], 5)
    loaders = [build([small_index.path], 2, r) for r in range(2)]
    assert isinstance(loaders[0], BaseDataLoader)
    assert train_steps(loaders, 3) == full[:3]
    states = [loader.state_dict() for loader in loaders]
    assert states == [{"step": 3, "samples_in_step": 0}] * 2  # no dp_rank_N keys: DCP's de-duplication keeps rank 0's
    dcp.save({"dataloader": loaders[0]}, checkpoint_id=tmp_path / "ckpt", no_dist=True)
    for dp in (1, 4):
        resumed = [build([small_index.path], dp, r) for r in range(dp)]
        for loader in resumed:
            dcp.load({"dataloader": loader}, checkpoint_id=tmp_path / "ckpt", no_dist=True)
            assert loader.state_dict() == {"step": 3, "samples_in_step": 0}
        assert train_steps(resumed, 2) == full[3:], f"dp {dp}"


def test_a_mixture_of_two_indexes_resumes_too(small_index):
    config = {"weights": [0.5, 0.5], "mixture_seed": 3, "layout": "bestfit"}
    full = train_steps([build([small_index.path] * 2, 2, r, **config) for r in range(2)], 3)
    resumed = [build([small_index.path] * 2, 1, 0, **config)]
    resumed[0].load_state_dict({"step": 1, "samples_in_step": 0})
    assert train_steps(resumed, 2) == full[1:]
