"""Bad input (issue 10): a clear one-line error, a non-zero exit, no traceback, nothing half-written.

The CLI is driven in process through ``detsampler.cli.main`` (its exit status and stderr are what a shell sees); disk
full
is a real write failure in a child process (``RLIMIT_FSIZE``: writes past the limit fail with EFBIG, as with ENOSPC).
"""

from __future__ import annotations

import json
import os
import resource
import signal
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from detsampler import LayoutConfig, Plan
from detsampler.cli import main
from detsampler.index import TokenIndex
from detsampler.index.prepare import IndexConfig, prepare_index

IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


def _cli(capsys: pytest.CaptureFixture, *argv: str) -> str:
    """Run the CLI; assert exit status 2 and exactly one ``detsampler: error:`` line, no traceback; return that line."""
    with pytest.raises(SystemExit) as exit_info:
        main(list(argv))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _no_index_written(cache: Path) -> None:
    assert not list(cache.glob("index-*/")) and not list(cache.glob(".tmp-index-*")), sorted(cache.iterdir())


CORPORA = {
    "malformed.jsonl": (b'{"text": "ok"}\n{"text": broken\n', "cannot be read as json files"),
    "empty.jsonl": (b"", "holds no documents"),
    "binary.txt": (b"\xff\xfe\x00binary\x80\x81", "UnicodeDecodeError"),
    "surrogate.jsonl": (b'{"text": "a \\ud800 b"}\n', "cannot be read as json files"),
}


@pytest.mark.parametrize("name", sorted(CORPORA))
def test_unreadable_corpora(capsys, tmp_path: Path, small_tokenizer, name: str) -> None:
    data, message = CORPORA[name]
    (tmp_path / name).write_bytes(data)
    cache = tmp_path / "cache"
    line = _cli(
        capsys,
        "build",
        "--data",
        str(tmp_path / name),
        "--tokenizer",
        str(small_tokenizer.path),
        "--cache-dir",
        str(cache),
    )
    assert message in line
    if cache.exists():
        _no_index_written(cache)


def test_a_dataset_dict_directory(capsys, tmp_path: Path, small_tokenizer) -> None:
    import datasets

    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": ["a", "b"]})}).save_to_disk(str(tmp_path / "dd"))
    line = _cli(
        capsys,
        "build",
        "--data",
        str(tmp_path / "dd"),
        "--tokenizer",
        str(small_tokenizer.path),
        "--cache-dir",
        str(tmp_path / "cache"),
    )
    assert "holds a DatasetDict with splits ['train']; pass one split's directory" in line


def _jsonl(tmp_path: Path) -> Path:
    path = tmp_path / "good.jsonl"
    path.write_text("".join(json.dumps({"text": f"document {i} " * 20}) + "\n" for i in range(20)))
    return path


@pytest.mark.parametrize(
    "cache, message",
    [("file", "is a file, not a directory"), ("", "cache_dir must be a directory"), ("file/sub", "Not a directory")],
)
def test_bad_cache_dirs(capsys, tmp_path: Path, small_tokenizer, cache: str, message: str) -> None:
    (tmp_path / "file").write_text("not a directory")
    target = str(tmp_path / cache) if cache else ""
    line = _cli(
        capsys,
        "build",
        "--data",
        str(_jsonl(tmp_path)),
        "--tokenizer",
        str(small_tokenizer.path),
        "--cache-dir",
        target,
    )
    assert message in line
    assert (tmp_path / "file").read_text() == "not a directory"


@pytest.mark.skipif(IS_ROOT, reason="root ignores permission bits")
@pytest.mark.parametrize("what", ["cache", "data", "tokenizer"])
def test_permission_denied(capsys, tmp_path: Path, small_tokenizer, what: str) -> None:
    import shutil

    data, cache, model = _jsonl(tmp_path), tmp_path / "cache", tmp_path / "tok.model"
    shutil.copy(small_tokenizer.path, model)
    cache.mkdir()
    target = {"cache": cache, "data": data, "tokenizer": model}[what]
    target.chmod(0o500 if what == "cache" else 0o000)
    try:
        line = _cli(capsys, "build", "--data", str(data), "--tokenizer", str(model), "--cache-dir", str(cache))
    finally:
        target.chmod(0o700)
    assert "ermission denied" in line
    _no_index_written(cache)


