"""The sharded index (issue 12.3): shards built by independent tasks (processes, torchrun ranks) with no collective, a
manifest written once, one index with global document ids equal to the single index of the same files; a missing or
corrupt shard is named; adding a file adds a shard without re-tokenizing the others."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from detsampler.cli import main
from detsampler.index import TokenIndexError, build_index
from detsampler.index.sharded import ShardedIndex
from detsampler.index.shards import finalize, input_files, sharded_root
from detsampler.layout import LayoutConfig, make_layout
from detsampler.text.corpus import load_corpus


@pytest.fixture()
def corpus(tmp_path, small_corpus) -> Path:
    """Four jsonl files of real documents (the session corpus, split)."""
    data = tmp_path / "data"
    data.mkdir()
    texts = small_corpus["text"]
    for j in range(4):
        with open(data / f"part-{j}.jsonl", "w") as f:
            for text in texts[j::4]:
                f.write(json.dumps({"text": text}) + "\n")
    return data


def _args(corpus: Path, cache: Path, tokenizer) -> list[str]:
    return ["build", "--data", str(corpus), "--tokenizer", tokenizer.path, "--cache-dir", str(cache)]


def _root(corpus, cache, tokenizer) -> Path:
    return sharded_root(cache, input_files(corpus), tokenizer)


def test_two_tasks_build_the_shards_and_the_manifest_equals_the_single_index(corpus, tmp_path, small_tokenizer, capsys):
    cache = tmp_path / "cache"
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    tasks = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "detsampler.cli",
                *_args(corpus, cache, small_tokenizer),
                "--shard",
                str(i),
                "--num-shards",
                "2",
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    for t in tasks:
        _, err = t.communicate(timeout=300)
        assert t.returncode == 0, err
    assert main([*_args(corpus, cache, small_tokenizer), "--finalize"]) == 0
    assert "shards" in capsys.readouterr().out
    sharded = ShardedIndex.open(_root(corpus, cache, small_tokenizer))
    single = build_index(load_corpus(str(corpus)), small_tokenizer, cache_dir=tmp_path / "single", progress=False)
    assert len(sharded.shards) == 4 and sharded.num_documents == single.num_documents
    np.testing.assert_array_equal(np.asarray(sharded.lengths), np.asarray(single.lengths))
    np.testing.assert_array_equal(np.asarray(sharded.offsets), np.asarray(single.offsets))
    np.testing.assert_array_equal(np.asarray(sharded.tokens), np.asarray(single.tokens))
    for config in (LayoutConfig(kind="concat", seq_len=64), LayoutConfig(kind="bestfit", seq_len=128, window_docs=3)):
        got, want = sharded.layout(config), single.layout(config)
        ids = np.arange(want.num_samples)
        a, b = got.locate(ids), want.locate(ids)
        assert all(np.array_equal(getattr(a, f), getattr(b, f)) for f in ("offsets", "doc_ids", "starts", "stops"))


def test_the_packed_dataset_reads_a_sharded_index(corpus, tmp_path, small_tokenizer):
    import pickle

    from detsampler.loader.dataset import PackedDataset

    cache = tmp_path / "cache"
    assert main([*_args(corpus, cache, small_tokenizer), "--sharded"]) == 0
    sharded = ShardedIndex.open(_root(corpus, cache, small_tokenizer))
    single = build_index(load_corpus(str(corpus)), small_tokenizer, cache_dir=tmp_path / "single", progress=False)
    config = LayoutConfig(kind="document", seq_len=64)
    a = PackedDataset(sharded, sharded.layout(config))
    b = PackedDataset(single, make_layout(config, np.asarray(single.lengths)))
    ids = np.arange(len(b))
    got, want = pickle.loads(pickle.dumps(a)).get_batch(ids), b.get_batch(ids)
    assert all(np.array_equal(got[k], want[k]) for k in want)


def test_a_missing_or_corrupt_shard_is_named(corpus, tmp_path, small_tokenizer):
    cache = tmp_path / "cache"
    assert main([*_args(corpus, cache, small_tokenizer), "--shard", "0", "--num-shards", "2"]) == 0
    files = input_files(corpus)
    root = _root(corpus, cache, small_tokenizer)
    with pytest.raises(TokenIndexError, match=r"shard 1 \(.*part-1.jsonl\) is missing"):
        finalize(root, files)
    assert main([*_args(corpus, cache, small_tokenizer), "--shard", "1", "--num-shards", "2"]) == 0
    claim = json.loads((root / "claims" / "shard-00002.json").read_text())
    (root / claim["path"] / "meta.json").write_text("{}")
    with pytest.raises(TokenIndexError, match=r"shard 2 \(.*part-2.jsonl\) is corrupt"):
        finalize(root, files)
    with pytest.raises(SystemExit):  # the CLI: one line, exit status 2
        main([*_args(corpus, cache, small_tokenizer), "--finalize"])


def test_adding_a_file_adds_a_shard_and_reuses_the_others(corpus, tmp_path, small_tokenizer):
    cache = tmp_path / "cache"
    assert main([*_args(corpus, cache, small_tokenizer), "--sharded"]) == 0
    before = ShardedIndex.open(_root(corpus, cache, small_tokenizer))
    built = {p.name: p.stat().st_mtime_ns for p in (cache / "shards").iterdir() if p.is_dir()}
    with open(corpus / "part-9.jsonl", "w") as f:
        f.write(json.dumps({"text": "def added():\n    return 'a new file'\n"}) + "\n")
    assert main([*_args(corpus, cache, small_tokenizer), "--sharded"]) == 0
    after = ShardedIndex.open(_root(corpus, cache, small_tokenizer))
    assert len(after.shards) == 5 and after.num_documents == before.num_documents + 1
    assert after.fingerprint != before.fingerprint
    for p in (cache / "shards").iterdir():
        if p.name in built:
            assert p.stat().st_mtime_ns == built[p.name]  # not rebuilt
    assert [s.fingerprint for s in after.shards[:4]] == [s.fingerprint for s in before.shards]


@pytest.mark.slow
def test_torchrun_ranks_build_their_shards_without_a_collective(corpus, tmp_path, small_tokenizer):
    """Under torchrun each rank builds shards rank, rank + world_size, ...; no process group is ever created."""
    cache = tmp_path / "cache"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "detsampler.cli",
        *_args(corpus, cache, small_tokenizer),
        "--shard",
        "auto",
    ]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=600, env=dict(os.environ, PYTHONWARNINGS="ignore")
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    index = finalize(_root(corpus, cache, small_tokenizer), input_files(corpus))
    assert len(index.shards) == 4


@pytest.mark.slow
def test_the_ray_engine_builds_one_task_per_shard(corpus, tmp_path, small_tokenizer):
    ray = pytest.importorskip("ray", reason="the optional extra detsampler[ray] is not installed")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        cache = tmp_path / "cache"
        assert main([*_args(corpus, cache, small_tokenizer), "--sharded", "--engine", "ray"]) == 0
    finally:
        ray.shutdown()
    index = ShardedIndex.open(_root(corpus, cache, small_tokenizer))
    single = build_index(load_corpus(str(corpus)), small_tokenizer, cache_dir=tmp_path / "single", progress=False)
    np.testing.assert_array_equal(np.asarray(index.tokens), np.asarray(single.tokens))


def test_the_cli_reads_a_sharded_index_as_data(corpus, tmp_path, small_tokenizer, capsys):
    cache = tmp_path / "cache"
    assert main([*_args(corpus, cache, small_tokenizer), "--sharded"]) == 0
    root = str(_root(corpus, cache, small_tokenizer))
    plan = [
        "--data",
        root,
        "--tokenizer",
        small_tokenizer.path,
        "--cache-dir",
        str(cache),
        "--kind",
        "bestfit",
        "--seq-len",
        "64",
        "--global-batch-size",
        "4",
    ]
    capsys.readouterr()
    assert main(["verify", *plan, "--steps", "0:20", "--tokens"]) == 0
    assert "OK: no duplicates, no gaps" in capsys.readouterr().out
    assert main(["show", *plan, "--step", "3", "--rank", "0", "--decode"]) == 0
    out = capsys.readouterr().out
    assert "doc " in out and "tokens [" in out


def test_the_last_task_writes_the_manifest_and_a_local_pool_builds_whole_shards(corpus, tmp_path, small_tokenizer):
    """No serial --finalize step after an array of tasks; ``--num-proc 2`` builds two shards at once, the same ones."""
    cache = tmp_path / "cache"
    root = _root(corpus, cache, small_tokenizer)
    assert main([*_args(corpus, cache, small_tokenizer), "--shard", "1", "--num-shards", "2"]) == 0
    assert not (root / "manifest.json").exists()  # shards 0 and 2 are not built yet
    assert main([*_args(corpus, cache, small_tokenizer), "--shard", "0", "--num-shards", "2"]) == 0
    by_tasks = ShardedIndex.open(root)
    pool_cache = tmp_path / "pool"
    assert main([*_args(corpus, pool_cache, small_tokenizer), "--sharded", "--num-proc", "2"]) == 0
    by_pool = ShardedIndex.open(_root(corpus, pool_cache, small_tokenizer))
    assert by_pool.fingerprint == by_tasks.fingerprint and len(by_pool.shards) == 4
    np.testing.assert_array_equal(np.asarray(by_pool.tokens), np.asarray(by_tasks.tokens))


def test_a_file_edited_in_place_is_rebuilt_and_listed_again(corpus, tmp_path, small_tokenizer):
    cache = tmp_path / "cache"
    assert main([*_args(corpus, cache, small_tokenizer), "--sharded"]) == 0
    root = _root(corpus, cache, small_tokenizer)
    before = ShardedIndex.open(root)
    part = corpus / "part-1.jsonl"
    text = part.read_text()
    part.write_text(text.replace("def ", "fed ", 1))  # the same size, so the same sharded index directory
    assert _root(corpus, cache, small_tokenizer) == root
    with pytest.raises(SystemExit):  # its shard is stale until rebuilt
        main([*_args(corpus, cache, small_tokenizer), "--finalize"])
    assert main([*_args(corpus, cache, small_tokenizer), "--sharded"]) == 0
    after = ShardedIndex.open(root)
    assert after.fingerprint != before.fingerprint
    want = build_index(load_corpus(str(part)), small_tokenizer, cache_dir=tmp_path / "single", progress=False)
    np.testing.assert_array_equal(after.shards[1].tokens, want.tokens)


def _edit_keeping_size_and_mtime(path: Path) -> None:
    """What ``cp -p``/``rsync -a``/``tar x`` of an edited file leave: the same size and the old mtime."""
    st = path.stat()
    path.write_text(path.read_text().replace("def ", "fed ", 1))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns


def test_content_decides_whether_a_shard_is_stale(corpus, tmp_path, small_tokenizer):
    """A same-size edit with the mtime restored makes the shard stale; a copy of the unchanged files (``cp -a``: new
    paths, inodes and ctimes) does not."""
    cache = tmp_path / "cache"
    assert main([*_args(corpus, cache, small_tokenizer), "--sharded"]) == 0
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-a", str(corpus), str(copy)], check=True)
    assert _root(copy, cache, small_tokenizer) == _root(corpus, cache, small_tokenizer)
    before = ShardedIndex.open(_root(corpus, cache, small_tokenizer))
    assert finalize(_root(copy, cache, small_tokenizer), input_files(copy)).fingerprint == before.fingerprint
    _edit_keeping_size_and_mtime(corpus / "part-1.jsonl")
    with pytest.raises(TokenIndexError, match=r"^shard 1 \(.*part-1.jsonl\) is stale: its content changed since"):
        finalize(_root(corpus, cache, small_tokenizer), input_files(corpus))
    assert main([*_args(corpus, cache, small_tokenizer), "--sharded"]) == 0
    after = ShardedIndex.open(_root(corpus, cache, small_tokenizer))
    want = build_index(load_corpus(str(corpus / "part-1.jsonl")), small_tokenizer, cache_dir=tmp_path / "single")
    np.testing.assert_array_equal(np.asarray(after.shards[1].tokens), np.asarray(want.tokens))
    assert after.fingerprint != before.fingerprint
