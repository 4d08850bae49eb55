"""Issue 23.2 and 23.4: packed SFT examples without cross-contamination. The boundaries of a packed micro batch
(``cu_seqlens``, ``max_seqlen``), the padding-free row of :class:`FlatteningCollator` equal, key by key, to what
``transformers.DataCollatorWithFlattening`` and TRL's padding-free ``DataCollatorForLanguageModeling`` return for the
same examples, and a tiny Llama's loss: equal on the padded packed batch and on the flattened one, different on a
batch whose position ids do not restart (the examples would attend to each other)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
trl_sft = pytest.importorskip("trl.trainer.sft_trainer")

import datasets  # noqa: E402
from transformers import DataCollatorWithFlattening, LlamaForCausalLM  # noqa: E402
from trl.data_utils import pack_dataset  # noqa: E402

from detsampler import LayoutConfig, PackedDataset  # noqa: E402
from detsampler.boundaries import sequence_boundaries  # noqa: E402
from detsampler.index import build_index  # noqa: E402
from detsampler.integrations.hf import CausalLMCollator, FlatteningCollator  # noqa: E402
from detsampler.layout import make_layout  # noqa: E402
from tests.tiny_llama import tiny_llama  # noqa: E402

SEQ_LEN = 64
PROMPT = 5  # positions of each example whose label does not count, in the loss-mask tests


@pytest.fixture(scope="module")
def sft_index(cache_root, small_corpus, small_tokenizer):
    """Short examples (the paragraphs of the standard-library sources of ``small_corpus``), of 1 to a few hundred
    tokens, some longer than SEQ_LEN."""
    paragraphs = [p for text in small_corpus["text"] for p in text.split("\n\n") if p.strip()][:600]
    return build_index(
        datasets.Dataset.from_dict({"text": paragraphs}), small_tokenizer, cache_dir=cache_root, progress=False
    )


def packed(index, overlong: str = "truncate", **kwargs) -> PackedDataset:
    config = LayoutConfig(kind="bestfit", seq_len=SEQ_LEN, seed=5, window_docs=256, overlong=overlong)
    return PackedDataset(index, make_layout(config, index.lengths), **kwargs)


def examples(ds: PackedDataset, ids: list[int]) -> list[list[int]]:
    """The token ids of every span of samples ``ids``, in order, read from the index (not from the batch): each a
    document's tokens and its EOS, cut to the span."""
    spans = ds.layout.locate(np.asarray(ids))
    out = []
    for d, a, b in zip(spans.doc_ids.tolist(), spans.starts.tolist(), spans.stops.tolist()):
        out.append([*ds.index.document_tokens(d).tolist(), ds.index.eos_id][a:b])
    return out


