"""Issue 31: what the audits and pushes of object storage say is what they did (moto's real S3 server on loopback).

- ``verify --tokens`` / ``build --verify-tokens`` of an index in a bucket read every block of every object, check each
  chunk and each object's sha256 (streamed, bounded memory), and no path prints "verified" for a check that did not run;
- two pushes racing to one prefix: exactly one succeeds, the other is refused naming the prefix, and the prefix opens as
  the winner's index (create-only writes where the store has them; read back and said so where it does not).
"""

from __future__ import annotations

import numpy as np
import pytest

from detsampler.cli import main
from detsampler.index import TokenIndex, build_index
from detsampler.index.checksums import CHUNK_BYTES, ChecksumError
from detsampler.index.push import push_index
from detsampler.storage import DEFAULT_BLOCK_BYTES, store_for


@pytest.fixture(scope="module")
def two_block_index(small_corpus, small_tokenizer, tmp_path_factory) -> TokenIndex:
    """An index whose ``tokens.npy`` spans two 1 MiB blocks: an edit past the first block is not met on open."""
    from datasets import Dataset

    corpus = Dataset.from_dict({"text": [t + f"\n# copy {k}\n" for k in range(3) for t in small_corpus["text"]]})
    index = build_index(corpus, small_tokenizer, cache_dir=tmp_path_factory.mktemp("two-blocks"), progress=False)
    assert (index.path / "tokens.npy").stat().st_size > DEFAULT_BLOCK_BYTES + CHUNK_BYTES
    return index


def _tampered(index: TokenIndex, url: str) -> int:
    """Push ``index`` to ``url``, flip one bit of its ``tokens.npy`` object in the last chunk; returns the chunk."""
    push_index(index.path, url)
    raw = bytearray((index.path / "tokens.npy").read_bytes())
    raw[-10] ^= 1
    store_for(url).put(f"{url}/tokens.npy", bytes(raw))
    return (len(raw) - 10) // CHUNK_BYTES


def _plan(tokenizer) -> list[str]:
    return ["--tokenizer", str(tokenizer.path), "--seq-len", "64", "--global-batch-size", "4", "--steps", "0:2"]


def test_verify_tokens_of_an_index_in_a_bucket_reads_every_block(two_block_index, small_tokenizer, s3_bucket, capsys):
    url = f"{s3_bucket}/audit/{two_block_index.path.name}"
    push_index(two_block_index.path, url)
    assert main(["verify", "--data", url, *_plan(small_tokenizer), "--tokens"]) == 0
    captured = capsys.readouterr()
    n = two_block_index.num_tokens
    assert f"index files: every chunk checksum and sha256 verified ({n} tokens)" in captured.out
    size = (two_block_index.path / "tokens.npy").stat().st_size
    assert f"verify: reading {url}/tokens.npy in full ({size:,} bytes)" in captured.err


def test_verify_tokens_of_a_tampered_index_in_a_bucket_is_refused(two_block_index, small_tokenizer, s3_bucket, capsys):
    """Before issue 31 this printed "every chunk checksum and sha256 verified" and exited 0: nothing was read."""
    url = f"{s3_bucket}/audit-tampered/{two_block_index.path.name}"
    chunk = _tampered(two_block_index, url)
    index = TokenIndex.open(url)  # opening reads the first block only: the edit is not met
    assert index.tokens._array.source.fetched_bytes <= DEFAULT_BLOCK_BYTES
    for argv in (
        ["verify", "--data", url, *_plan(small_tokenizer), "--tokens"],
        ["build", "--data", url, "--tokenizer", str(small_tokenizer.path), "--verify-tokens"],
    ):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        captured = capsys.readouterr()
        assert exit_.value.code == 2 and "verified" not in captured.out, argv
        assert f"tokens.npy chunk {chunk} (bytes {chunk * CHUNK_BYTES}.." in captured.err
        assert "fails its checksum" in captured.err and captured.err.count("detsampler: error:") == 1
    with pytest.raises(ChecksumError, match=f"tokens.npy chunk {chunk} "):
        index.tokens.verify_all()  # the array's own full check reads the blocks (it only marked them before)


def test_a_full_check_of_a_remote_array_streams_its_blocks_and_hashes_them_once(two_block_index, s3_bucket):
    url = f"{s3_bucket}/audit-stream/{two_block_index.path.name}"
    push_index(two_block_index.path, url)
    tokens = TokenIndex.open(url).tokens
    source = tokens._array.source
    before = source.fetched_bytes
    tokens.verify_all()
    size = (two_block_index.path / "tokens.npy").stat().st_size
    assert tokens.verified == -(-size // CHUNK_BYTES)  # every chunk
    assert tokens.sha256() == two_block_index.meta["files"]["tokens.npy"]["sha256"]  # no second read
    assert len(source._recent) <= 8 and source.fetched_bytes == before  # its own blocks untouched: read beside them


def test_verify_tokens_of_a_pre_tokenized_source_says_nothing_was_verified(tmp_path, small_tokenizer, capsys):
    """Before: "every chunk checksum and sha256 verified (0 tokens); 1 pre-tokenized file(s) record no checksum"."""
    path = tmp_path / "train.bin"
    np.array([11, 12, 2, 13, 2] * 40, dtype=np.uint16).tofile(path)
    argv = ["--data", f"nanogpt:{path}", "--cache-dir", str(tmp_path / "cache")]
    assert main(["verify", *argv, *_plan(small_tokenizer), "--tokens"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("index files: nothing verified: 1 pre-tokenized file(s) record no checksum\n")
