"""The trainer's data path: corpus -> tokenizer -> TokenIndex -> layout -> Plan -> DeterministicBatchSampler ->
DataLoader.

Everything that decides which tokens a step trains on is fixed by the index, the layout config, the plan's seed and
batch schedule; :func:`DataPipeline.fingerprint` hashes exactly these (not the number of ranks, the micro batch size or
the number of workers, which may change on resume). The DataLoader's only state is the sampler's start step.
"""

from __future__ import annotations

import functools
import logging
import multiprocessing
import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from detsampler.content import content_columns, documents_by_content, documents_by_id
from detsampler.layout import Layout, LayoutConfig
from detsampler.loader.sampler import DeterministicBatchSampler
from detsampler.plan import Plan
from detsampler.record import DataRecord
from detsampler.redaction import Redaction, documents_by_path
from detsampler.resume import DataFingerprint
from detsampler.storage.urls import is_remote
from detsampler.text.chat import with_tools
from train.config import DataConfig

__all__ = [
    "DataPipeline",
    "ThreadPrefetcher",
    "TimedIterator",
    "build_pipeline",
    "check_redacted_documents",
    "check_worker_start",
    "index_config",
    "resolve_redactions",
]


class TimedIterator:
    """Wraps an iterator and accumulates the seconds spent waiting in ``next`` (the DataLoader's data wait)."""

    def __init__(self, iterable: Any, clock: Callable[[], float]) -> None:
        self._it = iter(iterable)
        self._clock = clock
        self.waited = 0.0

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        t0 = self._clock()
        try:
            return next(self._it)
        finally:
            self.waited += self._clock() - t0

    def take_wait(self) -> float:
        """Seconds waited since the last call."""
        waited, self.waited = self.waited, 0.0
        return waited


_END = object()


class ThreadPrefetcher:
    """Iterates ``iterable`` in a background thread, up to ``depth`` items ahead, and hands the items over in order.

    Only the time at which a batch is read changes, never which batch comes next: the DataLoader's order is the queue's.
    The reader's exception is raised in the consumer at the item where it happened; :meth:`close` stops the reader.
    """

    def __init__(self, iterable: Any, depth: int) -> None:
        if depth < 1:
            raise ValueError(f"prefetch depth must be >= 1, got {depth}")
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, args=(iter(iterable),), name="batch-prefetch", daemon=True)
        self._thread.start()

    def _put(self, item: Any) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _read(self, it: Iterator[Any]) -> None:
        try:
            for item in it:
                if not self._put(item):
                    return
        except BaseException as error:  # handed to the consumer, which raises it
            self._put(_Raised(error))
            return
        self._put(_END)

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        item = self._queue.get()
        if item is _END:
            raise StopIteration
        if isinstance(item, _Raised):
            raise item.error
        return item

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


@dataclass(frozen=True)
class _Raised:
    error: BaseException


def _show_worker_log(level: int, worker_id: int) -> None:
    """A spawned or forkserver DataLoader worker's init: the library's log on stderr at the parent's level."""
    from detsampler.cli import show_library_log

    show_library_log(level)


def check_worker_start(pipeline: DataPipeline) -> None:
    """Refuse ``worker_start_method = "fork"`` with DataLoader workers over an index in an object store: this process
    has read it, and the store's client does not survive a fork (a forked worker's first request would be refused)."""
    config = pipeline.config
    if config.num_workers > 0 and config.worker_start_method == "fork" and pipeline.in_object_store:
        raise ValueError(
            f"DataConfig.worker_start_method = 'fork' with num_workers = {config.num_workers} over an index in an"
            f" object store ({pipeline.index.path}): the store's client does not survive a fork once this process used"
            " it; use forkserver or spawn, or leave worker_start_method empty (forkserver)"
        )


