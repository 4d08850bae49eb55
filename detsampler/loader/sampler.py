"""The torch adapter: a batch sampler that yields a rank's micro batches step by step, from any start step."""

from __future__ import annotations

from typing import Any, Iterable, Iterator

from torch.utils.data import Sampler

from detsampler.plan import Plan, _check_step

__all__ = ["DeterministicBatchSampler"]


class DeterministicBatchSampler(Sampler[list[int]]):
    """The micro batches (lists of sample ids) of ``rank``, for steps ``start_step, start_step + 1, ...``.

    Pass it as ``batch_sampler=`` to a ``torch.utils.data.DataLoader`` over a map-style dataset. The i-th batch it yields is
    micro step ``a`` of step ``s`` of ``plan``; the DataLoader dispatches batches to workers round-robin and returns them in
    order, so ``num_workers`` changes nothing but speed, and workers never read the same sample.

    Its only state is a step number, the same on every rank: ``state_dict() == {"step": s}`` names the next step to train.
    It is advanced by :meth:`steps` (which groups a DataLoader's batches by step) or set with :meth:`load_state_dict`.
    """

    def __init__(self, plan: Plan, rank: int, start_step: int = 0, num_steps: int | None = None) -> None:
        plan._check_rank(rank)
        if num_steps is not None:
            _check_step(num_steps, "num_steps")
        self.plan = plan
        self.rank = int(rank)
        self.start_step = _check_step(start_step, "start_step")
        self.num_steps = num_steps
        self._next_step = self.start_step

    @property
    def stop_step(self) -> int | None:
        return None if self.num_steps is None else self.start_step + self.num_steps

    def __iter__(self) -> Iterator[list[int]]:
        step = self.start_step
        while self.stop_step is None or step < self.stop_step:
            for micro_step in range(self.plan.num_micro_steps(step)):
                yield self.plan.micro_batch(step, micro_step, self.rank).tolist()
            step += 1

    def __len__(self) -> int:
        if self.stop_step is None:
            raise TypeError("an endless DeterministicBatchSampler has no length: pass num_steps")
        return self.plan.micro_steps_between(self.start_step, self.stop_step)

    def steps(self, batches: Iterable[Any]) -> Iterator[tuple[int, list[Any]]]:
        """Group ``batches`` (a DataLoader over this sampler) by step: yields ``(step, [micro batches])``.

        Before each step is yielded, the state moves past it, so a checkpoint taken after training it resumes at the next one.
        """
        it = iter(batches)
        step = self.start_step
        while self.stop_step is None or step < self.stop_step:
            micro_batches = []
            for _ in range(self.plan.num_micro_steps(step)):
                try:
                    micro_batches.append(next(it))
                except StopIteration:
                    return
            self._next_step = step + 1
            yield step, micro_batches
            step += 1

    def state_dict(self) -> dict[str, int]:
        return {"step": self._next_step}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Resume at ``state["step"]``: the next iteration starts there; ``num_steps`` keeps counting from it."""
        step = _check_step(int(state["step"]), "step")
        self.start_step = self._next_step = step
