"""Pre-tokenized corpora opened as indexes: fixtures written by each peer's own writer where it installs
(megatron-core's IndexedDatasetBuilder, OLMo-core's metadata writer, datatrove's DocumentTokenizer), read back through a
layout, PackedDataset and a DataLoader, and compared token for token with the peer's own reader. nanoGPT has no
package: its ``train.bin`` is written as nanoGPT's ``data/openwebtext/prepare.py`` does (uint16 ids, EOS 50256 after
each document) and read as its ``train.py`` does (``np.memmap(..., dtype=np.uint16)``)."""

from __future__ import annotations

import gzip
import json
import os
import pickle
import warnings

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from detsampler import DeterministicBatchSampler, LayoutConfig, Plan
from detsampler.cli import main
from detsampler.index.format import TokenIndexError
from detsampler.index.sources import open_source, parse_source_spec
from detsampler.loader.dataset import PackedDataset, collate_micro_batch

EOS = 7


def _documents(n: int = 60, seed: int = 0, eos: int | None = EOS) -> list[np.ndarray]:
    """``n`` documents of 1..90 random ids in [10, 1000), each ending with ``eos`` when given."""
    rng = np.random.default_rng(seed)
    docs = [rng.integers(10, 1000, size=int(rng.integers(1, 90))).astype(np.int64) for _ in range(n)]
    return [np.append(d, eos) if eos is not None else d for d in docs]


