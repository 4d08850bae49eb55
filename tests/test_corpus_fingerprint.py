"""Local corpora are fingerprinted by content (issue 10 item 5): moving, copying or touching a corpus changes nothing;
every edit is seen, also a same-size edit whose mtime was restored; a normal open hashes nothing."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from detsampler.index.format import default_cache_dir
from detsampler.index.prepare import IndexConfig, prepare_index
from detsampler.text.corpus import _default_cache_dir, _local_files, load_corpus
from detsampler.text.fingerprint import content_fingerprint


def _write_corpus(root: Path) -> Path:
    root.mkdir(parents=True)
    for i in range(3):
        with open(root / f"part-{i}.jsonl", "w") as f:
            for j in range(5):
                f.write(json.dumps({"text": f"document {i}-{j}: " + "lorem ipsum " * (j + 1)}) + "\n")
    return root


def _edit_keeping_size_and_mtime(path: Path) -> None:
    """What ``cp -p``/``rsync -a``/``tar x`` of an edited file leave: the same size and the old mtime."""
    st = os.stat(path)
    text = path.read_text()
    path.write_text(text.replace("lorem", "LOREM", 1))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(path).st_size == st.st_size and os.stat(path).st_mtime_ns == st.st_mtime_ns


def test_a_same_size_edit_with_restored_mtime_is_seen(tmp_path: Path) -> None:
    corpus, cache = _write_corpus(tmp_path / "corpus"), tmp_path / "cache"
    before = load_corpus(corpus, cache_dir=cache)
    _edit_keeping_size_and_mtime(corpus / "part-1.jsonl")
    after = load_corpus(corpus, cache_dir=cache)
    assert after._fingerprint != before._fingerprint
    assert "LOREM" in after[5]["text"] and "LOREM" not in before[5]["text"]  # the new bytes, not a stale arrow cache


def test_moving_copying_or_touching_the_corpus_changes_nothing(tmp_path: Path) -> None:
    corpus, cache = _write_corpus(tmp_path / "corpus"), tmp_path / "cache"
    fp = load_corpus(corpus, cache_dir=cache)._fingerprint
    copy = tmp_path / "elsewhere" / "copy"
    shutil.copytree(corpus, copy)  # new paths, inodes and ctimes
    assert load_corpus(copy, cache_dir=cache)._fingerprint == fp
    moved = tmp_path / "moved"
    corpus.rename(moved)
    (moved / "part-0.jsonl").touch()
    assert load_corpus(moved, cache_dir=cache)._fingerprint == fp
    single = load_corpus(moved / "part-2.jsonl", cache_dir=cache)._fingerprint
    shutil.copy(moved / "part-2.jsonl", tmp_path / "renamed.jsonl")
    assert load_corpus(tmp_path / "renamed.jsonl", cache_dir=cache)._fingerprint == single


def test_a_normal_open_hashes_nothing(tmp_path: Path) -> None:
    corpus, cache = _write_corpus(tmp_path / "corpus"), tmp_path / "cache"
    kind, files = _local_files(corpus)
    first = content_fingerprint(corpus, files, kind, cache)
    assert first.bytes_hashed == first.num_bytes > 0
    again = content_fingerprint(corpus, files, kind, cache)
    assert again == first.__class__(first.digest, first.num_files, first.num_bytes, 0)
    _edit_keeping_size_and_mtime(files[0])
    edited = content_fingerprint(corpus, files, kind, cache)
    assert edited.digest != first.digest and edited.bytes_hashed == files[0].stat().st_size


def test_the_index_follows_the_content(tmp_path: Path, small_tokenizer) -> None:
    corpus, cache = _write_corpus(tmp_path / "corpus"), tmp_path / "cache"

    def index_of(source: Path):
        return prepare_index(
            IndexConfig(data=str(source), tokenizer=str(small_tokenizer.path), cache_dir=str(cache)), progress=False
        ).index

    first = index_of(corpus)
    moved = tmp_path / "moved"
    corpus.rename(moved)
    assert index_of(moved).path == first.path  # the same index: no rebuild, a resume is not refused
    _edit_keeping_size_and_mtime(moved / "part-0.jsonl")
    assert index_of(moved).path != first.path  # rebuilt from the new bytes


def test_the_default_cache_dir_rule_is_the_indexs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DETSAMPLER_CACHE", str(tmp_path))
    assert _default_cache_dir() == default_cache_dir()
    monkeypatch.delenv("DETSAMPLER_CACHE")
    assert _default_cache_dir() == default_cache_dir()


def test_an_edited_arrow_cache_is_found_and_rebuilt(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Hugging Face's arrow cache of the parsed corpus (what on-the-fly tokenization reads) is checked against the
    content hash recorded when it was written: one byte changed in it, its mtime restored, is found and re-parsed."""
    corpus, cache = _write_corpus(tmp_path / "corpus"), tmp_path / "cache"
    before = load_corpus(corpus, cache_dir=cache)
    texts = list(before["text"])  # (a Column reads the memory map lazily)
    (arrow,) = (cache / "hf-datasets" / before._fingerprint).rglob("*.arrow")
    data = arrow.read_bytes()
    at = data.index(b"lorem ipsum lorem")
    st = arrow.stat()
    arrow.write_bytes(data[:at] + b"L" + data[at + 1 :])
    os.utime(arrow, ns=(st.st_atime_ns, st.st_mtime_ns))
    with caplog.at_level("WARNING", logger="detsampler"):
        after = load_corpus(corpus, cache_dir=cache)
    assert list(after["text"]) == texts
    assert after._fingerprint == before._fingerprint
    (line,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert line.startswith("detsampler: the arrow cache ") and line.endswith(
        "differs from what was written (edited or damaged since): parsed again from the corpus"
    )
    assert list(load_corpus(corpus, cache_dir=cache)["text"]) == texts
