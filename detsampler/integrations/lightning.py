"""Lightning (``lightning`` or ``pytorch_lightning`` 2.x): a ``LightningDataModule`` whose state is the step.

Lightning saves a datamodule's ``state_dict()`` in every checkpoint and hands it back to ``load_state_dict`` on
``trainer.fit(..., ckpt_path=...)``. Here that state is ``{"step": trainer.global_step}`` (optimizer steps done: the
next step to train), the same on every rank; the training DataLoader starts its :class:`DeterministicBatchSampler`
there. A step is the plan's global batch: ``accumulate_grad_batches`` micro batches on each of ``trainer.world_size``
processes, of ``global_batch_size / (world_size * accumulate_grad_batches)`` samples each (the plan is re-cut for every
run, its own ``world_size`` and ``micro_batch_size`` are not used). So a checkpoint resumes on another world size with
the same global batches, with nothing changed but the launch; ``accumulate_grad_batches`` must stay that of the
checkpoint (Lightning counts it over the batches of the epoch, the checkpoint's included: checked).

Lightning must not inject its own distributed sampler: build the Trainer with ``use_distributed_sampler=False``.

Batches are the dataset's fields as they are (``collate_micro_batch``: one dict of ``[B, seq_len]`` tensors per micro
batch): ``input_ids``, ``labels`` already the next token (``-100`` where the layout masks: do not shift them again),
``position_ids`` and ``document_ids``; the ``training_step`` of docs/integrations.md computes the next-token loss.

Redactions (``Plan(..., redactions=...)``) are applied in the loader
(:class:`~detsampler.loader.redact.RedactedDataset`: each micro batch's labels masked at the step it is read for), the
instance filter by the dataset; both are recorded.

Data record: the state also holds ``"data_record"`` (:class:`~detsampler.record.DataRecord`, ``framework="lightning"``);
``load_state_dict`` checks it against this run with the library's ``check_resume`` and refuses a resume onto other data
(:class:`~detsampler.integrations.checkpoint.CheckpointData`). A state without one (``{"step": s}``, saved before
records) loads only with ``allow_data_change=True``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from detsampler.integrations import require

try:
    pl = require("lightning.pytorch", "lightning")
except ImportError:
    pl = require("pytorch_lightning", "lightning")

from torch.utils.data import DataLoader, Dataset

from detsampler.integrations.checkpoint import CheckpointData
from detsampler.loader.dataset import collate_micro_batch
from detsampler.loader.redact import RedactedDataset
from detsampler.loader.sampler import DeterministicBatchSampler
from detsampler.plan import Plan, _check_step

__all__ = ["DetsamplerDataModule"]


class DetsamplerDataModule(pl.LightningDataModule):
    """The training data of ``plan`` over ``dataset`` (sample ``i`` of the plan is ``dataset[i]``), resumed by step.

    ``collate_fn`` is :func:`~detsampler.loader.dataset.collate_micro_batch` by default (a PackedDataset's micro batch
    as one dict, anything else through ``default_collate``). ``index``/``layout``: the data of a dataset that is not a
    PackedDataset or a MixtureDataset of them (recorded in every checkpoint and checked on resume);
    ``allow_data_change=True`` turns a failed check into a warning.
    """

    def __init__(
        self,
        dataset: Dataset,
        plan: Plan,
        *,
        num_workers: int = 0,
        collate_fn: Callable | None = None,
        pin_memory: bool = False,
        index: Any = None,
        layout: Any = None,
        allow_data_change: bool = False,
    ) -> None:
        super().__init__()
        if plan.batch_size_schedule is not None:
            raise ValueError(
                "a batch-size schedule changes the micro steps per step; Lightning accumulates a fixed number"
            )
        self.dataset, self.plan = dataset, plan
        self.num_workers, self.pin_memory = num_workers, pin_memory
        self.collate_fn = collate_micro_batch if collate_fn is None else collate_fn
        self.data_check = CheckpointData(
            dataset, plan, framework="lightning", index=index, layout=layout, allow_data_change=allow_data_change
        )
        self.start_step = 0
        self.loaded_step: int | None = None  # the step of a state loaded from a checkpoint, until checked
        self.sampler: DeterministicBatchSampler | None = None

    def train_dataloader(self) -> DataLoader:
        trainer = self.trainer
        if trainer._accelerator_connector.use_distributed_sampler and trainer.world_size > 1:
            raise ValueError(
                "DetsamplerDataModule shards by rank itself: build the Trainer with use_distributed_sampler=False"
            )
        plan = self._run_plan(trainer.world_size, trainer.accumulate_grad_batches)
        # NOTE: Lightning closes a step when the batches run in the epoch reach a multiple of accumulate_grad_batches,
        # counting those of the checkpoint: with another accumulate_grad_batches the first step would be cut short.
        done = trainer.fit_loop.epoch_loop.batch_progress.current.ready
        if done % trainer.accumulate_grad_batches:
            raise ValueError(
                f"the checkpoint was taken after {done} batches of the epoch, not a multiple of "
                f"accumulate_grad_batches={trainer.accumulate_grad_batches}: resume with the checkpoint's "
                "accumulate_grad_batches (on another world size the micro batch size follows)"
            )
        self._check_loaded_step(int(trainer.global_step))
        self.sampler = DeterministicBatchSampler(plan, trainer.global_rank, start_step=self.start_step)
        return DataLoader(
            RedactedDataset(self.dataset, plan) if plan.redactions else self.dataset,
            batch_sampler=self.sampler,
            num_workers=self.num_workers,
            collate_fn=self.collate_fn,
            pin_memory=self.pin_memory,
        )

    def _check_loaded_step(self, global_step: int) -> None:
        """A loaded state's step must be the checkpoint's own: Lightning's ``global_step``, restored from its loops
        (a state copied from another checkpoint would start the sampler elsewhere, in silence)."""
        if self.loaded_step is not None and self.loaded_step != global_step:
            raise ValueError(
                f"the checkpoint's DetsamplerDataModule state is not this checkpoint's: the sampler would start at"
                f" step {self.loaded_step} but Lightning resumes at global_step {global_step} (a state copied from"
                " another checkpoint)"
            )
        self.loaded_step = None

    def _run_plan(self, world_size: int, accumulate: int) -> Plan:
        """The plan cut for this run: ``micro_batch_size = global_batch_size / (world_size *
        accumulate_grad_batches)``."""
        micro_batch_size, rest = divmod(self.plan.global_batch_size, world_size * accumulate)
        if rest or not micro_batch_size:
            raise ValueError(
                f"the plan's global batch of {self.plan.global_batch_size} samples does not split into {world_size} "
                f"processes x accumulate_grad_batches={accumulate} micro batches"
            )
        return self.plan.with_world(world_size, micro_batch_size)

    def state_dict(self) -> dict[str, Any]:
        """``{"step": s, "data_record": DataRecord.to_dict()}`` (``s``: the next step to train; the record of this run's
        cut of the plan; no record only with ``allow_data_change=True`` over a dataset whose data is unknown)."""
        trainer, step = self.trainer, int(self.trainer.global_step)
        record = self.data_check.record(step, self._run_plan(trainer.world_size, trainer.accumulate_grad_batches))
        return {"step": step, **({"data_record": record.to_dict()} if record is not None else {})}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        if not isinstance(state_dict, Mapping) or not {"step"} <= set(state_dict) <= {"step", "data_record"}:
            raise ValueError(
                f"a DetsamplerDataModule state is {{'step': s, 'data_record': {{...}}}}, got {state_dict!r}"
            )
        step = _check_step(state_dict["step"], "step")
        self.data_check.check(state_dict.get("data_record"), step, "the checkpoint's DetsamplerDataModule state")
        self.start_step = self.loaded_step = step
