"""The torch adapter: a batch sampler that yields a rank's micro batches step by step, from any position, and whose
state is the next micro batch not yet consumed."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterable, Iterator, Mapping
from types import FrameType
from typing import Any

from torch.utils.data import DataLoader, Sampler

from detsampler.plan import Plan, _check_step

__all__ = ["DeterministicBatchSampler", "PlannedIds"]

_STATE_KEYS = ("step", "samples_in_step")
_CUT_KEYS = ("world_size", "micro_batch_size")  # a balanced plan's mid-step state: how its step was dealt
_AHEAD_SAMPLES = 512  # sample ids planned per stream call (a chunk of micro batches): bounds the sampler's memory
_AHEAD_MICRO_BATCHES = 64


class PlannedIds(list):
    """A micro batch's sample ids (a ``list``, as every batch sampler yields) that also says where the plan puts it:
    ``step``, ``micro_step``, ``rank``, and the ``stop_step`` of the sampler that yielded it (None: endless). It
    travels to the DataLoader worker that reads it, where a prefetching :class:`~detsampler.loader.PackedDataset` knows
    from it the micro batches that worker reads next (:mod:`detsampler.reads`). Equal to the plain list of its ids."""

    def __init__(self, ids: list[int], step: int, micro_step: int, rank: int, stop_step: int | None) -> None:
        super().__init__(ids)
        self.step, self.micro_step, self.rank, self.stop_step = step, micro_step, rank, stop_step

    def __reduce__(self):
        return (PlannedIds, (list(self), self.step, self.micro_step, self.rank, self.stop_step))


class DeterministicBatchSampler(Sampler[list[int]]):
    """The micro batches (lists of sample ids) of ``rank``, from step ``start_step`` up to (excluding) ``stop_step``.

    Pass it as ``batch_sampler=`` to a ``torch.utils.data.DataLoader`` (or torchdata's ``StatefulDataLoader``) over a
    map-style dataset. It yields micro step ``0, 1, ...`` of each step of ``plan`` in turn; the DataLoader dispatches
    batches to workers round-robin and returns them in order, so ``num_workers`` changes nothing but speed.

    State: ``state_dict() == {"step": s, "samples_in_step": k}`` names the next micro batch not yet consumed: step
    ``s``, whose first ``k`` samples (all ranks together: ``k = micro_step * world_size * micro_batch_size``) were
    consumed. It is equal on every rank that consumed the same number of micro batches, and elastic: it loads into a
    plan of another ``world_size`` or ``micro_batch_size`` (mid-step only where ``k`` is a whole number of its micro
    steps; at a step boundary, ``k == 0``, always). ``{"step": s}`` alone means ``k == 0``. What counts as consumed:

    - iterating the sampler directly (or a DataLoader without workers): each micro batch it yields;
    - :meth:`steps`: each step it hands out, even while a DataLoader's workers run the sampler ahead;
    - torchdata's ``StatefulDataLoader``: the sampler's iterator is itself stateful (the position of the next micro
      batch it yields), which the loader snapshots as it hands out each batch, so ``loader.state_dict()`` resumes at
      the next micro batch the loader has not returned, mid-step included, with any ``num_workers``.

    A driver that reads ahead of the training step runs the sampler ahead of consumption: a DataLoader with workers
    (``prefetch_factor * num_workers`` micro batches), accelerate's and Lightning's loaders (one batch), or any
    iteration in another thread than the one asking for the state. The sampler cannot see what such a loop consumed,
    so there :meth:`state_dict` refuses (RuntimeError naming the driver and the fix) instead of naming a micro batch
    never trained on; :meth:`steps`, ``StatefulDataLoader.state_dict()``, or the trainer's own step count are exact.
    Every iteration starts at the state; ``stop_step`` is absolute and never moves.
    """

    def __init__(self, plan: Plan, rank: int, start_step: int = 0, stop_step: int | None = None) -> None:
        plan._check_rank(rank)
        start_step = _check_step(start_step, "start_step")
        if stop_step is not None:
            stop_step = _check_step(stop_step, "stop_step")
            if stop_step < start_step:
                raise ValueError(f"stop_step {stop_step} comes before start_step {start_step}")
        self.plan = plan
        self.rank = int(rank)
        self.start_step = start_step
        self.stop_step = stop_step
        self._position = (start_step, 0)  # (step, micro step) of the next micro batch not yet consumed
        self._iter_start = self._position  # where the newest iteration started (or was restored)
        self._generation = 0  # iterations made so far
        self._tracked_up_to = 0  # iterations whose yields no longer count as consumed (steps() counts instead)
        self._ahead_of_consumption: str | None = None  # why the last move of the state may be ahead of consumption
        self._moved_in_thread: int | None = None  # the thread whose iteration last moved the state
        self._lock = threading.Lock()  # a DataLoader may run the sampler in a thread beside steps()

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        del state["_lock"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def __iter__(self) -> _MicroBatches:
        caller = sys._getframe(1)
        _refuse_resharding(self, caller)
        loader, package = _driver(caller)
        refusal = _out_of_order(loader)
        if refusal is not None:  # NOTE: torch calls iter() in its iterator's constructor, before any worker starts
            _disarm(caller.f_locals.get("self"))
            raise ValueError(refusal)
        reads_ahead = _read_ahead(loader, package)
        with self._lock:
            self._generation += 1
            self._iter_start = self._position
            return _MicroBatches(self, self._position, self._generation, reads_ahead)

    def __len__(self) -> int:
        """Micro batches from the state up to ``stop_step``: what a new iteration yields."""
        if self.stop_step is None:
            raise TypeError("an endless DeterministicBatchSampler has no length: pass stop_step")
        step, micro_step = self._position
        if step >= self.stop_step:
            return 0
        return self.plan.micro_steps_between(step, self.stop_step) - micro_step

    def _done(self, step: int) -> bool:
        return self.stop_step is not None and step >= self.stop_step

    def _yielded(self, generation: int, position: tuple[int, int], ahead: str | None, thread: int) -> None:
        with self._lock:
            if generation > self._tracked_up_to:
                self._position = position
                if ahead is None and thread != threading.get_ident():
                    ahead = "it is iterated in another thread, which may read ahead of the training step"
                self._ahead_of_consumption = ahead
                self._moved_in_thread = threading.get_ident()

    def _restored(self, position: tuple[int, int]) -> None:
        with self._lock:
            self._position = self._iter_start = position
            self._ahead_of_consumption = None

    def steps(self, batches: Iterable[Any]) -> Iterator[tuple[int, list[Any]]]:
        """Group ``batches`` (a DataLoader over this sampler, possibly wrapped) by step: ``(step, micro_batches)``.

        The batches are labelled from where the sampler's newest iteration started or was restored (a restored
        ``StatefulDataLoader``'s position, mid-step included: the first step yielded then holds only its remaining micro
        batches). Before each step is yielded, the state moves past it, so a checkpoint taken after training it resumes
        at the next one, however far the DataLoader has run the sampler ahead.
        """
        _check_snapshots(batches)
        refusal = _out_of_order(batches)
        if refusal is not None:
            raise ValueError(refusal)
        it = iter(batches)
        with self._lock:
            self._tracked_up_to = self._generation
            self._ahead_of_consumption = None
            step, micro_step = self._position = self._iter_start
        while not self._done(step):
            micro_batches = []
            for _ in range(self.plan.num_micro_steps(step) - micro_step):
                try:
                    micro_batches.append(next(it))
                except StopIteration:
                    return
            with self._lock:
                self._position = (step + 1, 0)
            yield step, micro_batches
            step, micro_step = step + 1, 0

    def state_dict(self) -> dict[str, int]:
        """The next micro batch not yet consumed (see the class doc), or RuntimeError when the loop driving the sampler
        reads ahead of consumption and :meth:`steps` does not count for it."""
        # NOTE: a StatefulDataLoader snapshots this state beside its sampler iterator's (exact) state, and restores the
        # iterator's over it: this one is not used there, so its own snapshots are answered, not refused.
        snapshot = str(sys._getframe(1).f_globals.get("__name__", "")).startswith("torchdata.")
        with self._lock:
            ahead = None if snapshot else self._ahead_of_consumption
            if ahead is None and not snapshot and self._moved_in_thread not in (None, threading.get_ident()):
                ahead = "it was iterated in another thread, which may read ahead of the training step"
            if ahead is not None:
                raise RuntimeError(
                    f"DeterministicBatchSampler.state_dict() cannot name the next unconsumed micro batch: {ahead}, so"
                    f" the sampler's position ({self._state(self._position)}) is past what was trained. Iterate with"
                    " `for step, micro_batches in sampler.steps(loader)` (the state moves as steps are handed out),"
                    " checkpoint a torchdata StatefulDataLoader's loader.state_dict(), or save the step your loop"
                    " trained: {'step': s} is the whole state"
                )
            return self._state(self._position)

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        """Resume at ``state`` (refused, with nothing changed, unless it is a valid state of this sampler's plan)."""
        position = self._parse(state)
        with self._lock:
            self._position = self._iter_start = position
            self._tracked_up_to = self._generation  # iterations made before no longer move the state
            self._ahead_of_consumption = self._moved_in_thread = None

    def _state(self, position: tuple[int, int]) -> dict[str, int]:
        step, micro_step = position
        state = {"step": step, "samples_in_step": micro_step * self.plan.world_size * self.plan.micro_batch_size}
        if micro_step and self.plan.balance is not None:  # NOTE: which samples were consumed depends on the cut
            state.update(world_size=self.plan.world_size, micro_batch_size=self.plan.micro_batch_size)
        return state

    def _parse(self, state: Mapping[str, int]) -> tuple[int, int]:
        if not isinstance(state, Mapping):
            raise TypeError(f"state must be a dict like {{'step': 3}}, got {type(state).__name__}")
        unknown = sorted(str(key) for key in state if key not in _STATE_KEYS + _CUT_KEYS)
        if unknown:
            raise ValueError(
                f"unknown keys {unknown} in the sampler state: expected 'step' and optionally 'samples_in_step'"
            )
        if "step" not in state:
            raise ValueError("the sampler state is missing 'step'")
        step = _check_step(state["step"], "step")
        samples = _check_step(state.get("samples_in_step", 0), "samples_in_step")
        per_micro_step = self.plan.world_size * self.plan.micro_batch_size
        if self.stop_step is not None and (step, samples) > (self.stop_step, 0):
            raise ValueError(f"step {step} is past stop_step {self.stop_step}")
        if samples and samples >= self.plan.batch_size(step):
            raise ValueError(
                f"samples_in_step {samples} of step {step} must be < its batch size {self.plan.batch_size(step)}"
            )
        if samples % per_micro_step:
            raise ValueError(
                f"samples_in_step {samples} of step {step} is not a whole number of micro steps of world_size * "
                f"micro_batch_size = {self.plan.world_size} * {self.plan.micro_batch_size}: resume this mid-step "
                "checkpoint with a world size and micro batch size that divide it"
            )
        if samples:
            self._check_cut(state, step)
        return step, samples // per_micro_step

    def _check_cut(self, state: Mapping[str, int], step: int) -> None:
        """A balanced plan deals each step's samples for its world size and micro batch size: a mid-step state names
        the consumed samples only under the cut that saved it."""
        cut = {key: state.get(key) for key in _CUT_KEYS}
        if self.plan.balance is None or cut == {
            "world_size": self.plan.world_size,
            "micro_batch_size": self.plan.micro_batch_size,
        }:
            return
        raise ValueError(
            f"the sampler state is mid-step {step} of a balanced plan dealt for world_size, micro_batch_size ="
            f" {cut['world_size']}, {cut['micro_batch_size']} but this plan has {self.plan.world_size},"
            f" {self.plan.micro_batch_size}: a balanced plan deals each step anew for its cut, so resume a mid-step"
            " state with the same world size and micro batch size (at a step boundary any cut resumes)"
        )


class _MicroBatches:
    """One iteration of a sampler: its micro batches from a position on. Its state is the next micro batch it yields.

    torchdata's ``StatefulDataLoader`` saves this state as it hands out each batch and restores it before prefetching
    again, which is what makes a restored loader resume at its next unreturned micro batch.
    """

    def __init__(
        self,
        sampler: DeterministicBatchSampler,
        position: tuple[int, int],
        generation: int,
        reads_ahead: str | None,
    ) -> None:
        self._sampler = sampler
        self._position = position
        self._generation = generation
        self._reads_ahead = reads_ahead  # why its driver reads ahead of consumption (None: it does not)
        self._thread = threading.get_ident()  # the thread that started it
        self._ahead: list[list[int]] = []  # planned micro batches, the next one last: at _ahead_at[-1]
        self._ahead_at: list[tuple[int, int]] = []  # their positions, then the one after them (reversed likewise)

    def __iter__(self) -> _MicroBatches:
        return self

    def __next__(self) -> list[int]:
        if not self._ahead or self._ahead_at[-1] != self._position:
            self._plan_ahead()
            if not self._ahead:
                raise StopIteration
        ids = self._ahead.pop()
        self._ahead_at.pop()
        self._position = self._ahead_at[-1]
        self._sampler._yielded(self._generation, self._position, self._reads_ahead, self._thread)
        return ids

    def _plan_ahead(self) -> None:
        """Plan the next chunk of micro batches from the position on in one stream call (the plan's values)."""
        sampler, (step, micro_step) = self._sampler, self._position
        self._ahead, self._ahead_at = [], []
        if sampler._done(step):
            return
        count = max(1, min(_AHEAD_MICRO_BATCHES, _AHEAD_SAMPLES // sampler.plan.micro_batch_size))
        ids, where = sampler.plan.micro_batches_from(step, micro_step, sampler.rank, count, sampler.stop_step)
        rows = [
            PlannedIds(row, step, micro, sampler.rank, sampler.stop_step)
            for row, (step, micro) in zip(ids.tolist(), where)
        ]
        self._ahead, self._ahead_at = rows[::-1], where[::-1]

    def state_dict(self) -> dict[str, int]:
        return self._sampler._state(self._position)

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        self._position = self._sampler._parse(state)
        self._sampler._restored(self._position)


def _check_snapshots(batches: Iterable[Any]) -> None:
    """Refuse a multi-process loader that snapshots its state less often than every batch.

    NOTE: a ``StatefulDataLoader`` restored from a snapshot taken ``n`` batches back replays those batches internally,
    so the first batch :meth:`DeterministicBatchSampler.steps` sees is not the restored position and its steps would be
    mislabelled.
    """
    every = getattr(batches, "snapshot_every_n_steps", 1)
    if getattr(batches, "num_workers", 0) and every != 1:
        raise ValueError(
            f"steps() over a StatefulDataLoader with workers needs snapshot_every_n_steps=1 (got {every!r}): a "
            "restored loader replays the batches since its last snapshot, which steps() cannot see"
        )


# Loaders of these packages fetch the next batch before the current one is trained (accelerate's DataLoaderShard to know
# which batch is the last; Lightning's prefetching data fetcher): the sampler they iterate runs one micro batch ahead.
_READ_AHEAD_PACKAGES = ("accelerate", "lightning", "pytorch_lightning", "lightning_fabric")
_MAX_CALLER_FRAMES = 48


def _out_of_order(loader: Any) -> str | None:
    """Why ``loader`` is refused when it hands out batches in the order its workers finish them (``in_order=False``,
    torch >= 2.6, and torchdata's ``StatefulDataLoader``), else None.

    NOTE: the micro batches carry no step once collated, so :meth:`DeterministicBatchSampler.steps` labels them by
    their count, and a training loop accumulates them in the order they come: out of order, a step would train micro
    batches of other steps. Without workers, ``in_order`` changes nothing and is accepted.
    """
    workers = getattr(loader, "num_workers", 0)
    if workers and getattr(loader, "in_order", True) is False:
        return (
            f"{type(loader).__name__}(in_order=False) with num_workers={workers} hands out micro batches in the order"
            " its workers finish them, not the plan's: a step would train micro batches of other steps;"
            " use in_order=True (the default)"
        )


def _disarm(iterator: Any) -> None:
    """Make the collection of a DataLoader iterator refused in its constructor do nothing.

    NOTE: torch's (and torchdata's) multi-process iterator calls ``iter(batch_sampler)`` in its constructor, before it
    starts a worker, so a refusal there leaves no process or thread; but its ``__del__`` would call
    ``_shutdown_workers`` on attributes never set, printing a second traceback ("Exception ignored in ...") whenever the
    half-made iterator is collected. Marked as shut down (nothing to shut down), it is collected silently.
    """
    if hasattr(type(iterator), "_shutdown_workers") and not hasattr(iterator, "_shutdown"):
        iterator._shutdown = True


def _driver(frame: FrameType | None) -> tuple[DataLoader | None, str | None]:
    """The DataLoader that starts this iteration (None: none is among the calling frames), and the module of the first
    calling frame in a package whose loader reads ahead (None: none).

    NOTE: torch's DataLoader iterator calls ``iter(batch_sampler)`` in its constructor, so the loader and whoever
    iterates it are ``self`` and module of the calling frames; this runs once per iteration, never per batch.
    """
    loader = None
    for _ in range(_MAX_CALLER_FRAMES):
        if frame is None:
            break
        owner = frame.f_locals.get("self")
        if loader is None and isinstance(owner, DataLoader):
            loader = owner
        module = str(frame.f_globals.get("__name__", ""))
        if module.partition(".")[0] in _READ_AHEAD_PACKAGES:
            return loader, module
        frame = frame.f_back
    return loader, None


def _read_ahead(loader: DataLoader | None, package: str | None) -> str | None:
    """Why the loop starting this iteration reads ahead of consumption (see :func:`_driver`), or None when each
    yielded micro batch is consumed before the next is asked for (the sampler iterated directly, or by a DataLoader
    without workers)."""
    if package is not None:
        return f"it is iterated through {package}, whose loader fetches batches ahead"
    workers = getattr(loader, "num_workers", 0)
    if workers:
        ahead = workers * (getattr(loader, "prefetch_factor", None) or 2)
        return (
            f"a {type(loader).__name__} with num_workers={workers} runs it up to {ahead} micro batches ahead of"
            " the batches it returned"
        )
    return None


def _refuse_resharding(sampler: DeterministicBatchSampler, frame: FrameType | None) -> None:
    """Refuse to be iterated by a wrapper that shards batch samplers across processes (``num_processes > 1``).

    NOTE: accelerate's ``prepare`` wraps any batch sampler in a ``BatchSamplerShard`` that keeps every
    ``num_processes``-th batch on each process. This sampler's micro batches are already its rank's share, so that
    wrapper would silently keep 1/W of them. The wrapper is the ``self`` of a calling frame that holds this sampler as
    its ``batch_sampler``.
    """
    for _ in range(3):
        if frame is None:
            return
        owner = frame.f_locals.get("self")
        if owner is not None and owner is not sampler and getattr(owner, "batch_sampler", None) is sampler:
            shards = getattr(owner, "num_processes", 1)
            if isinstance(shards, int) and shards > 1:
                raise RuntimeError(
                    f"DeterministicBatchSampler is wrapped by {type(owner).__name__}(num_processes={shards}), "
                    f"which would keep 1 of every {shards} of rank {sampler.rank}'s micro batches (they are already "
                    "that rank's share): prepare the DataLoader with "
                    "detsampler.integrations.hf.prepare_data_loader(accelerator, loader), or train with "
                    "detsampler.integrations.hf.DetsamplerTrainer"
                )
            return
        frame = frame.f_back
