"""Mapping version 2 of the keyed permutation of ``range(n)``: an exact keyed shuffle for small ``n``, a mixed-radix
Feistel network with modular addition above it.

- ``n <= SMALL_DOMAIN``: the permutation sorts ``range(n)`` by 64-bit keyed values ``v_i = subkeys(s, i)`` (a stable
  argsort; ``s`` derived from the key): every order of ``range(n)`` is reachable, each with probability ``1/n!`` up to
  the quality of the keyed values. Memory O(SMALL_DOMAIN) per key (cached).
- ``n > SMALL_DOMAIN``: let ``r = bits // 2`` with ``bits = ceil(log2 n)``, and ``a`` the smallest even number with
  ``a * 2**r >= n``. A value ``x < a * 2**r`` is the pair ``(hi, lo) = (x >> r, x & (2**r - 1))``. Round ``i`` (of
  ``NUM_ROUNDS``) adds a keyed function of one half to the other: even rounds ``hi = (hi + F_i(lo)) mod a``, odd rounds
  ``lo = (lo + F_i(hi)) mod 2**r``. ``F_i(v)`` is SplitMix64's finalizer of ``v XOR k_i`` (its top bits), reduced to the
  half's range by a 64x64-bit multiply-high (``mulhi(z, a)``) or a shift (``z >> (64 - r)``). Values that land in
  ``[n, a * 2**r)`` (fewer than ``2 / a`` of them) walk through the network again (cycle walking).

Why this shape: modular addition is not affine over GF(2), and adding a key-dependent offset to a half of even size is
an odd permutation whenever the offset is odd, so the parity of the result depends on the key (an XOR round is always
even); the mixed radix keeps the domain within a factor ``1 + 2/a`` of ``n``, so nearly no value walks (a power-of-two
domain walks up to half of them).

Invariants (tests/test_permutation.py, tests/test_permutation_stats.py): a bijection of ``[0, n)`` for every ``n`` and
key; ``inverse(apply(x)) == x``; the statistics of docs/design.md section 1 within 5 sigma of numpy's permutation.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from detsampler.keys import _M1, _M2, _S27, _S30, MASK64, subkeys

__all__ = ["NUM_ROUNDS", "SMALL_DOMAIN", "apply"]

NUM_ROUNDS = 8
SMALL_DOMAIN = 1 << 10  # up to this n: the exact keyed shuffle
_SHUFFLE_TAG = 1 << 40  # subkey index of the small path's sort key (far from the round keys 0 .. NUM_ROUNDS - 1)
_CHUNK = 1 << 14  # indices per pass: keeps a round's temporaries in cache
_FEW = 32  # up to this many indices with one key, Python ints beat numpy's per-call overhead
_M32 = np.uint64(0xFFFFFFFF)
_S32 = np.uint64(32)


# -- the small path: a keyed sort --------------------------------------------------------------------------------------


def _sort_orders(keys: np.ndarray, n: int) -> np.ndarray:
    """``orders[j]``: ``range(n)`` sorted (stably) by the keyed values of ``keys[j]`` (uint64, 1-D)."""
    s = subkeys(keys, _SHUFFLE_TAG)
    values = subkeys(s[:, None], np.arange(n, dtype=np.uint64)[None, :])
    return np.argsort(values, axis=1, kind="stable")


@lru_cache(maxsize=256)
def _cached_order(n: int, key: int) -> tuple[np.ndarray, np.ndarray]:
    """(order, inverse order) of one key, read-only."""
    order = _sort_orders(np.array([key], dtype=np.uint64), n)[0]
    inverse = np.empty_like(order)
    inverse[order] = np.arange(n)
    order.flags.writeable = inverse.flags.writeable = False
    return order, inverse


def _small(x: np.ndarray, n: int, keys: np.ndarray, inverse: bool) -> np.ndarray:
    """The small path on flat uint64 ``x`` with a 0-d key or one key per index."""
    idx = x.astype(np.int64)
    if keys.ndim == 0:
        return _cached_order(n, int(keys))[1 if inverse else 0][idx]
    unique, which = np.unique(keys, return_inverse=True)
    out = np.empty(idx.shape, dtype=np.int64)
    per_block = max(1, (1 << 20) // n)  # orders built per block: bounded memory
    for lo in range(0, unique.size, per_block):
        orders = _sort_orders(unique[lo : lo + per_block], n)
        if inverse:
            ranks = np.empty_like(orders)
            np.put_along_axis(ranks, orders, np.arange(n)[None, :], axis=1)
            orders = ranks
        sel = np.flatnonzero((which >= lo) & (which < lo + per_block))
        out[sel] = orders[which[sel] - lo, idx[sel]]
    return out


# -- the large path: the mixed-radix Feistel network -------------------------------------------------------------------


def _shape(n: int) -> tuple[int, int]:
    """``(r, a)``: the low half has ``2**r`` values, the high half ``a`` (even), and ``a * 2**r >= n``."""
    r = (int(n) - 1).bit_length() // 2
    a = -(-int(n) // (1 << r))
    return r, a + (a & 1)


@lru_cache(maxsize=4096)
def _scalar_round_keys(key: int) -> tuple[int, ...]:
    return tuple(int(subkeys(key, i)) for i in range(NUM_ROUNDS))


def _mix_top(v: np.ndarray, rk: np.ndarray | np.uint64, out: np.ndarray, scratch: np.ndarray) -> None:
    """``out =`` SplitMix64's finalizer of ``v ^ rk`` without its last xorshift (its top 31 bits are the
    finalizer's)."""
    np.bitwise_xor(v, rk, out=out)
    for shift, multiplier in ((_S30, _M1), (_S27, _M2)):
        np.right_shift(out, shift, out=scratch)
        np.bitwise_xor(out, scratch, out=out)
        np.multiply(out, multiplier, out=out)


