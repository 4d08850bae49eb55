"""The token index: per-document token counts, their offsets and (optionally) the concatenated tokens, on disk.

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
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
import uuid
from collections import deque
from concurrent.futures import ProcessPoolExecutor
from itertools import chain
from multiprocessing import get_all_start_methods, get_context
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np
from filelock import FileLock

from detsampler.keys import stable_hash64
from detsampler.layout import Layout, LayoutConfig, make_layout
from detsampler.tokenizer import Tokenizer
from detsampler.version import MAPPING_VERSION, __version__

__all__ = [
    "INDEX_FORMAT_VERSION",
    "TokenIndexError",
    "TokenIndex",
    "check_texts",
    "dataset_fingerprint",
    "default_cache_dir",
    "token_dtype",
]

INDEX_FORMAT_VERSION = 1
_KIND = "detsampler-token-index"
_HEADER_BYTES = 128  # a 1-D .npy v1.0 header is always 128 bytes (checked when written)
_BATCH_DOCS = 64  # documents per tokenization task


class TokenIndexError(ValueError):
    """An index that is missing, incomplete, corrupt, or built from another dataset or tokenizer."""


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
            "detsampler.corpus.load_corpus or datasets"
        )
    return fp


def check_texts(texts: Sequence[Any], first_doc: int, text_column: str) -> None:
    """Raise a ValueError naming the first document whose ``text_column`` is not a string."""
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            got = "None" if text is None else f"a {type(text).__name__}"
            raise ValueError(
                f"document {first_doc + i}: column {text_column!r} holds {got}, not a string; drop or fill such rows "
                f"first, e.g. dataset.filter(lambda row: isinstance(row[{text_column!r}], str))"
            )


# -- tokenization ----------------------------------------------------------------------------------------------------------

_WORKER_TOKENIZER: Tokenizer | None = None


def _init_worker(tokenizer: Tokenizer) -> None:
    global _WORKER_TOKENIZER
    _WORKER_TOKENIZER = tokenizer
    parent = os.getppid()

    def exit_with_parent() -> None:  # a killed build must not leave its tokenizer processes behind
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    import threading

    threading.Thread(target=exit_with_parent, daemon=True).start()


def encode_documents(tokenizer: Tokenizer, texts: Sequence[Any], first_doc: int, text_column: str, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """Tokenize ``texts`` (documents ``first_doc, ...``): their lengths (int64) and their tokens concatenated (``dtype``)."""
    check_texts(texts, first_doc, text_column)
    ids = tokenizer.encode_batch(texts)
    lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
    flat = np.fromiter(chain.from_iterable(ids), dtype=dtype, count=int(lengths.sum()))
    return lengths, flat


def _encode_task(args: tuple[list[Any], int, str, str]) -> tuple[np.ndarray, np.ndarray]:
    texts, first_doc, text_column, dtype = args
    assert _WORKER_TOKENIZER is not None
    return encode_documents(_WORKER_TOKENIZER, texts, first_doc, text_column, np.dtype(dtype))


def _text_batches(dataset: Any, text_column: str, batch_docs: int) -> Iterator[tuple[list[Any], int]]:
    column = dataset.with_format(None).select_columns([text_column])
    first = 0
    for batch in column.iter(batch_size=batch_docs):
        texts = batch[text_column]
        yield texts, first
        first += len(texts)


def _tokenize(dataset: Any, tokenizer: Tokenizer, text_column: str, num_proc: int, dtype: np.dtype, progress: bool) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(lengths, tokens) of consecutive batches of documents, in dataset order, tokenized by ``num_proc`` processes."""
    from tqdm.auto import tqdm

    bar = tqdm(total=len(dataset), unit="doc", desc="tokenizing", disable=not progress, file=sys.stderr, leave=False)
    try:
        batches = _text_batches(dataset, text_column, _BATCH_DOCS)
        if num_proc == 1:
            for texts, first in batches:
                out = encode_documents(tokenizer, texts, first, text_column, dtype)
                bar.update(len(texts))
                yield out
            return
        # fork where available: workers start at once and inherit the tokenizer; it also pickles (as its model) elsewhere
        ctx = get_context("fork") if "fork" in get_all_start_methods() else None
        with ProcessPoolExecutor(num_proc, mp_context=ctx, initializer=_init_worker, initargs=(tokenizer,)) as pool:
            pending: deque = deque()
            for texts, first in batches:  # at most 4 * num_proc batches in flight: memory stays bounded
                pending.append((len(texts), pool.submit(_encode_task, (texts, first, text_column, dtype.str))))
                while len(pending) >= 4 * num_proc:
                    n, fut = pending.popleft()
                    yield fut.result()
                    bar.update(n)
            while pending:
                n, fut = pending.popleft()
                yield fut.result()
                bar.update(n)
    finally:
        bar.close()


# -- files -----------------------------------------------------------------------------------------------------------------


