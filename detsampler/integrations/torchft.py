"""torchft (0.2.0): the plan's global batch of each step, split among the replica groups alive at that step's quorum.

torchft keeps a job running while replica groups fail and rejoin: before each step ``Manager.start_quorum()`` (called
by ``torchft.Optimizer.zero_grad()``) agrees with the lighthouse on the groups taking part; ``Manager.should_commit()``
(called by ``torchft.Optimizer.step()``) says whether the step's gradient is applied, and only then advances
``Manager.current_step()``. torchft's own ``torchft.data.DistributedSampler`` gives each group a fixed slice of the data
(``rank + num_replicas * replica_rank`` of ``num_replicas * num_replica_groups``): while a group is down its slice is
never read and the global batch shrinks (meta-pytorch/torchft#186, #292).

Here the data of step ``s`` is fixed by the plan (``plan.global_batch(s)``, ``B(s)`` samples); only its split changes.
At each quorum, with ``P = manager.num_participants()`` participating groups of ``W`` data-parallel ranks each, the rank
``r`` of the group whose ``manager.participating_rank()`` is ``p`` reads slot ``j = p * W + r`` of ``P * W``: the
positions ``[j * B // (P * W), (j + 1) * B // (P * W))`` of the step's global batch (:func:`replica_share`).

Invariants (tests/integrations/test_torchft.py):

- the shares of the ``P * W`` slots of a quorum partition the step's global batch, whatever ``P`` and ``W``: every
  committed step trains exactly the plan's ``B(s)`` samples, each once, however many groups are alive;
- the step is torchft's own ``manager.current_step()``, read after the quorum (a healing group has just received it
  from a peer): a step whose commit fails is trained again on the same samples by the next quorum, and nothing but
  torchft's step (which its ``Manager.state_dict`` already saves) is stored;
- a group that is not participating (healing: torchft zeroes its gradient) reads nothing.

The loss: torchft's ``allreduce`` averages the gradients of the ``P`` groups, each group's own data parallelism
averages over its ``W`` ranks, and the shares differ by up to one sample. Scale the *sum* of the per-sample losses of a
rank's share by :attr:`ReplicaShare.loss_scale` ``= P * W / B(s)``: the two averages then give exactly
``(1 / B(s)) * sum(per-sample gradients of the global batch)``, the gradient a single process would compute on the
whole step, whatever the shares. (Per-token losses: divide the sum by the global batch's token count instead, times
``P * W``; every group can compute it from the plan without a collective.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from detsampler.checks import is_int
from detsampler.integrations import require
from detsampler.plan import Plan

require("torchft", "torchft")

__all__ = ["FaultTolerantSampler", "ReplicaShare", "replica_share"]


def replica_share(
    global_batch: np.ndarray,
    participating_rank: int | None,
    num_participants: int,
    group_rank: int = 0,
    group_world_size: int = 1,
) -> np.ndarray:
    """The part of ``global_batch`` that ``group_rank`` of the replica group ``participating_rank`` reads when
    ``num_participants`` groups of ``group_world_size`` ranks take part; empty when the group is not participating
    (``None``). The ``num_participants * group_world_size`` shares partition ``global_batch`` in order, their sizes
    differing by at most one."""
    _check_rank(group_rank, group_world_size, "group_rank", "group_world_size")
    if participating_rank is None:
        return np.asarray(global_batch)[:0]
    _check_rank(participating_rank, num_participants, "participating_rank", "num_participants")
    slots = num_participants * group_world_size
    slot = participating_rank * group_world_size + group_rank
    size = len(global_batch)
    return np.asarray(global_batch)[slot * size // slots : (slot + 1) * size // slots]


def _check_rank(rank: Any, world_size: Any, rank_name: str, size_name: str) -> None:
    if not is_int(world_size) or world_size < 1:
        raise ValueError(f"{size_name} must be an integer >= 1, got {world_size!r}")
    if not is_int(rank) or not 0 <= rank < world_size:
        raise ValueError(f"Got {rank_name} {rank!r}, allowed values are in [0, {world_size})")


@dataclass(frozen=True)
class ReplicaShare:
    """What one rank trains at one quorum: the ``sample_ids`` of ``step`` it reads (empty when its group is not
    participating), the quorum it was split for and the step's ``global_batch_size``."""

    step: int
    sample_ids: np.ndarray
    participating_rank: int | None
    num_participants: int
    group_world_size: int
    global_batch_size: int

    @property
    def loss_scale(self) -> float:
        """The factor for the *sum* of this share's per-sample losses: ``num_participants * group_world_size /
        global_batch_size`` (0 when not participating), so that torchft's average over the groups and the group's own
        average over its ranks give the mean over the step's global batch."""
        if self.participating_rank is None:
            return 0.0
        return self.num_participants * self.group_world_size / self.global_batch_size


class FaultTolerantSampler:
    """The step's share of one rank of a torchft replica group, read from ``manager`` at each quorum.

    Call :meth:`share` after ``manager.start_quorum()`` (``torchft.Optimizer.zero_grad()``) and before the forward
    pass; it waits for the quorum. The step is ``manager.current_step()``: torchft advances it only on a commit, so a
    failed step is read again, split among the next quorum's groups. ``group_rank`` / ``group_world_size``: this rank
    within its replica group (the group's own data parallelism, e.g. FSDP's ranks).
    """

    def __init__(self, manager: Any, plan: Plan, group_rank: int = 0, group_world_size: int = 1) -> None:
        _check_rank(group_rank, group_world_size, "group_rank", "group_world_size")
        self.manager, self.plan = manager, plan
        self.group_rank, self.group_world_size = int(group_rank), int(group_world_size)

    def share(self) -> ReplicaShare:
        """This rank's :class:`ReplicaShare` of the current step, for the quorum ``manager.start_quorum()`` began."""
        participants = self.manager.num_participants()  # waits for the quorum (0: start_quorum was never called)
        if participants < 1:
            raise RuntimeError(
                "torchft's manager has no quorum (num_participants() is 0): call share() after manager.start_quorum() "
                "(torchft.Optimizer.zero_grad())"
            )
        rank = self.manager.participating_rank()
        step = self.manager.current_step()  # after the quorum: a healing group has just received the step
        batch = self.plan.global_batch(step)
        ids = replica_share(batch, rank, participants, self.group_rank, self.group_world_size)
        return ReplicaShare(step, ids, rank, participants, self.group_world_size, len(batch))
