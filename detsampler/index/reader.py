"""The token index reader: per-document token counts, their offsets and (optionally) the concatenated tokens, on disk.

Layout of an index directory (all arrays ``.npy``, opened memory-mapped with ``allow_pickle=False``)::

    lengths.npy   int64[num_documents]       positions of document d before its EOS (a BOS counted, the EOS not)
                                             (format 3: int32 where its files record says so)
    offsets.npy   int64[num_documents + 1]   where document d's stored tokens start; offsets[-1] = num_tokens
                                             (format 3: absent when no tokens are stored; ``offsets`` is then None)
                                             (offsets[d + 1] - offsets[d] = lengths[d] + 1 when the EOS is real, else
                                             lengths[d])
    tokens.npy uint16|uint32[num_tokens] document d is tokens[offsets[d] : offsets[d] + lengths[d]] (store_tokens only)
    loss_mask.npy uint8[num_tokens]      format 4 (chat data, store_tokens): 1 where the token aligned with it is a
                                         trained target (see :mod:`detsampler.text.chat`); a virtual EOS is
                                         trained exactly under policies `all` and `completion`
    meta.json format version, dataset fingerprint, tokenizer sha256, options, counts, file sizes and sha256s
    *.sums.npy    CRC-32 of each 64 KiB chunk of the three arrays (checked the first time a process reads the chunk)
    layouts/      persisted layouts, one directory per layout config, MAPPING_VERSION and packing version

Invariants: an index directory exists under its final name only once complete (it is written to a temporary directory,
every file fsynced, ``meta.json`` last, then renamed into place), so a build killed at any moment leaves nothing that
opens;
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

from detsampler.index.checksums import VerifiedArray, open_checked_all
from detsampler.index.format import (
    CHAT_FORMAT_VERSION,
    ERASURE_JOURNAL,
    INDEX_KIND,
    LENGTHS_FORMAT_VERSION,
    READ_FORMAT_VERSIONS,
    TokenIndexError,
    base_format_version,
    dataset_fingerprint,
    default_cache_dir,
    seal_ok,
    token_dtype,
)
from detsampler.layout import Layout, LayoutConfig
from detsampler.storage import BlockCache, RemotePath, as_path
from detsampler.text.chat import ChatConfig
from detsampler.text.policy import SpecialTokens
from detsampler.text.protocol import TokenizerLike

__all__ = ["TokenIndex"]


def _read_meta(path: Path | RemotePath, erasing: bool = False) -> dict:
    """``path/meta.json``, checked to be a detsampler token index of this format version (``erasing``: an interrupted
    erasure's journal beside it is the caller's to finish)."""
    meta_path = path / "meta.json"
    try:  # an object is read in one GET (no existence check first: one request fewer per open)
        text = meta_path.read_text() if isinstance(path, RemotePath) or meta_path.is_file() else None
    except FileNotFoundError:
        text = None
    if text is None:
        raise TokenIndexError(
            f"no index at {str(path)!r} (no meta.json: never built, or the build was interrupted); build it with "
            "detsampler.index.build_index or `detsampler build`"
        )
    try:
        meta = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise TokenIndexError(
            f"index {str(path)!r}: meta.json is not valid JSON ({exc}); delete the directory and rebuild"
        ) from None
    if not isinstance(meta, dict) or meta.get("kind") != INDEX_KIND:
        raise TokenIndexError(f"{str(path)!r} is not a detsampler token index (meta.json kind is not {INDEX_KIND!r})")
    if meta.get("format_version") not in READ_FORMAT_VERSIONS:
        raise TokenIndexError(
            f"index {str(path)!r} has format version {meta.get('format_version')!r}, this detsampler reads versions "
            f"{list(READ_FORMAT_VERSIONS)}; delete the directory and rebuild"
        )
    if not seal_ok(meta):
        raise TokenIndexError(
            f"index {str(path)!r}: meta.json fails its checksum (meta_sha256): it was edited after the build; delete"
            " the directory and rebuild"
        )
    if path.name.startswith("index-") and path.name != f"index-{meta.get('cache_key')}":
        raise TokenIndexError(
            f"index {str(path)!r}: meta.json names cache key {meta.get('cache_key')!r}, not the directory's"
        )
    if not erasing and isinstance(path, Path) and (path / ERASURE_JOURNAL).exists():  # (a bucket's: the old meta)
        raise TokenIndexError(
            f"index {str(path)!r}: an erasure was interrupted ({ERASURE_JOURNAL}): run `detsampler erase` on it again"
            " to finish it"
        )
    base_format_version(meta)
    return meta


def _lengths_dtype(path: Path | RemotePath, meta: dict) -> np.dtype:
    """int64, or (format 3) the dtype its ``files`` record names: int64 or int32."""
    record = meta["files"].get("lengths.npy") if isinstance(meta["files"], dict) else None
    name = record.get("dtype", "int64") if isinstance(record, dict) else "int64"
    if name not in ("int64", "int32") or (name != "int64" and base_format_version(meta) != LENGTHS_FORMAT_VERSION):
        raise TokenIndexError(f"index {str(path)!r}: lengths.npy has dtype {name!r}, not one this format allows")
    return np.dtype(name)


def _verify_full(path: Path | RemotePath, files: dict, arrays: dict[str, VerifiedArray]) -> None:
    """Every chunk of every array checked, and each file's sha256 (reads everything)."""
    for name, arr in arrays.items():
        arr.verify_all()
        if arr.sha256() != files[name]["sha256"]:
            raise TokenIndexError(
                f"index {str(path)!r}: {name}'s sha256 differs from the recorded one: the file was edited; delete the"
                " directory and rebuild"
            )


