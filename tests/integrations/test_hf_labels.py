"""The Hugging Face integration hands transformers causal LMs their own label convention, checked by value: the loss of
a real LlamaForCausalLM (tiny, from a config) on detsampler batches equals a next-token cross-entropy computed here by
hand over the same tokens, with -100 exactly where the layout masks; through the collator alone (what accelerate users
call), through accelerate's prepared loader, and through one Trainer step (its num_items_in_batch included). Also: the
data record each checkpoint saves and the resume check, in one process."""

from __future__ import annotations

import dataclasses
import json
import os
import re

import pytest
import torch
import torch.nn.functional as F

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from transformers import LlamaForCausalLM, TrainingArguments  # noqa: E402

from detsampler import LayoutConfig, PackedDataset, Plan  # noqa: E402
from detsampler.integrations.hf import (  # noqa: E402
    CausalLMCollator,
    DetsamplerDataRecord,
    DetsamplerTrainer,
    causal_lm_collator,
    prepare_data_loader,
)
from detsampler.layout import make_layout  # noqa: E402
from detsampler.loader.sampler import DeterministicBatchSampler  # noqa: E402
from detsampler.record import HF_STATE_KEY, RECORD_FILE, DataRecord, record_sha256  # noqa: E402
from tests.tiny_llama import tiny_llama  # noqa: E402

SEQ_LEN = 32


def llama(vocab_size: int) -> LlamaForCausalLM:
    return tiny_llama(vocab_size, hidden_size=32, num_hidden_layers=2, seed=0, max_position_embeddings=SEQ_LEN)


def dataset(index, kind: str, **kwargs) -> PackedDataset:
    return PackedDataset(index, make_layout(LayoutConfig(kind=kind, seq_len=SEQ_LEN), index.lengths), **kwargs)


def hand_targets(ds: PackedDataset, ids: list[int]) -> torch.Tensor:
    """The next token of every position, -100 where there is none in the same document piece, worked out here from
    the inputs (not from the dataset's labels): concat reads its seq_len + 1 tokens (output="tokens"); the other
    layouts end a piece where the document or the run of positions changes, or at the sample's end."""
    if ds.kind == "concat":
        tokens = PackedDataset(ds.index, ds.layout, output="tokens").get_batch(ids)["tokens"].long()
        return tokens[:, 1:]
    b = ds.get_batch(ids)
    x, doc, pos = b["input_ids"], b["document_ids"], b["position_ids"]
    targets = torch.full_like(x, -100)
    same = (doc[:, 1:] == doc[:, :-1]) & (doc[:, :-1] >= 0) & (pos[:, 1:] == pos[:, :-1] + 1)
    targets[:, :-1] = torch.where(same, x[:, 1:], targets[:, :-1])
    return targets


def some_samples(ds: PackedDataset) -> list[int]:
    """Two samples holding a document boundary (a document's end inside the sample), then two others."""
    docs = ds.get_batch(list(range(len(ds))))["document_ids"]
    crossing = torch.nonzero((docs[:, 1:] != docs[:, :-1]).any(1)).flatten().tolist()
    return crossing[:2] + [3, 70]


def hand_loss(model, ds: PackedDataset, micro_batches: list[list[int]]) -> tuple[torch.Tensor, int]:
    """Mean next-token cross-entropy over every real target of ``micro_batches`` (from the model's logits on each
    document alone: one forward per document piece), and the number of targets."""
    total, count = torch.zeros((), dtype=torch.float64), 0
    for ids in micro_batches:
        b, targets = ds.get_batch(ids), hand_targets(ds, ids)
        for row in range(len(ids)):
            pos = b["position_ids"][row].tolist()
            starts = [0] + [t for t in range(1, SEQ_LEN) if pos[t] != pos[t - 1] + 1]
            for start, stop in zip(starts, [*starts[1:], SEQ_LEN]):  # each piece alone: no attention across pieces
                with torch.no_grad():
                    logits = model(input_ids=b["input_ids"][row : row + 1, start:stop]).logits[0].float()
                piece = targets[row, start:stop]
                total += F.cross_entropy(logits, piece, ignore_index=-100, reduction="sum").double()
                count += int((piece != -100).sum())
    return total / count, count


