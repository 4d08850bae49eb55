"""A step's loss recomputed outside the trainer, from a checkpoint and the step's batches: what ``make demo-sft`` and
``tests/test_train_sft.py`` use to show what the logged loss is.

Invariant: for the model of the checkpoint saved before step ``s`` and step ``s``'s micro batches as every rank reads
them, :func:`masked_loss_sums` gives per rank and micro batch ``(sum of the token losses over the labels that are not
-100, their count)``; the trainer logs ``sum / count`` over the whole global batch
(``train.train.global_label_counts``), and :func:`loss_means` also gives the means per rank and per micro batch that
another normalisation would log.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F

from train.config import TrainConfig
from train.data import DataPipeline
from train.model import Transformer

__all__ = ["LossMeans", "checkpoint_model", "checkpoint_params", "loss_means", "masked_loss_sums", "step_batches"]


def checkpoint_params(checkpoint: str | Path) -> dict[str, torch.Tensor]:
    """The model's full parameters in a checkpoint directory (DCP, read without a process group)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "full.pt"
        dcp_to_torch_save(Path(checkpoint), out)
        return torch.load(out, weights_only=False)["model"]


def checkpoint_model(cfg: TrainConfig, vocab_size: int, checkpoint: str | Path | None) -> Transformer:
    """The unsharded model of ``cfg`` with the parameters of ``checkpoint`` (None: as initialised, ``init_seed``)."""
    torch.manual_seed(cfg.model.init_seed)  # what build_model does before sharding
    model = Transformer(replace(cfg.model, vocab_size=cfg.model.vocab_size or vocab_size)).eval()
    if checkpoint is not None:
        model.load_state_dict(checkpoint_params(checkpoint))
    return model


def step_batches(data: DataPipeline, step: int) -> list[list[dict[str, torch.Tensor]]]:
    """Per rank of ``data.plan``, its micro batches of ``step``, read as the trainer reads them."""
    out = []
    for rank in range(data.plan.world_size):
        sampler = data.sampler(rank, step, step + 1)
        ((_, micro_batches),) = list(sampler.steps(data.loader(sampler, pin_memory=False, persistent_workers=False)))
        out.append(micro_batches)
    return out


def masked_loss_sums(model: Transformer, ranks: list[list[dict]], masked_attention: bool) -> list[list[tuple]]:
    """Per rank and micro batch: ``(sum of the token losses over the labels that are not -100, their count)``."""
    out = []
    with torch.no_grad():
        for micro_batches in ranks:
            row = []
            for mb in micro_batches:
                logits = model(mb["input_ids"], mb["position_ids"], mb["document_ids"] if masked_attention else None)
                loss = F.cross_entropy(
                    logits.flatten(0, 1).float(), mb["labels"].flatten(), ignore_index=-100, reduction="sum"
                )
                row.append((float(loss), int((mb["labels"] != -100).sum())))
            out.append(row)
    return out


@dataclass(frozen=True)
class LossMeans:
    """A step's loss under three normalisations: the global token mean (what the trainer logs), the mean of the
    ranks' own token means, and the mean of the micro batches' own token means; ``counts``: unmasked labels per rank."""

    global_mean: float
    rank_mean: float
    micro_mean: float
    counts: tuple[int, ...]


def loss_means(sums: list[list[tuple]]) -> LossMeans:
    """The :class:`LossMeans` of :func:`masked_loss_sums`'s result (a count of 0 divides as 1: its sum is 0)."""
    per_rank = [(sum(s for s, _ in rank), sum(n for _, n in rank)) for rank in sums]
    micro = [s / max(n, 1) for rank in sums for s, n in rank]
    return LossMeans(
        global_mean=sum(s for s, _ in per_rank) / max(1, sum(n for _, n in per_rank)),
        rank_mean=sum(s / max(n, 1) for s, n in per_rank) / len(per_rank),
        micro_mean=sum(micro) / len(micro),
        counts=tuple(n for _, n in per_rank),
    )
