"""The VLM trainer (issue 33, ``make demo-vlm``'s): a tiny Qwen2-VL built from its config, SIGKILLed mid-run and
resumed: the steps trained again have the same samples, the same global batch contents (pixels included) and the same
loss, bit for bit, as the killed attempt logged them; likewise over chat conversations (``--chat``), whose policy a
resume may not change; and from the same shards in a bucket (moto's S3 server), images prefetched (``--shards``,
``--prefetch``), every step's global batch is the one read from them on local disk."""

from __future__ import annotations

import argparse
import sys
import uuid
from pathlib import Path

import pytest

from detsampler import DataFingerprint, Plan, check_resume
from detsampler.loader import PrefetchConfig
from detsampler.media import MediaLayoutConfig
from detsampler.storage import join, store_for
from train.launch import run_training
from train.metrics import read_metrics
from train.train_vlm import build_index, listed_shards, parse_args, prefetch_config

TINY = ["--documents", "48", "--every", "2", "--global-batch-size", "4"]
KEYS = ("sample_hash", "tokens_hash", "loss", "tokens", "images")


def trainer(run_dir: Path, corpus: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "train.train_vlm", "--run-dir", str(run_dir), "--corpus", str(corpus), *TINY, *extra]


def kill_and_resume(tmp_path: Path, *extra: str):
    """A 4-step run killed just before step 3 (1 worker), resumed with 2 workers from its checkpoint of step 2."""
    cmd = trainer(tmp_path / "run", tmp_path, "--steps", "4", *extra)
    killed = run_training([*cmd, "--num-workers", "1"], kill_point="before_step:3", timeout=600)
    assert killed.killed_at == "before_step:3", killed.output[-2000:]
    resumed = run_training([*cmd, "--num-workers", "2"], timeout=600)
    assert resumed.returncode == 0, resumed.output[-2000:]
    metrics = read_metrics(tmp_path / "run")
    assert sorted(metrics.steps) == [0, 1, 2, 3] and [e["step"] for e in metrics.resumes] == [2]
    (again,) = [r for r in metrics.discarded if r["step"] == 2]  # step 2 as the killed attempt trained it
    assert {k: again[k] for k in KEYS} == {k: metrics.steps[2][k] for k in KEYS}
    assert metrics.steps[2]["images"] > 0
    return metrics


@pytest.mark.slow
def test_a_killed_vlm_run_resumes_bit_identically(tmp_path):
    kill_and_resume(tmp_path)


@pytest.fixture(scope="module")
def chat_run(tmp_path_factory):
    """The corpus as conversations under the ``assistant`` policy, killed and resumed."""
    root = tmp_path_factory.mktemp("vlm-chat")
    return root, kill_and_resume(root, "--chat", "assistant")


