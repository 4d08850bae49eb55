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

Labels: a ``PackedDataset`` yields them already shifted (``labels[t]`` is the token after position ``t``, ``-100`` where
the layout masks); every ``transformers`` causal LM shifts ``labels`` once more. :class:`CausalLMCollator` hands the
model ``labels`` in its own convention (``labels[t + 1]`` is the target of position ``t``) and, where the model takes
them, ``shift_labels`` (the dataset's labels as they are), which ``ForCausalLMLoss`` and ``Trainer``'s count of the
targets (``num_items_in_batch``) use instead of shifting: every target counts, the last position's included. It also
passes ``position_ids`` with ``use_cache=False``, so that transformers masks attention per document where the positions
restart. ``DetsamplerTrainer`` uses it by default for a PackedDataset (or a MixtureDataset of them); TRL's
``SFTTrainer`` takes :class:`DetsamplerTrainerMixin` with :func:`sample_id_dataset` rows read by the collator.

Redactions (``Plan(..., redactions=...)``) and the instance filter (``PackedDataset(instance_filter=...)``) apply in the
loader: the DataLoader reads through :class:`~detsampler.loader.redact.RedactedDataset`, which masks each micro batch's
labels at the step it is read for, before either collator builds ``labels``/``shift_labels`` and before ``Trainer``
counts ``num_items_in_batch``; both are in the record, so ``detsampler stats|verify --checkpoint`` print the audit
trail.

Data record: every checkpoint gets ``checkpoint-N/detsampler_data.json`` (:class:`~detsampler.record.DataRecord`,
written by the main process before the Trainer's own files), and ``train(resume_from_checkpoint=...)`` checks it
against the resuming run before anything loads (:class:`~detsampler.integrations.checkpoint.CheckpointData`). The
checkpoint's ``trainer_state.json`` names the sha256 of that file (``stateful_callbacks["DetsamplerDataRecord"]``, a
:class:`DetsamplerDataRecord` callback's state), so a record edited or copied in from another checkpoint or run is
refused by every reader, and its step must be the state's ``global_step`` (:func:`~detsampler.record.read_record`).
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Sequence
from typing import Any

from detsampler.integrations import require

require("accelerate", "hf")
transformers = require("transformers", "hf")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from accelerate.data_loader import DataLoaderDispatcher  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402
from torch.utils.data._utils.collate import default_collate  # noqa: E402
from transformers.trainer import TRAINER_STATE_NAME  # noqa: E402
from transformers.trainer_callback import ExportableState  # noqa: E402
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint  # noqa: E402

from detsampler.boundaries import flatten, sequence_boundaries  # noqa: E402
from detsampler.integrations.checkpoint import CheckpointData  # noqa: E402
from detsampler.loader.dataset import MicroBatch, PackedDataset  # noqa: E402
from detsampler.loader.mixture_dataset import MixtureDataset  # noqa: E402
from detsampler.loader.redact import RedactedDataset  # noqa: E402
from detsampler.loader.sampler import DeterministicBatchSampler  # noqa: E402
from detsampler.plan import Plan  # noqa: E402
from detsampler.record import HF_STATE_KEY, RECORD_FILE, DataRecord, record_sha256  # noqa: E402

__all__ = [
    "CausalLMCollator",
    "DetsamplerDataRecord",
    "DetsamplerTrainer",
    "DetsamplerTrainerMixin",
    "FlatteningCollator",
    "causal_lm_collator",
    "prepare_data_loader",
    "sample_id_dataset",
    "trainer_plan",
    "unshard",
]

IGNORE_INDEX = -100


class CausalLMCollator:
    """A DataLoader ``collate_fn`` from detsampler samples to the keyword arguments of a ``transformers`` causal LM.

    Takes a ``PackedDataset`` micro batch (its ``MicroBatch``, a dict of ``[B, seq_len]`` tensors, or a list of
    per-sample dicts) of the four fields or of ``tokens`` (``output="tokens"``); with ``reader`` (a PackedDataset or a
    MixtureDataset of them), also rows ``{"sample_id": i}`` of :func:`sample_id_dataset`, read from ``reader``. Returns:

    - ``input_ids``;
    - ``labels`` in transformers' convention, which the model shifts: ``labels[:, t + 1]`` is the target of position
      ``t`` (``-100`` at position 0, which is nobody's target); the last position's target does not fit in it;
    - ``shift_labels`` (with ``shift_labels=True``): the targets as the dataset gives them, ``shift_labels[:, t]`` that
      of position ``t``, ``-100`` where the layout masks (document ends, padding) and where a ``loss_mask`` in the
      batch is False. ``ForCausalLMLoss`` (and TRL's fused
      head) use them instead of shifting ``labels``, and ``Trainer`` counts ``num_items_in_batch`` from them, so the
      last position's target counts too. Only for models whose ``forward`` passes its ``**kwargs`` to the loss (every
      transformers causal LM);
    - ``position_ids`` and ``use_cache=False`` (with ``position_ids=True``): the dataset's positions (``0..seq_len-1``
      for ``concat``; restarting at each document for ``bestfit``/``document``). With no ``attention_mask`` and no
      cache, transformers masks attention per run of increasing positions, so each document attends only to itself;
      with its default ``use_cache=True`` it would build a cache and skip that (documents would attend across).

    - ``cu_seq_lens_q``/``_k`` (int32) and ``max_length_q``/``_k`` (with ``flash_attn_kwargs=True``): the example
      boundaries of the micro batch flattened to ``[B * seq_len]`` (:func:`detsampler.boundaries.sequence_boundaries`:
      a row's padding is a segment of its own), which transformers' flash-attention path passes to the varlen kernel
      with the batch reshaped to one row, so attention stops at every example at any batch size (from the positions
      alone it does so only at batch size 1). sdpa and eager ignore them. Not run on a GPU in this repository's tests.

    ``document_ids`` are not passed: transformers' causal LMs take no such argument (the positions carry the same
    boundaries).
    """

    def __init__(
        self,
        *,
        position_ids: bool = True,
        shift_labels: bool = True,
        flash_attn_kwargs: bool = False,
        reader: Any = None,
    ) -> None:
        if reader is not None and not _is_packed(reader):
            raise ValueError(f"reader must be a PackedDataset or a MixtureDataset of them, got {type(reader).__name__}")
        self.position_ids, self.shift_labels, self.reader = bool(position_ids), bool(shift_labels), reader
        self.flash_attn_kwargs = bool(flash_attn_kwargs)

    def __repr__(self) -> str:
        return (
            f"CausalLMCollator(position_ids={self.position_ids}, shift_labels={self.shift_labels}, "
            f"flash_attn_kwargs={self.flash_attn_kwargs})"
        )

    def __call__(self, samples: Any) -> dict[str, Any]:
        batch = self._batched(samples)
        if "tokens" in batch:
            tokens = batch["tokens"].long()
            input_ids, targets = tokens[:, :-1], tokens[:, 1:]
            if "loss_mask" in batch:  # chat data: the targets the mask leaves out are not trained
                targets = targets.masked_fill(~batch["loss_mask"], IGNORE_INDEX)
            if "instance_mask" in batch:  # the instance filter's flagged samples: no target trained
                targets = targets.masked_fill(~batch["instance_mask"].bool()[:, None], IGNORE_INDEX)
            positions = torch.arange(input_ids.shape[1]).expand(input_ids.shape[0], -1)
        else:
            input_ids, targets, positions = batch["input_ids"], batch["labels"], batch.get("position_ids")
            if "loss_mask" in batch:  # True where the position's label counts (the dataset's labels already say so)
                targets = torch.where(batch["loss_mask"].bool(), targets, IGNORE_INDEX)
        labels = torch.full_like(targets, IGNORE_INDEX)
        labels[:, 1:] = targets[:, :-1]
        out: dict[str, Any] = {"input_ids": input_ids, "labels": labels}
        if self.shift_labels:
            out["shift_labels"] = targets
        if self.position_ids and positions is not None:
            out["position_ids"] = positions
            out["use_cache"] = False
        if self.flash_attn_kwargs:
            docs = batch.get("document_ids")
            if positions is None:  # no position ids given: each row is one sequence
                positions = torch.arange(input_ids.shape[1]).expand(input_ids.shape[0], -1)
            cu, longest = sequence_boundaries(positions.numpy(), None if docs is None else docs.numpy())
            out["cu_seq_lens_q"] = out["cu_seq_lens_k"] = torch.from_numpy(cu)
            out["max_length_q"] = out["max_length_k"] = longest
        return out

    def _batched(self, samples: Any) -> dict[str, torch.Tensor]:
        return _collate(samples, self.reader, type(self).__name__)


def _collate(samples: Any, reader: Any, name: str) -> dict[str, torch.Tensor]:
    """A micro batch of detsampler samples as a dict of ``[B, seq_len]`` tensors (see :class:`CausalLMCollator`)."""
    if isinstance(samples, MicroBatch):
        return samples.batch
    if isinstance(samples, dict) and "sample_id" not in samples:
        return samples
    rows = samples["sample_id"] if isinstance(samples, dict) else None
    if rows is None and isinstance(samples, Sequence) and samples and isinstance(samples[0], dict):
        if "sample_id" not in samples[0]:
            return default_collate(list(samples))
        rows = [row["sample_id"] for row in samples]
    if rows is not None:
        if reader is None:
            raise ValueError(f"rows of sample ids need {name}(reader=the PackedDataset they index)")
        read = reader.__getitems__([int(i) for i in rows])
        return read.batch if isinstance(read, MicroBatch) else default_collate(list(read))
    raise TypeError(f"{name} takes detsampler samples (a MicroBatch or dicts), got {type(samples).__name__}")


class FlatteningCollator:
    """A DataLoader ``collate_fn`` from detsampler samples to one padding-free row, as
    ``transformers.DataCollatorWithFlattening`` (and TRL's ``padding_free=True``) hand a model.

    Takes what :class:`CausalLMCollator` takes, of the four fields (``output="fields"``; a ``loss_mask`` is honoured
    when present). Every span of the micro batch (an example, or a piece of one) becomes a segment of one row
    ``[1, total]``, padding left out (:func:`detsampler.boundaries.flatten`); returns the keys
    ``DataCollatorWithFlattening`` returns with the same options, equal to its output on the same examples:
    ``input_ids``, ``labels`` (transformers' convention, the model shifts them: -100 at each segment's first position
    and wherever the dataset's label is -100), ``position_ids`` (restarting at 0 per segment; with
    ``return_position_ids``), ``cu_seq_lens_q``/``_k`` (int32) and ``max_length_q``/``_k`` (with
    ``return_flash_attn_kwargs``), ``seq_idx`` (int32, with ``return_seq_idx``). With no ``attention_mask``,
    transformers masks attention per segment from the position ids (sdpa, eager) or the ``cu_seq_lens`` (flash
    attention), so no example attends to another; the model must run without a cache (``use_cache=False``).
    """

    def __init__(
        self,
        *,
        return_position_ids: bool = True,
        return_flash_attn_kwargs: bool = False,
        return_seq_idx: bool = False,
        separator_id: int = IGNORE_INDEX,
        reader: Any = None,
    ) -> None:
        if reader is not None and not _is_packed(reader):
            raise ValueError(f"reader must be a PackedDataset or a MixtureDataset of them, got {type(reader).__name__}")
        self.return_position_ids, self.return_seq_idx = bool(return_position_ids), bool(return_seq_idx)
        self.return_flash_attn_kwargs = bool(return_flash_attn_kwargs)
        self.separator_id, self.reader = separator_id, reader

    def __repr__(self) -> str:
        return (
            f"FlatteningCollator(return_position_ids={self.return_position_ids}, return_flash_attn_kwargs="
            f"{self.return_flash_attn_kwargs}, return_seq_idx={self.return_seq_idx})"
        )

    def __call__(self, samples: Any) -> dict[str, Any]:
        batch = _collate(samples, self.reader, type(self).__name__)
        if "tokens" in batch:
            raise ValueError(
                "FlatteningCollator needs the four fields (PackedDataset output='fields'): token ids alone do not say"
                " where the examples end"
            )
        flat = flatten(batch, separator_id=self.separator_id)  # numpy reads the tensors in place
        keep = {"input_ids", "labels"}
        keep |= {"position_ids"} if self.return_position_ids else set()
        keep |= {"seq_idx"} if self.return_seq_idx else set()
        if self.return_flash_attn_kwargs:
            keep |= {"cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k"}
        return {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in flat.items() if k in keep}


def _is_packed(dataset: Any) -> bool:
    """A PackedDataset, or a MixtureDataset of them."""
    if isinstance(dataset, MixtureDataset):
        return all(isinstance(ds, PackedDataset) for ds in dataset.datasets)
    return isinstance(dataset, PackedDataset)


def _takes_loss_kwargs(model: Any) -> bool:
    forward = getattr(model, "forward", None)
    if forward is None:
        return False
    params = inspect.signature(forward).parameters.values()
    return any(p.kind == inspect.Parameter.VAR_KEYWORD or p.name == "shift_labels" for p in params)


def causal_lm_collator(dataset: Any, model: Any = None) -> CausalLMCollator:
    """The :class:`CausalLMCollator` for ``dataset`` (a PackedDataset or a MixtureDataset of them, also its reader for
    :func:`sample_id_dataset` rows): ``shift_labels`` unless ``model`` is given and its ``forward`` takes no
    ``**kwargs``."""
    if not _is_packed(dataset):
        raise ValueError(
            f"causal_lm_collator reads a PackedDataset or a MixtureDataset of them, got {type(dataset).__name__}: "
            "build CausalLMCollator(...) yourself"
        )
    return CausalLMCollator(shift_labels=model is None or _takes_loss_kwargs(model), reader=dataset)


def sample_id_dataset(dataset: Any) -> Any:
    """A ``datasets.Dataset`` whose row ``i`` is ``{"sample_id": i}``, one per sample of ``dataset``, for trainers that
    take only a ``datasets.Dataset`` (TRL's ``SFTTrainer``): the plan's sampler picks rows, and
    ``causal_lm_collator(dataset)`` reads them from ``dataset``. 8 bytes a sample, in memory."""
    import datasets
    import numpy as np

    return datasets.Dataset.from_dict({"sample_id": np.arange(len(dataset), dtype=np.int64)})


def _reader(dataset: Any, reader: Any, collator: Any) -> Any:
    """The PackedDataset (or MixtureDataset of them) behind ``dataset``: itself, ``reader`` when given, else the
    collator's ``reader``; None when unknown. A table of sample ids with no reader known is refused: nothing would say
    what the ids index."""
    if reader is not None:
        if not _is_packed(reader):
            raise ValueError(f"reader must be a PackedDataset or a MixtureDataset of them, got {type(reader).__name__}")
        return reader
    if _is_packed(dataset):
        return dataset
    found = getattr(collator, "reader", None)
    if found is None and _holds_sample_ids(dataset):
        raise ValueError(
            "train_dataset holds sample ids (sample_id_dataset) but nothing says what they index: pass reader=the"
            f" PackedDataset they index (the collator, a {type(collator).__name__}, has no reader)"
        )
    return found


def _skip_trl_preparation(args: Any, dataset: Any) -> None:
    """TRL's ``SFTTrainer`` tokenizes its dataset unless told not to: rows of sample ids hold no text."""
    if _holds_sample_ids(dataset) and hasattr(args, "dataset_kwargs"):
        args.dataset_kwargs = {**(args.dataset_kwargs or {}), "skip_prepare_dataset": True}


def _holds_sample_ids(dataset: Any) -> bool:
    """Whether ``dataset`` is a table of :func:`sample_id_dataset`'s rows (its one column ``sample_id``)."""
    return list(getattr(dataset, "column_names", None) or ()) == ["sample_id"]


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


class DetsamplerDataRecord(transformers.TrainerCallback, ExportableState):
    """Names, in each checkpoint's ``trainer_state.json`` (``stateful_callbacks``), the sha256 of the data record saved
    beside it: the Trainer's own state covers the record, so a reader refuses one edited or copied in. NOTE: the Trainer
    keys the state by the class name, which is :data:`detsampler.record.HF_STATE_KEY` (what readers look up)."""

    def __init__(self, sha256: str = "") -> None:
        self.sha256 = sha256

    def state(self) -> dict:
        return {"args": {"sha256": self.sha256}, "attributes": {}}


class DetsamplerTrainerMixin:
    """Put before ``transformers.Trainer`` (or a subclass) in the bases; adds the keyword arguments ``plan``, ``index``,
    ``layout``, ``reader`` and ``allow_data_change``.

    ``train_dataset`` is the map-style dataset whose sample ``i`` is the plan's sample ``i`` (a ``PackedDataset``, say),
    or, for trainers that take only a ``datasets.Dataset`` (TRL's ``SFTTrainer``), :func:`sample_id_dataset` rows of
    the PackedDataset ``reader`` (by default the collator's ``reader``: give ``reader=`` when the collator is wrapped in
    a function of yours). The DataLoader then reads each micro batch from ``reader`` in one batched read and hands the
    collator that micro batch, never rows: no ``sample_id`` column to strip (``remove_unused_columns``) and nothing for
    TRL to tokenize (``dataset_kwargs={"skip_prepare_dataset": True}`` is set).
    The data of Trainer step ``s`` is the plan's step ``s`` on every run, resumed or not, on any number of processes.
    With no ``data_collator`` given and a PackedDataset (or a MixtureDataset of them), batches go through
    :func:`causal_lm_collator`. Each checkpoint records its data (``detsampler_data.json``) and a resume onto other data
    is refused: the index and layout are the dataset's, or ``index=``/``layout=`` for any other dataset
    (:class:`~detsampler.integrations.checkpoint.CheckpointData`). The logged ``epoch`` is the plan's: samples consumed
    before the step over the samples of an epoch (:meth:`~detsampler.plan.Plan.consumed`).
    """

    def __init__(
        self,
        *args: Any,
        plan: Plan,
        index: Any = None,
        layout: Any = None,
        reader: Any = None,
        allow_data_change: bool = False,
        **kwargs: Any,
    ) -> None:
        # NOTE: the collator is set before __init__: TRL's SFTTrainer builds its own there when given none.
        dataset, model = kwargs.get("train_dataset"), kwargs.get("model")
        if kwargs.get("data_collator") is None and not args and _is_packed(dataset):
            kwargs["data_collator"] = causal_lm_collator(dataset, model if hasattr(model, "forward") else None)
        reader = _reader(dataset, reader, kwargs.get("data_collator"))
        _skip_trl_preparation(kwargs.get("args"), dataset)
        super().__init__(*args, **kwargs)
        if _is_packed(self.train_dataset) and self.data_collator is transformers.default_data_collator:  # positional
            self.data_collator = causal_lm_collator(self.train_dataset, self.model)
        if self.args.max_steps <= 0:
            raise ValueError("DetsamplerTrainer needs TrainingArguments(max_steps=...): the plan's stream is endless")
        # NOTE: resuming restarts the sampler at global_step; the Trainer's own skipping would skip that data again.
        self.args.ignore_data_skip = True
        self.plan = plan
        self.detsampler_reader = reader if reader is not None else _reader(self.train_dataset, None, self.data_collator)
        self.detsampler_data = CheckpointData(
            self.detsampler_reader if self.detsampler_reader is not None and index is None else self.train_dataset,
            plan,
            framework="hf",
            index=index,
            layout=layout,
            allow_data_change=allow_data_change,
        )
        self.detsampler_sampler: DeterministicBatchSampler | None = None
        self.add_callback(_StartAtGlobalStep(self))
        self.add_callback(DetsamplerDataRecord())

    def detsampler_plan(self) -> Plan:
        """The plan cut for this run's processes and per-device batch (:func:`trainer_plan`)."""
        return trainer_plan(self.plan, self.args, self.accelerator.num_processes)

    def get_train_dataloader(self) -> DataLoader:
        plan = self.detsampler_plan()
        self.detsampler_sampler = DeterministicBatchSampler(plan, rank=self.accelerator.process_index)
        args = self.args
        collate, rows = self.data_collator, self.train_dataset
        if _holds_sample_ids(rows) and self.detsampler_reader is not None:
            # NOTE: micro batches read from the data the ids index, in one batched read (the sampler's ids themselves:
            # an epoch-ordered plan's reach past len(rows)); the collator picks its fields from them
            rows = self.detsampler_reader
        elif not isinstance(collate, (CausalLMCollator, FlatteningCollator)) and not _is_packed(rows):
            collate = self._get_collator_with_removed_columns(collate, description="training")
        if plan.redactions:  # masked in the loader, before the collator, so num_items_in_batch never counts them
            rows = RedactedDataset(rows, plan)
        loader = DataLoader(
            rows,
            batch_sampler=self.detsampler_sampler,
            collate_fn=collate,
            num_workers=args.dataloader_num_workers,
            pin_memory=args.dataloader_pin_memory,
            persistent_workers=args.dataloader_persistent_workers and args.dataloader_num_workers > 0,
            prefetch_factor=args.dataloader_prefetch_factor if args.dataloader_num_workers > 0 else None,
        )
        return prepare_data_loader(self.accelerator, loader)

    def train(self, resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any) -> Any:
        """``Trainer.train``; when resuming, first checks the checkpoint's data record against this run (raises
        ValueError with the library's message before anything is loaded)."""
        checkpoint = resume_from_checkpoint
        if checkpoint is True:
            checkpoint = get_last_checkpoint(self.args.output_dir)  # None: Trainer.train raises its own error
        if isinstance(checkpoint, (str, os.PathLike)):
            self.check_data_resume(checkpoint)
        return super().train(resume_from_checkpoint, *args, **kwargs)

    def log(self, logs: dict[str, float], *args: Any, **kwargs: Any) -> None:
        """``Trainer.log`` with the plan's epoch: the samples consumed before the next step over the samples of an epoch
        (the Trainer's own counts its steps against ``max_steps``, as if they were one epoch)."""
        self.state.epoch = self.plan.consumed(self.state.global_step) / self.plan.stream.num_samples
        super().log(logs, *args, **kwargs)

    def check_data_resume(self, checkpoint: str | os.PathLike) -> None:
        """Raise ValueError unless resuming from ``checkpoint`` (a ``checkpoint-N`` directory) reads, before its step,
        exactly what the run that saved it read."""
        state_file = os.path.join(checkpoint, TRAINER_STATE_NAME)
        step = transformers.TrainerState.load_from_json(state_file).global_step if os.path.isfile(state_file) else 0
        path = os.path.join(checkpoint, RECORD_FILE)
        saved = DataRecord.load(path) if os.path.exists(path) else None
        self.detsampler_data.check(saved, step, str(checkpoint))

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        # NOTE: the record goes first, so that a checkpoint with a trainer_state.json always holds its data record.
        record = self.detsampler_data.record(self.state.global_step, self.detsampler_plan())
        if record is not None and self.args.should_save:
            folder = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
            directory = os.path.join(self._get_output_dir(trial=trial), folder)
            os.makedirs(directory, exist_ok=True)
            path = record.save(directory)
            # NOTE: Trainer restores callbacks by type (restore_callback_states_from_checkpoint): find ours each time.
            named = next(c for c in self.callback_handler.callbacks if isinstance(c, DetsamplerDataRecord))
            named.sha256 = record_sha256(path.read_bytes())
            self.state.stateful_callbacks.setdefault(HF_STATE_KEY, named.state())  # a state of an older checkpoint
        super()._save_checkpoint(model, trial)


class DetsamplerTrainer(DetsamplerTrainerMixin, transformers.Trainer):
    """``transformers.Trainer`` whose training data is a detsampler plan (see :class:`DetsamplerTrainerMixin`)."""