@dataclass
class DataPipeline:
    """What the training loop needs of the data: the index, layout and plan, and how to make a loader from a step."""

    config: DataConfig
    index: Any
    tokenizer: Any
    layout: Layout
    plan: Plan
    dataset: Any
    sources: list[tuple[Any, Layout]] | None = (
        None  # a mixture: (index, layout) of each source; index/layout: source 0's
    )

    @property
    def vocab_size(self) -> int:
        return int(self.index.vocab_size)

    @property
    def masked_attention(self) -> bool:
        """Whether attention must be masked per document (document and bestfit layouts)."""
        return not self.layout.labels_cross_documents

    def fingerprint(self) -> dict:
        """The data fingerprint; for a mixture, of every source's index and layout (the plan holds the weights)."""
        return self.data_fingerprint().to_dict()

    def data_fingerprint(self) -> DataFingerprint:
        """The library's :class:`~detsampler.resume.DataFingerprint` of this pipeline (the index
        provides its identity)."""
        instance_filter = self.config.instance_filter
        if self.sources is None:
            return DataFingerprint.of(self.index, self.layout, self.plan, instance_filter)
        return DataFingerprint.of(
            [index for index, _ in self.sources], [layout for _, layout in self.sources], self.plan, instance_filter
        )

    def data_record(self, step: int) -> DataRecord:
        """The library's :class:`~detsampler.record.DataRecord` of this pipeline at ``step`` (what a checkpoint of the
        state before ``step`` saves: ``detsampler show|verify|stats --checkpoint`` reads it)."""
        if self.sources is None:
            return DataRecord.of(
                step, self.index, self.layout, self.plan, framework="train", instance_filter=self.config.instance_filter
            )
        return DataRecord.of(
            step,
            [index for index, _ in self.sources],
            [layout for _, layout in self.sources],
            self.plan,
            framework="train",
            names=self.config.mixture_names or None,
            instance_filter=self.config.instance_filter,
        )

    def sampler(self, rank: int, start_step: int, stop_step: int) -> DeterministicBatchSampler:
        return DeterministicBatchSampler(self.plan, rank, start_step=start_step, stop_step=stop_step)

    @property
    def in_object_store(self) -> bool:
        """Whether an index (a source of a mixture, a shard of a sharded index) is read from an object store."""
        indexes = [self.index] if self.sources is None else [index for index, _ in self.sources]
        return any(is_remote(str(part.path)) for index in indexes for part in getattr(index, "shards", [index]))

    @property
    def worker_start_method(self) -> str | None:
        """How the DataLoader's workers start (None: the platform's default): ``data.worker_start_method``, else
        ``forkserver`` (``spawn`` where there is none) when an index is in an object store."""
        if self.config.worker_start_method:
            return self.config.worker_start_method
        if not self.in_object_store:
            return None
        return "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"

    def loader(self, sampler: DeterministicBatchSampler, pin_memory: bool, persistent_workers: bool) -> DataLoader:
        from detsampler.loader.dataset import collate_micro_batch

        workers = self.config.num_workers
        context, init = None, None
        if workers > 0:
            context = self.worker_start_method
            if context is not None and context not in multiprocessing.get_all_start_methods():
                raise ValueError(
                    f"DataConfig.worker_start_method {context!r} is not available here: this platform has"
                    f" {multiprocessing.get_all_start_methods()}"
                )
            if self.config.prefetch is not None and context not in (None, "fork"):
                # a worker that was not forked has no log handler: it shows its prefetcher's lines like the parent
                init = functools.partial(_show_worker_log, logging.getLogger("detsampler").getEffectiveLevel())
        return DataLoader(
            self.dataset,
            batch_sampler=sampler,
            num_workers=workers,
            pin_memory=pin_memory,
            persistent_workers=persistent_workers and workers > 0,
            collate_fn=collate_micro_batch,
            multiprocessing_context=context,
            worker_init_fn=init,
        )

    def reads_line(self) -> str | None:
        """One line on how the data is read when that is not a local memory map (an object store, prefetch, how the
        DataLoader's workers start), or None. Over a mixture it names every source."""
        prefetch, workers = self.config.prefetch, self.config.num_workers
        where = "the training process" if workers == 0 else f"each of {workers} DataLoader workers"
        started = "" if workers == 0 else f", started by {self.worker_start_method or 'the platform default'}"
        indexes = [self.index] if self.sources is None else [index for index, _ in self.sources]
        names = ", ".join(str(index.path) for index in indexes)
        if not self.in_object_store:
            if prefetch is None:
                return None
            local = "the index is" if self.sources is None else "every source is"
            return f"data: prefetch is on, but {local} local (memory-mapped): it is read as always, nothing fetched"
        if prefetch is None:
            return f"data: from {names}, blocks read on demand by {where}{started} (prefetch off)"
        one = "" if self.sources is None else f"one prefetcher over {len(indexes)} sources, "
        node = "" if prefetch.node_cache is None else (
            f", node cache {prefetch.node_cache!r} of at most {prefetch.node_cache_bytes:,} bytes shared by the node"
        )  # fmt: skip
        return (
            f"data: from {names}, prefetch on in {where}{started}: {one}budget {prefetch.budget_bytes:,} bytes, cache"
            f" {prefetch.cache_bytes:,} bytes, {prefetch.threads} threads, blocks of {prefetch.block_bytes:,} bytes"
            f"{node}"
        )

    def prefetch_summary(self) -> str | None:
        """One line on what this process's prefetcher did (None when none ran here: prefetch off, a local index, or
        DataLoader workers, whose prefetchers log their own lines)."""
        stats_of = getattr(self.dataset, "prefetch_stats", None)
        stats = stats_of() if stats_of is not None else None
        if stats is None:
            return None
        cache = stats.cache
        return (
            f"data: prefetch read {stats.served} micro batch(es) as planned, {stats.unplanned} on demand; fetched"
            f" {stats.fetched_bytes:,} bytes in {stats.requests} ranged reads for {stats.used_bytes:,} bytes used"
            f" ({stats.amplification or 0:.1f}x read amplification);"
            f" cache {cache.get('hits', 0)} hits, {cache.get('misses', 0)} misses, peak"
            f" {cache.get('peak_bytes', 0):,} of {cache.get('cap_bytes', 0):,} bytes; waited"
            f" {stats.wait_s * 1e3:.1f} ms for blocks{_over_cap_summary(stats)}{_node_summary(stats.node)}"
        )

    def close(self) -> None:
        """Stop this process's prefetcher, if one runs (its threads)."""
        close = getattr(self.dataset, "close", None)
        if close is not None:
            close()