class TokenIndex:
    """An opened index: ``lengths`` and ``offsets`` (int64 memory maps; format 3: ``lengths`` may be int32 and
    ``offsets`` None when no tokens are stored), ``tokens`` (memory map, or None), ``loss_mask`` (format 4, chat data
    with stored tokens: a uint8 memory map aligned with ``tokens``; else None), and ``meta``.

    Document ``d``'s tokens are ``tokens[offsets[d] : offsets[d] + lengths[d]]``; its EOS (``eos_id``) is virtual, at
    position ``lengths[d]``. Pickles as its path (workers reopen the memory maps; nothing is copied); an index in an
    object store pickles as what its open fetched and checked (its meta, each array's size, header and checksums,
    :func:`~detsampler.index.remote.handover`), so a DataLoader worker asks the store nothing again before its first
    read, and every block it reads is checked against those checksums (an object changed since is refused).
    """

    def __init__(
        self,
        path: Path | RemotePath,
        meta: dict,
        lengths: np.ndarray,
        offsets: np.ndarray | None,
        tokens: np.ndarray | None,
        loss_mask: np.ndarray | None = None,
    ) -> None:
        self.path = as_path(path)
        self.meta = meta
        self.lengths = lengths
        self.offsets = offsets
        self.tokens = tokens
        self.loss_mask = loss_mask

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
    def special_tokens(self) -> SpecialTokens:
        """The BOS/EOS policy the index was built with (the default for an index that records none)."""
        return SpecialTokens.from_meta(self.meta.get("special_tokens"))

    @property
    def eos_stored(self) -> bool:
        """Whether each document's EOS position (``lengths[d]``) is a stored token (else it is virtual: ``eos_id``)."""
        return self.special_tokens.eos_stored

    @property
    def chat(self) -> ChatConfig | None:
        """The chat configuration the index was rendered under (its template text included), or None (plain text)."""
        record = self.meta.get("chat")
        return None if record is None else ChatConfig.from_meta(record)

    @property
    def store_tokens(self) -> bool:
        return bool(self.meta["store_tokens"])

    @property
    def text_column(self) -> str:
        return str(self.meta["text_column"])

    @property
    def fingerprint(self) -> str:
        """Identifies the index's documents: a hash of the dataset fingerprint, tokenizer sha256 and options (what its
        persisted layouts are bound to: an erasure keeps every length, hence every layout)."""
        return str(self.meta["cache_key"])

    @property
    def erasures(self) -> list[dict]:
        """The erasure records of the index, oldest first (:mod:`detsampler.index.erase`); empty when none."""
        return list(self.meta.get("erasures") or [])

    @property
    def erased_documents(self) -> np.ndarray:
        """The sorted int64 ids of the documents whose stored tokens were erased (their labels are always -100)."""
        ids = [d for record in self.erasures for d in record["documents"]]
        return np.unique(np.asarray(ids, dtype=np.int64))

    @property
    def data_identity(self) -> str:
        """What a data fingerprint names: :attr:`fingerprint`, then ``+erasure:<id>`` per erasure record, so a resume
        across an erasure is accepted exactly when the new identity extends the recorded one by erasures."""
        return self.fingerprint + "".join(f"+erasure:{record['id']}" for record in self.erasures)

    def __repr__(self) -> str:
        return f"TokenIndex({str(self.path)!r}, num_documents={self.num_documents}, num_tokens={self.num_tokens})"

    def __reduce__(self):
        if isinstance(self.path, RemotePath):  # handed over: the arrays pickle as what was fetched and checked
            return (TokenIndex, (str(self.path), self.meta, self.lengths, self.offsets, self.tokens, self.loss_mask))
        return (TokenIndex.open, (str(self.path),))

    # -- open
    @classmethod
    def open(
        cls,
        path: str | os.PathLike,
        dataset: Any = None,
        tokenizer: TokenizerLike | None = None,
        verify_tokens: bool = False,
        block_cache: BlockCache | None = None,
    ) -> TokenIndex:
        """Open the index at ``path``, checking format version, file sizes, shapes and the small files' sha256.

        With ``dataset`` / ``tokenizer``, also check that they are the ones it was built from; ``verify_tokens`` also
        checks every chunk and the sha256 of every file (reads them all). Otherwise opening reads only ``meta.json`` and
        the small checksum files: each chunk of the arrays is checked the first time this process reads it. Every
        mismatch is an :class:`TokenIndexError` naming what differs. ``path`` may be an object store URL
        (``s3://bucket/prefix/index-KEY``): the arrays are then read by blocks, through ``block_cache`` when given (a
        :class:`~detsampler.storage.BlockCache` shared by the arrays; it does not travel with a pickle: a worker
        reopens without it), each block checked against the chunk CRC-32s as it arrives.
        """
        path = as_path(path)
        meta = _read_meta(path)
        try:
            n_docs, n_tok = int(meta["num_documents"]), int(meta["num_tokens"])
            files = meta["files"]
            store = bool(meta["store_tokens"])
            vocab = int(meta["tokenizer"]["vocab_size"])
        except (KeyError, TypeError, ValueError) as exc:
            raise TokenIndexError(
                f"index {str(path)!r}: meta.json lacks or mangles {exc}; delete the directory and rebuild"
            ) from None
        wanted = {"lengths.npy": (_lengths_dtype(path, meta), (n_docs,))}
        version = base_format_version(meta)
        if store or version != LENGTHS_FORMAT_VERSION or "offsets.npy" in files:
            wanted["offsets.npy"] = (np.dtype(np.int64), (n_docs + 1,))
        if store:
            wanted["tokens.npy"] = (token_dtype(vocab), (n_tok,))
        if version == CHAT_FORMAT_VERSION and not isinstance(meta.get("chat"), dict):
            raise TokenIndexError(f"index {str(path)!r}: format {CHAT_FORMAT_VERSION} but meta.json has no chat record")
        if store and version == CHAT_FORMAT_VERSION:
            wanted["loss_mask.npy"] = (np.dtype(np.uint8), (n_tok,))
        arrays = open_checked_all(path, files, wanted, block_cache)
        if verify_tokens:
            _verify_full(path, files, arrays)
        lengths, offsets, tokens = arrays["lengths.npy"], arrays.get("offsets.npy"), arrays.get("tokens.npy")
        if offsets is not None and (offsets[0] != 0 or offsets[-1] != n_tok):
            raise TokenIndexError(
                f"index {str(path)!r}: offsets/lengths are inconsistent with {n_tok} tokens; delete and rebuild"
            )
        index = cls(path, meta, lengths, offsets, tokens, arrays.get("loss_mask.npy"))
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
                f"index {str(self.path)!r} was built from a dataset with fingerprint {self.meta['dataset_fingerprint']}"
                f" and {self.meta['dataset_num_rows']} rows, got fingerprint {fp} and {len(dataset)} rows: the dataset"
                " changed since the build; build the index again (build_index / `detsampler build`)"
            )
        if text_column is not None and text_column != self.text_column:
            raise TokenIndexError(
                f"index {str(self.path)!r} was built from column {self.text_column!r}, got text_column {text_column!r}"
            )

    def check_tokenizer(self, tokenizer: TokenizerLike) -> None:
        """Raise unless ``tokenizer`` is the model this index was built with (sha256) and its EOS and padding ids are
        the ones the index records (they are written into every sample)."""
        want = self.meta["tokenizer"]["sha256"]
        if tokenizer.sha256 != want:
            raise TokenIndexError(
                f"index {str(self.path)!r} was built with tokenizer sha256 {want[:16]}..."
                f" ({self.meta['tokenizer'].get('path')}), got {tokenizer.sha256[:16]}... ({tokenizer.path}): the"
                " tokenizer changed since the build; pass the original model or build the index again"
            )
        for field in ("eos_id", "pad_id"):
            have, recorded = getattr(tokenizer, field, None), self.meta["tokenizer"].get(field)
            if have is not None and recorded is not None and int(have) != int(recorded):
                raise TokenIndexError(
                    f"index {str(self.path)!r} records {field} {self.meta['tokenizer'][field]}, its tokenizer "
                    f"({tokenizer.path}) has {field} {getattr(tokenizer, field)}: meta.json is wrong; rebuild the index"
                )

    def verify_once(self) -> bool:
        """The full check (every chunk, every file's sha256) the first time any process asks for this index; then a
        marker beside it (named by the sealed meta) says it passed; for an index in an object store, the marker is in
        the local cache (``$DETSAMPLER_CACHE/verified/``, named by the URL and the sealed meta). Returns whether it ran.
        Later reads stay checked chunk by chunk (remote: block by block), so an edit after the full check is still
        refused when read."""
        import hashlib

        from filelock import FileLock

        from detsampler.atomic import atomic_write

        where, name = self.path, f".verified-{self.meta['meta_sha256'][:16]}"
        if isinstance(self.path, RemotePath):  # an object store holds no markers: the local cache does
            where = default_cache_dir() / "verified"
            name = f"{hashlib.sha256(str(self.path).encode()).hexdigest()[:16]}-{self.meta['meta_sha256'][:16]}"
            where.mkdir(parents=True, exist_ok=True)
        marker = where / name
        if marker.is_file():
            return False
        try:
            lock = FileLock(
                str(where / f"{name}.lock" if isinstance(self.path, RemotePath) else where / ".verify.lock")
            )
            lock.acquire()
        except OSError:  # a read-only index: check, without a marker
            _verify_full(self.path, self.meta["files"], self._arrays())
            return True
        try:
            if marker.is_file():
                return False
            _verify_full(self.path, self.meta["files"], self._arrays())
            atomic_write(marker, "ok\n")
            return True
        finally:
            lock.release()

    def _arrays(self) -> dict[str, VerifiedArray]:
        arrays = {"lengths.npy": self.lengths}
        if self.offsets is not None:
            arrays["offsets.npy"] = self.offsets
        if self.tokens is not None:
            arrays["tokens.npy"] = self.tokens
        if self.loss_mask is not None:
            arrays["loss_mask.npy"] = self.loss_mask
        return arrays

    # -- reading
    def document_tokens(self, doc: int) -> np.ndarray:
        """The stored tokens of document ``doc`` (its BOS and a real EOS included; a virtual EOS is not stored)."""
        if self.tokens is None:
            raise ValueError(f"index {str(self.path)!r} was built with store_tokens=False: it holds no tokens")
        if not 0 <= doc < self.num_documents:
            raise ValueError(f"Got document {doc}, allowed documents are in [0, {self.num_documents})")
        start = int(self.offsets[doc])
        return np.asarray(self.tokens[start : int(self.offsets[doc + 1])])

    def layout(self, config: LayoutConfig, num_proc: int = 1, progress: bool = False) -> Layout:
        """The layout ``config`` over this index's documents, persisted in ``layouts/`` beside it and opened as memory
        maps
        (:mod:`detsampler.index.layouts`): built once, by the first process to ask (under a file lock, ``num_proc``
        processes packing a best-fit layout); opened by every other process in O(1) of the corpus size."""
        from detsampler.index.layouts import open_layout

        return open_layout(self, config, num_proc=num_proc, progress=progress)

    def loss_mask_counts(self) -> dict | None:
        """For a chat index, its positions (stored tokens, and a virtual EOS per document) whose token is a trained
        target and the masked ones (the build's exact count), with the policy; None for plain text."""
        chat = self.meta.get("chat")
        if chat is None:
            return None
        virtual_eos = 0 if self.eos_stored else self.num_documents
        trained = int(chat["num_trained_tokens"]) + (virtual_eos if self.chat.eos_trained else 0)
        return {
            "policy": chat["policy"],
            "trained_tokens": trained,
            "masked_tokens": self.num_tokens + virtual_eos - trained,
        }

    def summary(self) -> dict:
        """Counts and identity, for ``detsampler build`` and logs."""
        return {
            "path": str(self.path),
            "num_documents": self.num_documents,
            "num_tokens": self.num_tokens,
            "tokens_with_eos": self.num_tokens + (0 if self.eos_stored else self.num_documents),
            "special_tokens": self.special_tokens.to_meta(),
            "token_dtype": self.meta["token_dtype"],
            "store_tokens": self.store_tokens,
            "text_column": self.text_column,
            "dataset_fingerprint": self.meta["dataset_fingerprint"],
            "tokenizer_sha256": self.meta["tokenizer"]["sha256"],
            "vocab_size": self.vocab_size,
            "eos_id": self.eos_id,
            "pad_id": self.pad_id,
            "fingerprint": self.fingerprint,
            **({} if self.chat is None else {"chat": {k: v for k, v in self.meta["chat"].items() if k != "template"}}),
            **({} if self.chat is None else {"loss_mask": self.loss_mask_counts()}),
            "build": self.meta.get("build", {}),
        }
