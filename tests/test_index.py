"""TokenIndex: exact contents, caching, bad inputs and tampering (each a clear error), and the best-fit layout cache."""

from __future__ import annotations

import json

import datasets
import numpy as np
import pytest

from detsampler.index import INDEX_FORMAT_VERSION, TokenIndex, TokenIndexError, build_index, token_dtype
from detsampler.layout import LayoutConfig, make_layout
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
    assert isinstance(small_index.lengths, np.memmap) and isinstance(small_index.tokens, np.memmap)


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
    with pytest.raises(TokenIndexError, match="tokens.npy is .* bytes, the index recorded"):
        TokenIndex.open(p)
    # one edited length, same size
    p = _copy_index(small_index, tmp_path / "edit")
    lengths = np.load(p / "lengths.npy")
    lengths[1] += 1
    np.save(p / "lengths.npy", lengths)
    with pytest.raises(TokenIndexError, match="lengths.npy's sha256 differs"):
        TokenIndex.open(p)
    # one edited token: caught by verify_tokens
    p = _copy_index(small_index, tmp_path / "tok")
    tokens = np.load(p / "tokens.npy")
    tokens[5] ^= 1
    np.save(p / "tokens.npy", tokens)
    TokenIndex.open(p)  # sizes still match
    with pytest.raises(TokenIndexError, match="tokens.npy's sha256 differs"):
        TokenIndex.open(p, verify_tokens=True)
    # a file replaced by a pickled object array: never loaded
    p = _copy_index(small_index, tmp_path / "pickle")
    meta = json.loads((p / "meta.json").read_text())
    np.save(p / "offsets.npy", np.array([object()] * 3, dtype=object), allow_pickle=True)
    meta["files"]["offsets.npy"]["size"] = (p / "offsets.npy").stat().st_size
    import hashlib

    meta["files"]["offsets.npy"]["sha256"] = hashlib.sha256((p / "offsets.npy").read_bytes()).hexdigest()
    (p / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(TokenIndexError, match="offsets.npy is not a readable .npy file"):
        TokenIndex.open(p)
    # meta.json: broken, other version, missing
    p = _copy_index(small_index, tmp_path / "meta")
    (p / "meta.json").write_text("{ not json")
    with pytest.raises(TokenIndexError, match="meta.json is not valid JSON"):
        TokenIndex.open(p)
    meta = dict(small_index.meta, format_version=INDEX_FORMAT_VERSION + 1)
    (p / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(TokenIndexError, match="format version"):
        TokenIndex.open(p)
    (p / "meta.json").unlink()
    with pytest.raises(TokenIndexError, match="no index at"):
        TokenIndex.open(p)


def test_bestfit_bins_are_cached_next_to_the_index(small_index, tmp_path):
    index = TokenIndex.open(_copy_index(small_index, tmp_path / "idx"))
    import shutil

    shutil.rmtree(index.path / "layouts", ignore_errors=True)  # other tests may have cached layouts in the session index
    config = LayoutConfig(kind="bestfit", seq_len=128, seed=3, window_docs=5)
    first = index.layout(config)
    cached = list((index.path / "layouts").glob("bestfit-*.npy"))
    assert len(cached) == 1
    assert np.load(cached[0], allow_pickle=False).tolist() == first.bins_per_window.tolist()
    second = index.layout(config)
    fresh = make_layout(config, index.lengths)
    assert second.num_samples == first.num_samples == fresh.num_samples
    ids = np.arange(first.num_samples)
    a, b = second.locate(ids), fresh.locate(ids)
    assert all(np.array_equal(getattr(a, f), getattr(b, f)) for f in ("offsets", "doc_ids", "starts", "stops"))
    index.layout(LayoutConfig(kind="bestfit", seq_len=64, seed=3, window_docs=5))
    assert len(list((index.path / "layouts").glob("bestfit-*.npy"))) == 2
    assert index.layout(LayoutConfig(kind="concat", seq_len=64)).num_samples > 0