def _over_cap_summary(stats: Any) -> str:
    """The part of the summary line saying that the plan read more blocks at once than the cache holds (one micro
    batch's, or those fetched ahead): blocks were dropped before they were read and fetched again."""
    cap = stats.cache.get("cap_bytes", 0)
    need = max(stats.peak_need_bytes, stats.peak_window_bytes)
    if need <= cap:
        return ""
    return (
        f"; {stats.over_cap} micro batch(es) needed more blocks than the cache holds, up to {need:,} bytes at once:"
        f" blocks fetched again (raise cache_bytes to >= {need:,})"
    )


def _node_summary(node: dict | None) -> str:
    """The node cache's part of the summary line: the blocks it served this process, the blocks this process fetched
    from the store for it (a run over a warm cache fetches none), and what it did not keep."""
    if node is None:
        return ""
    return (
        f"; node cache {node['hits']} blocks served from it, {node['fetched']} fetched from the store for it"
        + (f" ({node['bypassed']} not kept: no room)" if node["bypassed"] else "")
        + (f" ({node['damaged']} damaged entries fetched again)" if node["damaged"] else "")
    )


def index_config(config: DataConfig) -> Any:
    """The :class:`detsampler.index.prepare.IndexConfig` of ``config``: ``detsampler build`` with the same options opens
    the same cached index."""
    from detsampler.index.prepare import IndexConfig

    return IndexConfig(
        data=config.source or None,
        text_column=config.text_column,
        tokenizer=config.tokenizer or None,
        vocab_size=config.vocab_size,
        cache_dir=config.cache_dir or None,  # the library's default: $DETSAMPLER_CACHE, else ./.cache/detsampler
        num_proc=config.num_proc,
        store_tokens=config.store_tokens,
        max_documents=config.max_documents or None,
        add_bos=config.add_bos,
        add_eos=config.add_eos or None,
        loss_policy=config.loss_policy or None,
        completion_column=config.completion_column or None,
    )


def _layout_config(config: DataConfig) -> LayoutConfig:
    """The layout of ``config`` (each mixture source gets the same one)."""
    return LayoutConfig(
        kind=config.layout,
        seq_len=config.seq_len,
        seed=config.seed,
        window_docs=config.window_docs,
        overlong=config.overlong,
        epoch_order=config.epoch_order,
    )