def test_disk_full_during_a_build(tmp_path: Path, small_tokenizer) -> None:
    """The token file outgrows what the process may write: one line, exit 2, no index and no
    temporary directory left."""
    cache = tmp_path / "cache"
    limit = 256 * 1024

    def limit_writes() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead of killing the process
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    cmd = [
        sys.executable,
        "-m",
        "detsampler.cli",
        "build",
        "--max-documents",
        "200",
        "--tokenizer",
        str(small_tokenizer.path),
        "--cache-dir",
        str(cache),
    ]
    result = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=limit_writes, timeout=300)
    assert result.returncode == 2, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert "File too large" in errors[0]
    _no_index_written(cache)


@pytest.mark.parametrize("out, message", [("outdir", "is a directory"), ("file/x.model", "is a file")])
def test_tokenizer_train_to_an_unwritable_place(capsys, tmp_path: Path, out: str, message: str) -> None:
    (tmp_path / "outdir").mkdir()
    (tmp_path / "file").write_text("x")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("def f(x):\n    return x + 1\n" * 200)
    line = _cli(
        capsys, "tokenizer", "train", "--input", str(corpus), "--vocab-size", "300", "--out", str(tmp_path / out)
    )
    assert message in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.txt", "file", "outdir"]  # no temporary files
    assert not list((tmp_path / "outdir").iterdir())


@pytest.mark.parametrize(
    "argv, message",
    [
        (["show", "--step", str(2**60)], "step must be <= 2**40"),
        (["verify", "--steps", "0:2", "--skip-steps", f"0..{10**20}"], "ends after the last possible data step"),
        (
            ["verify", "--steps", "0:2", "--global-batch-size", str(2**40)],
            "global_batch_size must be an integer <= 4194304",
        ),
        (["stats", "--step", str(2**62)], "step must be <= 2**40"),
        (["show", "--step", "0", "--decode", "--max-chars", "-5"], "expected an integer >= 0, got -5"),
    ],
    ids=["step", "skip-steps", "global-batch-size", "stats-step", "max-chars"],
)
def test_absurd_numbers(capsys, cache_root: Path, small_tokenizer, argv: list[str], message: str) -> None:
    line = _cli(
        capsys,
        *argv,
        "--max-documents",
        "16",
        "--tokenizer",
        str(small_tokenizer.path),
        "--cache-dir",
        str(cache_root),
        "--seq-len",
        "64",
    )
    assert message in line


