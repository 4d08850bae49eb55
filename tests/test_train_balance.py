"""The trainer with ``[data] balance`` on (issue 34), with real processes: 2 CPU ranks under torchrun, the runs of
tests/test_train_resume.py (its tiny model, bestfit layout, 120 documents, 8 steps, a checkpoint every 2).

A balanced step reads the unbalanced plan's samples, dealt to other ranks: the logged ``sample_hash`` and
``tokens_hash`` (the step's samples and trained tokens, put back in position order) are those of the plan without
balance. Stopped and resumed, every step is bit-identical; resumed on one rank, the data is the same."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from detsampler.cli import main
from detsampler.hashing import sample_hash
from tests.test_train_resume import (  # noqa: F401  # cache_dir: a fixture
    CONFIG,
    HALF,
    N,
    _assert_same_steps,
    _copy_run,
    _overrides,
    _train,
    cache_dir,
)
from train.metrics import read_metrics

pytestmark = pytest.mark.slow
BALANCE = {"data.balance": "{attention = 0.25}"}  # 64-token samples: a weight that makes the squares count


@pytest.fixture(scope="module")
def balanced(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Path:
    """N balanced steps on 2 ranks, uninterrupted."""
    run_dir = tmp_path_factory.mktemp("balanced")
    _train(run_dir, cache_dir, **BALANCE)
    return run_dir


@pytest.fixture(scope="module")
def balanced_half(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Path:
    run_dir = tmp_path_factory.mktemp("balanced-half")
    _train(run_dir, cache_dir, stop_at=HALF, **BALANCE)
    return run_dir


def test_a_balanced_run_reads_the_unbalanced_steps_and_records_its_balance(balanced: Path, cache_dir: Path) -> None:
    from train.config import load_config
    from train.data import build_pipeline

    saved = json.loads((balanced / "checkpoints" / f"step_{N:08d}" / "data_fingerprint.json").read_text())
    plan = saved["data_fingerprint"]["plan"]
    assert plan["mapping_version"] == 3
    assert plan["balance"] == {"algorithm": "lpt", "cost": {"attention": 0.25, "linear": 1.0, "fixed": 0.0}}
    config = load_config(CONFIG, _overrides(cache_dir)[1::2]).data
    unbalanced = build_pipeline(config, world_size=2).plan
    dealt = build_pipeline(replace(config, balance={"attention": 0.25}), world_size=2).plan
    m = read_metrics(balanced)
    for step in range(N):
        assert m.steps[step]["sample_hash"] == sample_hash(unbalanced.global_batch(step)), f"step {step}"
    assert any(not np.array_equal(dealt.global_batch(s), unbalanced.global_batch(s)) for s in range(N))


def test_a_balanced_run_stopped_and_resumed_is_bit_identical(
    balanced: Path,
    balanced_half: Path,
    tmp_path: Path,
    cache_dir: Path,
) -> None:
    run_dir = _copy_run(balanced_half, tmp_path / "run")
    _train(run_dir, cache_dir, **BALANCE)
    assert [e["step"] for e in read_metrics(run_dir).resumes] == [HALF]
    _assert_same_steps(balanced, run_dir)


def test_a_balanced_run_resumed_on_one_rank_keeps_the_global_batches(
    balanced: Path,
    balanced_half: Path,
    tmp_path: Path,
    cache_dir: Path,
) -> None:
    run_dir = _copy_run(balanced_half, tmp_path / "run")
    _train(run_dir, cache_dir, nproc=1, torchrun=False, **BALANCE)
    m = read_metrics(run_dir)
    assert [(e["step"], e["world_size"]) for e in m.resumes] == [(HALF, 1)]
    _assert_same_steps(balanced, run_dir, exact_loss=False)


def test_turning_balance_off_at_a_resume_is_refused_and_show_reads_the_balanced_checkpoint(
    balanced_half: Path,
    tmp_path: Path,
    cache_dir: Path,
    capsys: pytest.CaptureFixture,
) -> None:
    run_dir = _copy_run(balanced_half, tmp_path / "run")
    result = _train(run_dir, cache_dir, nproc=1, torchrun=False, expect_rc=2)
    assert "the checkpoint's run was balanced (mapping version 3) but [data] balance is off" in result.output
    assert main(["show", "--checkpoint", str(run_dir / "checkpoints" / f"step_{HALF:08d}")]) == 0
    out = capsys.readouterr().out
    assert "balanced (LPT; cost = 0.25 * sum(len^2) + 1.0 * tokens + 0.0 per sample)" in out
    logged = read_metrics(balanced_half).steps[HALF - 1]["sample_hash"]
    assert f"step {HALF - 1}: sample hash {logged}," in out
