"""The ``detsampler`` argument parser: the subcommands and their options.

Invariant: show, verify, stats and where take every option of :data:`detsampler.cli.options.OPTION_FIELDS`; build
takes the index options.
"""

from __future__ import annotations

import argparse
import re
from typing import Any

from detsampler.cli.options import (
    add_index_options,
    add_layout_options,
    add_mixture_options,
    add_plan_options,
    step_range,
)
from detsampler.layout import LAYOUT_KINDS

__all__ = ["build_parser", "explicit_options", "join_negative_values", "non_negative_int"]


def non_negative_int(text: str) -> int:
    """An argparse ``type``: ``text`` as an integer >= 0, else an ``ArgumentTypeError`` naming it."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {value}")
    return value


def _add_plan_inputs(p: argparse.ArgumentParser) -> None:
    """``--checkpoint``, and every option of OPTION_FIELDS: what a plan over an index (or a mixture) is computed
    from."""
    p.add_argument(
        "--checkpoint",
        default=None,
        metavar="PATH",
        help=(
            "audit what a checkpoint trained on: its data record gives the index(es), layout, plan, mapping version,"
            " skip ranges and batch schedule, so none is re-typed (an option given that contradicts it is refused;"
            " --world-size and --micro-batch-size may cut the plan another way). PATH: a checkpoint directory holding"
            " detsampler_data.json (the trainer's step_NNNNNNNN, a Hugging Face checkpoint-N), a trainer run"
            " directory (its newest complete checkpoint) or Hugging Face output_dir (its newest checkpoint-N), a"
            " Lightning .ckpt file, or a torchtitan DCP checkpoint directory"
        ),
    )
    add_index_options(p)
    add_layout_options(p)
    add_plan_options(p)
    add_mixture_options(p)


def _add_tokenizer_command(sub: Any) -> argparse.ArgumentParser:
    """``detsampler tokenizer train``."""
    tok = sub.add_parser("tokenizer", help="tokenizer tools", description="Tokenizer tools.")
    tok_sub = tok.add_subparsers(dest="tokenizer_command", required=True, metavar="ACTION")
    train = tok_sub.add_parser(
        "train",
        help="train a BPE tokenizer (sentencepiece or Hugging Face)",
        description=(
            "Train a BPE tokenizer locally. --kind sentencepiece (default): a .model file (byte fallback, identity"
            " normalization, '\\n' a piece; unk 0, bos 1, eos 2, pad 3). --kind hf-bpe: a Hugging Face byte-level BPE"
            " tokenizer.json and tokenizer_config.json in the directory --out (<|endoftext|> 0 = EOS, <|begin_of_text|>"
            " 1 = BOS, <|pad|> 2)."
        ),
    )
    train.add_argument(
        "--kind",
        choices=("sentencepiece", "hf-bpe"),
        default="sentencepiece",
        help="the tokenizer to train (default: %(default)s)",
    )
    train.add_argument(
        "--input",
        nargs="+",
        required=True,
        metavar="FILES_OR_DIR",
        help=(
            "files or directories (read recursively): of json/jsonl/parquet files (compressed or not), the"
            " --text-column of each record; of any other file, its whole text"
        ),
    )
    train.add_argument(
        "--text-column",
        default="text",
        metavar="NAME",
        help="the column of json/jsonl/parquet records to train on (default: %(default)s)",
    )
    train.add_argument("--vocab-size", type=int, required=True, metavar="N", help="number of pieces (>= 300)")
    train.add_argument(
        "--out",
        required=True,
        metavar="PATH",
        help="where to write the .model file (sentencepiece) or the tokenizer directory (hf-bpe)",
    )
    return train


def _add_build_command(sub: Any) -> argparse.ArgumentParser:
    """``detsampler build``: the index options, and how to print."""
    build = sub.add_parser(
        "build",
        help="build (or open) the index and print its summary",
        description="Build the token index of the corpus (or open the cached one) and print its summary.",
    )
    add_index_options(build)
    build.add_argument(
        "--from",
        nargs=2,
        dest="source",
        default=None,
        metavar=("KIND", "PATH"),
        help=(
            "open a pre-tokenized corpus instead of building: KIND megatron (PATH = the .bin/.idx prefix), "
            "olmo (a .npy token file), datatrove (a .ds file), nanogpt (a train.bin); same as --data KIND:PATH"
        ),
    )
    build.add_argument("--verify-tokens", action="store_true", help="also check the token file's sha256 when opening")
    build.add_argument("--json", action="store_true", help="print the summary as JSON")
    add_layout_options(build)
    build.add_argument(
        "--layout",
        action="store_true",
        help="also build the persisted layout of --kind/--seq-len/... beside the index (once per corpus)",
    )
    sharded = build.add_argument_group(
        "sharded index (one shard per input file of --data, tokenized with --tokenizer; pre-tokenized files of "
        "--data KIND:PATH or --from KIND PATH, a file or a directory of them, are shards as they are)"
    )
    sharded.add_argument(
        "--shard",
        default=None,
        metavar="I|auto",
        help="build only the shards I, I+N, I+2N, ... (auto: I = $RANK, N = $WORLD_SIZE, as torchrun sets)",
    )
    sharded.add_argument(
        "--num-shards", type=int, default=None, metavar="N", help="the number of tasks N (with --shard I)"
    )
    sharded.add_argument(
        "--finalize",
        action="store_true",
        help="write (or check) the manifest once every shard is built (the last --shard task to finish writes it too)",
    )
    sharded.add_argument(
        "--sharded",
        action="store_true",
        help="build every shard here (--num-proc N: N shards at once), then the manifest",
    )
    sharded.add_argument(
        "--engine",
        choices=("local", "ray"),
        default="local",
        help="--sharded: build the shards here, one after the other (local), or one Ray task each (ray)",
    )
    return build


def _add_erase_command(sub: Any) -> argparse.ArgumentParser:
    from detsampler.cli.erase import document_ids

    erase = sub.add_parser(
        "erase",
        help="overwrite documents' stored tokens in place (a legal erasure), every sample kept in place",
        description=(
            "Overwrite the stored tokens (and loss mask) of the documents --doc names with the index's pad id, in"
            " place, locally or in a bucket: every length, hence every sample and step, is kept, only the touched"
            " chunks' checksums are recomputed, and an erasure record is appended to the index's identity, so a run"
            " resumes across it and never trains on those documents again. Then reads the bytes back to prove them"
            " gone (exit 1 when not)."
        ),
    )
    erase.add_argument("index", metavar="INDEX", help="a built index directory (index-<key>) or its bucket URL")
    erase.add_argument(
        "--doc", type=document_ids, action="append", required=True, metavar="ID[,ID...]", help="documents to erase"
    )
    erase.add_argument("--json", action="store_true", help="print the erasure and its proof as JSON")
    return erase


def _add_push_command(sub: Any) -> argparse.ArgumentParser:
    push = sub.add_parser(
        "push",
        help="upload a built index and its layouts to an object store (s3://, gs://, az://, https://)",
        description=(
            "Upload the index directory DIR (and the layouts persisted beside it) to URL: every object first, each"
            " sealed record after the objects it seals, the index's meta.json last, so a reader never sees a"
            " half-uploaded index. Credentials and endpoint come from the environment (AWS_*, AWS_ENDPOINT_URL, ...)."
        ),
    )
    push.add_argument("directory", metavar="DIR", help="a built index directory (index-<key>, holding meta.json)")
    push.add_argument("url", metavar="URL", help="where to upload it, e.g. s3://bucket/prefix/index-<key>")
    return push


def _one_value_options(parser: argparse.ArgumentParser) -> set[str]:
    """The option strings of ``parser`` and its subcommands that take exactly one value."""
    found: set[str] = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found |= _one_value_options(sub)
        elif action.option_strings and action.nargs is None:
            found.update(action.option_strings)
    return found


def join_negative_values(argv: list[str]) -> list[str]:
    """``argv`` with each option that takes one value and is followed by a negative-looking value (``--steps -1:5``,
    ``--mixture-weights -1,2``) written as ``--option=value``, so that argparse passes the value to the option's check
    (which names what is wrong) instead of taking it for an option ("expected one argument")."""
    takes_one = _one_value_options(build_parser())
    out: list[str] = []
    i = 0
    while i < len(argv):
        if argv[i] in takes_one and i + 1 < len(argv) and re.match(r"-[\d.]", argv[i + 1]):
            out.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
            continue
        if argv[i] == "--":
            out.extend(argv[i:])
            break
        out.append(argv[i])
        i += 1
    return out


def explicit_options(argv: list[str]) -> set[str]:
    """The dests of the options ``argv`` gives explicitly (a default is never among them, even when the value typed is
    the default): parsed again with every default suppressed."""
    parser = build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                for inner in sub._actions:
                    if isinstance(inner, argparse._SubParsersAction):
                        for leaf in inner.choices.values():
                            _suppress(leaf)
                _suppress(sub)
    return set(vars(parser.parse_args(argv))) - {"command", "tokenizer_command", "help"}


def _suppress(parser: argparse.ArgumentParser) -> None:
    for action in parser._actions:
        if action.dest != "help" and not isinstance(action, argparse._SubParsersAction):
            action.default = argparse.SUPPRESS


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``detsampler COMMAND [options]``."""
    parser = argparse.ArgumentParser(
        prog="detsampler",
        description="Deterministic, resumable LLM data loading: build a token index and inspect the plan over it.",
        epilog=(
            "Every option maps onto one field of IndexConfig, LayoutConfig or Plan; `detsampler COMMAND --help` lists"
            " them."
        ),
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    train = _add_tokenizer_command(sub)
    build = _add_build_command(sub)

    show = sub.add_parser(
        "show",
        help="what a rank reads at a step: documents, token offsets, optionally text",
        description=(
            "Which documents and token offsets each rank reads at a step (and micro step), "
            "with the decoded text on --decode: the tool for explaining a loss spike at step S."
        ),
    )
    _add_plan_inputs(show)
    show.add_argument(
        "--step",
        type=non_negative_int,
        default=None,
        help="the training step (required without --checkpoint; with it, default: the checkpoint's last trained step)",
    )
    show.add_argument("--rank", type=int, default=None, help="one data-parallel rank (default: all)")
    show.add_argument("--micro-step", type=int, default=None, help="one micro step of the step (default: all)")
    show.add_argument("--decode", action="store_true", help="print each span's decoded text")
    show.add_argument(
        "--max-chars",
        type=non_negative_int,
        default=160,
        help="--decode: characters of text per span (default: %(default)s, 0 = all)",
    )

    verify = sub.add_parser(
        "verify",
        help="check a range of steps across all ranks: no duplicates, no gaps",
        description=(
            "Recompute the plan for steps A..B-1 on every rank and micro step and check that the "
            "micro batches partition each step, no sample repeats within an epoch, and every "
            "epoch the range covers completely reads every sample; print epoch coverage."
        ),
    )
    _add_plan_inputs(verify)
    verify.add_argument(
        "--steps",
        type=step_range,
        default=None,
        metavar="A:B",
        help="steps A .. B-1 (required without --checkpoint; with it, default: every step it trained, 0:STEP)",
    )
    verify.add_argument(
        "--tokens",
        action="store_true",
        help="also check every chunk checksum and the sha256 of each index file (reads them all)",
    )
    verify.add_argument(
        "--against",
        default=None,
        metavar="CHECKPOINT",
        help=(
            "with --checkpoint: an older checkpoint of the run (any form --checkpoint takes); print the data changes"
            " between the two records, the resume rule's verdict at its step, and whether every step reads the"
            " samples its plan reads (fails when the change reaches before its step)"
        ),
    )

    where = sub.add_parser(
        "where",
        help="which steps, micro steps, ranks and rows read a document (the reverse of show)",
        description=(
            "Every (step, micro step, rank, row) of steps A..B-1 that reads the document, with the token span it reads"
            " and where the span sits in the row; computed by inverting the layout, the epoch permutations and the"
            " plan, without a scan over the steps."
        ),
    )
    _add_plan_inputs(where)
    where.add_argument("--doc", type=non_negative_int, default=None, help="the document id (in its index)")
    where.add_argument(
        "--path", default=None, help="the document whose path (a corpus of files) is PATH, or ends with /PATH"
    )
    where.add_argument(
        "--sha256",
        default=None,
        metavar="HEX",
        help="the document whose content has this sha256 (64 hex digits: of its UTF-8 text, or of a chat row's"
        " canonical JSON; detsampler.content.content_hash): what a contamination audit starts from",
    )
    where.add_argument(
        "--id-column",
        default=None,
        metavar="COLUMN",
        help="with --id: the dataset's column that holds the ids (a conversation_id, a ticket number)",
    )
    where.add_argument(
        "--id",
        default=None,
        metavar="ID",
        help="the document whose --id-column value is ID (a string, or an integer column's number)",
    )
    where.add_argument(
        "--source", default=None, help="a mixture: the source the document belongs to (its name or number)"
    )
    where.add_argument(
        "--steps",
        type=step_range,
        default=None,
        metavar="A:B",
        help="steps A .. B-1 (required without --checkpoint; with it, default: every step it trained, 0:STEP)",
    )
    where.add_argument("--json", action="store_true", help="print the reads as JSON")

    stats = sub.add_parser(
        "stats",
        help="documents, tokens, samples per epoch per layout, padding, epochs at a step",
        description=(
            "Corpus and index counts, and per layout kind: samples per epoch, padding fraction, "
            "dropped tokens, steps per epoch and the epoch reached at --step."
        ),
    )
    _add_plan_inputs(stats)
    stats.add_argument(
        "--step",
        type=non_negative_int,
        default=None,
        help=(
            "report the epoch reached at this step, and the tokens trained and skipped before it (with --checkpoint,"
            " default: the checkpoint's step)"
        ),
    )
    stats.add_argument("--kinds", default=",".join(LAYOUT_KINDS), help="layout kinds to report (default: %(default)s)")
    stats.add_argument(
        "--filter-steps",
        type=step_range,
        default=None,
        metavar="A:B",
        help=(
            "count the samples and loss tokens the instance filter masks over steps A .. B-1 (a full read of those"
            " steps' tokens)"
        ),
    )
    stats.add_argument(
        "--instance-filter",
        default="",
        metavar="K=V,...",
        help=(
            "the repetition filter of --filter-steps: max_period, min_period, max_count (default: OLMo-core's,"
            " 13, 1, 32)"
        ),
    )
    stats.add_argument("--json", action="store_true", help="print the stats as JSON")
    push = _add_push_command(sub)
    erase = _add_erase_command(sub)
    for command in (train, build, show, verify, stats, where, push, erase):
        command.add_argument(
            "--quiet",
            action="store_true",
            help="print no progress bars and no log lines, only the result and errors (bars are off anyway when"
            " stderr is not a terminal)",
        )
    return parser
