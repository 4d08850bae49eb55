"""Tokenizer loading/training and corpus loading: identity, determinism across processes, and clear errors."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys

import datasets
import pytest

from detsampler.text.corpus import default_corpus, load_corpus, stdlib_files
from detsampler.text.tokenizer import Tokenizer, train_tokenizer


def test_tokenizer_identity_and_roundtrip(small_tokenizer, small_corpus):
    tok = Tokenizer.load(small_tokenizer.path)
    assert tok.sha256 == small_tokenizer.sha256 and len(tok.sha256) == 64
    assert tok.vocab_size == 512
    assert (tok.eos_id, tok.pad_id) == (2, 3)
    texts = small_corpus["text"][:4]
    ids = tok.encode_batch(texts)
    assert all(max(doc) < tok.vocab_size for doc in ids if doc)
    # identity normalization and byte fallback: source code decodes back exactly
    assert [tok.decode(doc) for doc in ids] == texts


def test_tokenizer_pickles_as_its_model(small_tokenizer, small_corpus):
    clone = pickle.loads(pickle.dumps(small_tokenizer))
    assert clone.sha256 == small_tokenizer.sha256
    texts = small_corpus["text"][:3]
    assert clone.encode_batch(texts) == small_tokenizer.encode_batch(texts)


def test_tokenizer_missing_or_not_a_model(tmp_path):
    with pytest.raises(ValueError, match="no sentencepiece model file"):
        Tokenizer.load(tmp_path / "nope.model")
    bad = tmp_path / "bad.model"
    bad.write_bytes(b"this is not a protobuf\x00\x01\x02" * 10)
    with pytest.raises(ValueError, match="not a sentencepiece model"):
        Tokenizer.load(bad)


def test_train_tokenizer_from_directory_is_deterministic(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for rel, path in stdlib_files()[:6]:
        (src / rel.replace("/", "_")).write_bytes(path.read_bytes())
    a = train_tokenizer([src], 400, tmp_path / "a.model")
    b = train_tokenizer(src, 400, tmp_path / "b.model")
    assert a.vocab_size == 400 and a.sha256 == b.sha256
    with pytest.raises(ValueError, match="vocab_size"):
        train_tokenizer(src, 10, tmp_path / "c.model")
    with pytest.raises(ValueError, match="neither a file nor a directory"):
        train_tokenizer([tmp_path / "missing"], 400, tmp_path / "d.model")


def test_default_corpus_sorted_and_deterministic_across_processes(small_corpus):
    paths = small_corpus["path"]
    assert paths == sorted(paths) and small_corpus.column_names == ["text", "path"]
    assert all("site-packages" not in p for p in stdlib_files() for p in [p[0]])
    again = default_corpus(max_documents=16)
    assert again._fingerprint == small_corpus._fingerprint
    code = "from detsampler.text.corpus import default_corpus; print(default_corpus(max_documents=16)._fingerprint)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == small_corpus._fingerprint
    assert default_corpus(max_documents=15)._fingerprint != small_corpus._fingerprint


def test_load_corpus_local_formats(tmp_path, small_corpus):
    rows = [{"text": t, "path": p} for t, p in zip(small_corpus["text"][:5], small_corpus["path"][:5])]
    jsonl = tmp_path / "docs.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    parquet = tmp_path / "docs.parquet"
    datasets.Dataset.from_list(rows).to_parquet(str(parquet))
    saved = tmp_path / "saved"
    datasets.Dataset.from_list(rows).save_to_disk(str(saved))
    texts_dir = tmp_path / "texts"
    texts_dir.mkdir()
    for i, r in enumerate(rows):
        (texts_dir / f"{i:02d}.txt").write_text(r["text"])
    want = [r["text"] for r in rows]
    for source in (jsonl, parquet, saved, texts_dir):
        ds = load_corpus(str(source))
        assert ds["text"] == want, source
    with pytest.raises(ValueError, match="text_column 'body' is not a column"):
        load_corpus(str(jsonl), text_column="body")
    with pytest.raises(ValueError, match="does not exist"):
        load_corpus(str(tmp_path / "missing"))
