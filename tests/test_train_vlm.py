"""The VLM trainer (issue 33, ``make demo-vlm``'s): a tiny Qwen2-VL built from its config, SIGKILLed mid-run and
resumed: the steps trained again have the same samples, the same global batch contents (pixels included) and the same
loss, bit for bit, as the killed attempt logged them."""

from __future__ import annotations

import sys

import pytest

from train.launch import run_training
from train.metrics import read_metrics


@pytest.mark.slow
def test_a_killed_vlm_run_resumes_bit_identically(tmp_path):
    cmd = [sys.executable, "-m", "train.train_vlm", "--run-dir", str(tmp_path / "run"), "--corpus", str(tmp_path)]
    cmd += ["--documents", "48", "--steps", "4", "--every", "2", "--global-batch-size", "4", "--num-workers", "1"]
    killed = run_training(cmd, kill_point="before_step:3", timeout=600)
    assert killed.killed_at == "before_step:3", killed.output[-2000:]
    resumed = run_training([*cmd, "--num-workers", "2"], timeout=600)
    assert resumed.returncode == 0, resumed.output[-2000:]
    metrics = read_metrics(tmp_path / "run")
    assert sorted(metrics.steps) == [0, 1, 2, 3] and [e["step"] for e in metrics.resumes] == [2]
    (again,) = [r for r in metrics.discarded if r["step"] == 2]  # step 2 as the killed attempt trained it
    keys = ("sample_hash", "tokens_hash", "loss", "tokens", "images")
    assert {k: again[k] for k in keys} == {k: metrics.steps[2][k] for k in keys}
    assert metrics.steps[2]["images"] > 0
