"""One torchft replica group (one process, gloo) training on detsampler's shares (tests/integrations/test_torchft.py).

    python -m tests.integrations._torchft_child LIGHTHOUSE REPLICA OUT_DIR LIFE [KILL_STEP]

NOTE: the gradients are averaged by ``Manager.allreduce`` per parameter, not by ``torchft.DistributedDataParallel``:
in torchft 0.2.0 its comm hook asserts (``assert fut._fut`` in ``ddp.py``) when the allreduce fails because a peer
died, which crashes the surviving groups instead of failing their commit (``_ManagedWork.wait`` reports the error and
returns before it sets up the future the hook reads).

The plan: :func:`plan_of` (7 samples a step, so that 2 and 3 groups get unequal shares); the model: a float64
``Linear(2, 1)`` on features ``[id / N, 1]`` with target ``sin(id)``, the squared error summed over the share and scaled
by ``loss_scale``. Each attempt at a step appends ``{"replica", "life", "step", "rank", "participants", "contributors",
"ids", "committed", "params", "grad"}`` to OUT_DIR/log-REPLICA-LIFE.jsonl (``params`` before the step, ``grad`` after
torchft's allreduce). With KILL_STEP, the group writes OUT_DIR/ready-REPLICA at the first step >= KILL_STEP that 3
groups take part in, between the quorum and the backward pass, and sleeps there (the test SIGKILLs it). The test paces
the groups with hold files (:func:`hold`), and they stop at the step written in OUT_DIR/stop (MAX_STEPS until then).
"""

from __future__ import annotations

import json
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torchft import Manager, Optimizer, ProcessGroupGloo

from detsampler.integrations.torchft import FaultTolerantSampler
from detsampler.plan import Plan
from tests.integrations.launch import exit_without_teardown

NUM_SAMPLES, GLOBAL_BATCH, MAX_STEPS = 60, 7, 100  # MAX_STEPS: a bound; the test writes OUT/stop


def plan_of() -> Plan:
    return Plan(num_samples=NUM_SAMPLES, seed=5, global_batch_size=GLOBAL_BATCH, micro_batch_size=GLOBAL_BATCH)


def features(ids) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.as_tensor(ids, dtype=torch.float64)
    return torch.stack([ids / NUM_SAMPLES, torch.ones_like(ids)], dim=1), torch.sin(ids)[:, None]


def stop_step(out: Path) -> int:
    try:
        return int((out / "stop").read_text())
    except (FileNotFoundError, ValueError):
        return MAX_STEPS


def hold(out: Path, name: str, step: int) -> None:
    """While OUT/hold-NAME names a step <= ``step``: write OUT/held-NAME-STEP once and wait for the test to remove the
    hold file (before the step's quorum, so that the test decides which groups meet in it)."""
    gate = out / f"hold-{name}"
    try:
        if step < int(gate.read_text()):
            return
    except (FileNotFoundError, ValueError):
        return
    (out / f"held-{name}-{step}").write_text("")
    while gate.exists():
        time.sleep(0.02)


def main(lighthouse: str, replica: int, out: Path, life: int, kill_step: int | None) -> None:
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    torch.manual_seed(0)
    model = nn.Linear(2, 1).double()
    inner = torch.optim.SGD(model.parameters(), lr=0.5)
    manager = Manager(
        pg=ProcessGroupGloo(timeout=timedelta(seconds=5)),
        min_replica_size=1,
        load_state_dict=lambda sd: (model.load_state_dict(sd["model"]), inner.load_state_dict(sd["optim"])),
        state_dict=lambda: {"model": model.state_dict(), "optim": inner.state_dict()},
        replica_id=f"group{replica}",
        store_addr="127.0.0.1",
        store_port=store.port,
        rank=0,
        world_size=1,
        lighthouse_addr=lighthouse,
        hostname="127.0.0.1",
        timeout=timedelta(seconds=5),
        quorum_timeout=timedelta(seconds=30),
        connect_timeout=timedelta(seconds=10),
    )
    optimizer = Optimizer(manager, inner)
    sampler = FaultTolerantSampler(manager, plan_of())
    log = open(out / f"log-{replica}-{life}.jsonl", "a")
    while manager.current_step() < stop_step(out):
        hold(out, f"{replica}-{life}", manager.current_step())
        optimizer.zero_grad()  # start_quorum
        share = sampler.share()
        params = [p.detach().flatten().tolist() for p in model.parameters()]
        if kill_step is not None and share.step >= kill_step and share.num_participants == 3:
            (out / f"ready-{replica}").write_text(str(share.step))
            time.sleep(120)  # killed here, mid-step: the quorum holds this group, its gradient never comes
        x, y = features(share.sample_ids)
        loss = ((model(x) - y) ** 2).sum() * share.loss_scale
        loss.backward()
        for p in model.parameters():  # torchft's average over the participating groups (a failure: no commit)
            manager.allreduce(p.grad).wait()
        grad = [p.grad.flatten().tolist() for p in model.parameters()]
        optimizer.step()  # should_commit: the step advances only on a commit
        row = {
            "replica": replica,
            "life": life,
            "step": share.step,
            "rank": share.participating_rank,
            "participants": share.num_participants,
            "contributors": list(share.contributors),
            "ids": share.sample_ids.tolist(),
            "committed": manager.current_step() == share.step + 1,
            "params": params,
            "grad": grad,
        }
        log.write(json.dumps(row) + "\n")
        log.flush()
        time.sleep(0.05)
    log.close()
    manager.shutdown(wait=False)


if __name__ == "__main__":
    lighthouse, replica, out, life = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4])
    kill_step = int(sys.argv[5]) if len(sys.argv) > 5 else None
    exit_without_teardown(lambda: main(lighthouse, replica, out, life, kill_step))
