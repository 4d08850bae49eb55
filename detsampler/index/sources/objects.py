"""The files of one pre-tokenized source as an open sees them: each asked about once, the remote ones concurrently.

A :class:`SourceFiles` stats every file an opener may read (the token file, the format's index or metadata files, the
optional ones) when it is made: a local file by ``os.stat``, an object by one HEAD each (size, ETag, last write), all
HEADs of one source at once on a small pool. Whole reads of the small files are memoized, so a file read for its
document boundaries and for the source's identity is fetched once per open.

A source in an object store whose server sends a strong ETag (S3, GCS, Azure) has its identity **recorded**: after the
first open computes it (from the bytes its scan reads anyway), ``$DETSAMPLER_CACHE/sources/identity-<key>.json``
holds it, bound to every file's URL, size, ETag and last write (the key hashes them, the record repeats them and is
sealed). A later open reads the record, checks its seal and that every file still has those versions, and fetches no
byte of the token file for the identity; a write of any file (a new ETag) names another record, so the identity is
computed again from the new bytes. A damaged record is said in one warning line and replaced. Invariant: an identity
is served from a record only when every file's current (size, ETag, last write) equals the recorded one.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from detsampler.atomic import atomic_write
from detsampler.index.format import default_cache_dir, seal_meta, seal_ok
from detsampler.storage import ObjectNotFoundError, RemotePath, store_for

__all__ = ["IDENTITY_RECORD_VERSION", "SourceFiles", "head_all"]

logger = logging.getLogger("detsampler")

IDENTITY_RECORD_VERSION = 1  # the recorded identity's fields; tick if they change
_HEAD_THREADS = 8  # HEADs of one open in flight at once
_RECORD_KIND = "detsampler-source-identity"

Version = tuple[int, str, str]  # an object's (size, ETag, last write); a file's stat, as (size, "", "")


def head_all(paths: Sequence[Path | RemotePath]) -> dict[Path | RemotePath, Version | None]:
    """Each path's version (None: it does not exist): a local file's size, an object's (size, ETag, last write), the
    objects' HEADs issued concurrently."""
    out: dict[Path | RemotePath, Version | None] = {}
    remote = [p for p in dict.fromkeys(paths) if isinstance(p, RemotePath)]
    for p in paths:
        if not isinstance(p, RemotePath):
            out[p] = (p.stat().st_size, "", "") if p.is_file() else None
    if len(remote) == 1:
        out[remote[0]] = _head(remote[0])
    elif remote:
        with ThreadPoolExecutor(min(_HEAD_THREADS, len(remote)), thread_name_prefix="detsampler-head") as pool:
            out.update(zip(remote, pool.map(_head, remote)))
    return out


def _head(path: RemotePath) -> Version | None:
    try:
        return store_for(path.url).version(path.url)
    except ObjectNotFoundError:
        return None


