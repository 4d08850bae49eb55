"""Grain's own classes over detsampler: ``grain.DataLoader`` (0 and 2 worker processes, ``ShardOptions`` for 1, 2 and 4
processes) and ``grain.MapDataset`` iterate :class:`PlanSource` records, which equal the plan's micro batches of each
process step by step; Grain's ``get_state`` / ``set_state`` round trip resumes exactly; a resume at another process
count, from the step's data record or from Grain's own state, continues with the same global batches; Grain refuses
its own state in a loader of another process count, and the data record a resume onto other data."""

from __future__ import annotations

import gc
import json
import re

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

grain = pytest.importorskip("grain")

from detsampler import LayoutConfig, PackedDataset, Plan  # noqa: E402
from detsampler.integrations.grain import PlanSampler, PlanSource, data_loader, map_dataset  # noqa: E402
from detsampler.record import DataRecord  # noqa: E402
from tests.strategies import skip_ranges  # noqa: E402

SEQ_LEN = 16
NUM_STEPS = 6


def dataset(index, kind: str = "bestfit") -> PackedDataset:
    return PackedDataset(index, index.layout(LayoutConfig(kind=kind, seq_len=SEQ_LEN)))


def ramp_plan(ds: PackedDataset) -> Plan:
    """Batches of 4, then 8 from step 2; data step 3 skipped: every record count differs from step to step."""
    ramp, skip = [(0, 4), (2, 8)], [(3, 3)]
    return Plan(len(ds), seed=3, global_batch_size=8, micro_batch_size=2, batch_size_schedule=ramp, skip_steps=skip)


def steps_of(elements, plan: Plan, start_step: int = 0, stop_step: int = NUM_STEPS) -> list[list[dict]]:
    """Elements grouped by step, each step ``plan.num_micro_steps(step)`` of them (``plan`` cut for the processes)."""
    it = iter(elements)
    return [[next(it) for _ in range(plan.num_micro_steps(s))] for s in range(start_step, stop_step)]


def check_process(steps, ds: PackedDataset, plan: Plan, rank: int, start_step: int = 0) -> None:
    """Each element is the plan's micro batch of ``rank`` at its step and micro step, fields read by the dataset."""
    for step, elements in enumerate(steps, start_step):
        for micro_step, element in enumerate(elements):
            ids = plan.micro_batch(step, micro_step, rank)
            assert element["sample_ids"].tolist() == ids.tolist()
            want = ds.get_batch(ids)
            assert set(element) == {*want, "sample_ids"}
            for name, value in want.items():
                assert np.array_equal(element[name], value.numpy()), name


def union(per_process, step_index: int) -> list[int]:
    return sorted(i for steps in per_process for e in steps[step_index] for i in e["sample_ids"].tolist())


def test_records_number_every_micro_batch_in_training_order(small_index):
    """``position`` inverts ``records_before`` over a ramp and a skip range: record ``g`` is the plan's ``g``-th micro
    batch at world size 1, whatever world size then cuts it."""
    ds = dataset(small_index)
    plan = ramp_plan(ds)
    source = PlanSource(ds, plan, NUM_STEPS)
    one = plan.with_world(1)
    expected = [(s, a) for s in range(NUM_STEPS) for a in range(one.num_micro_steps(s))]
    assert len(source) == len(expected) == 2 + 2 + 4 * 4
    assert [source.position(g) for g in range(len(source))] == expected
    assert [source.records_before(s) for s in range(NUM_STEPS + 1)] == [0, 2, 4, 8, 12, 16, 20]
    with pytest.raises(IndexError, match=r"Got record 20, allowed records are in \[0, 20\)"):
        source.position(20)


@pytest.mark.parametrize("world_size", [1, 2])
def test_data_loader_yields_each_process_the_plans_micro_batches(small_index, world_size):
    ds = dataset(small_index)
    plan = ramp_plan(ds)
    source = PlanSource(ds, plan, NUM_STEPS)
    cut = plan.with_world(world_size)
    per_process = []
    for rank in range(world_size):
        steps = steps_of(data_loader(source, rank, world_size), cut)
        check_process(steps, ds, cut, rank)
        per_process.append(steps)
    for s in range(NUM_STEPS):
        assert union(per_process, s) == sorted(plan.global_batch(s).tolist())