@pytest.mark.parametrize("kind", ["concat", "bestfit"])
def test_the_models_loss_through_the_collator_is_the_next_token_cross_entropy(small_index, kind):
    ds = dataset(small_index, kind)
    model = llama(small_index.vocab_size).eval()
    ids = some_samples(ds)
    targets = hand_targets(ds, ids)
    assert torch.equal(targets, ds.get_batch(ids)["labels"])  # the layout masks exactly there
    batch = causal_lm_collator(ds, model)(ds.__getitems__(ids))
    assert sorted(batch) == ["input_ids", "labels", "position_ids", "shift_labels", "use_cache"]
    with torch.no_grad():
        loss = model(**batch).loss
    want, count = hand_loss(model, ds, [ids])
    assert count == int((targets != -100).sum())
    if kind == "concat":
        assert count == len(ids) * SEQ_LEN  # the last position's target counts too
    else:
        assert count < len(ids) * (SEQ_LEN - 1)  # document ends masked (a piece's last position, padding)
    assert loss.item() == pytest.approx(want.item(), rel=1e-5, abs=1e-6)
    # without the collator (labels as the dataset gives them) the model shifts once more: the target is token t+2
    b = ds.get_batch(ids)
    with torch.no_grad():
        naive = model(input_ids=b["input_ids"], labels=b["labels"]).loss
    assert abs(naive.item() - want.item()) > 1e-4


def test_labels_in_transformers_convention_alone_give_the_same_targets_but_the_last(small_index):
    ds = dataset(small_index, "concat")
    model = llama(small_index.vocab_size).eval()
    ids = [5, 6]
    full = CausalLMCollator(shift_labels=True)(ds.__getitems__(ids))
    plain = CausalLMCollator(shift_labels=False)(ds.__getitems__(ids))
    assert "shift_labels" not in plain and torch.equal(plain["labels"], full["labels"])
    with torch.no_grad():
        logits = model(input_ids=full["input_ids"]).logits.float()
        loss = model(**plain).loss
    targets = hand_targets(ds, ids).clone()
    targets[:, -1] = -100  # the one target transformers' unshifted labels cannot hold
    assert loss.item() == pytest.approx(F.cross_entropy(logits.flatten(0, 1), targets.flatten()).item(), rel=1e-6)
    # output="tokens" gives the same batch as the four fields
    tokens = CausalLMCollator()(PackedDataset(ds.index, ds.layout, output="tokens").__getitems__(ids))
    assert sorted(tokens) == sorted(full) and all(torch.equal(tokens[k], full[k]) for k in full if k != "use_cache")


def test_accelerate_prepared_loader_gives_the_same_loss(small_index):
    from accelerate import Accelerator

    ds = dataset(small_index, "bestfit")
    model = llama(small_index.vocab_size).eval()
    plan = Plan(len(ds), seed=4, global_batch_size=4, micro_batch_size=2)
    accelerator = Accelerator(cpu=True)
    loader = torch.utils.data.DataLoader(
        ds, batch_sampler=DeterministicBatchSampler(plan, rank=0, stop_step=1), collate_fn=causal_lm_collator(ds, model)
    )
    for micro_step, batch in enumerate(prepare_data_loader(accelerator, loader)):
        with torch.no_grad():
            loss = model(**batch).loss
        want, _ = hand_loss(model, ds, [plan.micro_batch(0, micro_step, 0).tolist()])
        assert loss.item() == pytest.approx(want.item(), rel=1e-5, abs=1e-6)


class _Recording(DetsamplerTrainer):
    def training_step(self, model, inputs, num_items_in_batch=None):
        loss = super().training_step(model, inputs, num_items_in_batch)
        self.seen.append((self.state.global_step, float(loss), int(num_items_in_batch)))
        return loss


