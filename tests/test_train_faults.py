"""The trainer's checkpoints and run directory under faults: corrupted checkpoints, two trainers on one directory, a
killed launcher, a rewind, optimizer overrides on resume, configuration errors (issue 10, items 7-12).

Most runs are one process (no torchrun) over the tiny setup of tests/test_train_resume.py: a 6-step run checkpointing at
steps 2, 4 and 6 is trained once, and each test works on a copy of it; a resume with ``--stop-at`` equal to the step it
resumes at loads and verifies the checkpoint without training.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.test_train_resume import CONFIG, _overrides, cache_dir  # noqa: F401 - cache_dir is a fixture
from train.checkpoint import complete_checkpoints
from train.launch import KILL_MARKER, kill_tree, process_tree, run_training, train_command
from train.metrics import read_metrics

pytestmark = pytest.mark.slow

STEPS = 6


def _args(run_dir: Path, cache: Path, *extra: str, **settings: object) -> list[str]:
    settings = {"schedule.steps": STEPS, "checkpoint.every": 2, **settings}
    return ["--config", CONFIG, "--run-dir", str(run_dir), *_overrides(cache, **settings), *extra]


def _run(run_dir: Path, cache: Path, *extra: str, nproc: int = 1, **settings: object):
    return run_training(
        train_command(nproc, _args(run_dir, cache, *extra, **settings), torchrun=nproc > 1), timeout=300
    )


@pytest.fixture(scope="module")
def six_steps(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Path:
    run_dir = tmp_path_factory.mktemp("six")
    result = _run(run_dir, cache_dir)
    assert result.returncode == 0, result.output[-3000:]
    return run_dir


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _ckpt(run_dir: Path, step: int) -> Path:
    return run_dir / "checkpoints" / f"step_{step:08d}"


def _flip_byte(path: Path, offset: int = 1000) -> None:
    data = bytearray(path.read_bytes())
    data[offset % len(data)] ^= 0x01
    path.write_bytes(bytes(data))


FAULTS = {
    "flipped byte in a shard": lambda d: _flip_byte(d / "__0_0.distcp"),
    "deleted shard": lambda d: (d / "__0_0.distcp").unlink(),
    "truncated shard": lambda d: os.truncate(d / "__0_0.distcp", 100),
    "bad .metadata": lambda d: (d / ".metadata").write_bytes(b"\x80\x04not a pickle"),
    "deleted .metadata": lambda d: (d / ".metadata").unlink(),
    "bad zip record in a shard": lambda d: _flip_byte(d / "__0_0.distcp", -30),
    "COMPLETE without hashes": lambda d: (d / "COMPLETE").write_text("6\n"),
}


def _assert_one_clean_line(output: str, needle: str) -> None:
    assert "Traceback" not in output, output[-3000:]
    assert sum(needle in line for line in output.splitlines()) == 1, output[-3000:]


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_corrupted_checkpoint_is_refused_and_the_previous_one_resumes(
    six_steps: Path, tmp_path: Path, cache_dir: Path, fault: str
) -> None:
    run_dir = _copy(six_steps, tmp_path / "run")
    FAULTS[fault](_ckpt(run_dir, 6))
    result = _run(run_dir, cache_dir, "--stop-at", "4")
    assert result.returncode == 0, result.output[-3000:]
    _assert_one_clean_line(result.output, "fails verification")
    assert "falling back to step_00000004" in result.output
    assert f"resuming from {_ckpt(run_dir, 4)} at step 4" in result.output
    assert [p.name for p in complete_checkpoints(run_dir / "checkpoints")] == ["step_00000002", "step_00000004"]
    assert len(list((run_dir / "checkpoints").glob("rejected-*/step_00000006"))) == 1  # moved aside, not deleted


def test_the_fallback_trains_exactly_what_the_uninterrupted_run_trained(
    six_steps: Path, tmp_path: Path, cache_dir: Path
) -> None:
    run_dir = _copy(six_steps, tmp_path / "run")
    _flip_byte(_ckpt(run_dir, 6) / "__0_0.distcp")
    assert _run(run_dir, cache_dir, "--stop-at", "6").returncode == 0
    got, ref = read_metrics(run_dir), read_metrics(six_steps)
    assert [e["step"] for e in got.resumes] == [4]
    assert all(got.steps[s]["loss"] == ref.steps[s]["loss"] for s in range(STEPS))


def test_no_verifying_checkpoint_is_a_clear_refusal(six_steps: Path, tmp_path: Path, cache_dir: Path) -> None:
    run_dir = _copy(six_steps, tmp_path / "run")
    for step in (2, 4, 6):
        _flip_byte(_ckpt(run_dir, step) / "__0_0.distcp")
    before = (run_dir / "metrics.jsonl").read_text()
    result = _run(run_dir, cache_dir)
    assert result.returncode == 2
    _assert_one_clean_line(result.output, "error: no checkpoint under")
    assert (run_dir / "metrics.jsonl").read_text() == before  # nothing trained, nothing logged


def test_resume_path_that_fails_verification_is_refused(six_steps: Path, tmp_path: Path, cache_dir: Path) -> None:
    run_dir = _copy(six_steps, tmp_path / "run")
    (_ckpt(run_dir, 4) / "__0_0.distcp").unlink()
    result = _run(run_dir, cache_dir, "--resume", str(_ckpt(run_dir, 4)))
    assert result.returncode == 2
    _assert_one_clean_line(result.output, "the checkpoint fails verification: __0_0.distcp is missing")


def test_rewinding_moves_the_newer_checkpoints_aside(six_steps: Path, tmp_path: Path, cache_dir: Path) -> None:
    run_dir = _copy(six_steps, tmp_path / "run")
    result = _run(run_dir, cache_dir, "--resume", str(_ckpt(run_dir, 2)), "--stop-at", "2")
    assert result.returncode == 0, result.output[-3000:]
    _assert_one_clean_line(
        result.output, "rewinding to step 2: moved the newer checkpoints step_00000004, step_00000006"
    )
    assert [p.name for p in complete_checkpoints(run_dir / "checkpoints")] == ["step_00000002"]
    aside = list((run_dir / "checkpoints").glob("abandoned-*"))
    assert len(aside) == 1 and sorted(p.name for p in aside[0].iterdir()) == ["step_00000004", "step_00000006"]
    again = _run(run_dir, cache_dir, "--stop-at", "2")  # auto now finds step 2, not the abandoned timeline
    assert f"resuming from {_ckpt(run_dir, 2)} at step 2" in again.output


def test_a_new_learning_rate_on_resume_is_applied_and_recorded(
    six_steps: Path, tmp_path: Path, cache_dir: Path
) -> None:
    from train.config import load_config
    from train.train import lr_factor

    run_dir = _copy(six_steps, tmp_path / "run")
    result = _run(run_dir, cache_dir, "--resume", str(_ckpt(run_dir, 4)), **{"optimizer.lr": 0.001})
    assert result.returncode == 0, result.output[-3000:]
    assert "applied on resume (the checkpoint had other values): optimizer.lr: 0.003 -> 0.001" in result.output
    m = read_metrics(run_dir)
    cfg = load_config(CONFIG, [f"schedule.steps={STEPS}", "schedule.warmup_steps=2"])
    for step in (4, 5):
        assert m.steps[step]["lr"] == pytest.approx(0.001 * lr_factor(cfg, step), rel=1e-12)
    assert m.resumes[-1]["optimizer_changes"] == ["optimizer.lr: 0.003 -> 0.001"]
    assert json.loads((run_dir / "config.json").read_text())["optimizer"]["lr"] == 0.001


def _start_held(run_dir: Path, cache: Path, point: str, nproc: int = 1) -> tuple[subprocess.Popen, str]:
    """Start a run that stops at kill point ``point`` (it prints the marker and sleeps); returns it and its output."""
    env = {
        **os.environ,
        "DETSAMPLER_TEST_KILL_POINT": point,
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": str(Path(__file__).resolve().parent.parent),
    }
    proc = subprocess.Popen(
        train_command(nproc, _args(run_dir, cache), torchrun=nproc > 1),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
    )
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.strip() == f"{KILL_MARKER} {point}":
            return proc, "".join(lines)
    raise AssertionError("the held run ended early:\n" + "".join(lines)[-3000:])


def test_a_second_trainer_on_the_same_run_directory_is_refused(
    six_steps: Path, tmp_path: Path, cache_dir: Path
) -> None:
    run_dir = _copy(six_steps, tmp_path / "run")
    (_ckpt(run_dir, 6)).rename(run_dir / "checkpoints" / "moved")  # so that the first run has steps to train
    first, _ = _start_held(run_dir, cache_dir, "before_step:5")
    try:
        before = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
        result = _run(run_dir, cache_dir)
        assert result.returncode == 2
        _assert_one_clean_line(result.output, "is in use by another trainer")
        assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == before
    finally:
        kill_tree(first.pid)
        first.wait()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("point", ["before_init:0", "before_step:3"], ids=["rendezvous", "training"])
def test_ranks_exit_when_their_launcher_is_killed(tmp_path: Path, cache_dir: Path, point: str) -> None:
    """SIGKILL torchrun alone: its ranks (one held at a kill point, the other waiting for it) must not outlive it."""
    proc, _ = _start_held(tmp_path / "run", cache_dir, point, nproc=2)
    ranks = [p for p in process_tree(proc.pid) if p != proc.pid]
    assert ranks
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 30
    while any(_alive(p) for p in ranks) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = [p for p in ranks if _alive(p)]
    for p in left:
        os.kill(p, signal.SIGKILL)
    assert not left, f"ranks {left} outlived their launcher"


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"data.layout": '"document"', "data.seq_len": 1}, "seq_len must be >= 2 for the document layout"),
        ({"data.layout": '"bestfit"', "data.seq_len": 1}, "seq_len must be >= 2 for the bestfit layout"),
        ({"data.nonsense": 1}, "unknown key(s) ['nonsense'] in config section [data]"),
    ],
)
def test_a_configuration_error_is_one_line_printed_once(
    tmp_path: Path,
    cache_dir: Path,
    settings: dict,
    message: str,
) -> None:
    result = _run(tmp_path / "run", cache_dir, nproc=2, **settings)
    assert result.returncode != 0
    lines = [line for line in result.output.splitlines() if message in line]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output[-3000:]
    assert 'File "' + str(Path(__file__).resolve().parent.parent / "train") not in result.output  # no trainer traceback
    assert not (tmp_path / "run").exists()  # nothing written


# -- issue 21: nothing silent at the edges
# -----------------------------------------------------------------------------------------------------------------


def _listing(directory: Path) -> list[str]:
    """Every path under ``directory`` (the lock file aside), relative to it."""
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*") if p.name != ".lock")


@pytest.mark.parametrize(
    "nproc, settings, message",
    [
        (1, {"data.seed": 99}, "was trained on a different data stream than this configuration: layout.num_samples"),
        (
            2,
            {"model.dim": 32},
            "does not load into this model: ValueError: Size mismatch between saved torch.Size([512, 64]) and current:"
            " torch.Size([512, 32]) for model.tok_embeddings.weight",
        ),
    ],
    ids=["other data", "other model shape, 2 ranks"],
)
def test_a_refused_rewind_changes_nothing(
    six_steps: Path, tmp_path: Path, cache_dir: Path, nproc: int, settings: dict, message: str
) -> None:
    """``--resume step_2`` that is then refused (other data; a model of another shape, whose DCP error used to be a
    traceback per rank) used to move step_4 and step_6 aside first, so that a later ``--resume auto`` rewound to 2."""
    run_dir = _copy(six_steps, tmp_path / "run")
    before = _listing(run_dir)
    result = _run(run_dir, cache_dir, "--resume", str(_ckpt(run_dir, 2)), nproc=nproc, **settings)
    assert result.returncode != 0
    assert "[rank0]" not in result.output and "CheckpointException" not in result.output, result.output[-3000:]
    assert 'File "' + str(Path(__file__).resolve().parent.parent / "train") not in result.output  # no trainer traceback
    assert sum(message in line for line in result.output.splitlines()) == 1, result.output[-3000:]
    line = next(line for line in result.output.splitlines() if message in line)
    assert line.startswith(f"error: checkpoint {_ckpt(run_dir, 2)} ")
    assert "layout.seed: 1234 -> 99" in line or "model.dim" in settings
    assert _listing(run_dir) == before  # nothing moved aside, nothing logged


def test_a_refused_auto_resume_leaves_the_checkpoint_that_fails_verification_in_place(
    six_steps: Path, tmp_path: Path, cache_dir: Path
) -> None:
    run_dir = _copy(six_steps, tmp_path / "run")
    _flip_byte(_ckpt(run_dir, 6) / "__0_0.distcp")
    before = _listing(run_dir)
    result = _run(run_dir, cache_dir, **{"data.seed": 99})
    assert result.returncode == 2
    _assert_one_clean_line(result.output, "error: checkpoint")
    assert "fails verification" not in result.output  # said when it is moved aside, which a refused resume does not
    assert _listing(run_dir) == before
    again = _run(run_dir, cache_dir, "--stop-at", "4")
    assert again.returncode == 0, again.output[-3000:]
    _assert_one_clean_line(again.output, "fails verification")
    assert f"resuming from {_ckpt(run_dir, 4)} at step 4" in again.output


def test_a_checkpoint_missing_only_complete_is_moved_aside_like_every_rejected_one(
    six_steps: Path, tmp_path: Path, cache_dir: Path
) -> None:
    run_dir = _copy(six_steps, tmp_path / "run")
    (_ckpt(run_dir, 6) / "COMPLETE").unlink()
    result = _run(run_dir, cache_dir, "--stop-at", "4")
    assert result.returncode == 0, result.output[-3000:]
    _assert_one_clean_line(result.output, f"checkpoint {_ckpt(run_dir, 6)} has no COMPLETE marker")
    assert f"resuming from {_ckpt(run_dir, 4)} at step 4" in result.output
    aside = list((run_dir / "checkpoints").glob("rejected-*/step_00000006"))
    assert len(aside) == 1 and (aside[0] / "__0_0.distcp").is_file()  # moved aside, not deleted


def test_a_second_trainer_writing_into_the_first_ones_checkpoint_directory_is_refused(
    six_steps: Path, tmp_path: Path, cache_dir: Path
) -> None:
    """Each trainer used to lock only its own run directory: a second one with ``checkpoint.dir`` set to the first one's
    checkpoints wrote into them (and a later resume continued from the other run's weights)."""
    run_dir = _copy(six_steps, tmp_path / "run")
    _ckpt(run_dir, 6).rename(run_dir / "checkpoints" / "moved")  # so that the first run has steps to train
    first, _ = _start_held(run_dir, cache_dir, "before_step:5")
    try:
        before = _listing(run_dir)
        other = tmp_path / "other"
        result = _run(other, cache_dir, **{"checkpoint.dir": f'"{run_dir / "checkpoints"}"'})
        assert result.returncode == 2
        _assert_one_clean_line(
            result.output, f"error: {(run_dir / 'checkpoints').resolve()} is in use by another trainer (pid {first.pid}"
        )
        assert _listing(run_dir) == before
        assert not (other / "metrics.jsonl").exists()
    finally:
        kill_tree(first.pid)
        first.wait()
