"""Building a token index: validate, then (once per cache entry) tokenize into a temporary directory and rename it into
place.

Invariants: an index directory exists under its final name only once complete (written to a temporary directory, every
file fsynced, ``meta.json`` last, then renamed into place), so a build killed at any moment leaves nothing that opens.
One process builds, the others wait and open: a file lock on the cache entry serializes builders across processes, ranks
and jobs. There is no collective: ranks on nodes without a shared filesystem each build their own copy (one per node),
and a build longer than a process group's timeout times nothing out. torch is never imported here.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from detsampler.atomic import atomic_write, fsync_dir, removable_lock
from detsampler.checks import check_positive_int
from detsampler.index.checksums import write_checksums
from detsampler.index.files import HEADER_BYTES, npy_header, save_npy
from detsampler.index.format import (
    INDEX_FORMAT_VERSION,
    INDEX_KIND,
    dataset_fingerprint,
    default_cache_dir,
    index_cache_key,
    seal_meta,
    token_dtype,
)
from detsampler.index.reader import TokenIndex
from detsampler.index.tokenize import tokenize
from detsampler.text.policy import SpecialTokens
from detsampler.text.protocol import TokenizerLike, check_tokenizer_like
from detsampler.version import __version__

__all__ = ["build_index"]

logger = logging.getLogger("detsampler")


def _write_tokens(
    tmp: Path,
    dataset: Any,
    tokenizer: TokenizerLike,
    text_column: str,
    num_proc: int,
    dtype: np.dtype,
    store_tokens: bool,
    progress: bool,
    policy: SpecialTokens,
) -> tuple[np.ndarray, int]:
    """Tokenize ``dataset``, streaming the tokens to ``tmp/tokens.npy`` (with ``store_tokens``; its header written last,
    the file fsynced); returns the documents' lengths and the number of tokens."""
    lengths_parts: list[np.ndarray] = []
    num_tokens = 0
    tokens_file = open(tmp / "tokens.npy", "wb") if store_tokens else None
    try:
        if tokens_file is not None:
            tokens_file.write(b"\0" * HEADER_BYTES)
        for lengths, flat in tokenize(dataset, tokenizer, text_column, num_proc, dtype, progress, policy):
            lengths_parts.append(lengths)
            num_tokens += int(flat.size)
            if tokens_file is not None:
                tokens_file.write(flat.tobytes())
        if tokens_file is not None:
            tokens_file.seek(0)
            tokens_file.write(npy_header(dtype, num_tokens))
            tokens_file.flush()
            os.fsync(tokens_file.fileno())
    finally:
        if tokens_file is not None:
            tokens_file.close()
    lengths = np.concatenate(lengths_parts) if lengths_parts else np.zeros(0, np.int64)
    return lengths, num_tokens


def _write_meta(tmp: Path, meta: dict) -> None:
    """``tmp/meta.json``, written (to a temporary name, fsynced, renamed) after every other file: a directory without it
    never opens."""
    atomic_write(tmp / "meta.json", json.dumps(meta, indent=2, sort_keys=True) + "\n")


def _write_index(
    tmp: Path,
    dataset: Any,
    tokenizer: TokenizerLike,
    text_column: str,
    num_proc: int,
    store_tokens: bool,
    progress: bool,
    key: str,
    policy: SpecialTokens,
) -> dict:
    """Write the complete index of ``dataset`` into the directory ``tmp``; returns its meta."""
    dtype = token_dtype(tokenizer.vocab_size)
    start = time.perf_counter()
    lengths, num_tokens = _write_tokens(
        tmp, dataset, tokenizer, text_column, num_proc, dtype, store_tokens, progress, policy
    )
    seconds = time.perf_counter() - start
    if lengths.size != len(dataset):  # pragma: no cover - guards the batching
        raise RuntimeError(f"tokenized {lengths.size} documents of {len(dataset)}")
    offsets = np.zeros(lengths.size + 1, dtype=np.int64)
    np.cumsum(lengths + int(policy.eos_stored), out=offsets[1:])  # a real EOS is stored after each document
    save_npy(tmp / "lengths.npy", lengths)
    save_npy(tmp / "offsets.npy", offsets)
    names = ["lengths.npy", "offsets.npy"] + (["tokens.npy"] if store_tokens else [])
    files = {name: write_checksums(tmp, name) for name in names}
    meta = {
        "kind": INDEX_KIND,
        "format_version": INDEX_FORMAT_VERSION,
        "detsampler_version": __version__,
        "cache_key": key,
        "dataset_fingerprint": dataset_fingerprint(dataset),
        "dataset_num_rows": len(dataset),
        "text_column": text_column,
        "store_tokens": store_tokens,
        "tokenizer": tokenizer.describe(),
        "special_tokens": policy.to_meta(),
        "token_dtype": dtype.name,
        "num_documents": int(lengths.size),
        "num_tokens": int(num_tokens),
        "files": files,
        "build": {
            "seconds": round(seconds, 3),
            "tokens_per_second": round(num_tokens / max(seconds, 1e-9)),
            "num_proc": num_proc,
        },
    }
    _write_meta(tmp, seal_meta(meta))
    if progress:
        logger.info(
            "detsampler: tokenized %d documents, %d tokens in %.2f s (%s tokens/s, num_proc=%d)",
            lengths.size,
            num_tokens,
            seconds,
            f"{num_tokens / max(seconds, 1e-9):,.0f}",
            num_proc,
        )
    return meta


