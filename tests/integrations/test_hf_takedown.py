"""TRL's ``SFTTrainer`` and transformers' ``Trainer`` with the mixin, on a chat index, as an SFT team sets them up
(issue 32): ``SFTConfig``'s defaults (``remove_unused_columns=True``, the dataset prepared by TRL), a collator wrapped
in a function with ``reader=``, the logged epoch; then redactions applied through both collators before
``num_items_in_batch`` is counted, recorded in the checkpoint, and a resume that drops one refused."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

trl = pytest.importorskip("trl")
pytest.importorskip("accelerate")

from transformers import AutoTokenizer  # noqa: E402

from detsampler import LayoutConfig, PackedDataset, Plan  # noqa: E402
from detsampler.cli import main  # noqa: E402
from detsampler.index.prepare import IndexConfig, prepare_index  # noqa: E402
from detsampler.integrations.hf import (  # noqa: E402
    DetsamplerTrainerMixin,
    FlatteningCollator,
    causal_lm_collator,
    sample_id_dataset,
)
from detsampler.loader.dataset import MicroBatch  # noqa: E402
from detsampler.record import DataRecord  # noqa: E402
from detsampler.redaction import Redaction  # noqa: E402
from tests.chat_data import conversations, make_chat_tokenizer  # noqa: E402
from tests.tiny_llama import tiny_llama  # noqa: E402

SEQ_LEN = 128


@pytest.fixture(scope="module")
def chat(tmp_path_factory):
    """A chat index (assistant-only loss) over 40 conversations with a ``conversation_id``, its tokenizer and data."""
    root = tmp_path_factory.mktemp("hf-takedown")
    make_chat_tokenizer(root / "tok")
    rows = [{"conversation_id": f"c-{100 + i}", "messages": m} for i, m in enumerate(conversations(40, seed=4))]
    with open(root / "chat.jsonl", "w") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)
    config = IndexConfig(
        data=str(root / "chat.jsonl"),
        text_column="messages",
        tokenizer=str(root / "tok"),
        cache_dir=str(root / "cache"),
        loss_policy="assistant",
    )
    prepared = prepare_index(config)
    layout = prepared.index.layout(LayoutConfig(kind="bestfit", seq_len=SEQ_LEN))
    return root, prepared, PackedDataset(prepared.index, layout)


class Recording(DetsamplerTrainerMixin, trl.SFTTrainer):
    """Records every micro batch the model is given, and the ``num_items_in_batch`` it is scaled by."""

    def training_step(self, model, inputs, num_items_in_batch=None):
        self.seen.append((self.state.global_step, {k: v.clone() for k, v in inputs.items() if torch.is_tensor(v)}))
        self.counts.append(int(num_items_in_batch))
        return super().training_step(model, inputs, num_items_in_batch)


def sft(root, ds, plan, out, *, collator=None, max_steps=4, **kwargs):
    model = tiny_llama(ds.index.vocab_size, seed=0, max_position_embeddings=SEQ_LEN)
    settings = dict(
        output_dir=str(out),
        max_steps=max_steps,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        logging_steps=1,
        save_steps=2,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
    )
    run = Recording(
        model=model,
        args=trl.SFTConfig(**settings),  # TRL's defaults otherwise: remove_unused_columns=True, the dataset prepared
        train_dataset=sample_id_dataset(ds),
        data_collator=collator or causal_lm_collator(ds, model),
        processing_class=AutoTokenizer.from_pretrained(str(root / "tok")),
        plan=plan,
        **kwargs,
    )
    run.seen, run.counts = [], []
    return run


def expected(ds, plan, step: int, micro_step: int) -> dict:
    return ds.get_batch(plan.micro_batch(step, micro_step, 0))


def test_sft_trainer_with_its_defaults_and_a_wrapped_collator_reads_the_plan(chat, tmp_path):
    """Was: TRL tokenized the rows of sample ids (``KeyError: 'text'``); with preparation skipped, its
    ``remove_unused_columns=True`` stripped ``sample_id`` from the rows a wrapped collator got (``KeyError:
    'input_ids'``), and the mixin found the data only through the collator's undocumented ``.reader``."""
    root, _, ds = chat
    plan = Plan(len(ds), seed=3, global_batch_size=4, micro_batch_size=2)
    inner = causal_lm_collator(ds)
    run = sft(root, ds, plan, tmp_path / "wrapped", collator=lambda batch: inner(batch), reader=ds)
    run.train()
    assert [s for s, _ in run.seen] == [0, 0, 1, 1, 2, 2, 3, 3]
    for (step, inputs), a in zip(run.seen, [0, 1] * 4):
        assert torch.equal(inputs["input_ids"], expected(ds, plan, step, a)["input_ids"])
    with pytest.raises(ValueError, match="pass reader=the PackedDataset they index"):
        sft(root, ds, plan, tmp_path / "unknown", collator=lambda batch: inner(batch))


