"""``--checkpoint PATH`` of ``show``, ``verify`` and ``stats``: the data a checkpoint records, reopened, so that an
audit re-types nothing.

PATH is any form a trainer keeps its checkpoint in (:mod:`detsampler.cli.record_files` finds the record there).

Invariants: the indexes are reopened where the record says and the plan rebuilt from the record; unless
``DataFingerprint.of(reopened)`` equals the recorded fingerprint the audit is refused (an index changed since). Every
option given explicitly that maps onto a recorded value must equal it, else the audit is refused naming the option, the
checkpoint's value and the given one; ``--world-size`` and ``--micro-batch-size`` cut the recorded plan another way and
are allowed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from detsampler.cli.options import resolve_redaction_sources
from detsampler.cli.record_files import find_record
from detsampler.layout import Layout
from detsampler.mixture import MixtureConfig
from detsampler.mixture.weights import normalize_weights
from detsampler.plan import Plan, normalize_skip_steps
from detsampler.record import DataRecord
from detsampler.redaction import check_redacted_documents, normalize_redactions
from detsampler.resume import DataFingerprint, erasures_added, fingerprint_changes

__all__ = ["Audit", "after_checkpoint", "mixture_of", "open_audit"]

# options that only say how to build an index: a checkpoint names its index, so they have no effect
_UNUSED = ("vocab_size", "num_proc", "cache_dir")


@dataclass
class Opened:
    """A reopened index with what ``show`` reads beside it: its dataset (document paths, on-the-fly text) and
    tokenizer (decoding), None when not known."""

    index: Any
    dataset: Any = None
    tokenizer: Any = None


@dataclass
class Audit:
    """What a checkpoint's record rebuilds: where it was read, the record, one :class:`Opened` and one layout per index,
    the plan (cut as asked), the mixture's labels (None for a single index)."""

    where: str
    record: DataRecord
    prepared: list[Opened]
    layouts: list[Layout]
    plan: Plan
    labels: tuple[str, ...] | None


# -- options against the record
# --------------------------------------------------------------------------------------------


def _flag(dest: str) -> str:
    return "--redact" if dest == "redactions" else "--" + dest.replace("_", "-")


def _given(args: argparse.Namespace, dest: str) -> Any:
    return getattr(args, dest)


def _fractions(weights: Any, n: int) -> list[str]:
    ints = normalize_weights(list(weights), n)
    return [str(Fraction(c, sum(ints))) for c in ints]


def _recorded_values(record: DataRecord, indexes: list[Any]) -> dict[str, Any]:
    """Option dest -> the value the checkpoint records (options absent here are checked elsewhere or allowed)."""
    plan = record.fingerprint.plan
    configs = record.layout_configs()
    values: dict[str, Any] = {}
    layout_fields = {
        "kind": "kind",
        "seq_len": "seq_len",
        "layout_seed": "seed",
        "window_docs": "window_docs",
        "overlong": "overlong",
        "epoch_order": "epoch_order",
    }
    for dest, name in layout_fields.items():
        found = sorted({getattr(c, name) for c in configs}, key=str)
        values[dest] = found[0] if len(found) == 1 else found
    schedule = [list(row) for row in plan["batch_size_schedule"]]
    values.update(
        {
            "seed": plan["seed"],
            "global_batch_size": schedule[-1][1],
            "batch_size_schedule": schedule,
            "skip_steps": [list(r) for r in plan.get("skip_steps", [])],
            "redactions": [[r[0], list(r[1]), *r[2:]] for r in plan.get("redactions", [])],
            "mapping_version": plan["mapping_version"],
            "balance": "balance" in plan,
        }
    )
    for name in ("attention", "linear", "fixed"):  # the cost model of a balanced plan (None: not balanced)
        values[f"balance_{name}"] = plan["balance"]["cost"][name] if "balance" in plan else None
    first = indexes[0]
    if hasattr(first, "store_tokens"):
        values["store_tokens"] = bool(first.store_tokens)
    special = getattr(first, "special_tokens", None)
    if special is not None:
        values["add_bos"], values["add_eos"] = special.add_bos, special.add_eos
    if getattr(first, "text_column", None) is not None:
        values["text_column"] = first.text_column
    chat = getattr(first, "chat", None)
    if chat is not None:  # the chat columns and policy the index was built with
        values["loss_policy"], values["completion_column"] = chat.policy, chat.completion_column
    if record.is_mixture:
        stream = plan["stream"]
        values["mixture_seed"] = stream["seed"]
        values["mixture_weights"] = stream["schedule"][0][1]
        values["mixture_schedule"] = [list(row) for row in stream["schedule"][1:]]
        if record.names is not None:
            values["mixture_names"] = list(record.names)
    return values


