"""PackedDataset(output="tokens"): a concat micro batch as one ``[B, seq_len + 1]`` block of token ids in the index's
stored dtype, exactly the four-field output's inputs and labels, through every read path."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from detsampler.index import build_index
from detsampler.layout import LayoutConfig
from detsampler.loader.dataset import PackedDataset, collate_micro_batch
from detsampler.loader.sampler import DeterministicBatchSampler
from detsampler.plan import Plan


@pytest.fixture(scope="module")
def lean_index(tmp_path_factory, small_corpus, small_tokenizer):
    return build_index(
        small_corpus, small_tokenizer, cache_dir=tmp_path_factory.mktemp("lean"), store_tokens=False, progress=False
    )


def _pair(index, config, **kwargs):
    layout = index.layout(config)
    return PackedDataset(index, layout, **kwargs), PackedDataset(index, layout, output="tokens", **kwargs)


@pytest.mark.parametrize(("seq_len", "seed"), [(64, 0), (257, 3), (4096, 1)])
def test_tokens_are_the_fields_inputs_then_the_last_label(small_index, seq_len, seed):
    fields, tokens = _pair(small_index, LayoutConfig(kind="concat", seq_len=seq_len, seed=seed))
    ids = np.random.default_rng(seed).integers(0, len(fields), 37)
    want, got = fields.get_batch(ids), tokens.get_batch(ids)
    assert list(got) == ["tokens"]
    block = got["tokens"]
    assert block.shape == (37, seq_len + 1) and block.dtype == torch.uint16  # the index stores uint16 (512 pieces)
    assert torch.equal(block[:, :-1].long(), want["input_ids"])
    assert torch.equal(block[:, 1:].long(), want["labels"])
    single = tokens[int(ids[5])]
    assert torch.equal(single["tokens"], block[5])


def test_tokens_on_the_fly_equal_the_stored_ones(small_index, lean_index, small_corpus, small_tokenizer):
    config = LayoutConfig(kind="concat", seq_len=96, seed=5)
    stored = PackedDataset(small_index, small_index.layout(config), output="tokens")
    fly = PackedDataset(
        lean_index, lean_index.layout(config), dataset=small_corpus, tokenizer=small_tokenizer, output="tokens"
    )
    ids = np.random.default_rng(1).integers(0, len(stored), 64)
    a, b = stored.get_batch(ids)["tokens"], fly.get_batch(ids)["tokens"]
    assert a.dtype == b.dtype == torch.uint16
    assert torch.equal(a, b)


def test_tokens_through_workers_and_a_pickle_are_the_same(small_index):
    fields, tokens = _pair(small_index, LayoutConfig(kind="concat", seq_len=48, seed=2))
    plan = Plan(len(tokens), seed=7, global_batch_size=12, micro_batch_size=3, world_size=2)
    sampler = DeterministicBatchSampler(plan, rank=1, stop_step=4)
    loader = DataLoader(tokens, batch_sampler=sampler, num_workers=2, collate_fn=collate_micro_batch)
    got = [batch for _, micro_batches in sampler.steps(loader) for batch in micro_batches]
    want = [fields.get_batch(plan.micro_batch(s, m, 1)) for s in range(4) for m in range(plan.num_micro_steps(s))]
    assert len(got) == len(want) == 8
    for g, w in zip(got, want):
        assert torch.equal(g["tokens"][:, :-1].long(), w["input_ids"])
        assert torch.equal(g["tokens"][:, 1:].long(), w["labels"])
    clone = pickle.loads(pickle.dumps(tokens))
    assert clone.output == "tokens" and torch.equal(
        clone.get_batch([3, 0])["tokens"], tokens.get_batch([3, 0])["tokens"]
    )


@pytest.mark.parametrize("kind", ["document", "bestfit"])
def test_tokens_output_is_refused_where_labels_stop_at_documents(small_index, kind):
    layout = small_index.layout(LayoutConfig(kind=kind, seq_len=64, window_docs=4))
    with pytest.raises(ValueError, match=f"output='tokens' needs a concat layout.*{kind}"):
        PackedDataset(small_index, layout, output="tokens")


def test_an_unknown_output_is_refused(small_index):
    layout = small_index.layout(LayoutConfig(kind="concat", seq_len=64))
    with pytest.raises(ValueError, match="output must be 'fields' or 'tokens', got 'ids'"):
        PackedDataset(small_index, layout, output="ids")