def _check_build_args(dataset: Any, tokenizer: TokenizerLike, text_column: str, num_proc: int) -> None:
    """Raise a ValueError naming the parameter unless the text column exists, ``num_proc >= 1`` and ``tokenizer`` is
    one."""
    from detsampler.text.corpus import check_text_column

    check_text_column(dataset, text_column)
    check_positive_int(num_proc, "num_proc")
    check_tokenizer_like(tokenizer)


def build_index(
    dataset: Any,
    tokenizer: TokenizerLike,
    text_column: str = "text",
    cache_dir: str | os.PathLike | None = None,
    num_proc: int = 1,
    store_tokens: bool = True,
    progress: bool = True,
    special_tokens: SpecialTokens | None = None,
) -> TokenIndex:
    """Open the cached index of ``dataset`` under ``tokenizer``, building it first if it does not
    exist.

    One process builds, the others wait and open: a file lock on the cache entry serializes builders across processes,
    ranks and jobs (no collective, see the module doc).

    Args:
        dataset: a ``datasets.Dataset`` (its fingerprint names the cache entry).
        tokenizer: the tokenizer that encodes ``dataset[text_column]``: any
            :class:`~detsampler.text.protocol.TokenizerLike` (sentencepiece, ``tokenizer.json``, transformers).
        text_column: the column holding each document's text.
        cache_dir: where index directories live (default :func:`~detsampler.index.format.default_cache_dir`).
        num_proc: tokenizer processes.
        store_tokens: store the tokens (else only their counts: tokens are made on the fly).
        progress: show a progress bar and a summary line on stderr.
        special_tokens: the BOS/EOS policy (default: no BOS, a virtual EOS), recorded in the meta and the cache key.

    Returns:
        The opened :class:`~detsampler.index.reader.TokenIndex`, checked against ``dataset`` and ``tokenizer``.
    """
    _check_build_args(dataset, tokenizer, text_column, num_proc)
    policy = SpecialTokens() if special_tokens is None else special_tokens
    policy.check(tokenizer)
    key = index_cache_key(dataset, tokenizer, text_column, store_tokens, policy)
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"index-{key}"
    if (
        final / "meta.json"
    ).is_file():  # complete by construction (renamed into place): no lock, a read-only cache works
        return TokenIndex.open(final, dataset=dataset, tokenizer=tokenizer)
    return _build_locked(root, final, key, dataset, tokenizer, text_column, num_proc, store_tokens, progress, policy)


def _build_locked(
    root: Path,
    final: Path,
    key: str,
    dataset: Any,
    tokenizer: TokenizerLike,
    text_column: str,
    num_proc: int,
    store_tokens: bool,
    progress: bool,
    policy: SpecialTokens,
) -> TokenIndex:
    if (final / "meta.json").is_file():  # complete: open without the lock
        return TokenIndex.open(final, dataset=dataset, tokenizer=tokenizer)
    with removable_lock(root / f"index-{key}.lock"):  # removed when released: a refused build leaves no file
        if final.exists():
            return TokenIndex.open(final, dataset=dataset, tokenizer=tokenizer)
        for stale in root.glob(f".tmp-index-{key}-*"):  # left by killed builders; we hold the lock
            shutil.rmtree(stale, ignore_errors=True)
        tmp = root / f".tmp-index-{key}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        try:
            _write_index(tmp, dataset, tokenizer, text_column, num_proc, store_tokens, progress, key, policy)
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        fsync_dir(root)
    return TokenIndex.open(final, dataset=dataset, tokenizer=tokenizer)