@pytest.mark.slow
def test_a_killed_chat_run_resumes_bit_identically(chat_run):
    root, metrics = chat_run
    assert (root / "chat" / "shards" / "shard-00000.tar").is_file()  # the conversations, beside the text corpus
    # the policy's labels: the assistant turns only, far fewer than the positions a step holds (4 x 512)
    assert all(0 < metrics.steps[s]["tokens"] < 4 * 512 // 2 for s in range(4))


@pytest.mark.slow
def test_a_resume_with_another_chat_policy_is_refused_in_one_line(chat_run):
    root, _ = chat_run
    again = run_training(trainer(root / "run", root, "--steps", "6", "--chat", "all"), timeout=600)
    assert again.returncode == 2, again.output[-2000:]
    errors = [line for line in again.output.splitlines() if line.startswith("error:")]
    assert errors == [
        f"error: {root / 'run' / 'checkpoints' / 'step_00000004'}: the checkpoint was trained with --chat assistant,"
        " this run reads --chat all: the loss mask of every step already trained would change; resume with --chat"
        " assistant, or start a new run"
    ], again.output[-2000:]
    assert "Traceback" not in again.output
    assert max(read_metrics(root / "run").steps) == 3  # nothing trained
    # check_resume alone refuses it too: the index's identity holds the policy (its cache key: two indexes)
    fingerprints = []
    for policy in ("assistant", "all"):
        index = build_index(parse_args(["--run-dir", "-", "--corpus", str(root), *TINY, "--chat", policy]))
        layout = index.layout(MediaLayoutConfig(seq_len=512, max_patches=1024, window_docs=256))
        plan = Plan(layout.num_samples, seed=0, global_batch_size=4, micro_batch_size=2, world_size=1)
        fingerprints.append(DataFingerprint.of(index, layout, plan))
    with pytest.raises(ValueError, match=r"resuming at step 4 changes the index: index: '\w+' -> '\w+'"):
        check_resume(fingerprints[0], fingerprints[1], 4)


BAD_PREFETCH = [
    ("{bad", r"'\{bad' is not JSON \(Expecting property name .*\); give an object of PrefetchConfig fields"),
    ("[1]", r"got list \[1\], not an object of PrefetchConfig fields \(block_bytes, budget_bytes, "),
    ('{"blocks": 1}', r"unknown PrefetchConfig field\(s\) \['blocks'\]; its fields are \['block_bytes', "),
    ('{"block_bytes": 1000}', r"^PrefetchConfig.block_bytes must be a multiple of 65536, got 1000$"),
]


@pytest.mark.parametrize(("text", "message"), BAD_PREFETCH)
def test_a_bad_prefetch_option_is_refused_in_one_line(text, message):
    with pytest.raises(argparse.ArgumentTypeError, match=message) as caught:
        prefetch_config(text)
    assert "\n" not in str(caught.value)
    assert prefetch_config('{"block_bytes": 131072, "threads": 2}') == PrefetchConfig(block_bytes=131072, threads=2)


def test_shards_not_listable_or_without_tar_objects_are_refused_in_one_line(tmp_path, s3_bucket):
    with pytest.raises(ValueError, match=r"^--shards 'https://example.com/x': a https:// location cannot be listed;"):
        listed_shards("https://example.com/x")
    (tmp_path / "a.txt").write_text("not a shard")
    with pytest.raises(ValueError, match=rf"^--shards 'file://{tmp_path}': no \*.tar object under it \(1 other"
                                         rf" object\(s\): {tmp_path}/a.txt\); give the prefix"):  # fmt: skip
        listed_shards(f"file://{tmp_path}")
    prefix = join(s3_bucket, f"no-tars-{uuid.uuid4().hex[:8]}")
    store_for(prefix).put(join(prefix, "shard-00000.tar.gz"), b"x")
    with pytest.raises(ValueError, match=rf"^--shards '{prefix}': no \*.tar object under it \(1 other object\(s\)"):
        listed_shards(prefix)
    store_for(prefix).put(join(prefix, "b", "shard-00001.tar"), b"x")
    store_for(prefix).put(join(prefix, "a.tar"), b"x")
    assert listed_shards(prefix + "/") == [join(prefix, "a.tar"), join(prefix, "b", "shard-00001.tar")]


@pytest.mark.slow
def test_shards_in_a_bucket_prefetched_train_on_the_batches_of_the_same_shards_on_disk(tmp_path, s3_bucket):
    from train.vlm_corpus import write_vlm_corpus

    shards, _ = write_vlm_corpus(tmp_path / "made", 48)
    prefix = join(s3_bucket, f"vlm-{uuid.uuid4().hex[:8]}", "shards")
    for path in shards:
        store_for(join(prefix, path.name)).put(join(prefix, path.name), path)
    steps = ["--steps", "3", "--seq-len", "256", "--max-patches", "512"]
    prefetch = '{"block_bytes": 65536, "budget_bytes": 1048576, "cache_bytes": 2097152, "threads": 2}'
    remote = run_training(trainer(tmp_path / "bucket", tmp_path, *steps, "--shards", prefix, "--prefetch", prefetch,
                                  "--num-workers", "1"), timeout=600)  # fmt: skip
    assert remote.returncode == 0, remote.output[-2000:]
    assert f"reads {len(shards)} shards at {prefix}/ (images prefetched" in remote.output, remote.output[-2000:]
    assert "DataLoader workers started by forkserver" in remote.output
    local = run_training(trainer(tmp_path / "disk", tmp_path, *steps, "--shards", f"file://{tmp_path / 'made'}/shards",
                                 "--num-workers", "0"), timeout=600)  # fmt: skip
    assert local.returncode == 0, local.output[-2000:]
    got, want = read_metrics(tmp_path / "bucket").steps, read_metrics(tmp_path / "disk").steps
    assert sorted(got) == sorted(want) == [0, 1, 2]
    assert [{k: got[s][k] for k in KEYS} for s in got] == [{k: want[s][k] for k in KEYS} for s in got]
    assert sum(want[s]["images"] for s in want) > 0
