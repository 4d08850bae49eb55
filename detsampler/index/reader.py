"""The token index reader: per-document token counts, their offsets and (optionally) the concatenated tokens, on disk.

Layout of an index directory (all arrays ``.npy``, opened memory-mapped with ``allow_pickle=False``)::

    lengths.npy   int64[num_documents]       tokens of document d (EOS not counted, not stored)
    offsets.npy   int64[num_documents + 1]   offsets[d] = sum(lengths[:d]); offsets[-1] = num_tokens
    tokens.npy    uint16|uint32[num_tokens]  document d is tokens[offsets[d] : offsets[d] + lengths[d]] (store_tokens only)
    meta.json     format version, dataset fingerprint, tokenizer sha256, options, counts, file sizes and sha256s
    layouts/      cached best-fit bin counts (one .npy per layout config and MAPPING_VERSION)

Invariants: an index directory exists under its final name only once complete (it is written to a temporary directory,
every file fsynced, ``meta.json`` last, then renamed into place), so a build killed at any moment leaves nothing that opens;
:meth:`TokenIndex.open` checks the format version, every file's size and shape, and the small files' checksums, so a
truncated or edited index is an error and never a wrong sample. Nothing an index holds is ever executed.

The build path lives in :mod:`detsampler.index.build` (``build_index``: atomic temporary-directory write, locking,
distributed build) and :mod:`detsampler.index.tokenize` (the tokenization pool); the format's identity in
:mod:`detsampler.index.format`. This module only reads.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from detsampler.atomic import atomic_write
from detsampler.index.files import npy_bytes, sha256_file
from detsampler.index.format import (
    INDEX_FORMAT_VERSION,
    INDEX_KIND,
    TokenIndexError,
    dataset_fingerprint,
    index_cache_key,
    token_dtype,
)
from detsampler.keys import stable_hash64
from detsampler.layout import Layout, LayoutConfig, make_layout
from detsampler.text.tokenizer import Tokenizer
from detsampler.version import MAPPING_VERSION

__all__ = ["TokenIndex"]


def _load_array(path: Path, name: str, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    try:
        empty = int(np.prod(shape)) == 0  # an empty array cannot be memory-mapped
        arr = np.load(path / name, mmap_mode=None if empty else "r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise TokenIndexError(f"index {str(path)!r}: {name} is not a readable .npy file ({exc}); delete the directory and rebuild") from None
    if arr.dtype != dtype or arr.shape != shape:
        raise TokenIndexError(
            f"index {str(path)!r}: {name} has dtype {arr.dtype} and shape {arr.shape}, meta.json says {np.dtype(dtype)} "
            f"and {shape}: the file was edited or replaced; delete the directory and rebuild"
        )
    return arr


def _read_meta(path: Path) -> dict:
    """``path/meta.json``, checked to be a detsampler token index of this format version."""
    meta_path = path / "meta.json"
    if not meta_path.is_file():
        raise TokenIndexError(
            f"no index at {str(path)!r} (no meta.json: never built, or the build was interrupted); build it with "
            "detsampler.index.build_index or `detsampler build`"
        )
    try:
        meta = json.loads(meta_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise TokenIndexError(f"index {str(path)!r}: meta.json is not valid JSON ({exc}); delete the directory and rebuild") from None
    if not isinstance(meta, dict) or meta.get("kind") != INDEX_KIND:
        raise TokenIndexError(f"{str(path)!r} is not a detsampler token index (meta.json kind is not {INDEX_KIND!r})")
    if meta.get("format_version") != INDEX_FORMAT_VERSION:
        raise TokenIndexError(
            f"index {str(path)!r} has format version {meta.get('format_version')!r}, this detsampler reads version "
            f"{INDEX_FORMAT_VERSION}; delete the directory and rebuild"
        )
    return meta


def _check_files(path: Path, files: Any, store: bool, verify_tokens: bool) -> None:
    """Every file ``meta.json`` lists has its recorded size; the small files (and with ``verify_tokens`` the tokens) their
    recorded sha256."""
    expected = ["lengths.npy", "offsets.npy"] + (["tokens.npy"] if store else [])
    for name in expected:
        if name not in files:
            raise TokenIndexError(f"index {str(path)!r}: meta.json does not list {name}; delete the directory and rebuild")
        f = path / name
        size = f.stat().st_size if f.is_file() else None
        if size != files[name]["size"]:
            raise TokenIndexError(
                f"index {str(path)!r}: {name} is {'missing' if size is None else f'{size} bytes'}, the index recorded "
                f"{files[name]['size']} bytes: the file was truncated, edited or removed; delete the directory and rebuild"
            )
    for name in ["lengths.npy", "offsets.npy"] + (["tokens.npy"] if store and verify_tokens else []):
        if sha256_file(path / name) != files[name]["sha256"]:
            raise TokenIndexError(f"index {str(path)!r}: {name}'s sha256 differs from the recorded one: the file was edited; delete the directory and rebuild")


class TokenIndex:
    """An opened index: ``lengths`` and ``offsets`` (int64 memory maps), ``tokens`` (memory map, or None), and ``meta``.

    Document ``d``'s tokens are ``tokens[offsets[d] : offsets[d] + lengths[d]]``; its EOS (``eos_id``) is virtual, at
    position ``lengths[d]``. Pickles as its path (workers reopen the memory maps; nothing is copied).
    """

    def __init__(self, path: Path, meta: dict, lengths: np.ndarray, offsets: np.ndarray, tokens: np.ndarray | None) -> None:
        self.path = Path(path)
        self.meta = meta
        self.lengths = lengths
        self.offsets = offsets
        self.tokens = tokens

    # -- properties
    @property
    def num_documents(self) -> int:
        return int(self.meta["num_documents"])

    @property
    def num_tokens(self) -> int:
        """Stored tokens (EOS not counted)."""
        return int(self.meta["num_tokens"])

    @property
    def vocab_size(self) -> int:
        return int(self.meta["tokenizer"]["vocab_size"])

    @property
    def eos_id(self) -> int:
        return int(self.meta["tokenizer"]["eos_id"])

    @property
    def pad_id(self) -> int:
        return int(self.meta["tokenizer"]["pad_id"])

    @property
    def store_tokens(self) -> bool:
        return bool(self.meta["store_tokens"])

    @property
    def text_column(self) -> str:
        return str(self.meta["text_column"])

    @property
    def fingerprint(self) -> str:
        """Identifies the index's content: a hash of the dataset fingerprint, tokenizer sha256 and options."""
        return str(self.meta["cache_key"])

    def __repr__(self) -> str:
        return f"TokenIndex({str(self.path)!r}, num_documents={self.num_documents}, num_tokens={self.num_tokens})"

    def __reduce__(self):
        return (TokenIndex.open, (str(self.path),))

    # -- identity
    @staticmethod
    def cache_key(dataset: Any, tokenizer: Tokenizer, text_column: str = "text", store_tokens: bool = True) -> str:
        """The cache name's hash: the dataset fingerprint, the tokenizer's sha256, the options and the format version."""
        return index_cache_key(dataset, tokenizer, text_column, store_tokens)

    # -- open
    @classmethod
    def open(cls, path: str | os.PathLike, dataset: Any = None, tokenizer: Tokenizer | None = None, verify_tokens: bool = False) -> TokenIndex:
        """Open the index at ``path``, checking format version, file sizes, shapes and the small files' sha256.

        With ``dataset`` / ``tokenizer``, also check that they are the ones it was built from; ``verify_tokens`` also checks
        the token file's sha256 (reads it all). Every mismatch is an :class:`TokenIndexError` naming what differs.
        """
        path = Path(path)
        meta = _read_meta(path)
        try:
            n_docs, n_tok = int(meta["num_documents"]), int(meta["num_tokens"])
            files = meta["files"]
            store = bool(meta["store_tokens"])
            vocab = int(meta["tokenizer"]["vocab_size"])
        except (KeyError, TypeError, ValueError) as exc:
            raise TokenIndexError(f"index {str(path)!r}: meta.json lacks or mangles {exc}; delete the directory and rebuild") from None
        _check_files(path, files, store, verify_tokens)
        lengths = _load_array(path, "lengths.npy", np.dtype(np.int64), (n_docs,))
        offsets = _load_array(path, "offsets.npy", np.dtype(np.int64), (n_docs + 1,))
        tokens = _load_array(path, "tokens.npy", token_dtype(vocab), (n_tok,)) if store else None
        if offsets[0] != 0 or offsets[-1] != n_tok or (n_docs and lengths.min() < 0):
            raise TokenIndexError(f"index {str(path)!r}: offsets/lengths are inconsistent with {n_tok} tokens; delete and rebuild")
        index = cls(path, meta, lengths, offsets, tokens)
        if dataset is not None:
            index.check_dataset(dataset)
        if tokenizer is not None:
            index.check_tokenizer(tokenizer)
        return index

    def check_dataset(self, dataset: Any, text_column: str | None = None) -> None:
        """Raise unless ``dataset`` is the one this index was built from (fingerprint, number of rows, text column)."""
        fp = dataset_fingerprint(dataset)
        if fp != self.meta["dataset_fingerprint"] or len(dataset) != self.meta["dataset_num_rows"]:
            raise TokenIndexError(
                f"index {str(self.path)!r} was built from a dataset with fingerprint {self.meta['dataset_fingerprint']} and "
                f"{self.meta['dataset_num_rows']} rows, got fingerprint {fp} and {len(dataset)} rows: the dataset changed "
                "since the build; build the index again (build_index / `detsampler build`)"
            )
        if text_column is not None and text_column != self.text_column:
            raise TokenIndexError(f"index {str(self.path)!r} was built from column {self.text_column!r}, got text_column {text_column!r}")

    def check_tokenizer(self, tokenizer: Tokenizer) -> None:
        """Raise unless ``tokenizer`` is the model this index was built with (sha256)."""
        want = self.meta["tokenizer"]["sha256"]
        if tokenizer.sha256 != want:
            raise TokenIndexError(
                f"index {str(self.path)!r} was built with tokenizer sha256 {want[:16]}... "
                f"({self.meta['tokenizer'].get('path')}), got {tokenizer.sha256[:16]}... ({tokenizer.path}): the tokenizer "
                "changed since the build; pass the original model or build the index again"
            )

    # -- reading
    def document_tokens(self, doc: int) -> np.ndarray:
        """The stored tokens of document ``doc`` (without its EOS)."""
        if self.tokens is None:
            raise ValueError(f"index {str(self.path)!r} was built with store_tokens=False: it holds no tokens")
        if not 0 <= doc < self.num_documents:
            raise ValueError(f"Got document {doc}, allowed documents are in [0, {self.num_documents})")
        start = int(self.offsets[doc])
        return np.asarray(self.tokens[start : start + int(self.lengths[doc])])

    def layout(self, config: LayoutConfig) -> Layout:
        """The layout ``config`` over this index's documents; a best-fit layout's bin counts are cached in ``layouts/``.

        The cache file is keyed by the layout config and ``MAPPING_VERSION`` and written atomically; when it cannot be written
        (a read-only index) the layout is simply computed.
        """
        if config.kind != "bestfit":
            return make_layout(config, self.lengths)
        name = f"bestfit-{stable_hash64('bestfit-bins', MAPPING_VERSION, config.seq_len, config.seed, config.window_docs):016x}.npy"
        cached = self.path / "layouts" / name
        if cached.is_file():
            try:
                return make_layout(config, self.lengths, np.load(cached, allow_pickle=False))
            except (ValueError, OSError):
                pass  # a damaged cache file: recompute and rewrite it
        layout = make_layout(config, self.lengths)
        try:
            cached.parent.mkdir(exist_ok=True)
            atomic_write(cached, npy_bytes(layout.bins_per_window))
        except OSError:
            pass
        return layout

    def summary(self) -> dict:
        """Counts and identity, for ``detsampler build`` and logs."""
        return {
            "path": str(self.path),
            "num_documents": self.num_documents,
            "num_tokens": self.num_tokens,
            "tokens_with_eos": self.num_tokens + self.num_documents,
            "token_dtype": self.meta["token_dtype"],
            "store_tokens": self.store_tokens,
            "text_column": self.text_column,
            "dataset_fingerprint": self.meta["dataset_fingerprint"],
            "tokenizer_sha256": self.meta["tokenizer"]["sha256"],
            "vocab_size": self.vocab_size,
            "eos_id": self.eos_id,
            "pad_id": self.pad_id,
            "fingerprint": self.fingerprint,
            "build": self.meta.get("build", {}),
        }