def with_prompt_masked(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``batch`` with a ``loss_mask`` as the chat data gives it: the labels of each example's first PROMPT positions
    do not count (its prompt), and ``labels`` -100 there."""
    mask = (batch["position_ids"] >= PROMPT) & (batch["document_ids"] >= 0)
    return {**batch, "loss_mask": mask, "labels": torch.where(mask, batch["labels"], -100)}


def prompt_masked_labels(tokens: list[int]) -> list[int]:
    """transformers' labels of one example whose first PROMPT positions' targets do not count: the target of position
    ``t`` sits at ``t + 1``, so labels ``0 .. PROMPT`` are -100."""
    return [-100] * min(PROMPT + 1, len(tokens)) + tokens[PROMPT + 1 :]


def peaked_llama(vocab_size: int) -> LlamaForCausalLM:
    """Peaked attention (large initial weights): what a token attends to shows in the loss."""
    return tiny_llama(
        vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        seed=0,
        max_position_embeddings=SEQ_LEN,
        attn_implementation="sdpa",
        initializer_range=0.5,
    ).eval()


def loss(model, batch: dict) -> float:
    with torch.no_grad():
        return model(**{"use_cache": False, **batch}).loss.item()


def some_ids(ds: PackedDataset) -> list[int]:
    """A bin holding one truncated example, and four holding three or more examples (the last one padded)."""
    spans = ds.layout.locate(np.arange(len(ds)))
    multi = np.flatnonzero(np.diff(spans.offsets) >= 3)
    ids = [0, *multi[[0, 2, 4, -1]].tolist()]
    assert spans.num_tokens[ids[-1]] < SEQ_LEN and np.diff(spans.offsets)[0] == 1
    return ids


def test_cu_seqlens_tile_the_padded_batch_span_by_span(sft_index):
    ds = packed(sft_index)
    ids = some_ids(ds)
    b = ds.get_batch(ids)
    cu, longest = sequence_boundaries(b["position_ids"].numpy(), b["document_ids"].numpy())
    spans = ds.layout.locate(np.asarray(ids))
    want = []
    for i in range(len(ids)):
        lengths = (spans.stops - spans.starts)[spans.offsets[i] : spans.offsets[i + 1]].tolist()
        want += lengths + ([SEQ_LEN - sum(lengths)] if sum(lengths) < SEQ_LEN else [])  # a row's padding: one segment
    assert cu.dtype == np.int32 and cu.tolist() == np.cumsum([0, *want]).tolist()
    assert cu[-1] == len(ids) * SEQ_LEN and longest == max(want)
    # labels: -100 at each span's last position and on padding, so no target crosses a boundary
    flat_labels = b["labels"].reshape(-1).numpy()
    assert (flat_labels[cu[1:] - 1] == -100).all()


@pytest.mark.parametrize("mask", [False, True], ids=["all", "loss_mask"])
def test_flattening_equals_transformers_collator_key_by_key(sft_index, mask):
    ds = packed(sft_index)
    ids = some_ids(ds)
    batch = ds.get_batch(ids)
    batch = with_prompt_masked(batch) if mask else batch
    ours = FlatteningCollator(return_flash_attn_kwargs=True, return_seq_idx=True)(batch)
    spans = examples(ds, ids)
    features = [{"input_ids": t, **({"labels": prompt_masked_labels(t)} if mask else {})} for t in spans]
    theirs = DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_seq_idx=True)(features)
    assert sorted(ours) == sorted(theirs)
    for key, value in theirs.items():
        if isinstance(value, torch.Tensor):
            assert ours[key].dtype == value.dtype and torch.equal(ours[key], value), key
        else:
            assert ours[key] == value, key
    assert ours["input_ids"].shape[1] == sum(map(len, spans)) < len(ids) * SEQ_LEN  # the padding left out
    default = FlatteningCollator()(batch)  # transformers' default keys
    assert sorted(default) == sorted(DataCollatorWithFlattening()(features))


@pytest.mark.parametrize("mask", [False, True], ids=["all", "loss_mask"])
def test_flattening_equals_trl_padding_free_collator(sft_index, mask):
    ds = packed(sft_index)
    ids = some_ids(ds)
    batch = ds.get_batch(ids)
    batch = with_prompt_masked(batch) if mask else batch
    ours = FlatteningCollator(return_flash_attn_kwargs=True, return_seq_idx=True)(batch)
    features = [{"input_ids": t, **({"labels": prompt_masked_labels(t)} if mask else {})} for t in examples(ds, ids)]
    theirs = trl_sft.DataCollatorForLanguageModeling(pad_token_id=sft_index.pad_id, padding_free=True)(features)
    assert sorted(ours) == sorted(theirs)
    for key, value in theirs.items():
        assert torch.equal(ours[key], value) if isinstance(value, torch.Tensor) else ours[key] == value, key


@pytest.mark.parametrize("mask", [False, True], ids=["all", "loss_mask"])
def test_a_tiny_llama_gives_the_same_loss_packed_and_flattened_and_another_when_contaminated(sft_index, mask):
    ds = packed(sft_index)
    ids = some_ids(ds)
    model = peaked_llama(sft_index.vocab_size)
    batch = ds.get_batch(ids)
    contaminated = packed(sft_index, restart_position_ids=False).get_batch(ids)  # positions 0..L-1 over each row
    if mask:
        batch = with_prompt_masked(batch)
        contaminated = {**contaminated, "labels": batch["labels"]}
    padded = loss(model, CausalLMCollator()(batch))
    flat = loss(model, FlatteningCollator()(batch))
    assert flat == pytest.approx(padded, rel=1e-5, abs=1e-6)
    each = [loss(model, FlatteningCollator()({k: v[i : i + 1] for k, v in batch.items()})) for i in range(len(ids))]
    assert min(each) < padded < max(each)  # a mean over the rows' targets, not a copy of one row
    crossed = loss(model, CausalLMCollator()(contaminated))
    assert abs(crossed - padded) > 1e-2


def test_trl_packing_and_padding_free_give_our_loss_on_the_same_examples(sft_index):
    """TRL's own path: its best-fit-decreasing ``pack_dataset`` over the examples of our micro batch, then its
    padding-free collator: the same examples, packed in another order, give our loss."""
    ds = packed(sft_index)
    ids = some_ids(ds)
    model = peaked_llama(sft_index.vocab_size)
    rows = pack_dataset(
        datasets.Dataset.from_dict({"input_ids": examples(ds, ids)}), seq_length=SEQ_LEN, strategy="bfd"
    )
    assert sum(map(len, rows["input_ids"])) == sum(map(len, examples(ds, ids)))  # nothing truncated: spans fit
    trl_batch = trl_sft.DataCollatorForLanguageModeling(pad_token_id=sft_index.pad_id, padding_free=True)(list(rows))
    ours = FlatteningCollator()(ds.get_batch(ids))
    assert sorted(trl_batch["input_ids"][0].tolist()) == sorted(ours["input_ids"][0].tolist())
    assert loss(model, trl_batch) == pytest.approx(loss(model, ours), rel=1e-5, abs=1e-6)


def test_flattening_refuses_token_ids_alone(sft_index):
    concat = LayoutConfig(kind="concat", seq_len=SEQ_LEN)
    ds = PackedDataset(sft_index, make_layout(concat, sft_index.lengths), output="tokens")
    with pytest.raises(ValueError, match="FlatteningCollator needs the four fields"):
        FlatteningCollator()(ds.get_batch([0, 1]))


@pytest.mark.parametrize(("overlong", "strategy"), [("truncate", "bfd"), ("split", "bfd_split")])
def test_our_best_fit_packs_as_tightly_as_trls_on_the_same_examples(sft_index, overlong, strategy):
    """Both are best-fit decreasing over a group of examples (our window of ``window_docs`` examples, TRL's
    ``datasets.map`` batch of 1,000): on one group holding every example they need the same number of bins, and hold the
    same tokens (TRL's "bfd" truncates an over-long example, "bfd_split" splits it, as our policies do)."""
    lengths = np.asarray(sft_index.lengths)
    config = LayoutConfig(kind="bestfit", seq_len=SEQ_LEN, seed=5, window_docs=1000, overlong=overlong)
    layout = make_layout(config, lengths)
    rows = [[*sft_index.document_tokens(d).tolist(), sft_index.eos_id] for d in range(len(lengths))]
    theirs = pack_dataset(datasets.Dataset.from_dict({"input_ids": rows}), seq_length=SEQ_LEN, strategy=strategy)
    their_tokens = sum(map(len, theirs["input_ids"]))
    assert layout.tokens_per_epoch == their_tokens and layout.num_samples == len(theirs)
    efficiency = layout.tokens_per_epoch / (layout.num_samples * SEQ_LEN)
    assert efficiency == their_tokens / (len(theirs) * SEQ_LEN) > 0.99


def sft_step(tmp_path, ds: PackedDataset, collator, plan) -> tuple[float, list[int]]:
    """One SFTTrainer step (2 micro batches of 2 samples) with the mixin and ``collator``: the logged loss and each
    micro step's ``num_items_in_batch``."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast
    from trl import SFTConfig, SFTTrainer

    from detsampler.integrations.hf import DetsamplerTrainerMixin, sample_id_dataset

    class DetsamplerSFTTrainer(DetsamplerTrainerMixin, SFTTrainer):
        def training_step(self, model, inputs, num_items_in_batch=None):
            self.items.append(int(num_items_in_batch))
            return super().training_step(model, inputs, num_items_in_batch)

    tokenizer = PreTrainedTokenizerFast(  # SFTTrainer wants one; the batches are token ids already
        tokenizer_object=Tokenizer(WordLevel({"<pad>": 0}, unk_token="<pad>")), pad_token="<pad>", eos_token="<pad>"
    )
    args = SFTConfig(
        output_dir=str(tmp_path),
        max_steps=1,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        dataset_kwargs={"skip_prepare_dataset": True},
    )
    model = peaked_llama(ds.index.vocab_size).train()
    run = DetsamplerSFTTrainer(
        model=model,
        args=args,
        train_dataset=sample_id_dataset(ds),
        data_collator=collator,
        processing_class=tokenizer,
        plan=plan,
    )
    run.items = []
    run.train()
    return run.state.log_history[0]["loss"], run.items


def test_sfttrainer_with_the_flattening_collator_trains_the_padded_steps_loss(sft_index, tmp_path):
    from detsampler import Plan
    from detsampler.integrations.hf import causal_lm_collator

    ds = packed(sft_index)
    plan = Plan(len(ds), seed=4, global_batch_size=4, micro_batch_size=2)
    flat_loss, flat_items = sft_step(tmp_path / "flat", ds, FlatteningCollator(reader=ds), plan)
    padded_loss, padded_items = sft_step(tmp_path / "padded", ds, causal_lm_collator(ds), plan)
    targets = [int((ds.get_batch(plan.micro_batch(0, a, 0).tolist())["labels"] != -100).sum()) for a in range(2)]
    assert flat_items == padded_items == [sum(targets)] * 2  # every real target of the step, in both forms
    assert flat_loss == pytest.approx(padded_loss, rel=1e-5)


def test_the_padded_collator_hands_the_boundaries_of_the_flattened_batch(sft_index):
    """``CausalLMCollator(flash_attn_kwargs=True)``: the ``[B, seq_len]`` batch's boundaries over ``B * seq_len``, as
    transformers' flash path reads them (it reshapes the batch to one row); sdpa takes and ignores them."""
    ds = packed(sft_index)
    ids = some_ids(ds)
    batch = ds.get_batch(ids)
    padded = CausalLMCollator(flash_attn_kwargs=True)(batch)
    cu, longest = sequence_boundaries(batch["position_ids"].numpy(), batch["document_ids"].numpy())
    assert padded["cu_seq_lens_q"].dtype == torch.int32 and padded["cu_seq_lens_q"].tolist() == cu.tolist()
    assert (
        torch.equal(padded["cu_seq_lens_k"], padded["cu_seq_lens_q"])
        and padded["cu_seq_lens_q"][-1] == batch["input_ids"].numel()
    )
    assert padded["max_length_q"] == padded["max_length_k"] == longest
    # the segments are the flat row's examples, each row's padding a segment of its own
    flat = FlatteningCollator(return_flash_attn_kwargs=True)(batch)
    lengths = padded["cu_seq_lens_q"].diff()
    pad = [int((row < 0).sum()) for row in batch["document_ids"]]
    assert sorted(lengths.tolist()) == sorted(flat["cu_seq_lens_q"].diff().tolist() + [p for p in pad if p])
    model = peaked_llama(sft_index.vocab_size)
    assert loss(model, padded) == pytest.approx(loss(model, CausalLMCollator()(batch)), rel=1e-6)
    concat = PackedDataset(sft_index, make_layout(LayoutConfig(kind="concat", seq_len=SEQ_LEN), sft_index.lengths))
    rows = CausalLMCollator(flash_attn_kwargs=True)(
        PackedDataset(concat.index, concat.layout, output="tokens").get_batch([0, 1])
    )
    assert rows["cu_seq_lens_q"].tolist() == [0, SEQ_LEN, 2 * SEQ_LEN]  # concat: a row is one sequence


def test_both_collators_honour_a_loss_mask_whose_labels_were_left_unmasked(sft_index):
    ds = packed(sft_index)
    batch = ds.get_batch(some_ids(ds))
    masked = with_prompt_masked(batch)
    mask_only = {**batch, "loss_mask": masked["loss_mask"]}  # the labels as the layout gives them
    for collator in (CausalLMCollator(), FlatteningCollator(return_flash_attn_kwargs=True)):
        want, got = collator(masked), collator(mask_only)
        assert sorted(want) == sorted(got)
        for key, value in want.items():
            assert torch.equal(got[key], value) if isinstance(value, torch.Tensor) else got[key] == value, key
    assert int((CausalLMCollator()(mask_only)["shift_labels"] != -100).sum()) < int((batch["labels"] != -100).sum())
