"""Per-chunk checksums of the large files of an index or a layout, verified lazily: each chunk the first time a process
reads it.

A checked file is cut into chunks of :data:`CHUNK_BYTES` bytes of the file (the ``.npy`` header is in chunk 0); its
checksums are the CRC-32 of each chunk, kept in a small ``<stem>.sums.npy`` (uint32, one per chunk) whose own sha256 the
directory's JSON record holds and :func:`load_sums` checks in full on open (it is 1/16384 of the file).

Invariant: every element a :class:`VerifiedArray` returns lies in a chunk whose CRC-32 this process has checked against
the recorded one; a mismatch raises :class:`ChecksumError` naming the file, the chunk and its byte range. Opening costs
O(file size / CHUNK_BYTES) (the sums), never a read of the file; a read costs, besides the read, one CRC-32 of each
chunk it touches for the first time (CRC-32 runs at ~1.7 GB/s on one core here: ~40 us per 64 KiB chunk).
"""

from __future__ import annotations

import hashlib
import mmap
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from tokenize import TokenError
from typing import Any

import numpy as np

from detsampler.index.format import CHUNK_BYTES, ChecksumError, TokenIndexError
from detsampler.index.remote import first_block, handed_over, handover, open_remote, read_in_full, reblocked
from detsampler.ranges import concat_ranges
from detsampler.storage import BlockCache, RemoteArray, RemotePath

__all__ = [
    "CHUNK_BYTES",
    "ChecksumError",
    "VerifiedArray",
    "file_digests",
    "load_array",
    "load_sums",
    "open_checked",
    "open_checked_all",
    "sums_name",
    "write_checksums",
    "write_fence",
]

_SHIFT = CHUNK_BYTES.bit_length() - 1
_FEW_RANGES = 32  # up to this many ranges, checked_ranges walks them in Python ints
_READ_BYTES = 1 << 24


def sums_name(name: str) -> str:
    """The checksum file of data file ``name``: ``tokens.npy`` -> ``tokens.sums.npy``."""
    return f"{name[:-4] if name.endswith('.npy') else name}.sums.npy"


def file_digests(path: Path) -> tuple[str, np.ndarray]:
    """The sha256 (hex) of the file at ``path`` and the CRC-32 of each of its :data:`CHUNK_BYTES` chunks (one read)."""
    h = hashlib.sha256()
    sums: list[int] = []
    with open(path, "rb") as f:
        while block := f.read(_READ_BYTES):
            h.update(block)
            view = memoryview(block)
            sums.extend(zlib.crc32(view[i : i + CHUNK_BYTES]) for i in range(0, len(block), CHUNK_BYTES))
    return h.hexdigest(), np.asarray(sums, dtype=np.uint32)


