"""torchft (0.2.0): the plan's global batch of each step, split among the replica groups alive at that step's quorum.

torchft keeps a job running while replica groups fail and rejoin: before each step ``Manager.start_quorum()`` (called
by ``torchft.Optimizer.zero_grad()``) agrees with the lighthouse on the groups taking part; ``Manager.should_commit()``
(called by ``torchft.Optimizer.step()``) says whether the step's gradient is applied, and only then advances
``Manager.current_step()``. torchft's own ``torchft.data.DistributedSampler`` gives each group a fixed slice of the data
(``rank + num_replicas * replica_rank`` of ``num_replicas * num_replica_groups``): while a group is down its slice is
never read and the global batch shrinks (meta-pytorch/torchft#186, #292).

Here the data of step ``s`` is fixed by the plan (``plan.global_batch(s)``, ``B(s)`` samples); only its split changes.
torchft averages each gradient over the ``P = manager.num_participants()`` groups of the quorum, but not every one of
them contributes: a group that heals this step has its gradient zeroed by ``Manager.allreduce`` (a group behind the
others, whose ``participating_rank()`` is None, and, with ``init_sync=True``, at step 0 every group but one, which keep
a participating rank). So :meth:`FaultTolerantSampler.share` first sums, through the same ``Manager.allreduce``, a flag
per participating rank that says whether its gradient counts: the result is the step's *contributors* (the same for all
of them, because the flags of a healing group are zeroed exactly as its gradient is). With ``W`` data-parallel ranks per
group, group rank ``r`` reads column ``r`` of the global batch (positions ``[r * B // W, (r + 1) * B // W)``), split
among the ``C`` contributors of that column in the order of their participating ranks (:func:`replica_share`).

Invariants (tests/integrations/test_torchft.py):

- the shares of the contributors partition the step's global batch, whatever ``P``, ``C`` and ``W``: every committed
  step trains exactly the plan's ``B(s)`` samples, each once, however many groups are alive or healing;
- the step is torchft's own ``manager.current_step()``, read after the quorum (a healing group has just received it
  from a peer): a step whose commit fails is trained again on the same samples by the next quorum, and nothing but
  torchft's step (which its ``Manager.state_dict`` already saves) is stored;
- a group whose gradient does not count this step reads nothing;
- with ``W > 1``, step 0 under ``init_sync=True`` with several groups is refused (torchft heals group rank ``r`` of each
  group from group ``r % P``: a group's data would count for some of its ranks and not for others); pass
  ``init_sync=False`` (the same seed in every group) or start one group first.

The loss: torchft's ``allreduce`` divides the sum of the groups' gradients by ``P`` (healing groups included, with zero
gradients), each group's own data parallelism averages over its ``W`` ranks, and the shares differ in size. Scale the
*sum* of the per-sample losses of a rank's share by :attr:`ReplicaShare.loss_scale` ``= P * W / B(s)``: the two
averages then give exactly ``(1 / B(s)) * sum(per-sample gradients of the global batch)``, the gradient a single process
would compute on the whole step, whatever the shares. (Per-token losses: divide the sum by the global batch's token
count instead, times ``P * W``; every group can compute it from the plan without a collective.)

:meth:`FaultTolerantSampler.share` is a collective: every rank of every group of the quorum calls it once per step,
after ``start_quorum()`` and before its gradients' allreduce (it costs one allreduce of ``P`` floats). If that allreduce
fails (a peer died), the share is empty and torchft fails the step's commit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from detsampler.checks import is_int
from detsampler.integrations import require
from detsampler.plan import Plan

require("torchft", "torchft")

import torch  # noqa: E402
from torch.distributed import ReduceOp  # noqa: E402

from detsampler.loader.redact import RedactedDataset  # noqa: E402

__all__ = ["FaultTolerantSampler", "ReplicaShare", "replica_share"]


def replica_share(
    global_batch: np.ndarray,
    contributor: int | None,
    num_contributors: int,
    group_rank: int = 0,
    group_world_size: int = 1,
) -> np.ndarray:
    """The part of ``global_batch`` that ``group_rank`` of a replica group reads when it is contributor number
    ``contributor`` of ``num_contributors`` (for this group rank); empty when its gradient does not count (``None``).
    Group rank ``r`` takes column ``r`` of ``group_world_size`` contiguous columns, split among the contributors in
    order: over every group rank and contributor, the shares partition ``global_batch``."""
    _check_rank(group_rank, group_world_size, "group_rank", "group_world_size")
    batch, size = np.asarray(global_batch), len(global_batch)
    column = batch[group_rank * size // group_world_size : (group_rank + 1) * size // group_world_size]
    if contributor is None:
        return column[:0]
    _check_rank(contributor, num_contributors, "contributor", "num_contributors")
    n = len(column)
    return column[contributor * n // num_contributors : (contributor + 1) * n // num_contributors]


def _check_rank(rank: Any, world_size: Any, rank_name: str, size_name: str) -> None:
    if not is_int(world_size) or world_size < 1:
        raise ValueError(f"{size_name} must be an integer >= 1, got {world_size!r}")
    if not is_int(rank) or not 0 <= rank < world_size:
        raise ValueError(f"Got {rank_name} {rank!r}, allowed values are in [0, {world_size})")


@dataclass(frozen=True)
class ReplicaShare:
    """What one rank trains at one quorum: the ``sample_ids`` of ``step`` it reads (empty when its group's gradient does
    not count), its group's ``participating_rank`` among ``num_participants``, the ``contributors`` (the participating
    ranks whose gradients count for this group rank) and the step's ``global_batch_size``."""

    step: int
    sample_ids: np.ndarray
    participating_rank: int | None
    num_participants: int
    contributors: tuple[int, ...]
    group_world_size: int
    global_batch_size: int

    @property
    def loss_scale(self) -> float:
        """The factor for the *sum* of this share's per-sample losses: ``num_participants * group_world_size /
        global_batch_size`` (0 when this group does not contribute), so that torchft's average over the groups and the
        group's own average over its ranks give the mean over the step's global batch."""
        if self.participating_rank not in self.contributors:
            return 0.0
        return self.num_participants * self.group_world_size / self.global_batch_size