def sft_trainer(tmp_path, ds, model, plan, **settings):
    """TRL's SFTTrainer with the mixin: it takes only a datasets.Dataset, so its rows are sample ids read by the
    collator, and it wants a tokenizer (any: the batches are token ids already)."""
    trl = pytest.importorskip("trl")
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    from detsampler.integrations.hf import DetsamplerTrainerMixin, sample_id_dataset

    class DetsamplerSFTTrainer(DetsamplerTrainerMixin, trl.SFTTrainer):
        def training_step(self, model, inputs, num_items_in_batch=None):
            loss = super().training_step(model, inputs, num_items_in_batch)
            self.seen.append((self.state.global_step, float(loss), int(num_items_in_batch)))
            return loss

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(WordLevel({"<pad>": 0}, unk_token="<pad>")), pad_token="<pad>", eos_token="<pad>"
    )
    args = trl.SFTConfig(dataset_kwargs={"skip_prepare_dataset": True}, **settings)
    run = DetsamplerSFTTrainer(
        model=model,
        args=args,
        train_dataset=sample_id_dataset(ds),
        data_collator=causal_lm_collator(ds, model),
        processing_class=tokenizer,
        plan=plan,
    )
    run.seen = []
    return run


def trainer(tmp_path, ds, model, plan, kind="Trainer"):
    settings = dict(
        output_dir=str(tmp_path),
        max_steps=1,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="steps",
        save_steps=1,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
    )
    if kind == "SFTTrainer":
        return sft_trainer(tmp_path, ds, model, plan, **settings)
    run = _Recording(model=model, args=TrainingArguments(**settings), train_dataset=ds, plan=plan)
    run.seen = []
    return run


@pytest.mark.parametrize("trainer_kind", ["Trainer", "SFTTrainer"])
@pytest.mark.parametrize("kind", ["concat", "bestfit"])
def test_a_trainer_step_computes_the_next_token_cross_entropy_of_its_samples(small_index, tmp_path, kind, trainer_kind):
    ds = dataset(small_index, kind)
    model = llama(small_index.vocab_size)
    plan = Plan(len(ds), seed=4, global_batch_size=4, micro_batch_size=2)
    want, count = hand_loss(model.eval(), ds, [plan.micro_batch(0, a, 0).tolist() for a in range(2)])
    model.train()
    run = trainer(tmp_path, ds, model, plan, trainer_kind)
    assert isinstance(run.data_collator, CausalLMCollator)
    run.train()
    assert [s for s, _, _ in run.seen] == [0, 0]
    assert [n for _, _, n in run.seen] == [count, count]  # num_items_in_batch: every real target of the step
    step_loss = sum(loss for _, loss, _ in run.seen)  # each micro step's loss is its sum over the step's targets
    assert step_loss == pytest.approx(want.item(), rel=1e-5)
    assert run.state.log_history[0]["loss"] == pytest.approx(want.item(), rel=1e-5)
    # the checkpoint records its data, through the library's format
    record = DataRecord.load(tmp_path / "checkpoint-1")
    assert record.framework == "hf" and record.step == 1 and (tmp_path / "checkpoint-1" / RECORD_FILE).exists()
    assert record.fingerprint.layout["kind"] == kind and record.world_size == 1 and record.micro_batch_size == 2
    assert record.fingerprint.index == small_index.fingerprint


def _name_in_trainer_state(checkpoint, global_step: int, record: bytes) -> None:
    """A trainer_state.json at ``global_step`` naming the sha256 of ``record`` as the integration does."""
    named = {HF_STATE_KEY: {"args": {"sha256": record_sha256(record)}, "attributes": {}}}
    state = {"global_step": global_step, "stateful_callbacks": named}
    (checkpoint / "trainer_state.json").write_text(json.dumps(state))


