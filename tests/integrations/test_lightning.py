"""Lightning DDP over detsampler on 2 CPU processes (gloo), a tiny Llama trained on a real PackedDataset by the
documented training_step: killed and resumed from Lightning's own checkpoint (the datamodule's state is the step and the
data record), on 2 processes and on 1, each step reads the samples of the uninterrupted run; a resume with another
accumulate_grad_batches, or with another plan seed, is refused."""

from __future__ import annotations

import pytest
import torch

from detsampler.hashing import sample_hash
from detsampler.record import DataRecord
from tests.integrations._lightning_child import SEED
from tests.integrations._packed import data, plan_of
from tests.integrations.launch import audited, check, start, wait
from tests.integrations.launch import read_steps as steps

CHILD = "tests.integrations._lightning_child"


@pytest.mark.slow
def test_lightning_killed_and_resumed_reads_the_uninterrupted_steps(tmp_path, small_index, capsys):
    index = str(small_index.path)
    full, run, again, elastic = (tmp_path / name for name in ("full", "run", "again", "elastic"))
    first = [start(CHILD, 2, index, str(full), "full"), start(CHILD, 2, index, str(run), "kill")]
    check(wait(first[0]))
    check(wait(first[1]))
    ckpt = run / "ckpt" / "step=3.ckpt"
    assert ckpt.exists() and not (run / "ckpt" / "step=6.ckpt").exists()
    state = torch.load(ckpt, weights_only=False)["DetsamplerDataModule"]
    assert set(state) == {"step", "data_record"} and state["step"] == 3
    record = DataRecord.from_dict(state["data_record"])
    assert (record.framework, record.step, record.world_size, record.micro_batch_size) == ("lightning", 3, 2, 2)
    shown = audited(capsys, ckpt)  # the real .ckpt audited with nothing re-typed
    assert f"sample hash {sample_hash(plan_of(data(index), SEED).global_batch(2))}" in shown
    second = [
        start(CHILD, 2, index, str(again), "resume", str(ckpt)),
        start(CHILD, 1, index, str(elastic), "resume", str(ckpt)),  # 1 process x 2 micro batches of 4
        start(CHILD, 1, index, str(tmp_path / "refused"), "resume", str(ckpt), "4"),  # another accumulate_grad_batches
        start(CHILD, 1, index, str(tmp_path / "seed"), "resume", str(ckpt), "2", "99"),  # plan seed 2 -> 99
    ]
    check(wait(second[0]))
    check(wait(second[1]))
    refused = wait(second[2])[0]
    assert refused.returncode != 0
    assert (
        "the checkpoint was taken after 6 batches of the epoch, not a multiple of accumulate_grad_batches=4"
        in refused.stdout
    )
    seed = wait(second[3])[0]
    assert seed.returncode != 0
    assert (
        "refusing to resume from the checkpoint's DetsamplerDataModule state: resuming at step 3 changes the plan's "
        "seed: the checkpoint has 2, the new plan 99; this would change data already trained on" in seed.stdout
    )
    assert not (tmp_path / "seed" / "ids-1-0.jsonl").exists()

    reference = {rank: steps(full / f"ids-2-{rank}.jsonl") for rank in range(2)}
    plan = plan_of(data(index), SEED).with_world(2, 2)
    for rank in range(2):  # the uninterrupted run reads the plan
        assert reference[rank] == {s: [plan.micro_batch(s, a, rank).tolist() for a in range(2)] for s in range(6)}
        killed = steps(run / f"ids-2-{rank}.jsonl")
        assert sorted(killed) == [0, 1, 2, 3] and all(killed[s] == reference[rank][s] for s in killed)
        assert steps(again / f"ids-2-{rank}.jsonl") == {s: reference[rank][s] for s in (3, 4, 5)}
    one = steps(elastic / "ids-1-0.jsonl")
    assert sorted(one) == [3, 4, 5]
    for s in (3, 4, 5):
        assert sorted(i for mb in one[s] for i in mb) == sorted(
            i for r in range(2) for mb in reference[r][s] for i in mb
        )