def write_fence(directory: Path, name: str) -> dict:
    """Write ``<stem>.fence.npy``: every ``CHUNK_BYTES // itemsize``-th element of the sorted array ``name`` (1/8192 of
    it for int64); returns its record (file, size, sha256)."""
    from detsampler.index.files import save_npy, sha256_file

    arr = np.load(directory / name, mmap_mode="r", allow_pickle=False)
    fence_path = directory / f"{name[:-4]}.fence.npy"
    save_npy(fence_path, np.ascontiguousarray(arr[:: CHUNK_BYTES // arr.dtype.itemsize]))
    return {"file": fence_path.name, "size": fence_path.stat().st_size, "sha256": sha256_file(fence_path)}


def _read_small(path: Path | RemotePath, what: str, role: str = "") -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise TokenIndexError(f"{what}: cannot read {role}{path.name} ({exc.strerror})") from None


def _load_small(path: Path, record: dict, what: str, role: str = "", raw: bytes | None = None) -> np.ndarray:
    """A small ``.npy`` file read whole (``raw``: its bytes, read already) and checked against its record (size,
    sha256); ``role`` names it in the error when it cannot be read (e.g. ``"its checksums "``)."""
    import io

    if raw is None:
        raw = _read_small(path, what, role)
    if len(raw) != record.get("size") or hashlib.sha256(raw).hexdigest() != record.get("sha256"):
        raise TokenIndexError(
            f"{what}: {path.name} differs from the one recorded (size or sha256): the file was edited"
        )
    return np.load(io.BytesIO(raw), allow_pickle=False)


def write_checksums(directory: Path, name: str) -> dict:
    """Write ``directory/<stem>.sums.npy`` for data file ``name``; returns the file's record: size, sha256, chunk size,
    its checksum file's name, size and sha256."""
    from detsampler.index.files import save_npy, sha256_file

    sha, sums = file_digests(directory / name)
    sums_path = directory / sums_name(name)
    save_npy(sums_path, sums)
    return {
        "size": (directory / name).stat().st_size,
        "sha256": sha,
        "sums": {
            "file": sums_path.name,
            "chunk_bytes": CHUNK_BYTES,
            "checksum": "crc32",
            "size": sums_path.stat().st_size,
            "sha256": sha256_file(sums_path),
        },
    }


def load_sums(path: Path, record: dict, data_size: int, what: str) -> np.ndarray:
    """The chunk sums at ``path``, checked against ``record`` (``size``, ``sha256``) and the data file's size."""
    return _checked_sums(path, None, record, data_size, what)


def _checked_sums(path: Path, raw: bytes | None, record: dict, data_size: int, what: str) -> np.ndarray:
    sums = _load_small(path, record, what, role="its checksums ", raw=raw)
    if sums.dtype != np.uint32 or sums.shape != (-(-data_size // CHUNK_BYTES),):
        raise TokenIndexError(f"{what}: {path.name} holds {sums.shape} {sums.dtype}, not one uint32 per chunk")
    return sums


class VerifiedArray:
    """A read-only 1-D array, memory-mapped from a ``.npy`` file, its reads checked chunk by chunk (see the module doc).

    Reads: ``a[i]``, ``a[i:j]``, ``a[int_array]``, ``a.searchsorted(v, side)``; ``np.asarray(a)`` checks every chunk
    (a full read). ``verified`` counts the chunks this process has checked.
    """

    def __init__(
        self,
        path: Path | RemotePath,
        array: np.ndarray | RemoteArray,
        sums: np.ndarray,
        what: str,
        fence: np.ndarray | None = None,
    ) -> None:
        self._fence = fence  # sorted arrays: every FENCE_EVERY-th element, in RAM, so a search reads one block
        # NOTE: reads go through a plain ndarray view of the map: indexing a np.memmap runs its Python-level
        # __array_finalize__ on every result, a fixed cost per read that a micro batch pays a dozen times.
        self._array = array.view(np.ndarray) if isinstance(array, np.memmap) else array
        self._sums = sums
        self._what = what
        self._checked = np.zeros(len(sums), dtype=bool)
        self._read_in_full: str | None = None  # a remote object's sha256, once a full read checked every block
        self._unchecked = len(sums)  # chunks not checked yet: at 0 every read is a plain read of the map
        if isinstance(
            array, RemoteArray
        ):  # its blocks are checked against ``sums`` as they arrive (detsampler.index.remote)
            self.path, self._raw, self._data_offset = path, None, array.offset
            return
        self.path = Path(path)
        self._raw = np.memmap(path, dtype=np.uint8, mode="r") if path.stat().st_size else np.zeros(0, np.uint8)
        self._data_offset = int(getattr(array, "offset", 0)) if isinstance(array, np.memmap) else _npy_data_offset(path)
        for m in (array, self._raw):  # random reads: no read-around of neighbouring pages into this process
            _advise_random(m)

    # -- array-like surface
    @property
    def shape(self) -> tuple[int, ...]:
        return self._array.shape

    @property
    def dtype(self) -> np.dtype:
        return self._array.dtype

    @property
    def size(self) -> int:
        return int(self._array.size)

    @property
    def ndim(self) -> int:
        return 1

    @property
    def memory_mapped(self) -> bool:
        """Whether the elements are read from a memory map of the file (not from a copy in RAM, nor a remote store)."""
        base = self._array
        while base is not None and not isinstance(base, np.memmap):
            base = getattr(base, "base", None)
        return base is not None

    @property
    def verified(self) -> int:
        return int(self._checked.sum())

    def __len__(self) -> int:
        return len(self._array)

    def __repr__(self) -> str:
        return f"VerifiedArray({str(self.path)!r}, shape={self.shape}, dtype={self.dtype})"

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        if self._raw is None:  # a remote array: the read fetches every block, each checked as it arrives
            out = np.asarray(self._array, dtype=dtype)
            self._checked[:] = True
            self._unchecked = 0
            return out
        self.verify_all()
        return np.asarray(self._array, dtype=dtype)

    def tolist(self) -> list:
        return np.asarray(self).tolist()

    # whole-array reductions (each checks every chunk first: a full read, for tools and tests)
    def max(self) -> Any:
        return np.asarray(self).max()

    def min(self) -> Any:
        return np.asarray(self).min()

    def sum(self) -> Any:
        return np.asarray(self).sum()

    def __iter__(self):
        return iter(np.asarray(self))

    def __reduce__(self):
        if isinstance(self._array, RemoteArray):  # handed over: a worker asks the store nothing to reopen it
            return (_handed_over, (str(self.path), self._sums, self._what, self._fence, handover(self._array)))
        return (_reopen, (str(self.path), self._sums, self._what, self._fence))

    # -- checked reads
    def __getitem__(self, key: Any) -> Any:
        if not self._unchecked:  # every chunk checked: nothing left to guard
            return self._array[key]
        n = len(self._array)
        if isinstance(key, slice):
            lo, hi, _ = key.indices(n)
            if hi > lo:
                self._check_range(lo, hi - 1)
            return self._array[key]
        if isinstance(key, (int, np.integer)):
            i = int(key) + (n if key < 0 else 0)
            if 0 <= i < n:
                self._check_range(i, i)
            return self._array[key]
        idx = np.asarray(key)
        if idx.size:
            self._check_elements(np.where(idx < 0, idx + n, idx).reshape(-1))
        return self._array[idx]

    def searchsorted(self, v: Any, side: str = "left") -> np.ndarray:
        """``np.searchsorted`` over the (sorted) array; each answer is confirmed on checked elements around it, so a
        corrupted element met on the way can never yield a wrong answer silently. With a fence, each value reads one
        block of the file (the fence, in RAM, says which), not the ~log2(n) scattered pages of a binary search."""
        if not self._unchecked:  # every chunk checked: one search of the map (its pages were all read)
            values = np.asarray(v)
            return np.searchsorted(self._array, self._own_dtype(values.reshape(-1)), side=side).reshape(values.shape)
        if self._fence is not None:
            return self._fenced_search(v, side)
        pos = np.searchsorted(self._array, v, side=side)
        p = np.asarray(pos).reshape(-1)
        n = len(self._array)
        around = np.concatenate([p[p > 0] - 1, p[p < n]])
        if around.size:
            self._check_elements(around)
            vv = np.broadcast_to(np.asarray(v), np.shape(pos)).reshape(-1)
            below = np.where(p > 0, self._array[np.maximum(p - 1, 0)], vv)
            above = np.where(p < n, self._array[np.minimum(p, n - 1)], vv)
            ok = (below < vv) | (p == 0) if side == "left" else (below <= vv) | (p == 0)
            ok &= (vv <= above) | (p == n) if side == "left" else (vv < above) | (p == n)
            if not ok.all():
                self.verify_all()  # the array is not sorted where the search went: find the bad chunk
                raise ChecksumError(
                    f"{self._what}: {self.path.name} is not sorted around position {int(p[~ok][0])}", self.path
                )
        return pos

    def _own_dtype(self, values: np.ndarray) -> np.ndarray:
        """``values`` in the array's own integer dtype when they fit it: numpy would otherwise copy the searched
        array (or block) to the values' dtype on every search."""
        if values.dtype != self.dtype and values.dtype.kind in "iu" and self.dtype.kind in "iu" and values.size:
            info = np.iinfo(self.dtype)
            if info.min <= int(values.min()) and int(values.max()) <= info.max:
                return values.astype(self.dtype)
        return values

    def _fenced_search(self, v: Any, side: str) -> np.ndarray:
        values = self._own_dtype(np.asarray(v).reshape(-1))
        block = np.searchsorted(self._fence, values, side=side) - 1  # fence[block] < v <= fence[block + 1] (left)
        out = np.zeros(len(values), dtype=np.int64)
        n, every = len(self._array), self.fence_every
        for b in sorted(set(block[block >= 0].tolist())):
            lo, hi = b * every, min((b + 1) * every, n)
            self._check_range(lo, hi - 1)
            mine = block == b
            out[mine] = lo + self._array[lo:hi].searchsorted(values[mine], side=side)  # checked just above
        return out.reshape(np.shape(v))

    def checked_ranges(self, starts: np.ndarray, stops: np.ndarray) -> np.ndarray:
        """The underlying read-only memory map, once every chunk holding an element of some ``[starts[j], stops[j])``
        is checked: the caller reads only those ranges from it (the invariant holds for them). Cost when they are
        checked already: a few vectorized operations on ``len(starts)`` values, whatever the ranges' lengths."""
        starts, stops = np.asarray(starts, dtype=np.int64), np.asarray(stops, dtype=np.int64)
        if not self._unchecked and starts.size and self._inside(starts, stops):  # every chunk checked: bounds alone
            return self._array
        if starts.size <= _FEW_RANGES:  # a micro batch's spans: Python ints beat a dozen numpy calls
            self._check_few_ranges(starts.reshape(-1).tolist(), stops.reshape(-1).tolist())
            return self._array
        some = stops > starts
        if some.any():
            lo, hi = starts[some], stops[some]
            if int(lo.min()) < 0 or int(hi.max()) > len(self._array):
                raise IndexError(f"ranges reach outside [0, {len(self._array)}) of {self.path.name}")
            if not self._unchecked:
                return self._array
            isz = self.dtype.itemsize
            first = (self._data_offset + lo * isz) >> _SHIFT
            last = (self._data_offset + hi * isz - 1) >> _SHIFT
            wide = last - first > 1
            chunks = np.concatenate([first, last])
            if wide.any():  # a range over three or more chunks: list them all
                chunks = np.concatenate([chunks, concat_ranges(first[wide], last[wide] - first[wide] + 1)[0]])
            todo = chunks[~self._checked[chunks]]
            if todo.size:
                self._verify(todo)
        return self._array

    def _inside(self, starts: np.ndarray, stops: np.ndarray) -> bool:
        """Whether every range lies inside the array (two reductions; False says nothing of empty ranges outside)."""
        return int(np.minimum.reduce(starts, axis=None)) >= 0 and int(np.maximum.reduce(stops, axis=None)) <= len(self)

    def block_keys(self, starts: np.ndarray, stops: np.ndarray) -> list[tuple[str, int]]:
        """For an array in an object store, the ``(url, block)`` keys a read of the element ranges
        ``[starts[j], stops[j])`` fetches (:meth:`detsampler.storage.RemoteArray.block_keys`); a local one: none."""
        return self._array.block_keys(starts, stops) if self._raw is None else []

    @property
    def in_object_store(self) -> bool:
        """Whether the elements are read from an object store (by blocks), not from a local file."""
        return self._raw is None and isinstance(self._array, RemoteArray)

    def reblocked(self, block_bytes: int, cache: BlockCache | None, node: Any = None) -> VerifiedArray | None:
        """For an array in an object store, the same array read by blocks of ``block_bytes`` through ``cache`` (and
        the node-shared cache ``node``; each block checked against the same chunk sums on arrival); a local one: None
        (it is memory-mapped)."""
        if not self.in_object_store:
            return None
        array = reblocked(self._array, self._sums, self._what, block_bytes, cache, node)
        return VerifiedArray(self.path, array, self._sums, self._what, self._fence)

    @property
    def fence_every(self) -> int:
        return CHUNK_BYTES // self.dtype.itemsize

    def verify_all(self) -> None:
        """Check every chunk not checked yet (reads the whole file once). A remote object is read in full from the
        store, every block fetched and checked (:func:`~detsampler.index.remote.read_in_full`: streamed, bounded
        memory), once per array, whatever its reads fetched before; its sha256 is taken in the same pass."""
        if self._raw is None:
            if self._read_in_full is None:
                self._read_in_full = read_in_full(self._array, self._sums, self._what)
                self._checked[:] = True
                self._unchecked = 0
            return
        self._verify(np.flatnonzero(~self._checked))

    def sha256(self) -> str:
        """The sha256 (hex) of the whole file or object (a full read; a remote one by :meth:`verify_all`, every block
        checked, once)."""
        if self._raw is not None:
            from detsampler.index.files import sha256_file

            return sha256_file(self.path)
        self.verify_all()
        assert self._read_in_full is not None
        return self._read_in_full

    # -- internals
    def _check_few_ranges(self, starts: list[int], stops: list[int]) -> None:
        """What :meth:`checked_ranges` checks, range by range in Python ints (the same chunks, the same errors)."""
        n, isz, offset, checked = len(self._array), self.dtype.itemsize, self._data_offset, self._checked
        todo: list[int] = []
        for a, b in zip(starts, stops):
            if b <= a:
                continue
            if a < 0 or b > n:
                raise IndexError(f"ranges reach outside [0, {n}) of {self.path.name}")
            first, last = (offset + a * isz) >> _SHIFT, (offset + b * isz - 1) >> _SHIFT
            if last - first > 1 and not checked[first : last + 1].all():
                todo.extend(range(first, last + 1))
            elif not (checked[first] and checked[last]):
                todo.extend((first, last))
        if todo:
            self._verify(np.array(todo, dtype=np.int64))

    def _check_range(self, first: int, last: int) -> None:
        a = (self._data_offset + first * self.dtype.itemsize) >> _SHIFT
        b = (self._data_offset + (last + 1) * self.dtype.itemsize - 1) >> _SHIFT
        if not self._checked[a : b + 1].all():
            self._verify(np.arange(a, b + 1))

    def _check_elements(self, idx: np.ndarray) -> None:
        chunks = (self._data_offset + idx.astype(np.int64, copy=False) * self.dtype.itemsize) >> _SHIFT
        todo = chunks[~self._checked[chunks]]
        if todo.size:
            self._verify(todo)  # repeats are skipped there (np.unique would import numpy.ma: 0.3 s)

    def _verify(self, chunks: np.ndarray) -> None:
        raw = self._raw
        if raw is None:  # a remote array: every block it reads was checked on arrival (detsampler.index.remote)
            new = np.sort(chunks[~self._checked[chunks]])
            if new.size:  # counted once each (a chunk may be named twice): O(these chunks), not O(the file)
                self._unchecked -= 1 + int(np.count_nonzero(new[1:] != new[:-1]))
                self._checked[new] = True
            return
        for c in chunks.tolist():
            if self._checked[c]:
                continue
            lo, hi = c * CHUNK_BYTES, min((c + 1) * CHUNK_BYTES, len(raw))
            got = zlib.crc32(raw[lo:hi])
            if got != int(self._sums[c]):
                raise ChecksumError(
                    f"{self._what}: {self.path.name} chunk {c} (bytes {lo}..{hi - 1}) fails its checksum "
                    f"(crc32 {got:08x}, "
                    f"recorded {int(self._sums[c]):08x}): the file was edited or replaced after it was written",
                    self.path,
                )
            self._checked[c] = True
            self._unchecked -= 1


def load_array(path: Path, name: str, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """``path/name`` as a read-only memory map (allow_pickle=False), checked to have ``dtype`` and ``shape``."""
    try:
        empty = int(np.prod(shape)) == 0  # an empty array cannot be memory-mapped
        arr = np.load(path / name, mmap_mode=None if empty else "r", allow_pickle=False)
    except (ValueError, OSError, EOFError, SyntaxError, TokenError) as exc:  # a damaged header: numpy parses it
        why = " ".join(str(exc).split())
        raise TokenIndexError(
            f"{str(path)!r}: {name} is not a readable .npy file ({type(exc).__name__}: {why}); delete the directory "
            "and rebuild"
        ) from None
    if arr.dtype != dtype or arr.shape != shape:
        raise TokenIndexError(
            f"{str(path)!r}: {name} has dtype {arr.dtype} and shape {arr.shape}, its record says {np.dtype(dtype)} "
            f"and {shape}: the file was edited or replaced; delete the directory and rebuild"
        )
    return arr


def open_checked(
    path: Path | RemotePath,
    files: Any,
    name: str,
    dtype: np.dtype,
    shape: tuple[int, ...],
    block_cache: BlockCache | None = None,
) -> VerifiedArray:
    """``path/name`` memory-mapped behind its chunk checksums; its size, dtype, shape and checksum file checked now.
    An object in a store is read by blocks instead, through ``block_cache`` when given (each block checked on
    arrival)."""
    record = files.get(name) if isinstance(files, dict) else None
    if not isinstance(record, dict) or "sums" not in record:
        raise TokenIndexError(f"{str(path)!r}: its record does not list {name}; delete the directory and rebuild")
    f = path / name
    if isinstance(f, RemotePath):  # its first block, its checksums and its fence asked for at once: one round trip
        return _open_remote_checked(path, record, name, dtype, shape, block_cache)
    head, size = first_block(f, block_cache)
    if size != record["size"]:
        kind = "object" if isinstance(f, RemotePath) else "file"
        again = "push the index again" if isinstance(f, RemotePath) else "delete the directory and rebuild"
        raise TokenIndexError(
            f"{str(path)!r}: {name} is {'missing' if size is None else f'{size} bytes'}, its record says "
            f"{record['size']} bytes: the {kind} was truncated, edited or removed; {again}"
        )
    what = str(path)
    sums = load_sums(path / sums_name(name), record["sums"], size, what)
    array = (
        load_array(path, name, dtype, shape)
        if not isinstance(f, RemotePath)
        else open_remote(f, size, sums, what, block_cache, head)
    )
    if isinstance(array, RemoteArray) and (array.dtype != dtype or array.shape != shape):
        raise TokenIndexError(
            f"{str(path)!r}: {name} has dtype {array.dtype} and shape {array.shape}, its record says "
            f"{np.dtype(dtype)} and {shape}: the file was edited or replaced; delete the directory and rebuild"
        )
    fence = None if "fence" not in record else _load_fence(path, record, name, dtype, shape)
    return VerifiedArray(f, array, sums, what, fence)


def _load_fence(
    path: Path | RemotePath, record: dict, name: str, dtype: np.dtype, shape: tuple[int, ...]
) -> np.ndarray:
    what = str(path)
    fence = _load_small(path / record["fence"]["file"], record["fence"], what)
    if fence.shape != (-(-shape[0] // (CHUNK_BYTES // dtype.itemsize)),) or fence.dtype != dtype:
        raise TokenIndexError(f"{what}: {record['fence']['file']} does not match {name}")
    return fence


def _open_remote_checked(
    path: RemotePath, record: dict, name: str, dtype: np.dtype, shape: tuple[int, ...], cache: BlockCache | None
) -> VerifiedArray:
    """:func:`open_checked` of an object: its first block, checksums and fence fetched together, then checked in the
    order a local file's are (its size first: a missing or truncated object is said as such)."""
    f, what = path / name, str(path)
    with ThreadPoolExecutor(3, thread_name_prefix="detsampler-open") as pool:
        got_head = pool.submit(first_block, f, cache)
        got_raw = pool.submit(_read_small, path / sums_name(name), what, "its checksums ")
        got_fence = pool.submit(_load_fence, path, record, name, dtype, shape) if "fence" in record else None
        head, size = got_head.result()
        if size != record["size"]:
            raise TokenIndexError(
                f"{what!r}: {name} is {'missing' if size is None else f'{size} bytes'}, its record says "
                f"{record['size']} bytes: the object was truncated, edited or removed; push the index again"
            )
        sums = _checked_sums(path / sums_name(name), got_raw.result(), record["sums"], size, what)
        array = open_remote(f, size, sums, what, cache, head)
        if array.dtype != dtype or array.shape != shape:
            raise TokenIndexError(
                f"{what!r}: {name} has dtype {array.dtype} and shape {array.shape}, its record says "
                f"{np.dtype(dtype)} and {shape}: the file was edited or replaced; delete the directory and rebuild"
            )
        fence = None if got_fence is None else got_fence.result()
    return VerifiedArray(f, array, sums, what, fence)


def open_checked_all(
    path: Path | RemotePath,
    files: dict,
    wanted: dict[str, tuple[np.dtype, tuple[int, ...]]],
    cache: BlockCache | None = None,
) -> dict[str, VerifiedArray]:
    """``open_checked`` of each array of ``wanted`` (name: dtype, shape); in an object store all at once (each is a
    first block and a checksum file: two round trips, whatever the number of arrays). An error names the first array,
    in ``wanted``'s order, that fails."""

    def open_one(name: str) -> VerifiedArray:
        return open_checked(path, files, name, *wanted[name], cache)

    if not isinstance(path, RemotePath) or len(wanted) < 2:
        return {name: open_one(name) for name in wanted}
    with ThreadPoolExecutor(len(wanted), thread_name_prefix="detsampler-open") as pool:
        return dict(zip(wanted, pool.map(open_one, wanted)))


def _advise_random(arr: Any) -> None:
    mm = getattr(arr, "_mmap", None)
    if mm is not None and hasattr(mm, "madvise") and hasattr(mmap, "MADV_RANDOM"):
        try:
            mm.madvise(mmap.MADV_RANDOM)
        except OSError:
            pass


def _npy_data_offset(path: Path) -> int:
    with open(path, "rb") as f:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            np.lib.format.read_array_header_1_0(f)
        else:
            np.lib.format.read_array_header_2_0(f)
        return f.tell()


def _handed_over(path: str, sums: np.ndarray, what: str, fence: np.ndarray | None, described: tuple) -> VerifiedArray:
    return VerifiedArray(RemotePath(path), handed_over(sums, what, *described), sums, what, fence)


def _reopen(path: str, sums: np.ndarray, what: str, fence: np.ndarray | None = None) -> VerifiedArray:
    from detsampler.storage import as_path

    remote = as_path(path)
    if isinstance(remote, RemotePath):
        return VerifiedArray(remote, open_remote(remote, remote.stat().st_size, sums, what), sums, what, fence)
    p = Path(path)
    try:
        arr = np.load(p, mmap_mode="r", allow_pickle=False)
    except ValueError:  # an empty array cannot be memory-mapped
        arr = np.load(p, allow_pickle=False)
    return VerifiedArray(p, arr, sums, what, fence)
