"""The option <-> dataclass map of the ``detsampler`` command: option parsers, the option groups, and the dataclasses
built back from parsed options.

Invariant: every dest in :data:`OPTION_FIELDS` is added by exactly one ``add_*_options`` group, and the config built
from parsed options takes each mapped field from its option and nothing else (tests check the map covers every field).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from detsampler.balance import Balance, CostModel
from detsampler.layout import LAYOUT_KINDS, OVERLONG_POLICIES, LayoutConfig
from detsampler.media.layout import MediaLayoutConfig
from detsampler.media.packing import OVERLONG_MEDIA
from detsampler.mixture import Mixture, MixtureConfig
from detsampler.plan import Plan
from detsampler.redaction import check_redacted_documents
from detsampler.text.chat import CHAT_POLICIES
from detsampler.version import BALANCED_MAPPING_VERSION, MAPPING_VERSION, MAPPING_VERSIONS

if TYPE_CHECKING:
    from detsampler.index.prepare import IndexConfig

__all__ = [
    "OPTION_FIELDS",
    "add_index_options",
    "add_layout_options",
    "add_mixture_options",
    "add_plan_options",
    "balance_from_args",
    "index_config",
    "is_media",
    "layout_config",
    "layout_for",
    "media_layout_config",
    "mixture_config",
    "plan_from_args",
    "step_range",
]

# option dest -> (dataclass, field): the one-to-one map the parser is built from (tests check it covers every field)
OPTION_FIELDS: dict[str, tuple[str, str]] = {
    "data": ("IndexConfig", "data"),
    "text_column": ("IndexConfig", "text_column"),
    "tokenizer": ("IndexConfig", "tokenizer"),
    "vocab_size": ("IndexConfig", "vocab_size"),
    "cache_dir": ("IndexConfig", "cache_dir"),
    "num_proc": ("IndexConfig", "num_proc"),
    "store_tokens": ("IndexConfig", "store_tokens"),
    "max_documents": ("IndexConfig", "max_documents"),
    "add_bos": ("IndexConfig", "add_bos"),
    "add_eos": ("IndexConfig", "add_eos"),
    "loss_policy": ("IndexConfig", "loss_policy"),
    "completion_column": ("IndexConfig", "completion_column"),
    "kind": ("LayoutConfig", "kind"),
    "seq_len": ("LayoutConfig", "seq_len"),
    "layout_seed": ("LayoutConfig", "seed"),
    "window_docs": ("LayoutConfig", "window_docs"),
    "overlong": ("LayoutConfig", "overlong"),
    "epoch_order": ("LayoutConfig", "epoch_order"),  # and Plan.epoch_ids, which follows it (plan_from_args)
    # a media index's layout reads --seq-len, --layout-seed, --window-docs and --overlong too (media_layout_config)
    "max_patches": ("MediaLayoutConfig", "max_patches"),
    "seed": ("Plan", "seed"),
    "global_batch_size": ("Plan", "global_batch_size"),
    "micro_batch_size": ("Plan", "micro_batch_size"),
    "world_size": ("Plan", "world_size"),
    "batch_size_schedule": ("Plan", "batch_size_schedule"),
    "skip_steps": ("Plan", "skip_steps"),
    "redactions": ("Plan", "redactions"),
    "mapping_version": ("Plan", "mapping_version"),
    "balance": ("Plan", "balance"),  # --balance: a Balance over the command's layout, costed by the three below
    "balance_attention": ("CostModel", "attention"),
    "balance_linear": ("CostModel", "linear"),
    "balance_fixed": ("CostModel", "fixed"),
    "mixture_data": ("MixtureConfig", "sources"),
    "mixture_weights": ("MixtureConfig", "weights"),
    "mixture_schedule": ("MixtureConfig", "schedule"),
    "mixture_seed": ("MixtureConfig", "seed"),
    "mixture_names": ("MixtureConfig", "names"),
}


# -- option value parsers
# --------------------------------------------------------------------------------------------------


def _int_pairs(text: str, expected: str) -> list[tuple[int, int]]:
    """``text`` as comma-separated ``X:Y`` integer pairs (empty parts ignored); else an error saying ``expected``."""
    try:
        rows = [tuple(int(x) for x in part.split(":")) for part in text.split(",") if part.strip()]
    except ValueError:
        rows = []
    if not rows or any(len(r) != 2 for r in rows):
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
    return rows  # type: ignore[return-value]


def _schedule(text: str) -> list[tuple[int, int]]:
    return _int_pairs(text, "FIRST_STEP:SIZE[,FIRST_STEP:SIZE...], e.g. 0:8,100:16")


def _skip_ranges(text: str) -> list[tuple[int, int]]:
    """``FIRST..LAST[,FIRST..LAST...]``: inclusive ranges, spelled with ``..`` as the commands print them, never with
    the ``:`` of ``--steps A:B`` (which stops before B)."""
    expected = "FIRST..LAST[,FIRST..LAST...] (inclusive data steps), e.g. 100..199"
    parts = [part for part in text.split(",") if part.strip()]
    if any(":" in part for part in parts):
        raise argparse.ArgumentTypeError(
            f"expected {expected}, got {text!r}: skip ranges include LAST, so they are written FIRST..LAST (A:B, as in"
            " --steps, stops before B)"
        )
    try:
        return _int_pairs(",".join(part.replace("..", ":", 1) for part in parts), expected)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None


def _redaction(text: str) -> list:
    """``[SOURCE:]FROM_STEP:DOC[,DOC...]``: the documents (of mixture source SOURCE, a name or an index) redacted from
    training step FROM_STEP on, as ``[from_step, docs]`` or ``[from_step, docs, SOURCE]`` (the source resolved by
    :func:`resolve_redaction_sources`)."""
    expected = (
        "[SOURCE:]FROM_STEP:DOC[,DOC...] (document ids, masked from training step FROM_STEP on; over a mixture the"
        " source's name or index first), e.g. 40:4,10 or code:40:4,10"
    )
    parts = text.split(":")
    if len(parts) not in (2, 3) or not all(p.strip() for p in parts):
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
    *source, step, docs = parts
    try:
        entry = [int(step), [int(d) for d in docs.split(",") if d.strip()]]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
    if not entry[1]:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
    return entry + [source[0].strip()] if source else entry


def resolve_redaction_sources(entries: Any, labels: Sequence[str] | None) -> list | None:
    """``--redact`` entries with their source names turned into source indexes: ``labels`` are the mixture's source
    names (None: one index, whose entries name no source; a mixture's entries each name one)."""
    if not entries:
        return None
    out = []
    for entry in entries:
        if len(entry) == 2 or not isinstance(entry[2], str):
            if labels is not None and len(entry) == 2:
                raise ValueError(
                    f"--redact {entry[0]}:{','.join(map(str, entry[1]))}: over a mixture, name the documents' source"
                    f" first (SOURCE:FROM_STEP:DOCS, SOURCE one of {list(labels)} or an index)"
                )
            out.append(list(entry))
            continue
        if labels is None:
            raise ValueError(f"--redact {entry[2]}:...: a source is for a mixture (--mixture-data), this is one index")
        name = entry[2]
        if name in labels:
            k = list(labels).index(name)
        elif name.isdigit() and int(name) < len(labels):
            k = int(name)
        else:
            raise ValueError(f"--redact {name}:...: no source {name!r}: the mixture's sources are {list(labels)}")
        out.append([entry[0], entry[1], k])
    return out


def mapping_version(text: str) -> int:
    """A mapping version, given as a number or as a checkpoint that records one: a checkpoint directory holding
    ``data_fingerprint.json``, that file, or any JSON file holding a ``Plan.fingerprint()`` (under ``plan`` or not)."""
    if text.strip().isdigit():
        version = int(text)
    else:
        path = Path(text)
        path = path / "data_fingerprint.json" if path.is_dir() else path
        try:
            found = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise argparse.ArgumentTypeError(
                f"expected a mapping version or a checkpoint recording one, got {text!r} ({exc})"
            ) from None
        for key in ("data_fingerprint", "plan"):
            found = found.get(key, found) if isinstance(found, dict) else found
        version = found.get("mapping_version") if isinstance(found, dict) else None
        if not isinstance(version, int):
            raise argparse.ArgumentTypeError(
                f"{path} records no mapping version (expected a checkpoint's data_fingerprint.json)"
            )
    if version not in MAPPING_VERSIONS:
        raise argparse.ArgumentTypeError(
            f"mapping version must be one of {MAPPING_VERSIONS}, got {version} (from {text!r})"
        )
    return version


def step_range(text: str) -> tuple[int, int]:
    """``A:B`` with ``0 <= A < B``: the steps ``A .. B-1``."""
    try:
        a, b = (int(x) for x in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected A:B (steps A .. B-1), got {text!r}") from None
    if a < 0 or b <= a:
        raise argparse.ArgumentTypeError(f"expected 0 <= A < B, got {text!r}")
    return a, b


def _csv(text: str) -> list[str]:
    items = [x.strip() for x in text.split(",")]
    if not text.strip() or not all(items):
        raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {text!r}")
    return items


def _weights_entry(text: str) -> tuple[int, list[str]]:
    step, sep, weights = text.partition(":")
    try:
        first = int(step)
    except ValueError:
        first = -1
    if not sep or first < 1 or not weights.strip():
        raise argparse.ArgumentTypeError(
            f"expected FIRST_STEP:W,W,... with FIRST_STEP >= 1, e.g. 5000:0.4,0.2,0.4, got {text!r}"
        )
    return first, _csv(weights)


# -- option groups
# ---------------------------------------------------------------------------------------------------------


def add_mixture_options(p: argparse.ArgumentParser) -> None:
    """The MixtureConfig options."""
    g = p.add_argument_group("mixture (MixtureConfig)")
    g.add_argument(
        "--mixture-data",
        type=_csv,
        default=None,
        metavar="PATH,PATH,...",
        help="MixtureConfig.sources: draw from a mixture of these corpora (each indexed like --data) instead of --data",
    )
    g.add_argument(
        "--mixture-weights",
        type=_csv,
        default=None,
        metavar="W,W,...",
        help="MixtureConfig.weights: one weight per source from step 0 (numbers or fractions such as 1/3)",
    )
    g.add_argument(
        "--mixture-schedule",
        type=_weights_entry,
        action="append",
        default=None,
        metavar="STEP:W,W,...",
        help="MixtureConfig.schedule: weights from data step STEP on (repeat the option for more entries)",
    )
    g.add_argument(
        "--mixture-seed",
        type=int,
        default=0,
        help="MixtureConfig.seed: interleaving and source shuffles (default: %(default)s)",
    )
    g.add_argument(
        "--mixture-names",
        type=_csv,
        default=None,
        metavar="NAME,NAME,...",
        help="MixtureConfig.names: labels of the sources in reports (default: their paths)",
    )


def add_index_options(p: argparse.ArgumentParser) -> None:
    """The IndexConfig options, defaulting to IndexConfig's defaults."""
    from detsampler.index.prepare import IndexConfig

    d = IndexConfig()
    g = p.add_argument_group("index (IndexConfig)")
    g.add_argument(
        "--data",
        default=d.data,
        metavar="PATH",
        help=(
            "corpus: a text/json/jsonl/parquet file, a directory of them, a save_to_disk directory, or a "
            "pre-tokenized source KIND:PATH (megatron:PREFIX, olmo:FILE.npy, datatrove:FILE.ds, "
            "nanogpt:train.bin) (default: the running interpreter's standard library sources)"
        ),
    )
    g.add_argument("--text-column", default=d.text_column, help="column holding the documents (default: %(default)s)")
    g.add_argument(
        "--tokenizer",
        default=d.tokenizer,
        metavar="PATH",
        help=(
            "sentencepiece .model file, Hugging Face tokenizer.json, or transformers tokenizer directory "
            "(default: train a BPE model of --vocab-size pieces on the corpus once, cached)"
        ),
    )
    g.add_argument(
        "--vocab-size",
        type=int,
        default=d.vocab_size,
        help="vocabulary of the default tokenizer (default: %(default)s)",
    )
    g.add_argument(
        "--cache-dir",
        default=d.cache_dir,
        metavar="DIR",
        help="where tokenizers and indexes are cached (default: $DETSAMPLER_CACHE or ./.cache/detsampler)",
    )
    g.add_argument(
        "--num-proc", type=int, default=d.num_proc, help="tokenizer processes for a build (default: %(default)s)"
    )
    g.add_argument(
        "--store-tokens",
        action=argparse.BooleanOptionalAction,
        default=d.store_tokens,
        help="store the tokens (default), or only counts and offsets, tokenizing samples on the fly",
    )
    g.add_argument(
        "--max-documents", type=int, default=d.max_documents, metavar="N", help="use only the first N documents"
    )
    g.add_argument(
        "--add-bos",
        action=argparse.BooleanOptionalAction,
        default=d.add_bos,
        help="store the tokenizer's BOS before each document (default: no)",
    )
    g.add_argument(
        "--add-eos",
        choices=("virtual", "real"),
        default=d.add_eos,
        help=(
            "the EOS after each document: virtual (read, never stored; the default for text) or real (stored; "
            "the default for a pre-tokenized source, read as stored)"
        ),
    )
    g.add_argument(
        "--loss-policy",
        choices=CHAT_POLICIES,
        default=d.loss_policy,
        help=(
            "chat data: --text-column holds each example's messages (rendered with the --tokenizer directory's chat"
            " template), or with --completion-column its prompt; the tokens trained: assistant turns, the last_turn,"
            " the completion, or all; a loss mask is stored beside the tokens (default: plain text)"
        ),
    )
    g.add_argument(
        "--completion-column",
        default=d.completion_column,
        help="chat data as prompt/completion columns: the completion's column (--text-column is the prompt's)",
    )


def add_layout_options(p: argparse.ArgumentParser) -> None:
    """The LayoutConfig options, defaulting to LayoutConfig's defaults."""
    d = LayoutConfig()
    g = p.add_argument_group("layout (LayoutConfig)")
    g.add_argument(
        "--kind", choices=LAYOUT_KINDS, default=d.kind, help="how documents are cut into samples (default: %(default)s)"
    )
    g.add_argument("--seq-len", type=int, default=d.seq_len, help="input tokens per sample (default: %(default)s)")
    g.add_argument(
        "--layout-seed", type=int, default=d.seed, help="LayoutConfig.seed: the document order (default: %(default)s)"
    )
    g.add_argument(
        "--window-docs",
        type=int,
        default=d.window_docs,
        help="bestfit: documents packed together (default: %(default)s)",
    )
    g.add_argument(
        "--overlong",
        choices=OVERLONG_POLICIES,
        default=d.overlong,
        help="bestfit: a document longer than --seq-len positions is split into pieces, truncated or dropped"
        " (default: %(default)s)",
    )
    g.add_argument(
        "--max-patches",
        type=int,
        default=MediaLayoutConfig().max_patches,
        metavar="N",
        help="a media index (images beside text): at most N vision patches per sample, the second axis its samples"
        " are packed on (default: %(default)s)",
    )
    g.add_argument(
        "--epoch-order",
        action=argparse.BooleanOptionalAction,
        default=d.epoch_order,
        help="concat, document: a new document order each epoch (keyed by --layout-seed and the epoch), so sample"
        " boundaries move from epoch to epoch; sample ids then carry their epoch (default: one order for the run)",
    )


def add_plan_options(p: argparse.ArgumentParser) -> None:
    """The Plan options (all but ``num_samples``, which is the layout's or the mixture's)."""
    g = p.add_argument_group("plan (Plan)")
    g.add_argument("--seed", type=int, default=0, help="Plan.seed: the per-epoch shuffle (default: %(default)s)")
    g.add_argument(
        "--global-batch-size", type=int, default=8, help="samples per step, all ranks (default: %(default)s)"
    )
    g.add_argument(
        "--micro-batch-size", type=int, default=2, help="samples per rank per micro step (default: %(default)s)"
    )
    g.add_argument("--world-size", type=int, default=1, help="data-parallel ranks (default: %(default)s)")
    g.add_argument(
        "--batch-size-schedule",
        type=_schedule,
        default=None,
        metavar="S:B[,S:B...]",
        help="global batch size ramp: FIRST_STEP:SIZE pairs from step 0; the last SIZE must equal --global-batch-size",
    )
    g.add_argument(
        "--skip-steps",
        type=_skip_ranges,
        default=None,
        metavar="A..B[,A..B...]",
        help=(
            "data steps A..B (inclusive: A through B) never trained on: training step s reads the s-th data step"
            " outside them"
        ),
    )
    g.add_argument(
        "--redact",
        dest="redactions",
        type=_redaction,
        action="append",
        default=None,
        metavar="[SOURCE:]S:DOC[,DOC...]",
        help=(
            "Plan.redactions: mask the labels of these documents from training step S on (repeat for other steps); no"
            " sample moves. Over a mixture, the documents' source (name or index) first. stats and verify print what"
            " each trained before S"
        ),
    )
    g.add_argument(
        "--mapping-version",
        type=mapping_version,
        default=None,
        metavar="V|CHECKPOINT",
        help=(
            "Plan.mapping_version: the sample orders of this version, or of the version a checkpoint directory "
            f"(or its data_fingerprint.json) records (default: the current one, {MAPPING_VERSION}, or"
            f" {BALANCED_MAPPING_VERSION} with --balance)"
        ),
    )
    g.add_argument(
        "--balance",
        action="store_true",
        default=False,
        help=(
            "Plan.balance: deal each step's samples to (rank, micro step) by their modeled cost, attention masked per"
            " document (mapping version 3): the same samples per step, every rank's cost near the mean"
        ),
    )
    for name, what in (
        ("attention", "per squared token of each document span"),
        ("linear", "per token"),
        ("fixed", "per sample"),
    ):
        g.add_argument(
            f"--balance-{name}",
            type=float,
            default=None,
            metavar="X",
            help=f"CostModel.{name}: the cost {what} (default: {getattr(CostModel(), name)!r}); needs --balance",
        )


# -- parsed options -> dataclasses
# -----------------------------------------------------------------------------------------


def index_config(args: argparse.Namespace) -> IndexConfig:
    """The IndexConfig of the parsed options (one option per field)."""
    from detsampler.index.prepare import IndexConfig

    return IndexConfig(**{f.name: getattr(args, f.name) for f in fields(IndexConfig)})


def layout_config(args: argparse.Namespace, kind: str | None = None) -> LayoutConfig:
    """The LayoutConfig of the parsed options, with ``kind`` in place of ``--kind`` when given."""
    return LayoutConfig(
        kind=kind or args.kind,
        seq_len=args.seq_len,
        seed=args.layout_seed,
        window_docs=args.window_docs,
        # NOTE: a command that goes through every kind (stats) applies --overlong to bestfit, the kind it shapes
        overlong="split" if kind not in (None, "bestfit") else args.overlong,
        # NOTE: likewise --epoch-order applies to the kinds it shapes (concat, document); given with --kind bestfit it
        # is refused (LayoutConfig)
        epoch_order=bool(getattr(args, "epoch_order", False)) and kind in (None, "concat", "document"),
    )


def balance_from_args(args: argparse.Namespace, layout: Any) -> Balance | None:
    """``--balance`` and its cost model over ``layout`` (the layout, or a mixture built over its sources' layouts), or
    None."""
    given = {name: getattr(args, f"balance_{name}", None) for name in ("attention", "linear", "fixed")}
    given = {name: value for name, value in given.items() if value is not None}
    if not getattr(args, "balance", False):
        if given:
            raise ValueError(f"--balance-{next(iter(given))} needs --balance (it is the balanced plan's cost model)")
        return None
    return Balance(layout, CostModel(**given))


def is_media(index: Any) -> bool:
    """Whether ``index`` is a media index (images beside text: its layout packs on two axes)."""
    from detsampler.media.index import MediaIndex

    return isinstance(index, MediaIndex)


def media_layout_config(args: argparse.Namespace, kinds: Sequence[str] | None = None) -> MediaLayoutConfig:
    """The :class:`~detsampler.media.layout.MediaLayoutConfig` of the layout options: ``--seq-len``, ``--max-patches``,
    ``--layout-seed``, ``--window-docs``, ``--overlong`` (split or drop). A layout kind other than bestfit given
    explicitly (``--kind``, or ``kinds``: ``stats --kinds``) is refused: a media index has one layout, best fit on two
    axes."""
    explicit = getattr(args, "explicit", ())
    if kinds is not None and "kinds" in explicit and list(kinds) != ["bestfit"]:
        raise ValueError(
            f"--kinds {','.join(kinds)}: a media index is packed on two axes (best fit of LLM tokens and vision"
            " patches): drop --kinds, or pass --kinds bestfit"
        )
    if "kind" in explicit and args.kind != "bestfit":
        raise ValueError(
            f"--kind {args.kind}: a media index is packed on two axes (best fit of LLM tokens and vision patches):"
            " drop --kind, or pass --kind bestfit"
        )
    if args.overlong not in OVERLONG_MEDIA:
        raise ValueError(
            f"--overlong {args.overlong}: a media index cuts a document only between images; allowed are"
            f" {', '.join(OVERLONG_MEDIA)}"
        )
    return MediaLayoutConfig(seq_len=args.seq_len, max_patches=args.max_patches, seed=args.layout_seed,
                             window_docs=args.window_docs, overlong=args.overlong)  # fmt: skip


def layout_for(index: Any, args: argparse.Namespace, kind: str | None = None) -> Any:
    """The layout of the layout options over ``index``: a media index's two-axis layout (:func:`media_layout_config`),
    else the :class:`LayoutConfig` of :func:`layout_config` (``kind`` in place of ``--kind`` when given)."""
    if is_media(index):
        return index.layout(media_layout_config(args))
    return index.layout(layout_config(args, kind))


def plan_from_args(
    args: argparse.Namespace,
    num_samples: int | None = None,
    source: Mixture | None = None,
    epoch_ids: bool | None = None,
    layout: Any = None,
    *,
    documents: Sequence[int],
) -> Plan:
    """The Plan of the parsed options over ``num_samples`` (a layout's sample count) or ``source`` (a mixture).
    ``epoch_ids``: whether the layout has ``epoch_order`` (None: as ``--epoch-order`` says); ``layout``: the layout of
    ``num_samples``, whose spans a ``--balance`` plan costs (a mixture's: ``source``, built over its layouts).
    ``documents``: the document count of the index (of each mixture source): a ``--redact`` of a document past it is
    refused."""
    if epoch_ids is None:
        epoch_ids = bool(getattr(args, "epoch_order", False)) and source is None
    plan = _plan_from_args(args, num_samples, source, epoch_ids, layout)
    try:  # NOTE: show and where read such a redaction as masking nothing (exit 0); verify refused it mid-report
        check_redacted_documents(plan.redactions, documents)
    except ValueError as exc:
        raise ValueError(f"--redact: {exc}") from None
    return plan


def _plan_from_args(
    args: argparse.Namespace, num_samples: int | None, source: Mixture | None, epoch_ids: bool, layout: Any
) -> Plan:
    return Plan(
        num_samples,
        source=source,
        seed=args.seed,
        global_batch_size=args.global_batch_size,
        micro_batch_size=args.micro_batch_size,
        world_size=args.world_size,
        batch_size_schedule=args.batch_size_schedule,
        skip_steps=args.skip_steps,
        mapping_version=args.mapping_version,
        redactions=resolve_redaction_sources(
            getattr(args, "redactions", None), None if source is None else mixture_config(args).labels
        ),
        # NOTE: the sample ids carry their epoch exactly when the layout reorders documents each epoch; a mixture
        # qualifies its own epoch_order sources' ids
        epoch_ids=epoch_ids,
        balance=balance_from_args(args, layout if layout is not None else source),
    )


def mixture_config(args: argparse.Namespace) -> MixtureConfig | None:
    """The mixture options as a MixtureConfig, or None without --mixture-data."""
    if args.mixture_data is None:
        for dest in ("mixture_weights", "mixture_schedule", "mixture_names"):
            if getattr(args, dest) is not None:
                raise ValueError(f"--{dest.replace('_', '-')} needs --mixture-data (the sources of the mixture)")
        return None
    if args.data is not None:
        raise ValueError("give either --data (one corpus) or --mixture-data (a mixture), not both")
    if args.mixture_weights is None:
        raise ValueError("--mixture-data needs --mixture-weights, one weight per source")
    return MixtureConfig(
        sources=args.mixture_data,
        weights=args.mixture_weights,
        schedule=args.mixture_schedule or (),
        seed=args.mixture_seed,
        names=args.mixture_names,
    )
