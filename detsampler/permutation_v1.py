"""Mapping version 1 of the keyed permutation of ``range(n)`` (kept unchanged so that runs started on it resume
exactly).

Construction: a Feistel network over ``bits = max(2, ceil(log2 n))`` bits, cut unevenly into a low part of ``bits // 2``
bits and a high part of the rest, whose round function is SplitMix64's finalizer of (low part XOR round key); each round
XORs the high part with it and rotates the two parts, so that every round is a bijection of ``[0, 2**bits)`` whatever
the parity of ``bits``. Values that land in ``[n, 2**bits)`` are walked through the network again (cycle walking), which
keeps the map a bijection of ``[0, n)``; since ``2**bits < 2n`` (for n > 4), fewer than two rounds trips are needed on
average.

Known weaknesses, fixed by version 2 (:mod:`detsampler.permutation_v2`): XOR rounds are even permutations, so the parity
of the result is a function of ``n`` alone; with a 1-bit half every round is affine over GF(2), so for ``n <= 8`` only
1344 of the ``n!`` orders are reachable.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from detsampler.keys import _M1, _M2, _S27, _S30, _S31, mix64_int, subkeys

__all__ = ["NUM_ROUNDS", "apply"]

NUM_ROUNDS = 6


@dataclass(frozen=True)
class _Network:
    """The Feistel network over ``bits`` bits with given round keys (scalars or arrays shaped like the input)."""

    bits: int
    round_keys: tuple[np.ndarray, ...]

    @property
    def _widths(self) -> tuple[np.uint64, np.uint64, np.uint64, np.uint64]:
        low = self.bits // 2
        high = self.bits - low
        return np.uint64(low), np.uint64(high), np.uint64((1 << low) - 1), np.uint64((1 << high) - 1)

    def encrypt(self, x: np.ndarray) -> None:
        """The network applied to ``x`` (uint64) in place; array round keys are shaped like ``x``."""
        low, high, low_mask, high_mask = self._widths
        lo, f, scratch = np.empty_like(x), np.empty_like(x), np.empty_like(x)
        for rk in self.round_keys:
            np.bitwise_and(x, low_mask, out=lo)
            self._round_function(lo, rk, high_mask, f, scratch)
            np.right_shift(x, low, out=x)
            np.bitwise_xor(x, f, out=x)
            np.left_shift(lo, high, out=lo)
            np.bitwise_or(x, lo, out=x)

    def decrypt(self, y: np.ndarray) -> None:
        """The inverse of :meth:`encrypt`, in place."""
        low, high, low_mask, high_mask = self._widths
        lo, f, scratch = np.empty_like(y), np.empty_like(y), np.empty_like(y)
        for rk in reversed(self.round_keys):
            np.right_shift(y, high, out=lo)
            self._round_function(lo, rk, high_mask, f, scratch)
            np.bitwise_and(y, high_mask, out=y)
            np.bitwise_xor(y, f, out=y)
            np.left_shift(y, low, out=y)
            np.bitwise_or(y, lo, out=y)

    @staticmethod
    def _round_function(lo: np.ndarray, rk: np.ndarray, mask: np.uint64, out: np.ndarray, scratch: np.ndarray) -> None:
        """``out = mix64(lo ^ rk) & mask``, in place (the same values as :func:`detsampler.keys.mix64`)."""
        np.bitwise_xor(lo, rk, out=out)
        for shift, multiplier in ((_S30, _M1), (_S27, _M2)):
            np.right_shift(out, shift, out=scratch)
            np.bitwise_xor(out, scratch, out=out)
            np.multiply(out, multiplier, out=out)
        np.right_shift(out, _S31, out=scratch)
        np.bitwise_xor(out, scratch, out=out)
        np.bitwise_and(out, mask, out=out)


def _domain_bits(n: int) -> int:
    return max(2, (int(n) - 1).bit_length())


@lru_cache(maxsize=4096)
def _scalar_round_keys(key: int) -> tuple[int, ...]:
    """The round keys of one 64-bit key (cached: a run uses a handful of keys, one per epoch)."""
    return tuple(int(subkeys(key, i)) for i in range(NUM_ROUNDS))


def _network(n: int, keys: np.ndarray) -> _Network:
    """The network for domain size ``n``; ``keys`` is a 0-d key or one key per index."""
    if keys.ndim == 0:
        return _Network(_domain_bits(n), tuple(np.uint64(k) for k in _scalar_round_keys(int(keys))))
    return _Network(_domain_bits(n), tuple(subkeys(keys, i) for i in range(NUM_ROUNDS)))


def _walk_ints(values: list[int], n: int, key: int, inverse: bool) -> list[int]:
    """The network with cycle walking on a few Python ints: the numpy path's values, without its per-call overhead."""
    bits = _domain_bits(n)
    low = bits // 2
    high = bits - low
    low_mask, high_mask = (1 << low) - 1, (1 << high) - 1
    round_keys = _scalar_round_keys(key)
    if inverse:
        round_keys = round_keys[::-1]
    out = []
    for x in values:
        while True:
            for rk in round_keys:
                if inverse:
                    lo = x >> high
                    x = (((x & high_mask) ^ (mix64_int(lo ^ rk) & high_mask)) << low) | lo
                else:
                    lo = x & low_mask
                    x = (lo << high) | ((x >> low) ^ (mix64_int(lo ^ rk) & high_mask))
            if x < n:
                break
        out.append(x)
    return out


_CHUNK = 1 << 15  # indices per pass: keeps the temporaries of a round in cache
_FEW = 48  # up to this many indices with one key, Python ints beat numpy's per-call overhead


def _trip(y: np.ndarray, where: np.ndarray | None, n: int, keys: np.ndarray, inverse: bool) -> np.ndarray:
    """One pass of the network, in place, over ``y[where]`` (all of ``y`` when ``where`` is None), chunk by chunk;
    returns the indices (into ``y``) of the values that are still outside ``[0, n)``."""
    count = y.size if where is None else where.size
    outside = []
    for lo in range(0, count, _CHUNK):
        sel = slice(lo, lo + _CHUNK) if where is None else where[lo : lo + _CHUNK]
        net = _network(n, keys[sel] if keys.ndim else keys)
        part = y[sel]  # a view for a slice, a copy for an index array
        net.decrypt(part) if inverse else net.encrypt(part)
        if where is not None:
            y[sel] = part
        walkers = np.flatnonzero(part >= np.uint64(n))
        outside.append(walkers + lo if where is None else sel[walkers])
    return np.concatenate(outside) if outside else np.zeros(0, dtype=np.int64)


def apply(y: np.ndarray, n: int, keys: np.ndarray, inverse: bool) -> np.ndarray:
    """The permutation (or its inverse) of the flat uint64 indices ``y`` (checked to be in ``[0, n)``; walked in place),
    keyed by a 0-d uint64 key or one per index; int64 out.

    Cycle walking over the whole array: each trip re-runs the network on every value still outside ``[0, n)``, so the
    shrinking tail of walkers is handled in few, large passes (and the last few in Python ints)."""
    if keys.ndim == 0 and y.size <= _FEW:
        return np.array(_walk_ints(y.tolist(), n, int(keys), inverse), dtype=np.int64)
    outside = _trip(y, None, n, keys, inverse)
    while outside.size:
        if keys.ndim == 0 and outside.size <= _FEW:
            y[outside] = _walk_ints(y[outside].tolist(), n, int(keys), inverse)
            break
        outside = _trip(y, outside, n, keys, inverse)
    return y.view(np.int64)  # every value is below 2**62: the same bits as int64