def test_the_logged_epoch_is_the_plans(chat, tmp_path):
    """Was: 1.0 after 4 steps of a plan of 15.5 steps per epoch (the Trainer counted max_steps as one epoch)."""
    root, _, ds = chat
    plan = Plan(len(ds), seed=3, global_batch_size=4, micro_batch_size=2)
    run = sft(root, ds, plan, tmp_path / "epoch")
    run.train()
    logged = [(h["step"], h["epoch"]) for h in run.state.log_history if "loss" in h]
    assert logged == [(s, s * 4 / len(ds)) for s in (1, 2, 3, 4)] and len(ds) > 16


# -- redaction through both collators, recorded, audited, and kept on resume
# ------------------------------------------------------------------------------------------------------------------

FROM_STEP = 2


def redacted_docs(ds, plan) -> list[int]:
    """Two conversations: one that step FROM_STEP + 1 reads, one that step 0 reads (so the audit has steps)."""
    at = set(ds.get_batch(plan.global_batch(FROM_STEP + 1))["document_ids"].unique().tolist()) - {-1}
    before = set(ds.get_batch(plan.global_batch(0))["document_ids"].unique().tolist()) - {-1}
    return sorted(sorted(at)[:1] + sorted(before - at)[:1])


def redacted(ds, ids, step: int, docs: list[int]) -> dict:
    """``ds``'s micro batch with the labels (and loss mask) of ``docs`` masked from FROM_STEP on, by hand."""
    batch = ds.get_batch(list(ids))
    if step >= FROM_STEP:
        mask = torch.from_numpy(np.isin(batch["document_ids"].numpy(), docs))
        batch["labels"] = batch["labels"].masked_fill(mask, -100)
        batch["loss_mask"] = batch["loss_mask"] & ~mask
    return batch


@pytest.mark.parametrize("kind", ["CausalLMCollator", "FlatteningCollator"])
def test_a_redaction_reaches_both_collators_before_num_items_in_batch_and_is_recorded(chat, tmp_path, kind, capsys):
    """Was: the HF integration refused a plan with redactions, and the fix its error gave (``redact_labels`` in the
    training step) failed on both collators' output (no ``document_ids``)."""
    root, _, ds = chat
    base = Plan(len(ds), seed=3, global_batch_size=4, micro_batch_size=2)
    docs = redacted_docs(ds, base)
    plan = Plan(len(ds), seed=3, global_batch_size=4, micro_batch_size=2, redactions=[Redaction(docs, FROM_STEP)])
    collator = causal_lm_collator(ds) if kind == "CausalLMCollator" else FlatteningCollator(reader=ds)
    run = sft(root, ds, plan, tmp_path / "run", collator=collator)
    run.train()
    for (step, inputs), a, count in zip(run.seen, [0, 1] * 4, run.counts):
        want = redacted(ds, base.micro_batch(step, a, 0), step, docs)
        assert set(inputs) <= set(collator(MicroBatch(want))) and all(
            torch.equal(inputs[k], v) for k, v in collator(MicroBatch(want)).items() if torch.is_tensor(v)
        ), (step, a)
        step_batches = [redacted(ds, base.micro_batch(step, b, 0), step, docs) for b in (0, 1)]
        assert count == sum(int((b["labels"] != -100).sum()) for b in step_batches)  # num_items_in_batch: after
    unredacted = [ds.get_batch(base.micro_batch(s, a, 0)) for s in (FROM_STEP, FROM_STEP + 1) for a in (0, 1)]
    after = [redacted(ds, base.micro_batch(s, a, 0), s, docs) for s in (FROM_STEP, FROM_STEP + 1) for a in (0, 1)]
    assert sum(int((u["labels"] != r["labels"]).sum()) for u, r in zip(unredacted, after)) > 0  # it bites

    # the record holds the redaction; the audit counts the labels each read trained, from the batches trained on
    record = DataRecord.load(tmp_path / "run" / "checkpoint-4")
    assert record.fingerprint.plan["redactions"] == [[FROM_STEP, docs]]
    capsys.readouterr()  # the Trainer's own log lines
    assert main(["stats", "--checkpoint", str(tmp_path / "run" / "checkpoint-4"), "--json", "--quiet"]) == 0
    rows = json.loads(capsys.readouterr().out)["redactions"]
    for row in rows:
        trained = 0
        for step, a in [(s, a) for s in range(FROM_STEP) for a in (0, 1)]:
            b = ds.get_batch(base.micro_batch(step, a, 0))
            trained += int(((b["document_ids"] == row["document"]) & (b["labels"] != -100)).sum())
        assert row["trained"] == trained and (row["tokens"] > trained or not row["reads"]), row  # trained turns only
    assert any(row["steps"] for row in rows)

    # a resume that drops the redaction recorded for a step ahead of it is refused; allow_data_change warns
    again = sft(root, ds, base, tmp_path / "again", collator=collator)
    with pytest.raises(ValueError, match=f"drops the redaction of document {docs[0]} from step {FROM_STEP}"):
        again.check_data_resume(tmp_path / "run" / "checkpoint-2")
    allowed = sft(root, ds, base, tmp_path / "allowed", collator=collator, allow_data_change=True)
    with pytest.warns(UserWarning, match="allow_data_change=True: resuming at step 2 drops the redaction"):
        allowed.check_data_resume(tmp_path / "run" / "checkpoint-2")
