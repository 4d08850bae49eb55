"""Pre-tokenized files as shards (issue 12.3): a manifest over Megatron ``.bin/.idx``, OLMo ``.npy``, datatrove ``.ds``
and nanoGPT ``.bin`` files (one shard each, memory-mapped where they lie), read with global document ids exactly as each
file's own reader (:func:`~detsampler.index.sources.open_source`) reads it; mixed with tokenized shards when both read
the EOS the same way, refused with the reason otherwise; a missing, corrupt or changed file named in one line.

The files are written in each format's published layout (the format readers themselves are checked against the peers'
own readers in tests/test_sources.py)."""

from __future__ import annotations

import gzip
import json
import struct
from pathlib import Path

import numpy as np
import pytest

from detsampler.cli import main
from detsampler.index import TokenIndexError
from detsampler.index.sharded import ShardedIndex
from detsampler.index.shards import build_shards, finalize, input_files, sharded_root, source_entries, source_files
from detsampler.index.sources import open_source
from detsampler.layout import LayoutConfig
from detsampler.loader.dataset import PackedDataset
from detsampler.text.policy import SpecialTokens

EOS = 7
NAMES = {"megatron": "part-{}", "olmo": "part-{}.npy", "datatrove": "part-{}.ds", "nanogpt": "part-{}.bin"}


def _documents(n: int, seed: int, eos: int, high: int = 1000) -> list[np.ndarray]:
    """``n`` documents of 1..40 ids in [10, high), most ending with ``eos`` (every fourth does not)."""
    rng = np.random.default_rng(seed)
    docs = [rng.integers(10, high, size=int(rng.integers(1, 40))) for _ in range(n)]
    return [np.append(d, eos) if i % 4 else d for i, d in enumerate(docs)]


def _write(kind: str, path: Path, docs: list[np.ndarray]) -> None:
    """``docs`` as the ``kind`` format lays them out (see detsampler.index.sources.formats for each layout)."""
    if kind in ("olmo", "nanogpt"):  # split at EOS: every document must end with one
        docs = [d if d[-1] == EOS else np.append(d, EOS) for d in docs]
    flat = np.concatenate(docs)
    ends = np.cumsum([len(d) for d in docs])
    if kind == "megatron":
        flat.astype(np.uint16).tofile(f"{path}.bin")
        n = len(docs)
        with open(f"{path}.idx", "wb") as f:
            f.write(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 8, n, n + 1))
            f.write(np.array([len(d) for d in docs], dtype=np.int32).tobytes())
            f.write((np.append(0, ends[:-1]) * 2).astype(np.int64).tobytes())
            f.write(np.arange(n + 1, dtype=np.int64).tobytes())
    elif kind == "olmo":
        flat.astype(np.uint32).tofile(path)
        with gzip.open(path.with_name(path.name.removesuffix(".npy") + ".csv.gz"), "wt") as f:
            f.writelines(f"{s},{e}\n" for s, e in zip(np.append(0, ends[:-1]), ends))
    elif kind == "datatrove":
        flat.astype(np.uint16).tofile(path)
        ends.astype("<u8").tofile(path.with_name(path.name + ".index"))
    else:
        flat.astype(np.uint16).tofile(path)


def _files(kind: str, where: Path, num_files: int = 3, seed: int = 0, high: int = 1000) -> list[Path]:
    where.mkdir(parents=True, exist_ok=True)
    for k in range(num_files):
        _write(kind, where / NAMES[kind].format(k), _documents(5 + 3 * k, seed + k, EOS, high))
    return source_files(kind, where)


def _sharded(root: Path, kind: str, paths: list[Path], **options) -> ShardedIndex:
    return finalize(root, [], None, source_entries(root, kind, paths, **options))


