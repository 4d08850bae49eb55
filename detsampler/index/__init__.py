"""The token index: per-document token counts and (optionally) the tokens, on disk, memory-mapped.

- :mod:`~detsampler.index.reader`: :class:`TokenIndex`, opened and checked (it only reads);
- :mod:`~detsampler.index.build`: :func:`build_index`, the atomic, locked, once-per-job build;
- :mod:`~detsampler.index.tokenize`: the tokenization pool that feeds the build;
- :mod:`~detsampler.index.format`: the format version, cache key and error type;
- :mod:`~detsampler.index.files`: ``.npy`` writing and checksums;
- :mod:`~detsampler.index.sources`: pre-tokenized corpora (Megatron, OLMo, datatrove, nanoGPT) opened as index-like
  sources, memory-mapped;
- :mod:`~detsampler.index.protocol`: :class:`Index`, what every kind of index offers its readers;
- :mod:`~detsampler.index.push`: :func:`push_index`, an index uploaded to an object store (objects first, seal last).

Every path an index is opened from may be an object store URL (``s3://``, ``gs://``, ``az://``, ``https://``): see
:mod:`detsampler.storage`.
"""

from __future__ import annotations

from detsampler.index.build import build_index
from detsampler.index.format import (
    INDEX_FORMAT_VERSION,
    TokenIndexError,
    dataset_fingerprint,
    default_cache_dir,
    token_dtype,
)
from detsampler.index.protocol import Index
from detsampler.index.push import push_index
from detsampler.index.reader import TokenIndex

__all__ = [
    "INDEX_FORMAT_VERSION",
    "Index",
    "TokenIndex",
    "TokenIndexError",
    "build_index",
    "dataset_fingerprint",
    "default_cache_dir",
    "push_index",
    "token_dtype",
]
