"""torchtitan (0.3.0): :class:`DetsamplerDataLoader`, a ``BaseDataLoader`` whose state is the step.

torchtitan's trainer builds its data loader with ``config.dataloader.build(dp_world_size=, dp_rank=, tokenizer=,
seq_len=, local_batch_size=, snapshot_every_n_steps=)``, iterates it for ``(input_dict, labels)`` micro batches and
checkpoints it (DCP, key ``"dataloader"``) through ``state_dict()`` / ``load_state_dict()``. Its own
``HuggingFaceTextDataLoader`` saves one pickled iterator state per data-parallel rank and refuses another dp degree.
This one saves ``{"step": s, "samples_in_step": 0, "data_record": JSON}`` (a :class:`~detsampler.record.DataRecord`),
the same on every rank, and loads it at any ``dp_world_size`` that divides the global batch: the data of every step is
a pure function of the plan, and the record's fingerprint refuses a resume that would read other data.

What it yields, as torchtitan's own text loader does (``torchtitan/hf_datasets/text_datasets.py``):
``({"input": input_ids, "positions": position_ids}, labels)``. torchtitan's trainer passes every key but ``"input"`` to
the model's ``forward`` (``Trainer.post_dataloading_process``) and builds its flex / varlen document masks from
``positions`` (a document starts where they are 0: ``get_document_mask_mod``), so no other key is yielded. Labels are
``-100`` (torchtitan's ``IGNORE_INDEX``) wherever the layout masks: they count in neither the loss sum nor
``global_valid_tokens``.

Select it in a torchtitan config with ``dataloader=DetsamplerDataLoader.Config(index_paths=[...], ...)``: each entry a
built index directory (``detsampler build``), a sharded index directory, or a pre-tokenized source ``KIND:PATH``
(``megatron:data/corpus_text_document``). ``global_batch_size`` must equal ``training.global_batch_size`` (torchtitan
does not pass it to the loader); -1 means ``local_batch_size * dp_world_size``, as in torchtitan.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from detsampler.integrations import require

require("torchtitan", "torchtitan")

import torch  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402
from torchtitan.components.dataloader import BaseDataLoader  # noqa: E402

from detsampler.balance import Balance, CostModel  # noqa: E402
from detsampler.filter import RepetitionFilter  # noqa: E402
from detsampler.index.sharded import open_index  # noqa: E402
from detsampler.index.sources import is_source_spec, open_source, parse_source_spec  # noqa: E402
from detsampler.layout import OVERLONG_POLICIES, LayoutConfig  # noqa: E402
from detsampler.loader.dataset import PackedDataset, collate_micro_batch  # noqa: E402
from detsampler.loader.mixture_dataset import MixtureDataset  # noqa: E402
from detsampler.loader.redact import RedactedDataset  # noqa: E402
from detsampler.loader.sampler import DeterministicBatchSampler  # noqa: E402
from detsampler.mixture.config import MixtureConfig  # noqa: E402
from detsampler.plan import Plan  # noqa: E402
from detsampler.record import DataRecord, read_record  # noqa: E402
from detsampler.redaction import Redaction  # noqa: E402

__all__ = ["IGNORE_INDEX", "DetsamplerDataLoader"]

IGNORE_INDEX = -100  # torchtitan.components.loss.IGNORE_INDEX, and the labels PackedDataset masks with
FRAMEWORK = "torchtitan"


class DetsamplerDataLoader(BaseDataLoader):
    """The micro batches of data-parallel rank ``dp_rank``: ``({"input": ..., "positions": ...}, labels)``, step after
    step.

    The state moves past a step as its micro batches are handed out (:meth:`DeterministicBatchSampler.steps`), so the
    checkpoint torchtitan takes after a step's optimizer update names the next step, however far workers read ahead.

    A batch ramp (``batch_size_schedule``): torchtitan draws ``training.global_batch_size / (local_batch_size *
    dp_world_size)`` micro batches every step, a number fixed when the trainer starts. A step of the ramp with fewer
    samples yields its own micro batches, then fills the count with micro batches whose labels are all ``-100``:
    torchtitan divides the summed loss by the step's ``global_valid_tokens`` (labels that are not ``-100``, over all
    ranks), so the gradient is exactly that of the ramp's smaller batch. The filler costs a forward and backward each.
    """

    @dataclass(kw_only=True, slots=True)
    class Config(BaseDataLoader.Config):
        index_paths: list[str] = field(default_factory=list)
        """Indexes: one, or one per mixture source. Each a built index directory (``detsampler build``), a sharded
        index directory (``build --shard`` / ``--finalize``), or a pre-tokenized source ``KIND:PATH`` (``megatron``,
        ``olmo``, ``datatrove``, ``nanogpt``)."""

        source_eos: str = "real"
        """Pre-tokenized sources: ``real`` (the stored tokens as they are) or ``virtual`` (an EOS read after each
        document: needs ``source_eos_id``)."""

        source_eos_id: int | None = None
        """Pre-tokenized sources: the EOS id (None: unknown, only with ``source_eos="real"``)."""

        source_pad_id: int | None = None
        """Pre-tokenized sources: the id on padding (None: the EOS id, else 0); its labels are -100 anyway."""

        source_vocab_size: int | None = None
        """Pre-tokenized sources: the vocabulary size (None: the token dtype's range)."""

        weights: list[float] = field(default_factory=list)
        """Mixture weights from step 0, one per index (empty with one index)."""

        mixture_schedule: list[tuple[int, list[float]]] = field(default_factory=list)
        """Later mixture weights: ``(first_step, weights)`` entries after step 0, in data steps (MixtureConfig)."""

        mixture_seed: int = 0
        """Seed of the mixture's interleaving (a mixture's plan reads it instead of ``seed``)."""

        mixture_names: list[str] = field(default_factory=list)
        """Labels of the mixture's sources, for reports and the data record (empty: none)."""

        layout: str = "concat"
        """Packing: concat, document or bestfit (LayoutConfig.kind); seq_len is training.seq_len."""

        layout_seed: int = 0
        """LayoutConfig.seed (the document order the layout packs)."""

        window_docs: int = 1024
        """LayoutConfig.window_docs: documents packed together (bestfit)."""

        overlong: str = "split"
        """LayoutConfig.overlong (bestfit only): an example longer than seq_len is ``split`` into pieces, ``truncate``d
        to its first seq_len tokens or ``drop``ped (SFT: whole examples only)."""

        epoch_order: bool = False
        """LayoutConfig.epoch_order (concat and document layouts): a new document order each epoch; the plan's sample
        ids then carry their epoch (Plan.epoch_ids)."""

        restart_positions: bool | None = None
        """``positions`` restart at 0 at each document start (torchtitan's document masking then keeps documents
        apart). None: as the layout's labels do (document and bestfit restart; concat, whose labels cross documents,
        counts 0 .. seq_len-1)."""

        seed: int = 0
        """Plan.seed: the epoch shuffles of a single index."""

        global_batch_size: int = -1
        """Samples per step over all dp ranks: training.global_batch_size (-1: local_batch_size * dp_world_size)."""

        batch_size_schedule: list[tuple[int, int]] = field(default_factory=list)
        """A batch ramp: ``(first_step, global_batch_size)`` rows from step 0, the last one's size
        ``global_batch_size`` and none larger (Plan.batch_size_schedule; empty: none)."""

        skip_steps: list[tuple[int, int]] = field(default_factory=list)
        """Inclusive ranges of data steps never trained on (Plan.skip_steps)."""

        mapping_version: int = 0
        """Plan.mapping_version: keep the one a run started with (0: the current one, 2, or 3 with balance)."""

        balance: bool = False
        """Plan.balance: each step's samples dealt to (dp rank, micro step) by their modeled cost, attention masked
        per document (detsampler.balance.Balance over the layout, mapping version 3): the same samples per step."""

        balance_attention: float = CostModel().attention
        """CostModel.attention (with balance): the cost per squared token of each document span."""

        balance_linear: float = CostModel().linear
        """CostModel.linear (with balance): the cost per token."""

        balance_fixed: float = CostModel().fixed
        """CostModel.fixed (with balance): the cost per sample."""

        redactions: list[str] = field(default_factory=list)
        """Plan.redactions, as ``detsampler --redact`` writes them: ``"FROM_STEP:DOC,DOC"`` (over a mixture
        ``"SOURCE:FROM_STEP:DOC,DOC"``, SOURCE a ``mixture_names`` entry or the source's index): those documents'
        labels are -100 from training step FROM_STEP on, every step still reading what it read; recorded in the data
        record."""

        instance_filter: bool = False
        """OLMo-core's repetition filter (``InstanceFilterConfig``, its fields below): a flagged sample's labels are all
        -100; recorded in the data record."""

        repetition_max_period: int = 13
        """The filter's longest period (InstanceFilterConfig.repetition_max_period)."""

        repetition_min_period: int = 1
        """The filter's shortest period (InstanceFilterConfig.repetition_min_period)."""

        repetition_max_count: int = 32
        """Repeats of a period that flag a sample (InstanceFilterConfig.repetition_max_count)."""

        allow_missing_data_record: bool = False
        """Load a checkpointed state that holds no ``data_record`` (saved before it existed): its data cannot be
        checked, so this is refused unless set."""

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
        self.config = config
        global_batch_size = config.global_batch_size
        if global_batch_size <= 0:
            global_batch_size = local_batch_size * dp_world_size
        layout_config = _layout_config(config, seq_len)
        indexes = [_open(spec, config) for spec in _checked_paths(config)]
        layouts = [index.layout(layout_config) for index in indexes]
        schedule = _batch_size_schedule(config, global_batch_size)
        plan_args = dict(
            seed=config.seed,
            global_batch_size=global_batch_size,
            micro_batch_size=local_batch_size,
            world_size=dp_world_size,
            batch_size_schedule=schedule,
            skip_steps=[tuple(r) for r in config.skip_steps] or None,
            mapping_version=config.mapping_version or None,
            redactions=_redactions(config) or None,
        )
        restart = config.restart_positions
        repetition = _instance_filter(config)
        datasets = [
            PackedDataset(i, lay, restart_position_ids=restart, instance_filter=repetition)
            for i, lay in zip(indexes, layouts)
        ]
        if len(indexes) == 1 and not config.weights:
            _refuse_mixture_fields(config)
            balance = _balance(config, layouts[0])
            self.plan = Plan(layouts[0].num_samples, epoch_ids=layout_config.epoch_order, balance=balance, **plan_args)
            self.dataset: Dataset = datasets[0]
            recorded_index, recorded_layout, names = indexes[0], layouts[0], None
        else:
            if len(config.weights) != len(indexes):
                raise ValueError(
                    f"DetsamplerDataLoader.Config.weights needs one number per index: {len(config.weights)} for "
                    f"{len(indexes)} indexes"
                )
            mixture_config = MixtureConfig(
                weights=tuple(config.weights),
                schedule=tuple((step, tuple(w)) for step, w in config.mixture_schedule),
                seed=config.mixture_seed,
                names=tuple(config.mixture_names) or None,
            )
            self.plan = Plan(source=mixture_config.build(layouts), balance=_balance(config, layouts), **plan_args)
            self.dataset = MixtureDataset(datasets, self.plan.stream)
            recorded_index, recorded_layout, names = indexes, layouts, mixture_config.names
        self.indexes, self.layouts = indexes, layouts
        self.micro_steps_per_step = global_batch_size // (local_batch_size * dp_world_size)
        self.seq_len = seq_len
        self.pad_id = int(indexes[0].pad_id)
        self.record = DataRecord.of(
            0, recorded_index, recorded_layout, self.plan, framework=FRAMEWORK, names=names, instance_filter=repetition
        )
        self.sampler = DeterministicBatchSampler(self.plan, dp_rank)
        self.num_workers = config.num_workers

    @property
    def fingerprint(self) -> Any:
        """The :class:`~detsampler.resume.DataFingerprint` of this loader's data (what ``data_record`` saves)."""
        return self.record.fingerprint

    def __iter__(self) -> Iterator[tuple[dict[str, torch.Tensor], torch.Tensor]]:
        dataset = RedactedDataset(self.dataset, self.plan) if self.plan.redactions else self.dataset
        loader = DataLoader(
            dataset, batch_sampler=self.sampler, num_workers=self.num_workers, collate_fn=collate_micro_batch
        )
        for _, micro_batches in self.sampler.steps(loader):
            for batch in micro_batches:
                yield {"input": batch["input_ids"], "positions": batch["position_ids"]}, batch["labels"]
            for _ in range(self.micro_steps_per_step - len(micro_batches)):  # a ramp's smaller step (class doc)
                yield self._filler()

    def _filler(self) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        shape = (self.sampler.plan.micro_batch_size, self.seq_len)
        positions = torch.arange(self.seq_len, dtype=torch.int64).expand(shape).contiguous()
        inputs = torch.full(shape, self.pad_id, dtype=torch.int64)
        return {"input": inputs, "positions": positions}, torch.full(shape, IGNORE_INDEX, dtype=torch.int64)

    def state_dict(self) -> dict[str, Any]:
        state = self.sampler.state_dict()
        record = dataclasses.replace(self.record, step=state["step"], samples_in_step=state["samples_in_step"])
        return {**state, "data_record": record.to_json()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume at the saved step: refused (ValueError, the library's :func:`~detsampler.resume.check_resume`
        message) when this loader's data would differ from the checkpointed run's at any step before it."""
        if not state_dict:  # torchtitan passes {} when the checkpoint holds no loader state
            return
        state = dict(state_dict)
        saved = state.pop("data_record", None)
        if saved is None:
            if not self.config.allow_missing_data_record:
                raise ValueError(
                    f"the checkpoint's data loader state {state!r} holds no data_record (it was saved before detsampler"
                    " recorded its data), so nothing shows that this configuration reads the data it trained on; set"
                    " DetsamplerDataLoader.Config.allow_missing_data_record=True to resume at its step anyway"
                )
        else:
            where = "the checkpoint's data loader state"
            stated = {"its step": int(state["step"])} if "step" in state else {}
            samples = ("its samples_in_step", int(state.get("samples_in_step", 0)))
            record = read_record(saved, where, steps=stated, samples_in_step=samples if stated else None)
            record.check_resume(self.fingerprint, record.step)
        self.sampler.load_state_dict(state)


def _layout_config(config: DetsamplerDataLoader.Config, seq_len: int) -> LayoutConfig:
    """The layout of ``config`` at torchtitan's ``seq_len``; a bad ``layout`` / ``overlong`` is a ValueError naming
    the Config field."""
    if not isinstance(config.overlong, str) or config.overlong not in OVERLONG_POLICIES:
        raise ValueError(
            f"DetsamplerDataLoader.Config.overlong must be one of {OVERLONG_POLICIES}, got {config.overlong!r}"
        )
    if not isinstance(config.epoch_order, bool):
        raise ValueError(f"DetsamplerDataLoader.Config.epoch_order must be True or False, got {config.epoch_order!r}")
    try:
        return LayoutConfig(
            kind=config.layout,
            seq_len=seq_len,
            seed=config.layout_seed,
            window_docs=config.window_docs,
            overlong=config.overlong,
            epoch_order=config.epoch_order,
        )
    except ValueError as exc:
        raise ValueError(f"DetsamplerDataLoader.Config: {exc}") from None


def _instance_filter(config: DetsamplerDataLoader.Config) -> RepetitionFilter | None:
    """The repetition filter ``config`` turns on (None: off); a bad field is a ValueError naming it."""
    if not config.instance_filter:
        return None
    try:
        return RepetitionFilter(
            max_period=config.repetition_max_period,
            min_period=config.repetition_min_period,
            max_count=config.repetition_max_count,
        )
    except (TypeError, ValueError) as exc:
        raise ValueError(f"DetsamplerDataLoader.Config.repetition_*: {exc}") from None


def _redactions(config: DetsamplerDataLoader.Config) -> list[Redaction]:
    """``config.redactions`` (``[SOURCE:]FROM_STEP:DOC,DOC`` each) as Redaction entries; a malformed entry is a
    ValueError naming it and the form."""
    names = list(config.mixture_names) or [str(k) for k in range(len(config.index_paths))]
    out = []
    for entry in config.redactions:
        parts = str(entry).split(":")
        try:
            source = None
            if len(parts) == 3:
                source = names.index(parts[0]) if parts[0] in names else int(parts[0])
            if len(parts) not in (2, 3) or not parts[-1]:
                raise ValueError(entry)
            out.append(Redaction([int(d) for d in parts[-1].split(",")], int(parts[-2]), source))
        except ValueError:
            raise ValueError(
                f"DetsamplerDataLoader.Config.redactions entry {entry!r}: expected FROM_STEP:DOC[,DOC...] (over a"
                " mixture SOURCE:FROM_STEP:DOC[,DOC...], SOURCE a mixture_names entry or the source's index)"
            ) from None
    return out


def _checked_paths(config: DetsamplerDataLoader.Config) -> list[str]:
    if config.dataset or config.dataset_path:  # BaseDataLoader.Config's fields, read by torchtitan's own loader
        raise ValueError(
            f"DetsamplerDataLoader reads index_paths, not dataset={config.dataset!r} / dataset_path="
            f"{config.dataset_path!r} (torchtitan's HuggingFaceTextDataLoader's fields): leave them unset"
        )
    if not config.index_paths:
        raise ValueError(
            "DetsamplerDataLoader.Config.index_paths names no index: build one with `detsampler build`, or name a "
            "pre-tokenized source KIND:PATH"
        )
    if isinstance(config.index_paths, (str, bytes)):
        raise ValueError(f"DetsamplerDataLoader.Config.index_paths must be a list, got {config.index_paths!r}")
    return [str(p) for p in config.index_paths]


def _open(spec: str, config: DetsamplerDataLoader.Config) -> Any:
    """The built index, sharded index or pre-tokenized source ``spec`` names."""
    if is_source_spec(spec):
        kind, path = parse_source_spec(spec)
        options = {
            "eos_id": config.source_eos_id,
            "pad_id": config.source_pad_id,
            "vocab_size": config.source_vocab_size,
        }
        if config.source_eos == "virtual" and config.source_eos_id is None:
            raise ValueError(
                f"index_paths entry {spec!r}: source_eos='virtual' reads an EOS after each document; set "
                "DetsamplerDataLoader.Config.source_eos_id"
            )
        return open_source(kind, path, eos=config.source_eos, **{k: v for k, v in options.items() if v is not None})
    if not Path(spec).is_dir():
        raise ValueError(
            f"index_paths entry {spec!r} is neither an index directory (build one with `detsampler build`) nor a "
            "pre-tokenized source KIND:PATH (megatron, olmo, datatrove, nanogpt)"
        )
    return open_index(spec)


def _batch_size_schedule(config: DetsamplerDataLoader.Config, global_batch_size: int) -> list | None:
    if not config.batch_size_schedule:
        return None
    schedule = [tuple(row) for row in config.batch_size_schedule]
    larger = [row for row in schedule if len(row) == 2 and isinstance(row[1], int) and row[1] > global_batch_size]
    if larger:
        raise ValueError(
            f"batch_size_schedule rows {larger} exceed global_batch_size {global_batch_size}: torchtitan draws "
            "training.global_batch_size / (local_batch_size * dp) micro batches every step, so a ramp may only go up "
            "to it (set both to the largest size)"
        )
    return schedule


def _refuse_mixture_fields(config: DetsamplerDataLoader.Config) -> None:
    given = [name for name in ("mixture_schedule", "mixture_names") if getattr(config, name)]
    if given:
        raise ValueError(
            f"DetsamplerDataLoader.Config.{given[0]} is set but there is no mixture: give weights, one per index"
        )


def _balance(config: Any, layout: Any) -> Balance | None:
    """``Config.balance`` and its cost model over ``layout`` (a mixture's: its sources' layouts), or None."""
    if not config.balance:
        return None
    cost = CostModel(attention=config.balance_attention, linear=config.balance_linear, fixed=config.balance_fixed)
    return Balance(layout, cost)