def resolve_redactions(config: DataConfig, dataset: Any = None) -> list[Redaction]:
    """``config.redactions`` as :class:`~detsampler.redaction.Redaction` entries: ``paths`` resolved to document ids
    against ``dataset``'s ``path`` column, ``sha256`` content hashes against its content (its text column, or a
    chat row's rendered columns: :mod:`detsampler.content`) and ``ids`` against its column ``id_column`` (an error when
    it has no such column, or a path, hash or id names no document). Over a mixture ``dataset`` is the list of the
    sources' datasets, and each entry resolves against its source's."""
    out = []
    for entry in config.redactions:
        source = entry.get("source")
        own = dataset[source] if source is not None else dataset
        where = f"DataConfig.redactions from step {entry['from_step']}" + (
            "" if source is None else f" (source {_source_label(config, source)})"
        )
        documents = list(entry["documents"])
        if entry.get("paths"):
            column = getattr(own, "column_names", None) or []
            if "path" not in column:
                raise ValueError(f"{where} names paths, but the index's dataset has no path column: give document ids")
            documents += documents_by_path(own["path"], entry["paths"])
        if entry.get("sha256"):
            documents += _by_content(config, own, entry["sha256"], where)
        if entry.get("ids"):
            try:
                documents += documents_by_id(own, entry["id_column"], entry["ids"])
            except ValueError as e:
                raise ValueError(f"{where}: {e}") from None
        out.append(Redaction(sorted(set(documents)), entry["from_step"], source))
    return out


def _by_content(config: DataConfig, dataset: Any, hashes: list[str], where: str) -> list[int]:
    """The documents of ``dataset`` whose content hash is one of ``hashes`` (:mod:`detsampler.content`: the text of
    ``text_column``, or a chat row's rendered columns under ``loss_policy``)."""
    columns = content_columns(config.text_column, with_tools(config.chat_config(), dataset))  # as the index renders
    names = [columns] if isinstance(columns, str) else list(columns)
    missing = [c for c in names if c not in (getattr(dataset, "column_names", None) or [])]
    if missing:
        kind = "text column" if isinstance(columns, str) else "chat column"
        raise ValueError(
            f"{where} names content hashes, but the index's dataset has no {kind} {missing[0]!r}: give document ids"
        )
    try:
        return documents_by_content(dataset, hashes, columns)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None


def _source_label(config: DataConfig, source: int) -> str:
    return str(config.mixture_config().labels[source])


def check_redacted_documents(plan: Plan, num_documents: int | Sequence[int], config: DataConfig | None = None) -> None:
    """Refuse redactions naming documents the index (over a mixture: their source's index, ``num_documents`` one
    count per source) does not hold (a typo must not redact nothing silently)."""
    for r in plan.redactions or ():
        held = num_documents if r.source is None else num_documents[r.source]  # type: ignore[index]
        if r.documents[-1] >= held:
            bad = [d for d in r.documents if d >= held]
            of = "the index holds" if r.source is None else "that source holds"
            label = "" if r.source is None or config is None else f" (source {_source_label(config, r.source)})"
            raise ValueError(
                f"DataConfig.redactions from step {r.from_step}{label} names documents {bad}: {of} documents 0 .."
                f" {held - 1}"
            )


def _plan(
    config: DataConfig,
    world_size: int,
    num_samples: int | None = None,
    source: Any = None,
    dataset: Any = None,
    layout: Any = None,
) -> Plan:
    """The plan of ``config`` over ``num_samples`` (a layout's sample count) or ``source`` (a mixture); ``dataset``
    (a mixture: one per source) resolves the redactions' paths and content hashes; ``data.balance`` costs the samples
    by ``layout``'s spans (a mixture's: by its sources' layouts)."""
    from detsampler.balance import Balance

    balance = Balance(layout if layout is not None else source, config.balance) if config.balance else None
    return Plan(
        num_samples=num_samples,
        source=source,
        seed=config.seed,
        global_batch_size=config.global_batch_size,
        micro_batch_size=config.micro_batch_size,
        world_size=world_size,
        batch_size_schedule=[tuple(row) for row in config.batch_size_schedule] or None,
        skip_steps=[tuple(r) for r in config.skip_steps] or None,
        mapping_version=config.mapping_version or None,  # 0: the current version (3 balanced, else 2)
        redactions=resolve_redactions(config, dataset) or None,
        epoch_ids=config.epoch_order and source is None,  # a mixture qualifies its epoch_order sources' ids itself
        balance=balance,
    )


