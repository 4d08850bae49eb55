"""The trainer's data config takes a tokenizer.json, the BOS/EOS policy and pre-tokenized sources
(``data.tokenizer = "path/tokenizer.json"``, ``data.source = {kind = "megatron", path = ...}``), alone and mixed."""

from __future__ import annotations

import json
import re
import warnings

import numpy as np
import pytest
import torch

from train.config import load_config
from train.data import build_pipeline


@pytest.fixture(scope="module")
def hf_tokenizer(tmp_path_factory, small_corpus):
    from detsampler.text.hf import train_hf_bpe

    return train_hf_bpe(small_corpus["text"], 400, tmp_path_factory.mktemp("tok"))


@pytest.fixture(scope="module")
def megatron_prefix(tmp_path_factory, hf_tokenizer, small_corpus):
    pytest.importorskip("megatron.core")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
    prefix = str(tmp_path_factory.mktemp("megatron") / "corpus_text_document")
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
    for ids in hf_tokenizer.encode_batch(small_corpus["text"][:8]):
        builder.add_item(torch.tensor([*ids, hf_tokenizer.eos_id]))
        builder.end_document()
    builder.finalize(prefix + ".idx")
    return prefix


def _config(tmp_path, lines: str):
    path = tmp_path / "c.toml"
    path.write_text(
        f'[data]\nseq_len = 32\nglobal_batch_size = 4\nmicro_batch_size = 4\ncache_dir = "{tmp_path}"\n{lines}'
    )
    return load_config(path)


def test_megatron_source_table_with_tokenizer_json(tmp_path, megatron_prefix, hf_tokenizer):
    from detsampler.index.sources import open_source

    cfg = _config(
        tmp_path, f'source = {{kind = "megatron", path = "{megatron_prefix}"}}\ntokenizer = "{hf_tokenizer.path}"\n'
    )
    assert cfg.data.source == f"megatron:{megatron_prefix}"
    pipe = build_pipeline(cfg.data, world_size=1)
    source = open_source("megatron", megatron_prefix)
    assert (
        pipe.vocab_size == hf_tokenizer.vocab_size
        and pipe.index.fingerprint == open_source("megatron", megatron_prefix, tokenizer=hf_tokenizer).fingerprint
    )
    batch = next(iter(pipe.loader(pipe.sampler(0, 0, 1), pin_memory=False, persistent_workers=False)))
    stream = np.concatenate([source.document_tokens(d) for d in pipe.layout.order])
    for row, sample in zip(batch["input_ids"], pipe.plan.micro_batch(0, 0, 0)):
        assert row.tolist() == stream[sample * 32 : sample * 32 + 32].tolist()


def test_text_with_tokenizer_json_and_bos_in_a_mixture_with_megatron(
    tmp_path, megatron_prefix, hf_tokenizer, small_corpus
):
    text = tmp_path / "text.jsonl"
    text.write_text("".join(json.dumps({"text": t}) + "\n" for t in small_corpus["text"][8:12]))
    cfg = _config(
        tmp_path,
        f'mixture_sources = [{{kind = "megatron", path = "{megatron_prefix}"}}, "{text}"]\n'
        f'mixture_weights = [1, 1]\ntokenizer = "{hf_tokenizer.path}"\n',
    )
    pipe = build_pipeline(cfg.data, world_size=1)
    assert [index.__class__.__name__ for index, _ in pipe.sources] == ["TokenSource", "TokenIndex"]
    batch = next(iter(pipe.loader(pipe.sampler(0, 0, 1), pin_memory=False, persistent_workers=False)))
    assert batch["input_ids"].shape == (4, 32) and int(batch["input_ids"].max()) < hf_tokenizer.vocab_size
    with pytest.raises(ValueError, match="add_eos must be virtual, real or empty"):
        _config(tmp_path, 'add_eos = "sometimes"\n')
    bos = build_pipeline(
        _config(
            tmp_path, f'source = "{text}"\ntokenizer = "{hf_tokenizer.path}"\nadd_bos = true\nlayout = "document"\n'
        ).data,
        world_size=1,
    )
    assert bos.index.special_tokens.add_bos and bos.index.document_tokens(0)[0] == hf_tokenizer.bos_id


def test_the_trainer_refuses_ids_outside_the_vocabulary_and_a_source_without_its_tokenizer(tmp_path, hf_tokenizer):
    """Before: ids up to 4999 under a 400-id tokenizer were trained on (or crashed each rank with an IndexError)."""
    pytest.importorskip("megatron.core")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
    prefix = str(tmp_path / "wide")
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
    for d in range(8):
        builder.add_item(torch.tensor([5] * 18 + [4999 if d == 3 else 6, hf_tokenizer.eos_id]))
        builder.end_document()
    builder.finalize(prefix + ".idx")
    table = f'source = {{kind = "megatron", path = "{prefix}"}}\n'
    cfg = _config(tmp_path, table + f'tokenizer = "{hf_tokenizer.path}"\n')
    lo, vocab = min(5, hf_tokenizer.eos_id), hf_tokenizer.vocab_size
    span = f"token ids span [{lo}, 4999], outside the vocabulary [0, {vocab})"
    with pytest.raises(ValueError, match=f"^megatron source '.*wide': {re.escape(span)}"):
        build_pipeline(cfg.data, world_size=1)
    with pytest.raises(ValueError, match="record no tokenizer, so their EOS and pad ids would be unknown"):
        build_pipeline(_config(tmp_path, table).data, world_size=1)