class SourceFiles:
    """The files an opener of ``kind`` may read (see the module doc); the first one is the token file."""

    def __init__(self, kind: str, paths: Sequence[Path | RemotePath]) -> None:
        self.kind, self.paths = kind, list(paths)
        self._versions = head_all(self.paths)
        self._bytes: dict[Path | RemotePath, bytes] = {}

    @property
    def remote(self) -> bool:
        """Whether the files are objects in a store (a source lies wholly in one place)."""
        return isinstance(self.paths[0], RemotePath)

    def exists(self, path: Path | RemotePath) -> bool:
        return self._versions[path] is not None

    def size(self, path: Path | RemotePath) -> int:
        version = self._versions[path]
        if version is None:
            raise FileNotFoundError(f"{self.kind} source: {str(path)!r} does not exist")
        return version[0]

    def read_bytes(self, path: Path | RemotePath) -> bytes:
        """The whole file, read once per open (one GET of an object)."""
        if path not in self._bytes:
            self._bytes[path] = path.read_bytes()
        return self._bytes[path]

    def versions(self, files: Sequence[Path | RemotePath]) -> list[tuple[str, Version]] | None:
        """``(url, version)`` of each object of ``files`` when every one has a strong ETag (one that changes with its
        bytes, RFC 9110), else None: no record of these objects can be trusted."""
        out = []
        for f in files:
            version = self._versions[f]
            if version is None or version[1] in ("None", "") or version[1].startswith("W/"):
                return None
            out.append((str(f), version))
        return out

    def etag(self, path: Path | RemotePath) -> str | None:
        """The object's strong ETag (None: a local file, a missing one, or an object without a strong ETag)."""
        versions = self.versions([path]) if self.exists(path) and isinstance(path, RemotePath) else None
        return versions[0][1][1] if versions else None

    def untrusted(self, files: Sequence[Path | RemotePath]) -> str | None:
        """The URL of the first object of ``files`` without a strong ETag (None when all have one)."""
        for f in files:
            version = self._versions[f]
            if version is not None and (version[1] in ("None", "") or version[1].startswith("W/")):
                return str(f)
        return None

    # -- the recorded identity
    def _record_path(self, files: Sequence[Path | RemotePath]) -> tuple[Path, list] | None:
        versions = self.versions(files)
        if not self.remote or versions is None:
            return None
        listed = [[url, *version] for url, version in versions]
        key = hashlib.sha256(repr((IDENTITY_RECORD_VERSION, self.kind, listed)).encode()).hexdigest()[:24]
        return default_cache_dir() / "sources" / f"identity-{key}.json", listed

    def recorded_identity(self, files: Sequence[Path | RemotePath]) -> str | None:
        """The identity recorded for ``files`` at their current versions, or None (none recorded, untrusted objects,
        or a damaged record: said in one warning line, and the caller computes it again and records it)."""
        where = self._record_path(files)
        if where is None or not where[0].is_file():
            return None
        path, listed = where
        try:
            record = json.loads(path.read_text())
            if not isinstance(record, dict) or not seal_ok(record):
                raise ValueError("its seal does not match its content")
            if record.get("kind") != _RECORD_KIND or record.get("version") != IDENTITY_RECORD_VERSION:
                raise ValueError(f"it is not a version-{IDENTITY_RECORD_VERSION} identity record")
            if record.get("files") != listed or not isinstance(record.get("identity"), str):
                raise ValueError("it names other objects or versions than its name says")
            return record["identity"]
        except (OSError, ValueError) as exc:
            logger.warning(
                "detsampler: the recorded identity %r is damaged (%s): read again from the objects, and replaced",
                str(path),
                " ".join(str(exc).split()),
            )
            return None

    def record_identity(self, files: Sequence[Path | RemotePath], identity: str) -> None:
        """Record ``identity`` for ``files`` at their versions (atomically; an unwritable cache records nothing)."""
        where = self._record_path(files)
        if where is None:
            return
        path, listed = where
        record = {"kind": _RECORD_KIND, "version": IDENTITY_RECORD_VERSION, "files": listed, "identity": identity}
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(path, json.dumps(seal_meta(record), indent=1, sort_keys=True) + "\n")
        except OSError:
            pass

    def stamp(self, files: Sequence[Path | RemotePath]) -> tuple[str | None, str | None]:
        """(the files' stamp, None), or (None, the URL of an object no stamp can be trusted for): see
        :func:`detsampler.index.sources.base.scan_source`. Local files: their device, inode, size, mtime and ctime
        (ctime cannot be set from user space: any write names another entry); objects: their versions, asked once."""
        if not self.remote:
            stats = [os.stat(f) for f in files]
            key = [(s.st_dev, s.st_ino, s.st_size, s.st_mtime_ns, s.st_ctime_ns) for s in stats]
            return hashlib.sha256(repr(key).encode()).hexdigest()[:16], None
        versions = self.versions(files)
        if versions is None:
            return None, self.untrusted(files) or str(files[0])
        return hashlib.sha256(repr(versions).encode()).hexdigest()[:16], None
