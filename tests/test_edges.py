"""Nothing silent at the edges (issue 21): inputs that were accepted and changed are refused in one accurate line, or
accepted as what they are."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from detsampler import LayoutConfig, Plan
from detsampler.layout import make_layout
from detsampler.mixture import Mixture


def _plan(seed) -> Plan:
    return Plan(100, seed=seed, global_batch_size=4, micro_batch_size=2)


def test_a_numpy_integer_seed_is_the_same_seed() -> None:
    assert np.array_equal(_plan(np.int64(7)).global_batch(3), _plan(7).global_batch(3))
    assert _plan(np.int64(7)).seed == 7 and type(_plan(np.int64(7)).seed) is int


INT_DTYPES = st.sampled_from([np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64])


@given(dtype=INT_DTYPES, seed=st.integers(0, 127), step=st.integers(0, 50))
def test_an_integer_seed_of_any_numpy_type_is_that_integer(dtype, seed: int, step: int) -> None:
    assert np.array_equal(_plan(dtype(seed)).global_batch(step), _plan(seed).global_batch(step))


@given(dtype=INT_DTYPES, ids=st.lists(st.integers(0, 127), max_size=8), kind=st.sampled_from(["concat", "document"]))
def test_locate_reads_the_same_spans_for_any_integer_dtype(dtype, ids: list[int], kind: str) -> None:
    layout = make_layout(LayoutConfig(kind=kind, seq_len=4), LENGTHS)
    ids = [i % layout.num_samples for i in ids]
    got, want = layout.locate(np.array(ids, dtype=dtype)), layout.locate(np.array(ids, dtype=np.int64))
    assert [got.sample(i) for i in range(len(ids))] == [want.sample(i) for i in range(len(ids))]


@pytest.mark.parametrize(
    "seed, message",
    [
        ("0", "seed must be an integer, got '0' (str)"),
        (None, "seed must be an integer, got None (NoneType)"),
        (True, "seed must be an integer, got True (bool)"),
        (1.5, "seed must be an integer, got 1.5 (float)"),
    ],
)
def test_a_seed_that_is_not_an_integer_is_refused(seed, message: str) -> None:
    with pytest.raises(ValueError) as info:
        _plan(seed)
    assert str(info.value) == message


LENGTHS = np.array([5, 70, 3, 40, 12, 90, 8], dtype=np.int64)


@pytest.mark.parametrize("kind", ["concat", "document", "bestfit"])
def test_locate_refuses_float_sample_ids(kind: str) -> None:
    layout = make_layout(LayoutConfig(kind=kind, seq_len=16), LENGTHS)
    with pytest.raises(ValueError) as info:
        layout.locate(np.array([1.7]))
    assert str(info.value) == "Got sample ids of dtype float64, sample ids must be integers"
    with pytest.raises(ValueError, match=r"^Got sample id 18446744073709551615, allowed sample ids are in \[0, "):
        layout.locate(np.array([2**64 - 1], dtype=np.uint64))
    assert len(layout.locate(np.array([], dtype=np.int64))) == 0 == len(layout.locate([]))


def test_make_layout_refuses_lengths_that_wrap_or_overflow() -> None:
    with pytest.raises(ValueError) as info:
        make_layout(LayoutConfig(kind="concat", seq_len=16), np.array([3, 2**64 - 1], dtype=np.uint64))
    assert str(info.value) == ("document lengths must be <= 2**62, got 18446744073709551615 for document 1")
    with pytest.raises(ValueError) as info:
        make_layout(LayoutConfig(kind="concat", seq_len=16), np.full(4, 2**61, dtype=np.int64))
    assert str(info.value) == (
        "the documents hold 9223372036854775812 tokens with EOS in all; at most 2**62 = 4611686018427387904, so that"
        " token positions fit in int64"
    )
    layout = make_layout(LayoutConfig(kind="concat", seq_len=16), np.array([40, 50], dtype=np.uint64))
    assert layout.num_tokens == 92


def test_mixture_dataset_refuses_float_ids_and_swapped_datasets() -> None:
    from detsampler.loader.mixture_dataset import MixtureDataset

    class Source:
        def __init__(self, layout):
            self.layout = layout

        def __len__(self):
            return self.layout.num_samples

        def __getitem__(self, i):
            return (self, i)

    config = LayoutConfig(kind="document", seq_len=16)
    a, b = make_layout(config, LENGTHS), make_layout(config, LENGTHS[::-1].copy())
    assert a.num_samples == b.num_samples
    mixture = Mixture([a, b], [1, 1], seed=0)
    dataset = MixtureDataset([Source(a), Source(b)], mixture)
    with pytest.raises(ValueError) as info:
        dataset[1.7]
    assert str(info.value) == "Got sample id 1.7 (float), sample ids must be integers"
    with pytest.raises(ValueError, match=r"^Got sample ids of dtype float64, sample ids must be integers$"):
        dataset.__getitems__([1.7])
    with pytest.raises(ValueError) as info:
        MixtureDataset([Source(b), Source(a)], mixture)
    assert str(info.value) == (
        "datasets[0] reads another layout than mixture source 0 (datasets[1] reads source 0's): give the datasets in"
        " the order of the mixture's sources"
    )
    assert dataset[np.int64(1)][1] == int(mixture.split_ids(np.array([1]))[1][0])


def test_restart_position_ids_must_be_a_bool(small_index) -> None:
    from detsampler import PackedDataset

    layout = small_index.layout(LayoutConfig(kind="concat", seq_len=32))
    with pytest.raises(ValueError) as info:
        PackedDataset(small_index, layout, restart_position_ids="no")
    assert str(info.value) == (
        "Got restart_position_ids 'no' (str), restart_position_ids must be True, False or None (the layout's default)"
    )
    assert PackedDataset(small_index, layout, restart_position_ids=np.bool_(False)).restart_position_ids is False


# -- CLI inputs
# ----------------------------------------------------------------------------------------------------------


def _cli_error(capsys: pytest.CaptureFixture, *argv: str) -> str:
    """Run the CLI; assert exit status 2 and exactly one ``detsampler: error:`` line, no traceback; return that line."""
    from detsampler.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(list(argv))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_an_empty_data_path_is_refused(capsys, tmp_path) -> None:
    line = _cli_error(capsys, "build", "--data", "", "--cache-dir", str(tmp_path))
    assert line == "detsampler: error: data: got an empty path ''; pass a file, a directory of files or KIND:PATH"
    assert not list(tmp_path.iterdir())


def _write_corpus(root) -> int:
    """30 one-line json documents over plain, gzip-compressed and upper-case-suffixed files; returns the count."""
    import gzip
    import json

    names = ["a.jsonl", "b.jsonl.gz", "C.JSONL", "d.Json", "e.JSONL.GZ", "sub/f.jsonl.gz"]
    for k, name in enumerate(names):
        body = "".join(json.dumps({"text": f"document {k}.{i}"}) + "\n" for i in range(5)).encode()
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(gzip.compress(body, mtime=0) if name.lower().endswith(".gz") else body)
    return 5 * len(names)


def test_a_directory_corpus_reads_compressed_and_upper_case_files(tmp_path) -> None:
    from detsampler.text.corpus import load_corpus

    corpus = tmp_path / "corpus"
    n = _write_corpus(corpus)
    ds = load_corpus(corpus, cache_dir=tmp_path / "cache")
    assert len(ds) == n == 30
    assert sorted(ds["text"]) == sorted(f"document {k}.{i}" for k in range(6) for i in range(5))


def test_a_directory_corpus_refuses_files_it_cannot_read(tmp_path) -> None:
    from detsampler.text.corpus import load_corpus

    corpus = tmp_path / "corpus"
    _write_corpus(corpus)
    (corpus / "notes.csv").write_text("a,b\n")
    (corpus / "x.jsonl.zip").write_bytes(b"PK")
    with pytest.raises(ValueError) as info:
        load_corpus(corpus, cache_dir=tmp_path / "cache")
    assert str(info.value) == (
        f"data: {str(corpus)!r} holds 2 file(s) of no readable kind: 'notes.csv', 'x.jsonl.zip' (readable: .json,"
        " .jsonl, .md, .parquet, .text, .txt, any case, compressed with .bz2, .gz or .xz); move them out or pass the"
        " files to read"
    )


def test_verify_tokens_without_stored_tokens_says_what_it_checked(capsys, tmp_path, small_tokenizer) -> None:
    from detsampler.cli import main

    argv = ["--max-documents", "8", "--tokenizer", str(small_tokenizer.path), "--cache-dir", str(tmp_path)]
    assert main(["verify", "--steps", "0:2", "--no-store-tokens", "--tokens", "--seq-len", "64", *argv]) == 0
    out = capsys.readouterr().out
    assert "every chunk checksum and sha256 verified" not in out
    assert out.splitlines()[0] == (
        "index files: lengths and offsets verified (every chunk checksum and sha256); the index stores no tokens"
        " (--no-store-tokens): the text is tokenized on the fly, no token was checked"
    ), out


def test_a_long_verify_prints_progress(capsys, monkeypatch, tmp_path, small_tokenizer) -> None:
    import detsampler.verify
    from detsampler.cli import main

    monkeypatch.setattr(detsampler.verify, "PROGRESS_STEPS", 4)
    argv = ["--max-documents", "8", "--tokenizer", str(small_tokenizer.path), "--cache-dir", str(tmp_path)]
    assert main(["verify", "--steps", "0:10", "--seq-len", "64", *argv]) == 0
    progress = [line for line in capsys.readouterr().err.splitlines() if line.startswith("verify: ")]
    assert progress == [
        "verify: checking the micro batches: 4 of 10 steps (40%)",
        "verify: checking the micro batches: 8 of 10 steps (80%)",
        "verify: reading the steps' positions: 4 of 10 steps (40%)",
        "verify: reading the steps' positions: 8 of 10 steps (80%)",
    ]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["verify", "--steps", "-1:5"], "argument --steps: expected 0 <= A < B, got '-1:5'"),
        (
            ["verify", "--steps", "0:2", "--mixture-data", "a,b", "--mixture-weights", "-1,2"],
            "detsampler: error: weights[0] must be >= 0, got '-1'",
        ),
        (["build", "--seq-len", "64"], "--seq-len shapes the layout that only --layout builds: add --layout"),
        (["build", "--kind", "document", "--window-docs", "9"], "--kind, --window-docs shape the layout that only"),
        (["build", "--num-shards", "4"], "--num-shards counts the tasks of --shard I: add --shard I"),
        (["build", "--shard", "auto", "--num-shards", "4"], "--num-shards counts the tasks of --shard I: add --shard"),
        (["build", "--engine", "ray"], "--engine chooses how --sharded builds its shards: add --sharded"),
        (["build", "--from", "zzz", "/nonexistent"], "--from: unknown kind 'zzz'; kinds are megatron, olmo,"),
    ],
)
def test_cli_misuse_is_one_accurate_line(capsys, tmp_path, argv: list[str], message: str) -> None:
    line = _cli_error(capsys, *argv, "--cache-dir", str(tmp_path))
    assert message in line, line
    assert "expected one argument" not in line


def test_a_ray_task_failure_is_the_task_s_own_one_line(capsys, monkeypatch, tmp_path, small_tokenizer) -> None:
    ray_exceptions = pytest.importorskip("ray.exceptions")
    import detsampler.index.shards

    def failing(*args, **kwargs):
        cause = ValueError("data: 'corpus/a.jsonl' cannot be read as json files: JSONDecodeError")
        traceback = "Traceback (most recent call last):\n  \x1b[36mray::build_one()\x1b[39m\nValueError: ..."
        raise ray_exceptions.RayTaskError("build_one", traceback, cause).as_instanceof_cause()

    monkeypatch.setattr(detsampler.index.shards, "build_shards_ray", failing)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.jsonl").write_text('{"text": "x"}\n')
    line = _cli_error(
        capsys, "build", "--sharded", "--engine", "ray", "--data", str(corpus), "--tokenizer",
        str(small_tokenizer.path), "--cache-dir", str(tmp_path / "cache"),
    )  # fmt: skip
    assert line == "detsampler: error: data: 'corpus/a.jsonl' cannot be read as json files: JSONDecodeError"


# -- paper cuts
# ----------------------------------------------------------------------------------------------------------


def test_tokenizer_train_reads_the_text_column_of_json_lines(tmp_path) -> None:
    import gzip
    import json

    from detsampler.text.tokenizer import read_training_texts

    docs = [f"def f{i}(x):\n    return x + {i}\n" for i in range(4)]
    (tmp_path / "a.jsonl").write_text("".join(json.dumps({"id": i, "body": d}) + "\n" for i, d in enumerate(docs[:2])))
    (tmp_path / "b.JSONL.gz").write_bytes(
        gzip.compress("".join(json.dumps({"body": d}) + "\n" for d in docs[2:]).encode())
    )
    (tmp_path / "c.txt").write_text("plain text\n")
    assert read_training_texts([tmp_path], "body") == [*docs, "plain text\n"]
    with pytest.raises(ValueError) as info:
        read_training_texts([tmp_path / "a.jsonl"], "text")
    assert str(info.value) == (
        f"tokenizer train: {str(tmp_path / 'a.jsonl')!r} line 1 has no 'text' column (columns: body, id); pass"
        " --text-column"
    )


def test_tokenizer_train_hf_bpe_refuses_a_json_file_name_for_its_directory(capsys, tmp_path) -> None:
    (tmp_path / "in.txt").write_text("some text\n")
    line = _cli_error(
        capsys, "tokenizer", "train", "--kind", "hf-bpe", "--input", str(tmp_path / "in.txt"), "--vocab-size", "300",
        "--out", str(tmp_path / "tokenizer.json"),
    )  # fmt: skip
    assert line == (
        f"detsampler: error: tokenizer train: --kind hf-bpe writes a directory (tokenizer.json and"
        f" tokenizer_config.json in it), got --out {str(tmp_path / 'tokenizer.json')!r}, a .json file name: pass the"
        " directory to write"
    )
    assert not (tmp_path / "tokenizer.json").exists()


@pytest.mark.parametrize("quiet", [False, True])
def test_a_build_logged_to_a_file_draws_no_progress_bars(capsys, tmp_path, small_tokenizer, quiet: bool) -> None:
    from detsampler.cli import main

    (tmp_path / "c.jsonl").write_text("".join(f'{{"text": "document {i}"}}\n' for i in range(3)))
    argv = ["build", "--data", str(tmp_path / "c.jsonl"), "--tokenizer", str(small_tokenizer.path)]
    assert main([*argv, "--cache-dir", str(tmp_path / "cache"), *(["--quiet"] if quiet else [])]) == 0
    captured = capsys.readouterr()
    assert "documents            3" in captured.out
    if quiet:
        assert captured.err == ""
    else:
        assert captured.err == f"detsampler: hashing 1 corpus file(s), 0.0 MB, under {tmp_path / 'c.jsonl'}\n"


def test_skip_ranges_are_spelled_inclusively(capsys, tmp_path) -> None:
    from detsampler.cli.options import _skip_ranges

    assert _skip_ranges("100..199,300..300") == [(100, 199), (300, 300)]
    line = _cli_error(capsys, "verify", "--steps", "0:2", "--skip-steps", "100:199", "--cache-dir", str(tmp_path))
    assert line == (
        "detsampler verify: error: argument --skip-steps: expected FIRST..LAST[,FIRST..LAST...] (inclusive data steps),"
        " e.g. 100..199, got '100:199': skip ranges include LAST, so they are written FIRST..LAST (A:B, as in --steps,"
        " stops before B)"
    )
    line = _cli_error(capsys, "verify", "--steps", "0:2", "--skip-steps", "5..x", "--cache-dir", str(tmp_path))
    assert line.endswith("e.g. 100..199, got '5..x'")


def test_a_refused_build_leaves_no_lock_file(capsys, tmp_path, small_tokenizer) -> None:
    (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\n{"text": null}\n')
    (tmp_path / "good.jsonl").write_text('{"text": "ok"}\n')
    cache = tmp_path / "cache"
    argv = ["--tokenizer", str(small_tokenizer.path), "--cache-dir", str(cache)]
    line = _cli_error(capsys, "build", "--data", str(tmp_path / "bad.jsonl"), *argv)
    assert "document 1: column 'text' holds None" in line
    from detsampler.cli import main

    assert main(["build", "--data", str(tmp_path / "good.jsonl"), *argv]) == 0
    assert sorted(p.name for p in cache.glob("*.lock")) == []
    assert len(list(cache.glob("index-*/meta.json"))) == 1


def test_the_removable_lock_excludes_and_leaves_no_file(tmp_path) -> None:
    import threading

    from detsampler.atomic import removable_lock

    path, inside, overlaps = tmp_path / "x.lock", [], []

    def hold(k: int) -> None:
        for _ in range(20):
            with removable_lock(path):
                inside.append(k)
                if len(inside) > 1:
                    overlaps.append(list(inside))
                inside.remove(k)

    threads = [threading.Thread(target=hold, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert overlaps == [] and not path.exists()
