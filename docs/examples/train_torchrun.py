"""A data-parallel (FSDP2) training loop fed by detsampler, checkpointed with torch.distributed.checkpoint (DCP).

Run on CPU with two processes, then resume the checkpoint on one:

    torchrun --nproc_per_node=2 docs/examples/train_torchrun.py --ckpt /tmp/ds_ckpt --steps 4 --save-at 1
    torchrun --nproc_per_node=1 docs/examples/train_torchrun.py --ckpt /tmp/ds_ckpt --steps 4 --resume

Each rank prints the sample ids it reads; the global batch of a step is the same whatever the number of ranks.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, Dataset

from detsampler import DeterministicBatchSampler, Plan

SEQ_LEN, VOCAB = 16, 64


class RandomTokens(Dataset):
    """Sample i: SEQ_LEN + 1 tokens drawn from a generator seeded by i (stands in for a PackedDataset)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        tokens = torch.from_numpy(np.random.default_rng(i).integers(0, VOCAB, SEQ_LEN + 1))
        return {"input_ids": tokens[:-1], "labels": tokens[1:], "sample_id": torch.tensor(i)}


class TrainState(Stateful):
    """What DCP saves: model and optimizer (sharded) and the data position, {"step": s, ...}, the same on every rank."""

    def __init__(
        self, model: torch.nn.Module, optim: torch.optim.Optimizer, sampler: DeterministicBatchSampler
    ) -> None:
        self.model, self.optim, self.sampler = model, optim, sampler

    def state_dict(self) -> dict:
        model_sd, optim_sd = get_state_dict(self.model, self.optim)
        return {"model": model_sd, "optim": optim_sd, "data": self.sampler.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        set_state_dict(self.model, self.optim, model_state_dict=state["model"], optim_state_dict=state["optim"])
        self.sampler.load_state_dict(state["data"])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ckpt", required=True)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--save-at", type=int, default=None, help="checkpoint after training this step")
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(VOCAB, 32), torch.nn.Linear(32, VOCAB))
    fully_shard(model)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2)

    dataset = RandomTokens(10_000)
    plan = Plan(len(dataset), seed=0, global_batch_size=8, micro_batch_size=2, world_size=world)
    sampler = DeterministicBatchSampler(plan, rank=rank, stop_step=args.steps)  # stop_step is absolute
    state = {"train": TrainState(model, optim, sampler)}
    if args.resume:
        dcp.load(state, checkpoint_id=args.ckpt)  # calls TrainState.load_state_dict: the sampler resumes at "step"
    loader = DataLoader(dataset, batch_sampler=sampler, num_workers=1)

    for step, micro_batches in sampler.steps(loader):  # a step = plan.num_micro_steps(step) micro batches
        for batch in micro_batches:
            logits = model(batch["input_ids"])
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten())
            (loss / len(micro_batches)).backward()
        optim.step()
        optim.zero_grad()
        ids = torch.cat([b["sample_id"] for b in micro_batches]).tolist()
        print(f"world {world} rank {rank} step {step}: samples {ids}", flush=True)
        if step == args.save_at:
            dcp.save(state, checkpoint_id=args.ckpt)  # saves {"train": {..., "data": {"step": step + 1, ...}}}
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