def test_the_api_refuses_floats_and_bools_instead_of_coercing(small_index) -> None:
    from detsampler import DeterministicBatchSampler, PackedDataset

    plan = Plan(100, seed=0, global_batch_size=4, micro_batch_size=2)
    sampler = DeterministicBatchSampler(plan, 0)
    with pytest.raises(TypeError, match="step must be an integer, got float"):
        sampler.load_state_dict({"step": 2.7})
    dataset = PackedDataset(small_index, small_index.layout(LayoutConfig(kind="concat", seq_len=32)))
    with pytest.raises(TypeError, match="sample ids must be integers"):
        dataset.get_batch([1.7])
    with pytest.raises(ValueError, match="num_samples must be an integer >= 1, got float"):
        Plan(num_samples=10.0, seed=0, global_batch_size=4, micro_batch_size=2)
    with pytest.raises(ValueError, match="seq_len must be an integer >= 1, got True"):
        LayoutConfig(seq_len=True)
    with pytest.raises(ValueError, match=r"batch_size_schedule entry 0 \(step 0\) must be an integer, got 4.0"):
        Plan(100, seed=0, global_batch_size=4, micro_batch_size=2, batch_size_schedule=[(0, 4.0)])
    assert dataset.get_batch(np.array([1], dtype=np.int32))["input_ids"].shape == (1, 32)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--stop-at", "-5"], "expected an integer >= 0, got -5"),
        (["--set", "data.seq_len=0"], "DataConfig.seq_len must be an integer >= 1, got 0"),
        (["--set", "data.batch_size_schedule=5"], "DataConfig.batch_size_schedule must be a list, got 5 (int)"),
        (["--set", "nonsense"], "--set expects section.key=value"),
        (
            ["--set", "model.tie_embeddings=False"],
            "ModelConfig.tie_embeddings must be true or false, got 'False' (str)",
        ),
        (["--config", "/nonexistent.toml"], "No such file or directory: /nonexistent.toml"),
    ],
)
def test_trainer_usage_and_config_errors_are_one_line(capsys, tmp_path: Path, argv: list[str], message: str) -> None:
    from train.train import main as train_main

    assert train_main(["--run-dir", str(tmp_path / "run"), *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and message in err, err
    assert not (tmp_path / "run").exists()


def test_a_corpus_of_empty_documents_builds_and_opens(tmp_path, small_tokenizer):
    """Empty token and data arrays are loaded, not memory-mapped; opening them must not need numpy's private API."""
    data = tmp_path / "empty.jsonl"
    data.write_text('{"text": ""}\n' * 3)
    config = IndexConfig(data=str(data), tokenizer=str(small_tokenizer.path), cache_dir=str(tmp_path / "cache"))
    built = prepare_index(config, progress=False).index
    index = TokenIndex.open(built.path, verify_tokens=True)
    assert (index.num_documents, index.num_tokens) == (3, 0)
    assert np.asarray(index.lengths).tolist() == [0, 0, 0] and index.document_tokens(2).tolist() == []


def test_a_sharded_directory_without_its_manifest_is_not_read_as_a_corpus(capsys, tmp_path: Path, small_tokenizer):
    data = tmp_path / "data"
    data.mkdir()
    for j in range(2):  # two shards, one built
        (data / f"part-{j}.jsonl").write_text(f'{{"text": "def f():\\n    return {j}\\n"}}\n')
    cache = tmp_path / "cache"
    args = ["--tokenizer", str(small_tokenizer.path), "--cache-dir", str(cache)]
    assert main(["build", "--data", str(data), *args, "--shard", "0", "--num-shards", "2"]) == 0
    (root,) = cache.glob("sharded-*/")
    capsys.readouterr()
    line = _cli(capsys, "build", "--data", str(root), *args)
    assert line == (
        f"detsampler: error: data: {str(root)!r} is a sharded index directory without its manifest.json (its shards "
        "are not all built, or it was never finalized): run the missing --shard tasks or build --finalize"
    )


@pytest.mark.parametrize("data", ["hf://datasets/x/corpus.jsonl", "megatron:hf://datasets/x/prefix"])
def test_remote_storage_is_named_as_unsupported(capsys, tmp_path: Path, small_tokenizer, data: str) -> None:
    line = _cli(capsys, "build", "--data", data, "--tokenizer", str(small_tokenizer.path), "--cache-dir", str(tmp_path))
    url = data.removeprefix("megatron:")
    assert line.endswith(
        f"{url!r} is on remote storage ({url.split(':')[0]}://), which is not supported: copy it to a local path"
    )


@pytest.mark.parametrize(
    ("data", "error"),
    [
        ("s3://bucket/corpus", "data 's3://bucket/corpus' holds no index (no meta.json or manifest.json): an index in"),
        ("megatron:s3://bucket/prefix", "megatron source: no 's3://bucket/prefix.idx'; pass the path prefix of"),
    ],
)
def test_an_object_store_url_without_an_index_is_named(capsys, tmp_path, small_tokenizer, s3_endpoint, data, error):
    """Object store URLs are read (issue 22): one where there is no index (or no source) says so, naming it."""
    line = _cli(capsys, "build", "--data", data, "--tokenizer", str(small_tokenizer.path), "--cache-dir", str(tmp_path))
    assert line.startswith(f"detsampler: error: {error}")


@pytest.mark.parametrize("how", ["--data", "--from"])
def test_a_pre_tokenized_source_without_its_tokenizer_is_refused(capsys, tmp_path: Path, how: str) -> None:
    """Without a tokenizer its EOS and pad ids would be unknown (read as -1 and 0, printed as if they were ids)."""
    prefix = tmp_path / "m"
    np.array([11, 12, 2, 13, 2], dtype=np.uint16).tofile(f"{prefix}.bin")
    with open(f"{prefix}.idx", "wb") as f:  # MMIDIDX v1, uint16, 2 sequences, 3 document indices
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 8, 2, 3))
        f.write(np.array([3, 2], np.int32).tobytes() + np.array([0, 6], np.int64).tobytes())
        f.write(np.array([0, 1, 2], np.int64).tobytes())
    data = ["--data", f"megatron:{prefix}"] if how == "--data" else ["--from", "megatron", str(prefix)]
    line = _cli(capsys, "build", *data, "--cache-dir", str(tmp_path / "cache"))
    assert line == (
        f"detsampler: error: the pre-tokenized megatron files of {str(prefix)!r} record no tokenizer, so their EOS "
        "and pad ids would be unknown: pass --tokenizer (the one they were tokenized with)"
    )
