"""A pre-tokenized corpus opened as an index: the format's own document boundaries over a memory map of its tokens.

Invariants: the tokens are never copied (``tokens`` is a read-only memory map of the format's own file); only per
document arrays (``lengths``, ``offsets``: 16 bytes a document) are held in memory. Document ``d``'s stored tokens are
``tokens[offsets[d] : offsets[d + 1]]``, exactly the format's own. With ``eos="real"`` (the default) a document's last
stored token sits at its EOS position (``lengths[d] = stored - 1``), so samples read exactly the stored tokens, no token
added or dropped; with ``eos="virtual"`` an EOS (``eos_id``) is read after each document's stored tokens. The
``identity`` hashes the files' sizes, their small index files whole and sampled blocks of the token file, never a path.
The first open reads the token file once (:func:`scan_source`: per 64 KiB chunk its id bounds, the EOS boundaries of a
flat file, documents that do not end in the EOS), cached under the stat of every file with its ctime (an object: its
size and strong ETag), so that a write (its mtime restored or not) is scanned again; an object whose server sends no
strong ETag is scanned at every open, never cached; a damaged cached scan is scanned again and replaced. Every open
refuses ids outside the vocabulary and the signs of a foreign format (:func:`check_scan`).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import uuid
import zipfile
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from detsampler.index.format import TokenIndexError, default_cache_dir
from detsampler.layout import Layout, LayoutConfig, make_layout
from detsampler.storage import BlockedObject, RemoteArray, RemotePath, as_path, store_for
from detsampler.text.policy import SpecialTokens

__all__ = [
    "EOS_SOURCE_MODES",
    "PLAUSIBLE_IDS",
    "SourceScan",
    "TokenSource",
    "check_scan",
    "sampled_sha256",
    "scan_source",
]

logger = logging.getLogger("detsampler")

EOS_SOURCE_MODES = ("real", "virtual")
_BLOCK = 1 << 16  # bytes per sampled block of a token file
_BLOCKS = 32  # sampled blocks per token file (and its first and last MiB)


def sampled_sha256(paths: Sequence[Path], whole: Sequence[Path] = ()) -> str:
    """The sha256 of each file's size and sampled blocks (its first and last MiB, ``_BLOCKS`` evenly spaced blocks), and
    of the ``whole`` files' full bytes, by file name: a cheap content identity, independent of the directory."""
    h = hashlib.sha256(b"detsampler-source-identity-v1")
    for p in paths:
        size = p.stat().st_size
        h.update(f"{p.suffix}:{size}".encode())
        starts = [0, max(0, size - (1 << 20))] + [size * i // _BLOCKS for i in range(1, _BLOCKS)]
        ranges = [(a, min(size, a + (1 << 20 if k < 2 else _BLOCK))) for k, a in enumerate(starts)]
        for block in store_for(str(p)).read_ranges(str(p), ranges):  # one request for an object
            h.update(block)
    for p in whole:
        h.update(f"{p.suffix}:".encode() + hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()


class TokenSource:
    """An opened pre-tokenized corpus, usable wherever a :class:`~detsampler.index.reader.TokenIndex` is read
    (``layout`` -> :class:`~detsampler.loader.dataset.PackedDataset` -> DataLoader). Pickles as how it was opened:
    ``reopen`` is (the opener, its positional arguments, its format's own keywords); ``eos``, ``eos_id``, ``pad_id`` and
    ``vocab_size`` are added to those keywords here."""

    store_tokens = True

    def __init__(
        self,
        kind: str,
        path: str | os.PathLike,
        tokens: np.ndarray,
        starts: np.ndarray,
        *,
        identity: str,
        eos: str,
        eos_id: int | None,
        pad_id: int | None = None,
        vocab_size: int | None = None,
        reopen: tuple[Any, tuple, dict],
        scan: SourceScan | None = None,
        end_eos: bool = False,
        loss_mask: str | os.PathLike | None = None,
    ) -> None:
        if eos not in EOS_SOURCE_MODES:
            raise ValueError(f"eos must be one of {', '.join(EOS_SOURCE_MODES)}, got {eos!r}")
        stored = np.diff(starts)
        if eos == "real" and stored.size and int(stored.min()) < 1:
            d = int(np.argmin(stored))
            raise TokenIndexError(
                f"{kind} source {str(path)!r}: document {d} is empty, so it has no last token to stand for "
                "its EOS; open it with eos='virtual' (an EOS read after each document)"
            )
        self.kind, self.path, self.tokens = kind, as_path(path), tokens
        self.offsets = starts
        self.lengths = stored - 1 if eos == "real" else stored
        if eos == "virtual" and eos_id is None:
            raise ValueError(
                f"{kind} source {str(path)!r}: eos='virtual' needs the EOS id: pass eos_id= (or a tokenizer)"
            )
        self.eos = eos
        self.eos_id = -1 if eos_id is None else int(eos_id)  # -1: unknown (never read: the EOS positions are stored)
        self.pad_id = int(pad_id) if pad_id is not None else max(self.eos_id, 0)
        self.vocab_size = int(vocab_size) if vocab_size is not None else int(np.iinfo(tokens.dtype).max) + 1
        if scan is not None:  # ids in the vocabulary, a plausible dtype, (end_eos) documents that end in the EOS
            check_scan(kind, as_path(path), scan, tokens, vocab_size, eos_id, end_eos and eos == "real")
        self.identity = identity
        self.loss_mask, self.loss_mask_identity = None, None
        if loss_mask is not None:
            self.loss_mask = mask_memmap(Path(loss_mask), tokens.size, kind, Path(path))
            self.loss_mask_identity = sampled_sha256([Path(loss_mask)])
        fn, args, format_options = reopen  # the reading options shared by every format are added here, once
        if loss_mask is not None:
            format_options = {**format_options, "loss_mask": str(loss_mask)}
        self._reopen = (fn, args, dict(eos=eos, eos_id=eos_id, pad_id=pad_id, vocab_size=vocab_size, **format_options))

    # -- what readers of an index use
    @property
    def num_documents(self) -> int:
        return int(self.lengths.size)

    @property
    def num_tokens(self) -> int:
        """Stored tokens."""
        return int(self.offsets[-1])

    @property
    def eos_stored(self) -> bool:
        return self.eos == "real"

    @property
    def special_tokens(self) -> SpecialTokens:
        return SpecialTokens(add_eos="real" if self.eos_stored else "virtual")

    @property
    def loss_mask_eos(self) -> bool:
        """A virtual EOS read after a masked document is trained (as in pretraining); a stored one has its own value."""
        return True

    @property
    def fingerprint(self) -> str:
        """The source's content identity with how it is read (EOS mode and id, and its loss mask's identity when one is
        given): what a plan over it depends on."""
        key = f"{self.kind}|{self.identity}|{self.eos}|{self.eos_id}|{self.pad_id}"
        if self.loss_mask_identity is not None:  # absent: the fingerprints of sources opened without one stay the same
            key += f"|loss_mask:{self.loss_mask_identity}"
        return hashlib.sha256(key.encode()).hexdigest()[:20]

    def __repr__(self) -> str:
        counts = f"num_documents={self.num_documents}, num_tokens={self.num_tokens}"
        return f"TokenSource({self.kind!r}, {str(self.path)!r}, {counts})"

    @property
    def open_options(self) -> dict[str, Any]:
        """The keywords it was opened with: ``open_source(kind, path, **open_options)`` opens it again, read the same
        way (a sharded index's manifest records them)."""
        return dict(self._reopen[2])

    def __reduce__(self):
        fn, args, kwargs = self._reopen
        return (_call, (fn, args, kwargs))

    def document_tokens(self, doc: int) -> np.ndarray:
        """The stored tokens of document ``doc``, as the format stores them."""
        if not 0 <= doc < self.num_documents:
            raise ValueError(f"Got document {doc}, allowed documents are in [0, {self.num_documents})")
        return np.asarray(self.tokens[int(self.offsets[doc]) : int(self.offsets[doc + 1])])

    def layout(self, config: LayoutConfig) -> Layout:
        return make_layout(config, self.lengths)

    def check_dataset(self, dataset: Any, text_column: str | None = None) -> None:
        raise ValueError(
            f"{self.kind} source {str(self.path)!r} is pre-tokenized: it takes no dataset (no on-the-fly tokenization)"
        )

    def check_tokenizer(self, tokenizer: Any) -> None:
        """Raise unless ``tokenizer``'s EOS id is the one this source is read with."""
        if self.eos_id >= 0 and int(tokenizer.eos_id) != self.eos_id:
            raise TokenIndexError(
                f"{self.kind} source {str(self.path)!r} is read with eos_id {self.eos_id}, the tokenizer "
                f"{getattr(tokenizer, 'path', '?')!r} has eos_id {tokenizer.eos_id}"
            )

    def summary(self) -> dict:
        return {
            "path": str(self.path),
            "source_kind": self.kind,
            "num_documents": self.num_documents,
            "num_tokens": self.num_tokens,
            "tokens_with_eos": self.num_tokens + (0 if self.eos_stored else self.num_documents),
            "token_dtype": self.tokens.dtype.name,
            "eos": self.eos,
            "vocab_size": self.vocab_size,
            "eos_id": self.eos_id,
            "pad_id": self.pad_id,
            "identity": self.identity,
            "fingerprint": self.fingerprint,
            **({} if self.loss_mask is None else {"loss_mask_identity": self.loss_mask_identity}),
        }


def _call(fn: Any, args: tuple, kwargs: dict) -> Any:
    return fn(*args, **kwargs)


def token_memmap(path: Path | RemotePath, dtype: np.dtype, kind: str) -> np.ndarray | RemoteArray:
    """A read-only memory map of the flat token file ``path`` (an empty file gives an empty array); an object in a
    store is read by blocks on demand (a :class:`~detsampler.storage.RemoteArray`; the formats record no checksums)."""
    if not path.is_file():
        raise TokenIndexError(f"{kind} source: no token file at {str(path)!r}")
    size = path.stat().st_size
    if size % dtype.itemsize:
        raise TokenIndexError(
            f"{kind} source {str(path)!r}: {size} bytes is not a whole number of {dtype.name} tokens; check the dtype"
        )
    if size == 0:
        return np.zeros(0, dtype=dtype)
    if isinstance(path, RemotePath):
        return RemoteArray(BlockedObject(path.url, size), dtype, size // dtype.itemsize, 0)
    return np.memmap(path, dtype=dtype, mode="r")


def mask_memmap(path: Path, num_tokens: int, kind: str, token_path: Path) -> np.ndarray:
    """A read-only memory map of a pre-tokenized corpus's per-token loss mask (one byte a token, nonzero: the token is
    a trained target: OLMo-core's ``label_mask_paths`` arrays, datatrove's ``.loss`` files), checked to have one byte
    per token of ``token_path``."""
    if not path.is_file():
        raise TokenIndexError(f"{kind} source {str(token_path)!r}: no loss mask file at {str(path)!r}")
    size = path.stat().st_size
    if size != num_tokens:
        raise TokenIndexError(
            f"{kind} source {str(token_path)!r}: its loss mask {str(path)!r} holds {size} bytes, not one per token"
            f" ({num_tokens}): it belongs to another token file"
        )
    return np.zeros(0, dtype=np.uint8) if size == 0 else np.memmap(path, dtype=np.uint8, mode="r")


_CHUNK = 1 << 16  # bytes per chunk whose min and max id a scan records (the index's checksum chunk)
_SCAN_BYTES = 1 << 22  # bytes read at a time by a scan (with pread: no file page stays mapped)
_SCAN_VERSION = 2  # the cached scan's content; 1 was the document starts alone, keyed by inode and mtime
PLAUSIBLE_IDS = 1 << 24  # ids at or past this need a vocab_size given: no vocabulary is that large


@dataclass(frozen=True)
class SourceScan:
    """What one pass over a source's token file found: ``starts`` (document starts; the format's own, or split after
    each EOS), per 64 KiB chunk the smallest and largest id (``chunk_min``, ``chunk_max``), the largest id at an odd
    position of the first 4 MiB (``odd_max``), and, where asked, how many documents do not end in the EOS
    (``bad_ends``, the first being ``first_bad_end``, -1 when none)."""

    starts: np.ndarray
    chunk_min: np.ndarray
    chunk_max: np.ndarray
    odd_max: int
    bad_ends: int
    first_bad_end: int


def _stamp(files: Sequence[Path | RemotePath]) -> tuple[str | None, str | None]:
    """(the files' stamp, None), or (None, the URL of an object no stamp can be trusted for).

    A file: its device, inode, size, mtime and ctime. ctime cannot be set from user space, so any write (its mtime
    restored or not) names another cache entry; a copy (new inode and ctime) is scanned again: content decides. An
    object: its URL, size and version (ETag and time of the last write), where its server sends a strong ETag (which
    changes with the bytes, RFC 9110); without one (a plain HTTP server: Last-Modified alone, to the second) or with a
    weak one (``W/``), an edit that keeps the size and time would keep the stamp: no stamp."""
    remote = [f for f in files if isinstance(f, RemotePath)]
    if remote:
        versions = [(str(f), store_for(str(f)).version(str(f))) for f in remote]
        for url, (_, etag, _) in versions:
            if etag in ("None", "") or etag.startswith("W/"):
                return None, url
        return hashlib.sha256(repr(versions).encode()).hexdigest()[:16], None
    stats = [os.stat(f) for f in files]
    key = [(s.st_dev, s.st_ino, s.st_size, s.st_mtime_ns, s.st_ctime_ns) for s in stats]
    return hashlib.sha256(repr(key).encode()).hexdigest()[:16], None


@contextlib.contextmanager
def _reader(path: Path | RemotePath) -> Iterator[Callable[[int, int], bytes]]:
    """``pread(n, offset)`` over ``path``: the file's, or ranged reads of an object (ending at its end)."""
    if isinstance(path, RemotePath):
        store, size = store_for(path.url), path.stat().st_size
        yield lambda n, at: store.read_ranges(path.url, [(at, min(size, at + n))])[0]
        return
    with open(path, "rb") as f:
        yield lambda n, at: os.pread(f.fileno(), n, at)


def _scan(
    token_file: Path | RemotePath,
    dtype: np.dtype,
    num_tokens: int,
    starts: np.ndarray | None,
    split_eos: int | None,
    end_eos: int | None,
) -> SourceScan:
    per_chunk = _CHUNK // dtype.itemsize
    step = _SCAN_BYTES // dtype.itemsize  # a whole number of chunks, an even number of tokens
    n_chunks = -(-num_tokens // per_chunk)
    cmin = np.zeros(n_chunks, np.int64)
    cmax = np.zeros(n_chunks, np.int64)
    odd_max = np.iinfo(np.int64).min
    eos_ends, bad = [], []
    last = starts[1:] - 1 if starts is not None and end_eos is not None else None  # each document's last token
    with _reader(token_file) as pread:
        for t0 in range(0, num_tokens, step):
            block = np.frombuffer(pread(step * dtype.itemsize, t0 * dtype.itemsize), dtype=dtype)
            full = block.size // per_chunk * per_chunk
            c0 = t0 // per_chunk
            if full:
                cells = block[:full].reshape(-1, per_chunk)
                cmin[c0 : c0 + cells.shape[0]] = cells.min(axis=1)
                cmax[c0 : c0 + cells.shape[0]] = cells.max(axis=1)
            if full < block.size:
                cmin[c0 + full // per_chunk] = block[full:].min()
                cmax[c0 + full // per_chunk] = block[full:].max()
            if t0 == 0 and block.size > 1:  # the first 4 MiB: a 32-bit file read as 16-bit shows it anywhere
                odd_max = int(block[1::2].max())
            if split_eos is not None:
                eos_ends.append(np.flatnonzero(block == split_eos) + (t0 + 1))
            if last is not None:
                lo, hi = np.searchsorted(last, [t0, t0 + block.size])
                here = last[lo:hi]
                bad.append(lo + np.flatnonzero(block[here - t0] != end_eos))
    if split_eos is not None:
        ends = np.concatenate(eos_ends) if eos_ends else np.zeros(0, np.int64)
        if num_tokens and (not ends.size or ends[-1] != num_tokens):
            ends = np.append(ends, num_tokens)  # a last document without an EOS ends at the end
        starts = np.zeros(ends.size + 1, np.int64)
        starts[1:] = ends
    bad_docs = np.concatenate(bad) if bad else np.zeros(0, np.int64)
    return SourceScan(
        np.asarray(starts, dtype=np.int64),
        cmin,
        cmax,
        odd_max,
        int(bad_docs.size),
        int(bad_docs[0]) if bad_docs.size else -1,
    )


def scan_source(
    kind: str,
    identity: str,
    token_file: Path,
    dtype: np.dtype,
    num_tokens: int,
    files: Sequence[str | os.PathLike],
    *,
    starts: Callable[[], np.ndarray] | None = None,
    split_eos: int | None = None,
    end_eos: int | None = None,
) -> SourceScan:
    """One pass over ``token_file`` (see :class:`SourceScan`): document starts from ``starts()`` (a metadata parse) or
    split after each ``split_eos``; with ``end_eos``, the documents whose last token is not it. Kept in
    ``$DETSAMPLER_CACHE/sources`` under the source's identity and the stamp of every one of its ``files``
    (:func:`_stamp`), with a CRC-32 of its arrays checked on every load, so that only the first open of a file pays
    for the pass. A cached scan that cannot be read or fails its CRC is scanned again with one warning line and
    replaced (written atomically); an object whose server sends no strong ETag is scanned at every open, never cached
    (one warning line says why); an unwritable cache only means scanning again."""
    files = [as_path(f) for f in files]

    def scan() -> SourceScan:
        return _scan(token_file, dtype, num_tokens, starts() if starts is not None else None, split_eos, end_eos)

    stamp, untrusted = _stamp(files)
    if stamp is None:
        logger.warning(
            "detsampler: %s: the server sends no strong ETag, so an edit that keeps the object's size and time could"
            " not be told from a cached scan: scanned again at every open, not cached",
            untrusted,
        )
        return scan()
    mode = f"{dtype.name}-split{split_eos}-end{end_eos}"
    name = f"{kind}-{identity[:32]}-{hashlib.sha256(mode.encode()).hexdigest()[:8]}-{stamp}-v{_SCAN_VERSION}"
    path = default_cache_dir() / "sources" / f"{name}.npz"
    cached = _load_scan(path)
    if cached is not None:
        return cached
    found = scan()
    _save_scan(path, found)
    return found


_SCAN_FIELDS = ("starts", "chunk_min", "chunk_max", "ints")


def _load_scan(path: Path) -> SourceScan | None:
    """The scan cached at ``path``; None when there is none, or (with one warning line) when it cannot be read or
    fails its CRC-32 (a bit flip, a truncation: the caller scans again and replaces it)."""
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in _SCAN_FIELDS}
            crc = int(z["crc"])
        if crc != _crc(arrays):
            raise ValueError("its CRC-32 does not match its arrays")
        ints = arrays["ints"]
        return SourceScan(arrays["starts"], arrays["chunk_min"], arrays["chunk_max"], *map(int, ints))
    except (ValueError, OSError, KeyError, TypeError, EOFError, zipfile.BadZipFile, zlib.error) as exc:
        why = " ".join(str(exc).split())
        logger.warning(
            "detsampler: the cached scan %r is damaged (%s: %s): scanned again, and the cache replaced",
            str(path),
            type(exc).__name__,
            why,
        )
        return None


def _save_scan(path: Path, scan: SourceScan) -> None:
    """Write ``scan`` at ``path`` atomically (a temporary file renamed over it); an unwritable cache is skipped."""
    arrays = {
        "starts": scan.starts,
        "chunk_min": scan.chunk_min,
        "chunk_max": scan.chunk_max,
        "ints": np.array([scan.odd_max, scan.bad_ends, scan.first_bad_end], dtype=np.int64),
    }
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            np.savez(f, crc=np.int64(_crc(arrays)), **arrays)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()


def _crc(arrays: dict[str, np.ndarray]) -> int:
    crc = 0
    for k in sorted(arrays):
        a = np.ascontiguousarray(arrays[k], dtype=np.int64)
        crc = zlib.crc32(a.tobytes(), zlib.crc32(f"{k}:{a.size}".encode(), crc))
    return crc


def check_scan(
    kind: str,
    path: Path,
    scan: SourceScan,
    tokens: np.ndarray,
    vocab_size: int | None,
    eos_id: int | None,
    end_eos: bool,
) -> None:
    """Refuse a source whose ids fall outside the vocabulary it is read with (``vocab_size``; when None, ids past
    :data:`PLAUSIBLE_IDS`), whose every odd-position id of the first 4 MiB is 0 (a 32-bit file read as 16-bit), or
    (``end_eos``) of whose documents half or more do not end in the EOS (boundaries that do not belong to the token
    file)."""
    where = f"{kind} source {str(path)!r}"
    if not scan.chunk_min.size:
        return
    lo, hi = int(scan.chunk_min.min()), int(scan.chunk_max.max())
    bound = vocab_size if vocab_size is not None else min(int(np.iinfo(tokens.dtype).max) + 1, PLAUSIBLE_IDS)
    if lo < 0 or hi >= bound:
        c = int(np.flatnonzero((scan.chunk_min < 0) | (scan.chunk_max >= bound))[0])
        per_chunk = _CHUNK // tokens.dtype.itemsize
        cell = np.asarray(tokens[c * per_chunk : (c + 1) * per_chunk])
        first = c * per_chunk + int(np.flatnonzero((cell < 0) | (cell >= bound))[0])
        if vocab_size is None and lo >= 0:
            raise TokenIndexError(
                f"{where}: token ids up to {hi} (first at token {first}), and no vocabulary has that many ids: "
                f"is its dtype {tokens.dtype.name} the one it was written with? (pass vocab_size= if it is)"
            )
        given = f"vocab_size={vocab_size}" if vocab_size is not None else f"its dtype {tokens.dtype.name}"
        raise TokenIndexError(
            f"{where}: token ids span [{lo}, {hi}], outside the vocabulary [0, {bound}) it is read with ({given}); "
            f"first out of range at token {first}"
        )
    if tokens.size >= 64 and scan.odd_max == 0 and tokens.dtype.itemsize == 2:
        wider = np.dtype(f"{tokens.dtype.kind}{tokens.dtype.itemsize * 2}").name
        raise TokenIndexError(
            f"{where}: every token at an odd position (of its first {min(tokens.size, _SCAN_BYTES // 2):,}) is 0, "
            f"as when a {wider} file is read as "
            f"{tokens.dtype.name}; open it with dtype={wider!r}"
        )
    n_docs = scan.starts.size - 1
    if end_eos and eos_id is not None and n_docs and 2 * scan.bad_ends >= n_docs:
        d = scan.first_bad_end
        raise TokenIndexError(
            f"{where}: {scan.bad_ends} of its {n_docs} documents do not end in the EOS {eos_id} (document {d} ends "
            f"in {int(tokens[int(scan.starts[d + 1]) - 1])}): its index does not belong to its token file, or it "
            "stores no EOS (open it with eos='virtual')"
        )
