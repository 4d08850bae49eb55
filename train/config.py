"""Training configuration: one TOML file mapped one to one onto frozen dataclasses, overridable with ``--set
key=value``.

TOML sections are the fields of :class:`TrainConfig`: ``[model]``, ``[data]``, ``[optimizer]``, ``[schedule]``,
``[checkpoint]``, ``[runtime]``. A command-line override ``--set data.seq_len=128`` sets the same key as the TOML line
``seq_len = 128`` under ``[data]``; its value is parsed as a TOML value, and text that is no TOML value is a bare string
(``--set data.source="'x.txt'"`` and ``--set data.source=x.txt`` are the same; ``--set runtime.deterministic=False`` is
the string ``'False'``, which is refused: TOML's boolean is ``false``). Unknown sections or keys are a ValueError naming
them. Every field of every section is checked against its declared type (:func:`check_fields`: a bool is a bool, an int
an int, a float a finite number; nothing is coerced but int to float and list to tuple), then against its range.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import typing
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from detsampler.checks import check_int, is_int

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = [
    "CheckpointConfig",
    "DataConfig",
    "ModelConfig",
    "OptimizerConfig",
    "RuntimeConfig",
    "ScheduleConfig",
    "TrainConfig",
    "apply_overrides",
    "check_fields",
    "config_from_dict",
    "config_to_dict",
    "load_config",
]


def _positive_int(obj: Any, name: str, minimum: int = 1) -> None:
    check_int(getattr(obj, name), f"{type(obj).__name__}.{name}", minimum=minimum)


def _positive_float(obj: Any, name: str, allow_zero: bool = False) -> None:
    value = getattr(obj, name)  # a finite float: check_fields has run
    if value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{type(obj).__name__}.{name} must be a number {'>=' if allow_zero else '>'} 0, got {value!r}")


def _got(value: Any) -> str:
    return f"got {value!r} ({type(value).__name__})"


def _checked(value: Any, annotation: Any, name: str) -> Any:
    """``value`` as a value of the declared type ``annotation``, or a ValueError naming ``name``, what it got and what
    is allowed. Nothing is coerced except what loses nothing: an int where a float is declared (TOML ``lr = 1``)
    becomes that float, and a list where a tuple is declared becomes a tuple. Floats must be finite."""
    if annotation is Any:
        return value
    if annotation is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{name} must be true or false, {_got(value)}")
        return value
    if annotation is int:
        if not is_int(value):
            raise ValueError(f"{name} must be an integer, {_got(value)}")
        return int(value)
    if annotation is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{name} must be a finite number, {_got(value)}")
        try:
            number = float(value)
        except OverflowError:  # an int beyond the float range
            number = math.inf
        if not math.isfinite(number):
            raise ValueError(f"{name} must be a finite number, {_got(value)}")
        return number
    if annotation is str:
        if not isinstance(value, str):
            raise ValueError(f"{name} must be a string, {_got(value)}")
        return value
    if dataclasses.is_dataclass(annotation):
        if not isinstance(value, annotation):
            raise ValueError(f"{name} must be a [{name}] table, {_got(value)}")
        return value
    if typing.get_origin(annotation) is tuple:
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"{name} must be a list, {_got(value)}")
        items = typing.get_args(annotation)
        if len(items) == 2 and items[1] is Ellipsis:
            return tuple(_checked(v, items[0], f"{name}[{i}]") for i, v in enumerate(value))
        if len(value) != len(items):
            raise ValueError(f"{name} must be a list of {len(items)} items, {_got(value)}")
        return tuple(_checked(v, t, f"{name}[{i}]") for i, (v, t) in enumerate(zip(value, items)))
    raise TypeError(f"{name}: no check for the declared type {annotation!r}")  # a field of a type added without one


def check_fields(obj: Any) -> None:
    """Check (and normalise in place, see :func:`_checked`) every field of the frozen dataclass ``obj`` against its
    declared type: one generic check for every field of every section, run first by each ``__post_init__``."""
    hints = typing.get_type_hints(type(obj))
    for f in fields(obj):
        value = _checked(getattr(obj, f.name), hints[f.name], f"{type(obj).__name__}.{f.name}")
        object.__setattr__(obj, f.name, value)


def _redaction_source(entry: dict, name: str, labels: tuple[str, ...] | None) -> int | None:
    """The source index an entry names (``source = "NAME"``, one of the mixture's labels, or its index), None for one
    index; refused: a source over one index, none (or an unknown one) over a mixture."""
    if "source" not in entry:
        if labels is not None:
            raise ValueError(
                f"{name} names no source: over a mixture each redaction names the source whose documents it lists,"
                f" source = NAME (one of {list(labels)}) or its index"
            )
        return None
    source = entry["source"]
    if labels is None:
        raise ValueError(f"{name}.source is for a mixture (mixture_sources): over one index give no source")
    if isinstance(source, str) and source in labels:
        return labels.index(source)
    if is_int(source) and 0 <= source < len(labels):
        return int(source)
    raise ValueError(
        f"{name}.source {source!r} is no source of the mixture: its sources are {list(labels)} (or 0 .."
        f" {len(labels) - 1})"
    )


def _redaction_ids(entry: dict, name: str) -> dict[str, Any]:
    """An entry's ``id_column`` and ``ids`` (both or neither; ids strings or integers), as given, or ``{}``."""
    if ("ids" in entry) != ("id_column" in entry):
        missing = "id_column" if "ids" in entry else "ids"
        given = "ids" if missing == "id_column" else "id_column"
        raise ValueError(
            f"{name}.{given} needs {missing}: ids = [...] are values of the dataset's column id_column = C (a"
            " conversation_id)"
        )
    if "ids" not in entry:
        return {}
    column, ids = entry["id_column"], entry["ids"]
    if not isinstance(column, str) or not column:
        raise ValueError(f"{name}.id_column must be a column name, got {column!r}")
    if (
        not isinstance(ids, (list, tuple))
        or not ids
        or not all(isinstance(i, (str, int)) and not isinstance(i, bool) for i in ids)
    ):
        raise ValueError(f"{name}.ids must be a list of strings or integers (values of column {column!r}), got {ids!r}")
    return {"id_column": column, "ids": list(ids)}


def _redaction_entries(entries: Any, labels: tuple[str, ...] | None) -> tuple[dict, ...]:
    """``DataConfig.redactions`` checked: ``{documents = [ids], paths = [dataset paths], sha256 = [content hashes],
    id_column = C, ids = [values of column C], from_step = s}`` tables (at least one way of naming documents), sorted
    by step (then source); over a mixture (``labels``: its source names) each names ``source``, kept as the source's
    index. Document ids are checked (and duplicates across entries refused) here, paths, content hashes and id values
    when the pipeline resolves them against the dataset's ``path``, text and id columns."""
    from detsampler.redaction import Redaction, normalize_redactions

    out = []
    for i, entry in enumerate(entries):
        name = f"DataConfig.redactions[{i}]"
        allowed = {"documents", "paths", "sha256", "id_column", "ids", "from_step", "source"}
        if not isinstance(entry, dict) or set(entry) - allowed or "from_step" not in entry:
            raise ValueError(
                f"{name}: a redaction is {{documents = [ids], paths = [...], sha256 = [...], id_column = C, ids ="
                f" [...], from_step = s}} (and source = NAME over a mixture), got {entry!r}"
            )
        by_id = _redaction_ids(entry, name)
        source = _redaction_source(entry, name, labels)
        paths = entry.get("paths", [])
        if not isinstance(paths, (list, tuple)) or not all(isinstance(p, str) for p in paths):
            raise ValueError(f"{name}.paths must be a list of strings, got {paths!r}")
        hashes = entry.get("sha256", [])
        if not isinstance(hashes, (list, tuple)) or not all(
            isinstance(h, str) and len(h) == 64 and all(c in "0123456789abcdefABCDEF" for c in h) for h in hashes
        ):
            raise ValueError(f"{name}.sha256 must be a list of sha256 hex digests (64 hex digits each), got {hashes!r}")
        documents = entry.get("documents", [])
        if not documents and not paths and not hashes and not by_id:
            raise ValueError(
                f"{name} names no document: give documents = [ids], paths = [...], sha256 = [...] or id_column = C"
                " with ids = [...]"
            )
        try:
            ids = Redaction(documents, entry["from_step"]).documents if documents else ()
            Redaction([0], entry["from_step"])
        except ValueError as exc:
            raise ValueError(f"DataConfig.redactions: {exc}") from None
        row: dict[str, Any] = {"documents": list(ids), "from_step": int(entry["from_step"])}
        if source is not None:
            row["source"] = source
        if paths:
            row["paths"] = sorted(set(paths))
        if hashes:
            row["sha256"] = sorted({h.lower() for h in hashes})
        row.update(by_id)
        out.append(row)
    out.sort(key=lambda r: (r["from_step"], r.get("source", -1)))
    try:
        normalize_redactions(
            [Redaction(r["documents"], r["from_step"], r.get("source")) for r in out if r["documents"]]
        )
        for a, b in zip(out, out[1:]):
            if (a["from_step"], a.get("source")) == (b["from_step"], b.get("source")):
                of = "" if labels is None else f" of source {labels[a['source']]}"
                raise ValueError(f"two redactions{of} from step {a['from_step']}: give each step once")
    except ValueError as exc:
        raise ValueError(f"DataConfig.redactions: {exc}") from None
    return tuple(out)


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """A Llama-style decoder. ``vocab_size = 0`` takes the tokenizer's vocabulary size."""

    vocab_size: int = 0
    dim: int = 64
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int = 0  # 0: same as n_heads
    ffn_dim: int = 0  # 0: about 8/3 * dim, rounded up to a multiple of 32
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    init_std: float = 0.02
    init_seed: int = 0
    tie_embeddings: bool = False

    def __post_init__(self) -> None:
        check_fields(self)
        _positive_int(self, "vocab_size", 0)
        _positive_int(self, "init_seed", 0)
        for name in ("dim", "n_layers", "n_heads"):
            _positive_int(self, name)
        _positive_int(self, "n_kv_heads", 0)
        _positive_int(self, "ffn_dim", 0)
        if self.dim % self.n_heads:
            raise ValueError(f"ModelConfig.dim ({self.dim}) must be divisible by n_heads ({self.n_heads})")
        if (self.dim // self.n_heads) % 2:
            raise ValueError(
                f"ModelConfig head dim dim/n_heads = {self.dim // self.n_heads} must be even for rotary embeddings"
            )
        if self.n_heads % self.kv_heads:
            raise ValueError(f"ModelConfig.n_heads ({self.n_heads}) must be divisible by n_kv_heads ({self.kv_heads})")
        _positive_float(self, "rope_theta")
        _positive_float(self, "norm_eps")
        _positive_float(self, "init_std")

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def hidden_dim(self) -> int:
        return self.ffn_dim or 32 * -(-(8 * self.dim // 3) // 32)


def _source_spec(value: Any, name: str) -> str:
    """A data source as the index options take it: a path, or ``KIND:PATH`` for a table ``{kind = ..., path = ...}``."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and set(value) == {"kind", "path"} and all(isinstance(v, str) for v in value.values()):
        return value["path"] if value["kind"] == "text" else f"{value['kind']}:{value['path']}"
    raise ValueError(f'DataConfig.{name} must be a path or a table {{kind = "megatron", path = "..."}}, {_got(value)}')


def _schedule_entry(value: Any) -> Any:
    """A mixture schedule entry as a pair: the table ``{step = S, weights = [...]}`` is ``[S, [...]]``."""
    if isinstance(value, dict) and set(value) == {"step", "weights"}:
        return (value["step"], value["weights"])
    return value


def _options_table(value: Any, cls: type, name: str, shape: str) -> Any:
    """``data.<name>``, options of the dataclass ``cls``, as an instance or None (off): a table of its fields (``{}``:
    its defaults), ``true`` (the defaults), ``false`` or absent (off). Unknown keys, and values ``cls`` refuses, are a
    ValueError naming ``DataConfig.<name>``; ``shape`` is the table shown in the error for any other value."""
    if value is None or value is False:
        return None
    if value is True:
        return cls()
    if isinstance(value, cls):
        return value
    if isinstance(value, dict):
        allowed = {f.name for f in fields(cls)}
        unknown = sorted(set(value) - allowed)
        if unknown:
            raise ValueError(f"DataConfig.{name}: unknown key(s) {unknown}; allowed keys are {sorted(allowed)}")
        try:
            return cls(**value)
        except ValueError as exc:
            raise ValueError(f"DataConfig.{name}: {exc}") from None
    raise ValueError(f"DataConfig.{name} must be a table {shape}, true or false, {_got(value)}")


def _instance_filter(value: Any) -> Any:
    """``data.instance_filter`` as a :class:`detsampler.filter.RepetitionFilter` or None (off)."""
    from detsampler.filter import RepetitionFilter

    return _options_table(
        value, RepetitionFilter, "instance_filter", "{max_period = 13, min_period = 1, max_count = 32}"
    )


def _prefetch(value: Any) -> Any:
    """``data.prefetch`` as a :class:`detsampler.loader.PrefetchConfig` or None (off)."""
    from detsampler.loader.prefetch import PrefetchConfig

    shape = "{budget_bytes = 67108864, cache_bytes = 134217728, threads = 8, block_bytes = 65536}"
    return _options_table(value, PrefetchConfig, "prefetch", shape)


def _balance(value: Any) -> Any:
    """``data.balance`` as a :class:`detsampler.balance.CostModel` (the balanced plan's cost model) or None (off)."""
    from detsampler.balance import CostModel

    shape = "{" + ", ".join(f"{name} = {value!r}" for name, value in CostModel().describe().items()) + "}"
    return _options_table(value, CostModel, "balance", shape)


WORKER_START_METHODS = ("", "fork", "forkserver", "spawn")


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    """What the data stream is (source, tokenizer, layout, seed, batch schedule) and how it is loaded (workers).

    ``source`` empty means the default corpus (the Python standard library); else a local text corpus path, or a
    pre-tokenized corpus as a table ``{kind = "megatron", path = "data/corpus_text_document"}`` (kinds: megatron, olmo,
    datatrove, nanogpt; the string ``"KIND:PATH"`` is the same). ``tokenizer``: a sentencepiece ``.model``, a Hugging
    Face ``tokenizer.json`` or a local transformers directory; empty means a
    ``vocab_size``-piece tokenizer trained once on the corpus (the whole default corpus when ``source`` is empty) and
    cached. ``max_documents > 0`` keeps only the first documents of the source. The index options map one to one onto
    :class:`detsampler.index.prepare.IndexConfig` (``train.data.index_config``). ``add_bos`` / ``add_eos``
    (``"virtual"``,
    ``"real"``, or empty for the source's default) are the BOS/EOS policy
    (:class:`detsampler.text.policy.SpecialTokens`).

    A mixture: ``mixture_sources`` lists local corpora (each like ``source``, which must then be empty), all with the
    same tokenizer and layout, drawn with ``mixture_weights`` from step 0 and ``mixture_schedule`` entries
    ``[first_step, [weights]]`` after it (data steps); ``mixture_names`` labels them; ``seed`` seeds the mixture too
    (see :class:`detsampler.mixture.MixtureConfig`). ``skip_steps``: inclusive ``[first, last]`` ranges of data steps
    never trained on (:class:`detsampler.plan.Plan`). ``instance_filter``: OLMo-core's repetition filter
    (:class:`detsampler.filter.RepetitionFilter`, a table of its fields, ``{}`` or ``true`` for its defaults; absent or
    ``false``: off); a flagged sample is still read, its labels are all -100 (its loss is masked, the stream
    unchanged). ``redactions``: ``{documents = [ids], from_step = s}`` tables (or ``paths = [...]``, ``sha256 = [...]``
    content hashes, ``id_column = "C", ids = [...]`` values of an id column, resolved when the pipeline is built), whose
    documents' labels are masked (-100) from training step ``s`` on, every step still reading what it read
    (:mod:`detsampler.redaction`); over a mixture each names ``source = "NAME"`` (a ``mixture_names`` entry, else a
    ``mixture_sources`` one, or the source's index), whose document ids (paths, texts, id values) it lists.

    Reading from a bucket (an index at an ``s3://``, ``gs://``, ``az://`` or ``https://`` URL, as ``source`` or found
    in a ``cache_dir`` URL): ``prefetch`` turns on the exact lookahead prefetcher
    (:class:`detsampler.loader.PrefetchConfig`, a table of its fields ``budget_bytes``, ``cache_bytes``, ``threads``,
    ``block_bytes``; ``{}`` or ``true`` for its defaults; absent or ``false``: off): each process that reads batches
    (the training process, or each DataLoader worker) fetches the blocks of its next micro batches ahead into a
    bounded cache; the batches are the same, byte for byte: an index, a pre-tokenized source, a sharded index, or
    every source of a mixture through one prefetcher (one budget, one cache). Over local data (memory-mapped) it does
    nothing, and says so once. ``worker_start_method``: how DataLoader
    workers start (``num_workers > 0``); empty: ``forkserver`` when an index is in an object store (its client does
    not survive a fork once the training process used it), else the platform's default; ``fork`` over an index in an
    object store is refused. A resume may add
    schedule entries and skip ranges at or after its step, and redactions from its step on. ``mapping_version``
    (:class:`detsampler.plan.Plan`): 0, the default, resumes a run on the version its checkpoint records and starts a
    new run on the current one (3 when ``balance`` is on, else 2). ``balance`` (:class:`detsampler.balance.CostModel`,
    a table of its fields ``attention``, ``linear``, ``fixed``; ``{}`` or ``true`` for its defaults; absent or
    ``false``: off): each step's samples dealt to (rank, micro step) by their modeled cost (attention masked per
    document), the same samples per step (:class:`detsampler.balance.Balance`, mapping version 3); ``{attention = 0}``
    balances tokens (padding-free SFT). A resume keeps the checkpoint's balance.

    Supervised fine-tuning (``train/configs/sft.toml``): ``loss_policy`` (:class:`detsampler.text.chat.ChatConfig`)
    makes ``text_column`` a column of chat messages rendered with the tokenizer's chat template (a local transformers
    tokenizer directory) and trains only the tokens the policy names (``assistant``, ``last_turn``, ``all``), or, with
    ``completion_column``, a prompt column whose completion is trained (``completion``, ``all``); the index stores the
    loss mask beside the tokens and masked labels are -100. ``overlong`` (:class:`detsampler.layout.LayoutConfig`,
    bestfit only): an example longer than ``seq_len`` is ``split`` into pieces, ``truncate``d or ``drop``ped.
    """

    source: str = ""
    add_bos: bool = False
    add_eos: str = ""
    text_column: str = "text"
    max_documents: int = 0
    tokenizer: str = ""
    vocab_size: int = 4096  # of the default tokenizer
    cache_dir: str = ""  # "": $DETSAMPLER_CACHE, else ./.cache/detsampler (where detsampler build caches)
    layout: str = "concat"
    seq_len: int = 256
    window_docs: int = 1024
    epoch_order: bool = False  # concat, document: a new document order each epoch (LayoutConfig.epoch_order)
    seed: int = 0
    global_batch_size: int = 8
    micro_batch_size: int = 2
    batch_size_schedule: tuple[tuple[int, int], ...] = ()
    num_workers: int = 0
    prefetch_batches: int = 0  # micro batches a background thread reads ahead of the training loop (0: none)
    num_proc: int = 1  # index build processes
    store_tokens: bool = True  # False: the index keeps only lengths; batches are tokenized on the fly
    mixture_sources: tuple[str, ...] = ()
    mixture_weights: tuple[Any, ...] = ()
    mixture_schedule: tuple[tuple[int, tuple[Any, ...]], ...] = ()
    mixture_names: tuple[str, ...] = ()
    skip_steps: tuple[tuple[int, int], ...] = ()
    redactions: tuple[
        Any, ...
    ] = ()  # {documents/paths/sha256/ids = [...], from_step = s}: labels masked from step s on
    mapping_version: int = 0  # 0: the checkpoint's on resume, else detsampler's MAPPING_VERSION; or a version to use
    instance_filter: Any = None  # a RepetitionFilter table, true (its defaults) or false/absent (off)
    loss_policy: str = (
        ""  # "": plain text; chat data: assistant, last_turn, all, or (with completion_column) completion
    )
    completion_column: str = ""  # prompt/completion data: text_column holds the prompt, this column the completion
    overlong: str = "split"  # bestfit: an example longer than seq_len is split, truncated or dropped
    prefetch: Any = None  # a PrefetchConfig table ({} or true: its defaults), or false/absent (off)
    worker_start_method: str = ""  # "": forkserver over an index in an object store, else the platform's default
    balance: Any = None  # a CostModel table ({} or true: its defaults): each step dealt to ranks by cost; false: off

    def __post_init__(self) -> None:
        from detsampler.layout import LAYOUT_KINDS, OVERLONG_POLICIES, LayoutConfig
        from detsampler.version import MAPPING_VERSIONS

        object.__setattr__(self, "source", _source_spec(self.source, "source"))
        if isinstance(self.mixture_sources, (list, tuple)):
            specs = tuple(_source_spec(s, f"mixture_sources[{i}]") for i, s in enumerate(self.mixture_sources))
            object.__setattr__(self, "mixture_sources", specs)
        if isinstance(self.mixture_schedule, (list, tuple)):
            object.__setattr__(self, "mixture_schedule", tuple(_schedule_entry(e) for e in self.mixture_schedule))
        object.__setattr__(self, "instance_filter", _instance_filter(self.instance_filter))
        object.__setattr__(self, "prefetch", _prefetch(self.prefetch))
        object.__setattr__(self, "balance", _balance(self.balance))
        check_fields(self)
        if self.mapping_version != 0 and self.mapping_version not in MAPPING_VERSIONS:
            raise ValueError(
                "DataConfig.mapping_version must be 0 (the checkpoint's, else the current one) or one of "
                f"{MAPPING_VERSIONS}, got {self.mapping_version!r}"
            )
        self._check_balance_version()

        if self.add_eos not in ("", "virtual", "real"):
            raise ValueError(
                f"DataConfig.add_eos must be virtual, real or empty (the source's default), got {self.add_eos!r}"
            )

        if self.layout not in LAYOUT_KINDS:
            raise ValueError(f"DataConfig.layout must be one of {LAYOUT_KINDS}, got {self.layout!r}")
        if self.worker_start_method not in WORKER_START_METHODS:
            raise ValueError(
                f"DataConfig.worker_start_method must be one of {WORKER_START_METHODS} (empty: forkserver over an index"
                f" in an object store, else the platform's default), got {self.worker_start_method!r}"
            )
        if self.overlong not in OVERLONG_POLICIES:
            raise ValueError(f"DataConfig.overlong must be one of {OVERLONG_POLICIES}, got {self.overlong!r}")
        for name in ("seq_len", "window_docs", "global_batch_size", "micro_batch_size", "num_proc", "seed"):
            _positive_int(self, name, 0 if name == "seed" else 1)
        try:
            LayoutConfig(
                kind=self.layout,
                seq_len=self.seq_len,
                seed=self.seed,
                window_docs=self.window_docs,
                overlong=self.overlong,
                epoch_order=self.epoch_order,
            )
        except ValueError as exc:
            raise ValueError(f"DataConfig: {exc}") from None
        self.chat_config()  # validates loss_policy and completion_column
        for name in ("max_documents", "num_workers", "prefetch_batches", "vocab_size"):
            _positive_int(self, name, 0)
        from detsampler.plan import normalize_skip_steps

        object.__setattr__(self, "skip_steps", normalize_skip_steps(list(self.skip_steps)))
        if self.mixture_sources and self.source:
            raise ValueError("DataConfig: give either source (one corpus) or mixture_sources (a mixture), not both")
        if (self.mixture_weights or self.mixture_schedule or self.mixture_names) and not self.mixture_sources:
            raise ValueError("DataConfig.mixture_weights, mixture_schedule and mixture_names need mixture_sources")
        mixture = self.mixture_config()  # validates the mixture: one weight per source, weights, schedule steps
        labels = None if mixture is None else tuple(mixture.labels)
        object.__setattr__(self, "redactions", _redaction_entries(self.redactions, labels))

    def _check_balance_version(self) -> None:
        """A balanced plan is mapping version 3, and version 3 is the balanced plan's."""
        from detsampler.version import BALANCED_MAPPING_VERSION

        balanced = self.balance is not None
        if self.mapping_version and (self.mapping_version == BALANCED_MAPPING_VERSION) != balanced:
            why = (
                f"with balance set: a balanced plan is mapping version {BALANCED_MAPPING_VERSION} (give it, or 0)"
                if balanced
                else "is the balanced plan's: set balance (a table of its cost model, or true), or give 0"
            )
            raise ValueError(f"DataConfig.mapping_version {self.mapping_version} {why}")

    def chat_config(self) -> Any:
        """The :class:`~detsampler.text.chat.ChatConfig` of ``loss_policy`` (``text_column`` holds the messages, or
        the prompt beside ``completion_column``), or None for plain text (``loss_policy`` empty)."""
        from detsampler.text.chat import CHAT_POLICIES, ChatConfig

        if not self.loss_policy:
            if self.completion_column:
                raise ValueError(
                    f"DataConfig.completion_column ({self.completion_column!r}) is for prompt/completion data: set"
                    " loss_policy too (completion or all)"
                )
            return None
        if self.loss_policy not in CHAT_POLICIES:
            raise ValueError(
                f"DataConfig.loss_policy must be one of {CHAT_POLICIES} or empty (plain text), got {self.loss_policy!r}"
            )
        try:
            return ChatConfig(
                column=self.text_column, completion_column=self.completion_column or None, policy=self.loss_policy
            )
        except ValueError as exc:
            raise ValueError(f"DataConfig.loss_policy: {exc}") from None

    def mixture_config(self) -> Any:
        """The :class:`~detsampler.mixture.MixtureConfig` of the mixture fields, or None without ``mixture_sources``."""
        from detsampler.mixture import MixtureConfig

        if not self.mixture_sources:
            return None
        return MixtureConfig(
            sources=tuple(self.mixture_sources),
            weights=tuple(self.mixture_weights),
            schedule=tuple(self.mixture_schedule),
            seed=self.seed,
            names=tuple(self.mixture_names) or None,
        )


@dataclass(frozen=True, kw_only=True)
class OptimizerConfig:
    """AdamW."""

    lr: float = 3e-3
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.1
    grad_clip: float = 1.0  # 0: no clipping

    def __post_init__(self) -> None:
        check_fields(self)
        _positive_float(self, "lr")
        _positive_float(self, "eps")
        _positive_float(self, "weight_decay", allow_zero=True)
        _positive_float(self, "grad_clip", allow_zero=True)
        for name in ("beta1", "beta2"):
            value = getattr(self, name)
            if not 0 <= value < 1:
                raise ValueError(f"OptimizerConfig.{name} must be in [0, 1), got {value!r}")


@dataclass(frozen=True, kw_only=True)
class ScheduleConfig:
    """Number of steps and the learning-rate schedule: linear warmup, then cosine (or constant) down to
    ``min_lr_ratio``."""

    steps: int = 100
    warmup_steps: int = 10
    decay: str = "cosine"
    min_lr_ratio: float = 0.1

    def __post_init__(self) -> None:
        check_fields(self)
        _positive_int(self, "steps")
        _positive_int(self, "warmup_steps", 0)
        if self.decay not in ("cosine", "constant", "linear"):
            raise ValueError(f"ScheduleConfig.decay must be 'cosine', 'linear' or 'constant', got {self.decay!r}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"ScheduleConfig.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio!r}")


@dataclass(frozen=True, kw_only=True)
class CheckpointConfig:
    """Save every ``every`` steps (and at the end); keep the last ``keep`` complete checkpoints. ``dir`` empty:
    RUN_DIR/checkpoints."""

    every: int = 50
    keep: int = 2
    dir: str = ""
    save_final: bool = True

    def __post_init__(self) -> None:
        check_fields(self)
        _positive_int(self, "every")
        _positive_int(self, "keep")


@dataclass(frozen=True, kw_only=True)
class RuntimeConfig:
    """Where and how it runs: ``device`` auto picks CUDA+NCCL+bf16 when available, else CPU+gloo+fp32."""

    device: str = "auto"
    mixed_precision: str = "auto"  # auto: bf16 on CUDA, fp32 on CPU; or "bf16", "fp32"
    deterministic: bool = True  # CPU: deterministic algorithms (bit-identical resumes)
    # CUDA, with deterministic: an operation without a deterministic implementation is an error, not a warning
    # (use_deterministic_algorithms(True, warn_only=False)), and memory-efficient attention's backward runs
    # deterministically (one key split); on CPU deterministic algorithms are always strict
    strict_determinism: bool = False
    threads: int = 0  # CPU threads per rank; 0: cores / local ranks
    log_every: int = 1

    def __post_init__(self) -> None:
        check_fields(self)
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"RuntimeConfig.device must be 'auto', 'cpu' or 'cuda', got {self.device!r}")
        if self.mixed_precision not in ("auto", "bf16", "fp32"):
            raise ValueError(
                f"RuntimeConfig.mixed_precision must be 'auto', 'bf16' or 'fp32', got {self.mixed_precision!r}"
            )
        _positive_int(self, "threads", 0)
        _positive_int(self, "log_every")


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """The whole configuration; each field is one TOML section."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)

    def __post_init__(self) -> None:
        check_fields(self)


_SECTION_TYPES = {
    "model": ModelConfig,
    "data": DataConfig,
    "optimizer": OptimizerConfig,
    "schedule": ScheduleConfig,
    "checkpoint": CheckpointConfig,
    "runtime": RuntimeConfig,
}


def config_from_dict(raw: dict[str, Any]) -> TrainConfig:
    """A TrainConfig from a nested dict (a parsed TOML file); unknown sections or keys raise ValueError naming them."""
    sections = {}
    for name, value in raw.items():
        if name not in _SECTION_TYPES:
            raise ValueError(f"unknown config section [{name}]; allowed sections are {sorted(_SECTION_TYPES)}")
        if not isinstance(value, dict):
            raise ValueError(f"config section [{name}] must be a table, got {type(value).__name__}")
        cls = _SECTION_TYPES[name]
        allowed = {f.name for f in fields(cls)}
        unknown = sorted(set(value) - allowed)
        if unknown:
            raise ValueError(f"unknown key(s) {unknown} in config section [{name}]; allowed keys are {sorted(allowed)}")
        sections[name] = cls(**value)  # every field checked against its declared type (check_fields)
    return TrainConfig(**sections)


def config_to_dict(config: TrainConfig) -> dict[str, Any]:
    """The nested dict of ``config`` (tuples as lists), the inverse of :func:`config_from_dict`."""

    def plain(value: Any) -> Any:
        if isinstance(value, tuple):
            return [plain(v) for v in value]
        return value

    return {
        name: {k: plain(v) for k, v in dataclasses.asdict(getattr(config, name)).items()} for name in _SECTION_TYPES
    }


def _parse_value(text: str) -> Any:
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text  # a bare string


def apply_overrides(raw: dict[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """``raw`` with each ``section.key=value`` of ``overrides`` set (values parsed as TOML, else taken as strings)."""
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in raw.items()}
    for item in overrides:
        key, sep, text = item.partition("=")
        section, dot, name = key.strip().partition(".")
        if not sep or not dot or not name:
            raise ValueError(f"--set expects section.key=value (e.g. data.seq_len=128), got {item!r}")
        out.setdefault(section, {})[name] = _parse_value(text.strip())
    return out


def load_config(path: str | Path | None, overrides: Iterable[str] = ()) -> TrainConfig:
    """The TrainConfig of TOML file ``path`` (None: all defaults) with ``overrides`` applied."""
    raw: dict[str, Any] = {}
    if path is not None:
        with open(path, "rb") as f:
            raw = tomllib.load(f)
    return config_from_dict(apply_overrides(raw, overrides))
