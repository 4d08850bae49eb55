"""A cache of fetched blocks shared by the processes of one node (its ranks and their DataLoader workers): a directory
on local disk or ``/dev/shm``, bounded in bytes, so that each block is fetched from the store once per node.

No server: the processes coordinate through the filesystem alone, as pip's and Hugging Face's caches do.

- **An entry** is one block of one object, in ``blocks/<h[:2]>/<h>.blk``, ``h`` the sha256 of its key: the object's
  *identity* (what names its content: the sha256 of an index array's chunk sums, or a pre-tokenized file's size and
  ETag), its URL, the block size and the block's number. Two runs sharing a directory therefore share a block only when
  they read the same bytes of the same object; an object rewritten at its URL (a new identity) never meets its old
  blocks. The file holds a header (magic, the key, the payload's length and CRC-32) and the block's bytes.
- **Published atomically**: written to ``tmp/`` under a name of the writer's pid, then renamed into place, so a reader
  sees a whole entry or none; a process killed while writing leaves a temporary file that is never served (removed by
  the next process that finds its writer dead).
- **Fetched once per node**: a process takes the lock of a block's stripe (``flock`` on one of 4,096 lock files: the
  kernel releases it when its holder dies, killed or not) before fetching it, and looks again once it holds it; a
  process that finds the stripe held waits for it, then reads the entry its holder published.
- **Checked before served**: every entry read is checked (magic, key, length, CRC-32) and then by the object's own
  check (an index's chunk CRC-32s) by the reader; one that fails is removed, said in one warning line, and fetched
  again from the store. No ``fsync``: an entry torn by a power cut fails its CRC and is fetched again, never served.
- **Bounded**: ``ledger`` holds the bytes of the entries (their files: header and block), updated under ``.lock``
  with every publish and removal (a newcomer's bytes reserved before it is renamed into place, so a writer killed
  between the two over-counts, never under-counts, and the next eviction round recounts from the directory). An
  entry is published only when it fits under ``cap_bytes`` after evictions: the entries whose next use (``ranking()``,
  given by the reader, asked once per round: a prefetcher ranks them by the node's plan) is furthest go first, the
  least recently used among those of no known use; a newcomer needed later than every entry that could make room is
  not published (bypass). This module knows nothing of plans.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import struct
import threading
import uuid
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

__all__ = ["NEVER_USED", "NodeCache"]

log = logging.getLogger("detsampler.storage")

NEVER_USED = 1 << 62  # the next use of an entry no known use reads
_MAGIC = b"DSNODE1\n"
_STRIPES = 4096
_VERSION = "v1"  # the directory's layout; tick if it changes


class NodeCache:
    """The node-shared block cache at ``directory`` of at most ``cap_bytes`` of blocks (see the module doc). One
    instance per process; its counts are this process's: ``hits`` (blocks served from the cache), ``fetched`` (blocks
    this process fetched from the store for it), ``published``, ``bypassed``, ``evicted``, ``waited`` (blocks another
    process was fetching), ``damaged`` (entries that failed a check, removed)."""

    ENTRY_HEADER_BYTES = 256  # the most bytes an entry holds besides its block (magic, length, the JSON header)

    def __init__(self, directory: str | os.PathLike, cap_bytes: int) -> None:
        if isinstance(cap_bytes, bool) or not isinstance(cap_bytes, int) or cap_bytes < 1:
            raise ValueError(f"Got cap_bytes={cap_bytes!r}, the node cache's cap must be an integer >= 1")
        self.root = Path(directory) / _VERSION
        self.cap_bytes = cap_bytes
        _make_layout(Path(directory), self.root)
        # a reader's ranking, asked once per eviction round: the next use of an entry (by its name)
        self.ranking: Callable[[], Callable[[str], int]] = lambda: lambda h: NEVER_USED
        self.hits = self.fetched = self.published = self.bypassed = self.evicted = self.waited = self.damaged = 0
        self._count_lock = threading.Lock()
        self._unwritable_said = False
        self._clear_orphans()

    # -- keys and entries
    @staticmethod
    def key(identity: str, url: str, block_bytes: int, block: int) -> str:
        """The entry name of block ``block`` of ``block_bytes`` of the object ``url`` whose content is ``identity``."""
        return hashlib.sha256(json.dumps([identity, url, block_bytes, block]).encode()).hexdigest()

    def _path(self, h: str) -> Path:
        return self.root / "blocks" / h[:2] / f"{h}.blk"

    def get(self, h: str) -> bytes | None:
        """The block of entry ``h`` once its header and CRC-32 check, or None (absent; damaged: removed, said)."""
        path = self._path(h)
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return None
        data = _payload(raw, h)
        if data is None:
            self.drop(h, "it fails its header or CRC-32 check")
            return None
        with contextlib.suppress(OSError):
            os.utime(path)  # its last use: recency among entries of no known use
        self._count("hits")
        return data

    def drop(self, h: str, why: str) -> None:
        """Remove entry ``h`` (it failed a check: ``why``), said in one warning line."""
        with self._global():
            size = self._remove(h)
        if size is not None:
            self._count("damaged")
            log.warning(
                "storage: node cache %s: entry %s removed (%s): fetched again from the store", self.root, h, why
            )

    # -- fetching once per node
    def fetch(self, want: list[int], names: dict[int, str], read: Callable[[list[int]], dict[int, bytes]]) -> dict:
        """Blocks ``want`` (their entry names ``names``): from the cache, else fetched by ``read`` (checked blocks of
        the store) once per node, under their stripes' locks, and published. Blocks the cache serves are the caller's
        to check (:meth:`drop` one that fails)."""
        out: dict[int, bytes] = {}
        missing = []
        for b in want:
            data = self.get(names[b])
            if data is None:
                missing.append(b)
            else:
                out[b] = data
        if not missing:
            return out
        mine, theirs = self._try_stripes(missing, names)
        try:
            out.update(self._fill([b for b in missing if _stripe(names[b]) in mine], names, read))
        finally:
            for fd in mine.values():
                os.close(fd)
        for b in [b for b in missing if b not in out]:  # another process holds its stripe: wait, then look again
            self._count("waited")
            with self._stripe_lock(_stripe(names[b])):
                out.update(self._fill([b], names, read))
        return out

    def _fill(self, blocks: list[int], names: dict[int, str], read: Callable) -> dict[int, bytes]:
        """Blocks whose stripes this process holds: the cache's (published meanwhile), else read and published."""
        out, lacking = {}, []
        for b in blocks:
            data = self.get(names[b])
            if data is None:
                lacking.append(b)
            else:
                out[b] = data
        if lacking:
            got = read(lacking)
            for b in lacking:
                self._publish(names[b], got[b])
            self._count("fetched", len(lacking))
            out.update(got)
        return out

    def _publish(self, h: str, data: bytes) -> None:
        """Publish ``data`` as entry ``h`` when it fits under the cap; a write the filesystem refuses (full, read-only
        since) publishes nothing: the block is served to its reader all the same, said in one warning line."""
        tmp = self.root / "tmp" / f"{h}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
        header = json.dumps({"key": h, "size": len(data), "crc32": zlib.crc32(data)}).encode()
        entry = _MAGIC + struct.pack("<I", len(header)) + header + data
        try:
            with open(tmp, "wb") as f:
                f.write(entry)
            with self._global():
                if not self._room_for(h, len(entry)):
                    self._count("bypassed")
                    return
                self._path(h).parent.mkdir(exist_ok=True)
                os.replace(tmp, self._path(h))
                self._count("published")
        except OSError as exc:
            self._count("bypassed")
            self._say_unwritable(exc)
        finally:
            with contextlib.suppress(OSError):
                tmp.unlink()

    def _say_unwritable(self, exc: OSError) -> None:
        with self._count_lock:
            said, self._unwritable_said = self._unwritable_said, True
        if not said:
            log.warning(
                "storage: node cache %r: an entry could not be written (%s): blocks are served without being"
                " published (this process fetches them for itself) until there is room",
                str(self.root),
                exc.strerror or exc,
            )

    # -- the cap
    def _room_for(self, h: str, size: int) -> bool:
        """Reserve ``size`` bytes for entry ``h`` under the cap, evicting by next use (global lock held)."""
        if self._path(h).exists():
            return False  # published meanwhile (a lock stripe shared by another writer's block)
        held = self._ledger()
        if held + size <= self.cap_bytes:
            self._write_ledger(held + size)
            return True
        if size > self.cap_bytes:
            return False
        entries = self._entries()
        held = sum(n for _, n, _ in entries)  # recounted: a writer killed between its reservation and its rename
        rank = self.ranking()
        mine = rank(h)
        ranked = sorted(((rank(e), -mtime, e, n) for e, n, mtime in entries), reverse=True)
        slack = self.cap_bytes // 16  # evict a little more than needed: fewer rounds of listing the directory
        for use, _, e, n in ranked:
            if held + size <= self.cap_bytes - (slack if use >= NEVER_USED else 0):
                break
            if use < mine or (use == mine and use != NEVER_USED):
                break  # every entry left is needed no later than the newcomer: it is not held (bypass)
            if self._remove(e, ledger=False) is not None:
                held -= n
                self._count("evicted")
        if held + size > self.cap_bytes:
            self._write_ledger(held)
            return False
        self._write_ledger(held + size)
        return True

    def _entries(self) -> list[tuple[str, int, float]]:
        """(name, bytes, last use) of every entry (global lock held)."""
        out = []
        for sub in os.scandir(self.root / "blocks"):
            for entry in os.scandir(sub.path):
                with contextlib.suppress(FileNotFoundError):
                    st = entry.stat()
                    out.append((entry.name[:-4], st.st_size, st.st_mtime))
        return out

    def _remove(self, h: str, ledger: bool = True) -> int | None:
        """Remove entry ``h`` (global lock held); its bytes, or None when it was not there."""
        path = self._path(h)
        try:
            size = path.stat().st_size
            path.unlink()
        except FileNotFoundError:
            return None
        if ledger:
            with contextlib.suppress(OSError):  # a ledger left unwritten over-counts: the cap still holds
                self._write_ledger(max(0, self._ledger() - size))
        return size

    def held_bytes(self) -> int:
        """The bytes of the entries now (a listing: for tests and reports)."""
        with self._global():
            return sum(n for _, n, _ in self._entries())

    def _ledger(self) -> int:
        """The bytes the ledger holds; recounted from the directory when it is missing or not a count (empty: torn by
        a power cut after its rename; negative or not a number: edited), so that it never under-counts."""
        try:
            text = (self.root / "ledger").read_text().strip()
        except FileNotFoundError:
            text = ""
        if text.isdecimal():  # NOTE: an empty ledger read as 0 let a full cache take its cap again
            return int(text)
        return sum(n for _, n, _ in self._entries())

    def _write_ledger(self, held: int) -> None:
        tmp = self.root / "tmp" / f"ledger.{os.getpid()}.{uuid.uuid4().hex[:8]}"
        tmp.write_text(str(held))
        os.replace(tmp, self.root / "ledger")

    # -- locks
    @contextlib.contextmanager
    def _global(self) -> Iterator[None]:
        fd = os.open(self.root / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def _stripe_lock(self, stripe: int) -> Iterator[None]:
        fd = os.open(self.root / "locks" / f"{stripe:03x}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _try_stripes(self, blocks: list[int], names: dict[int, str]) -> tuple[dict[int, int], set[int]]:
        """The stripes of ``blocks`` this process could lock without waiting (stripe -> its open fd), and the others."""
        mine: dict[int, int] = {}
        theirs: set[int] = set()
        for stripe in sorted({_stripe(names[b]) for b in blocks}):
            fd = os.open(self.root / "locks" / f"{stripe:03x}.lock", os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                mine[stripe] = fd
            except BlockingIOError:
                os.close(fd)
                theirs.add(stripe)
        return mine, theirs

    # -- housekeeping
    def _clear_orphans(self) -> None:
        """Remove temporary files whose writer is dead (killed mid-write): they were never served."""
        for entry in os.scandir(self.root / "tmp"):
            try:
                pid = int(entry.name.split(".")[-2])
                os.kill(pid, 0)
            except ProcessLookupError:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
            except (ValueError, IndexError, PermissionError):
                continue

    def _count(self, name: str, n: int = 1) -> None:
        with self._count_lock:
            setattr(self, name, getattr(self, name) + n)

    def stats(self) -> dict[str, Any]:
        names = ("hits", "fetched", "published", "bypassed", "evicted", "waited", "damaged")
        return {"directory": str(self.root.parent), "cap_bytes": self.cap_bytes, **{n: getattr(self, n) for n in names}}


def _make_layout(directory: Path, root: Path) -> None:
    """Make (or find) the cache's directories under ``root`` and check this process can write there: else one line
    naming ``directory`` (a file, a read-only directory, one on a read-only filesystem)."""
    try:
        for sub in ("blocks", "locks", "tmp"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        os.close(os.open(root / ".lock", os.O_RDWR | os.O_CREAT, 0o644))
        probe = root / "tmp" / f"probe.{os.getpid()}.{uuid.uuid4().hex[:8]}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        where = Path(exc.filename) if exc.filename else root
        shape = isinstance(exc, (NotADirectoryError, FileExistsError))  # a file where a directory goes
        blocking = next((p for p in (where, *where.parents) if shape and p.exists() and not p.is_dir()), None)
        why = f"{str(blocking)!r} is not a directory" if blocking else f"{exc.strerror or exc}: {str(where)!r}"
        raise ValueError(
            f"node cache {str(directory)!r}: cannot hold the cache ({why}): give a directory on local disk or /dev/shm"
            " that this process can write"
        ) from None


def _stripe(h: str) -> int:
    return int(h[:3], 16) % _STRIPES


def _payload(raw: bytes, h: str) -> bytes | None:
    """The block in an entry's bytes, or None when its magic, key, length or CRC-32 is not right."""
    if raw[: len(_MAGIC)] != _MAGIC or len(raw) < len(_MAGIC) + 4:
        return None
    (n,) = struct.unpack("<I", raw[len(_MAGIC) : len(_MAGIC) + 4])
    start = len(_MAGIC) + 4 + n
    try:
        header = json.loads(raw[len(_MAGIC) + 4 : start])
    except ValueError:
        return None
    data = raw[start:]
    if not isinstance(header, dict) or header.get("key") != h or header.get("size") != len(data):
        return None
    return data if header.get("crc32") == zlib.crc32(data) else None
