"""A pre-tokenized corpus opened as an index: the format's own document boundaries over a memory map of its tokens.

Invariants: the tokens are never copied (``tokens`` is a read-only memory map of the format's own file); only per
document arrays (``lengths``, ``offsets``: 16 bytes a document) are held in memory. Document ``d``'s stored tokens are
``tokens[offsets[d] : offsets[d + 1]]``, exactly the format's own. With ``eos="real"`` (the default) a document's last
stored token sits at its EOS position (``lengths[d] = stored - 1``), so samples read exactly the stored tokens, no token
added or dropped; with ``eos="virtual"`` an EOS (``eos_id``) is read after each document's stored tokens. The
``identity`` hashes the files' sizes, their small index files whole and sampled blocks of the token file, never a path.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from detsampler.index.format import TokenIndexError, default_cache_dir
from detsampler.layout import Layout, LayoutConfig, make_layout
from detsampler.text.policy import SpecialTokens

__all__ = ["EOS_SOURCE_MODES", "TokenSource", "cached_starts", "sampled_sha256"]

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
        with open(p, "rb") as f:
            starts = [0, max(0, size - (1 << 20))] + [size * i // _BLOCKS for i in range(1, _BLOCKS)]
            for start in starts:
                h.update(os.pread(f.fileno(), 1 << 20 if start in starts[:2] else _BLOCK, start))
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
        self.kind, self.path, self.tokens = kind, Path(path), tokens
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
        self.identity = identity
        fn, args, format_options = reopen  # the reading options shared by every format are added here, once
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
    def fingerprint(self) -> str:
        """The source's content identity with how it is read (EOS mode and id): what a plan over it depends on."""
        key = f"{self.kind}|{self.identity}|{self.eos}|{self.eos_id}|{self.pad_id}"
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
        }


def _call(fn: Any, args: tuple, kwargs: dict) -> Any:
    return fn(*args, **kwargs)


def token_memmap(path: Path, dtype: np.dtype, kind: str) -> np.ndarray:
    """A read-only memory map of the flat token file ``path`` (an empty file gives an empty array)."""
    if not path.is_file():
        raise TokenIndexError(f"{kind} source: no token file at {str(path)!r}")
    size = path.stat().st_size
    if size % dtype.itemsize:
        raise TokenIndexError(
            f"{kind} source {str(path)!r}: {size} bytes is not a whole number of {dtype.name} tokens; check the dtype"
        )
    if size == 0:
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r")


def cached_starts(
    kind: str, identity: str, mode: str, compute: Callable[[], np.ndarray], files: Sequence[str | os.PathLike]
) -> np.ndarray:
    """Document starts found by ``compute`` (an EOS scan or a metadata parse), kept in ``$DETSAMPLER_CACHE/sources``
    under the source's content identity, so that only the first open of a file pays for the scan. The cache file is
    written atomically; an unwritable cache only means computing again."""
    # the local file's own stamp too: a file edited in place (same size, unsampled bytes changed) is never misread
    files = [Path(f) for f in files]
    stamp = hashlib.sha256(repr([(f.stat().st_dev, f.stat().st_ino, f.stat().st_mtime_ns) for f in files]).encode())
    path = default_cache_dir() / "sources" / f"{kind}-{identity[:32]}-{mode}-{stamp.hexdigest()[:12]}.npy"
    if path.is_file():
        try:
            return np.load(path, allow_pickle=False)
        except (ValueError, OSError):
            pass  # a damaged cache file: compute and rewrite it
    starts = compute()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}")
        with open(tmp, "wb") as f:
            np.save(f, starts)
        os.replace(tmp, path)
    except OSError:
        pass
    return starts
