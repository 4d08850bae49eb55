"""torchft (0.2.0), real: its lighthouse on loopback, replica groups as processes over gloo, one SIGKILLed mid-step and
restarted; every committed step trains exactly the plan's global batch. And the split itself, by property."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st
from torchft.coordination import LighthouseServer
from torchft.data import DistributedSampler as TorchftDistributedSampler

from detsampler.integrations.torchft import FaultTolerantSampler, ReplicaShare, replica_share
from tests.integrations._torchft_child import GLOBAL_BATCH, features, plan_of

ROOT = Path(__file__).resolve().parents[2]
KILL_STEP = 4


# -- the split, pure
# ----------------------------------------------------------------------------------------------------


@given(size=st.integers(0, 40), group_world_size=st.integers(1, 4), data=st.data())
@example(size=7, group_world_size=1, data=None)
@example(size=2, group_world_size=2, data=None)  # fewer samples than shares: some are empty
def test_the_shares_of_the_contributors_partition_the_global_batch_in_order(size, group_world_size, data):
    """Whatever the number of contributors of each group rank's column (a group heals for one group rank and not
    another at step 0 with ``init_sync``), the shares are the global batch, in order."""
    batch = np.arange(100, 100 + size, dtype=np.int64)
    counts = (
        [3] * group_world_size
        if data is None
        else data.draw(st.lists(st.integers(1, 5), min_size=group_world_size, max_size=group_world_size))
    )
    shares = [
        replica_share(batch, c, counts[r], r, group_world_size)
        for r in range(group_world_size)
        for c in range(counts[r])
    ]
    assert np.array_equal(np.concatenate(shares), batch)
    for r in range(group_world_size):
        lengths = [len(replica_share(batch, c, counts[r], r, group_world_size)) for c in range(counts[r])]
        assert max(lengths) - min(lengths) <= 1


def test_a_group_that_does_not_contribute_reads_nothing_and_weighs_nothing():
    assert replica_share(np.arange(7), None, 2).size == 0
    assert ReplicaShare(3, np.arange(0), None, 2, (0, 1), 1, 7).loss_scale == 0.0
    assert ReplicaShare(3, np.arange(0), 1, 2, (0,), 1, 7).loss_scale == 0.0  # participating, but healing
    assert ReplicaShare(3, np.arange(4), 0, 2, (0, 1), 2, 7).loss_scale == 4 / 7


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((3, 3, 0, 1), "Got contributor 3, allowed values are in [0, 3)"),
        ((-1, 3, 0, 1), "Got contributor -1"),
        ((0, 0, 0, 1), "num_contributors must be an integer >= 1, got 0"),
        ((0, 2, 2, 2), "Got group_rank 2, allowed values are in [0, 2)"),
        ((0, 2, 0, 0), "group_world_size must be an integer >= 1, got 0"),
        ((0.0, 2, 0, 1), "Got contributor 0.0"),
    ],
)
def test_a_rank_outside_its_world_is_refused(args, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        replica_share(np.arange(7), *args)


def test_a_balanced_plan_is_refused():
    """The quorum's groups change from step to step; a balanced plan deals each step for a fixed world size."""
    from detsampler.balance import Balance
    from detsampler.layout import LayoutConfig, make_layout
    from detsampler.plan import Plan

    layout = make_layout(LayoutConfig(kind="bestfit", seq_len=16), np.arange(1, 80))
    plan = Plan(layout.num_samples, 0, 8, 2, balance=Balance(layout))
    with pytest.raises(ValueError, match=r"FaultTolerantSampler splits each step among the replica groups .* balance"):
        FaultTolerantSampler(None, plan)


def test_a_share_before_the_quorum_is_refused(tmp_path):
    """``share()`` before ``start_quorum()``: torchft's manager reports 0 participants; refused, not an empty share."""
    from datetime import timedelta

    import torch.distributed as dist
    from torchft import Manager, ProcessGroupGloo

    lighthouse = LighthouseServer(bind="127.0.0.1:0", min_replicas=1)
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    manager = Manager(
        pg=ProcessGroupGloo(),
        min_replica_size=1,
        load_state_dict=None,
        state_dict=None,
        replica_id="solo",
        store_addr="127.0.0.1",
        store_port=store.port,
        rank=0,
        world_size=1,
        lighthouse_addr=lighthouse.address(),
        hostname="127.0.0.1",
        connect_timeout=timedelta(seconds=10),
    )
    try:
        with pytest.raises(RuntimeError, match=r"call share\(\) after manager.start_quorum\(\)"):
            FaultTolerantSampler(manager, plan_of()).share()
    finally:
        manager.shutdown(wait=False)
        lighthouse.shutdown()


