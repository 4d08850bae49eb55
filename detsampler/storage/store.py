"""The object store: the narrow surface every array, record and manifest of an index is read from and written to.

One :class:`Store` per backend: :class:`LocalStore` (files; arrays are still memory-mapped by their readers, this only
serves the small reads and writes) and :class:`ObjectStore` (S3, GCS, Azure, HTTP through ``obstore``, the optional
extra ``remote``). :func:`store_for` picks it from a location (:mod:`detsampler.storage.urls`).

Invariants: ``read_ranges(url, ranges)`` returns exactly the bytes ``[start, end)`` of each range, in order, or raises;
``put`` is atomic (a reader sees the old object, or none, or all of the new one: a local file is renamed into place,
an object PUT or multipart upload becomes visible only once complete); a request that fails for a reason that may pass
(no answer, a lost connection, a 5xx but 501 and 505, 408 or 429 status) is retried with exponential backoff
(:class:`RetryPolicy`), each retry logged (logger ``detsampler.storage``: the object, the request, the cause, the time
left), and when the retries run out a :class:`StorageError` names the object, the retries made and the cause; any other
failure is not retried. A range the object does not hold (it is empty or shorter: HTTP 416, or fewer bytes returned) is
refused naming the object's size and the range wanted.
"""

from __future__ import annotations

import logging
import math
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Protocol, TypeVar, runtime_checkable

from detsampler.atomic import atomic_write
from detsampler.storage.urls import Location, join, parse_location

__all__ = [
    "CreateOnlyUnsupportedError",
    "LocalStore",
    "ObjectChangedError",
    "ObjectNotFoundError",
    "ObjectStore",
    "RangeReader",
    "RetryPolicy",
    "StorageError",
    "Store",
    "store_for",
]


log = logging.getLogger("detsampler.storage")
T = TypeVar("T")
COALESCE_BYTES = 1 << 20  # a remote store merges ranges closer than this into one request (0: only what is asked)


class StorageError(OSError):
    """A read or write of an object that failed (after its retries, for a remote one); the message names it."""


class ObjectNotFoundError(StorageError, FileNotFoundError):
    """An object that does not exist."""


class CreateOnlyUnsupportedError(StorageError):
    """A create-only write (:meth:`ObjectStore.create`) asked of a store that offers none."""


class ObjectChangedError(StorageError):
    """A read of one version of an object (``if_match``: its ETag) that the store no longer holds (HTTP 412)."""