@pytest.mark.parametrize("kind", ["megatron", "olmo", "datatrove", "nanogpt"])
def test_each_pre_tokenized_kind_is_a_shard_read_as_its_own_reader_reads_it(kind, tmp_path):
    paths = _files(kind, tmp_path / "data")
    sharded = _sharded(tmp_path / "index", kind, paths, eos_id=EOS)
    own = [open_source(kind, p, eos_id=EOS) for p in paths]
    assert [s.kind for s in sharded.shards] == [kind] * 3 and len(paths) == 3
    assert sharded.num_documents == sum(s.num_documents for s in own)
    want = [s.document_tokens(d).tolist() for s in own for d in range(s.num_documents)]
    assert [sharded.document_tokens(g).tolist() for g in range(sharded.num_documents)] == want
    np.testing.assert_array_equal(np.asarray(sharded.lengths), np.concatenate([s.lengths for s in own]))
    np.testing.assert_array_equal(np.asarray(sharded.tokens), np.concatenate([np.asarray(s.tokens) for s in own]))
    for shard, path in zip(sharded.shards, paths):  # memory-mapped where it lies: nothing copied
        assert isinstance(shard.tokens, np.memmap) and Path(shard.tokens.filename).name.startswith(path.name)
    assert sorted(p.name for p in (tmp_path / "index").iterdir() if p.is_file()) == [
        "manifest.json",
        "manifest.json.lock",
    ]
    # the loader reads each document's stored tokens, its last one at the EOS position (a real EOS, as stored)
    layout = sharded.layout(LayoutConfig(kind="document", seq_len=64))
    ds = PackedDataset(sharded, layout)
    for sample in range(len(ds)):
        item = ds[sample]
        doc = int(item["document_ids"][0])
        assert item["input_ids"][item["document_ids"] == doc].tolist() == want[doc]


def test_a_missing_corrupt_or_changed_source_file_is_named_in_one_line(tmp_path):
    paths = _files("megatron", tmp_path / "data")
    root = tmp_path / "index"
    _sharded(root, "megatron", paths, eos_id=EOS)
    bin1 = Path(f"{paths[1]}.bin")
    good = bin1.read_bytes()

    def refused(pattern: str) -> None:
        with pytest.raises(TokenIndexError, match=pattern) as caught:
            ShardedIndex.open(root)
        assert "\n" not in str(caught.value)

    bin1.unlink()
    refused(r"shard 1 \(.*part-1\) cannot be opened: .*no token file")
    bin1.write_bytes(good[:-2])  # truncated
    refused(r"shard 1 \(.*part-1\) cannot be opened: .*not contiguous")
    changed = bytearray(good)
    changed[0] ^= 1  # one token edited in place
    bin1.write_bytes(bytes(changed))
    refused(r"shard 1 \(.*part-1\) is not the one the manifest lists .* changed")
    bin1.write_bytes(good)
    assert ShardedIndex.open(root).num_documents == sum(open_source("megatron", p).num_documents for p in paths)
    with pytest.raises(TokenIndexError, match=r"megatron shard .*nothing.* cannot be opened"):
        source_entries(root, "megatron", [tmp_path / "nothing"])