def test_workers_yield_the_same_records_and_grains_state_round_trips(small_index):
    """With 2 Grain worker processes, rank 1 of 2 reads the same records in the same order, and a loader restored with
    Grain's ``set_state`` after 3 records continues with the uninterrupted run's next ones; a map_dataset pipeline with
    ``mp_prefetch`` workers yields them too, and its state names the same position."""
    ds = dataset(small_index)
    plan = ramp_plan(ds)
    source = PlanSource(ds, plan, NUM_STEPS)
    cut = plan.with_world(2)
    loader = data_loader(source, 1, 2, worker_count=2)
    it = iter(loader)
    head = [next(it) for _ in range(3)]
    state = it.get_state()
    tail = list(it)
    check_process(steps_of(head + tail, cut), ds, cut, 1)
    restored = iter(loader)
    restored.set_state(state)
    again = list(restored)
    assert [e["sample_ids"].tolist() for e in again] == [e["sample_ids"].tolist() for e in tail]
    assert json.loads(state)["worker_count"] == 2
    assert source.position_of_grain_state(state) == {"step": 2, "samples_in_step": 4}  # steps 0, 1 (1 each), 1 of 2
    # the same through a map_dataset pipeline whose 2 workers are Grain's mp_prefetch
    options = grain.MultiprocessingOptions(num_workers=2)
    pipeline = iter(map_dataset(source, 1, 2).to_iter_dataset().mp_prefetch(options))
    head = [next(pipeline) for _ in range(3)]
    state = pipeline.get_state()
    check_process(steps_of(head + list(pipeline), cut), ds, cut, 1)
    assert [w["next_index"] for w in state["iterators_in_use_states"]] == [2, 1]
    assert source.position_of_map_state(state, 1, 2) == {"step": 2, "samples_in_step": 4}
    del it, restored, pipeline
    gc.collect()


@pytest.mark.parametrize("new_world_size", [1, 4])
def test_resume_at_another_process_count_continues_the_global_batches(small_index, new_world_size):
    """Trained 3 steps at 2 processes; resumed at 1 or 4 from the data record (``state_dict``) and from Grain's own
    state: each later step's union over processes is the plan's global batch, each process's micro batches the
    plan's for the new count."""
    ds = dataset(small_index)
    plan = Plan(len(ds), seed=5, global_batch_size=8, micro_batch_size=2)
    source = PlanSource(ds, plan, NUM_STEPS)
    grain_states = []
    for rank in range(2):
        it = iter(data_loader(source, rank, 2))
        steps_of(it, plan.with_world(2), 0, 3)
        grain_states.append(it.get_state())
    saved = source.state_dict(3, world_size=2)
    from_grain = [source.position_of_grain_state(state) for state in grain_states]
    assert from_grain == [{"step": 3, "samples_in_step": 0}] * 2
    cut = plan.with_world(new_world_size)
    for start in (saved, from_grain[0]):
        resumed = PlanSource(dataset(small_index), plan, NUM_STEPS)  # a fresh process's objects
        per_process = []
        for rank in range(new_world_size):
            steps = steps_of(data_loader(resumed, rank, new_world_size, start=start), cut, 3)
            check_process(steps, ds, cut, rank, 3)
            per_process.append(steps)
        for i, s in enumerate(range(3, NUM_STEPS)):
            assert union(per_process, i) == sorted(plan.global_batch(s).tolist())


