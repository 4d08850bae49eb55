"""Durable, atomic file writes: the one place that says how a file or directory reaches the disk.

Invariants: after :func:`atomic_write` returns, ``path`` holds exactly ``data`` and survives a power cut (the data and
the directory entry are fsynced); at no moment does ``path`` hold a partial write (the data goes to a temporary file in
the same directory, renamed over ``path``); a failed write leaves ``path`` as it was and no temporary file behind
(tests/test_foundations.py).
"""

from __future__ import annotations

import contextlib
import errno
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

__all__ = ["atomic_write", "fsync_dir", "fsync_file", "removable_lock", "temporary_name"]

# fsync of a directory is not supported everywhere (some network and FUSE filesystems): nothing more can be done there.
_UNSUPPORTED = {errno.EINVAL, errno.ENOTSUP, errno.EBADF, errno.EISDIR, errno.EACCES}


def fsync_file(path: str | os.PathLike) -> None:
    """Flush ``path``'s data to the disk."""
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def fsync_dir(path: str | os.PathLike) -> None:
    """Flush ``path``'s directory entries (a rename into it, a new file) to the disk, where the filesystem
    supports it."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        if exc.errno in _UNSUPPORTED:
            return
        raise
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in _UNSUPPORTED:
            raise
    finally:
        os.close(fd)


def temporary_name(path: str | os.PathLike) -> Path:
    """A fresh hidden name beside ``path`` (same directory, so a rename onto ``path`` is atomic)."""
    path = Path(path)
    return path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")


def atomic_write(path: str | os.PathLike, data: bytes | str) -> None:
    """Write ``data`` (``str`` as UTF-8) to ``path`` atomically and durably (module invariants)."""
    path = Path(path)
    tmp = temporary_name(path)
    try:
        with open(tmp, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


@contextlib.contextmanager
def removable_lock(path: str | os.PathLike) -> Iterator[None]:
    """An exclusive lock (``flock``) on the file ``path``, removed when the lock is released, so that a build, refused
    or done, leaves no lock file behind.

    Removing a lock file is safe only because every holder checks, once it holds the lock, that ``path`` still names
    the file it locked (a waiter that locked a file removed meanwhile retries on the new one). Where ``flock`` does not
    exist the lock is a ``filelock.FileLock`` whose file stays.
    """
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        from filelock import FileLock

        with FileLock(str(path)):
            yield
        return
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            mine = os.fstat(fd)
            try:
                now = os.stat(path)
                same = (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino)
            except FileNotFoundError:
                same = False
        except BaseException:
            os.close(fd)
            raise
        if same:
            break
        os.close(fd)  # the file was removed by the holder before us: lock the new one
    try:
        yield
    finally:
        try:
            os.unlink(path)  # before the release: a waiter on this file then sees it gone and retries
        finally:
            os.close(fd)
