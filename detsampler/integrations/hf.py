"""Hugging Face ``transformers.Trainer`` and ``accelerate`` over detsampler, resumed by the Trainer's own
``global_step``.

Two things go wrong with a plain ``DataLoader(dataset, batch_sampler=sampler)`` handed to them, and both are handled
here:

- ``accelerator.prepare`` wraps every batch sampler in a ``BatchSamplerShard`` that keeps 1/W of the batches on each of
  W processes; the sampler's micro batches are already the rank's share. :func:`prepare_data_loader` prepares the loader
  and turns that wrapper into a pass-through; the naive use is refused by the sampler when iterated.
- On resume, ``Trainer`` skips the batches of the steps already trained (``skip_first_batches``). The sampler restarts
  at the step instead, so :class:`DetsamplerTrainer` sets ``ignore_data_skip=True`` and, once the Trainer has read
  ``trainer_state.json``, starts the sampler at its ``global_step``.

A Trainer step is one step of the plan: ``gradient_accumulation_steps`` micro batches of
``per_device_train_batch_size`` samples per process, so the plan's ``global_batch_size`` must equal their product with
the number of processes (checked, with the value to set). The plan is re-cut for the number of processes of each run
(``Plan.with_world``), so a checkpoint resumes on another world size with the same global batches, given the matching
``gradient_accumulation_steps``.
"""

from __future__ import annotations

from typing import Any

from detsampler.integrations import require

require("accelerate", "hf")
transformers = require("transformers", "hf")

from accelerate.data_loader import DataLoaderDispatcher  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from detsampler.loader.sampler import DeterministicBatchSampler  # noqa: E402
from detsampler.plan import Plan  # noqa: E402

__all__ = ["DetsamplerTrainer", "DetsamplerTrainerMixin", "prepare_data_loader", "trainer_plan", "unshard"]


def unshard(prepared: DataLoader) -> DataLoader:
    """Make accelerate's sharding wrapper around a :class:`DeterministicBatchSampler` a pass-through (in place)."""
    if isinstance(prepared, DataLoaderDispatcher):
        raise ValueError(
            "accelerate dispatches batches from process 0 (dispatch_batches=True); each rank reads its own micro "
            "batches from a DeterministicBatchSampler: prepare with dispatch_batches=False"
        )
    wrapper = getattr(prepared, "batch_sampler", None)
    if isinstance(wrapper, DeterministicBatchSampler):
        return prepared  # one process: nothing was wrapped
    if not isinstance(getattr(wrapper, "batch_sampler", None), DeterministicBatchSampler):
        raise ValueError(
            f"not a DataLoader over a DeterministicBatchSampler: its batch sampler is {type(wrapper).__name__}"
        )
    if getattr(wrapper, "split_batches", False):
        raise ValueError(
            "accelerate's split_batches would split each micro batch across processes: use split_batches=False"
        )
    wrapper.num_processes, wrapper.process_index = 1, 0
    return prepared


def prepare_data_loader(accelerator: Any, loader: DataLoader) -> DataLoader:
    """``accelerator.prepare(loader)`` (device placement, registration) without re-sharding the sampler's micro
    batches."""
    return unshard(accelerator.prepare(loader))


def trainer_plan(plan: Plan, args: Any, num_processes: int) -> Plan:
    """``plan`` cut for this run's processes and per-device batch; refuses a plan whose step is not one Trainer step."""
    if plan.batch_size_schedule is not None:
        raise ValueError(
            "a batch-size schedule changes the micro steps per step; transformers.Trainer accumulates a fixed number"
        )
    cut = plan.with_world(num_processes, args.per_device_train_batch_size)
    micro_steps = cut.num_micro_steps(0)
    if micro_steps != args.gradient_accumulation_steps:
        raise ValueError(
            f"the plan's global batch of {plan.global_batch_size} samples is {num_processes} processes x "
            f"{args.per_device_train_batch_size} per device x {micro_steps} micro steps: set "
            f"gradient_accumulation_steps={micro_steps} (it is {args.gradient_accumulation_steps})"
        )
    return cut


class _StartAtGlobalStep(transformers.TrainerCallback):
    """Starts the sampler at the Trainer's ``global_step``, read from ``trainer_state.json`` on resume (0 otherwise)."""

    def __init__(self, trainer: DetsamplerTrainerMixin) -> None:
        self.trainer = trainer

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.trainer.detsampler_sampler.load_state_dict({"step": state.global_step})


class DetsamplerTrainerMixin:
    """Put before ``transformers.Trainer`` (or a subclass) in the bases; adds the keyword argument ``plan``.

    ``train_dataset`` is the map-style dataset whose sample ``i`` is the plan's sample ``i`` (a ``PackedDataset``, say).
    The data of Trainer step ``s`` is the plan's step ``s`` on every run, resumed or not, on any number of processes.
    """

    def __init__(self, *args: Any, plan: Plan, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.args.max_steps <= 0:
            raise ValueError("DetsamplerTrainer needs TrainingArguments(max_steps=...): the plan's stream is endless")
        # NOTE: resuming restarts the sampler at global_step; the Trainer's own skipping would skip that data again.
        self.args.ignore_data_skip = True
        self.plan = plan
        self.detsampler_sampler: DeterministicBatchSampler | None = None
        self.add_callback(_StartAtGlobalStep(self))

    def get_train_dataloader(self) -> DataLoader:
        plan = trainer_plan(self.plan, self.args, self.accelerator.num_processes)
        self.detsampler_sampler = DeterministicBatchSampler(plan, rank=self.accelerator.process_index)
        args = self.args
        loader = DataLoader(
            self.train_dataset,
            batch_sampler=self.detsampler_sampler,
            collate_fn=self._get_collator_with_removed_columns(self.data_collator, description="training"),
            num_workers=args.dataloader_num_workers,
            pin_memory=args.dataloader_pin_memory,
            persistent_workers=args.dataloader_persistent_workers and args.dataloader_num_workers > 0,
            prefetch_factor=args.dataloader_prefetch_factor if args.dataloader_num_workers > 0 else None,
        )
        return prepare_data_loader(self.accelerator, loader)


class DetsamplerTrainer(DetsamplerTrainerMixin, transformers.Trainer):
    """``transformers.Trainer`` whose training data is a detsampler plan (see :class:`DetsamplerTrainerMixin`)."""