def test_a_mixture_reads_through_grain_as_the_plan_says(small_index):
    """A MixtureDataset (bestfit and document layouts of one index, weights 1:3) read through Grain's DataLoader by 2
    processes: each element is the mixture plan's micro batch, its fields those the MixtureDataset reads."""
    from detsampler.loader.mixture_dataset import MixtureDataset
    from detsampler.mixture.config import MixtureConfig

    parts = [dataset(small_index, "bestfit"), dataset(small_index, "document")]
    mixture = MixtureConfig(weights=(1, 3), seed=2).build([part.layout for part in parts])
    plan = Plan(source=mixture, global_batch_size=8, micro_batch_size=2)
    mixed = MixtureDataset(parts, plan.stream)
    source = PlanSource(mixed, plan, 3)
    cut = plan.with_world(2)
    for rank in range(2):
        steps = steps_of(data_loader(source, rank, 2), cut, 0, 3)
        for step, elements in enumerate(steps):
            for micro_step, element in enumerate(elements):
                ids = cut.micro_batch(step, micro_step, rank)
                assert element["sample_ids"].tolist() == ids.tolist()
                for name, value in mixed.__getitems__(ids.tolist()).batch.items():
                    assert np.array_equal(element[name], value.numpy()), name
    record = DataRecord.from_json(source.state_dict(1)["data_record"])
    assert record.is_mixture and len(record.indexes) == 2 and record.framework == "grain"


def test_grain_refuses_its_state_in_a_loader_of_another_process_count(small_index):
    """Grain checks ``repr(sampler)`` when it restores its state: the rank, world size and start are in it, so a state
    of process 0 of 2 is refused by a loader of process 0 of 1 (it would name other records), and the step read out of
    the state is what resumes there."""
    ds = dataset(small_index)
    plan = Plan(len(ds), seed=5, global_batch_size=8, micro_batch_size=2)
    source = PlanSource(ds, plan, NUM_STEPS)
    it = iter(data_loader(source, 0, 2))
    steps_of(it, plan.with_world(2), 0, 1)
    state = it.get_state()
    other = iter(data_loader(source, 0, 1))
    with pytest.raises(ValueError, match="Sampler in checkpoint does not match dataloader sampler"):
        other.set_state(state)
    start = source.position_of_grain_state(state)
    first = next(iter(data_loader(source, 0, 1, start=start)))
    assert first["sample_ids"].tolist() == plan.with_world(1).micro_batch(1, 0, 0).tolist()


def test_map_dataset_element_k_is_the_plans_and_its_state_round_trips(small_index):
    """``map_dataset``: element ``k`` of process ``p`` is its ``k``-th micro batch; the MapDataset pipeline's own
    ``{"next_index"}`` state restores mid-run; another process count resumes from the step's state."""
    ds = dataset(small_index)
    plan = ramp_plan(ds)
    source = PlanSource(ds, plan, NUM_STEPS)
    cut = plan.with_world(2)
    per_process = []
    for rank in range(2):
        md = map_dataset(source, rank, 2)
        assert len(md) == len(source) // 2
        steps = steps_of([md[k] for k in range(len(md))], cut)
        check_process(steps, ds, cut, rank)
        per_process.append(steps)
        it = iter(md.to_iter_dataset())
        head = [next(it) for _ in range(3)]
        state = it.get_state()
        assert state == {"next_index": 3}
        assert source.position_of_map_state(state, rank, 2) == {"step": 2, "samples_in_step": 4}
        restored = iter(md.to_iter_dataset())
        restored.set_state(state)
        assert [e["sample_ids"].tolist() for e in restored] == [md[k]["sample_ids"].tolist() for k in range(3, len(md))]
        assert [e["sample_ids"].tolist() for e in head] == [md[k]["sample_ids"].tolist() for k in range(3)]
    one = [steps_of(map_dataset(source, 0, 1, start=source.state_dict(2, world_size=2)), plan.with_world(1), 2)]
    check_process(one[0], ds, plan.with_world(1), 0, 2)
    for i, s in enumerate(range(2, NUM_STEPS)):
        assert union(one, i) == union(per_process, s) == sorted(plan.global_batch(s).tolist())


def test_a_resume_onto_other_data_is_refused(small_index):
    """The data record of ``state_dict`` is checked: another layout over the same index is refused with the library's
    message; a start given as a bare step is not checked (nothing to check against)."""
    ds = dataset(small_index)
    plan = Plan(len(ds), seed=5, global_batch_size=8, micro_batch_size=2)
    saved = PlanSource(ds, plan, NUM_STEPS).state_dict(2)
    concat = dataset(small_index, "concat")
    other = PlanSource(concat, Plan(len(concat), seed=5, global_batch_size=8, micro_batch_size=2), NUM_STEPS)
    with pytest.raises(ValueError, match="refusing to resume from the Grain state"):
        data_loader(other, 0, 1, start=saved)
    with pytest.raises(ValueError, match="not by a detsampler PlanSampler over"):
        other.position_of_grain_state(iter(data_loader(PlanSource(ds, plan, NUM_STEPS), 0, 1)).get_state())


