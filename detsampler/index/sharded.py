"""A sharded index: a manifest over shards, opened as one index with global document ids.

A sharded index directory holds ``manifest.json`` (sealed) and ``layouts/``; the manifest lists the shards in order,
each ``{"kind", "path", "fingerprint", "num_documents", "num_tokens"}``, its ``path`` relative to the manifest's
directory. Shard ``k``'s documents are the global documents ``[doc_base[k], doc_base[k+1])`` and its tokens the global
token positions ``[token_base[k], token_base[k+1])``. A shard is any reader :data:`SHARD_KINDS` can open:
``"detsampler"``, a :class:`~detsampler.index.reader.TokenIndex` directory (one input file tokenized), or one file of a
pre-tokenized format (``"megatron"``, ``"olmo"``, ``"datatrove"``, ``"nanogpt"``: a
:class:`~detsampler.index.sources.TokenSource`, its tokens memory-mapped where they lie, never copied; its entry's
``options`` are how it is read: ``eos``, ``eos_id``, ``pad_id``, ``vocab_size``, the format's own). Each kind gives the
:class:`ShardReader` surface.

Invariants: :class:`ShardedIndex` reads like a ``TokenIndex`` (``lengths``, ``offsets``, ``tokens`` over global ids,
each read going to the shard that holds it, nothing of size D materialized); its fingerprint hashes the shards'
fingerprints in order, so adding, removing or rebuilding a shard changes it (and names new layouts); a missing,
incomplete, corrupt or changed shard is an error naming the shard. Shards of different kinds may be mixed only where
the reader cannot tell them apart: the same EOS reading (stored or virtual), EOS and pad ids, vocabulary size, and
stored tokens in every shard or in none; else opening names the first shard that differs and why.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from detsampler.index.format import TokenIndexError, seal_meta, seal_ok
from detsampler.index.protocol import Index
from detsampler.index.reader import TokenIndex
from detsampler.layout import Layout, LayoutConfig
from detsampler.storage import RemotePath, as_path, parse_location

__all__ = [
    "CLAIMS",
    "MANIFEST",
    "SHARD_KINDS",
    "TOKENIZED_KIND",
    "ShardReader",
    "ShardedArray",
    "ShardedIndex",
    "open_index",
    "open_shards",
    "write_manifest",
]

MANIFEST = "manifest.json"
CLAIMS = "claims"  # a local build's records, one per finished shard (detsampler.index.shards): checked on open
MANIFEST_KIND = "detsampler-sharded-index"
MANIFEST_VERSION = 1
_OPEN_THREADS = 16  # shards in an object store opened at once


ShardReader = Index  # a shard is any index: a TokenIndex or a pre-tokenized TokenSource (detsampler.index.protocol)


def _open_token_index(path: Path, options: dict) -> ShardReader:
    return TokenIndex.open(path)


def _source_opener(kind: str) -> Callable[[Path, dict], ShardReader]:
    def open_kind(path: Path, options: dict) -> ShardReader:
        from detsampler.index.sources import open_source

        return open_source(kind, path, **options)

    return open_kind


# kind -> opener(path, the entry's options); a source kind's options are open_source's keywords
TOKENIZED_KIND = (
    "detsampler"  # a shard tokenized by detsampler (a TokenIndex); every other kind is a pre-tokenized file
)
SHARD_KINDS: dict[str, Callable[[Path, dict], ShardReader]] = {
    TOKENIZED_KIND: _open_token_index,
    **{kind: _source_opener(kind) for kind in ("megatron", "olmo", "datatrove", "nanogpt")},
}


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


def shard_location(root: Path | RemotePath, relative: str) -> Path | RemotePath:
    """Where a manifest entry's ``path`` (relative to the manifest's directory ``root``, ``..`` allowed) lies: a local
    path, or for a manifest in an object store the URL it names in the same bucket."""
    if not isinstance(root, RemotePath):
        return Path(os.path.normpath(root / relative))
    loc = parse_location(root.url)
    key = posixpath.normpath(posixpath.join(loc.key, relative))
    if key.startswith("..") or key.startswith("/"):
        raise TokenIndexError(f"sharded index {root.url}: shard path {relative!r} leaves the bucket")
    return RemotePath(f"{loc.scheme}://{loc.bucket}/{key}")


def _open_shard(root: Path | RemotePath, entry: dict, k: int) -> ShardReader:
    kind, path = entry.get("kind"), shard_location(root, str(entry.get("path")))
    if kind not in SHARD_KINDS:
        raise TokenIndexError(
            f"sharded index {str(root)!r}: shard {k} has kind {kind!r}, known kinds are {sorted(SHARD_KINDS)}"
        )
    try:
        shard = SHARD_KINDS[kind](path, dict(entry.get("options") or {}))
    except (TokenIndexError, OSError, ValueError, TypeError) as exc:
        raise TokenIndexError(
            f"sharded index {str(root)!r}: shard {k} ({entry.get('path')}) cannot be opened: {exc}"
        ) from None
    if shard.fingerprint != entry.get("fingerprint") or shard.num_documents != entry.get("num_documents"):
        raise TokenIndexError(
            f"sharded index {str(root)!r}: shard {k} ({entry.get('path')}) is not the one the manifest "
            f"lists (fingerprint {shard.fingerprint}, manifest {entry.get('fingerprint')}): it changed since the "
            "manifest was written; finalize again"
        )
    return shard


def _reading(shard: ShardReader) -> tuple:
    """What the reader of a sharded index takes from the index as a whole: it must be the same in every shard."""
    return (bool(shard.eos_stored), int(shard.eos_id), int(shard.pad_id), int(shard.vocab_size), shard.tokens is None)


def _check_compatible(root: Path, entries: list[dict], shards: list[ShardReader]) -> None:
    """Raise naming the first shard that is read differently from shard 0, and how (see the module doc)."""
    first = _reading(shards[0])
    for k, shard in enumerate(shards[1:], start=1):
        got = _reading(shard)
        if got == first:
            continue
        if got[0] != first[0]:
            why = (
                f"shard 0 ({entries[0].get('kind')}) {'stores' if first[0] else 'reads a virtual'} EOS, shard {k} "
                f"({entries[k].get('kind')}) {'stores' if got[0] else 'reads a virtual'} EOS, and a sample reads "
                "one or the other: build the tokenized shards with add_eos='real' (--add-eos real) to mix them with "
                "pre-tokenized files whose documents end in a stored EOS, or read those with eos='virtual'"
            )
        elif got[4] != first[4]:
            why = "some shards store no tokens (store_tokens=False), others do: build them all one way"
        else:
            why = (
                f"(eos_id, pad_id, vocab_size) {got[1:4]} differ from shard 0's {first[1:4]}: a sharded index has "
                "one tokenizer; give every shard the same one"
            )
        raise TokenIndexError(
            f"sharded index {str(root)!r}: shard {k} ({entries[k].get('path')}) cannot be mixed: {why}"
        )


def open_shards(root: str | os.PathLike, entries: list[dict]) -> list[ShardReader]:
    """Every shard of ``entries`` (paths relative to ``root``) opened and checked against its entry and against the
    others (they must read alike: see the module doc); an error names the first shard that fails, and why."""
    root = as_path(root)
    if not entries:
        raise TokenIndexError(f"sharded index {str(root)!r}: {MANIFEST} lists no shards")
    if isinstance(root, RemotePath) and len(entries) > 1:  # each shard's few small reads: all shards' at once
        with ThreadPoolExecutor(min(len(entries), _OPEN_THREADS), thread_name_prefix="detsampler-open") as pool:
            shards = list(pool.map(lambda k: _open_shard(root, entries[k], k), range(len(entries))))
    else:
        shards = [_open_shard(root, e, k) for k, e in enumerate(entries)]
    _check_compatible(root, entries, shards)
    return shards


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
        self.path, self.meta, self.shards = as_path(path), manifest, shards
        docs = np.array([0] + [s.num_documents for s in shards], dtype=np.int64).cumsum()
        toks = np.array([0] + [s.num_tokens for s in shards], dtype=np.int64).cumsum()
        self.doc_base, self.token_base = docs, toks
        self.lengths = ShardedArray([s.lengths for s in shards], docs)
        self.offsets = ShardedArray([s.offsets for s in shards], docs, add=toks[:-1], tail=int(toks[-1]))
        stored = [s.tokens for s in shards]
        dtype = np.result_type(*[t.dtype for t in stored]) if all(t is not None for t in stored) else None
        self.tokens = None if dtype is None else ShardedArray(stored, toks, dtype=dtype)

    @classmethod
    def open(cls, path: str | os.PathLike) -> ShardedIndex:
        """Open the sharded index at ``path``: its manifest (checked) and every shard (each named in any error)."""
        path = as_path(path)
        try:
            manifest = json.loads((path / MANIFEST).read_text())
        except (OSError, ValueError) as exc:
            raise TokenIndexError(
                f"sharded index {str(path)!r}: no readable {MANIFEST} ({exc}): its build did not finish, or was never"
                " finalized; run the build again (or `detsampler build --finalize` once every shard is built)"
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
        if not isinstance(path, RemotePath):
            check_claims(path, manifest)
        return cls(path, manifest, open_shards(path, manifest["shards"]))

    num_documents = property(lambda self: int(self.doc_base[-1]))
    num_tokens = property(lambda self: int(self.token_base[-1]))
    fingerprint = property(lambda self: str(self.meta["cache_key"]))
    eos_id = property(lambda self: int(self.shards[0].eos_id))
    pad_id = property(lambda self: int(self.shards[0].pad_id))
    vocab_size = property(lambda self: int(self.shards[0].vocab_size))
    store_tokens = property(lambda self: self.tokens is not None)
    eos_stored = property(lambda self: bool(self.shards[0].eos_stored))
    special_tokens = property(lambda self: self.shards[0].special_tokens)

    def __reduce__(self):
        if isinstance(self.path, RemotePath):  # handed over: its checked manifest and its shards, as each pickles
            return (ShardedIndex, (str(self.path), self.meta, self.shards))
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

    def check_dataset(self, dataset: Any, text_column: str | None = None) -> None:
        """Always raises: a sharded index reads its shards' stored tokens, it takes no dataset."""
        raise ValueError(
            f"sharded index {str(self.path)!r} takes no dataset: its shards hold the tokens (no on-the-fly "
            "tokenization); pass dataset=None"
        )

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


