"""Lightning's documented training_step (docs/integrations.md; tests/integrations/_lightning_child.py's LitLM) computes
the next-token cross-entropy of each micro batch, checked by value against a hand computation over the same tokens; and
the DataModule's state records its data and checks it on load, in one process."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch

L = pytest.importorskip("lightning.pytorch")
pytest.importorskip("transformers")

from detsampler import Plan  # noqa: E402
from detsampler.integrations.lightning import DetsamplerDataModule  # noqa: E402
from detsampler.record import DataRecord  # noqa: E402
from tests.integrations._lightning_child import LitLM  # noqa: E402
from tests.integrations.test_hf_labels import dataset, hand_loss, tiny_llama  # noqa: E402

DOC = Path(__file__).resolve().parents[2] / "docs" / "integrations.md"


def test_the_documented_training_step_is_the_one_tested():
    assert inspect.getsource(LitLM) in DOC.read_text()


class _Recording(LitLM):
    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        self.seen.append((self.trainer.global_step, float(loss.detach())))
        return loss


@pytest.mark.parametrize("kind", ["concat", "bestfit"])
def test_the_documented_training_step_is_the_next_token_cross_entropy(small_index, tmp_path, kind):
    ds = dataset(small_index, kind)
    model = tiny_llama(small_index.vocab_size)
    plan = Plan(len(ds), seed=5, global_batch_size=4, micro_batch_size=4)  # re-cut: 1 process x 2 micro batches of 2
    micro = plan.with_world(1, 2)
    want = [hand_loss(model.eval(), ds, [micro.micro_batch(0, a, 0).tolist()])[0].item() for a in range(2)]
    model.train()
    module = _Recording(model)
    module.seen = []
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=1,
        accumulate_grad_batches=2,
        use_distributed_sampler=False,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
    )
    datamodule = DetsamplerDataModule(ds, plan)
    trainer.fit(module, datamodule=datamodule)
    assert [s for s, _ in module.seen] == [0, 0]
    assert [loss for _, loss in module.seen] == pytest.approx(want, rel=1e-5)
    state = datamodule.state_dict()
    record = DataRecord.from_dict(state["data_record"])
    assert state["step"] == 1 and (record.framework, record.step, record.micro_batch_size) == ("lightning", 1, 2)


def test_load_state_dict_checks_the_data_record(small_index):
    ds = dataset(small_index, "bestfit")
    plan = Plan(len(ds), seed=0, global_batch_size=8, micro_batch_size=8)
    saved = {"step": 3, "data_record": DataRecord.of(3, ds.index, ds.layout, plan.with_world(2, 2)).to_dict()}
    module = DetsamplerDataModule(ds, plan)
    module.load_state_dict(saved)  # another world size: accepted
    assert module.start_step == 3
    other = DetsamplerDataModule(ds, Plan(len(ds), seed=99, global_batch_size=8, micro_batch_size=8))
    with pytest.raises(ValueError, match="changes the plan's seed: the checkpoint has 0, the new plan 99"):
        other.load_state_dict(saved)
    concat = dataset(small_index, "concat")
    with pytest.raises(ValueError, match="changes the layout"):
        concat_plan = Plan(len(concat), seed=0, global_batch_size=8, micro_batch_size=8)
        DetsamplerDataModule(concat, concat_plan).load_state_dict(saved)
    with pytest.raises(ValueError, match="holds no detsampler data record"):
        DetsamplerDataModule(ds, plan).load_state_dict({"step": 3})  # a state saved before records
    old = DetsamplerDataModule(ds, plan, allow_data_change=True)
    with pytest.warns(UserWarning, match="holds no detsampler data record"):
        old.load_state_dict({"step": 3})
    assert old.start_step == 3
    with pytest.raises(ValueError, match="pass index= and layout="):
        DetsamplerDataModule(torch.utils.data.TensorDataset(torch.zeros(len(ds), 8)), plan)


def test_a_state_step_other_than_its_records_or_an_edited_record_is_refused(small_index):
    """Issue 31: a state naming step 7 over the record of step 5 resumed at 7; a record edited by hand (world_size
    2 -> 4) loaded as written. Both are refused naming the state."""
    ds = dataset(small_index, "bestfit")
    plan = Plan(len(ds), seed=0, global_batch_size=8, micro_batch_size=8)
    record = DataRecord.of(5, ds.index, ds.layout, plan.with_world(2, 2), framework="lightning").to_dict()
    with pytest.raises(ValueError, match=r"DetsamplerDataModule state: the record's step 5 is not this checkpoint's "):
        DetsamplerDataModule(ds, plan).load_state_dict({"step": 7, "data_record": record})
    with pytest.raises(ValueError, match=r"DetsamplerDataModule state: the data record fails its seal"):
        DetsamplerDataModule(ds, plan).load_state_dict({"step": 5, "data_record": {**record, "world_size": 4}})
    module = DetsamplerDataModule(ds, plan)
    module.load_state_dict({"step": 5, "data_record": record})
    assert module.start_step == 5


def test_a_checkpoint_holding_another_checkpoints_datamodule_state_is_refused(small_index, tmp_path, capsys):
    """Issue 31: a real Lightning checkpoint after 2 steps whose datamodule state is the one saved after step 1 (a
    whole valid state, copied): Lightning resumed at global_step 2 and the sampler at step 1, training step 2 on step
    1's data in silence. The resume is refused naming both steps, and so is its audit."""
    from detsampler.cli import main

    ds = dataset(small_index, "bestfit")
    plan = Plan(len(ds), seed=5, global_batch_size=4, micro_batch_size=4)

    def fit(max_steps, ckpt_path=None):
        trainer = L.Trainer(
            accelerator="cpu",
            devices=1,
            max_steps=max_steps,
            accumulate_grad_batches=2,
            use_distributed_sampler=False,
            logger=False,
            callbacks=[L.callbacks.ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=1, save_top_k=-1)],
            enable_progress_bar=False,
            enable_model_summary=False,
            default_root_dir=str(tmp_path),
        )
        module = _Recording(tiny_llama(small_index.vocab_size))
        module.seen = []
        trainer.fit(module, datamodule=DetsamplerDataModule(ds, plan), ckpt_path=ckpt_path)
        return module.seen

    fit(2)
    first, second = sorted(tmp_path.glob("*.ckpt"), key=lambda p: torch.load(p, weights_only=False)["global_step"])
    saved = torch.load(second, weights_only=True)  # as the CLI reads it: Lightning states both steps, as ints
    assert type(saved["global_step"]) is int and saved["DetsamplerDataModule"]["step"] == saved["global_step"] == 2
    forged = torch.load(second, weights_only=False)
    forged["DetsamplerDataModule"] = torch.load(first, weights_only=False)["DetsamplerDataModule"]
    torch.save(forged, tmp_path / "forged.ckpt")
    with pytest.raises(ValueError, match=r"the sampler would start at step 1 but Lightning resumes at global_step 2"):
        fit(3, str(tmp_path / "forged.ckpt"))
    with pytest.raises(SystemExit):
        main(["show", "--checkpoint", str(tmp_path / "forged.ckpt")])
    assert "the record's step 1 is not this checkpoint's step 2 (global_step)" in capsys.readouterr().err
    assert [s for s, _ in fit(3, str(second))] == [2, 2]  # the checkpoint as saved resumes