def test_a_state_whose_step_is_not_its_records_is_refused(small_index):
    """Issue 31: a Grain state naming step 7 over the record of step 5 resumed at 7 (torchtitan's loader refuses
    this); so did another samples_in_step, and a record edited by hand (world_size 2 -> 4). Each is refused naming
    the state, the record's value and the state's."""
    ds = dataset(small_index)
    plan = Plan(len(ds), seed=5, global_batch_size=8, micro_batch_size=2)
    source = PlanSource(ds, plan, NUM_STEPS)
    saved = source.state_dict(5)
    with pytest.raises(ValueError, match=r"the Grain state: the record's step 5 is not this checkpoint's step 7"):
        source.resume_position({**saved, "step": 7})
    mid = source.state_dict(2, samples_in_step=4, world_size=2)
    with pytest.raises(ValueError, match=r"the record's samples_in_step 4 is not this checkpoint's 0"):
        source.resume_position({**mid, "samples_in_step": 0})
    edited = json.dumps({**json.loads(saved["data_record"]), "world_size": 4})
    with pytest.raises(ValueError, match=r"the Grain state: the data record fails its seal \(record_sha256\)"):
        source.resume_position({**saved, "data_record": edited})
    assert source.resume_position(saved) == (5, 0) and source.resume_position(mid) == (2, 4)


def test_bad_positions_and_shards_are_refused(small_index):
    ds = dataset(small_index)
    plan = ramp_plan(ds)
    source = PlanSource(ds, plan, NUM_STEPS)
    with pytest.raises(ValueError, match=r"is not divisible by world_size \* micro_batch_size = 4 \* 2 = 8"):
        data_loader(source, 0, 4)  # step 0's batch of 4 cannot be cut for 4 processes of 2
    with pytest.raises(ValueError, match="samples_in_step 2 of step 2 must be a multiple of world_size"):
        data_loader(source, 0, 2, start={"step": 2, "samples_in_step": 2})
    with pytest.raises(ValueError, match=r"Got step 7, this source serves steps \[0, 6\)"):
        data_loader(source, 0, 1, start=7)
    with pytest.raises(ValueError, match=r"Got num_steps 0, num_steps must be an integer >= 1"):
        PlanSource(ds, plan, 0)
    with pytest.raises(ValueError, match="a Batch operation with worker_count=2 stacks each worker's records"):
        data_loader(source, 0, 1, worker_count=2, operations=[grain.transforms.Batch(batch_size=2)])
    for rank, (shard_index, shard_count) in ((1, (0, 2)), (0, (0, 4))):  # 4 shards: every index still falls on rank 0
        options = grain.sharding.ShardOptions(shard_index=shard_index, shard_count=shard_count)
        loader = grain.DataLoader(data_source=source, sampler=PlanSampler(source, rank, 2), shard_options=options)
        with pytest.raises(
            ValueError, match=rf"for records with ShardOptions\(shard_index={shard_index}, shard_count="
        ):
            next(iter(loader))
    sampler = PlanSampler(source, 1, 2)
    with pytest.raises(ValueError, match="for global index 0, which belongs to shard 0: pass shard_options="):
        sampler[0]  # read directly (no Grain loader): the index alone is checked


@pytest.fixture(scope="module")
def bestfit(small_index) -> PackedDataset:
    return dataset(small_index)