def _loader_documents(source, seq_len: int | None = None) -> dict[int, list[int]]:
    """Every document as the DataLoader delivers it (document layout, one document a sample), by document id."""
    seq_len = seq_len or int(source.lengths.max()) + 1
    layout = source.layout(LayoutConfig(kind="document", seq_len=seq_len))
    ds = PackedDataset(source, layout)
    plan = Plan(len(ds), seed=1, global_batch_size=4, micro_batch_size=4)
    steps = -(-len(ds) // 4)
    loader = DataLoader(
        ds,
        batch_sampler=DeterministicBatchSampler(plan, rank=0, stop_step=steps),
        num_workers=1,
        collate_fn=collate_micro_batch,
    )
    got: dict[int, list[int]] = {}
    for batch in loader:
        for ids, docs in zip(batch["input_ids"], batch["document_ids"]):
            d = int(docs[0])
            got.setdefault(d, ids[docs == d].tolist())
    return got


def test_megatron_equals_megatron_core_reader(tmp_path):
    pytest.importorskip("megatron.core")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets.indexed_dataset import IndexedDataset, IndexedDatasetBuilder
    prefix = str(tmp_path / "corpus_text_document")
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
    docs = _documents()
    for i, doc in enumerate(docs):
        if i % 5 == 0:  # some documents of two sequences (as --split-sentences writes them)
            half = len(doc) // 2
            builder.add_item(torch.from_numpy(doc[:half]))
            builder.add_item(torch.from_numpy(doc[half:]))
        else:
            builder.add_item(torch.from_numpy(doc))
        builder.end_document()
    builder.finalize(prefix + ".idx")
    peer = IndexedDataset(prefix)
    bounds = peer.document_indices
    peer_docs = [
        np.concatenate([peer[s] for s in range(bounds[d], bounds[d + 1])]).tolist() for d in range(len(bounds) - 1)
    ]
    source = open_source("megatron", prefix)
    assert source.num_documents == len(peer_docs) == len(docs)
    assert [source.document_tokens(d).tolist() for d in range(len(docs))] == peer_docs
    got = _loader_documents(source)
    assert [got[d] for d in range(len(docs))] == peer_docs  # the EOS stored by the writer is read, no token added
    assert isinstance(source.tokens, np.memmap)
    clone = pickle.loads(pickle.dumps(source))
    assert clone.fingerprint == source.fingerprint and np.array_equal(clone.lengths, source.lengths)
    virtual = open_source("megatron", prefix, eos="virtual", eos_id=EOS)
    assert virtual.fingerprint != source.fingerprint
    assert _loader_documents(virtual)[3] == peer_docs[3] + [EOS]


def test_olmo_npy_equals_olmo_core_reader(tmp_path):
    pytest.importorskip("olmo_core")
    from olmo_core.data.utils import iter_document_indices, load_array_slice, write_document_indices

    docs = _documents(seed=1)
    path = tmp_path / "part-0-00000.npy"
    flat = np.concatenate(docs).astype(np.uint32)
    mm = np.memmap(path, dtype=np.uint32, mode="w+", shape=flat.shape)  # as Dolma writes its token files
    mm[:] = flat
    mm.flush()
    del mm
    peer_bounds = list(iter_document_indices(path, eos_token_id=EOS, dtype=np.uint32))
    peer_docs = [load_array_slice(path, s, e, np.uint32).tolist() for s, e in peer_bounds]
    scanned = open_source("olmo", path, eos_id=EOS)  # no metadata: split after each EOS
    write_document_indices(path, dtype=np.uint32, eos_token_id=EOS)
    with_meta = open_source("olmo", path)  # the .csv.gz the peer wrote
    for source in (scanned, with_meta):
        assert [source.document_tokens(d).tolist() for d in range(source.num_documents)] == peer_docs
        got = _loader_documents(source)
        assert [got[d] for d in range(len(peer_docs))] == peer_docs
    assert scanned.identity != with_meta.identity  # the metadata file is part of the identity
    with pytest.raises(ValueError, match="pass eos_id"):
        open_source("olmo", tmp_path / "x.npy" if (tmp_path / "x.npy").write_bytes(b"\0" * 8) else None)


def test_olmo_metadata_decides_boundaries(tmp_path):
    """With a .csv.gz, documents are its rows even where a document holds no EOS (the case iter_document_indices warns
    of)."""
    path = tmp_path / "a.npy"
    np.array([5, 6, EOS, 8, 9, 10, 11, EOS], dtype=np.uint32).tofile(path)
    with gzip.open(tmp_path / "a.csv.gz", "wt") as f:
        f.write("0,3\n3,5\n5,8\n")
    source = open_source("olmo", path)
    assert [source.document_tokens(d).tolist() for d in range(3)] == [[5, 6, EOS], [8, 9], [10, 11, EOS]]


def test_datatrove_equals_datatrove_reader(tmp_path, small_corpus):
    pytest.importorskip("datatrove")
    from datatrove.data import Document
    from datatrove.pipeline.tokens import DocumentTokenizer
    from datatrove.utils.dataset import DatatroveFileDataset

    from detsampler.text.hf import train_hf_bpe

    tok = train_hf_bpe(small_corpus["text"], 400, tmp_path / "tok")
    texts = [line for text in small_corpus["text"][:3] for line in text.split("\n\n") if line.strip()][:80]
    out = tmp_path / "tokenized"
    step = DocumentTokenizer(
        str(out),
        tokenizer_name_or_path=tok.path,
        eos_token="<|endoftext|>",
        shuffle_documents=False,
        save_filename="corpus",
    )
    step.run((Document(text=t, id=str(i)) for i, t in enumerate(texts)), rank=0, world_size=1)
    ds_file = next(out.glob("*.ds"))
    source = open_source("datatrove", ds_file, tokenizer=tok)
    assert source.num_documents == len(texts) and source.eos_id == tok.eos_id == 0
    expected = [[*ids, tok.eos_id] for ids in tok.encode_batch(texts)]  # DocumentTokenizer appends the EOS
    assert [source.document_tokens(d).tolist() for d in range(len(texts))] == expected
    got = _loader_documents(source)
    assert [got[d] for d in range(len(texts))] == expected
    seq_len = 32
    peer = DatatroveFileDataset(str(ds_file), seq_len, token_size=2)
    flat = np.concatenate(expected)
    w = seq_len + 1
    for i in range(len(peer)):  # the peer reads consecutive windows of seq_len + 1 tokens: our stored tokens
        assert peer[i]["input_ids"].tolist() == flat[i * w : (i + 1) * w].tolist()


def test_nanogpt_train_bin(tmp_path):
    docs = _documents(seed=2, eos=50256)
    path = tmp_path / "train.bin"
    arr = np.memmap(path, dtype=np.uint16, mode="w+", shape=(sum(map(len, docs)),))  # as prepare.py writes it
    arr[:] = np.concatenate(docs)
    arr.flush()
    del arr
    source = open_source("nanogpt", path)
    data = np.memmap(path, dtype=np.uint16, mode="r")  # as nanoGPT's train.py reads it
    assert [source.document_tokens(d).tolist() for d in range(len(docs))] == [d.tolist() for d in docs]
    layout = source.layout(LayoutConfig(kind="concat", seq_len=64, seed=0))
    ds = PackedDataset(source, layout)
    order = np.asarray(layout.order)
    stream = np.concatenate([data[source.offsets[d] : source.offsets[d + 1]] for d in order]).astype(np.int64)
    for c in range(len(ds)):
        assert ds[c]["input_ids"].tolist() == stream[c * 64 : c * 64 + 64].tolist()
        assert ds[c]["labels"].tolist() == stream[c * 64 + 1 : c * 64 + 65].tolist()


def test_source_errors(tmp_path):
    with pytest.raises(ValueError, match="KIND one of megatron, olmo, datatrove, nanogpt"):
        parse_source_spec("parquet:x")
    with pytest.raises(TokenIndexError, match=r"no .*\.idx"):
        open_source("megatron", tmp_path / "nothing")
    (tmp_path / "odd.bin").write_bytes(b"\0" * 3)
    with pytest.raises(TokenIndexError, match="not a whole number of uint16 tokens"):
        open_source("nanogpt", tmp_path / "odd.bin")
    np.array([EOS, EOS, 5], dtype=np.uint16).tofile(tmp_path / "t.bin")
    assert open_source("nanogpt", tmp_path / "t.bin", eos_id=EOS).num_documents == 3
    (tmp_path / "x.ds").write_bytes(np.array([1, 2, 3], dtype=np.uint16).tobytes())
    (tmp_path / "x.ds.index").write_bytes(np.array([0, 3], dtype="<u8").tobytes())
    with pytest.raises(TokenIndexError, match="document 0 is empty"):
        open_source("datatrove", tmp_path / "x.ds")
    assert open_source("datatrove", tmp_path / "x.ds", eos="virtual", eos_id=EOS).lengths.tolist() == [0, 3]


def test_cli_build_from_megatron_and_a_mixture_with_text(tmp_path, capsys, small_corpus, small_tokenizer, cache_root):
    pytest.importorskip("megatron.core")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
    prefix = str(tmp_path / "m")
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
    for doc in _documents(eos=small_tokenizer.eos_id):
        builder.add_item(torch.from_numpy(doc % small_tokenizer.vocab_size))
        builder.end_document()
    builder.finalize(prefix + ".idx")
    assert main(["build", "--from", "megatron", prefix, "--tokenizer", small_tokenizer.path, "--json"]) == 0
    out = capsys.readouterr().out
    assert '"source_kind": "megatron"' in out and '"num_documents": 60' in out
    text = tmp_path / "text.jsonl"
    text.write_text("".join(json.dumps({"text": t}) + "\n" for t in small_corpus["text"][:6]))
    args = [
        "verify",
        "--mixture-data",
        f"megatron:{prefix},{text}",
        "--mixture-weights",
        "1,1",
        "--tokenizer",
        small_tokenizer.path,
        "--cache-dir",
        str(cache_root),
        "--seq-len",
        "64",
        "--steps",
        "0:20",
    ]
    assert main(args) == 0, capsys.readouterr()


def _write_megatron(prefix, docs, dtype=np.uint16) -> None:
    """``docs`` written by megatron-core's own IndexedDatasetBuilder, one sequence per document."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=dtype)
    for doc in docs:
        builder.add_item(torch.from_numpy(np.asarray(doc, dtype=np.int64)))
        builder.end_document()
    builder.finalize(f"{prefix}.idx")


def _keep_mtime_write(path, position: int, value: np.ndarray) -> None:
    """Overwrite the bytes at ``position`` with ``value`` in place and restore the file's mtime (as ``cp -p`` of an
    edited file, ``rsync -a`` or ``tar x`` leave it)."""
    st = path.stat()
    with open(path, "r+b") as f:
        f.seek(position)
        f.write(value.tobytes())
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns


def test_an_eos_written_in_an_unsampled_block_with_the_mtime_restored_is_seen(tmp_path, cache_root):
    """The EOS-boundary cache of a nanoGPT/OLMo file is keyed by content, not by (identity, inode, mtime)."""
    path = tmp_path / "train.bin"
    tokens = np.full(4 << 20, 11, dtype=np.uint16)  # 8 MiB: bytes [1114112, 1310720) lie in no sampled block
    tokens[1 << 19 :: 1 << 19] = 50256
    tokens.tofile(path)
    before = open_source("nanogpt", path)
    assert before.num_documents == 8
    _keep_mtime_write(path, 1_200_000, np.array([50256], dtype=np.uint16))
    after = open_source("nanogpt", path)
    assert after.identity == before.identity  # the sampled identity cannot see it: the cache key must
    assert after.num_documents == 9 and after.offsets.tolist()[:3] == [0, (1 << 19) + 1, 600_001]


def test_token_ids_outside_the_vocabulary_are_refused(tmp_path, small_tokenizer, capsys):
    pytest.importorskip("megatron.core")
    docs = _documents(seed=4)
    docs[30][0] = 4999
    _write_megatron(tmp_path / "big", docs)
    with pytest.raises(
        TokenIndexError,
        match=r"^megatron source '.*big': token ids span \[7, 4999\], outside the vocabulary \[0, 1000\) it is read "
        r"with \(vocab_size=1000\); first out of range at token \d+$",
    ):
        open_source("megatron", tmp_path / "big", vocab_size=1000)
    assert open_source("megatron", tmp_path / "big", vocab_size=5000).num_documents == 60
    docs[40][2] = -50
    _write_megatron(tmp_path / "neg", docs, dtype=np.int16)
    with pytest.raises(TokenIndexError, match=r"token ids span \[-50, 4999\], outside the vocabulary \[0, 32768\)"):
        open_source("megatron", tmp_path / "neg")
    cli = ["build", "--data", f"megatron:{tmp_path / 'big'}", "--tokenizer", small_tokenizer.path]
    with pytest.raises(SystemExit) as exit_:  # the CLI: one line, exit 2
        main([*cli, "--cache-dir", str(tmp_path / "cache")])
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and err.count("\n") == 0
    assert f"token ids span [7, 4999], outside the vocabulary [0, {small_tokenizer.vocab_size})" in err


def test_foreign_format_mix_ups_are_refused(tmp_path):
    pytest.importorskip("megatron.core")
    docs = _documents(seed=5)
    flat = np.concatenate(docs)
    # an OLMo uint16 .npy read as uint32 (OLMo's default): ids of two tokens each
    olmo = flat if flat.size % 2 == 0 else np.append(flat, EOS)  # a whole number of uint32 cells
    olmo.astype(np.uint16).tofile(tmp_path / "olmo16.npy")
    with pytest.raises(TokenIndexError, match=r"^olmo source '.*olmo16.npy': token ids span \[\d+, \d+\], outside"):
        open_source("olmo", tmp_path / "olmo16.npy", eos_id=EOS, vocab_size=1000)
    with pytest.raises(TokenIndexError, match=r"token ids up to \d+ .*no vocabulary has that many ids.*dtype"):
        open_source("olmo", tmp_path / "olmo16.npy", eos_id=EOS)  # no vocabulary given: ids past 2^24
    assert open_source("olmo", tmp_path / "olmo16.npy", eos_id=EOS, dtype="uint16").num_tokens == olmo.size
    # a nanoGPT uint32 train.bin read as uint16 (nanoGPT's default)
    np.append(flat, 50256).astype(np.uint32).tofile(tmp_path / "train.bin")
    with pytest.raises(TokenIndexError) as refused:
        open_source("nanogpt", tmp_path / "train.bin")
    assert str(refused.value) == (
        f"nanogpt source {str(tmp_path / 'train.bin')!r}: every token at an odd position (of its first "
        f"{2 * (flat.size + 1):,}) is 0, as when a uint32 file is read as uint16; open it with dtype='uint32'"
    )
    assert open_source("nanogpt", tmp_path / "train.bin", dtype="uint32").num_tokens == flat.size + 1
    # a Megatron .idx of another corpus with the same token total: documents cut at the wrong places
    _write_megatron(tmp_path / "a", docs)
    other = np.split(flat, np.sort(np.random.default_rng(9).choice(np.arange(1, flat.size), 59, replace=False)))
    _write_megatron(tmp_path / "b", other)
    os.replace(tmp_path / "b.idx", tmp_path / "a.idx")
    with pytest.raises(TokenIndexError, match=r"^megatron source '.*a': \d+ of its 60 documents do not end in the EOS"):
        open_source("megatron", tmp_path / "a", eos_id=EOS)


def test_a_source_over_http_without_an_etag_edited_in_place_is_scanned_again(tmp_path, monkeypatch, caplog):
    """Issue 31: a server that sends no ETag (a plain HTTP server: Last-Modified only, to the second) cannot tell an
    edit that keeps the size and mtime; its scan was reused and an id outside the vocabulary was served."""
    from tests.more_servers import range_http_server

    monkeypatch.setenv("DETSAMPLER_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "served" / "train.bin"
    path.parent.mkdir()
    tokens = np.full(4 << 20, 11, dtype=np.uint16)  # 8 MiB: bytes [1114112, 1310720) lie in no sampled block
    tokens[1 << 19 :: 1 << 19] = 50256
    tokens.tofile(path)
    with range_http_server(path.parent) as server:
        url = f"{server}/train.bin"
        assert open_source("nanogpt", url, vocab_size=50257).num_documents == 8
        assert f"{url}: the server sends no strong ETag" in caplog.text
        assert not list((tmp_path / "cache" / "sources").glob("*.npz"))  # nothing cached under an untrusted key
        _keep_mtime_write(path, 1_200_000, np.array([60000], dtype=np.uint16))
        with pytest.raises(TokenIndexError, match=r"token ids span \[11, 60000\], outside the vocabulary \[0, 50257\)"):
            open_source("nanogpt", url, vocab_size=50257)


@pytest.mark.parametrize("damage", ["bit flip", "truncated"])
def test_a_damaged_cached_scan_is_rescanned_with_one_warning_and_replaced(tmp_path, monkeypatch, caplog, damage):
    """Issue 31: a bit-flipped or truncated ``.npz`` scan was a ``zipfile.BadZipFile`` traceback at every later open."""
    monkeypatch.setenv("DETSAMPLER_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "train.bin"
    np.array([11, 12, 50256, 13, 50256] * 100, dtype=np.uint16).tofile(path)
    want = open_source("nanogpt", path).offsets.tolist()
    (cached,) = (tmp_path / "cache" / "sources").glob("*.npz")
    raw = bytearray(cached.read_bytes())
    if damage == "bit flip":
        raw[len(raw) // 2] ^= 0x10
    else:
        raw = raw[: len(raw) // 2]
    cached.write_bytes(bytes(raw))
    caplog.clear()
    assert open_source("nanogpt", path).offsets.tolist() == want
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and warnings[0].startswith(f"detsampler: the cached scan {str(cached)!r} is damaged")
    assert "scanned again" in warnings[0]
    caplog.clear()
    assert open_source("nanogpt", path).offsets.tolist() == want  # the replaced cache reads back, silently
    assert not [r for r in caplog.records if r.levelname == "WARNING"]
    assert [p.name for p in cached.parent.iterdir()] == [cached.name]  # replaced atomically: no temporary left
