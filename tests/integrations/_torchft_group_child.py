"""One rank of a torchft replica group of 2 data-parallel ranks, reading a real PackedDataset
(tests/integrations/test_torchft.py starts 2 of them per group).

    python -m tests.integrations._torchft_group_child LIGHTHOUSE REPLICA GROUP_RANK GROUP_PORT OUT_DIR INDEX_DIR

The group's ranks share a TCPStore on GROUP_PORT (rank 0 hosts it): torchft's Manager uses it, and so does the group's
own gloo process group, which averages the gradients within the group before torchft averages them across the groups
(``Manager.allreduce``: see tests/integrations/_torchft_child.py for why not its DDP). The data: the bestfit
PackedDataset of tests/integrations/_packed.py (8 tokens) and :func:`plan_of` (10 samples a step); the model: a float64
embedding and a linear head, each sample's loss its token cross-entropy summed over its labels and divided by the
sequence length, summed over the share and scaled by ``loss_scale``. Each attempt appends ``{"replica", "group_rank",
"step", "rank", "participants", "ids" (the ``sample_ids`` of the batch the dataset returned), "committed", "params",
"grad"}`` to OUT_DIR/log-REPLICA-GROUP_RANK.jsonl. The test paces the groups with hold files (``hold``), and they
stop at the step written in OUT_DIR/stop.
"""

from __future__ import annotations

import json
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torchft import Manager, Optimizer, ProcessGroupGloo

from detsampler.integrations.torchft import FaultTolerantSampler
from detsampler.plan import Plan
from tests.integrations._packed import SEQ_LEN, data
from tests.integrations._torchft_child import hold, stop_step
from tests.integrations.launch import exit_without_teardown

GROUP_WORLD_SIZE, GLOBAL_BATCH = 2, 10


def plan_of(num_samples: int) -> Plan:
    return Plan(num_samples, seed=1, global_batch_size=GLOBAL_BATCH, micro_batch_size=GLOBAL_BATCH)


def make_model(vocab_size: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Embedding(vocab_size, 4), nn.Linear(4, vocab_size)).double()


def sample_losses(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Each sample's loss: its tokens' cross-entropy, summed over the labels the layout keeps, over the sequence length
    (a constant: a sample whose labels are all masked weighs 0)."""
    logits = model(batch["input_ids"])
    per_token = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=-100, reduction="none")
    return per_token.view(len(logits), SEQ_LEN).sum(1) / SEQ_LEN


def main(lighthouse: str, replica: int, group_rank: int, port: int, out: Path, index_dir: str) -> None:
    store = dist.TCPStore("127.0.0.1", port, is_master=group_rank == 0, wait_for_workers=False)
    dist.init_process_group(
        "gloo", store=dist.PrefixStore("group", store), rank=group_rank, world_size=GROUP_WORLD_SIZE
    )
    dataset = data(index_dir)
    model = make_model(dataset.index.vocab_size)
    inner = torch.optim.SGD(model.parameters(), lr=0.5)
    manager = Manager(
        pg=ProcessGroupGloo(timeout=timedelta(seconds=10)),
        min_replica_size=1,
        load_state_dict=lambda sd: (model.load_state_dict(sd["model"]), inner.load_state_dict(sd["optim"])),
        state_dict=lambda: {"model": model.state_dict(), "optim": inner.state_dict()},
        replica_id=f"group{replica}",
        store_addr="127.0.0.1",
        store_port=port,
        rank=group_rank,
        world_size=GROUP_WORLD_SIZE,
        lighthouse_addr=lighthouse,
        hostname="127.0.0.1",
        timeout=timedelta(seconds=10),
        quorum_timeout=timedelta(seconds=30),
        connect_timeout=timedelta(seconds=10),
    )
    optimizer = Optimizer(manager, inner)
    sampler = FaultTolerantSampler(manager, plan_of(len(dataset)), group_rank, GROUP_WORLD_SIZE)
    log = open(out / f"log-{replica}-{group_rank}.jsonl", "a")
    while manager.current_step() < stop_step(out):
        hold(out, f"{replica}-{group_rank}", manager.current_step())
        optimizer.zero_grad()  # start_quorum
        share = sampler.share()
        params = [p.detach().flatten().tolist() for p in model.parameters()]
        batch = dataset.get_batch(share.sample_ids)  # empty while the group heals
        (sample_losses(model, batch).sum() * share.loss_scale).backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)  # the group's own data parallelism: the mean over its ranks
            p.grad /= GROUP_WORLD_SIZE
            manager.allreduce(p.grad).wait()  # torchft: the mean over the participating groups
        grad = [p.grad.flatten().tolist() for p in model.parameters()]
        optimizer.step()
        row = {
            "replica": replica,
            "group_rank": group_rank,
            "step": share.step,
            "rank": share.participating_rank,
            "participants": share.num_participants,
            "contributors": list(share.contributors),
            "ids": batch["sample_ids"].tolist(),
            "committed": manager.current_step() == share.step + 1,
            "params": params,
            "grad": grad,
        }
        log.write(json.dumps(row) + "\n")
        log.flush()
        time.sleep(0.05)
    log.close()
    manager.shutdown(wait=False)
    dist.destroy_process_group()


if __name__ == "__main__":
    lighthouse, replica, group_rank, port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    exit_without_teardown(lambda: main(lighthouse, replica, group_rank, port, Path(sys.argv[5]), sys.argv[6]))
