"""transformers.Trainer over detsampler on 2 CPU processes (gloo), on a real PackedDataset through the integration's
collator: killed and resumed from the Trainer's own checkpoint, on 2 processes and on 1, each step reads the samples of
the uninterrupted run; the naive accelerator.prepare is refused; the checkpoint records its data, and a resume with
another plan seed is refused with the library's message."""

from __future__ import annotations

import pytest

from detsampler.hashing import sample_hash
from detsampler.record import RECORD_FILE, DataRecord
from tests.integrations._hf_child import SEED
from tests.integrations._packed import data, plan_of
from tests.integrations.launch import audited, check, start, wait
from tests.integrations.launch import read_steps as steps

CHILD = "tests.integrations._hf_child"


@pytest.mark.slow
def test_trainer_killed_and_resumed_reads_the_uninterrupted_steps(tmp_path, small_index, capsys):
    index = str(small_index.path)
    full, run, again, elastic = (tmp_path / name for name in ("full", "run", "again", "elastic"))
    first = [start(CHILD, 2, index, str(full), "full"), start(CHILD, 2, index, str(run), "kill")]
    outputs = check(wait(first[0]))
    check(wait(first[1]))  # the killed ranks exit 0 from os._exit(0)
    assert all(
        "naive prepare: DeterministicBatchSampler is wrapped by BatchSamplerShard(num_processes=2)" in o
        for o in outputs
    )
    checkpoint = run / "checkpoint-3"
    assert (checkpoint / "trainer_state.json").exists() and not (run / "checkpoint-6").exists()
    record = DataRecord.load(checkpoint / RECORD_FILE)
    assert (record.framework, record.step, record.world_size, record.micro_batch_size) == ("hf", 3, 2, 2)
    shown = audited(capsys, checkpoint)  # the real Trainer checkpoint audited with nothing re-typed
    assert f"sample hash {sample_hash(plan_of(data(index), SEED).global_batch(2))}" in shown
    second = [
        start(CHILD, 2, index, str(again), "resume", str(checkpoint)),
        start(CHILD, 1, index, str(elastic), "resume", str(checkpoint), "4"),  # 1 process x 4 micro steps
        start(CHILD, 1, index, str(tmp_path / "refused"), "resume", str(checkpoint), "4", "99"),  # plan seed 1 -> 99
    ]
    check(wait(second[0]))
    check(wait(second[1]))
    refused = wait(second[2])[0]
    assert refused.returncode != 0
    assert (
        f"refusing to resume from {checkpoint}: resuming at step 3 changes the plan's seed: the checkpoint has 1, the "
        "new plan 99; this would change data already trained on" in refused.stdout
    )
    assert not (tmp_path / "refused" / "ids-1-0.jsonl").exists()  # refused before training a step

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
