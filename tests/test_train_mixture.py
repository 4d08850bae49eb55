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


def _settings(root: Path, paths: list[str], schedule=None, skip=None, redactions=None) -> list[str]:
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
    if redactions:  # TOML inline tables
        settings["data.redactions"] = (
            "["
            + ", ".join("{" + ", ".join(f"{k} = {json.dumps(v)}" for k, v in r.items()) + "}" for r in redactions)
            + "]"
        )
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


@pytest.fixture(scope="module")
def runs(setup, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A run stopped at step 4 (``past``, its copy) and resumed there with an annealing entry written at the resume
    step (allowed) to step 8 (``run``)."""
    root, paths = setup
    run = tmp_path_factory.mktemp("mixture-runs") / "run"
    first = _train(run, root, paths, stop_at=4)
    assert first.returncode == 0, first.output[-4000:]
    past = Path(shutil.copytree(run, run.parent / "past"))
    resumed = _train(run, root, paths, schedule=[ANNEAL])
    assert resumed.returncode == 0, resumed.output[-4000:]
    return run, past


def test_trainer_on_a_three_source_mixture_and_stats_report_the_shares(setup, runs, tmp_path, capsys):
    root, paths = setup
    run, past = runs
    past = shutil.copytree(past, tmp_path / "past")
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


# documents of two sources, redacted from the resume step: every document id 0, 2, ... of "code", 0 and 1 of "text"
REDACTIONS = [
    {"source": "code", "documents": list(range(0, 24, 2)), "from_step": 4},
    {"source": "text", "documents": [0, 1], "from_step": 4},
]


def test_a_mixture_run_resumed_with_redactions_trains_the_same_but_the_masked_labels(setup, runs, tmp_path):
    """The run stopped at step 4, resumed with ``data.redactions`` of two sources from step 4: every step reads the
    samples of the run resumed without them, and its inputs and labels (the step's ``tokens_hash``) are those of that
    run's batches with exactly the labels of the redacted (source, document) pairs set to -100 from step 4 on."""
    import numpy as np

    from detsampler.index.sharded import open_index
    from detsampler.loader.dataset import PackedDataset
    from detsampler.loader.mixture_dataset import MixtureDataset
    from detsampler.record import DataRecord
    from train.data import step_token_hashes

    root, paths = setup
    reference, past = runs
    run = Path(shutil.copytree(past, tmp_path / "run"))
    result = _train(run, root, paths, schedule=[ANNEAL], redactions=REDACTIONS)
    assert result.returncode == 0, result.output[-4000:]
    assert "data: redacted from step 4: 12 document(s) of source code [0, 2, 4, 6, 8, 10, 12, 14 ...]" in result.output
    ref, got = read_metrics(reference).steps, read_metrics(run).steps
    assert sorted(got) == list(range(8))

    record = DataRecord.load(run / "checkpoints" / f"step_{8:08d}")
    assert record.fingerprint.plan["redactions"] == [[4, REDACTIONS[0]["documents"], 0], [4, [0, 1], 2]]
    indexes = [open_index(i["path"]) for i in record.indexes]
    layouts = [index.layout(config) for index, config in zip(indexes, record.layout_configs())]
    plan = _plan(root, paths, [ANNEAL])
    dataset = MixtureDataset([PackedDataset(i, lay) for i, lay in zip(indexes, layouts)], plan.stream)
    redacted = {0: REDACTIONS[0]["documents"], 2: [0, 1]}
    masked_total = 0
    for s in range(8):
        micro_batches = [dataset.__getitems__(plan.micro_batch(s, a, 0).tolist()).batch for a in range(4)]
        masked = 0
        for a, mb in enumerate(micro_batches):  # the redaction by hand: each row against its source's documents
            if s < 4:
                continue
            sources = plan.stream.split_ids(plan.micro_batch(s, a, 0))[0]
            for row, k in enumerate(sources.tolist()):
                hit = (
                    np.isin(mb["document_ids"][row].numpy(), redacted.get(k, [])) & (mb["labels"][row] != -100).numpy()
                )
                mb["labels"][row][hit] = -100
                masked += int(hit.sum())
        want = sample_hash(step_token_hashes(micro_batches).view(np.int64).reshape(-1))
        assert got[s]["sample_hash"] == ref[s]["sample_hash"], s  # the same samples at every step
        assert got[s]["tokens_hash"] == want, s  # the same inputs and labels, less exactly the redacted ones
        assert got[s]["tokens"] == ref[s]["tokens"] - masked, s
        if s < 4:
            assert (got[s]["loss"], got[s]["tokens_hash"]) == (ref[s]["loss"], ref[s]["tokens_hash"]), s
        masked_total += masked
    assert masked_total > 0
