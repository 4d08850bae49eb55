"""Redaction in the trainer, with real (1-process) runs: a resume that adds ``data.redactions`` from its step on is
accepted, reads the same samples at every step and trains on exactly the labels of the unredacted run less the
redacted documents' ones; a redaction before the resume step is refused (exit status 2, the library's message)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.test_train_resume import TOKENIZER, _train
from train.metrics import read_metrics

pytestmark = pytest.mark.slow

N, HALF = 4, 2
REDACT = {"documents": list(range(0, 120, 2)), "from_step": HALF}  # every other document, from the resume step


def _redactions(entry: dict) -> str:
    return json.dumps([entry]).replace('"documents":', "documents =").replace('"from_step":', "from_step =")


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from detsampler.text.corpus import default_corpus
    from detsampler.text.tokenizer import train_tokenizer

    root = tmp_path_factory.mktemp("cache")
    train_tokenizer(None, 512, root / TOKENIZER, texts=default_corpus(max_documents=120)["text"])
    return root


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> tuple[Path, Path]:
    """N steps uninterrupted, and N/2 steps stopped at their checkpoint (1 process each)."""
    full, half = tmp_path_factory.mktemp("full"), tmp_path_factory.mktemp("half")
    common = {"nproc": 1, "torchrun": False, "schedule.steps": N}
    _train(full, cache_dir, **common)
    _train(half, cache_dir, stop_at=HALF, **common)
    return full, half


def _masked_labels(run: Path, steps: range, documents: list[int]) -> dict[int, int]:
    """Per step, the labels (not already -100) at positions of ``documents``: what the redaction removes."""
    from detsampler.index.sharded import open_index
    from detsampler.loader.dataset import PackedDataset
    from detsampler.record import DataRecord

    record = DataRecord.load(run / "checkpoints" / f"step_{N:08d}")
    index = open_index(record.indexes[0]["path"])
    layout = index.layout(record.layout_configs()[0])
    plan = record.plan(layout.num_samples)
    ds = PackedDataset(index, layout)
    out = {}
    for s in steps:
        batch = ds.get_batch(plan.global_batch(s))
        hit = np.isin(batch["document_ids"].numpy(), documents) & (batch["labels"].numpy() != -100)
        out[s] = int(hit.sum())
    return out


def test_a_redaction_from_the_resume_step_is_accepted_and_moves_nothing_else(runs, tmp_path, cache_dir):
    full, half = runs
    run = Path(shutil.copytree(half, tmp_path / "run"))
    settings = {"schedule.steps": N, "data.redactions": _redactions(REDACT)}
    result = _train(run, cache_dir, nproc=1, torchrun=False, **settings)
    assert f"resuming from {run / 'checkpoints' / f'step_{HALF:08d}'} at step {HALF}" in result.output
    ref, got = read_metrics(full).steps, read_metrics(run).steps
    assert sorted(got) == list(range(N))
    masked = _masked_labels(run, range(N), REDACT["documents"])
    for s in range(N):
        assert got[s]["sample_hash"] == ref[s]["sample_hash"], s  # the same samples at every step
        removed = masked[s] if s >= HALF else 0
        assert got[s]["tokens"] == ref[s]["tokens"] - removed, s
        if s < HALF:  # the past, as trained
            assert (got[s]["loss"], got[s]["tokens_hash"]) == (ref[s]["loss"], ref[s]["tokens_hash"]), s
        else:  # the labels changed, hence the hash of inputs and labels
            assert got[s]["tokens_hash"] != ref[s]["tokens_hash"], s
    assert all(masked[s] > 0 for s in range(HALF, N))
    # the record names the redaction
    from detsampler.record import DataRecord

    record = DataRecord.load(run / "checkpoints" / f"step_{N:08d}")
    assert record.fingerprint.plan["redactions"] == [[HALF, REDACT["documents"]]]


def test_a_redaction_before_the_resume_step_is_refused(runs, tmp_path, cache_dir):
    _, half = runs
    run = Path(shutil.copytree(half, tmp_path / "run"))
    early = {**REDACT, "from_step": HALF - 1}
    settings = {"schedule.steps": N, "data.redactions": _redactions(early)}
    result = _train(run, cache_dir, nproc=1, torchrun=False, expect_rc=2, **settings)
    assert "redactions adds" in result.output and f"redact from step >= {HALF}" in result.output, result.output[-2000:]
    assert read_metrics(run).steps == read_metrics(half).steps  # nothing was trained or logged


def test_a_resume_with_another_instance_filter_is_refused(runs, tmp_path, cache_dir):
    """The half run trained without an instance filter: resuming it with one is refused like any data change."""
    _, half = runs
    run = Path(shutil.copytree(half, tmp_path / "run"))
    settings = {"schedule.steps": N, "data.instance_filter": "true"}
    result = _train(run, cache_dir, nproc=1, torchrun=False, expect_rc=2, **settings)
    assert "changes the instance filter: instance_filter.kind: '<absent>' -> 'repetition'" in result.output, (
        result.output[-2000:]
    )
    assert read_metrics(run).steps == read_metrics(half).steps  # nothing was trained or logged
