"""Bring your own tokenizer: a Hugging Face tokenizer.json (tokenizers) and a transformers directory (AutoTokenizer),
trained here (nothing downloaded), through the index build, the BOS/EOS policy and the loader, checked against the
tokenizers themselves."""

from __future__ import annotations

import pickle
import shutil

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from detsampler import DeterministicBatchSampler, LayoutConfig, Plan
from detsampler.index import build_index
from detsampler.index.format import TokenIndexError
from detsampler.loader.dataset import PackedDataset, collate_micro_batch
from detsampler.text import SpecialTokens, load_tokenizer
from detsampler.text.hf import HF_BPE_SPECIALS, HFTokenizer, TransformersTokenizer, train_hf_bpe


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory, small_corpus):
    """A 400-token byte-level BPE tokenizer.json (+ tokenizer_config.json) trained on the small corpus."""
    out = tmp_path_factory.mktemp("hf-bpe")
    train_hf_bpe(small_corpus["text"], 400, out)
    return out


@pytest.fixture(scope="module")
def hf_tok(hf_dir):
    return load_tokenizer(hf_dir / "tokenizer.json")


def test_hf_tokenizer_specials_and_encoding_equal_tokenizers_own(hf_dir, hf_tok, small_corpus):
    from tokenizers import Tokenizer as Rust

    rust = Rust.from_file(str(hf_dir / "tokenizer.json"))
    assert isinstance(hf_tok, HFTokenizer)
    assert (hf_tok.eos_id, hf_tok.bos_id, hf_tok.pad_id) == (0, 1, 2)
    assert hf_tok.vocab_size == rust.get_vocab_size(with_added_tokens=True) == 400
    texts = [*small_corpus["text"][:4], "", "héllo wörld\n\ttabs"]
    assert hf_tok.encode_batch(texts) == [rust.encode(t, add_special_tokens=False).ids for t in texts]
    assert hf_tok.decode(hf_tok.encode_batch(["x = 1\n"])[0]) == "x = 1\n"
    clone = pickle.loads(pickle.dumps(hf_tok))
    assert clone.sha256 == hf_tok.sha256 and clone.encode_batch(texts) == hf_tok.encode_batch(texts)


def test_identity_is_the_files_not_the_path(hf_dir, hf_tok, tmp_path):
    moved = tmp_path / "elsewhere"
    shutil.copytree(hf_dir, moved)
    assert load_tokenizer(moved / "tokenizer.json").sha256 == hf_tok.sha256
    (moved / "tokenizer_config.json").write_text(
        (moved / "tokenizer_config.json").read_text().replace("<|pad|>", "<|endoftext|>")
    )
    assert load_tokenizer(moved / "tokenizer.json").sha256 != hf_tok.sha256  # the config names the specials: part of it


def test_hf_tokenizer_errors(tmp_path, hf_dir):
    with pytest.raises(ValueError, match=r"no tokenizer\.json"):
        load_tokenizer(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ValueError, match=r"not a Hugging Face tokenizer\.json"):
        load_tokenizer(tmp_path / "bad.json")
    with pytest.raises(ValueError, match="has no token '<nope>'"):
        HFTokenizer.load(hf_dir / "tokenizer.json", eos_token="<nope>")


def test_transformers_directory_equals_autotokenizer(hf_dir, hf_tok, small_corpus):
    transformers = pytest.importorskip("transformers")
    tok = load_tokenizer(hf_dir)
    auto = transformers.AutoTokenizer.from_pretrained(str(hf_dir), local_files_only=True)
    assert isinstance(tok, TransformersTokenizer)
    assert (
        (tok.eos_id, tok.bos_id, tok.pad_id) == (auto.eos_token_id, auto.bos_token_id, auto.pad_token_id) == (0, 1, 2)
    )
    texts = small_corpus["text"][:3]
    assert tok.encode_batch(texts) == [auto(t, add_special_tokens=False)["input_ids"] for t in texts]
    assert tok.encode_batch(texts) == hf_tok.encode_batch(texts)
    assert pickle.loads(pickle.dumps(tok)).encode_batch(texts) == tok.encode_batch(texts)


