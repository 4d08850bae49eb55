"""Side by side with TRL: on the same chat dataset and tokenizer, each example's stored tokens and loss mask equal
TRL's own ``SFTTrainer`` preprocessing (``assistant_only_loss=True`` for messages; prompt/completion data with its
completion-only loss). By design we differ in one place: the index appends its EOS after every example; for messages
it is never trained (TRL appends nothing: the template ends each turn), and being last it changes no trained logit;
for prompt/completion data it is the EOS TRL appends to the completion, trained in both. Packed by ``concat``, the
labels of a sample equal those TRL's padding-free collator makes of the pieces of examples it holds: -100 at each
example's last position, so none predicts the next example's first token."""

from __future__ import annotations

import numpy as np
import pytest

from detsampler.index import build_index
from detsampler.layout import LayoutConfig
from detsampler.loader.dataset import PackedDataset
from detsampler.text.chat import ChatConfig
from tests.chat_data import chat_dataset, hand_rendered, make_chat_tokenizer, prompt_dataset, with_empty_prompts
from tests.tiny_llama import tiny_llama

pytest.importorskip("trl")


def _trl_prepared(dataset, tok_dir, tmp_path, **config):
    """TRL's preprocessed dataset (input_ids and labels per example), from its real SFTTrainer over a tiny Llama."""
    from transformers import PreTrainedTokenizerFast
    from trl import SFTConfig, SFTTrainer

    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(tok_dir))
    model = tiny_llama(len(tokenizer))
    cpu = dict(bf16=False, use_cpu=True)
    args = SFTConfig(output_dir=str(tmp_path / "trl"), report_to=[], max_length=None, **cpu, **config)
    trainer = SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer)
    return trainer.train_dataset


@pytest.mark.parametrize("kind", ["messages", "prompt_completion"])
def test_tokens_and_masks_equal_trl_preprocessing(kind, tmp_path):
    tok = make_chat_tokenizer(tmp_path / "tok")
    if kind == "messages":
        data, config = chat_dataset(24, seed=7), ChatConfig(policy="assistant")
        prepared = _trl_prepared(data, tmp_path / "tok", tmp_path, assistant_only_loss=True)
    else:
        data = prompt_dataset(24, seed=8)
        config = ChatConfig(column="prompt", completion_column="completion", policy="completion")
        prepared = _trl_prepared(data, tmp_path / "tok", tmp_path, completion_only_loss=True)
    index = build_index(data, tok, cache_dir=tmp_path / "cache", progress=False, chat=config)
    assert len(prepared) == index.num_documents
    for d, row in enumerate(prepared):
        ours = index.document_tokens(d).tolist()
        mask = np.asarray(index.loss_mask[index.offsets[d] : index.offsets[d + 1]]).astype(bool).tolist()
        if config.eos_trained:  # TRL's completion ends with the EOS it appends: our virtual EOS, trained
            ours, mask = ours + [index.eos_id], mask + [True]
        assert row["input_ids"] == ours, d
        assert [label != -100 for label in row["labels"]] == mask, d  # TRL's labels: -100 where not trained
        assert any(mask) and not all(mask)


def _pieces(rendered, spans, i: int, seq_len: int) -> list[dict[str, list[int]]]:
    """Sample ``i``'s inputs (its first ``seq_len`` positions) as TRL examples: per span, the piece of the example's
    tokens and its labels (the token where trained, else -100), from the examples rendered by hand."""
    out, col = [], 0
    for d, a, b in spans.sample(i):
        b = min(b, a + seq_len - col)
        if b > a:
            ids, mask = rendered[d]
            out.append({"input_ids": ids[a:b].tolist(), "labels": np.where(mask[a:b], ids[a:b], -100).tolist()})
            col += b - a
    return out


@pytest.mark.parametrize("policy", ["all", "assistant", "completion"])
def test_concat_labels_equal_trl_padding_free_labels_of_the_samples_pieces(policy, tmp_path):
    """Issue 31 item 6, by value: the real ``trl`` ``DataCollatorForLanguageModeling(padding_free=True)`` over the
    pieces of examples a ``concat`` sample holds gives, row for row, the labels of our ``CausalLMCollator`` and
    ``FlatteningCollator`` (transformers' convention: the target of position t at t + 1). Before the fix, under
    ``all`` (and ``completion`` after an empty prompt) ours held the next example's first token where TRL has -100."""
    import torch
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    from detsampler.integrations.hf import CausalLMCollator, FlatteningCollator

    tok = make_chat_tokenizer(tmp_path / "tok")
    if policy == "completion":
        data = with_empty_prompts(prompt_dataset(24, seed=8))
        config = ChatConfig(column="prompt", completion_column="completion", policy=policy)
    else:
        data, config = chat_dataset(24, seed=7), ChatConfig(policy=policy)
    index = build_index(data, tok, cache_dir=tmp_path / "cache", progress=False, chat=config)
    seq_len = 64
    layout = index.layout(LayoutConfig(kind="concat", seq_len=seq_len))
    ids = np.arange(layout.num_samples)
    batch = PackedDataset(index, layout).__getitems__(ids)
    ours, flat = CausalLMCollator()(batch), FlatteningCollator()(batch)
    rendered, spans = hand_rendered(tok, data, config), layout.locate(ids)
    trl = DataCollatorForLanguageModeling(pad_token_id=index.pad_id, padding_free=True)
    for i in ids.tolist():
        theirs = trl(_pieces(rendered, spans, i, seq_len))
        assert torch.equal(ours["input_ids"][i], theirs["input_ids"][0]), i
        assert torch.equal(ours["labels"][i], theirs["labels"][0]), i
    assert torch.equal(flat["labels"][0], ours["labels"].reshape(-1))  # a concat row is one segment of the flat row
