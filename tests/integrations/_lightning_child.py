"""One rank of a Lightning DDP run over detsampler (tests/integrations/test_lightning.py starts it).

    python -m tests.integrations._lightning_child INDEX_DIR OUT_DIR MODE [CKPT_PATH] [ACCUMULATE] [SEED]

The data: a PackedDataset of the index at INDEX_DIR (bestfit, 8 tokens), the plan of seed SEED (2 by default); the
model: a tiny LlamaForCausalLM trained by :class:`LitLM`, the ``training_step`` of docs/integrations.md. MODE: ``full``
trains steps 0-5; ``kill`` exits the process hard at global_step 4 (``step=3.ckpt`` is on disk); ``resume`` fits from
CKPT_PATH. Each rank appends ``{"step": s, "ids": [...]}`` per micro batch to OUT_DIR/ids-<world>-<rank>.jsonl.
"""

from __future__ import annotations

import json
import os
import sys

import lightning.pytorch as L
import torch
import torch.nn.functional as F
from transformers import LlamaForCausalLM

from detsampler.integrations.lightning import DetsamplerDataModule
from tests.integrations._packed import SEQ_LEN, data, plan_of
from tests.integrations.launch import exit_without_teardown
from tests.tiny_llama import tiny_llama

MAX_STEPS = 6
SEED = 2


class LitLM(L.LightningModule):
    def __init__(self, model):  # a causal LM returning .logits (transformers' LlamaForCausalLM here)
        super().__init__()
        self.model = model

    def training_step(self, batch, batch_idx):
        # labels are already the next token, -100 where the layout masks: no shift here
        logits = self.model(
            input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False
        ).logits  # restarting positions (bestfit): transformers masks attention per document
        return F.cross_entropy(logits.flatten(0, 1).float(), batch["labels"].flatten(), ignore_index=-100)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def llama(vocab_size: int) -> LlamaForCausalLM:
    return tiny_llama(vocab_size, max_position_embeddings=SEQ_LEN)


class Recording(LitLM):
    def __init__(self, model, ids_path: str) -> None:
        super().__init__(model)
        self.ids_path = ids_path

    def training_step(self, batch, batch_idx):
        with open(self.ids_path, "a") as f:
            f.write(json.dumps({"step": self.trainer.global_step, "ids": batch["sample_ids"].tolist()}) + "\n")
        return super().training_step(batch, batch_idx)


class KillAfterStep(L.Callback):
    def on_train_batch_end(self, trainer, *args):
        if trainer.global_step == 4:
            os._exit(0)  # NOTE: no cleanup, no save: as killed


def main() -> None:
    index_dir, out, mode = sys.argv[1:4]
    ckpt = sys.argv[4] if len(sys.argv) > 4 and sys.argv[4] != "-" else None
    accumulate = int(sys.argv[5]) if len(sys.argv) > 5 else 2
    seed = int(sys.argv[6]) if len(sys.argv) > 6 else SEED
    world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    os.makedirs(out, exist_ok=True)
    L.seed_everything(0, verbose=False)
    dataset = data(index_dir)
    checkpoints = L.callbacks.ModelCheckpoint(
        dirpath=os.path.join(out, "ckpt"), every_n_train_steps=3, save_top_k=-1, filename="{step}"
    )
    trainer = L.Trainer(
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
        Recording(llama(dataset.index.vocab_size), os.path.join(out, f"ids-{world}-{rank}.jsonl")),
        datamodule=DetsamplerDataModule(dataset, plan_of(dataset, seed, micro_batch_size=8)),
        ckpt_path=ckpt,
    )
    print(f"rank {rank} of {world}: trained to step {trainer.global_step}", flush=True)


if __name__ == "__main__":
    exit_without_teardown(main)
