"""Side by side with TRL: on the same chat dataset and tokenizer, each example's stored tokens and loss mask equal
TRL's own ``SFTTrainer`` preprocessing (``assistant_only_loss=True`` for messages; prompt/completion data with its
completion-only loss). By design we differ in one place: the index appends its EOS after every example; for messages
it is never trained (TRL appends nothing: the template ends each turn), and being last it changes no trained logit;
for prompt/completion data it is the EOS TRL appends to the completion, trained in both."""

from __future__ import annotations

import numpy as np
import pytest

from detsampler.index import build_index
from detsampler.text.chat import ChatConfig
from tests.chat_data import chat_dataset, make_chat_tokenizer, prompt_dataset
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