class FaultTolerantSampler:
    """The step's share of one rank of a torchft replica group, agreed at each quorum.

    Call :meth:`share` on every rank after ``manager.start_quorum()`` (``torchft.Optimizer.zero_grad()``) and before the
    forward pass: it waits for the quorum and runs one small allreduce (module docstring). The step is
    ``manager.current_step()``: torchft advances it only on a commit, so a failed step is read again, split among the
    next quorum's groups. ``group_rank`` / ``group_world_size``: this rank within its replica group (the group's own
    data parallelism, e.g. FSDP's ranks). ``device``: where the manager's process group reduces tensors (``"cuda"``
    for torchft's NCCL groups; ``"cpu"`` for gloo).
    """

    def __init__(
        self,
        manager: Any,
        plan: Plan,
        group_rank: int = 0,
        group_world_size: int = 1,
        device: torch.device | str = "cpu",
    ) -> None:
        _check_rank(group_rank, group_world_size, "group_rank", "group_world_size")
        if plan.balance is not None:
            raise ValueError(
                "FaultTolerantSampler splits each step among the replica groups of its quorum, whose number changes"
                " from step to step, while a balanced plan (Plan(balance=...)) deals a step for a fixed world size:"
                " pass the plan without balance"
            )
        self.manager, self.plan, self.device = manager, plan, torch.device(device)
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
        contributors = self._contributors(rank, participants)
        if self.group_world_size > 1 and step == 0 and 0 < len(contributors) < participants:
            # NOTE: torchft heals group rank r of every group from group r % P at step 0 (init_sync): a group's data
            # would count for some of its ranks' gradients and not for others, which no split of the batch can fix
            raise RuntimeError(
                f"torchft heals {participants - len(contributors)} of the {participants} replica groups at step 0 "
                "(init_sync=True), each group rank from another group: with group_world_size > 1 their data would "
                "count in part. Pass init_sync=False to torchft.Manager (initialize the model from the same seed in "
                "every group), or start one group before the others"
            )
        batch = self.plan.global_batch(step)
        index = contributors.index(rank) if rank in contributors else None
        ids = replica_share(batch, index, max(len(contributors), 1), self.group_rank, self.group_world_size)
        return ReplicaShare(step, ids, rank, participants, contributors, self.group_world_size, len(batch))

    def read(self, dataset: Any, share: ReplicaShare) -> dict[str, torch.Tensor]:
        """``share``'s samples read from ``dataset`` (a PackedDataset or a MixtureDataset of them: one batched read),
        with the plan's redactions in force at ``share.step`` applied: the labels (and ``loss_mask``) of redacted
        documents are -100 (:func:`~detsampler.loader.redact.redact_labels`). The instance filter is the dataset's.
        An empty share gives an empty batch."""
        ids = share.sample_ids.tolist()
        if self.plan.redactions:
            read = RedactedDataset(dataset, self.plan).read(ids, share.step)
        else:
            read = dataset.__getitems__(ids)
        batch = getattr(read, "batch", read)
        return {**batch, "sample_ids": torch.as_tensor(share.sample_ids, dtype=torch.int64)}

    def _contributors(self, rank: int | None, participants: int) -> tuple[int, ...]:
        """The participating ranks whose gradients count this step (for this group rank), or () if the allreduce
        failed: ``Manager.allreduce`` zeroes the flags of a group that is not participating or heals, as it zeroes its
        gradient."""
        flags = torch.zeros(participants, dtype=torch.float32, device=self.device)
        if rank is not None:
            flags[rank] = 1.0
        if not self.manager.allreduce(flags, reduce_op=ReduceOp.SUM).wait() or self.manager.errored() is not None:
            return ()  # the step's commit fails: what it reads does not matter
        return tuple(int(i) for i in np.flatnonzero(flags.cpu().numpy() > 0.5))
