"""The GPU check (issue 26) tested on CPU: ``scripts/gpu_check.sh --device cpu`` runs ``train.gpu_check``'s CPU
fallback (gloo, fp32, the tiny model on one rank under torchrun, 8 steps on the first 120 files of the default corpus),
which kills, resumes, compares and reports exactly as on a GPU; an injected mismatch must fail it, a spent time budget
too, each with its JSON report written. ``scripts/gpu_wheels.sh --dry-run`` lists one pin per package.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from train.compare import compare_runs
from train.metrics import RunMetrics

ROOT = Path(__file__).resolve().parent.parent
TOKENIZER = "tokenizer-512.model"


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from detsampler.text.corpus import default_corpus
    from detsampler.text.tokenizer import train_tokenizer

    root = tmp_path_factory.mktemp("cache")
    train_tokenizer(None, 512, root / TOKENIZER, texts=default_corpus(max_documents=120)["text"])
    return root


def _check(tmp_path: Path, cache_dir: Path, *extra: str) -> tuple[int, str, dict]:
    settings = {
        "data.cache_dir": f'"{cache_dir}"',
        "data.tokenizer": f'"{cache_dir / TOKENIZER}"',
        "data.max_documents": 120,
        "data.vocab_size": 512,
        "data.layout": '"bestfit"',
        "data.window_docs": 32,
        "schedule.warmup_steps": 2,
    }
    sets = [a for k, v in settings.items() for a in ("--set", f"{k}={v}")]
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable, "GPU_CHECK_TIMEOUT": "200"}
    cmd = ["bash", "scripts/gpu_check.sh", "--device", "cpu", "--out", str(tmp_path / "runs"), *sets, *extra]
    result = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    output = result.stdout + result.stderr
    assert (out / "gpu_check.json").exists(), output[-4000:]
    assert (out / "gpu_check.log").read_text().strip().endswith(f"exit {result.returncode}")
    return result.returncode, output, json.loads((out / "gpu_check.json").read_text())


@pytest.mark.slow
def test_the_cpu_fallback_kills_resumes_compares_and_reports(tmp_path: Path, cache_dir: Path) -> None:
    rc, output, report = _check(tmp_path, cache_dir)
    assert rc == 0, output[-4000:]
    assert report["status"] == "ok" and report["error"] is None
    assert ">>> SIGKILL sent to every process of the run (torchrun and its rank) at before_step:6" in output
    assert "GPU CHECK OK" in output
    cmp = report["comparison"]
    assert (cmp["sample_hashes_equal"], cmp["tokens_equal"], cmp["losses_equal"]) == (8, 8, 8)
    assert cmp["resumed_at"] == [4] and cmp["retrained_steps"] == 2 and cmp["max_abs_loss_diff"] == 0
    assert [s["step"] for s in report["steps"]] == list(range(8)) and all(s["same"] for s in report["steps"])
    # the data wait of the steady steps: A (prefetch 0) all but steps 0-1, B (prefetch 2) also without 4-5 (resume)
    waits = report["data_wait_ms"]
    assert waits["prefetch_0"]["n"] == 6 and waits["prefetch_2"]["n"] == 4
    assert all(w["max"] >= w["median"] >= 0 for w in waits.values())
    speed = report["speed"]["A"]
    assert speed["tokens_per_s"] > 0 and speed["mfu"] is None and speed["peak_mem_gib"] is None  # CPU
    assert report["config"]["precision"] == "fp32" and report["config"]["deterministic"] is True
    assert report["config"]["strict_determinism"] is True  # a no-op on CPU, where determinism is always strict
    out = tmp_path / "out"
    assert (out / "gpu_check.txt").read_text().startswith("GPU CHECK OK")
    for name in ("metrics_A.jsonl", "metrics_B.jsonl"):
        assert (out / name).stat().st_size > 0


@pytest.mark.slow
def test_an_injected_loss_mismatch_fails_the_check(tmp_path: Path, cache_dir: Path) -> None:
    """Run B resumes with twice the learning rate: the same data, other losses after the resume step -> exit 1."""
    rc, output, report = _check(tmp_path, cache_dir, "--inject-mismatch", "loss")
    assert rc == 1, output[-4000:]
    assert report["status"] == "mismatch" and "GPU CHECK MISMATCH" in output
    cmp = report["comparison"]
    assert cmp["sample_hashes_equal"] == 8 and cmp["tokens_equal"] == 8
    assert cmp["bad_steps"] == [5, 6, 7] and cmp["losses_equal"] == 5


def test_a_spent_time_budget_fails_with_its_report(tmp_path: Path, cache_dir: Path) -> None:
    rc, output, report = _check(tmp_path, cache_dir, "--budget-s", "0")
    assert rc == 2, output[-4000:]
    assert report["status"] == "failed" and "time budget" in report["error"]
    assert "comparison" not in report and report["model"]["params"] > 0


def _metrics(rows: dict[int, tuple[str, float]]) -> RunMetrics:
    return RunMetrics(steps={s: {"sample_hash": h, "tokens_hash": h, "loss": loss} for s, (h, loss) in rows.items()})


def test_a_tolerance_loosens_the_losses_never_the_data() -> None:
    a = _metrics({0: ("x", 1.0), 1: ("y", 2.0)})
    close = _metrics({0: ("x", 1.0), 1: ("y", 2.0 + 1e-6)})
    assert compare_runs(a, close, 2).bad == [1]  # bit for bit by default
    assert compare_runs(a, close, 2, loss_tolerance=1e-5).bad == []
    other_data = _metrics({0: ("x", 1.0), 1: ("z", 2.0)})
    assert compare_runs(a, other_data, 2, loss_tolerance=1.0).bad == [1]
    assert compare_runs(a, _metrics({0: ("x", 1.0)}), 2, loss_tolerance=1.0).bad == [1]  # a missing step


def test_the_flop_count_counts_the_models_parameters() -> None:
    from train.config import load_config
    from train.gpu_check import model_flops
    from train.model import Transformer

    cfg = load_config(ROOT / "train" / "configs" / "tiny.toml").model
    flops = model_flops(cfg, 2048, 64)
    real = sum(p.numel() for p in Transformer(replace(cfg, vocab_size=2048)).parameters())
    assert flops["params"] == real
    assert flops["matmul_params"] == real - 2048 * cfg.dim
    assert flops["flops_per_token"] == 6 * flops["matmul_params"] + 12 * cfg.n_layers * cfg.dim * 64
    tied = model_flops(replace(cfg, tie_embeddings=True), 2048, 64)
    assert tied["matmul_params"] == tied["params"] == real - 2048 * cfg.dim


def test_the_wheels_script_pins_one_version_of_each_package() -> None:
    result = subprocess.run(
        ["bash", "scripts/gpu_wheels.sh", "--dry-run", "pyarrow==26.0.1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    pins = result.stdout.splitlines()[0].removeprefix("pins: ").split()
    names = [p.split("==")[0] for p in pins]
    assert {"datasets", "dill", "multiprocess", "fsspec", "pyarrow"} == set(names) and len(names) == len(set(names))
    assert "--no-deps --only-binary=:all: --python-version 3.12" in result.stdout
    assert "pip download" in result.stdout and "-d .whl" in result.stdout


def test_a_refused_nondeterministic_operation_is_recognised() -> None:
    from train.gpu_check import determinism_error

    refused = (
        "RuntimeError: scatter_add_cuda_kernel does not have a deterministic implementation, but you set "
        "'torch.use_deterministic_algorithms(True)'."
    )
    assert determinism_error(["step 0 ...", refused])
    assert not determinism_error(["RuntimeError: CUDA out of memory", "UserWarning: ... non-deterministic ..."])


def test_a_run_b_that_cannot_finish_in_time_stops_the_check_after_run_a(
    tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run A took (as if) 200 s for 8 steps: run B (6 + 8 - 4 = 10 steps) would need 250 s of a 150 s budget."""
    import train.gpu_check as gpu_check

    calls = []
    monkeypatch.setattr(gpu_check, "run_logged", lambda label, args, **kw: calls.append(label) or 200.0)
    sets = [
        f'data.cache_dir="{cache_dir}"',
        f'data.tokenizer="{cache_dir / TOKENIZER}"',
        "data.max_documents=120",
        "data.vocab_size=512",
    ]
    argv = ["--device", "cpu", "--budget-s", "150", "--out", str(tmp_path / "runs"), "--json", str(tmp_path / "r.json")]
    assert gpu_check.main(argv + [a for s in sets for a in ("--set", s)]) == 2
    report = json.loads((tmp_path / "r.json").read_text())
    assert calls == ["A"] and report["status"] == "failed"
    assert "run B would take about 250s at run A's pace" in report["error"]


