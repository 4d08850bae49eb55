"""One rank of a Lightning DDP run over detsampler (tests/integrations/test_lightning.py starts it).

    python -m tests.integrations._lightning_child OUT_DIR MODE [CKPT_PATH] [ACCUMULATE]

MODE: ``full`` trains steps 0-5; ``kill`` exits the process hard at global_step 4 (``step=3.ckpt`` is on disk);
``resume`` fits from CKPT_PATH. Each rank appends ``{"step": s, "ids": [...]}`` per micro batch to
OUT_DIR/ids-<world>-<rank>.jsonl.
"""

from __future__ import annotations

import json
import os
import sys

import lightning.pytorch as pl
import torch
from torch.utils.data import Dataset

from detsampler import Plan
from detsampler.integrations.lightning import DetsamplerDataModule

NUM_SAMPLES, MAX_STEPS = 64, 6
PLAN = Plan(NUM_SAMPLES, seed=2, global_batch_size=8, micro_batch_size=8)  # re-cut for each run (world, accumulation)


class Numbered(Dataset):
    def __len__(self) -> int:
        return NUM_SAMPLES

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([i, i % 7], dtype=torch.float32)


class Tiny(pl.LightningModule):
    def __init__(self, ids_path: str) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.ids_path = ids_path

    def training_step(self, batch, batch_idx):
        with open(self.ids_path, "a") as f:
            f.write(json.dumps({"step": self.trainer.global_step, "ids": batch[:, 0].long().tolist()}) + "\n")
        return torch.nn.functional.mse_loss(self.layer(batch[:, 1:] / 7), batch[:, :1] / 64)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class KillAfterStep(pl.Callback):
    def on_train_batch_end(self, trainer, *args):
        if trainer.global_step == 4:
            os._exit(0)  # NOTE: no cleanup, no save: as killed


def main() -> None:
    out, mode = sys.argv[1], sys.argv[2]
    ckpt = sys.argv[3] if len(sys.argv) > 3 and sys.argv[3] != "-" else None
    accumulate = int(sys.argv[4]) if len(sys.argv) > 4 else 2
    world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    os.makedirs(out, exist_ok=True)
    pl.seed_everything(0, verbose=False)
    checkpoints = pl.callbacks.ModelCheckpoint(
        dirpath=os.path.join(out, "ckpt"), every_n_train_steps=3, save_top_k=-1, filename="{step}"
    )
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=world,
        strategy="ddp" if world > 1 else "auto",
        max_steps=MAX_STEPS,
        accumulate_grad_batches=accumulate,
        use_distributed_sampler=False,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[checkpoints] + ([KillAfterStep()] if mode == "kill" else []),
    )
    trainer.fit(
        Tiny(os.path.join(out, f"ids-{world}-{rank}.jsonl")),
        datamodule=DetsamplerDataModule(Numbered(), PLAN),
        ckpt_path=ckpt,
    )
    print(f"rank {rank} of {world}: trained to step {trainer.global_step}", flush=True)


if __name__ == "__main__":
    try:
        main()
    finally:
        # NOTE: gloo's threads stopped before the interpreter's teardown, which otherwise can abort the process after it
        # trained ("terminate called without an active exception", exit -6): seen once in a fresh-clone make test.
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
