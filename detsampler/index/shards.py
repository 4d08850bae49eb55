"""Building a sharded index: one shard per input file, built by independent tasks, and a cheap final manifest.

The input files of ``data`` (sorted, as :func:`~detsampler.text.corpus.load_corpus` reads a directory) are the shards:
shard ``j`` is file ``j``, tokenized into an ordinary index under ``<cache>/shards/`` (keyed by the file's content, so a
shard is reused by every sharded index that holds its file). Task ``i`` of ``n`` builds the shards ``j`` with
``j % n == i`` (a Slurm array task, a Kubernetes job index, a torchrun rank: no collective, no process group); each
finished shard leaves a claim ``<root>/claims/shard-<j>.json`` (written atomically after its index is complete).
:func:`finalize` checks every claim's index against its file's content (the content fingerprint the index was built
from), and writes the manifest; a missing,
stale or corrupt shard is named in the error. ``<root>`` is ``<cache>/sharded-<key>``, the key hashing the file list
(names and sizes), the tokenizer, the text column and the options: adding a file makes a new root whose old shards are
found built.

Pre-tokenized files (:data:`SOURCE_SUFFIXES`: Megatron ``.bin/.idx`` pairs, OLMo ``.npy``, datatrove ``.ds``, nanoGPT
``.bin``) are shards as they are: nothing is built, :func:`source_entries` opens each file (memory-mapped, never
copied) and gives its manifest entry, and :func:`finalize` lists them after the tokenized shards.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from filelock import FileLock

from detsampler.atomic import atomic_write
from detsampler.index.build import build_index
from detsampler.index.format import INDEX_FORMAT_VERSION, TokenIndexError
from detsampler.index.sharded import CLAIMS, MANIFEST, ShardedIndex, open_shards, write_manifest
from detsampler.text.policy import SpecialTokens
from detsampler.text.protocol import TokenizerLike

__all__ = [
    "SOURCE_SUFFIXES",
    "build_shards",
    "build_shards_ray",
    "complete",
    "finalize",
    "input_files",
    "shard_tasks",
    "sharded_root",
    "source_entries",
    "source_files",
]

# the file that names one shard of each pre-tokenized kind (a Megatron shard is the prefix of its .idx/.bin pair)
SOURCE_SUFFIXES = {"megatron": ".idx", "olmo": ".npy", "datatrove": ".ds", "nanogpt": ".bin"}


def input_files(data: str | os.PathLike) -> list[Path]:
    """The files of ``data`` (a file or a directory of text/json/jsonl/parquet files), sorted: shard ``j`` is file
    ``j``."""
    from detsampler.text.corpus import corpus_files
    from detsampler.text.file_kinds import EXTENSIONS

    p = Path(data)
    if not p.exists():
        raise ValueError(f"data: {str(p)!r} does not exist")
    files = corpus_files(p)
    if not files:
        raise ValueError(f"data: no {sorted(EXTENSIONS)} files under {str(p)!r}")
    return files


def source_files(kind: str, path: str | os.PathLike) -> list[Path]:
    """The shards of the pre-tokenized ``kind`` at ``path``: the file (a Megatron prefix) itself, or every such file
    under the directory ``path``, sorted."""
    if kind not in SOURCE_SUFFIXES:
        raise ValueError(f"source kind must be one of {', '.join(SOURCE_SUFFIXES)}, got {kind!r}")
    p = Path(path)
    if not p.is_dir():
        return [Path(str(p).removesuffix(".idx").removesuffix(".bin")) if kind == "megatron" else p]
    suffix = SOURCE_SUFFIXES[kind]
    found = sorted(f for f in p.rglob(f"*{suffix}") if f.is_file())
    if not found:
        raise ValueError(f"data: no {kind} {suffix} files under {str(p)!r}")
    return [f.with_suffix("") for f in found] if kind == "megatron" else found


def source_entries(root: Path, kind: str, paths: list[Path], **options: Any) -> list[dict[str, Any]]:
    """One manifest entry per pre-tokenized file of ``paths`` (opened with ``open_source(kind, path, **options)``,
    checked, nothing copied); a file that does not open is named in the error."""
    from detsampler.index.sources import open_source

    entries = []
    for p in paths:
        try:
            source = open_source(kind, p, **options)
        except (TokenIndexError, OSError, ValueError) as exc:
            raise TokenIndexError(f"{kind} shard {str(p)!r} cannot be opened: {exc}") from None
        entries.append(
            {
                "kind": kind,
                "path": os.path.relpath(p.resolve(), root.resolve()),
                "options": source.open_options,
                "fingerprint": source.fingerprint,
                "input": p.name,
                "num_documents": source.num_documents,
                "num_tokens": source.num_tokens,
            }
        )
    return entries


def sharded_root(
    cache_dir: str | os.PathLike,
    files: list[Path],
    tokenizer: TokenizerLike | None,
    text_column: str = "text",
    store_tokens: bool = True,
    special_tokens: SpecialTokens | None = None,
    sources: Sequence[tuple[str, Path]] = (),
) -> Path:
    """``<cache>/sharded-<key>``: the key hashes the files' names and sizes (text files and pre-tokenized ones, with
    their kinds), the tokenizer and the options."""
    fields: dict[str, Any] = {
        "format_version": INDEX_FORMAT_VERSION,
        "tokenizer": tokenizer.sha256 if tokenizer is not None else None,
        "text_column": text_column,
        "store_tokens": store_tokens,
        "files": [[f.name, f.stat().st_size] for f in files],
    }
    if special_tokens is not None and special_tokens != SpecialTokens():  # keeps the default's old keys
        fields["special_tokens"] = special_tokens.to_meta()
    if sources:
        fields["sources"] = [[kind, p.name, _size(kind, p)] for kind, p in sources]
    body = json.dumps(fields)
    return Path(cache_dir) / f"sharded-{hashlib.sha256(body.encode()).hexdigest()[:20]}"


def _size(kind: str, p: Path) -> int:
    files = [p.with_name(p.name + ".bin"), p.with_name(p.name + ".idx")] if kind == "megatron" else [p]
    return sum(f.stat().st_size for f in files if f.is_file())


def shard_tasks(num_files: int, task: int, num_tasks: int) -> list[int]:
    """The shards task ``task`` of ``num_tasks`` builds: ``task, task + num_tasks, ...``."""
    if not 0 <= task < num_tasks:
        raise ValueError(f"--shard must be in [0, {num_tasks}) for --num-shards {num_tasks}, got {task}")
    return list(range(task, num_files, num_tasks))


def _claim_path(root: Path, j: int) -> Path:
    return root / CLAIMS / f"shard-{j:05d}.json"


def _build_one(
    files: list[Path],
    tokenizer: TokenizerLike,
    root: Path,
    j: int,
    text_column: str,
    num_proc: int,
    store_tokens: bool,
    progress: bool,
    special_tokens: SpecialTokens | None,
) -> tuple[Path, dict[str, Any]]:
    """Build shard ``j`` (file ``j``) and write its claim; returns (the claim's path, the claim)."""
    from detsampler.text.corpus import load_corpus

    f = files[j]
    stat = f.stat()  # before the read: a file changed during the build makes its claim stale
    try:
        index = build_index(
            load_corpus(str(f), text_column, cache_dir=root.parent),  # its parse and hashes in the build's cache
            tokenizer,
            text_column=text_column,
            cache_dir=root.parent / "shards",
            num_proc=num_proc,
            store_tokens=store_tokens,
            progress=progress,
            special_tokens=special_tokens,
        )
    except (ValueError, TypeError) as exc:  # bad input: name the shard and its file (the index refused is not built)
        raise (TypeError if isinstance(exc, TypeError) else ValueError)(
            f"shard {j} of {len(files)} ({f}): {' '.join(str(exc).split())}"
        ) from None
    claim = {
        "shard": j,
        "input": str(f),
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        "path": os.path.relpath(index.path, root),
        "fingerprint": index.fingerprint,
        "num_documents": index.num_documents,
        "num_tokens": index.num_tokens,
    }
    atomic_write(_claim_path(root, j), json.dumps(claim, indent=2, sort_keys=True) + "\n")
    return _claim_path(root, j), claim


def build_shards(
    files: list[Path],
    tokenizer: TokenizerLike,
    root: Path,
    shards: list[int],
    text_column: str = "text",
    num_proc: int = 1,
    store_tokens: bool = True,
    progress: bool = True,
    special_tokens: SpecialTokens | None = None,
) -> list[Path]:
    """Build shards ``shards`` (indices into ``files``) and claim each; returns the claims written. With ``num_proc``
    > 1 and several shards, ``num_proc`` processes build whole shards at once (a shard's parse, hashing, tokenization
    and writes all in one of them: nothing of a shard build stays serial); one shard is tokenized by ``num_proc``."""
    (root / CLAIMS).mkdir(parents=True, exist_ok=True)
    args = (text_column, 1 if len(shards) > 1 else num_proc, store_tokens)
    if num_proc == 1 or len(shards) == 1:
        done = (_build_one(files, tokenizer, root, j, *args, progress, special_tokens) for j in shards)
        return [_report(path, claim, len(files), progress) for path, claim in done]
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_all_start_methods, get_context

    ctx = get_context("fork") if "fork" in get_all_start_methods() else None  # as the tokenizer pool does
    with ProcessPoolExecutor(min(num_proc, len(shards)), mp_context=ctx) as pool:
        futures = [pool.submit(_build_one, files, tokenizer, root, j, *args, False, special_tokens) for j in shards]
        return [_report(*future.result(), len(files), progress) for future in futures]


def _report(path: Path, claim: dict[str, Any], num_files: int, progress: bool) -> Path:
    if progress:
        print(
            f"detsampler: shard {claim['shard']} of {num_files} ({Path(claim['input']).name}): "
            f"{claim['num_documents']} documents, {claim['num_tokens']} tokens",
            file=sys.stderr,
        )
    return path


def complete(root: Path, num_files: int) -> bool:
    """Whether every shard of ``num_files`` has its claim (so that :func:`finalize` can write the manifest)."""
    return all(_claim_path(root, j).is_file() for j in range(num_files))


def build_shards_ray(
    files: list[Path],
    tokenizer: TokenizerLike,
    root: Path,
    shards: list[int],
    text_column: str = "text",
    num_proc: int = 1,
    store_tokens: bool = True,
    special_tokens: SpecialTokens | None = None,
) -> list[int]:
    """:func:`build_shards` as one Ray task per shard on the Ray cluster this process is attached to (``ray.init()``
    first, or ``$RAY_ADDRESS``; else a local instance is started). Ray schedules; nothing here does."""
    try:
        import ray
    except ImportError:
        raise ValueError("--engine ray needs Ray: pip install 'detsampler[ray]'") from None
    if not ray.is_initialized():
        ray.init()
    model = tokenizer.path

    @ray.remote(num_cpus=num_proc)
    def build_one(j: int) -> int:
        from detsampler.text.load import load_tokenizer

        build_shards(
            files, load_tokenizer(model), root, [j], text_column, num_proc, store_tokens, False, special_tokens
        )
        return j

    return ray.get([build_one.remote(j) for j in shards])


def _entry(root: Path, files: list[Path], j: int) -> dict[str, Any]:
    """Shard ``j``'s manifest entry, from its claim, checked against its file and its index."""
    f = files[j]
    try:
        claim = json.loads(_claim_path(root, j).read_text())
    except (OSError, ValueError):
        raise TokenIndexError(
            f"shard {j} ({f}) is missing (never built, or its build did not finish): run the task that "
            f"builds it (task {j} % N of --num-shards N) again"
        ) from None
    from detsampler.index.reader import TokenIndex
    from detsampler.text.corpus import _local_files
    from detsampler.text.fingerprint import content_fingerprint

    try:
        index = TokenIndex.open(root / claim["path"])
    except TokenIndexError as exc:
        raise TokenIndexError(f"shard {j} ({f}) is corrupt: {exc}") from None
    # content decides, never path, size or mtime: the per-file hash cache is keyed by the file's stat with its ctime,
    # so an unchanged file hashes nothing, and an edit (its mtime restored or not) or a copy is hashed again
    content = content_fingerprint(f, [f], _local_files(f)[0], root.parent).digest
    if content != index.meta.get("dataset_fingerprint"):
        raise TokenIndexError(
            f"shard {j} ({f}) is stale: its content changed since its shard was built (content {content}, the shard "
            f"was built from {index.meta.get('dataset_fingerprint')}); build it again"
        )
    if index.fingerprint != claim.get("fingerprint"):
        raise TokenIndexError(f"shard {j} ({f}) is not the index its claim names; build it again")
    return {
        "kind": "detsampler",
        "path": claim["path"],
        "fingerprint": index.fingerprint,
        "input": f.name,
        "num_documents": index.num_documents,
        "num_tokens": index.num_tokens,
    }


def finalize(
    root: Path,
    files: list[Path],
    tokenizer: TokenizerLike | None = None,
    sources: Sequence[dict[str, Any]] = (),
) -> ShardedIndex:
    """Write the manifest of ``root`` once every shard is complete (under a file lock; cheap: it reads the claims and
    each shard's meta) and open the sharded index. ``sources``: the pre-tokenized shards' entries
    (:func:`source_entries`), listed after the tokenized ones. Raises naming the first missing, stale or corrupt
    shard, or the first that cannot be mixed with the others."""
    root.mkdir(parents=True, exist_ok=True)
    with FileLock(str(root / f"{MANIFEST}.lock")):
        entries = [_entry(root, files, j) for j in range(len(files))] + list(sources)
        if not entries:
            raise ValueError("a sharded index needs at least one shard (no input files, no sources)")
        if _listed(root) != json.loads(json.dumps(entries)):  # new, or a shard rebuilt since (a file edited in place)
            open_shards(root, entries)  # they open and read alike, or no manifest is written
            write_manifest(root, entries, tokenizer.describe() if tokenizer is not None else None)
    return ShardedIndex.open(root)


def _listed(root: Path) -> list | None:
    """The shards the manifest at ``root`` lists (None without a readable one)."""
    try:
        return json.loads((root / MANIFEST).read_text()).get("shards")
    except (OSError, ValueError, AttributeError):
        return None