@runtime_checkable
class RangeReader(Protocol):
    """The read surface a prefetcher needs: an object's size and many byte ranges of it in one call."""

    def size(self, url: str) -> int: ...

    def read_ranges(
        self,
        url: str,
        ranges: Sequence[tuple[int, int]],
        *,
        coalesce_bytes: int = COALESCE_BYTES,
        if_match: str | None = None,
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


def _too_short(url: str, size: int, ranges: Sequence[tuple[int, int]]) -> StorageError:
    """The error of a read of ``ranges`` reaching past the end of an object of ``size`` bytes (not retried)."""
    a, b = next(((a, b) for a, b in ranges if b > size), ranges[-1])
    return _ShortObjectError(
        f"{url}: the object is {'empty' if size == 0 else 'truncated'}: it holds {size} bytes, and bytes [{a}, {b})"
        " were wanted",
        size,
    )


class _ShortObjectError(StorageError):
    """A read past the end of an object (``size``: the object's bytes)."""

    def __init__(self, message: str, size: int) -> None:
        super().__init__(message)
        self.size = size


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
        self,
        url: str,
        ranges: Sequence[tuple[int, int]],
        *,
        coalesce_bytes: int = COALESCE_BYTES,
        if_match: str | None = None,
    ) -> list[bytes]:
        """The bytes of each range (``if_match`` is an object's ETag: a file has none, it is not checked)."""
        ranges = _check_ranges(url, ranges)
        try:
            with open(self._path(url), "rb") as f:
                out = [os.pread(f.fileno(), b - a, a) for a, b in ranges]
                if any(len(data) != b - a for (a, b), data in zip(ranges, out)):
                    raise _too_short(url, os.fstat(f.fileno()).st_size, ranges)
                return out
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
        times = (self.init_backoff_s, self.max_backoff_s, self.retry_timeout_s, self.request_timeout_s)
        if not all(math.isfinite(t) for t in times) or min(self.retry_timeout_s, self.request_timeout_s) <= 0:
            raise ValueError(f"Got {self!r}: the timeouts must be > 0 seconds, and every time finite")

    @classmethod
    def from_env(cls) -> RetryPolicy:
        env = os.environ
        fields: dict[str, Any] = {}
        for name, field, cast, rule in (
            ("DETSAMPLER_STORAGE_MAX_RETRIES", "max_retries", int, "an integer >= 0"),
            ("DETSAMPLER_STORAGE_RETRY_TIMEOUT_S", "retry_timeout_s", float, "a number of seconds, finite and > 0"),
            ("DETSAMPLER_STORAGE_REQUEST_TIMEOUT_S", "request_timeout_s", float, "a number of seconds, finite and > 0"),
        ):
            if env.get(name):
                try:
                    value = cast(env[name])
                except ValueError:
                    value = None
                # NOTE: inf or nan seconds passed here and failed every request later, naming no setting
                if value is None or not math.isfinite(value) or value < 0 or (cast is float and value == 0):
                    raise ValueError(f"Got {name}={env[name]!r}, it must be {rule}") from None
                fields[field] = value
        return cls(**fields)

    def client_options(self, allow_http: bool) -> dict:
        return {"allow_http": allow_http, "timeout": timedelta(seconds=self.request_timeout_s)}

    def retry_config(self) -> dict:
        """The client's own retry settings: none (NOTE: :class:`ObjectStore` retries each request itself, so that
        every retry is logged with the time left; the client's retries are silent)."""
        return {
            "max_retries": 0,
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
        self._clients: dict[tuple[int, str, str, tuple], Any] = {}

    def _client(self, loc: Location) -> Any:
        """This process's client for ``loc``'s bucket, made again whenever the environment its scheme reads changed
        (another endpoint is another server: ``AWS_ENDPOINT_URL``, ``AZURITE_BLOB_STORAGE_URL``, credentials)."""
        _check_not_forked(str(loc))
        endpoint = os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT") or ""
        key = (os.getpid(), loc.scheme, loc.bucket, _client_environment(loc.scheme))
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

    def _call(self, url: str, what: str, request: Callable[[], T], ranges: Sequence[tuple[int, int]] = ()) -> T:
        """``request()``, retried while its failure may pass and the policy allows: each retry is logged (the object,
        the request, the cause, the wait and the time left), and the last failure is a :class:`StorageError` that
        says how many retries were made in how long. ``ranges``: the byte ranges it reads (a 416 names them)."""
        policy, start, retries = self.retry, time.monotonic(), 0
        while True:
            try:
                return request()
            except BaseException as exc:
                panic = type(exc).__name__ == "PanicException"  # the client's Rust panic (a BaseException)
                if not isinstance(exc, Exception) and not panic:
                    raise
                status = _status(exc)
                if ranges and (status == 416 or panic):  # a range past the end: 416, or a panic slicing a merged one
                    size = self.size(url)
                    if any(b > size for _, b in ranges):
                        raise _too_short(url, size, ranges) from None
                if not _transient(exc, status):
                    raise self._fail(url, what, exc) from None
                elapsed = time.monotonic() - start
                wait = min(policy.init_backoff_s * 2**retries, policy.max_backoff_s)
                left = policy.retry_timeout_s - elapsed
                if retries >= policy.max_retries or wait >= left:
                    raise self._fail(url, what, exc, (retries, elapsed)) from None
                retries += 1
                log.warning(
                    "storage: %s: %s failed (%s); retry %d of at most %d in %.1f s, %.1f s left of the %g s allowed",
                    url,
                    what,
                    self._why(exc, 200),
                    retries,
                    policy.max_retries,
                    wait,
                    left,
                    policy.retry_timeout_s,
                )
                time.sleep(wait)

    def _why(self, exc: BaseException, limit: int = 400) -> str:
        """The cause of a failed request in one line (a timeout said as such)."""
        text = str(exc)
        why = " ".join(text.split("\n\nDebug source")[0].split())[:limit]
        if "kind: Timeout" in text or "TimedOut" in text:
            why = f"no answer within the request timeout of {self.retry.request_timeout_s:g} s: {why}"
        return f"{type(exc).__name__}: {why}"

    def _fail(self, url: str, what: str, exc: BaseException, retried: tuple[int, float] | None = None) -> StorageError:
        if isinstance(exc, StorageError):  # refused before any request (a forked process)
            return exc
        if isinstance(exc, FileNotFoundError) and what in _WRITES:  # a write creates its object: no bucket to put it in
            loc = parse_location(url)
            kind = "container" if loc.scheme in _CONTAINERS else "bucket"  # NOTE: Azure's was called a bucket
            return StorageError(f"{url}: {what} failed: the {kind} {loc.bucket!r} does not exist (create it first)")
        if isinstance(exc, FileNotFoundError):
            return ObjectNotFoundError(f"{url}: does not exist ({what})")
        if retried is None:
            return StorageError(f"{url}: {what} failed, a failure that is not retried ({self._why(exc)})")
        retries, elapsed = retried
        return StorageError(
            f"{url}: {what} failed after {retries} {'retry' if retries == 1 else 'retries'} in {elapsed:.1f} s (at"
            f" most {self.retry.max_retries} within {self.retry.retry_timeout_s:g} s: DETSAMPLER_STORAGE_MAX_RETRIES,"
            f" DETSAMPLER_STORAGE_RETRY_TIMEOUT_S) ({self._why(exc)})"
        )

    def size(self, url: str) -> int:
        loc = parse_location(url)
        return int(self._call(url, "HEAD", lambda: _obstore().head(self._client(loc), loc.key))["size"])

    def read_ranges(
        self,
        url: str,
        ranges: Sequence[tuple[int, int]],
        *,
        coalesce_bytes: int = COALESCE_BYTES,
        if_match: str | None = None,
    ) -> list[bytes]:
        """The bytes of each range, in order; ranges closer than ``coalesce_bytes`` are fetched in one request (the
        bytes between them too), the requests of one call run in parallel (up to 10). With ``if_match`` (an ETag)
        each range is one conditional GET (``If-Match``), all at once, and a store that no longer holds that version
        of the object answers 412: :class:`ObjectChangedError`, never another version's bytes."""
        ranges = _check_ranges(url, ranges)
        loc = parse_location(url)
        nonempty = [(a, b) for a, b in ranges if b > a]
        what = f"ranged GET of {len(nonempty)} ranges"

        def request() -> list:
            if if_match is not None:
                return _conditional_ranges(self._client(loc), loc.key, nonempty, if_match)
            return _obstore().get_ranges(
                self._client(loc),
                loc.key,
                starts=[a for a, _ in nonempty],
                ends=[b for _, b in nonempty],
                coalesce=int(coalesce_bytes),
            )

        try:
            got = self._call(url, what, request, nonempty) if nonempty else []
        except _PreconditionFailed:
            raise ObjectChangedError(
                f"{url}: the object changed since it was opened (its ETag was {if_match}, the store no longer holds"
                " that version): open the source again"
            ) from None
        it = iter(got)
        out = [bytes(next(it)) if b > a else b"" for a, b in ranges]
        if any(len(data) != b - a for (a, b), data in zip(ranges, out)):
            raise _too_short(url, self.size(url), ranges)
        return out

    def read_head(self, url: str, num_bytes: int) -> tuple[bytes, int]:
        """The first ``num_bytes`` bytes of the object (fewer when it is shorter) and its size, in one request (the
        whole object for ``num_bytes`` < 0)."""
        loc = parse_location(url)
        options = {"range": (0, num_bytes)} if num_bytes >= 0 else {}

        def get() -> tuple[bytes, int]:
            got = _obstore().get(self._client(loc), loc.key, options=options)
            return bytes(got.bytes()), int(got.meta["size"])

        try:
            return self._call(url, "GET", get, [(0, num_bytes)] if num_bytes > 0 else ())
        except _ShortObjectError as exc:
            if exc.size == 0:  # an empty object holds no first bytes (HTTP 416): the caller checks its size
                return b"", 0
            raise

    def version(self, url: str) -> tuple:
        """What changes whenever the object is written: its size, ETag and last write time."""
        loc = parse_location(url)
        meta = self._call(url, "HEAD", lambda: _obstore().head(self._client(loc), loc.key))
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

        def listing() -> list[str]:
            pages = _obstore().list(self._client(loc), prefix=prefix or None)
            return sorted(join(base, meta["path"]) for page in pages for meta in page)

        return self._call(url, "LIST", listing)

    def put(self, url: str, data: bytes | Path) -> None:
        loc = parse_location(url)
        self._call(url, "PUT", lambda: _obstore().put(self._client(loc), loc.key, data))

    def put_tagged(
        self, url: str, data: bytes | Path | Iterable[bytes], *, multipart: bool | None = None
    ) -> str | None:
        """:meth:`put`, returning the ETag the store gave the object written (None when it gives none). ``data`` may
        be an iterable of bytes, read once, in order, as it is sent: an exception it raises ends the upload before it
        completes (a single PUT is never sent, a multipart upload is aborted) and is raised. ``multipart``: whether to
        upload in parts (obstore's default: a file over 5 MiB, or an iterable)."""
        loc = parse_location(url)
        try:
            return _obstore().put(self._client(loc), loc.key, data, use_multipart=multipart).get("e_tag")
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
        self._call(url, "DELETE", lambda: _obstore().delete(self._client(loc), loc.key))


class _PreconditionFailed(StorageError):
    """A conditional read refused by the store (412): the object is not the version asked for."""


def _conditional_ranges(client: Any, key: str, ranges: list[tuple[int, int]], etag: str) -> list[bytes]:
    """The bytes of ``ranges`` of one version of an object (``If-Match: etag``), the GETs issued at once.

    NOTE: each GET is the client's blocking call, run on this process's pool (:func:`_get_pool`): an event loop per
    call (``asyncio.run`` of ``get_async``) cost the client 3x the CPU time per GET (0.8 ms against 0.25 ms for an
    unconditional read, benchmark 17), which a loaded machine's training loop paid for in data wait."""
    obstore = _obstore()

    def one(span: tuple[int, int]) -> bytes:
        try:
            return bytes(obstore.get(client, key, options={"range": span, "if_match": etag}).bytes())
        except Exception as exc:
            if type(exc).__name__ == "PreconditionError" or _status(exc) == 412:
                raise _PreconditionFailed(str(exc)) from None
            raise

    if len(ranges) == 1:
        return [one(ranges[0])]
    return list(_get_pool().map(one, ranges))


_GET_THREADS = 32  # the conditional GETs in flight at once, per process (a prefetcher's 8 threads x 4 runs a call)
_POOL: tuple[int, ThreadPoolExecutor] | None = None
_POOL_LOCK = threading.Lock()


def _get_pool() -> ThreadPoolExecutor:
    """This process's pool of threads for conditional GETs (made on first use; a forked child makes its own)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None or _POOL[0] != os.getpid():
            _POOL = (os.getpid(), ThreadPoolExecutor(_GET_THREADS, thread_name_prefix="detsampler-get"))
        return _POOL[1]


# the environment each scheme's client is built from (obstore's builders read these prefixes)
_ENV_PREFIXES = {"s3": ("AWS_",), "gs": ("GOOGLE_",), "gcs": ("GOOGLE_",)}
_ENV_PREFIXES.update(dict.fromkeys(("az", "abfs", "abfss"), ("AZURE_", "AZURITE_")))


def _client_environment(scheme: str) -> tuple[tuple[str, str], ...]:
    """The variables of the environment that a client of ``scheme`` is built from, sorted (none for HTTP)."""
    prefixes = _ENV_PREFIXES.get(scheme)
    return tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith(prefixes))) if prefixes else ()


_WRITES = ("PUT", "create-only PUT")  # requests that create their object (a "not found" names the bucket)
_CONTAINERS = ("az", "abfs", "abfss")  # Azure Blob storage: objects live in containers (S3 and GCS: buckets)
_STATUS = re.compile(r"status code: (\d{3})|status: (\d{3})")


def _status(exc: BaseException) -> int | None:
    """The HTTP status a failed request got, when it got one."""
    match = _STATUS.search(str(exc))
    return int(match.group(1) or match.group(2)) if match else None


def _transient(exc: BaseException, status: int | None) -> bool:
    """Whether a failure may pass when the request is made again: no answer or a lost connection (the client's
    ``GenericError`` without a status), a server error (5xx but 501 and 505), a timeout (408) or throttling (429). Not:
    a missing object, refused credentials, a bad request, a refusal before any request (a forked process)."""
    if isinstance(exc, (StorageError, FileNotFoundError, PermissionError)):
        return False
    if type(exc).__name__ not in ("GenericError", "JoinError") and not isinstance(exc, (TimeoutError, ConnectionError)):
        return False
    # NOTE: 501 (Not Implemented: a read-only HTTP server's PUT) and 505 say the server never does it: not retried
    return status is None or (status >= 500 and status not in (501, 505)) or status in (408, 429)


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
