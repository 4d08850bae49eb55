"""What every integration saves of its data with a checkpoint, and checks when a run resumes from one.

Each integration saves a :class:`~detsampler.record.DataRecord` (the data fingerprint, the step, where each index opens
again, how the run was cut) with every checkpoint, and on resume checks the resuming run against it through the
library's :func:`~detsampler.resume.check_resume`: another index, layout or plan seed, and batch sizes, mixture weights
or skip ranges changed before the resume are refused with the library's message; another world size or micro batch,
and batch-ramp or mixture schedule entries and skip ranges ahead of the resume pass.

The index and layout come from the training dataset when it is a :class:`~detsampler.loader.dataset.PackedDataset`
(its ``index`` and ``layout``) or a :class:`~detsampler.loader.mixture_dataset.MixtureDataset` of them (one per source);
for any other dataset they are passed explicitly (``index=``, ``layout=``). Without them the integration refuses to
start: a check of the plan alone would pass a changed index or layout (``bestfit`` -> ``concat`` on the same seed) in
silence, which is the failure the record exists to catch. ``allow_data_change=True`` is the explicit opt-out: a
mismatch, a checkpoint without a record or a dataset whose data is unknown is then a warning, never an error.

The record is read as every reader reads it (:func:`~detsampler.record.read_record`): its seal must hold and its step
must be the step of the state (or checkpoint) that holds it, even with ``allow_data_change=True``: an edited record, or
one of another step, does not say where the run stands, so nothing can resume from it.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

from detsampler.loader.dataset import PackedDataset
from detsampler.loader.mixture_dataset import MixtureDataset
from detsampler.plan import Plan
from detsampler.record import DataRecord, read_record
from detsampler.resume import DataFingerprint

__all__ = ["CheckpointData", "data_of"]


def data_of(dataset: Any, index: Any = None, layout: Any = None) -> tuple[Any, Any] | None:
    """The ``(index, layout)`` the plan's samples come from: the ones given (both, or neither), else the dataset's own
    (a PackedDataset; a MixtureDataset of PackedDatasets gives lists, one per source); None when unknown."""
    if (index is None) != (layout is None):
        raise ValueError("pass both index= and layout= (the ones the training dataset reads), or neither")
    if index is not None:
        return index, layout
    if isinstance(dataset, PackedDataset):
        return dataset.index, dataset.layout
    if isinstance(dataset, MixtureDataset) and all(isinstance(ds, PackedDataset) for ds in dataset.datasets):
        return [ds.index for ds in dataset.datasets], [ds.layout for ds in dataset.datasets]
    return None


def instance_filter_of(dataset: Any) -> Any:
    """The instance filter the dataset reads through (a PackedDataset's; a MixtureDataset's sources must agree on
    theirs, since a data record names one), or None."""
    if isinstance(dataset, PackedDataset):
        return dataset.instance_filter
    if isinstance(dataset, MixtureDataset):
        found = {getattr(ds, "instance_filter", None) for ds in dataset.datasets}
        if len(found) > 1:
            raise ValueError(
                f"the mixture's sources read through different instance filters ({sorted(map(str, found))}): a data"
                " record names one; give every source's PackedDataset the same instance_filter"
            )
        return found.pop() if found else None
    return None


class CheckpointData:
    """The data record of one run: :meth:`record` what a checkpoint saves, :meth:`check` a saved record against this
    run (``framework`` names the integration in the record and in messages)."""

    def __init__(
        self,
        dataset: Any,
        plan: Plan,
        *,
        framework: str,
        index: Any = None,
        layout: Any = None,
        allow_data_change: bool = False,
    ) -> None:
        self.plan, self.framework, self.allow_data_change = plan, framework, bool(allow_data_change)
        self.data = data_of(dataset, index, layout)
        if self.data is None:
            message = (
                f"the training dataset is a {type(dataset).__name__}, not a PackedDataset or MixtureDataset: pass "
                "index= and layout= (the ones it reads), so that each checkpoint records its data and a resume onto "
                "other data is refused"
            )
            if not self.allow_data_change:
                raise ValueError(message + " (or allow_data_change=True to save and check nothing)")
            warnings.warn(message + "; allow_data_change=True: checkpoints record no data", stacklevel=3)
        self.instance_filter = instance_filter_of(dataset)
        self.fingerprint = DataFingerprint.of(*self.data, plan, self.instance_filter) if self.data is not None else None

    def record(self, step: int, plan: Plan) -> DataRecord | None:
        """The record of a checkpoint whose next step is ``step``, for ``plan`` (this run's cut of the plan)."""
        if self.data is None:
            return None
        return DataRecord.of(step, *self.data, plan, framework=self.framework, instance_filter=self.instance_filter)

    def check(
        self,
        saved: DataRecord | Mapping | str | bytes | None,
        step: int,
        where: str,
        *,
        samples_in_step: int | None = None,
    ) -> DataRecord | None:
        """Raise ValueError (the library's message) unless this run resuming at ``step`` reads what the run that saved
        ``saved`` (from ``where``; None: the checkpoint holds no record) read before it. The record is read by
        :func:`~detsampler.record.read_record` and bound to the state that holds it: its step must be ``step`` (and
        its ``samples_in_step`` the state's, when given), whatever ``allow_data_change`` says, since a state whose
        record is another step's or edited does not say where to resume. Returns the record read (None when none)."""
        if self.fingerprint is None:
            return None  # allow_data_change without data: warned at construction
        record = None
        if saved is not None:
            samples = ("its samples_in_step", samples_in_step) if samples_in_step is not None else None
            record = read_record(saved, where, steps={"its step": step}, samples_in_step=samples)
        try:
            if record is None:
                raise ValueError(
                    f"{where} holds no detsampler data record (written by a detsampler before records, or not by "
                    "this integration): what it trained on cannot be checked"
                )
            record.check_resume(self.fingerprint, step)
        except ValueError as error:
            if not self.allow_data_change:
                raise ValueError(
                    f"refusing to resume from {where}: {error} (allow_data_change=True resumes anyway)"
                ) from error
            warnings.warn(f"resuming from {where} with allow_data_change=True: {error}", stacklevel=3)
        return record
