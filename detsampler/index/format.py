"""The identity and format of a token index: its format version, error type, token dtype, cache location and cache key.

Invariant: an index's cache key is a function of the dataset fingerprint and row count, the tokenizer's sha256 (the hash
of its files, wherever they are), the text column, ``store_tokens``, the BOS/EOS policy (with the BOS and EOS ids it
inserts; the default policy adds nothing to the key, so indexes built before policies existed keep their names), the
chat configuration's identity (columns, loss-mask policy, template sha256; only for a chat index, keyed under
:data:`CHAT_FORMAT_VERSION`) and :data:`INDEX_FORMAT_VERSION` only: the same inputs always name the same directory.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from detsampler.text.chat import ChatConfig
from detsampler.text.policy import SpecialTokens
from detsampler.text.protocol import TokenizerLike

__all__ = [
    "CHAT_FORMAT_VERSION",
    "CHUNK_BYTES",
    "ERASED_FORMAT_VERSION",
    "ERASURE_JOURNAL",
    "INDEX_FORMAT_VERSION",
    "INDEX_KIND",
    "LENGTHS_FORMAT_VERSION",
    "READ_FORMAT_VERSIONS",
    "ChecksumError",
    "TokenIndexError",
    "base_format_version",
    "dataset_fingerprint",
    "default_cache_dir",
    "index_cache_key",
    "seal_meta",
    "seal_ok",
    "token_dtype",
]

# 2: per-chunk checksums of the arrays (``*.sums.npy``), a sealed meta.json, persisted layouts
INDEX_FORMAT_VERSION = 2
# 3: as 2, but lengths.npy may be int32 (its dtype named in its ``files`` record) and an index that stores no tokens has
#    no offsets.npy (nothing reads it): what ``detsampler.index.synthetic.write_lengths_index`` writes (4 bytes per
#    document instead of 16). ``build_index`` still writes version 2; the reader reads both.
LENGTHS_FORMAT_VERSION = 3
# 4: as 2, plus a chat configuration in meta.json (``chat``: columns, loss-mask policy, template text and sha256) and,
#    when tokens are stored, loss_mask.npy (uint8, aligned with tokens.npy, checksummed like it). What ``build_index``
#    writes for chat data (``chat=``): a reader that does not know masks must not open it and train on every token.
CHAT_FORMAT_VERSION = 4
# 5: an index of format 2 or 4 (``erased_from_format``) whose stored tokens of some documents were overwritten in place
#    with its pad id (``detsampler erase``: loss masks zeroed, chunk checksums and file sha256s recomputed, every length
#    kept) and whose meta.json lists the erasures (``erasures``). A reader that does not know erasures must not open it:
#    it would train on the erased documents' neutral tokens as labels. Its cache key (the directory) is unchanged.
ERASED_FORMAT_VERSION = 5
ERASURE_JOURNAL = "erasure.pending.json"  # written before an erasure touches a byte, removed once meta.json is written
READ_FORMAT_VERSIONS = (INDEX_FORMAT_VERSION, LENGTHS_FORMAT_VERSION, CHAT_FORMAT_VERSION, ERASED_FORMAT_VERSION)
INDEX_KIND = "detsampler-token-index"


class TokenIndexError(ValueError):
    """An index that is missing, incomplete, corrupt, or built from another dataset or tokenizer."""


CHUNK_BYTES = 1 << 16  # the checksum chunk of an index's arrays: a CRC-32 per 64 KiB of the file (.sums.npy)


class ChecksumError(TokenIndexError):
    """A chunk of a file whose checksum differs from the one recorded when it was written (``path``: the file)."""

    def __init__(self, message: str, path: Any = None) -> None:
        super().__init__(message)
        self.path = path


def default_cache_dir() -> Path:
    """``$DETSAMPLER_CACHE`` if set, else ``.cache/detsampler`` under the current directory."""
    return Path(os.environ.get("DETSAMPLER_CACHE") or Path.cwd() / ".cache" / "detsampler")


def token_dtype(vocab_size: int) -> np.dtype:
    """``uint16`` when every id fits, else ``uint32``."""
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


def dataset_fingerprint(dataset: Any) -> str:
    """The Hugging Face fingerprint of ``dataset`` (it changes whenever the data or a transform does)."""
    fp = getattr(dataset, "_fingerprint", None)
    if not isinstance(fp, str) or not fp:
        raise ValueError(
            f"dataset must be a datasets.Dataset with a fingerprint, got {type(dataset).__name__}; load it with "
            "detsampler.text.corpus.load_corpus or datasets"
        )
    return fp


def index_cache_key(
    dataset: Any,
    tokenizer: TokenizerLike,
    text_column: str = "text",
    store_tokens: bool = True,
    special_tokens: SpecialTokens | None = None,
    chat: ChatConfig | None = None,
    template: str | None = None,
) -> str:
    """The cache name's hash: the dataset fingerprint, the tokenizer's sha256, the options, the BOS/EOS policy, the
    chat configuration with its template (``template``: the text it renders with) and the format version."""
    fields = {
        "format_version": INDEX_FORMAT_VERSION if chat is None else CHAT_FORMAT_VERSION,
        "dataset": dataset_fingerprint(dataset),
        "num_rows": len(dataset),
        "tokenizer": tokenizer.sha256,
        "text_column": text_column,
        "store_tokens": bool(store_tokens),
    }
    if special_tokens is not None and special_tokens != SpecialTokens():
        fields["special_tokens"] = {**special_tokens.to_meta(), "bos_id": tokenizer.bos_id, "eos_id": tokenizer.eos_id}
    if chat is not None:
        fields["chat"] = chat.identity(template)
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:20]


SEAL_FIELD = "meta_sha256"


def _seal(record: dict) -> str:
    body = {k: v for k, v in record.items() if k != SEAL_FIELD}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def seal_meta(record: dict) -> dict:
    """``record`` with its seal: the sha256 of its canonical JSON without the seal (``meta_sha256``)."""
    return {**record, SEAL_FIELD: _seal(record)}


def seal_ok(record: dict) -> bool:
    """Whether ``record`` carries the seal of exactly its content (any edit of a value breaks it)."""
    return record.get(SEAL_FIELD) == _seal(record)


def base_format_version(meta: dict) -> int:
    """The format an index's files follow: its ``format_version``, or, erased (format 5), the one it had before."""
    version = meta.get("format_version")
    if version == ERASED_FORMAT_VERSION:
        base = meta.get("erased_from_format")
        if base not in (INDEX_FORMAT_VERSION, CHAT_FORMAT_VERSION):
            raise TokenIndexError(f"an erased index must name its format before (2 or 4), got {base!r}")
        return int(base)
    return version