@pytest.mark.parametrize(
    "policy",
    [
        SpecialTokens(),
        SpecialTokens(add_bos=True),
        SpecialTokens(add_eos="real"),
        SpecialTokens(add_bos=True, add_eos="real"),
    ],
)
def test_policy_documents_equal_tokenizer_plus_specials(policy, hf_dir, hf_tok, small_corpus, tmp_path):
    """Each document read back (index, then loader) is exactly tokenizer(text) plus the policy's BOS and EOS, against
    tokenizers' own encoder."""
    from tokenizers import Tokenizer as Rust

    rust = Rust.from_file(str(hf_dir / "tokenizer.json"))
    index = build_index(small_corpus, hf_tok, cache_dir=tmp_path, progress=False, special_tokens=policy)
    assert index.special_tokens == policy and index.meta["special_tokens"] == policy.to_meta()
    expected = []
    for text in small_corpus["text"]:
        doc = [1] * policy.add_bos + rust.encode(text, add_special_tokens=False).ids + [0]  # the EOS, real or virtual
        expected.append(doc)
        stored = doc if policy.eos_stored else doc[:-1]
        assert index.document_tokens(len(expected) - 1).tolist() == stored
    seq_len = int(index.lengths.max()) + 1
    layout = index.layout(LayoutConfig(kind="document", seq_len=seq_len))
    ds = PackedDataset(index, layout)
    got = {}
    for sample in range(len(ds)):
        item = ds[sample]
        d = int(item["document_ids"][0])
        got[d] = item["input_ids"][item["document_ids"] == d].tolist()
    assert [got[d] for d in range(len(expected))] == expected


def test_policy_is_in_the_fingerprint_and_checked(hf_tok, small_tokenizer, small_corpus, tmp_path):
    plain = build_index(small_corpus, hf_tok, cache_dir=tmp_path, progress=False)
    bos = build_index(
        small_corpus, hf_tok, cache_dir=tmp_path, progress=False, special_tokens=SpecialTokens(add_bos=True)
    )
    real = build_index(
        small_corpus, hf_tok, cache_dir=tmp_path, progress=False, special_tokens=SpecialTokens(add_eos="real")
    )
    assert len({plain.fingerprint, bos.fingerprint, real.fingerprint}) == 3
    assert real.num_tokens == plain.num_tokens + plain.num_documents and np.array_equal(real.lengths, plain.lengths)
    with pytest.raises(ValueError, match="add_eos must be one of virtual, real"):
        SpecialTokens(add_eos="maybe")
    no_bos = type("NoBos", (), {"bos_id": None, "path": "x"})()
    with pytest.raises(ValueError, match="has no BOS token"):
        SpecialTokens(add_bos=True).check(no_bos)
    with pytest.raises(TokenIndexError, match="tokenizer changed"):
        PackedDataset(plain, plain.layout(LayoutConfig(kind="concat", seq_len=64)), tokenizer=small_tokenizer)


def test_build_refuses_what_is_not_a_tokenizer(small_corpus, tmp_path):
    with pytest.raises(ValueError, match="tokenizer must be a TokenizerLike"):
        build_index(small_corpus, object(), cache_dir=tmp_path, progress=False)


@pytest.mark.parametrize("policy", [SpecialTokens(add_bos=True, add_eos="real"), SpecialTokens()])
def test_on_the_fly_equals_stored_through_a_dataloader(policy, hf_tok, small_corpus, tmp_path):
    stored = build_index(small_corpus, hf_tok, cache_dir=tmp_path, progress=False, special_tokens=policy)
    counts = build_index(
        small_corpus, hf_tok, cache_dir=tmp_path, progress=False, special_tokens=policy, store_tokens=False
    )
    config = LayoutConfig(kind="concat", seq_len=256)
    plan = Plan(stored.layout(config).num_samples, seed=3, global_batch_size=4, micro_batch_size=4)
    batches = []
    for index, kwargs in ((stored, {}), (counts, {"dataset": small_corpus, "tokenizer": hf_tok, "cache_tokens": 2000})):
        ds = PackedDataset(index, index.layout(config), **kwargs)
        loader = DataLoader(
            ds,
            batch_sampler=DeterministicBatchSampler(plan, rank=0, stop_step=6),
            num_workers=1,
            collate_fn=collate_micro_batch,
        )
        batches.append([b["input_ids"] for b in loader])
    assert all(torch.equal(a, b) for a, b in zip(*batches)) and len(batches[0]) == 6


def test_train_hf_bpe_is_deterministic(tmp_path, small_corpus):
    a = train_hf_bpe(small_corpus["text"][:4], 300, tmp_path / "a")
    b = train_hf_bpe(small_corpus["text"][:4], 300, tmp_path / "b")
    assert a.sha256 == b.sha256 and a.specials == {k: v for k, v in HF_BPE_SPECIALS.items()}


@given(
    docs=st.lists(st.lists(st.integers(3, 60_000), max_size=6), max_size=8),
    add_bos=st.booleans(),
    add_eos=st.sampled_from(["virtual", "real"]),
)
def test_policy_apply_equals_the_naive_concatenation(docs, add_bos, add_eos):
    policy = SpecialTokens(add_bos=add_bos, add_eos=add_eos)
    lengths, stored = policy.apply(docs, 1, 2, np.uint16)
    naive = [[1] * add_bos + d + [2] * policy.eos_stored for d in docs]
    assert lengths.tolist() == [len(d) + add_bos for d in docs]
    assert stored.dtype == np.uint16 and stored.tolist() == [t for d in naive for t in d]
