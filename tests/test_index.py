"""TokenIndex: exact contents, caching, bad inputs and tampering (each a clear error), and the best-fit layout cache."""

from __future__ import annotations

import json

import datasets
import numpy as np
import pytest

from detsampler.index import INDEX_FORMAT_VERSION, TokenIndex, TokenIndexError, build_index, token_dtype
from detsampler.index.format import READ_FORMAT_VERSIONS
from detsampler.text.corpus import default_tokenizer


def _copy_index(index: TokenIndex, dest):
    import shutil

    # Without the layout cache, which tests sharing the session's index fill.
    shutil.copytree(index.path, dest, ignore=shutil.ignore_patterns("layouts"))
    return dest


def test_index_holds_exactly_the_tokenized_documents(small_index, small_corpus, small_tokenizer):
    ids = small_tokenizer.encode_batch(small_corpus["text"])
    assert small_index.num_documents == len(ids) == len(small_corpus)
    assert small_index.lengths.tolist() == [len(doc) for doc in ids]
    assert small_index.offsets[0] == 0 and np.array_equal(np.diff(small_index.offsets), small_index.lengths)
    assert small_index.tokens.dtype == np.uint16
    assert small_index.tokens.tolist() == [t for doc in ids for t in doc]
    assert small_index.document_tokens(3).tolist() == ids[3]
    meta = small_index.meta
    assert meta["format_version"] == INDEX_FORMAT_VERSION
    assert meta["dataset_fingerprint"] == small_corpus._fingerprint
    assert meta["tokenizer"]["sha256"] == small_tokenizer.sha256
    assert meta["num_tokens"] == sum(map(len, ids))
    assert set(meta["files"]) == {"lengths.npy", "offsets.npy", "tokens.npy"}
    from detsampler.index.checksums import VerifiedArray

    assert isinstance(small_index.lengths, VerifiedArray) and isinstance(small_index.tokens, VerifiedArray)
    assert small_index.tokens.memory_mapped  # memory-mapped, checked chunk by chunk


def test_token_dtype():
    assert token_dtype(512) == np.uint16 and token_dtype(65536) == np.uint16 and token_dtype(65537) == np.uint32


def test_build_again_opens_the_cache(small_index, small_corpus, small_tokenizer, cache_root, capsys):
    again = build_index(small_corpus, small_tokenizer, cache_dir=cache_root, progress=True)
    assert again.path == small_index.path and again.meta == small_index.meta
    assert "tokenized" not in capsys.readouterr().err  # nothing was tokenized


def test_num_proc_and_store_tokens_options(tmp_path, small_corpus, small_tokenizer, small_index):
    par = build_index(small_corpus, small_tokenizer, cache_dir=tmp_path, num_proc=2, progress=False)
    assert np.array_equal(par.tokens, small_index.tokens) and np.array_equal(par.lengths, small_index.lengths)
    lean = build_index(small_corpus, small_tokenizer, cache_dir=tmp_path, store_tokens=False, progress=False)
    assert lean.path != par.path and lean.tokens is None and not (lean.path / "tokens.npy").exists()
    assert np.array_equal(lean.lengths, small_index.lengths)


def test_empty_documents_and_bad_text(tmp_path, small_tokenizer):
    ds = datasets.Dataset.from_dict({"text": ["", "def f():\n    return 1\n", "", "x = 2\n"]})
    index = build_index(ds, small_tokenizer, cache_dir=tmp_path, progress=False)
    assert index.lengths[0] == 0 and index.lengths[2] == 0 and index.num_documents == 4
    many = ["x = 1\n"] * 300 + [None]
    cases = (
        (["a = 1\n", "b = 2\n", None], 1, "document 2: column 'text' holds None"),
        ([3, 1, 4], 1, "document 0: column 'text' holds a int"),
        (many, 2, "document 300: column 'text' holds None"),  # raised in a worker process
    )
    for column, num_proc, what in cases:
        ds = datasets.Dataset.from_dict({"text": column})
        with pytest.raises(ValueError, match=f"{what}, not a string"):
            build_index(ds, small_tokenizer, cache_dir=tmp_path, num_proc=num_proc, progress=False)
        assert not list(tmp_path.glob(".tmp-index-*")), "a failed build leaves no temporary directory"
    with pytest.raises(ValueError, match="text_column 'content' is not a column"):
        build_index(ds, small_tokenizer, text_column="content", cache_dir=tmp_path)
    with pytest.raises(ValueError, match="num_proc"):
        build_index(ds, small_tokenizer, cache_dir=tmp_path, num_proc=0)