def _fsync_file(path: Path) -> None:
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def _npy_header(dtype: np.dtype, n: int) -> bytes:
    import io

    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": (n,)})
    header = buf.getvalue()
    if len(header) != _HEADER_BYTES:  # pragma: no cover - numpy's v1.0 header layout is fixed
        raise RuntimeError(f"unexpected .npy header size {len(header)}")
    return header


def _save_npy(path: Path, array: np.ndarray) -> None:
    with open(path, "wb") as f:
        np.lib.format.write_array(f, np.ascontiguousarray(array), version=(1, 0), allow_pickle=False)
        f.flush()
        os.fsync(f.fileno())


def _write_index(tmp: Path, dataset: Any, tokenizer: Tokenizer, text_column: str, num_proc: int, store_tokens: bool, progress: bool, key: str) -> dict:
    dtype = token_dtype(tokenizer.vocab_size)
    start = time.perf_counter()
    lengths_parts: list[np.ndarray] = []
    num_tokens = 0
    tokens_file = open(tmp / "tokens.npy", "wb") if store_tokens else None
    try:
        if tokens_file is not None:
            tokens_file.write(b"\0" * _HEADER_BYTES)
        for lengths, flat in _tokenize(dataset, tokenizer, text_column, num_proc, dtype, progress):
            lengths_parts.append(lengths)
            num_tokens += int(flat.size)
            if tokens_file is not None:
                tokens_file.write(flat.tobytes())
        if tokens_file is not None:
            tokens_file.seek(0)
            tokens_file.write(_npy_header(dtype, num_tokens))
            tokens_file.flush()
            os.fsync(tokens_file.fileno())
    finally:
        if tokens_file is not None:
            tokens_file.close()
    seconds = time.perf_counter() - start
    lengths = np.concatenate(lengths_parts) if lengths_parts else np.zeros(0, np.int64)
    if lengths.size != len(dataset):  # pragma: no cover - guards the batching
        raise RuntimeError(f"tokenized {lengths.size} documents of {len(dataset)}")
    offsets = np.zeros(lengths.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    _save_npy(tmp / "lengths.npy", lengths)
    _save_npy(tmp / "offsets.npy", offsets)
    names = ["lengths.npy", "offsets.npy"] + (["tokens.npy"] if store_tokens else [])
    files = {name: {"size": (tmp / name).stat().st_size, "sha256": _sha256_file(tmp / name)} for name in names}
    meta = {
        "kind": _KIND,
        "format_version": INDEX_FORMAT_VERSION,
        "detsampler_version": __version__,
        "cache_key": key,
        "dataset_fingerprint": dataset_fingerprint(dataset),
        "dataset_num_rows": len(dataset),
        "text_column": text_column,
        "store_tokens": store_tokens,
        "tokenizer": tokenizer.describe(),
        "token_dtype": dtype.name,
        "num_documents": int(lengths.size),
        "num_tokens": int(num_tokens),
        "files": files,
        "build": {"seconds": round(seconds, 3), "tokens_per_second": round(num_tokens / max(seconds, 1e-9)), "num_proc": num_proc},
    }
    meta_tmp = tmp / "meta.json.tmp"
    meta_tmp.write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    _fsync_file(meta_tmp)
    os.replace(meta_tmp, tmp / "meta.json")  # meta.json last: a directory without it never opens
    _fsync_dir(tmp)
    if progress:
        print(
            f"detsampler: tokenized {lengths.size} documents, {num_tokens} tokens in {seconds:.2f} s "
            f"({num_tokens / max(seconds, 1e-9):,.0f} tokens/s, num_proc={num_proc})",
            file=sys.stderr,
        )
    return meta


def _initialized_dist() -> Any:
    """``torch.distributed`` when it is imported, initialized and has more than one rank (torch is never imported here)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized() or dist.get_world_size() < 2:
        return None
    return dist


# -- the index -------------------------------------------------------------------------------------------------------------


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
        h = hashlib.sha256(
            json.dumps(
                {
                    "format_version": INDEX_FORMAT_VERSION,
                    "dataset": dataset_fingerprint(dataset),
                    "num_rows": len(dataset),
                    "tokenizer": tokenizer.sha256,
                    "text_column": text_column,
                    "store_tokens": bool(store_tokens),
                },
                sort_keys=True,
            ).encode()
        )
        return h.hexdigest()[:20]

    # -- build / open
    @classmethod
    def build(
        cls,
        dataset: Any,
        tokenizer: Tokenizer,
        text_column: str = "text",
        cache_dir: str | os.PathLike | None = None,
        num_proc: int = 1,
        store_tokens: bool = True,
        progress: bool = True,
    ) -> TokenIndex:
        """Open the cached index of ``dataset`` under ``tokenizer``, building it first if it does not exist.

        One process builds, the others wait and open: with torch.distributed initialized, rank 0 builds and the others wait
        at a barrier; always, a file lock on the cache entry serializes builders across processes and jobs.
        """
        from detsampler.corpus import check_text_column

        check_text_column(dataset, text_column)
        if isinstance(num_proc, bool) or not isinstance(num_proc, int) or num_proc < 1:
            raise ValueError(f"num_proc must be an integer >= 1, got {num_proc!r}")
        if not isinstance(tokenizer, Tokenizer):
            raise ValueError(f"tokenizer must be a detsampler.tokenizer.Tokenizer, got {type(tokenizer).__name__}")
        key = cls.cache_key(dataset, tokenizer, text_column, store_tokens)
        root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        root.mkdir(parents=True, exist_ok=True)
        final = root / f"index-{key}"
        dist = _initialized_dist()
        if dist is None and (final / "meta.json").is_file():
            # complete by construction (renamed into place): no lock needed, so a read-only cache works. (With
            # torch.distributed every rank goes through the barrier below, whatever it finds, so none is left waiting.)
            return cls.open(final, dataset=dataset, tokenizer=tokenizer)
        if dist is not None and dist.get_rank() != 0:
            dist.barrier()  # rank 0 builds first
            if not (final / "meta.json").is_file():
                raise TokenIndexError(f"rank 0 did not build the index {str(final)!r}; see rank 0's error")
            return cls.open(final, dataset=dataset, tokenizer=tokenizer)
        try:
            return cls._build_locked(root, final, key, dataset, tokenizer, text_column, num_proc, store_tokens, progress)
        finally:
            if dist is not None:
                dist.barrier()

    @classmethod
    def _build_locked(cls, root: Path, final: Path, key: str, dataset: Any, tokenizer: Tokenizer, text_column: str, num_proc: int, store_tokens: bool, progress: bool) -> TokenIndex:
        if (final / "meta.json").is_file():  # complete: open without the lock
            return cls.open(final, dataset=dataset, tokenizer=tokenizer)
        with FileLock(str(root / f"index-{key}.lock")):
            if final.exists():
                return cls.open(final, dataset=dataset, tokenizer=tokenizer)
            for stale in root.glob(f".tmp-index-{key}-*"):  # left by killed builders; we hold the lock
                shutil.rmtree(stale, ignore_errors=True)
            tmp = root / f".tmp-index-{key}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            tmp.mkdir()
            try:
                _write_index(tmp, dataset, tokenizer, text_column, num_proc, store_tokens, progress, key)
                os.rename(tmp, final)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            _fsync_dir(root)
        return cls.open(final, dataset=dataset, tokenizer=tokenizer)

    @classmethod
    def open(cls, path: str | os.PathLike, dataset: Any = None, tokenizer: Tokenizer | None = None, verify_tokens: bool = False) -> TokenIndex:
        """Open the index at ``path``, checking format version, file sizes, shapes and the small files' sha256.

        With ``dataset`` / ``tokenizer``, also check that they are the ones it was built from; ``verify_tokens`` also checks
        the token file's sha256 (reads it all). Every mismatch is an :class:`TokenIndexError` naming what differs.
        """
        path = Path(path)
        meta_path = path / "meta.json"
        if not meta_path.is_file():
            raise TokenIndexError(
                f"no index at {str(path)!r} (no meta.json: never built, or the build was interrupted); build it with "
                "TokenIndex.build or `detsampler build`"
            )
        try:
            meta = json.loads(meta_path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise TokenIndexError(f"index {str(path)!r}: meta.json is not valid JSON ({exc}); delete the directory and rebuild") from None
        if not isinstance(meta, dict) or meta.get("kind") != _KIND:
            raise TokenIndexError(f"{str(path)!r} is not a detsampler token index (meta.json kind is not {_KIND!r})")
        if meta.get("format_version") != INDEX_FORMAT_VERSION:
            raise TokenIndexError(
                f"index {str(path)!r} has format version {meta.get('format_version')!r}, this detsampler reads version "
                f"{INDEX_FORMAT_VERSION}; delete the directory and rebuild"
            )
        try:
            n_docs, n_tok = int(meta["num_documents"]), int(meta["num_tokens"])
            files = meta["files"]
            store = bool(meta["store_tokens"])
            vocab = int(meta["tokenizer"]["vocab_size"])
        except (KeyError, TypeError, ValueError) as exc:
            raise TokenIndexError(f"index {str(path)!r}: meta.json lacks or mangles {exc}; delete the directory and rebuild") from None
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
            if _sha256_file(path / name) != files[name]["sha256"]:
                raise TokenIndexError(f"index {str(path)!r}: {name}'s sha256 differs from the recorded one: the file was edited; delete the directory and rebuild")
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
                "since the build; build the index again (TokenIndex.build / `detsampler build`)"
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
            tmp = cached.with_name(f".{name}.{os.getpid()}-{uuid.uuid4().hex[:8]}")
            _save_npy(tmp, layout.bins_per_window)
            os.replace(tmp, cached)
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
