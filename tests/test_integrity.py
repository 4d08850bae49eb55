"""Issue 10, items 2-4: an edited or swapped token file, an edited meta.json and a tampered layout cache are never
served.

Each test injects the fault into a copy of the session's index and asserts a clear refusal (or, for the layout cache,
a correct recomputation).
"""

from __future__ import annotations

import json
import shutil

import datasets
import numpy as np
import pytest

from detsampler.index import TokenIndex, TokenIndexError, build_index
from detsampler.layout import LayoutConfig, make_layout


def _copy(index: TokenIndex, dest):
    shutil.copytree(index.path, dest, ignore=shutil.ignore_patterns("layouts", "*.lock", ".verified-*"))
    return dest


def _edit_token(path, position: int) -> None:
    """Flip one bit of token ``position`` in place (same size, same header)."""
    tokens = np.load(path / "tokens.npy", mmap_mode="r+")
    tokens[position] ^= 1
    tokens.flush()
    del tokens


# -- 10.2: tokens.npy ------------------------------------------------------------------------------------------------


def test_a_same_size_token_edit_is_refused_on_first_read(small_index, tmp_path):
    p = _copy(small_index, tmp_path / "edit")
    _edit_token(p, 5)
    index = TokenIndex.open(p)  # cheap open: the edit is found when the chunk is first read
    with pytest.raises(TokenIndexError, match=r"tokens\.npy.*checksum"):
        index.document_tokens(0)


def test_the_edited_chunk_is_refused_through_the_packed_dataset(small_index, tmp_path):
    from detsampler.loader.dataset import PackedDataset

    p = _copy(small_index, tmp_path / "edit")
    _edit_token(p, int(small_index.num_tokens) - 3)  # the last chunk
    index = TokenIndex.open(p)
    layout = make_layout(LayoutConfig(kind="concat", seq_len=64), np.asarray(index.lengths))
    ds = PackedDataset(index, layout)
    with pytest.raises(TokenIndexError, match=r"tokens\.npy.*checksum"):
        ds.get_batch(np.arange(layout.num_samples))


def test_the_tokens_of_another_index_with_equal_lengths_are_refused(small_tokenizer, tmp_path):
    texts = ["x = 1\n", "y = 2\n", "def f(a):\n    return a * 2\n" * 40]
    a = build_index(
        datasets.Dataset.from_dict({"text": texts}), small_tokenizer, cache_dir=tmp_path / "a", progress=False
    )
    b = build_index(
        datasets.Dataset.from_dict({"text": [texts[1], texts[0], texts[2]]}),
        small_tokenizer,
        cache_dir=tmp_path / "b",
        progress=False,
    )
    assert np.array_equal(a.lengths, b.lengths) and not np.array_equal(a.tokens, b.tokens)  # the premise
    shutil.copyfile(b.path / "tokens.npy", a.path / "tokens.npy")
    with pytest.raises(TokenIndexError, match=r"tokens\.npy.*checksum"):
        TokenIndex.open(a.path).document_tokens(0)
    with pytest.raises(TokenIndexError, match=r"tokens\.npy"):
        TokenIndex.open(a.path, verify_tokens=True)


