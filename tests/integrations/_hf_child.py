"""One rank of a transformers.Trainer run over detsampler (tests/integrations/test_hf_trainer.py starts it).

    python -m tests.integrations._hf_child INDEX_DIR OUT_DIR MODE [RESUME_FROM] [GRAD_ACCUM] [SEED]

The data: a PackedDataset of the index at INDEX_DIR (bestfit, 8 tokens), the plan of seed SEED (1 by default), through
the integration's CausalLMCollator (which also passes the sample ids on). MODE: ``full`` trains steps 0-5 (and first
checks that the naive ``accelerator.prepare`` is refused); ``kill`` exits the process hard at global_step 4
(checkpoint-3 is on disk); ``resume`` resumes from RESUME_FROM. Each rank appends ``{"step": s, "ids": [...]}`` per
micro batch to OUT_DIR/ids-<world>-<rank>.jsonl as it trains.
"""

from __future__ import annotations

import json
import os
import sys

import torch
from torch.utils.data import DataLoader, Dataset
from transformers import TrainerCallback, TrainingArguments

from detsampler import DeterministicBatchSampler
from detsampler.integrations.hf import CausalLMCollator, DetsamplerTrainer
from tests.integrations._packed import SEQ_LEN, data, plan_of
from tests.integrations.launch import exit_without_teardown
from tests.tiny_llama import tiny_llama

MAX_STEPS = 6
SEED = 1


class TaggingCollator(CausalLMCollator):
    def __call__(self, samples):
        return {**super().__call__(samples), "sample_ids": samples.batch["sample_ids"]}


class Numbered(Dataset):
    """Sample i is i (for the naive prepare's refusal)."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> int:
        return i


class Recording(DetsamplerTrainer):
    def training_step(self, model, inputs, num_items_in_batch=None):
        ids = inputs.pop("sample_ids")
        with open(self.ids_path, "a") as f:
            f.write(json.dumps({"step": self.state.global_step, "ids": ids.tolist()}) + "\n")
        return super().training_step(model, inputs, num_items_in_batch)


class KillAfterStep(TrainerCallback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            os._exit(0)  # NOTE: no cleanup, no save: as killed


def naive_prepare_error(trainer: DetsamplerTrainer) -> str:
    """The message the sampler raises when accelerate's own prepare() re-shards it."""
    plan = trainer.plan.with_world(trainer.accelerator.num_processes, 2)
    loader = trainer.accelerator.prepare(
        DataLoader(Numbered(), batch_sampler=DeterministicBatchSampler(plan, trainer.accelerator.process_index))
    )
    try:
        next(iter(loader))
    except RuntimeError as error:
        return str(error)
    return "not refused"


def main() -> None:
    index_dir, out, mode = sys.argv[1:4]
    resume = sys.argv[4] if len(sys.argv) > 4 and sys.argv[4] != "-" else None
    accum = int(sys.argv[5]) if len(sys.argv) > 5 else 2
    seed = int(sys.argv[6]) if len(sys.argv) > 6 else SEED
    world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    dataset = data(index_dir)
    args = TrainingArguments(
        output_dir=out,
        max_steps=MAX_STEPS,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=accum,
        save_strategy="steps",
        save_steps=3,
        logging_steps=100,
        report_to=[],
        use_cpu=True,
        ddp_backend="gloo",
        disable_tqdm=True,
        seed=0,
        learning_rate=1e-3,
    )
    trainer = Recording(
        model=tiny_llama(dataset.index.vocab_size, max_position_embeddings=SEQ_LEN),
        args=args,
        train_dataset=dataset,
        data_collator=TaggingCollator(position_ids=True),
        plan=plan_of(dataset, seed),
    )
    trainer.ids_path = os.path.join(out, f"ids-{world}-{rank}.jsonl")
    if mode == "full":
        print("naive prepare:", naive_prepare_error(trainer), flush=True)
    if mode == "kill":
        trainer.add_callback(KillAfterStep(4))
    trainer.train(resume_from_checkpoint=resume)
    print(f"rank {rank} of {world}: trained to step {trainer.state.global_step}", flush=True)


if __name__ == "__main__":
    exit_without_teardown(main)