@given(data=st.data())
@example(data=None)  # pinned below: a ramp, a skip range, 2 processes stopped mid-step, resumed on 4 (refused) and 1
def test_any_grain_state_resumes_on_any_process_count_with_the_plans_batches(bestfit, data):
    """From any point of a run on ``P`` processes (each ``get_state()`` after ``k`` records), the step read out of
    Grain's state resumes on ``P'`` processes: the records taken before and after it make up every global batch of the
    plan exactly, or the resume is refused when ``P'`` cannot cut the consumed part of the step."""
    if data is None:
        m, ramp, skips, old, new, consumed = 2, [(0, 8), (2, 16)], [(1, 1)], 2, [4, 1], 3
    else:
        m = data.draw(st.integers(1, 3), label="micro_batch_size")
        sizes = data.draw(st.lists(st.integers(1, 3), min_size=1, max_size=3), label="sizes")
        ramp = [(i * 2, 4 * m * k) for i, k in enumerate(sizes)]
        skips = data.draw(skip_ranges(max_step=6, max_ranges=1, max_len=2), label="skip_steps")
        old = data.draw(st.sampled_from([1, 2, 4]), label="processes")
        new = [data.draw(st.sampled_from([1, 2, 4]), label="new processes")]
        consumed = None
    plan = Plan(
        len(bestfit),
        seed=1,
        global_batch_size=ramp[-1][1],
        micro_batch_size=m,
        batch_size_schedule=ramp,
        skip_steps=skips or None,
    )
    source = PlanSource(bestfit, plan, NUM_STEPS)
    per_process = len(source) // old
    if consumed is None:
        consumed = data.draw(st.integers(0, per_process), label="records consumed per process")
    taken, states = [], []
    for rank in range(old):
        it = iter(data_loader(source, rank, old))
        taken += [i for _ in range(consumed) for i in next(it)["sample_ids"].tolist()]
        states.append(source.position_of_grain_state(it.get_state()))
    assert all(state == states[0] for state in states)
    step, samples = states[0]["step"], states[0]["samples_in_step"]
    cut, expected, left = plan.with_world(old), 0, consumed  # the naive model: whole steps, then the micro steps left
    while expected < NUM_STEPS and left >= cut.num_micro_steps(expected):
        left -= cut.num_micro_steps(expected)
        expected += 1
    assert (step, samples) == (expected, left * old * m)
    for processes in new:
        if samples % (processes * m):
            with pytest.raises(ValueError, match="must be a multiple of world_size"):
                data_loader(source, 0, processes, start=states[0])
            continue
        rest = [
            e["sample_ids"].tolist()
            for r in range(processes)
            for e in data_loader(source, r, processes, start=states[0])
        ]
        everything = sorted(taken + [i for ids in rest for i in ids])
        assert everything == sorted(
            plan.global_batch(s)[j] for s in range(NUM_STEPS) for j in range(plan.batch_size(s))
        )