def check_claims(root: Path, manifest: dict) -> None:
    """Raise unless every build claim under ``root/claims`` (one per shard its build finished) names the index the
    manifest lists for that shard: a claim that differs is a shard rebuilt since the manifest was written, by a build
    that has not written the new one yet (killed, failed, or still running): the manifest no longer describes what was
    built, so it is never opened as complete."""
    claims = root / CLAIMS
    if not claims.is_dir():  # a manifest written by hand, or pushed without its claims
        return
    entries = manifest.get("shards") or []
    for p in sorted(claims.glob("shard-*.json")):
        try:
            claim = json.loads(p.read_text())
            k = int(claim["shard"])
            entry = entries[k] if 0 <= k < len(entries) else {}
            same = (entry.get("path"), entry.get("fingerprint")) == (claim["path"], claim["fingerprint"])
        except (OSError, ValueError, KeyError, TypeError):
            raise TokenIndexError(
                f"sharded index {str(root)!r}: its build claim {p.name} is unreadable (damaged): build it again"
            ) from None
        if not same:
            raise TokenIndexError(
                f"sharded index {str(root)!r}: shard {k} ({Path(str(claim.get('input'))).name}) was rebuilt since "
                f"{MANIFEST} was written (its claim names index {claim['fingerprint']}, the manifest "
                f"{entry.get('fingerprint')}): a build of it did not finish; run the build again (or --finalize once "
                "every shard is built)"
            )


def open_index(path: str | os.PathLike) -> Any:
    """A ``TokenIndex``, a ``ShardedIndex`` or a :class:`~detsampler.media.index.MediaIndex` (images beside text),
    whichever ``path`` holds."""
    root = as_path(path)
    if (root / MANIFEST).is_file() or (not isinstance(root, RemotePath) and (root / CLAIMS).is_dir()):
        return ShardedIndex.open(path)  # a sharded build's claims without a manifest: said to be unfinished
    if _meta_kind(root) == "detsampler-media-index":
        from detsampler.media.index import MediaIndex  # NOTE: imported on use: the media index reads this package

        return MediaIndex.open(path)
    return TokenIndex.open(path)


def _meta_kind(root: Path | RemotePath) -> Any:
    """The ``kind`` a directory's ``meta.json`` records (None when unreadable: the opener says why)."""
    try:
        meta = json.loads((root / "meta.json").read_text())
    except (OSError, ValueError):
        return None
    return meta.get("kind") if isinstance(meta, dict) else None
