"""The trainer on a sharded index (issue 12.3), with the resume tests' harness (tests/test_train_resume.py): the
same 120 documents, split in order into 4 jsonl files and built as a sharded index, train exactly what the single index
trains (the same samples, tokens and losses at every step, since the global document ids are the single index's), and
a run SIGKILLed right after a checkpoint resumes to those same steps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from detsampler.cli import main
from detsampler.index.sharded import ShardedIndex
from tests.test_train_resume import HALF, TOKENIZER, _assert_same_steps, _train, baseline, cache_dir  # noqa: F401
from train.metrics import read_metrics

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def sharded_root(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Path:
    """The resume runs' 120 documents as 4 files (30 each, in order), built as a sharded index with their tokenizer."""
    from detsampler.text.corpus import default_corpus

    data = tmp_path_factory.mktemp("sharded-data")
    texts = default_corpus(max_documents=120)["text"]
    for j in range(4):
        lines = (json.dumps({"text": t}) + "\n" for t in texts[30 * j : 30 * (j + 1)])
        (data / f"part-{j}.jsonl").write_text("".join(lines))
    cache = tmp_path_factory.mktemp("sharded-cache")
    args = ["build", "--data", str(data), "--tokenizer", str(cache_dir / TOKENIZER), "--cache-dir", str(cache)]
    assert main([*args, "--sharded"]) == 0
    (root,) = cache.glob("sharded-*")
    return root


def test_a_sharded_index_trains_the_single_index_steps_and_resumes_after_a_kill(
    baseline: Path,
    sharded_root: Path,
    tmp_path: Path,
    cache_dir: Path,
) -> None:
    run_dir = tmp_path / "run"
    on_shards = {"data.source": f'"{sharded_root}"', "data.max_documents": 0}
    _train(run_dir, cache_dir, kill_point=f"after_save:{HALF}", **on_shards)
    _train(run_dir, cache_dir, **on_shards)
    m = read_metrics(run_dir)
    assert [e["step"] for e in m.resumes] == [HALF]
    saved = json.loads((run_dir / "checkpoints" / f"step_{HALF:08d}" / "data_fingerprint.json").read_text())
    assert saved["data_fingerprint"]["index"] == ShardedIndex.open(sharded_root).fingerprint  # it read the shards
    _assert_same_steps(baseline, run_dir)  # every step: samples, tokens and losses of the single index's run