def test_resume_checks_the_checkpoints_data_record(small_index, tmp_path):
    ds = dataset(small_index, "bestfit")
    plan = Plan(len(ds), seed=0, global_batch_size=4, micro_batch_size=2)
    checkpoint = tmp_path / "checkpoint-3"
    checkpoint.mkdir()
    saved = DataRecord.of(3, ds.index, ds.layout, plan.with_world(2, 1), framework="hf").save(checkpoint)
    _name_in_trainer_state(checkpoint, 3, saved.read_bytes())
    model = llama(small_index.vocab_size)

    def check(ds, plan, **kwargs):
        run = _Recording(
            model=model,
            args=TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=4, use_cpu=True, report_to=[]),
            train_dataset=ds,
            plan=plan,
            **kwargs,
        )
        run.check_data_resume(str(checkpoint))

    check(ds, plan)  # another world size and micro batch: the same data
    check(ds, Plan(len(ds), seed=0, global_batch_size=4, micro_batch_size=2, skip_steps=[(5, 6)]))  # skips ahead
    with pytest.raises(ValueError, match=r"refusing to resume from .*checkpoint-3: .*changes the plan's seed"):
        check(ds, Plan(len(ds), seed=99, global_batch_size=4, micro_batch_size=2))
    concat = dataset(small_index, "concat")
    with pytest.raises(ValueError, match="changes the layout"):
        check(concat, Plan(len(concat), seed=0, global_batch_size=4, micro_batch_size=2))
    with pytest.warns(UserWarning, match="allow_data_change=True: .*changes the plan's seed"):
        check(ds, Plan(len(ds), seed=99, global_batch_size=4, micro_batch_size=2), allow_data_change=True)
    os.remove(checkpoint / RECORD_FILE)
    with pytest.raises(ValueError, match="holds no detsampler data record"):
        check(ds, plan)


def test_a_checkpoint_record_edited_copied_or_out_of_step_is_refused(small_index, tmp_path, capsys):
    """Issue 31, a real Trainer's checkpoint-2 (trainer_state.json names the sha256 of its record): the record with its
    step edited by hand (2 -> 5), checkpoint-1's record copied in, another run's record of step 2 copied in (it was
    shown as this run), a re-sealed record of step 5 with trainer_state.json rewritten to name it, another run's record
    in a copy without trainer_state.json. The resume check and the audit refuse each, naming the file; the checkpoint
    as saved resumes."""
    import shutil

    from detsampler.cli import main

    ds = dataset(small_index, "bestfit")

    def run(out, seed=4, steps=2, resume=None):
        settings = dict(output_dir=str(out), max_steps=steps, per_device_train_batch_size=2, save_steps=1)
        args = TrainingArguments(**settings, gradient_accumulation_steps=2, use_cpu=True, report_to=[])
        the_plan = Plan(len(ds), seed=seed, global_batch_size=4, micro_batch_size=2)
        trainer = _Recording(model=llama(small_index.vocab_size), args=args, train_dataset=ds, plan=the_plan)
        trainer.seen = []
        trainer.train(resume_from_checkpoint=resume)
        return trainer

    trainer = run(tmp_path / "run")
    saved = tmp_path / "run" / "checkpoint-2"
    state = json.loads((saved / "trainer_state.json").read_text())
    original = (saved / RECORD_FILE).read_bytes()
    assert state["stateful_callbacks"][HF_STATE_KEY]["args"]["sha256"] == record_sha256(original)
    assert DetsamplerDataRecord.__name__ == HF_STATE_KEY  # the Trainer keys the state by the callback's class name
    run(tmp_path / "other", seed=9)
    resealed = dataclasses.replace(DataRecord.load(saved), step=5).to_json().encode()
    named = "its sha256 is not the one trainer_state.json records"
    faults = {
        "edited": (original.replace(b'"step": 2', b'"step": 5'), named),
        "copied": ((saved.parent / "checkpoint-1" / RECORD_FILE).read_bytes(), named),
        "another run": ((tmp_path / "other" / "checkpoint-2" / RECORD_FILE).read_bytes(), named),
        "re-sealed": (resealed, "the record's step 5 is not this checkpoint's step 2 (its directory name checkpoint-2"),
    }
    for name, (data, message) in faults.items():
        checkpoint = tmp_path / name / "checkpoint-2"
        shutil.copytree(saved, checkpoint)
        (checkpoint / RECORD_FILE).write_bytes(data)
        if name == "re-sealed":
            _name_in_trainer_state(checkpoint, 2, data)
        with pytest.raises(ValueError, match=re.escape(f"{checkpoint / RECORD_FILE}: {message}")):
            trainer.check_data_resume(str(checkpoint))
        with pytest.raises(SystemExit):
            main(["show", "--checkpoint", str(checkpoint)])
        assert f"{checkpoint / RECORD_FILE}: {message}" in capsys.readouterr().err, name
    # Issue 31 (re-review): without trainer_state.json, another run's record of step 2 passed its directory name
    bare = tmp_path / "no-trainer-state" / "checkpoint-2"
    shutil.copytree(saved, bare)
    (bare / "trainer_state.json").unlink()
    (bare / RECORD_FILE).write_bytes((tmp_path / "other" / "checkpoint-2" / RECORD_FILE).read_bytes())
    said = f"{bare / RECORD_FILE}: its Hugging Face checkpoint has no trainer_state.json"
    with pytest.raises(ValueError, match=re.escape(said)):
        trainer.check_data_resume(str(bare))
    with pytest.raises(SystemExit):
        main(["show", "--checkpoint", str(bare)])
    assert said in capsys.readouterr().err
    resumed = run(tmp_path / "run", steps=3, resume=str(saved))
    assert [s for s, _, _ in resumed.seen] == [2, 2]
    assert DataRecord.load(tmp_path / "run" / "checkpoint-3").step == 3


