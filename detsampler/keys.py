"""64-bit keys and mixing, the only source of randomness in detsampler.

Every random choice of the library (a permutation's round keys, an epoch's shuffle, a layout's document order, a
mixture's interleaving) is a pure function of the user's seed and of integers that name the choice, through the
functions here. Nothing reads a global random state, so two processes with the same arguments compute the same bits.
"""

from __future__ import annotations

import hashlib
import struct

import numpy as np

__all__ = ["MASK64", "mix64", "mix64_int", "stable_hash64", "subkeys"]

MASK64 = (1 << 64) - 1
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
MIX_MULTIPLIERS = (0xBF58476D1CE4E5B9, 0x94D049BB133111EB)  # SplitMix64's finalizer
_M1, _M2 = (np.uint64(m) for m in MIX_MULTIPLIERS)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)


def mix64(x: np.ndarray | int) -> np.ndarray:
    """SplitMix64's finalizer: a bijection of uint64 in which every output bit depends on every input bit.

    Works on arrays (elementwise, wrapping arithmetic) and on Python ints; always returns a uint64 array (0-d for a
    scalar).
    """
    z = np.asarray(x, dtype=np.uint64) if not isinstance(x, int) else np.asarray(x & MASK64, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = z ^ (z >> _S30)
        z = z * _M1
        z = z ^ (z >> _S27)
        z = z * _M2
        return z ^ (z >> _S31)


def mix64_int(z: int) -> int:
    """:func:`mix64` of one 64-bit Python int, without numpy (the same values)."""
    m1, m2 = MIX_MULTIPLIERS
    z ^= z >> 30
    z = (z * m1) & MASK64
    z ^= z >> 27
    z = (z * m2) & MASK64
    return z ^ (z >> 31)


def stable_hash64(*parts: int | str | bytes) -> int:
    """A 64-bit hash of a sequence of integers and strings, stable across processes, platforms and Python versions.

    Unlike ``hash()``, it is not salted per process. Integers may be negative or wider than 64 bits.
    """
    h = hashlib.blake2b(digest_size=8, person=b"detsampler")
    for part in parts:
        if isinstance(part, bool) or not isinstance(part, (int, str, bytes)):
            raise TypeError(f"stable_hash64 takes int, str or bytes parts, got {type(part).__name__}")
        if isinstance(part, int):
            data = part.to_bytes((part.bit_length() + 8) // 8 + 1, "little", signed=True)
            h.update(b"i" + struct.pack("<I", len(data)) + data)
        else:
            data = part.encode() if isinstance(part, str) else part
            h.update(b"s" + struct.pack("<I", len(data)) + data)
    return int.from_bytes(h.digest(), "little")


def subkeys(key: np.ndarray | int, index: np.ndarray | int) -> np.ndarray:
    """Key number ``index`` derived from ``key``, elementwise: distinct (key, index) pairs give unrelated keys."""
    base = mix64(key)
    idx = np.asarray(index, dtype=np.uint64)
    with np.errstate(over="ignore"):
        return mix64(base ^ mix64((idx + np.uint64(1)) * _GOLDEN))