def test_the_full_check_runs_once_per_index(small_index, tmp_path):
    """What the trainer calls at start: every chunk and sha256 the first time, then a marker; an edit is found first."""
    p = _copy(small_index, tmp_path / "once")
    assert TokenIndex.open(p).verify_once() is True
    assert TokenIndex.open(p).verify_once() is False  # the marker: not read again
    q = _copy(small_index, tmp_path / "edited")
    _edit_token(q, int(small_index.num_tokens) // 3)
    with pytest.raises(TokenIndexError, match=r"tokens\.npy chunk .* fails its checksum"):
        TokenIndex.open(q).verify_once()
    assert not list(q.glob(".verified-*"))


def test_verify_tokens_reads_every_chunk(small_index, small_tokenizer, tmp_path, capsys):
    """`detsampler verify --tokens` is the full check: it finds an edit in a chunk no sample has read yet."""
    from detsampler.cli import main

    root = tmp_path / "cache"
    p = _copy(small_index, root / small_index.path.name)
    args = [
        "--cache-dir",
        str(root),
        "--max-documents",
        "16",
        "--tokenizer",
        small_tokenizer.path,
        "--seq-len",
        "64",
        "--global-batch-size",
        "4",
        "--steps",
        "0:2",
    ]
    assert main(["verify", *args, "--tokens"]) == 0
    assert "every chunk checksum and sha256 verified" in capsys.readouterr().out
    _edit_token(p, int(small_index.num_tokens) // 2)
    assert main(["verify", *args]) == 0  # the plan alone does not read the edited chunk
    with pytest.raises(SystemExit) as exit_:
        main(["verify", *args, "--tokens"])
    assert exit_.value.code == 2
    assert "tokens.npy chunk" in capsys.readouterr().err


# -- 10.3: meta.json -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("field", ["eos_id", "pad_id", "cache_key"])
def test_an_edited_meta_json_is_refused(small_index, tmp_path, field):
    p = _copy(small_index, tmp_path / field)
    meta = json.loads((p / "meta.json").read_text())
    if field == "cache_key":
        meta["cache_key"] = meta["cache_key"][::-1]
    else:
        meta["tokenizer"][field] += 1
    (p / "meta.json").write_text(json.dumps(meta, indent=2, sort_keys=True))
    with pytest.raises(TokenIndexError, match="meta.json"):
        TokenIndex.open(p)


def test_eos_and_pad_are_cross_checked_against_the_tokenizer(small_index, small_tokenizer, tmp_path):
    from detsampler.index.format import seal_meta

    p = _copy(small_index, tmp_path / "resealed")
    meta = json.loads((p / "meta.json").read_text())
    meta["tokenizer"]["eos_id"] = (
        small_tokenizer.pad_id
    )  # a consistent-looking meta.json whose eos is not the tokenizer's
    (p / "meta.json").write_text(json.dumps(seal_meta(meta), indent=2, sort_keys=True))
    TokenIndex.open(p)
    with pytest.raises(TokenIndexError, match="eos_id"):
        TokenIndex.open(p, tokenizer=small_tokenizer)


# -- 10.4: the best-fit layout cache ---------------------------------------------------------------------------------


def _bestfit_bins_file(path):
    """The file that holds the best-fit layout's bin boundaries (items per bin, cumulative)."""
    (found,) = (path / "layouts").rglob("bin_items.npy")
    return found


def _tamper(f, how: str) -> None:
    if how == "header":
        raw = bytearray(f.read_bytes())
        raw[20] ^= 0x20  # inside the header dict
        f.write_bytes(bytes(raw))
        return
    arr = np.load(f, mmap_mode="r+")
    if how == "lower":
        arr[len(arr) // 2] -= 1  # a bin in the middle loses an item: found by its chunk's checksum when first read
    else:
        arr[-1] += 1  # the last bin reaches past the items: found on open
    arr.flush()


@pytest.mark.parametrize("how", ["lower", "raise", "header"])
def test_a_tampered_bestfit_cache_is_recomputed(small_index, tmp_path, how):
    config = LayoutConfig(kind="bestfit", seq_len=128, seed=2, window_docs=4)
    p = _copy(small_index, tmp_path / how)
    TokenIndex.open(p).layout(config)
    _tamper(_bestfit_bins_file(p), how)
    layout = TokenIndex.open(p).layout(config)
    fresh = make_layout(config, np.asarray(small_index.lengths))
    assert layout.num_samples == fresh.num_samples
    ids = np.arange(fresh.num_samples)
    got, want = layout.locate(ids), fresh.locate(ids)
    for field in ("offsets", "doc_ids", "starts", "stops"):
        np.testing.assert_array_equal(getattr(got, field), getattr(want, field))
