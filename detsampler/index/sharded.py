"""A sharded index: a manifest over shards, opened as one index with global document ids.

A sharded index directory holds ``manifest.json`` (sealed) and ``layouts/``; the manifest lists the shards in order,
each ``{"kind", "path", "fingerprint", "num_documents", "num_tokens"}``, its ``path`` relative to the manifest's
directory. Shard ``k``'s documents are the global documents ``[doc_base[k], doc_base[k+1])`` and its tokens the global
token positions ``[token_base[k], token_base[k+1])``. A shard is any reader :data:`SHARD_KINDS` can open:
``"detsampler"``, a :class:`~detsampler.index.reader.TokenIndex` directory (one input file tokenized); other kinds
(pre-tokenized formats) register an opener giving the :class:`ShardReader` surface: ``lengths``, ``offsets``, ``tokens``
(1-D arrays, memory maps), ``fingerprint``, ``num_documents``, ``num_tokens``, ``eos_id``, ``pad_id``, ``vocab_size``.

Invariants: :class:`ShardedIndex` reads like a ``TokenIndex`` (``lengths``, ``offsets``, ``tokens`` over global ids,
each read going to the shard that holds it, nothing of size D materialized); its fingerprint hashes the shards'
fingerprints in order, so adding, removing or rebuilding a shard changes it (and names new layouts); a missing,
incomplete or corrupt shard is an error naming the shard.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from detsampler.index.format import TokenIndexError, seal_meta, seal_ok
from detsampler.index.reader import TokenIndex
from detsampler.layout import Layout, LayoutConfig

__all__ = ["MANIFEST", "SHARD_KINDS", "ShardReader", "ShardedArray", "ShardedIndex", "open_index", "write_manifest"]

MANIFEST = "manifest.json"
MANIFEST_KIND = "detsampler-sharded-index"
MANIFEST_VERSION = 1


class ShardReader(Protocol):
    """What a shard must offer (a ``TokenIndex`` does)."""

    lengths: Any
    offsets: Any
    tokens: Any
    fingerprint: str
    num_documents: int
    num_tokens: int
    eos_id: int
    pad_id: int
    vocab_size: int


SHARD_KINDS: dict[str, Callable[[Path], ShardReader]] = {"detsampler": TokenIndex.open}


class ShardedArray:
    """The concatenation of one 1-D array per shard, read without materializing it: element ``i`` is
    ``parts[k][i - bases[k]] + add[k]`` for the shard ``k`` holding ``i``; ``tail`` (if given) is one last element."""

    def __init__(
        self,
        parts: list[Any],
        bases: np.ndarray,
        add: np.ndarray | None = None,
        tail: int | None = None,
        dtype: Any = np.int64,
    ) -> None:
        self._parts, self._bases, self._add, self._tail = parts, bases, add, tail
        self._n = int(bases[-1]) + (tail is not None)
        self.dtype = np.dtype(dtype)

    shape = property(lambda self: (self._n,))
    size = property(lambda self: self._n)
    ndim = 1

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, (int, np.integer)):
            return self[np.array([int(key) + (self._n if key < 0 else 0)])][0]
        if isinstance(key, slice):
            return self[np.arange(*key.indices(self._n))]
        idx = np.asarray(key, dtype=np.int64)
        if idx.size and (idx.min() < 0 or idx.max() >= self._n):
            raise IndexError(f"index out of range for a sharded array of {self._n} elements")
        flat = idx.reshape(-1)
        out = np.empty(flat.size, dtype=self.dtype)
        shard = np.searchsorted(self._bases, flat, side="right") - 1
        for k in sorted(set(shard.tolist())):
            mine = shard == k
            if k == len(self._parts):  # the tail element
                out[mine] = self._tail
                continue
            values = np.asarray(self._parts[k][flat[mine] - self._bases[k]])
            out[mine] = values + (self._add[k] if self._add is not None else 0)
        return out.reshape(idx.shape)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        """The whole array (O(n) memory: for tools over small corpora)."""
        return self[np.arange(self._n)].astype(dtype or self.dtype, copy=False)

    def tolist(self) -> list:
        return np.asarray(self).tolist()


def _open_shard(root: Path, entry: dict, k: int) -> ShardReader:
    kind, path = entry.get("kind"), root / str(entry.get("path"))
    if kind not in SHARD_KINDS:
        raise TokenIndexError(
            f"sharded index {str(root)!r}: shard {k} has kind {kind!r}, known kinds are {sorted(SHARD_KINDS)}"
        )
    try:
        shard = SHARD_KINDS[kind](path)
    except (TokenIndexError, OSError, ValueError) as exc:
        raise TokenIndexError(
            f"sharded index {str(root)!r}: shard {k} ({entry.get('path')}) cannot be opened: {exc}"
        ) from None
    if shard.fingerprint != entry.get("fingerprint") or shard.num_documents != entry.get("num_documents"):
        raise TokenIndexError(
            f"sharded index {str(root)!r}: shard {k} ({entry.get('path')}) is not the one the manifest "
            f"lists (fingerprint {shard.fingerprint}, manifest {entry.get('fingerprint')})"
        )
    return shard


def manifest_key(entries: list[dict]) -> str:
    """The sharded index's fingerprint: the shards' kinds and fingerprints, in order."""
    body = json.dumps([[e["kind"], e["fingerprint"]] for e in entries]).encode()
    return hashlib.sha256(b"sharded-v1" + body).hexdigest()[:20]


def write_manifest(root: str | os.PathLike, entries: list[dict], tokenizer: dict | None = None) -> dict:
    """Write ``root/manifest.json`` (atomically) for ``entries`` (``kind``, ``path`` relative to ``root``,
    ``fingerprint``, ``num_documents``, ``num_tokens`` each); returns the manifest."""
    from detsampler.atomic import atomic_write

    manifest = {
        "kind": MANIFEST_KIND,
        "format_version": MANIFEST_VERSION,
        "cache_key": manifest_key(entries),
        "num_documents": sum(int(e["num_documents"]) for e in entries),
        "num_tokens": sum(int(e["num_tokens"]) for e in entries),
        "tokenizer": tokenizer or {},
        "shards": entries,
    }
    Path(root).mkdir(parents=True, exist_ok=True)
    atomic_write(Path(root) / MANIFEST, json.dumps(seal_meta(manifest), indent=2, sort_keys=True) + "\n")
    return manifest


class ShardedIndex:
    """An opened sharded index (see the module doc): reads like a ``TokenIndex`` over global document ids."""

    def __init__(self, path: Path, manifest: dict, shards: list[ShardReader]) -> None:
        self.path, self.meta, self.shards = Path(path), manifest, shards
        docs = np.array([0] + [s.num_documents for s in shards], dtype=np.int64).cumsum()
        toks = np.array([0] + [s.num_tokens for s in shards], dtype=np.int64).cumsum()
        self.doc_base, self.token_base = docs, toks
        self.lengths = ShardedArray([s.lengths for s in shards], docs)
        self.offsets = ShardedArray([s.offsets for s in shards], docs, add=toks[:-1], tail=int(toks[-1]))
        stored = [s.tokens for s in shards]
        self.tokens = None if any(t is None for t in stored) else ShardedArray(stored, toks, dtype=stored[0].dtype)

    @classmethod
    def open(cls, path: str | os.PathLike) -> ShardedIndex:
        """Open the sharded index at ``path``: its manifest (checked) and every shard (each named in any error)."""
        path = Path(path)
        try:
            manifest = json.loads((path / MANIFEST).read_text())
        except (OSError, ValueError) as exc:
            raise TokenIndexError(
                f"sharded index {str(path)!r}: no readable {MANIFEST} ({exc}); finalize it with "
                "`detsampler build --finalize`"
            ) from None
        if (
            manifest.get("kind") != MANIFEST_KIND
            or manifest.get("format_version") != MANIFEST_VERSION
            or not seal_ok(manifest)
        ):
            raise TokenIndexError(
                f"sharded index {str(path)!r}: {MANIFEST} is not a version-{MANIFEST_VERSION} manifest "
                "or fails its seal (edited); finalize it again"
            )
        shards = [_open_shard(path, e, k) for k, e in enumerate(manifest["shards"])]
        eos = {(s.eos_id, s.pad_id, s.vocab_size) for s in shards}
        if len(eos) > 1:
            raise TokenIndexError(
                f"sharded index {str(path)!r}: shards disagree on (eos_id, pad_id, vocab_size): {sorted(eos)}"
            )
        return cls(path, manifest, shards)

    num_documents = property(lambda self: int(self.doc_base[-1]))
    num_tokens = property(lambda self: int(self.token_base[-1]))
    fingerprint = property(lambda self: str(self.meta["cache_key"]))
    eos_id = property(lambda self: int(self.shards[0].eos_id))
    pad_id = property(lambda self: int(self.shards[0].pad_id))
    vocab_size = property(lambda self: int(self.shards[0].vocab_size))
    store_tokens = property(lambda self: self.tokens is not None)

    def __reduce__(self):
        return (ShardedIndex.open, (str(self.path),))

    def __repr__(self) -> str:
        return f"ShardedIndex({str(self.path)!r}, shards={len(self.shards)}, num_documents={self.num_documents})"

    def shard_of(self, doc: int) -> tuple[int, int]:
        """(shard, document within the shard) of global document ``doc``."""
        k = int(np.searchsorted(self.doc_base, doc, side="right")) - 1
        return k, int(doc - self.doc_base[k])

    def document_tokens(self, doc: int) -> np.ndarray:
        if not 0 <= doc < self.num_documents:
            raise ValueError(f"Got document {doc}, allowed documents are in [0, {self.num_documents})")
        k, local = self.shard_of(doc)
        return self.shards[k].document_tokens(local)

    def check_tokenizer(self, tokenizer: Any) -> None:
        for shard in self.shards:
            shard.check_tokenizer(tokenizer)

    def layout(self, config: LayoutConfig, num_proc: int = 1, progress: bool = False) -> Layout:
        """The layout ``config`` over all shards' documents, persisted in ``layouts/`` beside the manifest."""
        from detsampler.index.layouts import open_layout

        return open_layout(self, config, num_proc=num_proc, progress=progress)

    def summary(self) -> dict:
        return {
            "path": str(self.path),
            "num_shards": len(self.shards),
            "num_documents": self.num_documents,
            "num_tokens": self.num_tokens,
            "fingerprint": self.fingerprint,
            "eos_id": self.eos_id,
            "pad_id": self.pad_id,
        }


def open_index(path: str | os.PathLike) -> TokenIndex | ShardedIndex:
    """A ``TokenIndex`` or a ``ShardedIndex``, whichever ``path`` holds."""
    return ShardedIndex.open(path) if (Path(path) / MANIFEST).is_file() else TokenIndex.open(path)
