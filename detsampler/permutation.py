"""A keyed pseudo-random permutation of ``range(n)``, computed pointwise in O(1) memory, in each mapping version.

``permute(x, n, key, version)`` dispatches on the mapping version (:data:`detsampler.version.MAPPING_VERSION` by
default): version 2 (:mod:`detsampler.permutation_v2`) is an exact keyed shuffle for ``n <= 1024`` and a mixed-radix
Feistel network with modular addition above; version 1 (:mod:`detsampler.permutation_v1`) is the XOR Feistel network of
the first release, kept unchanged so that runs started on it resume exactly. Version 3 (a balanced plan,
:mod:`detsampler.balance`) permutes as version 2 does.

Invariants (tests/test_permutation.py, tests/test_permutation_stats.py):
- ``permute(·, n, key, v)`` is a bijection of ``[0, n)`` for every ``n >= 1``, every 64-bit key and every version;
- ``unpermute(permute(x, n, key, v), n, key, v) == x``;
- memory is proportional to the number of indices asked for (plus, in version 2, O(1024) per cached small-n key);
- version 2 passes the statistical battery of docs/design.md section 1 within 5 sigma of numpy's permutation.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from detsampler import permutation_v1, permutation_v2
from detsampler.checks import is_int
from detsampler.keys import MASK64
from detsampler.version import MAPPING_VERSION, MAPPING_VERSIONS

__all__ = ["MAX_DOMAIN", "Permutation", "check_mapping_version", "permute", "permute_within", "unpermute"]

MAX_DOMAIN = 1 << 62
# NOTE: version 3 changes which rank reads which of a step's samples (a balanced plan), not the permutation
_VERSIONS = {1: permutation_v1, 2: permutation_v2, 3: permutation_v2}


def _check_domain(n: int) -> None:
    if not is_int(n):
        raise TypeError(f"n must be an integer, got {type(n).__name__}")
    if not 1 <= n <= MAX_DOMAIN:
        raise ValueError(f"n must be in [1, 2**62], got {n}")


def _as_indices(x: np.ndarray | int, n: int, name: str) -> np.ndarray:
    arr = np.asarray(x)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{name} must be integers, got dtype {arr.dtype}")
    if arr.size and (arr.min() < 0 or arr.max() >= n):
        bad = arr[(arr < 0) | (arr >= n)].flat[0]
        raise ValueError(f"Got {name} {int(bad)}, allowed {name} are in [0, {n})")
    return arr.astype(np.uint64)


def check_mapping_version(version: int) -> int:
    """``version`` as an int if this library can compute it, else a ValueError listing those it can."""
    if isinstance(version, bool) or version not in MAPPING_VERSIONS:
        raise ValueError(f"Got mapping version {version!r}, allowed mapping versions are {MAPPING_VERSIONS}")
    return int(version)


def _apply(x: np.ndarray | int, n: int, key: np.ndarray | int, inverse: bool, version: int) -> np.ndarray:
    _check_domain(n)
    module = _VERSIONS[check_mapping_version(version)]
    arr = _as_indices(x, n, "value" if inverse else "index")  # a fresh uint64 copy, walked in place
    shape = arr.shape
    keys = np.asarray(key if not isinstance(key, int) else key & MASK64, dtype=np.uint64)
    keys = np.broadcast_to(keys, shape).reshape(-1) if keys.ndim else keys
    return module.apply(arr.reshape(-1), int(n), keys, inverse).reshape(shape)


def permute(x: np.ndarray | int, n: int, key: np.ndarray | int, version: int = MAPPING_VERSION) -> np.ndarray:
    """The images of indices ``x`` (in ``[0, n)``) under the permutation keyed by ``key``, as int64, shaped like ``x``.

    Args:
        x: indices in ``[0, n)`` (an int or an integer array of any shape).
        n: the domain size, ``1 <= n <= 2**62``.
        key: a 64-bit integer, or a uint64 array broadcastable to ``x`` (one key per index, e.g. one per epoch).
        version: the mapping version whose permutation to compute (``MAPPING_VERSIONS``).

    Returns:
        ``permute(x)`` as int64, shaped like ``x``: a bijection of ``[0, n)`` for every key, O(1) memory per index.
    """
    return _apply(x, n, key, False, version)


def permute_within(x: np.ndarray, n: int, key: int, version: int) -> np.ndarray:
    """:func:`permute` of a flat int64 array ``x`` that the caller has already bounded to ``[0, n)``, with one Python
    int ``key``, an int ``n`` in ``[1, 2**62]`` and a checked ``version``: the same values, without checking them again.
    """
    keys = np.asarray(key & MASK64, dtype=np.uint64)
    return _VERSIONS[int(version)].apply(x.astype(np.uint64), int(n), keys, False)


def unpermute(y: np.ndarray | int, n: int, key: np.ndarray | int, version: int = MAPPING_VERSION) -> np.ndarray:
    """The inverse of :func:`permute`: ``unpermute(permute(x, n, k, v), n, k, v) == x`` for every ``x`` in
    ``[0, n)``.

    Args:
        y: images in ``[0, n)``; ``n``, ``key``, ``version`` as for :func:`permute`.

    Returns:
        The preimages as int64, shaped like ``y``.
    """
    return _apply(y, n, key, True, version)


@dataclass(frozen=True)
class Permutation:
    """The permutation of ``range(n)`` keyed by ``key`` (in mapping version ``version``): ``perm[i]`` is the image of
    ``i``, ``perm.inverse(v)`` its preimage."""

    n: int
    key: int
    version: int = MAPPING_VERSION

    def __post_init__(self) -> None:
        _check_domain(self.n)
        check_mapping_version(self.version)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: np.ndarray | int) -> np.ndarray | int:
        out = permute(index, self.n, self.key, self.version)
        return int(out) if out.ndim == 0 else out

    def inverse(self, value: np.ndarray | int) -> np.ndarray | int:
        out = unpermute(value, self.n, self.key, self.version)
        return int(out) if out.ndim == 0 else out
