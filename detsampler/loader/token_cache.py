"""A bounded, least-recently-used cache of tokenized documents, one per process (each DataLoader worker has its own).

Invariant: the cache holds at most ``max_tokens`` tokens (a document larger than that is never kept), so a worker's
memory for it is bounded whatever the corpus or step count; a hit returns the exact array that was put.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

__all__ = ["TokenCache"]


class TokenCache:
    """Document id -> its stored tokens (int64 array), at most ``max_tokens`` tokens in all; 0 disables it."""

    def __init__(self, max_tokens: int) -> None:
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0:
            raise ValueError(f"cache_tokens must be an integer >= 0, got {max_tokens!r}")
        self.max_tokens = max_tokens
        self.num_tokens = 0
        self._docs: OrderedDict[int, np.ndarray] = OrderedDict()

    def __len__(self) -> int:
        return len(self._docs)

    def get_many(self, docs: Sequence[int]) -> list[np.ndarray | None]:
        """The cached tokens of each of ``docs`` (None where absent); hits become the most recently used."""
        out: list[np.ndarray | None] = []
        for d in docs:
            part = self._docs.get(d)
            if part is not None:
                self._docs.move_to_end(d)
            out.append(part)
        return out

    def put_many(self, docs: Sequence[int], parts: Sequence[np.ndarray]) -> None:
        """Keep ``parts[i]`` as document ``docs[i]``'s tokens, evicting the least recently used past ``max_tokens``."""
        for d, part in zip(docs, parts):
            if part.size > self.max_tokens or d in self._docs:
                continue
            self._docs[d] = part
            self.num_tokens += part.size
        while self.num_tokens > self.max_tokens:
            _, old = self._docs.popitem(last=False)
            self.num_tokens -= old.size
