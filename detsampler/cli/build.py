"""``detsampler tokenizer train`` and ``detsampler build``: make the tokenizer and the index, and
print what was made."""

from __future__ import annotations

import argparse
from collections import Counter
from typing import Any

from detsampler.cli.inputs import prepare, show_progress, verify_files
from detsampler.cli.options import is_media, layout_config
from detsampler.cli.report import fmt_int, fmt_loss_mask, print_json, print_rows, rel

__all__ = ["cmd_build", "cmd_tokenizer_train"]


def cmd_tokenizer_train(args: argparse.Namespace) -> int:
    """Train a sentencepiece model or a Hugging Face BPE tokenizer.json and print its path, sha256 and special ids."""
    from detsampler.text.tokenizer import read_training_texts

    if args.kind == "hf-bpe" and args.out.lower().endswith(".json"):
        raise ValueError(
            "tokenizer train: --kind hf-bpe writes a directory (tokenizer.json and tokenizer_config.json in it), got"
            f" --out {args.out!r}, a .json file name: pass the directory to write"
        )
    texts = read_training_texts(args.input, args.text_column)
    if args.kind == "hf-bpe":
        from detsampler.text.hf import train_hf_bpe

        tok = train_hf_bpe(texts, args.vocab_size, args.out)
    else:
        from detsampler.text.tokenizer import train_tokenizer

        tok = train_tokenizer(None, args.vocab_size, args.out, texts=texts)
    print_rows(
        [
            ("model", tok.path),
            ("sha256", tok.sha256),
            ("vocab_size", tok.vocab_size),
            ("eos_id", tok.eos_id),
            ("bos_id", tok.bos_id),
            ("pad_id", tok.pad_id),
        ]
    )
    return 0


def _push_layout(prepared: Any, config: Any, num_proc: int) -> None:
    """An index in an object store (``--cache-dir s3://...``) whose local build is staged in the local cache: build the
    layout beside that copy and push it (the objects first, ``layout.json`` last; the index's seal is unchanged)."""
    from detsampler.index.push import push_index
    from detsampler.index.reader import TokenIndex
    from detsampler.storage import RemotePath

    index = prepared.index
    if not isinstance(index.path, RemotePath) or not isinstance(index, TokenIndex):
        return
    staged = prepared.config.cache_path / index.path.name
    if (staged / "meta.json").is_file():
        TokenIndex.open(staged).layout(config, num_proc=num_proc, progress=show_progress())
        push_index(staged, str(index.path))


def _tokenizer_named(summary: dict, index: Any) -> str:
    """The summary's tokenizer: the one loaded, else (a built index given as --data, no --tokenizer) the one the index
    records, said to be unchecked."""
    if summary["tokenizer_path"] is not None:
        return rel(summary["tokenizer_path"])
    recorded = (getattr(index, "meta", None) or {}).get("tokenizer", {}).get("path")
    return f"{rel(recorded) if recorded else '?'} (recorded by the index, not loaded: --tokenizer checks it)"


def cmd_build(args: argparse.Namespace) -> int:
    """Build (or open the cached) index and print its summary, as text or ``--json``; or a sharded index's shards and
    manifest (``--shard``, ``--finalize``, ``--sharded``)."""
    _refuse_ignored(args)
    if args.layout:  # NOTE: checked before anything is built or printed (a sharded build printed its shards first)
        layout_config(args)
    if args.shard is not None or args.finalize or args.sharded:
        from detsampler.cli.shards import cmd_build_sharded

        return cmd_build_sharded(args)
    if args.source is not None:
        if args.data is not None:
            raise ValueError("give either --data or --from KIND PATH, not both")
        args.data = f"{args.source[0]}:{args.source[1]}"
    prepared = prepare(args)
    audit = verify_files(prepared.index).line() if args.verify_tokens else None  # a full read, before any output
    if args.layout and is_media(prepared.index):
        raise ValueError(
            "--layout: a media index's two-axis layout is packed in RAM when it is opened (show, where, verify, stats"
            " --max-patches N); nothing is persisted"
        )
    summary = {}
    if args.layout:
        _push_layout(prepared, layout_config(args), args.num_proc)
        layout = prepared.index.layout(layout_config(args), num_proc=args.num_proc, progress=show_progress())
        print_rows([("layout", rel(str(layout.path))), ("samples", fmt_int(layout.num_samples))])  # stderr if --json
        summary["layout"] = {"path": str(layout.path), "num_samples": int(layout.num_samples)}
    summary = {**prepared.index.summary(), **summary}
    if audit is not None:
        summary["verified"] = audit
        if not args.json:
            print(audit)
    if "source_kind" in summary:
        return _print_source(summary, args.json)
    if "num_images" in summary:
        return _print_media(summary, args.json)
    summary["tokenizer_path"] = None if prepared.tokenizer is None else prepared.tokenizer.path
    if "num_shards" in summary:
        return _print_sharded(summary, prepared.index.meta["shards"], args.json)
    if args.json:
        print_json(summary, indent=2, sort_keys=True)
        return 0
    build = summary["build"]
    print_rows(
        [
            ("index", rel(summary["path"])),
            ("documents", fmt_int(summary["num_documents"])),
            (
                "tokens",
                f"{fmt_int(summary['num_tokens'])}"
                + (
                    f" (+{fmt_int(summary['num_documents'])} EOS)"
                    if summary["tokens_with_eos"] > summary["num_tokens"]
                    else ""
                ),
            ),
            (
                "special tokens",
                f"add_bos={summary['special_tokens']['add_bos']}, add_eos={summary['special_tokens']['add_eos']}",
            ),
            (
                "token dtype",
                summary["token_dtype"] + ("" if summary["store_tokens"] else " (not stored: tokenized on the fly)"),
            ),
            ("text column", summary["text_column"]),
            *([("loss mask", fmt_loss_mask(summary["loss_mask"]))] if "loss_mask" in summary else []),
            ("dataset fingerprint", summary["dataset_fingerprint"]),
            (
                "tokenizer",
                (
                    f"{_tokenizer_named(summary, prepared.index)} (sha256 {summary['tokenizer_sha256'][:16]}..., vocab"
                    f" {summary['vocab_size']}, eos {summary['eos_id']}, pad {summary['pad_id']})"
                ),
            ),
            ("index fingerprint", summary["fingerprint"]),
            (
                "built in",
                (
                    f"{build.get('seconds')} s, {fmt_int(int(build.get('tokens_per_second', 0)))} tokens/s, "
                    f"num_proc={build.get('num_proc')}"
                ),
            ),
        ]
    )
    return 0