def _packed_dataset(
    prepared: Any,
    layout: Layout,
    text_column: str,
    instance_filter: Any = None,
    prefetch: Any = None,
    plan: Plan | None = None,
) -> Any:
    """The PackedDataset of a prepared index; when its tokens are not stored, it tokenizes each batch's documents on the
    fly. ``instance_filter`` (``data.instance_filter``): a flagged sample's labels are all -100. ``prefetch``
    (``data.prefetch``, a PrefetchConfig) with ``plan``: an index in an object store is read ahead by the plan."""
    from detsampler.loader.dataset import PackedDataset

    ahead = {} if prefetch is None else {"prefetch": prefetch, "plan": plan}
    if prepared.index.tokens is None:
        return PackedDataset(
            prepared.index,
            layout,
            dataset=prepared.dataset,
            tokenizer=prepared.tokenizer,
            text_column=text_column,
            instance_filter=instance_filter,
            **ahead,
        )
    return PackedDataset(prepared.index, layout, instance_filter=instance_filter, **ahead)


def _verify_once(index: Any) -> None:
    """The full check of a built index (every chunk and sha256), once per new index (a marker beside it), of each shard
    of a sharded one; reads stay checked chunk by chunk anyway. Pre-tokenized sources record no checksums to check."""
    for part in getattr(index, "shards", [index]):
        if hasattr(part, "verify_once"):
            part.verify_once()


def build_pipeline(config: DataConfig, world_size: int, rank: int = 0) -> DataPipeline:
    """Build (or open from the cache) tokenizer and index, then the layout, plan and dataset for
    ``world_size`` ranks."""
    from detsampler.index.prepare import prepare_index

    if config.mixture_sources:
        return _build_mixture_pipeline(config, world_size, rank)
    # One process builds the index (a file lock, no collective: each node builds its own copy without a shared
    # filesystem);
    # a file lock serializes the default tokenizer's one-time training.
    prepared = prepare_index(index_config(config), progress=rank == 0)
    index, tokenizer = prepared.index, prepared.tokenizer
    _verify_once(index)
    layout = index.layout(_layout_config(config))
    plan = _plan(config, world_size, num_samples=layout.num_samples, dataset=prepared.dataset, layout=layout)
    check_redacted_documents(plan, index.num_documents)
    dataset = _packed_dataset(prepared, layout, config.text_column, config.instance_filter, config.prefetch, plan)
    pipeline = DataPipeline(config=config, index=index, tokenizer=tokenizer, layout=layout, plan=plan, dataset=dataset)
    check_worker_start(pipeline)
    return pipeline


def step_token_hashes(micro_batches: list[dict[str, torch.Tensor]]) -> np.ndarray:
    """Per-sample token hashes of this rank's micro batches of one step: uint64 [micro_steps, micro_batch_size]. A row
    hashes its input ids and labels, and its loss mask when the batch holds one (SFT data)."""
    from train.metrics import token_row_hashes

    rows = []
    for mb in micro_batches:
        parts = [mb["input_ids"], mb["labels"]] + ([mb["loss_mask"].to(torch.int64)] if "loss_mask" in mb else [])
        both = torch.cat(parts, dim=1).cpu().numpy()
        rows.append(token_row_hashes(both))
    return np.stack(rows)


def _build_mixture_pipeline(config: DataConfig, world_size: int, rank: int) -> DataPipeline:
    """One index per ``mixture_sources`` entry (one shared tokenizer), the same layout config for each, the plan over
    their mixture and a :class:`detsampler.loader.mixture_dataset.MixtureDataset` of their packed datasets."""
    from detsampler.index.prepare import prepare_sources
    from detsampler.loader.mixture_dataset import MixtureDataset

    prepared = prepare_sources(index_config(config), config.mixture_sources, progress=rank == 0)
    for p in prepared:
        _verify_once(p.index)
    layouts = [p.index.layout(_layout_config(config)) for p in prepared]
    mixture = config.mixture_config().build(layouts)
    plan = _plan(config, world_size, source=mixture, dataset=[p.dataset for p in prepared])
    check_redacted_documents(plan, [p.index.num_documents for p in prepared], config)
    datasets = [
        _packed_dataset(p, lay, config.text_column, config.instance_filter) for p, lay in zip(prepared, layouts)
    ]
    ahead = {} if config.prefetch is None else {"prefetch": config.prefetch, "plan": plan}
    pipeline = DataPipeline(
        config=config,
        index=prepared[0].index,
        tokenizer=prepared[0].tokenizer,
        layout=layouts[0],
        plan=plan,
        dataset=MixtureDataset(datasets, plan.stream, **ahead),
        sources=[(p.index, lay) for p, lay in zip(prepared, layouts)],
    )
    check_worker_start(pipeline)
    return pipeline
