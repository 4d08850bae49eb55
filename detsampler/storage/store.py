"""The object store: the narrow surface every array, record and manifest of an index is read from and written to.

One :class:`Store` per backend: :class:`LocalStore` (files; arrays are still memory-mapped by their readers, this only
serves the small reads and writes) and :class:`ObjectStore` (S3, GCS, Azure, HTTP through ``obstore``, the optional
extra ``remote``). :func:`store_for` picks it from a location (:mod:`detsampler.storage.urls`).

Invariants: ``read_ranges(url, ranges)`` returns exactly the bytes ``[start, end)`` of each range, in order, or raises;
``put`` is atomic (a reader sees the old object, or none, or all of the new one: a local file is renamed into place,
an object PUT or multipart upload becomes visible only once complete); a request that fails is retried with exponential
backoff (:class:`RetryPolicy`), and when the retries run out a :class:`StorageError` names the object and the cause.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from detsampler.atomic import atomic_write
from detsampler.storage.urls import Location, join, parse_location

__all__ = [
    "CreateOnlyUnsupportedError",
    "LocalStore",
    "ObjectNotFoundError",
    "ObjectStore",
    "RangeReader",
    "RetryPolicy",
    "StorageError",
    "Store",
    "store_for",
]


COALESCE_BYTES = 1 << 20  # a remote store merges ranges closer than this into one request (0: only what is asked)


class StorageError(OSError):
    """A read or write of an object that failed (after its retries, for a remote one); the message names it."""


class ObjectNotFoundError(StorageError, FileNotFoundError):
    """An object that does not exist."""


class CreateOnlyUnsupportedError(StorageError):
    """A create-only write (:meth:`ObjectStore.create`) asked of a store that offers none."""


@runtime_checkable
class RangeReader(Protocol):
    """The read surface a prefetcher needs: an object's size and many byte ranges of it in one call."""

    def size(self, url: str) -> int: ...

    def read_ranges(
        self, url: str, ranges: Sequence[tuple[int, int]], *, coalesce_bytes: int = COALESCE_BYTES
    ) -> list[bytes]: ...


@runtime_checkable
class Store(RangeReader, Protocol):
    """:class:`RangeReader` plus a first-bytes read that also gives the size (one request), existence, listing and
    atomic writes."""

    def read_head(self, url: str, num_bytes: int) -> tuple[bytes, int]: ...

    def exists(self, url: str) -> bool: ...

    def list(self, url: str) -> list[str]: ...

    def put(self, url: str, data: bytes | Path) -> None: ...


def _check_ranges(url: str, ranges: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    out = [(int(a), int(b)) for a, b in ranges]
    for a, b in out:
        if a < 0 or b < a:
            raise ValueError(f"{url}: Got byte range [{a}, {b}), a range is [start, end) with 0 <= start <= end")
    return out


class LocalStore:
    """Files on a local or POSIX-shared filesystem (``url``: a path or ``file://`` URL)."""

    @staticmethod
    def _path(url: str) -> Path:
        return Path(parse_location(url).key)

    def size(self, url: str) -> int:
        try:
            return self._path(url).stat().st_size
        except FileNotFoundError:
            raise ObjectNotFoundError(f"{url}: does not exist") from None

    def read_ranges(
        self, url: str, ranges: Sequence[tuple[int, int]], *, coalesce_bytes: int = COALESCE_BYTES
    ) -> list[bytes]:
        ranges = _check_ranges(url, ranges)
        try:
            with open(self._path(url), "rb") as f:
                return [os.pread(f.fileno(), b - a, a) for a, b in ranges]
        except FileNotFoundError:
            raise ObjectNotFoundError(f"{url}: does not exist") from None

    def exists(self, url: str) -> bool:
        return self._path(url).is_file()

    def read_head(self, url: str, num_bytes: int) -> tuple[bytes, int]:
        """The first ``num_bytes`` bytes of the file (fewer when it is shorter; all for ``num_bytes`` < 0) and its
        size."""
        try:
            with open(self._path(url), "rb") as f:
                size = os.fstat(f.fileno()).st_size
                return os.pread(f.fileno(), size if num_bytes < 0 else num_bytes, 0), size
        except FileNotFoundError:
            raise ObjectNotFoundError(f"{url}: does not exist") from None

    def list(self, url: str) -> list[str]:
        root = self._path(url)
        return sorted(str(p) for p in root.rglob("*") if p.is_file()) if root.is_dir() else []

    def put(self, url: str, data: bytes | Path) -> None:
        path = self._path(url)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, Path(data).read_bytes() if isinstance(data, Path) else data)


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """How a remote request is retried: up to ``max_retries`` times, waiting ``init_backoff_s`` doubling up to
    ``max_backoff_s``, within ``retry_timeout_s`` in all; a request is abandoned after ``request_timeout_s``.

    :meth:`from_env` reads ``DETSAMPLER_STORAGE_MAX_RETRIES``, ``DETSAMPLER_STORAGE_RETRY_TIMEOUT_S`` and
    ``DETSAMPLER_STORAGE_REQUEST_TIMEOUT_S`` over these defaults."""

    max_retries: int = 5
    init_backoff_s: float = 0.1
    max_backoff_s: float = 5.0
    retry_timeout_s: float = 120.0
    request_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        if self.max_retries < 0 or min(self.init_backoff_s, self.max_backoff_s) <= 0:
            raise ValueError(f"Got {self!r}: max_retries must be >= 0 and the backoffs > 0")
        if min(self.retry_timeout_s, self.request_timeout_s) <= 0:
            raise ValueError(f"Got {self!r}: the timeouts must be > 0 seconds")

    @classmethod
    def from_env(cls) -> RetryPolicy:
        env = os.environ
        fields: dict[str, Any] = {}
        for name, field, cast in (
            ("DETSAMPLER_STORAGE_MAX_RETRIES", "max_retries", int),
            ("DETSAMPLER_STORAGE_RETRY_TIMEOUT_S", "retry_timeout_s", float),
            ("DETSAMPLER_STORAGE_REQUEST_TIMEOUT_S", "request_timeout_s", float),
        ):
            if env.get(name):
                try:
                    fields[field] = cast(env[name])
                except ValueError:
                    raise ValueError(f"Got {name}={env[name]!r}, it must be a number") from None
        return cls(**fields)

    def client_options(self, allow_http: bool) -> dict:
        return {"allow_http": allow_http, "timeout": timedelta(seconds=self.request_timeout_s)}

    def retry_config(self) -> dict:
        return {
            "max_retries": self.max_retries,
            "backoff": {
                "init_backoff": timedelta(seconds=self.init_backoff_s),
                "max_backoff": timedelta(seconds=self.max_backoff_s),
                "base": 2,
            },
            "retry_timeout": timedelta(seconds=self.retry_timeout_s),
        }