def _mulhi(z: np.ndarray, a: np.uint64, scratch: np.ndarray) -> None:
    """``z = (z * a) >> 64`` exactly, in place, for ``a < 2**32``: a map of uint64 onto ``[0, a)``, uniform to within
    ``2**-32``."""
    np.bitwise_and(z, _M32, out=scratch)
    np.multiply(scratch, a, out=scratch)
    np.right_shift(scratch, _S32, out=scratch)
    np.right_shift(z, _S32, out=z)
    np.multiply(z, a, out=z)
    np.add(z, scratch, out=z)
    np.right_shift(z, _S32, out=z)


def _network(hi: np.ndarray, lo: np.ndarray, r: int, a: int, round_keys: list, inverse: bool) -> None:
    """The rounds on (hi, lo) in place; round keys are scalars or arrays shaped like the halves."""
    f, scratch = np.empty_like(hi), np.empty_like(hi)
    a64, low_mask, top = np.uint64(a), np.uint64((1 << r) - 1), np.uint64(64 - r)
    order = range(NUM_ROUNDS - 1, -1, -1) if inverse else range(NUM_ROUNDS)
    for i in order:
        if i % 2 == 0:  # hi = hi +- F(lo) mod a; min() picks the wrapped-back value of the two candidates
            _mix_top(lo, round_keys[i], f, scratch)
            _mulhi(f, a64, scratch)
            if inverse:
                np.subtract(hi, f, out=hi)
                np.add(hi, a64, out=scratch)
            else:
                np.add(hi, f, out=hi)
                np.subtract(hi, a64, out=scratch)
            np.minimum(hi, scratch, out=hi)
        else:  # lo = lo +- F(hi) mod 2**r
            _mix_top(hi, round_keys[i], f, scratch)
            np.right_shift(f, top, out=f)
            np.subtract(lo, f, out=lo) if inverse else np.add(lo, f, out=lo)
            np.bitwise_and(lo, low_mask, out=lo)