_LAYOUT_OPTIONS = {
    "kind": "--kind",
    "seq_len": "--seq-len",
    "layout_seed": "--layout-seed",
    "window_docs": "--window-docs",
    "overlong": "--overlong",
    "epoch_order": "--epoch-order",
}


def _refuse_ignored(args: argparse.Namespace) -> None:
    """A ValueError for an option given without the partner that uses it (it would be ignored), or an unknown
    ``--from`` kind."""
    from detsampler.index.sources import SOURCE_KINDS

    explicit = getattr(args, "explicit", set())
    layout = [flag for dest, flag in _LAYOUT_OPTIONS.items() if dest in explicit]
    if layout and not args.layout:
        verb = "shapes" if len(layout) == 1 else "shape"
        raise ValueError(
            f"{', '.join(layout)} {verb} the layout that only --layout builds: add --layout, or leave "
            f"{'it' if len(layout) == 1 else 'them'} out"
        )
    if "num_shards" in explicit and (args.shard is None or args.shard == "auto"):
        raise ValueError(
            "--num-shards counts the tasks of --shard I: add --shard I, or leave it out (--shard auto reads"
            " $WORLD_SIZE; --sharded builds every shard)"
        )
    if "engine" in explicit and not args.sharded:
        raise ValueError("--engine chooses how --sharded builds its shards: add --sharded, or leave it out")
    if args.source is not None and args.source[0] not in SOURCE_KINDS:
        raise ValueError(f"--from: unknown kind {args.source[0]!r}; kinds are {', '.join(SOURCE_KINDS)}")


def _print_sharded(summary: dict, entries: list[dict], as_json: bool) -> int:
    """A finalized sharded index's summary: what its manifest holds (nothing was built)."""
    if as_json:
        print_json(summary, indent=2, sort_keys=True)
        return 0
    kinds = Counter(entry["kind"] for entry in entries)
    tokenizer = summary["tokenizer_path"]
    print_rows(
        [
            ("sharded index", rel(summary["path"])),
            ("shards", f"{summary['num_shards']} ({', '.join(f'{k} {n}' for k, n in sorted(kinds.items()))})"),
            ("documents", fmt_int(summary["num_documents"])),
            ("tokens", fmt_int(summary["num_tokens"])),
            ("eos / pad", f"{summary['eos_id']} / {summary['pad_id']}"),
            ("tokenizer", rel(tokenizer) if tokenizer else "none given (every shard is a pre-tokenized file)"),
            ("fingerprint", summary["fingerprint"]),
        ]
    )
    return 0


def _print_media(summary: dict, as_json: bool) -> int:
    """A media index's summary: what was opened (built by :func:`detsampler.media.build.build_media_index`)."""
    if as_json:
        print_json(summary, indent=2, sort_keys=True)
        return 0
    counts = ", ".join(f"{k}={v}" for k, v in summary["counts"].items() if k not in ("family", "version"))
    print_rows(
        [
            ("media index", rel(summary["path"])),
            ("documents", f"{fmt_int(summary['num_documents'])} ({summary['skipped_documents']} left out at build)"),
            ("tokens", f"{fmt_int(summary['num_tokens'])} (image tokens expanded; +{summary['num_documents']} EOS)"),
            ("images", fmt_int(summary["num_images"])),
            ("counts", f"{summary['counts']['family']} v{summary['counts']['version']} ({counts})"),
            *([("chat", f"policy {summary['chat']['policy']}")] if "chat" in summary else []),
            ("fingerprint", summary["fingerprint"]),
        ]
    )
    return 0


def _print_source(summary: dict, as_json: bool) -> int:
    """A pre-tokenized source's summary: what was opened (nothing was built or copied)."""
    if as_json:
        print_json(summary, indent=2, sort_keys=True)
        return 0
    print_rows(
        [
            ("source", f"{summary['source_kind']} {rel(summary['path'])} (memory-mapped, not copied)"),
            ("documents", fmt_int(summary["num_documents"])),
            (
                "tokens",
                fmt_int(summary["num_tokens"])
                + ("" if summary["eos"] == "real" else f" (+{fmt_int(summary['num_documents'])} EOS)"),
            ),
            ("token dtype", summary["token_dtype"]),
            (
                "eos",
                f"{summary['eos']} (eos_id {summary['eos_id']}, pad_id {summary['pad_id']}, "
                f"vocab {summary['vocab_size']})",
            ),
            ("identity", summary["identity"][:16] + "..."),
            ("fingerprint", summary["fingerprint"]),
        ]
    )
    return 0