def test_open_checks_dataset_and_tokenizer(small_index, small_corpus, small_tokenizer, cache_root):
    TokenIndex.open(small_index.path, dataset=small_corpus, tokenizer=small_tokenizer)
    changed = small_corpus.map(lambda row: {"text": row["text"] + "\n# edited\n"})
    with pytest.raises(TokenIndexError, match="the dataset changed since the build"):
        TokenIndex.open(small_index.path, dataset=changed)
    other_tok = default_tokenizer(cache_root, vocab_size=600, corpus=small_corpus)
    with pytest.raises(TokenIndexError, match="the tokenizer changed since the build"):
        TokenIndex.open(small_index.path, tokenizer=other_tok)


def test_open_rejects_tampered_indexes(small_index, tmp_path):
    # truncated token file
    p = _copy_index(small_index, tmp_path / "trunc")
    with open(p / "tokens.npy", "r+b") as f:
        f.truncate((p / "tokens.npy").stat().st_size - 2)
    with pytest.raises(TokenIndexError, match="tokens.npy is .* bytes, its record says"):
        TokenIndex.open(p)
    # one edited length, same size
    p = _copy_index(small_index, tmp_path / "edit")
    lengths = np.load(p / "lengths.npy")
    lengths[1] += 1
    np.save(p / "lengths.npy", lengths)
    with pytest.raises(TokenIndexError, match="lengths.npy chunk 0 .* fails its checksum"):
        TokenIndex.open(p).lengths[1]
    # one edited token: caught by verify_tokens
    p = _copy_index(small_index, tmp_path / "tok")
    tokens = np.load(p / "tokens.npy")
    tokens[5] ^= 1
    np.save(p / "tokens.npy", tokens)
    TokenIndex.open(
        p
    )  # sizes still match: found when the chunk is read (tests/test_integrity.py), or by the full check
    with pytest.raises(TokenIndexError, match="tokens.npy chunk 0 .* fails its checksum"):
        TokenIndex.open(p, verify_tokens=True)
    # a file replaced by a pickled object array: never loaded
    p = _copy_index(small_index, tmp_path / "pickle")
    meta = json.loads((p / "meta.json").read_text())
    np.save(p / "offsets.npy", np.array([object()] * 3, dtype=object), allow_pickle=True)
    from detsampler.index.checksums import write_checksums
    from detsampler.index.format import seal_meta

    meta["files"]["offsets.npy"] = write_checksums(
        p, "offsets.npy"
    )  # a consistent forgery, checksums and seal included
    (p / "meta.json").write_text(json.dumps(seal_meta(meta)))
    with pytest.raises(TokenIndexError, match="offsets.npy is not a readable .npy file"):
        TokenIndex.open(p)
    # meta.json: broken, other version, missing
    p = _copy_index(small_index, tmp_path / "meta")
    (p / "meta.json").write_text("{ not json")
    with pytest.raises(TokenIndexError, match="meta.json is not valid JSON"):
        TokenIndex.open(p)
    meta = dict(small_index.meta, format_version=max(READ_FORMAT_VERSIONS) + 1)
    (p / "meta.json").write_text(json.dumps(meta))  # the version is checked first, whatever the seal says
    with pytest.raises(TokenIndexError, match="format version"):
        TokenIndex.open(p)
    (p / "meta.json").unlink()
    with pytest.raises(TokenIndexError, match="no index at"):
        TokenIndex.open(p)
