"""Indexes of document lengths only (no tokens stored): written from lengths given chunk by chunk, in O(chunk) memory.

:func:`write_lengths_index` is the writer; :func:`synthetic_index` feeds it seeded random lengths, for scale tests and
benchmarks (10^8 documents and more, no text, no tokenizer). Such an index opens as any other ``TokenIndex`` (with
``store_tokens`` False); its layouts, plans and ``locate`` work unchanged. On disk it is index format 3
(:data:`~detsampler.index.format.LENGTHS_FORMAT_VERSION`): ``lengths.npy`` as int32 and its checksums, no
``offsets.npy`` (4 bytes per document: 4 GB at 10^9 documents).

Invariant: the directory appears under its final name only once complete (temporary directory, fsync, sealed
``meta.json`` last, rename), as for :func:`~detsampler.index.build.build_index`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from detsampler.atomic import fsync_dir, fsync_file
from detsampler.index.checksums import write_checksums
from detsampler.index.format import INDEX_KIND, LENGTHS_FORMAT_VERSION, seal_meta
from detsampler.index.reader import TokenIndex
from detsampler.version import __version__

__all__ = ["synthetic_index", "synthetic_lengths", "write_lengths_index"]

CHUNK_DOCS = 1 << 22
LENGTHS_DTYPE = np.dtype(np.int32)


def _write_lengths(tmp: Path, chunks: Iterable[np.ndarray], num_documents: int, progress: bool) -> int:
    """``lengths.npy`` (int32: 4 bytes per document) from ``chunks``; returns the number of tokens."""
    from tqdm.auto import tqdm

    lengths = np.lib.format.open_memmap(tmp / "lengths.npy", mode="w+", dtype=LENGTHS_DTYPE, shape=(num_documents,))
    done, num_tokens = 0, 0
    with tqdm(
        total=num_documents, unit="doc", desc="lengths", disable=not progress, file=sys.stderr, leave=False
    ) as bar:
        for chunk in chunks:
            chunk = np.asarray(chunk)
            if chunk.size and (chunk.min() < 0 or chunk.max() > np.iinfo(LENGTHS_DTYPE).max):
                bad = int(chunk.min()) if chunk.min() < 0 else int(chunk.max())
                raise ValueError(f"document lengths must be in [0, 2^31), got {bad}")
            if done + len(chunk) > num_documents:
                raise ValueError(f"got more than {num_documents} document lengths")
            lengths[done : done + len(chunk)] = chunk
            num_tokens += int(chunk.sum(dtype=np.int64))
            done += len(chunk)
            bar.update(len(chunk))
    if done != num_documents:
        raise ValueError(f"got {done} document lengths, expected {num_documents}")
    lengths.flush()
    del lengths
    fsync_file(tmp / "lengths.npy")
    return num_tokens


def write_lengths_index(
    root: str | os.PathLike,
    chunks: Iterable[np.ndarray],
    num_documents: int,
    identity: dict,
    vocab_size: int = 1 << 16,
    eos_id: int = 2,
    pad_id: int = 3,
    progress: bool = False,
) -> TokenIndex:
    """Write (or open, if present) the lengths-only index of ``num_documents`` documents whose lengths ``chunks`` yields
    in order, under ``root/index-<key>``; ``identity`` (JSON) names its content and makes the key."""
    key = hashlib.sha256(json.dumps({"format_version": LENGTHS_FORMAT_VERSION, **identity}, sort_keys=True).encode())
    key = key.hexdigest()[:20]
    root = Path(root)
    final = root / f"index-{key}"
    if (final / "meta.json").is_file():
        return TokenIndex.open(final)
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".tmp-index-{key}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        start = time.perf_counter()
        num_tokens = _write_lengths(tmp, chunks, num_documents, progress)
        meta = {
            "kind": INDEX_KIND,
            "format_version": LENGTHS_FORMAT_VERSION,
            "detsampler_version": __version__,
            "cache_key": key,
            "dataset_fingerprint": "lengths:" + key,
            "dataset_num_rows": num_documents,
            "text_column": "text",
            "store_tokens": False,
            "identity": identity,
            "token_dtype": "uint16" if vocab_size <= 1 << 16 else "uint32",
            "tokenizer": {"vocab_size": vocab_size, "eos_id": eos_id, "pad_id": pad_id, "sha256": None, "path": None},
            "num_documents": num_documents,
            "num_tokens": num_tokens,
            "files": {"lengths.npy": {**write_checksums(tmp, "lengths.npy"), "dtype": LENGTHS_DTYPE.name}},
            "build": {"seconds": round(time.perf_counter() - start, 3), "num_proc": 1},
        }
        (tmp / "meta.json").write_text(json.dumps(seal_meta(meta), indent=2, sort_keys=True) + "\n")
        fsync_file(tmp / "meta.json")
        fsync_dir(tmp)
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    fsync_dir(root)
    return TokenIndex.open(final)


def synthetic_lengths(num_documents: int, mean_length: int, seed: int, chunk: int = CHUNK_DOCS) -> Iterator[np.ndarray]:
    """Seeded document lengths, uniform in ``[1, 2 * mean_length)``, ``chunk`` at a time (chunk ``i`` seeded by
    ``(seed, i)``: the same lengths whatever is read before)."""
    for i, a in enumerate(range(0, num_documents, chunk)):
        rng = np.random.default_rng([seed, i])
        yield rng.integers(1, 2 * mean_length, size=min(chunk, num_documents - a), dtype=np.int64)


def synthetic_index(
    root: str | os.PathLike, num_documents: int, mean_length: int = 1000, seed: int = 0, progress: bool = False
) -> TokenIndex:
    """The lengths-only index of ``num_documents`` seeded random lengths (see :func:`synthetic_lengths`) under
    ``root``."""
    identity = {
        "synthetic": True,
        "num_documents": num_documents,
        "mean_length": mean_length,
        "seed": seed,
        "chunk": CHUNK_DOCS,
    }
    chunks = synthetic_lengths(num_documents, mean_length, seed)
    return write_lengths_index(root, chunks, num_documents, identity, progress=progress)
