"""The trainer on a 3-source mixture of local corpora (stdlib code, its docstrings and comments, plain-text files).

A run trains 4 steps and stops with a checkpoint; it resumes with a schedule entry written at the resume step (allowed,
and checked) and trains to step 8; `detsampler stats` with the same options reports the per-source token shares the
weights ask for, and every step the trainer logged reads exactly the plan's samples. Resuming with an entry before the
checkpoint's step, or a skip range in its past, is refused.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from detsampler.cli import main
from detsampler.index.prepare import IndexConfig, prepare_index
from detsampler.layout import LayoutConfig
from detsampler.mixture import Mixture
from detsampler.plan import Plan
from tests.mixture_corpora import write_mixture_corpora
from train.launch import run_training, train_command
from train.metrics import read_metrics, sample_hash

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:torch.distributed is disabled")]

CONFIG = str(Path(__file__).resolve().parent.parent / "train" / "configs" / "tiny.toml")
SEED, SEQ_LEN, GBS, MBS = 1234, 64, 16, 4
WEIGHTS = [0.5, 0.3, 0.2]
ANNEAL = (4, [0.2, 0.2, 0.6])
NAMES = ["code", "docs", "text"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory):
    from detsampler.text.corpus import default_corpus
    from detsampler.text.tokenizer import train_tokenizer

    root = tmp_path_factory.mktemp("train-mixture")
    texts = default_corpus(max_documents=24)["text"]
    train_tokenizer(None, 512, root / "tok.model", texts=texts)
    paths = write_mixture_corpora(root / "corpora", texts, max_text_files=6)
    return root, paths


def _settings(root: Path, paths: list[str], schedule=None, skip=None) -> list[str]:
    settings = {
        "data.cache_dir": f'"{root / "cache"}"',
        "data.tokenizer": f'"{root / "tok.model"}"',
        "data.vocab_size": 512,
        "data.layout": '"concat"',
        "data.seq_len": SEQ_LEN,
        "data.seed": SEED,
        "data.global_batch_size": GBS,
        "data.micro_batch_size": MBS,
        "data.mixture_sources": json.dumps(paths),
        "data.mixture_weights": json.dumps(WEIGHTS),
        "data.mixture_names": json.dumps(NAMES),
        "schedule.steps": 8,
        "schedule.warmup_steps": 2,
        "checkpoint.every": 4,
        "runtime.threads": 1,
    }
    if schedule:
        settings["data.mixture_schedule"] = json.dumps(schedule)
    if skip:
        settings["data.skip_steps"] = json.dumps(skip)
    out = []
    for key, value in settings.items():
        out += ["--set", f"{key}={value}"]
    return out


def _train(run_dir: Path, root: Path, paths: list[str], stop_at: int | None = None, **kw):
    args = ["--config", CONFIG, "--run-dir", str(run_dir), "--resume", "auto", *_settings(root, paths, **kw)]
    if stop_at is not None:
        args += ["--stop-at", str(stop_at)]
    return run_training(train_command(1, args, torchrun=False), timeout=300)


def _plan(root: Path, paths: list[str], schedule=None) -> Plan:
    layouts = [
        prepare_index(
            IndexConfig(data=p, tokenizer=str(root / "tok.model"), cache_dir=str(root / "cache")), progress=False
        ).index.layout(LayoutConfig(kind="concat", seq_len=SEQ_LEN, seed=SEED))
        for p in paths
    ]
    return Plan(
        source=Mixture(layouts, [(0, WEIGHTS), *(schedule or [])], SEED),
        seed=SEED,
        global_batch_size=GBS,
        micro_batch_size=MBS,
    )


def test_trainer_on_a_three_source_mixture_and_stats_report_the_shares(setup, tmp_path, capsys):
    root, paths = setup
    run = tmp_path / "run"
    first = _train(run, root, paths, stop_at=4)
    assert first.returncode == 0, first.output[-4000:]
    past = shutil.copytree(run, tmp_path / "past")

    # resume at step 4 with an annealing entry written at the resume step: allowed
    resumed = _train(run, root, paths, schedule=[ANNEAL])
    assert resumed.returncode == 0, resumed.output[-4000:]
    plan = _plan(root, paths, [ANNEAL])
    metrics = read_metrics(run)
    assert sorted(metrics.steps) == list(range(8))
    for step, record in metrics.steps.items():
        assert record["sample_hash"] == sample_hash(plan.global_batch(step)), step
        assert record["loss"] == record["loss"]  # finite, not NaN

    # detsampler stats with the same options: per-source token shares are what the weights ask for
    cli = [
        "stats",
        "--tokenizer",
        str(root / "tok.model"),
        "--cache-dir",
        str(root / "cache"),
        "--mixture-data",
        ",".join(paths),
        "--mixture-weights",
        ",".join(map(str, WEIGHTS)),
        "--mixture-schedule",
        f"{ANNEAL[0]}:{','.join(map(str, ANNEAL[1]))}",
        "--mixture-names",
        ",".join(NAMES),
        "--mixture-seed",
        str(SEED),
        "--seed",
        str(SEED),
        "--layout-seed",
        str(SEED),
        "--kind",
        "concat",
        "--seq-len",
        str(SEQ_LEN),
        "--global-batch-size",
        str(GBS),
        "--micro-batch-size",
        str(MBS),
        "--step",
        "8",
        "--json",
    ]
    assert main(cli) == 0
    stats = json.loads(capsys.readouterr().out)
    asked = [(4 * GBS * a + 4 * GBS * b) / (8 * GBS) for a, b in zip(WEIGHTS, ANNEAL[1])]
    for row, want in zip(stats["sources"], asked):
        assert row["expected_share"] == pytest.approx(want)
        # each of the two segments is within its bound (< 2 samples for three sources) of its weights
        assert abs(row["token_share"] - want) < 4 / (8 * GBS)
        assert row["tokens"] == row["samples"] * SEQ_LEN
    assert sum(row["samples"] for row in stats["sources"]) == 8 * GBS

    # the same change written before the checkpoint's step, or a skip range in its past: refused
    early = _train(past, root, paths, schedule=[(2, ANNEAL[1])])
    assert early.returncode != 0 and "changes the past" in early.output, early.output[-3000:]
    _check_resume_in_process(root, paths, past)


def _check_resume_in_process(root: Path, paths: list[str], run: Path) -> None:
    """The trainer's own resume check on the saved checkpoint: future skip ranges and entries pass, past ones do not."""
    from train import checkpoint as ckpt
    from train.config import load_config
    from train.data import build_pipeline

    path = ckpt.latest_checkpoint(run / "checkpoints")
    meta = ckpt.read_meta(path)
    assert meta["step"] == 4

    def check(*extra: str, **kw) -> None:
        overrides = [*_settings(root, paths, **kw)[1::2], *extra]  # the section.key=value items of the --set pairs
        data = build_pipeline(load_config(CONFIG, overrides).data, world_size=1)
        ckpt.check_fingerprint(path, meta["data"], data.fingerprint(), plan=data.plan, resume_step=meta["step"])

    check()
    check(skip=[(4, 5)], schedule=[(6, [1, 1, 1])])
    with pytest.raises(ckpt.DataFingerprintError, match="lies in the past of the resume"):
        check(skip=[(1, 2)])
    with pytest.raises(ckpt.DataFingerprintError, match="changes the past"):
        check(schedule=[(3, [1, 1, 1])])
    with pytest.raises(ckpt.DataFingerprintError, match="different data stream"):
        check("data.seq_len=32")  # another layout: not a change the plan can absorb