_RUNTIME_PID: int | None = None  # the process whose obstore client started obstore's runtime


def _obstore() -> Any:
    try:
        import obstore
    except ImportError:  # pragma: no cover - the extra is installed in the test environment
        raise ImportError("reading or writing object storage needs obstore: pip install 'detsampler[remote]'") from None
    return obstore


def _check_not_forked(url: str) -> None:
    """Refuse to use obstore in a process forked after its parent used it.

    NOTE: obstore's runtime (tokio's threads, its I/O driver) does not survive ``fork``: a forked child's first request
    waits forever (tests/test_prefetch.py). A DataLoader worker started by ``forkserver`` or ``spawn`` starts its own.
    """
    global _RUNTIME_PID
    if _RUNTIME_PID is None:
        _RUNTIME_PID = os.getpid()
    elif os.getpid() != _RUNTIME_PID:
        raise StorageError(
            f"{url}: this process was forked from process {_RUNTIME_PID} after that one read or wrote object storage,"
            " and the client's runtime does not survive a fork (its requests would wait forever): start DataLoader"
            " workers with multiprocessing_context='forkserver' (or 'spawn'), or open the index in the workers only"
        )


class ObjectStore:
    """Objects in S3, GCS, Azure Blob or behind HTTP(S), through ``obstore`` (credentials and endpoint from the usual
    environment: ``AWS_*`` and ``AWS_ENDPOINT_URL``, ``GOOGLE_*``, ``AZURE_*``). One client per bucket and process (a
    forked DataLoader worker makes its own)."""

    def __init__(self, retry: RetryPolicy | None = None) -> None:
        self.retry = retry or RetryPolicy.from_env()
        self._clients: dict[tuple[int, str, str, str], Any] = {}

    def _client(self, loc: Location) -> Any:
        _check_not_forked(str(loc))
        endpoint = os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT") or ""
        key = (os.getpid(), loc.scheme, loc.bucket, endpoint)  # a changed endpoint is another server: a new client
        client = self._clients.get(key)
        if client is None:
            allow_http = loc.scheme == "http" or (loc.scheme == "s3" and endpoint.startswith("http://"))
            client = _obstore().store.from_url(
                f"{loc.scheme}://{loc.bucket}",
                client_options=self.retry.client_options(allow_http),
                retry_config=self.retry.retry_config(),
            )
            self._clients = {k: v for k, v in self._clients.items() if k[0] == key[0]}  # drop a parent's clients
            self._clients[key] = client
        return client

    def _fail(self, url: str, what: str, exc: BaseException) -> StorageError:
        if isinstance(exc, StorageError):  # refused before any request (a forked process)
            return exc
        if isinstance(exc, FileNotFoundError):
            return ObjectNotFoundError(f"{url}: does not exist ({what})")
        why = " ".join(str(exc).split("\n\nDebug source")[0].split())
        return StorageError(
            f"{url}: {what} failed after up to {self.retry.max_retries} retries within {self.retry.retry_timeout_s:g} s"
            f" ({type(exc).__name__}: {why[:400]})"
        )

    def size(self, url: str) -> int:
        loc = parse_location(url)
        try:
            return int(_obstore().head(self._client(loc), loc.key)["size"])
        except Exception as exc:
            raise self._fail(url, "HEAD", exc) from None

    def read_ranges(
        self, url: str, ranges: Sequence[tuple[int, int]], *, coalesce_bytes: int = COALESCE_BYTES
    ) -> list[bytes]:
        """The bytes of each range, in order; ranges closer than ``coalesce_bytes`` are fetched in one request (the
        bytes between them too), the requests of one call run in parallel (up to 10)."""
        ranges = _check_ranges(url, ranges)
        loc = parse_location(url)
        nonempty = [(a, b) for a, b in ranges if b > a]
        try:
            got = (
                _obstore().get_ranges(
                    self._client(loc),
                    loc.key,
                    starts=[a for a, _ in nonempty],
                    ends=[b for _, b in nonempty],
                    coalesce=int(coalesce_bytes),
                )
                if nonempty
                else []
            )
        except Exception as exc:
            raise self._fail(url, f"ranged GET of {len(nonempty)} ranges", exc) from None
        it = iter(got)
        out = [bytes(next(it)) if b > a else b"" for a, b in ranges]
        for (a, b), data in zip(ranges, out):
            if len(data) != b - a:
                raise StorageError(f"{url}: bytes [{a}, {b}) returned {len(data)} bytes: the object is shorter")
        return out

    def read_head(self, url: str, num_bytes: int) -> tuple[bytes, int]:
        """The first ``num_bytes`` bytes of the object (fewer when it is shorter) and its size, in one request (the
        whole object for ``num_bytes`` < 0)."""
        loc = parse_location(url)
        try:
            options = {"range": (0, num_bytes)} if num_bytes >= 0 else {}
            got = _obstore().get(self._client(loc), loc.key, options=options)
            return bytes(got.bytes()), int(got.meta["size"])
        except Exception as exc:
            raise self._fail(url, "GET", exc) from None

    def version(self, url: str) -> tuple:
        """What changes whenever the object is written: its size, ETag and last write time."""
        loc = parse_location(url)
        try:
            meta = _obstore().head(self._client(loc), loc.key)
        except Exception as exc:
            raise self._fail(url, "HEAD", exc) from None
        return int(meta["size"]), str(meta.get("e_tag")), str(meta.get("last_modified"))

    def exists(self, url: str) -> bool:
        try:
            self.size(url)
        except ObjectNotFoundError:
            return False
        return True

    def list(self, url: str) -> list[str]:
        loc = parse_location(url)
        prefix = f"{loc.key}/" if loc.key else ""
        base = f"{loc.scheme}://{loc.bucket}"
        try:
            pages = _obstore().list(self._client(loc), prefix=prefix or None)
            return sorted(join(base, meta["path"]) for page in pages for meta in page)
        except Exception as exc:
            raise self._fail(url, "LIST", exc) from None

    def put(self, url: str, data: bytes | Path) -> None:
        loc = parse_location(url)
        try:
            _obstore().put(self._client(loc), loc.key, data)
        except Exception as exc:
            raise self._fail(url, "PUT", exc) from None

    def put_tagged(self, url: str, data: bytes | Path) -> str | None:
        """:meth:`put`, returning the ETag the store gave the object written (None when it gives none)."""
        loc = parse_location(url)
        try:
            return _obstore().put(self._client(loc), loc.key, data).get("e_tag")
        except Exception as exc:
            raise self._fail(url, "PUT", exc) from None

    def create(self, url: str, data: bytes) -> bool:
        """Write ``data`` at ``url`` only if no object is there: one conditional PUT (``If-None-Match: *``; Azure's
        equivalent). True when written, False when an object was there already (nothing written). Raises
        :class:`CreateOnlyUnsupportedError` when the store offers no create-only write (obstore's ``NotImplemented``:
        e.g. S3 with ``AWS_CONDITIONAL_PUT=disabled``, an HTTP server)."""
        from obstore.exceptions import AlreadyExistsError

        loc = parse_location(url)
        try:
            _obstore().put(self._client(loc), loc.key, data, mode="create")
        except AlreadyExistsError:
            return False
        except NotImplementedError:
            raise CreateOnlyUnsupportedError(f"{url}: this store does not support create-only writes") from None
        except Exception as exc:
            raise self._fail(url, "create-only PUT", exc) from None
        return True

    def delete(self, url: str) -> None:
        loc = parse_location(url)
        try:
            _obstore().delete(self._client(loc), loc.key)
        except Exception as exc:
            raise self._fail(url, "DELETE", exc) from None


_LOCAL = LocalStore()
_REMOTE: ObjectStore | None = None


def store_for(path: str | os.PathLike) -> LocalStore | ObjectStore:
    """The store that serves ``path``: the local filesystem, or (a remote URL) this process's :class:`ObjectStore`."""
    global _REMOTE
    if not parse_location(path).remote:
        return _LOCAL
    policy = RetryPolicy.from_env()
    if _REMOTE is None or _REMOTE.retry != policy:
        _REMOTE = ObjectStore(policy)
    return _REMOTE
