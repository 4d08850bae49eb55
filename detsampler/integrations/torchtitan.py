"""torchtitan (0.3.0): :class:`DetsamplerDataLoader`, a ``BaseDataLoader`` whose state is the step.

torchtitan's trainer builds its data loader with ``config.dataloader.build(dp_world_size=, dp_rank=, tokenizer=,
seq_len=, local_batch_size=, snapshot_every_n_steps=)``, iterates it for ``(input_dict, labels)`` micro batches and
checkpoints it (DCP, key ``"dataloader"``) through ``state_dict()`` / ``load_state_dict()``. Its own
``HuggingFaceTextDataLoader`` saves one pickled iterator state per data-parallel rank and refuses another dp degree.
This one saves ``{"step": s, "samples_in_step": 0}``, the same on every rank, and loads it at any ``dp_world_size``
that divides the global batch: the data of every step is a pure function of the plan.

Select it in a torchtitan config with ``dataloader=DetsamplerDataLoader.Config(index_paths=[...], ...)``; the indexes
are built beforehand (``detsampler build``). ``global_batch_size`` must equal ``training.global_batch_size`` (torchtitan
does not pass it to the loader); -1 means ``local_batch_size * dp_world_size``, as in torchtitan.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from detsampler.integrations import require

require("torchtitan", "torchtitan")

import torch  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402
from torchtitan.components.dataloader import BaseDataLoader  # noqa: E402

from detsampler.index.reader import TokenIndex  # noqa: E402
from detsampler.layout import LayoutConfig  # noqa: E402
from detsampler.loader.dataset import PackedDataset, collate_micro_batch  # noqa: E402
from detsampler.loader.mixture_dataset import MixtureDataset  # noqa: E402
from detsampler.loader.sampler import DeterministicBatchSampler  # noqa: E402
from detsampler.mixture.config import MixtureConfig  # noqa: E402
from detsampler.plan import Plan  # noqa: E402

__all__ = ["DetsamplerDataLoader"]


class DetsamplerDataLoader(BaseDataLoader):
    """The micro batches of data-parallel rank ``dp_rank``: ``({"input": input_ids}, labels)``, step after step.

    The state moves past a step as its micro batches are handed out (:meth:`DeterministicBatchSampler.steps`), so the
    checkpoint torchtitan takes after a step's optimizer update names the next step, however far workers read ahead.
    """

    @dataclass(kw_only=True, slots=True)
    class Config(BaseDataLoader.Config):
        index_paths: list[str] = field(default_factory=list)
        """Built token indexes: one, or one per mixture source."""

        weights: list[float] = field(default_factory=list)
        """Mixture weights, one per index (empty with one index)."""

        mixture_seed: int = 0
        """Seed of the mixture's interleaving."""

        layout: str = "concat"
        """Packing: concat, document or bestfit."""

        seed: int = 0
        """Seed of the epoch shuffles."""

        global_batch_size: int = -1
        """Samples per step over all dp ranks: training.global_batch_size (-1: local_batch_size * dp_world_size)."""

        num_workers: int = 0
        """DataLoader worker processes."""

    def __init__(
        self,
        config: Config,
        *,
        dp_world_size: int,
        dp_rank: int,
        seq_len: int,
        local_batch_size: int,
        tokenizer: Any = None,
        snapshot_every_n_steps: int | None = None,
    ) -> None:
        dataset, stream = _dataset(config, seq_len)
        global_batch_size = config.global_batch_size
        if global_batch_size <= 0:
            global_batch_size = local_batch_size * dp_world_size
        counted = {"num_samples": stream} if isinstance(stream, int) else {"source": stream}
        self.plan = Plan(
            **counted,
            seed=config.seed,
            global_batch_size=global_batch_size,
            micro_batch_size=local_batch_size,
            world_size=dp_world_size,
        )
        if not isinstance(dataset, PackedDataset):
            dataset = MixtureDataset(dataset, self.plan.stream)
        self.dataset: Dataset = dataset
        self.sampler = DeterministicBatchSampler(self.plan, dp_rank)
        self.num_workers = config.num_workers

    def __iter__(self) -> Iterator[tuple[dict[str, torch.Tensor], torch.Tensor]]:
        loader = DataLoader(
            self.dataset, batch_sampler=self.sampler, num_workers=self.num_workers, collate_fn=collate_micro_batch
        )
        for _, micro_batches in self.sampler.steps(loader):
            for batch in micro_batches:
                yield {"input": batch["input_ids"]}, batch["labels"]

    def state_dict(self) -> dict[str, int]:
        return self.sampler.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if state_dict:  # torchtitan passes {} when the checkpoint holds no loader state
            self.sampler.load_state_dict(state_dict)


def _dataset(config: DetsamplerDataLoader.Config, seq_len: int) -> tuple[Any, Any]:
    """The packed dataset (or the list of one per source) and the plan's stream: a sample count or a mixture."""
    if not config.index_paths:
        raise ValueError("DetsamplerDataLoader.Config.index_paths names no index: build one with `detsampler build`")
    layout_config = LayoutConfig(kind=config.layout, seq_len=seq_len)
    indexes = [TokenIndex.open(path) for path in config.index_paths]
    layouts = [index.layout(layout_config) for index in indexes]
    if len(indexes) == 1 and not config.weights:
        return PackedDataset(indexes[0], layouts[0]), layouts[0].num_samples
    if len(config.weights) != len(indexes):
        raise ValueError(f"weights needs one number per index: {len(config.weights)} for {len(indexes)} indexes")
    mixture = MixtureConfig(weights=tuple(config.weights), seed=config.mixture_seed).build(layouts)
    return [PackedDataset(index, layout) for index, layout in zip(indexes, layouts)], mixture