def test_torchfts_own_sampler_loses_the_slice_of_a_group_that_is_down():
    """torchft's ``DistributedSampler`` (meta-pytorch/torchft#186, #292): a fixed slice per group; with group 2 of 3
    down, its third of the data is never read and each step's global batch shrinks from 3 to 2 group batches."""
    dataset = list(range(30))
    read = {
        g: list(TorchftDistributedSampler(dataset, replica_rank=g, num_replica_groups=3, group_rank=0, num_replicas=1))
        for g in range(3)
    }
    alive = read[0] + read[1]
    assert len(alive) == 20 and set(alive).isdisjoint(read[2]) and len(read[2]) == 10


# -- the real thing: 3 replica groups, one killed and restarted
# -----------------------------------------------------------------------


def _start(lighthouse: str, replica: int, out: Path, life: int, *extra: str) -> subprocess.Popen:
    """A replica group of one process (tests/integrations/_torchft_child.py), its output in OUT/out-REPLICA-LIFE.txt."""
    args = [lighthouse, str(replica), str(out), str(life), *extra]
    return _spawn("tests.integrations._torchft_child", args, out / f"out-{replica}-{life}.txt")


def _spawn(module: str, args: list[str], output: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", RUST_LOG="warn")
    with open(output, "w") as sink:
        return subprocess.Popen(
            [sys.executable, "-m", module, *args], cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT
        )


def _rows(out: Path) -> list[dict]:
    return [json.loads(line) for f in sorted(out.glob("log-*.jsonl")) for line in f.read_text().splitlines()]


def _wait_for(condition, procs, out: Path, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        failed = [p for p in procs if p.poll() not in (None, 0)]
        if failed or time.monotonic() > deadline:
            tails = "\n".join(f"--- {f.name}\n{f.read_text()[-3000:]}" for f in sorted(out.glob("out-*.txt")))
            raise AssertionError(f"timed out or a group failed waiting for {what}:\n{tails}")
        time.sleep(0.1)


def _reference_gradient(params: list[list[float]], ids: np.ndarray) -> list[list[float]]:
    """The mean squared-error gradient of the whole global batch on one process (what every committed step should
    apply, whatever the split)."""
    model = torch.nn.Linear(2, 1).double()
    with torch.no_grad():
        model.weight.copy_(torch.tensor(params[0], dtype=torch.float64).view(1, 2))
        model.bias.copy_(torch.tensor(params[1], dtype=torch.float64))
    x, y = features(ids)
    ((model(x) - y) ** 2).mean().backward()
    return [model.weight.grad.flatten().tolist(), model.bias.grad.flatten().tolist()]


def _held(out: Path, name: str, step: int) -> bool:
    """Whether the process NAME waits at a step >= ``step`` (tests/integrations/_torchft_child.py: ``hold``)."""
    return any(int(f.name.rsplit("-", 1)[1]) >= step for f in out.glob(f"held-{name}-*"))


def _hold(out: Path, names: list[str], step: int) -> None:
    for name in names:
        (out / f"hold-{name}").write_text(str(step))


def _release(out: Path, names: list[str]) -> None:
    for name in names:
        (out / f"hold-{name}").unlink()


@pytest.mark.slow
def test_a_killed_and_restarted_group_loses_and_repeats_nothing(tmp_path):
    out, first = tmp_path, ["0-0", "1-0", "2-0"]  # hold names: group-life
    lighthouse = LighthouseServer(bind="127.0.0.1:0", min_replicas=1, join_timeout_ms=3000, heartbeat_timeout_ms=1500)
    procs: list[subprocess.Popen] = []
    try:
        address = lighthouse.address()
        _hold(out, first, 0)  # the three start together
        procs += [_start(address, 0, out, 0), _start(address, 1, out, 0), _start(address, 2, out, 0, str(KILL_STEP))]
        _wait_for(lambda: all(_held(out, n, 0) for n in first), procs, out, 60, "the 3 groups to start")
        _release(out, first)
        _wait_for(lambda: (out / "ready-2").exists(), procs, out, 60, "group 2 to reach the kill step")
        killed_at = int((out / "ready-2").read_text())
        _hold(out, ["0-0", "1-0"], killed_at + 2)  # the survivors train 2 steps alone, then wait for the restart
        _hold(out, ["2-1"], 0)
        procs[2].send_signal(signal.SIGKILL)  # mid-step: it took part in the quorum, its gradient never comes
        procs[2].wait(timeout=10)
        procs.append(_start(address, 2, out, 1))
        rejoin = ["0-0", "1-0", "2-1"]
        _wait_for(
            lambda: _held(out, "0-0", killed_at + 2) and _held(out, "1-0", killed_at + 2) and _held(out, "2-1", 0),
            procs[:2] + procs[3:],
            out,
            60,
            "the survivors and the restarted group",
        )
        (out / "stop").write_text(str(killed_at + 6))
        _release(out, rejoin)
        for p in procs[:2] + procs[3:]:
            assert p.wait(timeout=60) == 0, [f.read_text()[-3000:] for f in sorted(out.glob("out-*.txt"))]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        lighthouse.shutdown()

    rows = _rows(out)
    plan = plan_of()
    for r in sorted(rows, key=lambda r: (r["step"], r["committed"], r["replica"])):  # docs/usage.md, "Elastic"
        who = f"group {r['replica']}{' (restarted)' if r['life'] else ''}"
        rank = "behind" if r["rank"] is None else f"rank {r['rank']} of {r['participants']}"
        rank += "" if r["rank"] in r["contributors"] else ", heals"
        print(f"step {r['step']:2d}  {who:20s} {rank:20s} {'committed' if r['committed'] else 'failed':9s}  {r['ids']}")
    committed = defaultdict(list)
    for r in rows:
        if r["committed"] and r["rank"] is not None:
            committed[r["step"]].append(r)
    last = max(committed)
    assert sorted(committed) == list(range(last + 1))  # every step up to the last committed, none skipped
    for step, group_rows in committed.items():
        # nothing lost, nothing trained twice: the committed shares of the step are the plan's global batch, exactly
        ids = Counter(i for r in group_rows for i in r["ids"])
        assert ids == Counter(plan.global_batch(step).tolist()), step
        assert sum(ids.values()) == GLOBAL_BATCH
        assert sorted(r["rank"] for r in group_rows) == list(range(group_rows[0]["participants"]))
        # the groups agree on the model, and the averaged gradient is the whole batch's mean, whatever the shares
        assert all(r["params"] == group_rows[0]["params"] for r in group_rows)
        expected = _reference_gradient(group_rows[0]["params"], plan.global_batch(step))
        for r in group_rows:
            np.testing.assert_allclose(np.concatenate(r["grad"]), np.concatenate(expected), rtol=1e-12, atol=1e-14)

    # step 0 with init_sync: every group but one heals although it keeps a participating rank (torchft zeroes its
    # gradient): it reads nothing and the one contributor reads the whole batch
    assert any(r["rank"] is not None and r["rank"] not in r["contributors"] and r["ids"] == [] for r in committed[0])
    participants = {step: rs[0]["participants"] for step, rs in committed.items()}
    # the kill: group 2 held the quorum of step killed_at; the others' commit failed and the step was trained again,
    # on the same samples, by the next quorum of the survivors (both, or one while the other was still timing out and
    # healed at the step after); the restarted group 2 healed, then took part again
    failed = [r for r in rows if r["step"] == killed_at and not r["committed"] and r["replica"] != 2]
    assert failed and all(r["participants"] == 3 for r in failed)
    assert participants[killed_at] < 3 and 3 in {participants[s] for s in range(killed_at + 3, last + 1)}
    assert not any(r["committed"] and r["step"] >= killed_at for r in rows if r["replica"] == 2 and r["life"] == 0)


def _start_group(lighthouse: str, replica: int, out: Path, index_dir: str) -> list[subprocess.Popen]:
    """A replica group of 2 ranks (tests/integrations/_torchft_group_child.py), output in OUT/out-REPLICA-RANK.txt."""
    from tests.integrations.launch import free_port

    port = str(free_port())
    return [
        _spawn(
            "tests.integrations._torchft_group_child",
            [lighthouse, str(replica), str(rank), port, str(out), index_dir],
            out / f"out-{replica}-{rank}.txt",
        )
        for rank in range(2)
    ]


@pytest.mark.slow
def test_groups_of_two_ranks_read_the_plan_through_a_packed_dataset(tmp_path, small_index):
    """2 replica groups of 2 data-parallel ranks, a real PackedDataset: group 1 joins after group 0 has trained alone
    (it heals: its ranks read empty batches), then each committed step's 4 shares are the plan's global batch."""
    from tests.integrations._packed import data
    from tests.integrations._torchft_group_child import GLOBAL_BATCH as BATCH
    from tests.integrations._torchft_group_child import make_model, plan_of, sample_losses

    out, index_dir = tmp_path, str(small_index.path)
    lighthouse = LighthouseServer(bind="127.0.0.1:0", min_replicas=1, join_timeout_ms=3000, heartbeat_timeout_ms=1500)
    procs: list[subprocess.Popen] = []

    def start_group(replica: int) -> None:
        procs.extend(_start_group(lighthouse.address(), replica, out, index_dir))

    names = ["0-0", "0-1", "1-0", "1-1"]  # hold names: group-rank
    try:
        # NOTE: a group that heartbeats without asking for a quorum blocks the others' (torchft's lighthouse wants more
        # than half of the heartbeating groups), so group 1 starts only once group 0 waits at step 2
        _hold(out, names, 2)
        _hold(out, names[2:], 0)
        start_group(0)
        _wait_for(lambda: all(_held(out, n, 2) for n in names[:2]), procs, out, 90, "group 0 to train 2 steps alone")
        start_group(1)
        _wait_for(lambda: all(_held(out, n, 0) for n in names[2:]), procs, out, 90, "group 1 to start")
        (out / "stop").write_text("6")
        _release(out, names)
        for p in procs:
            assert p.wait(timeout=60) == 0, [f.read_text()[-3000:] for f in sorted(out.glob("out-*.txt"))]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        lighthouse.shutdown()

    dataset = data(index_dir)
    plan = plan_of(len(dataset))
    rows = _rows(out)
    committed = defaultdict(list)
    for r in rows:
        if r["committed"] and r["rank"] is not None:
            committed[r["step"]].append(r)
    assert sorted(committed) == list(range(max(committed) + 1))
    assert any(r["rank"] is None and r["ids"] == [] for r in rows if r["replica"] == 1)  # group 1 healed: read nothing
    seen = set()
    for step, group_rows in committed.items():
        participants = group_rows[0]["participants"]
        seen.add(participants)
        assert sorted((r["rank"], r["group_rank"]) for r in group_rows) == [
            (p, g) for p in range(participants) for g in range(2)
        ]
        ids = Counter(i for r in group_rows for i in r["ids"])
        assert ids == Counter(plan.global_batch(step).tolist()) and sum(ids.values()) == BATCH, step
        assert all(r["params"] == group_rows[0]["params"] and r["grad"] == group_rows[0]["grad"] for r in group_rows)
        model = make_model(dataset.index.vocab_size)
        with torch.no_grad():
            for p, values in zip(model.parameters(), group_rows[0]["params"]):
                p.copy_(torch.tensor(values, dtype=torch.float64).view_as(p))
        sample_losses(model, dataset.get_batch(plan.global_batch(step))).mean().backward()
        expected = np.concatenate([p.grad.flatten().numpy() for p in model.parameters()])
        np.testing.assert_allclose(np.concatenate(group_rows[0]["grad"]), expected, rtol=1e-10, atol=1e-13)
    assert seen == {1, 2}


@pytest.mark.slow
def test_init_sync_at_step_0_with_two_ranks_per_group_is_refused(tmp_path, small_index):
    """2 groups of 2 ranks start together with torchft's default ``init_sync=True``: torchft heals group rank r of each
    group from group r % 2, so each group's data would count for one of its ranks only; every rank refuses at step 0,
    before training."""
    out, names = tmp_path, ["0-0", "0-1", "1-0", "1-1"]
    lighthouse = LighthouseServer(bind="127.0.0.1:0", min_replicas=1, join_timeout_ms=3000, heartbeat_timeout_ms=1500)
    procs: list[subprocess.Popen] = []
    try:
        _hold(out, names, 0)
        for replica in range(2):
            procs += _start_group(lighthouse.address(), replica, out, str(small_index.path))
        _wait_for(lambda: all(_held(out, n, 0) for n in names), procs, out, 90, "both groups")
        (out / "stop").write_text("1")  # were step 0 not refused, the groups would stop after it
        _release(out, names)
        codes = [p.wait(timeout=60) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        lighthouse.shutdown()
    assert codes == [1, 1, 1, 1]
    for f in sorted(out.glob("out-*.txt")):
        assert "RuntimeError: torchft heals 1 of the 2 replica groups at step 0 (init_sync=True)" in f.read_text(), f
    assert not list(out.glob("log-*.jsonl")) or all(not f.read_text() for f in out.glob("log-*.jsonl"))
