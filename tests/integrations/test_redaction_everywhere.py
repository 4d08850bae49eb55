"""Redaction and the instance filter in every integration (issue 32, item 1): Lightning, torchtitan, Grain and the
torchft loop each hand the training step exactly the unredacted batches with the labels of the redacted documents
masked from the redaction step on (checked by value against ``redaction_mask``), and record the redactions (and the
filter) in their checkpoint's data record; the refusal that sent users to ``redact_labels`` is gone. Hugging Face and
TRL: tests/integrations/test_hf_takedown.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from detsampler import LayoutConfig, PackedDataset, Plan
from detsampler.filter import RepetitionFilter
from detsampler.integrations.checkpoint import CheckpointData
from detsampler.record import DataRecord
from detsampler.redaction import Redaction

SEQ_LEN, FROM_STEP = 32, 2


def packed(index, **kwargs) -> PackedDataset:
    return PackedDataset(index, index.layout(LayoutConfig(kind="bestfit", seq_len=SEQ_LEN)), **kwargs)


def redacted_docs(ds, plan) -> list[int]:
    """Two documents that step FROM_STEP + 1 reads (so the redaction bites), and that step 0 reads one of."""
    at = set(ds.get_batch(plan.global_batch(FROM_STEP + 1))["document_ids"].unique().tolist()) - {-1}
    before = set(ds.get_batch(plan.global_batch(0))["document_ids"].unique().tolist()) - {-1}
    return sorted(sorted(at)[:1] + sorted(before - at)[:1])


def expected(ds, ids, step: int, docs: list[int]) -> dict:
    """``ds``'s batch of ``ids`` with the labels of ``docs`` masked when ``step >= FROM_STEP`` (by hand: np.isin)."""
    batch = ds.get_batch(list(ids))
    if step >= FROM_STEP:
        mask = torch.from_numpy(np.isin(batch["document_ids"].numpy(), docs))
        batch["labels"] = batch["labels"].masked_fill(mask, -100)
    return batch


def test_an_integration_records_a_plan_that_redacts(small_index):
    """Was: refused (``the plan redacts documents (1 entries), which hf's training loop does not apply``)."""
    ds = packed(small_index)
    plan = Plan(len(ds), seed=0, global_batch_size=4, micro_batch_size=2, redactions=[Redaction([3], FROM_STEP)])
    record = CheckpointData(ds, plan, framework="hf").record(5, plan)
    assert record.fingerprint.plan["redactions"] == [[FROM_STEP, [3]]]
    assert DataRecord.from_dict(record.to_dict()).plan(len(ds)).redactions == (Redaction([3], FROM_STEP),)


def test_lightning_trains_the_redacted_labels_and_records_them(small_index, tmp_path):
    L = pytest.importorskip("lightning.pytorch")
    pytest.importorskip("transformers")
    from detsampler.integrations.lightning import DetsamplerDataModule
    from tests.integrations._lightning_child import LitLM
    from tests.tiny_llama import tiny_llama

    ds = packed(small_index)
    base = Plan(len(ds), seed=5, global_batch_size=4, micro_batch_size=4)
    docs = redacted_docs(ds, base)
    plan = Plan(len(ds), seed=5, global_batch_size=4, micro_batch_size=4, redactions=[Redaction(docs, FROM_STEP)])

    class Recording(LitLM):
        def training_step(self, batch, batch_idx):
            self.seen.append((self.trainer.global_step, {k: v.clone() for k, v in batch.items()}))
            return super().training_step(batch, batch_idx)

    module = Recording(tiny_llama(small_index.vocab_size))
    module.seen = []
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=4,
        accumulate_grad_batches=2,
        use_distributed_sampler=False,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
    )
    datamodule = DetsamplerDataModule(ds, plan, num_workers=1)  # the step travels to the worker with the ids
    trainer.fit(module, datamodule=datamodule)
    cut = plan.with_world(1, 2)
    assert [s for s, _ in module.seen] == [0, 0, 1, 1, 2, 2, 3, 3]
    masked = 0
    for (step, batch), a in zip(module.seen, [0, 1] * 4):
        want = expected(ds, cut.micro_batch(step, a, 0), step, docs)
        assert all(torch.equal(batch[k], want[k]) for k in want), (step, a)
        masked += int((batch["labels"] != ds.get_batch(cut.micro_batch(step, a, 0))["labels"]).sum())
    assert masked > 0
    record = DataRecord.from_dict(datamodule.state_dict()["data_record"])
    assert record.fingerprint.plan["redactions"] == [[FROM_STEP, docs]]