def _write_steps(run_dir: Path, first: dict, steps: range, loss_shift: float = 0.0) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / "metrics.jsonl", "a") as f:
        f.write(json.dumps(first) + "\n")
        for s in steps:
            record = {"event": "step", "step": s, "loss": 5 - 0.1 * s + loss_shift, "sample_hash": f"h{s}"}
            record.update(tokens_hash=f"t{s}", data_wait_ms=1.0, step_ms=10.0, tokens_per_s=100.0)
            f.write(json.dumps(record) + "\n")


def test_a_refused_operation_falls_back_to_warnings_and_the_stated_tolerance(
    tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run A stops on torch's refusal of a non-deterministic operation: it runs again with warn_only (strict off), and
    losses 1e-4 apart then pass within the fallback tolerance, the data still compared exactly (runs faked)."""
    import train.gpu_check as gpu_check

    calls = []

    def fake_run(label: str, args: list[str], *, keep: list[str], kill_point: str | None = None, **kw: object) -> float:
        calls.append((label, kill_point, "runtime.strict_determinism=false" in args))
        run_dir = Path(args[args.index("--run-dir") + 1])
        if len(calls) == 1:
            keep.append("RuntimeError: foo_cuda does not have a deterministic implementation, but you set it")
            raise SystemExit("gpu_check: run A failed with exit code 1")
        if label == "A":
            _write_steps(run_dir, {"event": "start", "step": 0}, range(8))
        elif kill_point is not None:
            _write_steps(run_dir, {"event": "start", "step": 0}, range(6))
        else:
            _write_steps(run_dir, {"event": "resumed_from", "step": 4}, range(4, 8), loss_shift=1e-4)
        return 1.0

    monkeypatch.setattr(gpu_check, "run_logged", fake_run)
    sets = [
        f'data.cache_dir="{cache_dir}"',
        f'data.tokenizer="{cache_dir / TOKENIZER}"',
        "data.max_documents=120",
        "data.vocab_size=512",
    ]
    argv = ["--device", "cpu", "--out", str(tmp_path / "runs"), "--json", str(tmp_path / "r.json")]
    assert gpu_check.main(argv + [a for s in sets for a in ("--set", s)]) == 0
    assert calls == [("A", None, False), ("A", None, True), ("B", "before_step:6", True), ("B", None, True)]
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["status"] == "ok" and report["config"]["strict_determinism"] is False
    assert report["config"]["overrides"][-1] == "runtime.strict_determinism=false"
    cmp = report["comparison"]
    assert cmp["loss_tolerance"] == 0.01 and cmp["losses_equal"] == 8 and 0 < cmp["max_abs_loss_diff"] < 1e-3
    assert "losses within 0.01" in report["verdict"]