def _normalized_given(dest: str, value: Any, record: DataRecord) -> Any:
    """The given option value in the recorded form."""
    if dest == "batch_size_schedule":
        return [list(r) for r in value] if value is not None else None
    if dest == "skip_steps":
        return [list(r) for r in normalize_skip_steps([tuple(r) for r in value or []])]
    if dest == "redactions":
        return [r.to_list() for r in normalize_redactions(resolve_redaction_sources(value, _labels(record)) or [])]
    if dest == "mixture_weights":
        return _fractions(value, len(record.indexes))
    if dest == "mixture_schedule":
        return [[int(step), _fractions(w, len(record.indexes))] for step, w in value or []]
    if dest == "mixture_names":
        return list(value)
    if dest == "add_eos" and value is None:
        return "virtual"
    return value


def _conflicts(args: argparse.Namespace, explicit: set[str], record: DataRecord, indexes: list[Any]) -> list[str]:
    recorded = _recorded_values(record, indexes)
    problems = []
    for dest in sorted(explicit):
        if dest in _UNUSED:
            problems.append(f"{_flag(dest)} has no effect with --checkpoint (the checkpoint names its index)")
            continue
        if dest in ("data", "mixture_data"):
            mixture = dest == "mixture_data"
            if mixture != record.is_mixture:
                what = "a mixture of " + str(len(record.indexes)) + " sources" if record.is_mixture else "one index"
                problems.append(f"{_flag(dest)}: the checkpoint's data is {what}")
            continue
        if dest in ("mixture_weights", "mixture_schedule", "mixture_seed", "mixture_names") and not record.is_mixture:
            problems.append(f"{_flag(dest)}: the checkpoint's data is one index, not a mixture")
            continue
        if dest not in recorded:
            continue
        try:
            given = _normalized_given(dest, _given(args, dest), record)
        except ValueError as exc:
            problems.append(f"{_flag(dest)}: {exc}")
            continue
        if given != recorded[dest]:
            shown, saved = _show_value(_given(args, dest)), _show_value(recorded[dest])
            problems.append(f"{_flag(dest)} {shown} contradicts the checkpoint, which records {saved}")
    return problems


