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
    CHAT_FORMAT_VERSION,
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
from detsampler.text.chat import ChatConfig, resolve_template, with_tools
from detsampler.text.policy import SpecialTokens
from detsampler.text.protocol import TokenizerLike, check_tokenizer_like
from detsampler.version import __version__

__all__ = ["build_index", "build_key"]

logger = logging.getLogger("detsampler")


class _NpyStream:
    """An ``.npy`` file written in pieces: a blank header first, the real one (its length now known) last; fsynced."""

    def __init__(self, path: Path, dtype: np.dtype) -> None:
        self.file, self.dtype, self.size = open(path, "wb"), np.dtype(dtype), 0
        self.file.write(b"\0" * HEADER_BYTES)

    def write(self, values: np.ndarray) -> None:
        self.file.write(np.ascontiguousarray(values, dtype=self.dtype).tobytes())
        self.size += int(values.size)

    def close(self, complete: bool) -> None:
        if complete:
            self.file.seek(0)
            self.file.write(npy_header(self.dtype, self.size))
            self.file.flush()
            os.fsync(self.file.fileno())
        self.file.close()


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
    chat: ChatConfig | None = None,
    template: str | None = None,
) -> tuple[np.ndarray, int, int]:
    """Tokenize ``dataset``, streaming the tokens to ``tmp/tokens.npy`` (with ``store_tokens``; its header written last,
    the file fsynced) and, for chat data, their loss mask to ``tmp/loss_mask.npy``; returns the documents' lengths,
    the number of tokens and the number of trained (mask 1) tokens."""
    lengths_parts: list[np.ndarray] = []
    num_tokens = num_trained = 0
    streams = {}
    if store_tokens:
        streams["tokens"] = _NpyStream(tmp / "tokens.npy", dtype)
        if chat is not None:
            streams["mask"] = _NpyStream(tmp / "loss_mask.npy", np.dtype(np.uint8))
    complete = False
    try:
        for lengths, flat, mask in tokenize(
            dataset, tokenizer, text_column, num_proc, dtype, progress, policy, chat, template
        ):
            lengths_parts.append(lengths)
            num_tokens += int(flat.size)
            if mask is not None:
                num_trained += int(np.count_nonzero(mask))
            if "tokens" in streams:
                streams["tokens"].write(flat)
            if "mask" in streams:
                streams["mask"].write(mask)
        complete = True
    finally:
        for stream in streams.values():
            stream.close(complete)
    lengths = np.concatenate(lengths_parts) if lengths_parts else np.zeros(0, np.int64)
    return lengths, num_tokens, num_trained


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
    chat: ChatConfig | None = None,
    template: str | None = None,
) -> dict:
    """Write the complete index of ``dataset`` into the directory ``tmp``; returns its meta."""
    dtype = token_dtype(tokenizer.vocab_size)
    start = time.perf_counter()
    lengths, num_tokens, num_trained = _write_tokens(
        tmp, dataset, tokenizer, text_column, num_proc, dtype, store_tokens, progress, policy, chat, template
    )
    seconds = time.perf_counter() - start
    if lengths.size != len(dataset):  # pragma: no cover - guards the batching
        raise RuntimeError(f"tokenized {lengths.size} documents of {len(dataset)}")
    offsets = np.zeros(lengths.size + 1, dtype=np.int64)
    np.cumsum(lengths + int(policy.eos_stored), out=offsets[1:])  # a real EOS is stored after each document
    save_npy(tmp / "lengths.npy", lengths)
    save_npy(tmp / "offsets.npy", offsets)
    names = ["lengths.npy", "offsets.npy"] + (["tokens.npy"] if store_tokens else [])
    names += ["loss_mask.npy"] if store_tokens and chat is not None else []
    files = {name: write_checksums(tmp, name) for name in names}
    meta = {
        "kind": INDEX_KIND,
        "format_version": INDEX_FORMAT_VERSION if chat is None else CHAT_FORMAT_VERSION,
        "detsampler_version": __version__,
        "cache_key": key,
        "dataset_fingerprint": dataset_fingerprint(dataset),
        "dataset_num_rows": len(dataset),
        "text_column": text_column,
        "store_tokens": store_tokens,
        "tokenizer": tokenizer.describe(),
        "special_tokens": policy.to_meta(),
        **({} if chat is None else {"chat": {**chat.to_meta(template), "num_trained_tokens": num_trained}}),
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


def _check_build_args(
    dataset: Any, tokenizer: TokenizerLike, text_column: str, num_proc: int, chat: ChatConfig | None
) -> None:
    """Raise a ValueError naming the parameter unless the text column (or the chat columns) exists, ``num_proc >= 1``
    and ``tokenizer`` is one."""
    from detsampler.text.corpus import check_text_column

    if chat is not None and not isinstance(chat, ChatConfig):
        raise TypeError(f"chat must be a ChatConfig or None, got {type(chat).__name__}")
    for column in [text_column] if chat is None else chat.columns:
        check_text_column(dataset, column)
    check_positive_int(num_proc, "num_proc")
    check_tokenizer_like(tokenizer)


def build_key(
    dataset: Any,
    tokenizer: TokenizerLike,
    text_column: str = "text",
    store_tokens: bool = True,
    special_tokens: SpecialTokens | None = None,
    chat: ChatConfig | None = None,
) -> str:
    """The cache key :func:`build_index` gives the index of these arguments (its directory is ``index-<key>``, on disk
    or in a bucket): chat data's template text and policy included."""
    chat = with_tools(chat, dataset)
    template, column = _rendered(chat, tokenizer, text_column)
    policy = SpecialTokens() if special_tokens is None else special_tokens
    return index_cache_key(dataset, tokenizer, column, store_tokens, policy, chat, template)


def _rendered(chat: ChatConfig | None, tokenizer: TokenizerLike, text_column: str) -> tuple[str | None, str]:
    """The chat template text chat data is rendered with (None: plain text) and the column the index reads."""
    return (None, text_column) if chat is None else (resolve_template(chat, tokenizer), chat.column)


def build_index(
    dataset: Any,
    tokenizer: TokenizerLike,
    text_column: str = "text",
    cache_dir: str | os.PathLike | None = None,
    num_proc: int = 1,
    store_tokens: bool = True,
    progress: bool = True,
    special_tokens: SpecialTokens | None = None,
    chat: ChatConfig | None = None,
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
        chat: chat or instruction data (:class:`~detsampler.text.chat.ChatConfig`): its columns are rendered (chat
            template, or prompt + completion) instead of ``text_column``, and a loss mask is stored beside the tokens
            (``loss_mask.npy``); its template text and policy are recorded in the meta and the cache key.

    Returns:
        The opened :class:`~detsampler.index.reader.TokenIndex`, checked against ``dataset`` and ``tokenizer``.
    """
    _check_build_args(dataset, tokenizer, text_column, num_proc, chat)
    chat = with_tools(chat, dataset)  # a tools column is rendered, as TRL renders it
    policy = SpecialTokens() if special_tokens is None else special_tokens
    policy.check(tokenizer)
    template, text_column = _rendered(chat, tokenizer, text_column)
    key = index_cache_key(dataset, tokenizer, text_column, store_tokens, policy, chat, template)
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"index-{key}"
    if (
        final / "meta.json"
    ).is_file():  # complete by construction (renamed into place): no lock, a read-only cache works
        return TokenIndex.open(final, dataset=dataset, tokenizer=tokenizer)
    args = (dataset, tokenizer, text_column, num_proc, store_tokens, progress, policy, chat, template)
    return _build_locked(root, final, key, *args)


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
    chat: ChatConfig | None,
    template: str | None,
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
            _write_index(
                tmp, dataset, tokenizer, text_column, num_proc, store_tokens, progress, key, policy, chat, template
            )
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        fsync_dir(root)
    return TokenIndex.open(final, dataset=dataset, tokenizer=tokenizer)
