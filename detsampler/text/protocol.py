"""What the index needs of a tokenizer (:class:`TokenizerLike`), and the content identity of a tokenizer's files.

Invariant: a tokenizer's ``sha256`` is a function of the bytes of the files that define it (and, for several files, of
their names relative to their directory), never of where they are: the same tokenizer at another path has the same
identity, so an index built with it opens with either.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

__all__ = ["TokenizerLike", "check_tokenizer_like", "describe_tokenizer", "files_sha256"]


@runtime_checkable
class TokenizerLike(Protocol):
    """A tokenizer an index can be built with.

    ``encode_batch`` returns each text's ids with no special token added (the index adds BOS/EOS per its policy);
    ``bos_id`` is None when the tokenizer has no BOS token; ``pad_id`` is the pad token's id, or ``eos_id`` when
    there is none. The object pickles (DataLoader workers and tokenizer processes get the same tokenizer).
    """

    path: str
    sha256: str
    vocab_size: int
    eos_id: int
    bos_id: int | None
    pad_id: int

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def describe(self) -> dict: ...


_REQUIRED = ("path", "sha256", "vocab_size", "eos_id", "pad_id", "encode_batch", "decode", "describe")


def check_tokenizer_like(tokenizer: object) -> None:
    """Raise a ValueError naming what ``tokenizer`` lacks unless it has every member of :class:`TokenizerLike`."""
    missing = [name for name in _REQUIRED if not hasattr(tokenizer, name)]
    if missing:
        raise ValueError(
            "tokenizer must be a TokenizerLike (detsampler.text.load_tokenizer(path) makes one from a .model, a "
            f"tokenizer.json or a transformers directory), got {type(tokenizer).__name__} lacking {', '.join(missing)}"
        )


def files_sha256(paths: Sequence[str | os.PathLike]) -> str:
    """The identity of a tokenizer made of ``paths``: the sha256 of the one file's bytes, or for several files the
    sha256 of their (name, sha256) pairs sorted by name (names only, so the directory they sit in does not matter)."""
    files = [Path(p) for p in paths]
    if len(files) == 1:
        return hashlib.sha256(files[0].read_bytes()).hexdigest()
    h = hashlib.sha256(b"detsampler-tokenizer-files-v1")
    for f in sorted(files, key=lambda f: f.name):
        h.update(f.name.encode() + b"\0" + hashlib.sha256(f.read_bytes()).digest())
    return h.hexdigest()


def describe_tokenizer(tokenizer: TokenizerLike, kind: str) -> dict:
    """What an index records of ``tokenizer`` (its kind, path, identity, vocabulary size and special ids)."""
    return {
        "kind": kind,
        "path": tokenizer.path,
        "sha256": tokenizer.sha256,
        "vocab_size": tokenizer.vocab_size,
        "eos_id": tokenizer.eos_id,
        "bos_id": tokenizer.bos_id,
        "pad_id": tokenizer.pad_id,
    }