def test_torchtitan_reads_its_configured_redactions_and_filter_and_records_them(small_index):
    pytest.importorskip("torchtitan")
    from tests.integrations.test_torchtitan import LOCAL_BATCH, build, draw

    ds = packed(small_index)
    base = Plan(len(ds), seed=0, global_batch_size=8, micro_batch_size=LOCAL_BATCH)
    docs = redacted_docs(ds, base)
    repetition = RepetitionFilter(max_period=4, max_count=3)
    config = dict(layout="bestfit", redactions=[f"{FROM_STEP}:{','.join(map(str, docs))}"], instance_filter=True)
    config.update(repetition_max_period=4, repetition_max_count=3)
    loader = build([small_index.path], 1, 0, **config)
    filtered = packed(small_index, instance_filter=repetition)
    for step, ranks in enumerate(draw([loader], 4)):
        for a, (inputs, labels) in enumerate(ranks[0]):
            want = expected(filtered, base.micro_batch(step, a, 0), step, docs)
            assert torch.equal(inputs["input"], want["input_ids"]) and torch.equal(labels, want["labels"]), (step, a)
    record = DataRecord.from_json(loader.state_dict()["data_record"])
    assert record.fingerprint.plan["redactions"] == [[FROM_STEP, docs]]
    assert record.instance_filter() == repetition
    with pytest.raises(ValueError, match="redactions entry 'x:1': expected FROM_STEP:DOC"):
        build([small_index.path], 1, 0, redactions=["x:1"])


def test_grain_records_are_redacted_at_their_step(small_index):
    pytest.importorskip("grain")
    from detsampler.integrations.grain import PlanSource

    ds = packed(small_index)
    base = Plan(len(ds), seed=1, global_batch_size=4, micro_batch_size=2)
    docs = redacted_docs(ds, base)
    plan = Plan(len(ds), seed=1, global_batch_size=4, micro_batch_size=2, redactions=[Redaction(docs, FROM_STEP)])
    source = PlanSource(ds, plan, num_steps=4)
    for record in range(len(source)):
        step, a = source.position(record)
        want = expected(ds, base.micro_batch(step, a, 0), step, docs)
        got = source[record]
        assert all(np.array_equal(got[k], want[k].numpy()) for k in want), record
    saved = DataRecord.from_json(source.state_dict(2)["data_record"])
    assert saved.fingerprint.plan["redactions"] == [[FROM_STEP, docs]]


def test_the_torchft_loop_reads_its_share_redacted(small_index):
    pytest.importorskip("torchft")
    from detsampler.integrations.torchft import FaultTolerantSampler, ReplicaShare

    ds = packed(small_index)
    base = Plan(len(ds), seed=2, global_batch_size=6, micro_batch_size=6)
    docs = redacted_docs(ds, base)
    plan = Plan(len(ds), seed=2, global_batch_size=6, micro_batch_size=6, redactions=[Redaction(docs, FROM_STEP)])
    sampler = FaultTolerantSampler(None, plan)
    for step in range(4):
        ids = plan.global_batch(step)[2:5]  # one contributor's share of the step
        share = ReplicaShare(step, ids, 0, 2, (0, 1), 1, 6)
        got, want = sampler.read(ds, share), expected(ds, ids, step, docs)
        assert all(torch.equal(got[k], want[k]) for k in want) and got["sample_ids"].tolist() == ids.tolist()


def test_a_redacted_read_without_its_step_or_document_ids_is_refused(small_index):
    """Never served unmasked: a plain list of ids (no step), a dataset whose samples hold no document_ids, token ids
    alone (``output="tokens"``) are each refused in one line."""
    from detsampler.loader.redact import RedactedDataset
    from detsampler.loader.sampler import PlannedIds

    ds = packed(small_index)
    plan = Plan(len(ds), seed=0, global_batch_size=4, micro_batch_size=2, redactions=[Redaction([3], FROM_STEP)])
    redacted = RedactedDataset(ds, plan)
    with pytest.raises(ValueError, match="read sample ids without their training step \\(list\\)"):
        redacted.__getitems__([0, 1])
    with pytest.raises(TypeError, match="a single index does not carry"):
        redacted[0]

    class Plain(torch.utils.data.Dataset):
        def __len__(self):
            return len(ds)

        def __getitem__(self, i):
            return {"input_ids": ds[i]["input_ids"], "labels": ds[i]["labels"]}

    with pytest.raises(ValueError, match="the dataset's samples hold \\['input_ids', 'labels'\\], not labels and"):
        RedactedDataset(Plain(), plan).__getitems__(PlannedIds([0, 1], 0, 0, 0, None))
    concat = PackedDataset(
        small_index, small_index.layout(LayoutConfig(kind="concat", seq_len=SEQ_LEN)), output="tokens"
    )
    with pytest.raises(ValueError, match="read output='fields'"):
        RedactedDataset(concat, plan)


def test_the_hf_collator_honours_the_instance_filter_of_token_ids(small_index):
    """Was: ``CausalLMCollator`` on ``output="tokens"`` batches ignored their ``instance_mask``: a flagged sample's
    targets were all trained. Now they are -100, as the four fields' labels are."""
    pytest.importorskip("transformers")
    from detsampler.integrations.hf import CausalLMCollator

    layout = small_index.layout(LayoutConfig(kind="concat", seq_len=SEQ_LEN))
    strict = RepetitionFilter(max_period=2, max_count=3)  # flags any run of 3 equal tokens or pairs
    tokens = PackedDataset(small_index, layout, output="tokens", instance_filter=strict)
    fields = PackedDataset(small_index, layout, instance_filter=strict)
    ids = list(range(64))
    batch = tokens.get_batch(ids)
    flagged = ~batch["instance_mask"]
    assert flagged.any() and not flagged.all()
    got = CausalLMCollator()(batch)["shift_labels"]
    assert (got[flagged] == -100).all() and torch.equal(got, fields.get_batch(ids)["labels"])
