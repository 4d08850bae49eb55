"""What every kind of index is to its readers: the :class:`Index` protocol.

A built :class:`~detsampler.index.reader.TokenIndex`, a :class:`~detsampler.index.sharded.ShardedIndex` and a
pre-tokenized :class:`~detsampler.index.sources.base.TokenSource` all satisfy it, on disk or in an object store; the
layouts (:mod:`detsampler.index.layouts`) and the loader depend on this protocol, never on a concrete class, so that the
index package is a tree: ``layouts`` imports none of ``reader``, ``sharded`` or ``sources``.

Invariant (per implementation): document ``d``'s stored tokens are ``tokens[offsets[d] : offsets[d + 1]]`` and it has
``lengths[d]`` positions before its EOS; ``fingerprint`` names the content (equal fingerprints read equal tokens);
the object pickles as where it opens again, never as its arrays.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np

from detsampler.text.policy import SpecialTokens

__all__ = ["Index"]


@runtime_checkable
class Index(Protocol):
    """The read surface of an index (see the module doc); ``lengths``, ``offsets`` and ``tokens`` are 1-D arrays or
    array-likes (checked memory maps, remote arrays, a sharded view); ``tokens`` and ``offsets`` may be None for an
    index that stores no tokens."""

    path: Any
    lengths: Any
    offsets: Any
    tokens: Any

    @property
    def num_documents(self) -> int: ...

    @property
    def num_tokens(self) -> int: ...

    @property
    def fingerprint(self) -> str: ...

    @property
    def eos_id(self) -> int: ...

    @property
    def pad_id(self) -> int: ...

    @property
    def vocab_size(self) -> int: ...

    @property
    def eos_stored(self) -> bool: ...

    @property
    def store_tokens(self) -> bool: ...

    @property
    def special_tokens(self) -> SpecialTokens: ...

    def document_tokens(self, doc: int) -> np.ndarray: ...

    def check_tokenizer(self, tokenizer: Any) -> None: ...

    def check_dataset(self, dataset: Any, text_column: str | None = None) -> None: ...

    def layout(self, config: Any) -> Any: ...

    def summary(self) -> dict: ...