def _text_files(where: Path, texts: list[str]) -> Path:
    where.mkdir()
    for j in range(2):
        (where / f"text-{j}.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts[j::2]))
    return where


def test_tokenized_and_pre_tokenized_shards_mix_when_they_read_the_eos_alike(
    tmp_path, small_corpus, small_tokenizer, capsys
):
    tok = small_tokenizer
    text = _text_files(tmp_path / "text", small_corpus["text"][:6])
    megatron = tmp_path / "megatron"
    megatron.mkdir()
    for k in range(2):  # documents ending in the tokenizer's stored EOS, as Megatron's preprocess_data writes them
        docs = [np.append(d, tok.eos_id) for d in _documents(4, k, EOS, high=tok.vocab_size)]
        _write("megatron", megatron / f"m-{k}", docs)
    base = ["build", "--data", str(text), "--from", "megatron", str(megatron), "--tokenizer", tok.path]
    base += ["--cache-dir", str(tmp_path / "cache"), "--sharded"]
    with pytest.raises(SystemExit):  # text shards read a virtual EOS, the Megatron files store theirs: refused
        main(base)
    error = capsys.readouterr().err
    assert error.startswith("detsampler: error: ") and error.count("\n") == 1 and "--add-eos real" in error
    assert not (tmp_path / "cache" / "shards").exists()  # refused before a shard is built
    assert main([*base, "--add-eos", "real"]) == 0
    files, sources = input_files(text), [("megatron", p) for p in source_files("megatron", megatron)]
    root = sharded_root(tmp_path / "cache", files, tok, special_tokens=SpecialTokens(add_eos="real"), sources=sources)
    sharded = ShardedIndex.open(root)
    assert [s.__class__.__name__ for s in sharded.shards] == ["TokenIndex"] * 2 + ["TokenSource"] * 2
    virtual = sharded_root(tmp_path / "plain", files, tok)  # the library's own check: text shards with a virtual EOS
    build_shards(files, tok, virtual, [0, 1], progress=False)
    with pytest.raises(TokenIndexError, match=r"shard 2 \(.*m-0\) cannot be mixed: .*add_eos='real'") as caught:
        finalize(virtual, files, tok, source_entries(virtual, "megatron", [sources[0][1]]))
    assert "\n" not in str(caught.value) and not (virtual / "manifest.json").exists()  # no manifest written
    assert sharded.eos_stored and sharded.eos_id == tok.eos_id
    parts = list(sharded.shards[:2]) + [open_source("megatron", p, tokenizer=tok) for _, p in sources]
    want = [s.document_tokens(d).tolist() for s in parts for d in range(s.num_documents)]
    assert [sharded.document_tokens(g).tolist() for g in range(sharded.num_documents)] == want
    capsys.readouterr()
    plan = ["--seq-len", "64", "--global-batch-size", "4", "--steps", "0:10", "--tokens"]
    assert (
        main(["verify", "--data", str(root), "--tokenizer", tok.path, "--cache-dir", str(tmp_path / "cache"), *plan])
        == 0
    )
    out = capsys.readouterr().out  # the tokenized shards' checksums read in full; the Megatron files have none
    tokenized = sum(shard.num_tokens for shard in sharded.shards[:2])
    assert f"verified ({tokenized} tokens); 2 pre-tokenized file(s) record no checksum: not verified" in out
    assert "OK: no duplicates, no gaps" in out
    from detsampler.index.prepare import IndexConfig, prepare_index

    with pytest.raises(ValueError, match=r"2 of its 4 shards are tokenized: pass the tokenizer"):
        prepare_index(IndexConfig(data=str(root)), progress=False)


def test_a_sharded_index_of_pre_tokenized_files_only_is_prepared_without_a_tokenizer(tmp_path):
    """Like a single pre-tokenized source (its tokenizer optional), a manifest over pre-tokenized files only needs none
    (a mixed one still does: test_tokenized_and_pre_tokenized_shards_mix_when_they_read_the_eos_alike)."""
    from detsampler.index.prepare import IndexConfig, prepare_index

    paths = _files("megatron", tmp_path / "data")
    sharded = _sharded(tmp_path / "index", "megatron", paths, eos_id=EOS)
    prepared = prepare_index(IndexConfig(data=str(tmp_path / "index")), progress=False)
    assert prepared.tokenizer is None and prepared.dataset is None
    assert prepared.index.num_documents == sharded.num_documents
    manifest = json.loads((tmp_path / "index" / "manifest.json").read_text())
    assert {e["kind"] for e in manifest["shards"]} == {"megatron"}


def test_build_on_a_sharded_index_directory_prints_its_summary(tmp_path, capsys):
    """``detsampler build --data DIR`` on a finalized sharded index opens it and prints what it holds (no build)."""
    paths = _files("megatron", tmp_path / "data")
    sharded = _sharded(tmp_path / "index", "megatron", paths, eos_id=EOS)
    capsys.readouterr()
    assert main(["build", "--data", str(tmp_path / "index")]) == 0
    out = capsys.readouterr().out
    assert "shards" in out and "3 (megatron 3)" in out and sharded.fingerprint in out
    assert main(["build", "--data", str(tmp_path / "index"), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["num_documents"] == sharded.num_documents and summary["tokenizer_path"] is None
