"""Grain (0.2.x): :class:`PlanSource`, a ``RandomAccessDataSource`` of the plan's micro batches, and
:class:`PlanSampler`, the index sampler that hands each process its own, from any step.

Record ``g`` of a :class:`PlanSource` is the ``g``-th micro batch (``plan.micro_batch_size`` samples) of the plan's
training order counted from step 0, every step's positions in order: a numbering that depends on neither the world
size nor the number of Grain workers. Grain's ``DataLoader`` gives process ``p`` of ``P`` (its ``ShardOptions``) the
sampler's global indices ``p, p + P, p + 2P, ...``; every step's batch being a multiple of ``P * micro_batch_size``,
these records are exactly ``plan.with_world(P)``'s micro batches of rank ``p``, step after step: element ``k`` of
process ``p`` at step ``s`` is the plan's micro step ``k - (micro steps before s)`` of rank ``p``. A balanced plan
(``Plan(balance=...)``) is numbered by its one-rank deal (each step's samples in micro batches of near-equal modeled
cost, heaviest first), so process ``p`` reads that deal's micro batches ``p, p + P, ...``: balanced at any ``P``.

A record is read with one :meth:`~detsampler.loader.dataset.PackedDataset.get_batch` (vectorized over its samples)
and is a dict of numpy arrays ``[micro_batch_size, seq_len]``: the dataset's fields and ``sample_ids``. The plan's
redactions are applied to it at its step (labels and ``loss_mask`` masked where a redacted document's tokens are); the
instance filter is the dataset's; both are in the data record. Records, not
samples, are Grain's elements: with ``worker_count > 0`` Grain batches inside each worker, so a ``Batch`` operation
over samples would mix the micro batches of ``worker_count`` consecutive records; whole records come back in order
whatever the worker count.

What resumes is the step. :meth:`PlanSource.state_dict` is ``{"step", "samples_in_step", "data_record"}`` (a
:class:`~detsampler.record.DataRecord`) and :meth:`PlanSource.resume_position` checks it (the library's
:func:`~detsampler.resume.check_resume`) before a sampler starts there, at any process count whose micro steps divide
the batches. Grain's own iterator state (``DataLoaderIterator.get_state()``, what Orbax's ``PyGrainCheckpointHandler``
saves) names this process's last record: restored into a loader of the same process count, rank and start it resumes as
Grain resumes; into any other loader it is refused by Grain's own check (the sampler's ``repr`` names the rank, world
size and start), and :meth:`PlanSource.position_of_grain_state` reads the step out of it instead, so a checkpoint that
holds only Grain's state resumes on another process count too.
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from collections.abc import Mapping, Sequence
from types import FrameType
from typing import Any

import numpy as np

from detsampler.checks import is_int
from detsampler.integrations import require

grain = require("grain", "grain")

from detsampler.integrations.checkpoint import CheckpointData  # noqa: E402
from detsampler.plan import Plan  # noqa: E402
from detsampler.redaction import Blocklist  # noqa: E402

__all__ = ["PlanSampler", "PlanSource", "data_loader", "map_dataset"]

FRAMEWORK = "grain"
_SAMPLER_REPR = re.compile(
    r"^detsampler\.PlanSampler\(rank=(\d+), world_size=(\d+), start_step=(\d+), samples_in_step=(\d+), data=(\w+)\)$"
)


class PlanSource:
    """The plan's micro batches as a Grain ``RandomAccessDataSource``: record ``g`` is the ``g``-th micro batch of
    ``plan.micro_batch_size`` samples in training order from step 0, up to ``num_steps`` (module doc).

    ``dataset`` is a :class:`~detsampler.loader.dataset.PackedDataset`, a
    :class:`~detsampler.loader.mixture_dataset.MixtureDataset` of them (``plan`` over its mixture), or any map-style
    dataset of dict samples (then with ``index=`` and ``layout=``, as for every integration). ``len(source)`` is the
    number of records of steps ``[0, num_steps)``. Its ``repr`` (which Grain saves and checks with its iterator state)
    names the data fingerprint and the micro batch, not ``num_steps``: extending a run keeps every record.
    """

    def __init__(
        self,
        dataset: Any,
        plan: Plan,
        num_steps: int,
        *,
        index: Any = None,
        layout: Any = None,
        allow_data_change: bool = False,
    ) -> None:
        if not isinstance(plan, Plan):
            raise TypeError(f"plan must be a detsampler Plan, got {type(plan).__name__}")
        self.checkpoint = CheckpointData(
            dataset, plan, framework=FRAMEWORK, index=index, layout=layout, allow_data_change=allow_data_change
        )
        if not isinstance(num_steps, (int, np.integer)) or isinstance(num_steps, bool) or num_steps < 1:
            raise ValueError(f"Got num_steps {num_steps!r}, num_steps must be an integer >= 1 (the steps to serve)")
        self.dataset = dataset
        self.plan = plan.with_world(1)  # the records' numbering: one rank, so every micro batch in training order
        self._blocklist = Blocklist(plan.redactions or ())
        self.num_steps = int(num_steps)
        self._length = self.records_before(self.num_steps)
        fingerprint = self.checkpoint.fingerprint
        self.data_hash = fingerprint.hash[:16] if fingerprint is not None else "unchecked"

    def __len__(self) -> int:
        return self._length

    def __repr__(self) -> str:
        return f"detsampler.PlanSource(micro_batch_size={self.plan.micro_batch_size}, data={self.data_hash})"

    def __getitem__(self, record: int) -> dict[str, np.ndarray]:
        step, micro_step = self.position(record)
        ids = self.plan.micro_batch(step, micro_step, 0)
        batch = self._read(ids)
        if self._blocklist.redactions:
            self._redact(batch, ids, step)
        return {**batch, "sample_ids": ids}

    def _redact(self, batch: dict[str, np.ndarray], ids: np.ndarray, step: int) -> None:
        """The plan's redactions in force at ``step``: the labels (and ``loss_mask``) of their documents' positions
        masked, in place (every record is read at its step: the mask is the training loop's)."""
        if "labels" not in batch or "document_ids" not in batch:
            raise ValueError(
                "the plan redacts documents, which masks labels by their document_ids: the records hold"
                f" {sorted(batch)} (read output='fields')"
            )
        stream = self.plan.stream
        sources = stream.split_ids(ids)[0] if hasattr(stream, "split_ids") else None
        mask = self._blocklist.mask(batch["document_ids"], step, sources)
        batch["labels"] = np.where(mask, -100, batch["labels"])
        if "loss_mask" in batch:
            batch["loss_mask"] = batch["loss_mask"] & ~mask

    def _read(self, ids: np.ndarray) -> dict[str, np.ndarray]:
        """The samples ``ids`` as one dict of arrays ``[len(ids), ...]``: ``get_batch`` (PackedDataset), a batched
        ``__getitems__`` (MixtureDataset of PackedDatasets), else the dataset's samples stacked."""
        get_batch = getattr(self.dataset, "get_batch", None)
        if get_batch is not None:
            batch = get_batch(ids)
        else:
            items = getattr(self.dataset, "__getitems__", lambda i: [self.dataset[j] for j in i])(ids.tolist())
            batch = getattr(items, "batch", None)
            if not isinstance(batch, dict):
                batch = {key: np.stack([np.asarray(item[key]) for item in items]) for key in items[0]}
        return {key: np.asarray(value) for key, value in batch.items()}

    # -- records <-> steps

    def records_before(self, step: int) -> int:
        """Records of the steps before ``step``: the first record of ``step``."""
        return self.plan.micro_steps_between(0, step)

    def position(self, record: int) -> tuple[int, int]:
        """``(step, r)``: record ``record`` is the ``r``-th micro batch of ``step`` (O(log num_steps) plan calls)."""
        if not isinstance(record, (int, np.integer)) or isinstance(record, bool) or not 0 <= record < self._length:
            raise IndexError(f"Got record {record!r}, allowed records are in [0, {self._length})")
        low, high = 0, self.num_steps - 1  # the last step whose first record is <= record
        while low < high:
            middle = (low + high + 1) // 2
            if self.records_before(middle) <= record:
                low = middle
            else:
                high = middle - 1
        return low, int(record) - self.records_before(low)

    def first_record(self, step: int, samples_in_step: int = 0, world_size: int = 1) -> int:
        """The record a process count of ``world_size`` resumes at: ``samples_in_step`` samples into ``step``."""
        plan = self.plan.with_world(world_size)  # raises unless world_size * micro_batch_size divides every batch
        if not 0 <= step <= self.num_steps or (step == self.num_steps and samples_in_step):
            raise ValueError(f"Got step {step!r}, this source serves steps [0, {self.num_steps})")
        per_micro_step = world_size * plan.micro_batch_size
        if samples_in_step and (samples_in_step >= plan.batch_size(step) or samples_in_step % per_micro_step):
            raise ValueError(
                f"samples_in_step {samples_in_step} of step {step} must be a multiple of world_size * micro_batch_size"
                f" = {per_micro_step} below its batch size {plan.batch_size(step)}: resume this mid-step position"
                " with a process count that divides it, or at the next step"
            )
        return self.records_before(step) + samples_in_step // plan.micro_batch_size

    # -- checkpoints

    def state_dict(self, step: int, samples_in_step: int = 0, world_size: int = 1) -> dict[str, Any]:
        """What to checkpoint: ``{"step", "samples_in_step", "data_record"}`` for a resume at ``step`` (the next step
        to train), the same on every process (``world_size``: the processes of the run, recorded; ValueError for a
        position they cannot have reached)."""
        self.first_record(step, samples_in_step, world_size)
        plan = self.plan.with_world(world_size)
        record = self.checkpoint.record(step, plan)
        state: dict[str, Any] = {"step": int(step), "samples_in_step": int(samples_in_step)}
        if record is not None:
            state["data_record"] = dataclasses.replace(record, samples_in_step=int(samples_in_step)).to_json()
        return state

    def resume_position(self, state: Mapping[str, Any]) -> tuple[int, int]:
        """``(step, samples_in_step)`` of a :meth:`state_dict`, once its data record shows that this source reads what
        the saved run read before it (ValueError otherwise, the library's message)."""
        if not isinstance(state, Mapping) or "step" not in state:
            raise ValueError(f"a PlanSource state is {{'step': s, 'data_record': ...}}, got {state!r}")
        step = _whole(state["step"], "the Grain state's step")
        samples = _whole(state.get("samples_in_step", 0), "the Grain state's samples_in_step")
        self.checkpoint.check(state.get("data_record"), step, "the Grain state", samples_in_step=samples)
        return step, samples

    def position_of_grain_state(self, state: bytes | str) -> dict[str, int]:
        """``{"step", "samples_in_step"}`` where the process that saved Grain's ``DataLoaderIterator.get_state()``
        ``state`` (over a :class:`PlanSampler` of this source) stands: its next record. Any process count resumes from
        it (:func:`data_loader` with ``start=``); Grain's own ``set_state`` only into the same rank, world size and
        start. ValueError when the state is not a Grain ``DataLoader`` state of a sampler of this source's data."""
        saved = json.loads(state.decode() if isinstance(state, bytes) else state)
        seen = saved.get("last_seen_indices") if isinstance(saved, dict) else None
        if (
            not isinstance(saved, dict)
            or saved.get("version") != 2
            or not isinstance(seen, dict)
            or not seen
            or not all(is_int(v) for v in seen.values())
        ):
            raise ValueError(f"not a Grain DataLoader iterator state (version 2): {str(saved)[:200]!r}")
        match = _SAMPLER_REPR.match(str(saved.get("sampler", "")))
        if match is None or saved.get("data_source") != repr(self):
            raise ValueError(
                f"the Grain state was saved by sampler {saved.get('sampler')!r} over {saved.get('data_source')!r}, "
                f"not by a detsampler PlanSampler over {self!r} (other data, or another micro batch size)"
            )
        rank, world_size, start_step, start_samples = (int(match.group(i)) for i in range(1, 5))
        # NOTE: Grain's workers hand records out in order, so the next one follows the newest last seen index.
        global_index = max(int(v) for v in saved["last_seen_indices"].values()) + world_size
        return self._position_after(global_index // world_size, rank, world_size, (start_step, start_samples))

    def position_of_map_state(
        self, state: Mapping[str, Any], rank: int, world_size: int, start: int | Mapping[str, Any] | None = None
    ) -> dict[str, int]:
        """``{"step", "samples_in_step"}`` where process ``rank`` of ``world_size`` stands after the Grain iterator
        state ``state`` of a :func:`map_dataset` pipeline (started at ``start``, as given to it): ``{"next_index": k}``
        (``to_iter_dataset()``), or ``.mp_prefetch()``'s state (its workers' ``next_index`` summed). That state names
        neither the data nor the process count, so the caller vouches for them; any process count resumes from the
        result (``start=``)."""
        if isinstance(state, Mapping) and "next_index" in state:
            consumed = _whole(state["next_index"], "the Grain state's next_index", minimum=0)
        elif isinstance(state, Mapping) and "iterators_in_use_states" in state:
            consumed = sum(
                _whole(worker["next_index"], "the Grain state's next_index", minimum=0)
                for worker in state["iterators_in_use_states"]
            )
        else:
            raise ValueError(f"not the Grain iterator state of a map_dataset pipeline: {str(state)[:200]!r}")
        self.plan.with_world(world_size)._check_rank(rank)  # NOTE: an outside rank gave a negative samples_in_step
        return self._position_after(consumed, rank, world_size, _start(self, start))

    def _position_after(self, consumed: int, rank: int, world_size: int, start: tuple[int, int]) -> dict[str, int]:
        """Where process ``rank`` of ``world_size`` stands once it has taken ``consumed`` records from ``start``."""
        record = self.first_record(*start, world_size) + rank + consumed * world_size
        if record >= self._length:
            return {"step": self.num_steps, "samples_in_step": 0}
        step, micro_step = self.position(record)
        per_micro_step = world_size * self.plan.micro_batch_size
        return {"step": step, "samples_in_step": (micro_step - rank) // world_size * per_micro_step}


class PlanSampler:
    """Grain's index sampler for process ``rank`` of ``world_size``: global index ``g`` reads record ``first + g``
    of ``source``, ``first`` the record of the start (``start_step``, ``samples_in_step`` into it).

    Pass it to ``grain.DataLoader`` with ``shard_options=sampler.shard_options`` (what :func:`data_loader` does):
    Grain then asks process ``rank`` for ``g = rank, rank + world_size, ...``, which are its micro batches of the plan
    cut for ``world_size``. A loader with other shard options is refused at the first record. ``len(sampler)`` is the
    number of global indices up to the source's ``num_steps``.
    """

    def __init__(
        self, source: PlanSource, rank: int, world_size: int, start_step: int = 0, samples_in_step: int = 0
    ) -> None:
        if not isinstance(source, PlanSource):
            raise TypeError(f"source must be a PlanSource, got {type(source).__name__}")
        self.source = source
        source.plan.with_world(world_size)._check_rank(rank)
        self.rank, self.world_size = int(rank), int(world_size)
        self.start_step, self.samples_in_step = int(start_step), int(samples_in_step)
        self.first = source.first_record(start_step, samples_in_step, world_size)
        self.shard_options = grain.sharding.ShardOptions(shard_index=self.rank, shard_count=self.world_size)
        self._shard_options = self.shard_options  # NOTE: what grain.DataLoader reads when given no shard_options
        self._checked = False  # the reader's shard options compared (at the first read)

    def __len__(self) -> int:
        return len(self.source) - self.first

    def __repr__(self) -> str:
        # NOTE: Grain saves this with its iterator state and refuses a state whose repr differs: a state restored into
        # another rank, world size or start would name other records, so each is part of it.
        return (
            f"detsampler.PlanSampler(rank={self.rank}, world_size={self.world_size}, start_step={self.start_step}, "
            f"samples_in_step={self.samples_in_step}, data={self.source.data_hash})"
        )

    def __getitem__(self, index: int) -> Any:
        if not self._checked:
            self._check_caller(sys._getframe(1))
        if not 0 <= index < len(self):
            raise IndexError(f"Got index {index}, allowed indices are in [0, {len(self)})")
        if index % self.world_size != self.rank:
            self._refuse(f"global index {index}, which belongs to shard {index % self.world_size}")
        return grain.RecordMetadata(index=index, record_key=self.first + index)

    def _check_caller(self, frame: FrameType | None) -> None:
        """Refuse a Grain reader whose shard options are not this sampler's.

        NOTE: ``grain.DataLoader`` reads the sampler through a map dataset that holds the loader's ``_shard_options``
        and asks for ``k * shard_count + shard_index``: with another shard count every index may still fall on this
        rank (4 shards over a sampler of 2) and name other records, so the options are compared once, at the first
        read (in each worker process), not inferred from the indices.
        """
        owner = frame.f_locals.get("self") if frame is not None else None
        options = getattr(owner, "_shard_options", None)
        mine = (self.rank, self.world_size)
        if isinstance(options, grain.sharding.ShardOptions) and (options.shard_index, options.shard_count) != mine:
            self._refuse(
                f"records with ShardOptions(shard_index={options.shard_index}, shard_count={options.shard_count})"
            )
        self._checked = True

    def _refuse(self, what: str) -> None:
        raise ValueError(
            f"Grain asked PlanSampler(rank={self.rank}, world_size={self.world_size}) for {what}: pass "
            "shard_options=sampler.shard_options to grain.DataLoader (or build it with data_loader())"
        )


def _whole(value: Any, what: str, minimum: int | None = None) -> int:
    """``value`` as an int, or a ValueError naming ``what``: a state's step is never rounded (7.9 is not step 7)."""
    if not is_int(value) or (minimum is not None and value < minimum):
        rule = "an integer" if minimum is None else f"an integer >= {minimum}"
        raise ValueError(f"{what} must be {rule}, got {value!r}")
    return int(value)


def _start(source: PlanSource, start: int | Mapping[str, Any] | None) -> tuple[int, int]:
    if start is None:
        return 0, 0
    if isinstance(start, Mapping):
        if "data_record" in start:
            return source.resume_position(start)
        # a position read from Grain's state (PlanSource.position_of_grain_state), whose data was checked there
        return _whole(start["step"], "start's step"), _whole(start.get("samples_in_step", 0), "start's samples_in_step")
    if not is_int(start):
        raise ValueError(f"start must be a step (an integer) or a state, got {start!r}")
    return int(start), 0


def data_loader(
    source: PlanSource,
    rank: int,
    world_size: int,
    *,
    start: int | Mapping[str, Any] | None = None,
    operations: Sequence[Any] = (),
    worker_count: int = 0,
    worker_buffer_size: int = 1,
    read_options: Any = None,
) -> Any:
    """A ``grain.DataLoader`` of process ``rank`` of ``world_size``: its micro batches of ``source``'s plan, in order,
    from ``start`` (a step; a :meth:`PlanSource.state_dict`, whose data record is checked; or a
    :meth:`PlanSource.position_of_grain_state`), through ``operations`` (Grain transforms applied to each record)."""
    _refuse_worker_batching(operations, worker_count)
    step, samples = _start(source, start)
    sampler = PlanSampler(source, rank, world_size, step, samples)
    return grain.DataLoader(
        data_source=source,
        sampler=sampler,
        operations=list(operations),
        worker_count=worker_count,
        worker_buffer_size=worker_buffer_size,
        shard_options=sampler.shard_options,
        read_options=read_options,
    )


def _refuse_worker_batching(operations: Sequence[Any], worker_count: int) -> None:
    """NOTE: with 2 or more workers Grain applies ``operations`` inside each worker, to records ``w, w + W, ...``: a
    ``Batch`` would stack micro batches of different micro steps (and steps), not consecutive ones."""
    batches = (grain.transforms.Batch, getattr(getattr(grain, "python", None), "BatchOperation", ()))
    if worker_count and worker_count >= 2 and any(isinstance(op, batches) for op in operations):
        raise ValueError(
            f"a Batch operation with worker_count={worker_count} stacks each worker's records (records w, w + "
            f"{worker_count}, ...), not consecutive micro batches: a record is already a micro batch (set the plan's "
            "micro_batch_size), or batch with worker_count 0 or 1"
        )


def map_dataset(source: PlanSource, rank: int, world_size: int, *, start: int | Mapping[str, Any] | None = None) -> Any:
    """A ``grain.MapDataset`` whose element ``k`` is process ``rank``'s ``k``-th micro batch from ``start`` (as for
    :func:`data_loader`). Its iterator's Grain state (``{"next_index": k}``) counts this process's elements from the
    start: checkpoint :meth:`PlanSource.state_dict` of the step as well, which any process count resumes from.

    NOTE: ``.mp_prefetch`` with ``W`` workers runs what comes before it on elements ``w, w + W, ...`` of each worker: a
    ``.batch`` before it stacks micro batches of different steps (as :func:`data_loader` refuses); batch after it, or
    not at all (an element is already a micro batch)."""
    step, samples = _start(source, start)
    first = PlanSampler(source, rank, world_size, step, samples).first
    return grain.MapDataset.source(source)[first + rank :: world_size]