def test_the_saved_data_record_is_audited_by_the_cli(small_index, tmp_path, capsys):
    """``state_dict``'s record saved in a checkpoint directory: ``detsampler show --checkpoint`` reopens the index and
    prints the last trained step's samples, which are the plan's."""
    from detsampler.cli import main

    ds = dataset(small_index)
    plan = Plan(len(ds), seed=5, global_batch_size=8, micro_batch_size=2)
    state = PlanSource(ds, plan, NUM_STEPS).state_dict(3, world_size=2)
    DataRecord.from_json(state["data_record"]).save(tmp_path)
    assert main(["show", "--checkpoint", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "saved at step 3 by grain" in out and "showing its last trained step 2" in out
    shown = sorted(int(i) for i in re.findall(r"position \d+ +sample (\d+)", out))
    assert shown == sorted(plan.global_batch(2).tolist())


def test_grains_checkpoint_handler_saves_a_state_that_resumes_on_another_process_count(small_index, tmp_path):
    """Grain's own Orbax handler (``grain.checkpoint.CheckpointHandler``, no Orbax needed to call it) saves the
    iterator's state as ``process_0-of-1.json``; restored by the handler into a loader of 2 processes it is refused by
    Grain; read for its step, it resumes 2 processes on the plan's global batches."""
    ds = dataset(small_index)
    plan = Plan(len(ds), seed=5, global_batch_size=8, micro_batch_size=2)
    source = PlanSource(ds, plan, NUM_STEPS)
    it = iter(data_loader(source, 0, 1))
    steps_of(it, plan, 0, 2)
    handler = grain.checkpoint.CheckpointHandler()
    handler.save(tmp_path, it)
    saved = tmp_path / "process_0-of-1.json"
    with pytest.raises(ValueError, match="Sampler in checkpoint does not match dataloader sampler"):
        handler.restore(tmp_path, iter(data_loader(source, 0, 2)))
    start = source.position_of_grain_state(saved.read_text())
    assert start == {"step": 2, "samples_in_step": 0}
    resumed = [steps_of(data_loader(source, rank, 2, start=start), plan.with_world(2), 2) for rank in range(2)]
    for i, step in enumerate(range(2, NUM_STEPS)):
        assert union(resumed, i) == sorted(plan.global_batch(step).tolist())


def test_a_balanced_plan_deals_its_one_rank_micro_batches_to_the_processes(small_index):
    """PlanSource numbers the records by the plan cut for one rank; balanced, that deals each step into micro batches
    of near-equal modeled cost, which the processes take in turn: process ``r`` of ``W`` reads micro batches ``r, r +
    W, ...`` of the one-rank deal, and the processes together read the step's global batch (issue 34)."""
    from detsampler.balance import Balance, CostModel, sample_costs

    ds = dataset(small_index)
    plan = Plan(len(ds), seed=3, global_batch_size=16, micro_batch_size=2, balance=Balance(ds.layout, CostModel()))
    one = plan.with_world(1)
    source = PlanSource(ds, plan, NUM_STEPS)
    per_process = []
    for rank in range(2):
        steps = steps_of(data_loader(source, rank, 2), plan.with_world(2))
        for step, elements in enumerate(steps):
            for i, element in enumerate(elements):
                assert element["sample_ids"].tolist() == one.micro_batch(step, 2 * i + rank, 0).tolist()
        per_process.append(steps)
    for s in range(NUM_STEPS):
        assert union(per_process, s) == sorted(plan.global_batch(s).tolist())
    cells = sample_costs(plan.balance, one.stream, one.step_positions(0)).reshape(8, 2).sum(axis=1)
    assert cells.max() / cells.mean() < 1.1  # the one-rank deal: micro batches of near-equal cost


def test_a_position_of_a_rank_outside_the_world_or_of_a_fractional_step_is_refused(small_index):
    """Issue 31 (re-run): `position_of_map_state(state, rank=5, world_size=2)` returned `{"step": 2, "samples_in_step":
    -4}` and rank -1 a position as if valid; a state or start of step 7.9 (or True) resumed at step 7 (1); a Grain state
    whose `last_seen_indices` is empty was `max() arg is an empty sequence`; a negative `next_index` named an internal
    record."""
    ds = dataset(small_index)
    source = PlanSource(ds, ramp_plan(ds), NUM_STEPS)
    assert source.position_of_map_state({"next_index": 3}, 1, 2) == {"step": 2, "samples_in_step": 4}
    for rank in (5, 2, -1, True):
        with pytest.raises(ValueError, match=re.escape(f"Got rank {rank!r}, allowed ranks are in [0, 2)")):
            source.position_of_map_state({"next_index": 3}, rank, 2)
    with pytest.raises(ValueError, match=re.escape("the Grain state's next_index must be an integer >= 0, got -4")):
        source.position_of_map_state({"next_index": -4}, 0, 2)
    state = source.state_dict(2)
    for step in (2.5, True, "2"):
        with pytest.raises(ValueError, match=re.escape(f"the Grain state's step must be an integer, got {step!r}")):
            source.resume_position({**state, "step": step})
        with pytest.raises(ValueError, match=re.escape(f"start's step must be an integer, got {step!r}")):
            data_loader(source, 0, 1, start={"step": step})
    with pytest.raises(ValueError, match=re.escape("start must be a step (an integer) or a state, got 2.5")):
        data_loader(source, 0, 1, start=2.5)
    assert source.resume_position(state) == (2, 0)
    grain_state = json.loads(iter(data_loader(source, 0, 1)).get_state())
    with pytest.raises(ValueError, match="not a Grain DataLoader iterator state"):
        source.position_of_grain_state(json.dumps({**grain_state, "last_seen_indices": {}}))