def _trip(y: np.ndarray, n: int, keys: np.ndarray, inverse: bool) -> None:
    """One pass of the network over all of ``y`` (uint64, flat, in place), chunk by chunk."""
    r, a = _shape(n)
    shift, low_mask = np.uint64(r), np.uint64((1 << r) - 1)
    scalar = None if keys.ndim else [np.uint64(k) for k in _scalar_round_keys(int(keys))]
    for start in range(0, y.size, _CHUNK):
        part = y[start : start + _CHUNK]
        rks = scalar or [subkeys(keys[start : start + _CHUNK], i) for i in range(NUM_ROUNDS)]
        hi = np.right_shift(part, shift)
        lo = np.bitwise_and(part, low_mask)
        _network(hi, lo, r, a, rks, inverse)
        np.left_shift(hi, shift, out=hi)
        np.bitwise_or(hi, lo, out=part)


def _walk_ints(values: list[int], n: int, key: int, inverse: bool) -> list[int]:
    """The network with cycle walking on a few Python ints: the numpy path's values, without its per-call overhead.

    The rounds run as (even, odd) pairs with their keys bound once, so no round tests its parity or direction."""
    r, a = _shape(n)
    low_mask, m1, m2, top = (1 << r) - 1, int(_M1), int(_M2), 64 - r
    rks = _scalar_round_keys(key)
    pairs = [(rks[i], rks[i + 1]) for i in range(0, NUM_ROUNDS, 2)]
    out = []
    for x in values:
        while True:
            hi, lo = x >> r, x & low_mask
            if inverse:
                for k_even, k_odd in reversed(pairs):
                    z = hi ^ k_odd
                    z ^= z >> 30
                    z = z * m1 & MASK64
                    z ^= z >> 27
                    lo = (lo - ((z * m2 & MASK64) >> top)) & low_mask
                    z = lo ^ k_even
                    z ^= z >> 30
                    z = z * m1 & MASK64
                    z ^= z >> 27
                    hi = (hi - ((z * m2 & MASK64) * a >> 64)) % a
            else:
                for k_even, k_odd in pairs:
                    z = lo ^ k_even
                    z ^= z >> 30
                    z = z * m1 & MASK64
                    z ^= z >> 27
                    hi = (hi + ((z * m2 & MASK64) * a >> 64)) % a
                    z = hi ^ k_odd
                    z ^= z >> 30
                    z = z * m1 & MASK64
                    z ^= z >> 27
                    lo = (lo + ((z * m2 & MASK64) >> top)) & low_mask
            x = (hi << r) | lo
            if x < n:
                break
        out.append(x)
    return out


def _large(y: np.ndarray, n: int, keys: np.ndarray, inverse: bool) -> np.ndarray:
    """Cycle walking over the flat uint64 array ``y`` (walked in place)."""
    if keys.ndim == 0 and y.size <= _FEW:
        return np.array(_walk_ints(y.tolist(), n, int(keys), inverse), dtype=np.int64)
    _trip(y, n, keys, inverse)
    outside = np.flatnonzero(y >= np.uint64(n))
    while outside.size:  # fewer than 2 / a of the values: a few small passes
        if keys.ndim == 0 and outside.size <= _FEW:
            y[outside] = _walk_ints(y[outside].tolist(), n, int(keys), inverse)
            break
        walkers = y[outside]
        _trip(walkers, n, keys[outside] if keys.ndim else keys, inverse)
        y[outside] = walkers
        outside = outside[walkers >= np.uint64(n)]
    return y.view(np.int64)


def apply(y: np.ndarray, n: int, keys: np.ndarray, inverse: bool) -> np.ndarray:
    """The permutation (or its inverse) of the flat uint64 indices ``y`` (checked to be in ``[0, n)``; walked in place),
    keyed by a 0-d uint64 key or one per index; int64 out."""
    if n <= SMALL_DOMAIN:
        return _small(y, n, keys, inverse)
    return _large(y, n, keys, inverse)
