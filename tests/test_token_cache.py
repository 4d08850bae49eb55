"""The per-worker token cache of on-the-fly reads: bounded by tokens, least recently used out first, exact hits."""

from __future__ import annotations

import numpy as np
import pytest

from detsampler.loader.token_cache import TokenCache


def test_cache_is_bounded_and_evicts_the_least_recently_used():
    cache = TokenCache(10)
    a, b, c = np.arange(4), np.arange(4, 8), np.arange(8, 12)
    cache.put_many([0, 1], [a, b])
    assert cache.get_many([0])[0] is a  # 0 is now the most recently used
    cache.put_many([2], [c])  # 12 tokens > 10: evict 1, the least recently used
    assert cache.get_many([0, 1, 2]) == [a, None, c] and cache.num_tokens == 8
    cache.put_many([3], [np.arange(11)])  # larger than the whole cache: never kept
    assert cache.get_many([3]) == [None] and cache.num_tokens <= cache.max_tokens
    off = TokenCache(0)
    off.put_many([0], [a])
    assert len(off) == 0
    with pytest.raises(ValueError, match="cache_tokens must be an integer >= 0"):
        TokenCache(-1)
