"""The ``.npy`` files of an index directory: durable writes and checksums (atomic renames: :mod:`detsampler.atomic`).

Invariant: :func:`save_npy` returns only once the array is on disk (fsynced); :func:`npy_header` is exactly
:data:`HEADER_BYTES` long, so a token file can be streamed after a placeholder header and the header written last.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np

__all__ = ["HEADER_BYTES", "npy_bytes", "npy_header", "save_npy", "sha256_file"]

HEADER_BYTES = 128  # a 1-D .npy v1.0 header is always 128 bytes (checked when written)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def npy_header(dtype: np.dtype, n: int) -> bytes:
    import io

    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buf, {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": (n,)}
    )
    header = buf.getvalue()
    if len(header) != HEADER_BYTES:  # pragma: no cover - numpy's v1.0 header layout is fixed
        raise RuntimeError(f"unexpected .npy header size {len(header)}")
    return header


def save_npy(path: Path, array: np.ndarray) -> None:
    with open(path, "wb") as f:
        np.lib.format.write_array(f, np.ascontiguousarray(array), version=(1, 0), allow_pickle=False)
        f.flush()
        os.fsync(f.fileno())


def npy_bytes(array: np.ndarray) -> bytes:
    """``array`` serialized as a ``.npy`` v1.0 file (no pickles), for :func:`detsampler.atomic.atomic_write`."""
    import io

    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.ascontiguousarray(array), version=(1, 0), allow_pickle=False)
    return buf.getvalue()