def test_a_dataset_whose_data_is_unknown_needs_the_index_and_layout(small_index, tmp_path):
    ds = dataset(small_index, "concat")
    plain = torch.utils.data.TensorDataset(torch.zeros(len(ds), SEQ_LEN, dtype=torch.long))
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=1, use_cpu=True, report_to=[])
    plan = Plan(len(ds), seed=0, global_batch_size=8, micro_batch_size=8)
    model = llama(small_index.vocab_size)
    with pytest.raises(ValueError, match="pass index= and layout="):
        DetsamplerTrainer(model=model, args=args, train_dataset=plain, plan=plan)
    run = DetsamplerTrainer(model=model, args=args, train_dataset=plain, plan=plan, index=ds.index, layout=ds.layout)
    assert run.detsampler_data.fingerprint.index == small_index.fingerprint


@pytest.mark.parametrize("trainer_kind", ["Trainer", "SFTTrainer"])
def test_an_epoch_order_plan_reads_past_the_first_epoch_through_the_trainers_loader(
    small_index, tmp_path, trainer_kind
):
    """With ``epoch_order`` the plan's sample ids carry their epoch (``epoch * N + sample``): the Trainer's DataLoader
    (over the PackedDataset, or over TRL's rows of sample ids) yields, past the first epoch, the batches that
    ``get_batch`` gives those ids."""
    ds = PackedDataset(small_index, make_layout(LayoutConfig(kind="concat", seq_len=SEQ_LEN, epoch_order=True),
                                                small_index.lengths))  # fmt: skip
    plan = Plan(len(ds), seed=3, global_batch_size=4, micro_batch_size=2, epoch_ids=True)
    run = trainer(tmp_path, ds, llama(small_index.vocab_size), plan, kind=trainer_kind)
    sampler_steps = -(-len(ds) // 4) + 2  # into epoch 1
    loader = run.get_train_dataloader()
    want = iter(DeterministicBatchSampler(run.detsampler_plan(), rank=0))
    seen_epoch_1 = False
    for i, batch in enumerate(loader):
        ids = next(want)
        seen_epoch_1 |= min(ids) >= len(ds)
        ref = ds.get_batch(ids)
        assert torch.equal(batch["input_ids"], ref["input_ids"])
        if i >= 2 * sampler_steps:
            break
    assert seen_epoch_1