def _show_value(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return json.dumps(value, default=str).replace(" ", "")
    return str(value)


# -- reopening
# -------------------------------------------------------------------------------------------------------------


def _open_indexes(record: DataRecord, where: str) -> list[Any]:
    from detsampler.index.locations import open_location

    opened = []
    for location in record.indexes:
        try:
            opened.append(open_location(location))
        except (ValueError, OSError) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise ValueError(
                f"checkpoint {where}: its index at {location.get('path')!r} does not open ({why}); it was moved or"
                " deleted since the checkpoint was saved"
            ) from None
    return opened


def mixture_of(record: DataRecord, layouts: list[Layout]) -> Any:
    """The mixture ``record`` reads over ``layouts`` (one per source), rebuilt from its recorded stream."""
    stream = record.fingerprint.plan["stream"]
    schedule = stream["schedule"]
    config = MixtureConfig(
        weights=tuple(schedule[0][1]),
        schedule=tuple((int(step), tuple(w)) for step, w in schedule[1:]),
        seed=int(stream["seed"]),
        names=record.names,
    )
    return config.build(layouts)


def _datasets(args: argparse.Namespace, explicit: set[str], record: DataRecord, indexes: list[Any]) -> list[Any]:
    """The corpus of each index when the options name it (checked to be the one it was built from), else, for the
    default corpus, found by its fingerprint; None where not known."""
    from detsampler.cli.options import index_config
    from detsampler.index.prepare import load_dataset_for

    if "mixture_data" in explicit:
        data = list(args.mixture_data)
        if len(data) != len(indexes):
            raise ValueError(f"--mixture-data names {len(data)} corpora, the checkpoint's mixture {len(indexes)}")
    elif explicit & {"data", "max_documents", "text_column"} and not record.is_mixture:
        data = [args.data]
    else:
        return [_default_corpus_of(index) for index in indexes]
    out = []
    base = index_config(args)
    for path, index in zip(data, indexes):
        if not hasattr(index, "check_dataset") or getattr(index, "meta", {}).get("dataset_fingerprint") is None:
            out.append(None)
            continue
        from dataclasses import replace

        # NOTE: the index records its text column: --text-column, when given, must be it (checked below and by
        # _conflicts), and is not needed otherwise
        column = base.text_column if "text_column" in explicit else index.text_column
        dataset = load_dataset_for(replace(base, data=path, text_column=column))
        try:
            index.check_dataset(dataset, column)
        except ValueError as exc:
            flag = "--mixture-data" if "mixture_data" in explicit else "--data"
            what = path or "(the default corpus)"
            raise ValueError(f"{flag} {what} is not the corpus of the checkpoint's index: {exc}") from None
        out.append(dataset)
    return out


def _default_corpus_of(index: Any) -> Any:
    """The default corpus (the standard library's first N sources) when ``index`` was built from it, else None."""
    meta = getattr(index, "meta", None)
    if not isinstance(meta, dict) or "dataset_fingerprint" not in meta or "dataset_num_rows" not in meta:
        return None
    from detsampler.index.format import dataset_fingerprint
    from detsampler.text.corpus import default_corpus, stdlib_files

    rows = int(meta["dataset_num_rows"])
    if rows > len(stdlib_files()):
        return None
    dataset = default_corpus(max_documents=rows)
    return dataset if dataset_fingerprint(dataset) == meta["dataset_fingerprint"] else None


def _tokenizer(args: argparse.Namespace, explicit: set[str], index: Any, needed: bool) -> Any:
    """The tokenizer of ``index``: ``--tokenizer`` (checked against the index), else the one its meta records."""
    from detsampler.text.load import load_tokenizer

    if "tokenizer" in explicit:
        tok = load_tokenizer(args.tokenizer)
        if hasattr(index, "check_tokenizer"):
            try:
                index.check_tokenizer(tok)
            except ValueError as exc:
                raise ValueError(f"--tokenizer {args.tokenizer} is not the checkpoint's index's: {exc}") from None
        return tok
    if not needed:
        return None
    meta = getattr(index, "meta", None)
    recorded = meta.get("tokenizer", {}).get("path") if isinstance(meta, dict) else None
    if recorded and Path(recorded).exists():
        tok = load_tokenizer(recorded)
        if not hasattr(index, "check_tokenizer"):
            return tok
        try:
            index.check_tokenizer(tok)
            return tok
        except ValueError:
            pass
    if getattr(index, "kind", None) not in (None, "index"):  # a pre-tokenized source: ids are shown instead
        return None
    raise ValueError(
        f"--decode: the tokenizer the index at {str(getattr(index, 'path', '?'))!r} was built with"
        f" ({recorded or 'not recorded'}) is not there or changed; pass --tokenizer PATH"
    )


def open_audit(args: argparse.Namespace, *, corpus: bool = False, decode: bool = False) -> Audit:
    """The record of ``args.checkpoint``, its indexes reopened, their layouts and the plan (cut for ``--world-size`` /
    ``--micro-batch-size`` when given); refused when an explicit option contradicts the record or the data changed.
    ``corpus``: also find each index's corpus (document paths); ``decode``: and its tokenizer (decoded text)."""
    explicit = set(getattr(args, "explicit", set()))
    record, where = find_record(args.checkpoint)
    indexes = _open_indexes(record, where)
    problems = _conflicts(args, explicit, record, indexes)
    if problems:
        raise ValueError(
            f"checkpoint {where}: " + "; ".join(problems) + ". Drop the option: the checkpoint gives it"
            " (--world-size, --micro-batch-size, --step and --rank may differ)"
        )
    configs = record.layout_configs()
    layouts = [index.layout(config) for index, config in zip(indexes, configs)]
    cut = {
        "world_size": args.world_size if "world_size" in explicit else None,
        "micro_batch_size": args.micro_batch_size if "micro_batch_size" in explicit else None,
    }
    try:
        if record.is_mixture:
            plan = record.plan(source=mixture_of(record, layouts), **cut)
        else:
            plan = record.plan(layouts[0].num_samples, layout=layouts[0], **cut)
    except ValueError as exc:
        raise ValueError(f"checkpoint {where}: {exc}; the index or layout changed since it was saved") from None
    try:  # NOTE: a recorded redaction of a document the index lacks was shown as redacted, or refused mid-report
        check_redacted_documents(plan.redactions, [index.num_documents for index in indexes])
    except ValueError as exc:
        raise ValueError(f"checkpoint {where}: its plan's redaction is not of its index: {exc}") from None
    many = record.is_mixture
    reopened = DataFingerprint.of(
        indexes if many else indexes[0], layouts if many else layouts[0], plan, record.instance_filter()
    )
    if erasures_added(record.fingerprint.index, reopened.index):  # erased since: every sample in place, audited as is
        reopened = dataclasses.replace(reopened, index=record.fingerprint.index)
    if reopened.hash != record.fingerprint.hash:
        changes = fingerprint_changes(record.fingerprint, reopened)
        raise ValueError(
            f"checkpoint {where}: the data it names changed since it was saved ({'; '.join(changes)}); an audit of"
            " other data would not show what was trained"
        )
    wanted = corpus or decode or explicit & {"data", "mixture_data", "max_documents"}
    datasets = _datasets(args, explicit, record, indexes) if wanted else [None] * len(indexes)
    prepared = []
    for index, dataset in zip(indexes, datasets):
        on_the_fly = getattr(index, "tokens", True) is None
        if decode and on_the_fly and dataset is None:
            raise ValueError(
                f"--decode: the index at {str(index.path)!r} stores no tokens; pass --data with the corpus it was built"
                " from (checked against the index) to tokenize its documents"
            )
        tokenizer = _tokenizer(args, explicit, index, needed=decode)
        prepared.append(Opened(index=index, dataset=dataset, tokenizer=tokenizer))
    return Audit(where, record, prepared, layouts, plan, _labels(record))


def after_checkpoint(record: DataRecord, end: int) -> str | None:
    """The line that says steps ``record.step .. end - 1`` of an audit are the plan's, not trained by the checkpoint
    (None when ``end`` does not pass its step). NOTE: `stats --step` / `verify --steps` past it counted them as
    trained."""
    if end <= record.step:
        return None
    return (
        f"  steps {record.step}..{end - 1} are after the checkpoint's step {record.step}: counted as the plan reads"
        " them, not trained by it"
    )


def _labels(record: DataRecord) -> tuple[str, ...] | None:
    """A mixture record's source names (``source0, source1, ...`` when it records none); None for one index."""
    if not record.is_mixture:
        return None
    return record.names or tuple(f"source{k}" for k in range(len(record.indexes)))
