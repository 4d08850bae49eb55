"""Uploading a built index (and the layouts persisted beside it) to an object store, with the on-disk atomicity.

Order: every data object (arrays, checksum files, fences) first, smallest first; each layout's sealed ``layout.json``
after its own objects; the index's sealed ``meta.json`` last of all. An index is found by its ``meta.json`` only, so a
reader never sees a half-uploaded index: an upload killed at any moment leaves objects that nothing opens, and pushing
again completes it. A destination that already holds a different sealed record (another index under the same name) is
refused before anything is written: objects of two indexes are never mixed under one seal.

Pushes racing to one prefix: before writing any data a push claims the prefix by a create-only write of
``push-claim.json`` (the sha256 of the seal it will write); a push that finds another index's claim there is refused
before writing anything, so of two pushes of different indexes exactly one writes, and the seal itself is written
create-only and read back. A store that offers no create-only write (or ignores its precondition: a second create of
the claim must be refused) gets the claim written and read back instead, and every object's ETag checked against the
one its PUT returned before the seal is written and after: a concurrent push is then detected (both may be refused),
not excluded, and the push says so (:attr:`PushResult.exclusive` is False).

Nothing is uploaded that fails its own checks, and what is checked is what is sent: every sealed record
(``meta.json``, ``layout.json``, ``manifest.json``) is read once, its seal checked, and those bytes are the ones
compared, claimed and uploaded; every file a record lists is read once for its upload, and checked as it is read:
a file with chunk checksums chunk by chunk against its ``*.sums.npy`` (itself checked against the record's sha256),
its size and sha256 at its end, a checksum file or fence by its size and sha256. A failure stops the upload of that
file before it completes (a PUT never sent, a multipart upload aborted: the object there, if any, stays as it was) and
refuses the push naming the file and the chunk, before any seal is written. A record that lists a file the directory
lacks is refused too. Files no record lists (a sharded index's build claims) are uploaded as they are.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import zlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from detsampler.checks import check_local_path
from detsampler.index.checksums import load_sums
from detsampler.index.format import CHUNK_BYTES, ChecksumError, TokenIndexError, seal_ok
from detsampler.storage import (
    CreateOnlyUnsupportedError,
    ObjectNotFoundError,
    ObjectStore,
    join,
    parse_location,
    store_for,
)

__all__ = ["CLAIM", "PushResult", "push", "push_index", "push_sharded"]

SEALS = ("meta.json", "layout.json")
CLAIM = "push-claim.json"  # written first, create-only: which seal this prefix is being pushed for
_CLAIM_KIND = "detsampler-push-claim"
_LOCAL_ONLY = (".verified-", ".verify.lock", ".tmp", ".lock")
_READ_BYTES = 64 * CHUNK_BYTES  # a file is read for its upload 4 MiB at a time, whole chunks
_PART_BYTES = 5 * 2**20  # obstore's part size: a larger file is a multipart upload (aborted when a chunk fails)

logger = logging.getLogger("detsampler")


@dataclass(frozen=True)
class PushResult:
    """What a push did: objects and bytes uploaded (a sharded index's: its shards' and its own), sealed records left as
    they were (already there, identical), whether the prefix was held by create-only writes (``exclusive``; False: the
    store has none, so a concurrent push was checked for by reading back, not excluded), and for a sharded index where
    its shards went and how many objects went under ``url`` itself."""

    url: str
    objects: int
    num_bytes: int
    unchanged: int
    exclusive: bool = True
    shard_urls: tuple[str, ...] = ()  # a sharded index's: where each shard's index went (outside ``url``)
    manifest_objects: int = 0  # a sharded index's: the objects under ``url`` (the manifest, its layouts and claims)


def _files(directory: Path) -> list[Path]:
    """The files to upload, relative to ``directory`` (lock files, markers and temporaries stay local)."""
    out = []
    for p in sorted(directory.rglob("*")):
        rel = p.relative_to(directory)
        if p.is_file() and not any(part.startswith(".") or part.endswith(_LOCAL_ONLY) for part in rel.parts):
            out.append(rel)
    return out


@dataclass(frozen=True)
class _Expect:
    """What a file to upload must be, from the sealed record that lists it: ``size`` bytes of sha256 ``sha256``, and
    (``sums``: its checksum file and that file's record) one CRC-32 per chunk."""

    record: Path  # the record that lists the file (named in a refusal)
    size: int
    sha256: str
    sums: tuple[Path, dict] | None = None


def _refused(url: str, what: str) -> str:
    return (
        f"push to {url} refused: {what}; nothing of it was uploaded and no seal was written (the index is damaged:"
        " delete it and build it again)"
    )


def _records(root: Path, url: str, files: list[Path], seal: str) -> dict[Path, bytes]:
    """The bytes of every sealed record under ``root`` (read once: these are the bytes checked and uploaded), each
    refused unless it is JSON that holds its own seal."""
    out = {}
    for rel in files:
        if rel.name not in (*SEALS, seal):
            continue
        raw = (root / rel).read_bytes()
        try:
            record = json.loads(raw)
        except ValueError:
            record = None
        if not isinstance(record, dict) or not seal_ok(record):
            raise TokenIndexError(_refused(url, f"{rel} fails its seal (it is not the record that was written)"))
        out[rel] = raw
    return out


def _expected(root: Path, url: str, records: dict[Path, bytes]) -> dict[Path, _Expect]:
    """What each file a record lists must be (its own, and its checksum file's and fence's); a listed file the
    directory lacks is refused."""
    out: dict[Path, _Expect] = {}

    def expect(rel: Path, entry: object, record: Path, sums: tuple[Path, dict] | None = None) -> None:
        if not isinstance(entry, dict) or not isinstance(entry.get("size"), int) or "sha256" not in entry:
            raise TokenIndexError(_refused(url, f"{record} holds no size and sha256 for {rel.name}"))
        if not (root / rel).is_file():
            raise TokenIndexError(_refused(url, f"{record} lists {rel.name}, which {str(root / rel.parent)!r} lacks"))
        out[rel] = _Expect(record, entry["size"], str(entry["sha256"]), sums)

    for record, raw in records.items():
        files = json.loads(raw).get("files")
        for name, entry in (files if isinstance(files, dict) else {}).items():
            rel = record.parent / name
            sums = None
            for side in ("sums", "fence"):
                if isinstance(entry, dict) and side in entry:
                    side_rel = record.parent / str(entry[side].get("file"))
                    expect(side_rel, entry[side], record)
                    if side == "sums":
                        sums = (side_rel, entry[side])
            expect(rel, entry, record, sums)
    return out


class _Checked:
    """The bytes of one file for its upload, read once, in order, each chunk checked as it is read (see the module
    doc); iterating raises :class:`ChecksumError` (kept in ``error``) at the first chunk that fails, so the upload that
    reads it never completes."""

    def __init__(self, root: Path, rel: Path, expect: _Expect, url: str) -> None:
        self.path, self.rel, self.expect, self.url = root / rel, rel, expect, url
        self.error: Exception | None = None

    def _fail(self, what: str) -> ChecksumError:
        self.error = ChecksumError(_refused(self.url, f"{self.rel} {what}"), self.path)
        return self.error

    def __iter__(self) -> Iterator[bytes]:
        expect, sums = self.expect, None
        if expect.sums is not None:
            side, record = expect.sums
            try:
                sums = load_sums(self.path.parent / side.name, record, expect.size, str(self.path.parent))
            except TokenIndexError as exc:
                self.error = TokenIndexError(_refused(self.url, str(exc)))
                raise self.error from None
        h, done = hashlib.sha256(), 0
        with open(self.path, "rb") as f:
            while block := f.read(_READ_BYTES):
                if done + len(block) > expect.size:
                    break
                for lo in range(0, len(block), CHUNK_BYTES) if sums is not None else ():
                    c, got = (done + lo) // CHUNK_BYTES, zlib.crc32(block[lo : lo + CHUNK_BYTES])
                    if got != int(sums[c]):
                        hi = done + min(lo + CHUNK_BYTES, len(block))
                        raise self._fail(
                            f"chunk {c} (bytes {done + lo}..{hi - 1}) fails its checksum (crc32 {got:08x}, recorded"
                            f" {int(sums[c]):08x}): the file was edited or replaced after it was written"
                        )
                h.update(block)
                done += len(block)
                yield block
        size = self.path.stat().st_size
        if done != expect.size or size != expect.size:
            raise self._fail(f"is {size} bytes, {expect.record} records {expect.size}: the file was cut or edited")
        if h.hexdigest() != expect.sha256:
            raise self._fail(f"differs from the one recorded in {expect.record} (its sha256): the file was edited")


def _check_destination(url: str) -> None:
    if not parse_location(url).remote:
        raise ValueError(
            f"Got destination {url!r}: push uploads to an object store URL (s3://, gs://, az://, https://)"
        )


def _read(store: ObjectStore, url: str) -> bytes | None:
    """The whole object at ``url`` (one GET), or None when there is none."""
    try:
        return store.read_head(url, -1)[0]
    except ObjectNotFoundError:
        return None


def _check_seals(store: ObjectStore, url: str, records: dict[Path, bytes]) -> int:
    """Refuse a destination whose sealed records differ from ``records`` (this push's); returns how many are there,
    identical."""
    unchanged = 0
    for rel, ours in records.items():
        dest = join(url, *rel.parts)
        there = _read(store, dest)
        if there is not None and there != ours:
            raise TokenIndexError(
                f"{dest} already holds a different sealed record than this push's {rel}: another index was pushed"
                " there; push to another prefix (or delete that one first)"
            )
        unchanged += there is not None
    return unchanged


def _claim_record(seal: str, data: bytes) -> bytes:
    """The claim of a push of the seal ``seal`` (a ``meta.json`` or ``manifest.json``) of bytes ``data``: its name and
    sha256."""
    sha = hashlib.sha256(data).hexdigest()
    return json.dumps({"kind": _CLAIM_KIND, "seal": seal, "sha256": sha}, sort_keys=True).encode()


def _taken(url: str, theirs: bytes | None, ours: bytes) -> TokenIndexError:
    """The refusal of a push that finds another push's claim on ``url``."""
    try:
        other = json.loads(theirs or b"")["sha256"][:16]
    except (ValueError, KeyError, TypeError):
        other = "?"
    return TokenIndexError(
        f"push to {url} refused: another push holds this prefix ({CLAIM} is for a {json.loads(ours)['seal']} of sha256"
        f" {other}..., this push's is {json.loads(ours)['sha256'][:16]}...): a push of another index to it is running"
        " or unfinished; push to another prefix, push that index again to finish it, or delete the prefix first"
    )


def _claim(store: ObjectStore, url: str, claim: bytes) -> bool:
    """Claim ``url`` for this push (see the module doc); returns whether the claim is exclusive (a create-only write
    the store enforces). A claim of another push is refused; this push's own (an earlier or concurrent push of the same
    index) is taken over."""
    where = join(url, CLAIM)
    try:
        created = store.create(where, claim)
        enforced = not created or not store.create(where, claim)  # a second create must be refused
    except CreateOnlyUnsupportedError:
        created, enforced = None, False
    if enforced:
        if not created and _read(store, where) != claim:
            raise _taken(url, _read(store, where), claim)
        return True
    logger.warning(
        "detsampler: push to %s: the store does not enforce create-only writes: the claim, the objects' ETags and the"
        " seal are read back instead, so a concurrent push to this prefix is detected, not excluded",
        url,
    )
    if created is None:
        store.put(where, claim)
    if _read(store, where) != claim:
        raise _taken(url, _read(store, where), claim)
    return False


def _check_written(store: ObjectStore, url: str, tags: dict[Path, str | None], claim: bytes) -> None:
    """Without create-only writes: refuse unless the claim is still this push's and every object still has the ETag
    its PUT returned (another push wrote over them otherwise)."""
    if _read(store, join(url, CLAIM)) != claim:
        raise _taken(url, _read(store, join(url, CLAIM)), claim)
    for rel, tag in tags.items():
        dest = join(url, *rel.parts)
        if tag is not None and store.version(dest)[1] != str(tag):
            raise TokenIndexError(
                f"push to {url} refused: {dest} was written over by another push while this one ran (its ETag is not"
                " the one this push's PUT returned): the prefix holds a mix; delete it and push one index again"
            )


def _write_seal(store: ObjectStore, url: str, seal: str, data: bytes, exclusive: bool) -> None:
    """Write the seal ``seal`` (its checked bytes ``data``) at ``url`` last (create-only where the store enforces
    it), then read it back."""
    dest = join(url, seal)
    if not exclusive:
        store.put(dest, data)
    elif not store.create(dest, data) and _read(store, dest) != data:
        raise TokenIndexError(f"push to {url} refused: {dest} was written by another push meanwhile; nothing sealed")
    if _read(store, dest) != data:
        raise TokenIndexError(
            f"push to {url} refused: {dest} does not hold what this push wrote (another push wrote over it); delete"
            " the prefix and push one index again"
        )


def _release(store: ObjectStore, url: str, seal: str, claim: bytes) -> None:
    """Remove this push's claim from ``url`` after a refusal of damaged files, unless a seal is there (the prefix
    holds an index pushed before, which its claim names): an index built again (another seal) can then be pushed to
    it."""
    if _read(store, join(url, seal)) is None and _read(store, join(url, CLAIM)) == claim:
        store.delete(join(url, CLAIM))


def _upload(root: Path, url: str, seal: str, max_workers: int) -> PushResult:
    """Every file under ``root`` to ``url``: the claim, data (smallest first), ``layout.json`` records, ``seal`` last;
    a destination holding different sealed records, or another push's claim, is refused before anything is written,
    and a file that fails its checks as it is read for its upload before any seal is (see the module doc)."""
    store = store_for(url)
    assert isinstance(store, ObjectStore)  # _check_destination refused a local one
    files = _files(root)
    records = _records(root, url, files, seal)
    expected = _expected(root, url, records)
    unchanged = _check_seals(store, url, records)
    claim = _claim_record(seal, records[Path(seal)])
    exclusive = _claim(store, url, claim)
    if not exclusive:  # a rival that finished before this claim was written: its seals are there now
        _check_seals(store, url, records)
    data = sorted((f for f in files if f not in records), key=lambda f: ((root / f).stat().st_size, str(f)))
    damaged: list[Exception] = []  # the refusals of files that failed their checks as they were read

    def put(rel: Path) -> str | None:
        if not exclusive and _read(store, join(url, CLAIM)) != claim:  # lost the claim: stop writing at once
            raise _taken(url, _read(store, join(url, CLAIM)), claim)
        dest = join(url, *rel.parts)
        if rel not in expected:  # listed by no record (a sharded index's build claims): nothing to check it against
            return store.put_tagged(dest, root / rel)
        body = _Checked(root, rel, expected[rel], url)
        try:
            return store.put_tagged(dest, body, multipart=expected[rel].size > _PART_BYTES)
        except Exception:
            if body.error is not None:  # raised by the read for the upload: the upload was never completed
                damaged.append(body.error)
                raise body.error from None
            raise

    pool = ThreadPoolExecutor(max_workers)
    try:
        tags = dict(zip(data, pool.map(put, data)))
    except Exception as exc:
        pool.shutdown(cancel_futures=True)  # after a refusal, no file not yet begun is uploaded
        if any(exc is d for d in damaged):
            _release(store, url, seal, claim)
        raise
    finally:
        pool.shutdown(cancel_futures=True)
    for rel in sorted((f for f in records if f != Path(seal)), key=str):
        tags[rel] = store.put_tagged(join(url, *rel.parts), records[rel])
    if not exclusive:
        _check_written(store, url, tags, claim)
    _write_seal(store, url, seal, records[Path(seal)], exclusive)
    if not exclusive:
        _check_written(store, url, tags, claim)
    return PushResult(url, len(files), sum((root / f).stat().st_size for f in files), unchanged, exclusive)


def _directory(directory: str | os.PathLike) -> Path:
    """The local index directory to push (a file of it is refused, naming the directory to give)."""
    root = Path(check_local_path(directory, "push"))
    if root.is_file():
        raise TokenIndexError(
            f"{str(root)!r} is a file: push takes the index directory that holds it ({str(root.parent)!r})"
        )
    return root


def push_index(directory: str | os.PathLike, url: str, *, max_workers: int = 8) -> PushResult:
    """Upload the index at ``directory`` (a built, sealed index directory) to ``url`` (see the module doc for the order
    and the atomicity). Returns what was uploaded."""
    root = _directory(directory)
    if not (root / "meta.json").is_file():
        raise TokenIndexError(f"{str(root)!r} holds no index (no meta.json): build it first (`detsampler build`)")
    _check_destination(url)
    _check_pushable(root)  # the seal and every file's size and checksums: never upload a damaged index
    return _upload(root, url, "meta.json", max_workers)


def _check_pushable(root: Path) -> None:
    """Open the index at ``root`` (a token index, or a media index whose images travel with it: bytes it holds itself,
    or byte ranges of objects in a store), refusing one that would not read the same from the bucket."""
    from detsampler.index.sharded import open_index
    from detsampler.storage import is_remote

    index = open_index(root)
    sources = index.meta.get("sources", [""])[1:] if hasattr(index, "num_images") else []  # a media index's
    local = [s for s in sources if not is_remote(s)]
    if local:
        raise TokenIndexError(
            f"media index {str(root)!r} reads images from {len(local)} local file(s) (first {local[0]!r}), which a"
            " reader of the bucket cannot open: put the shards in the bucket and build the index from their URLs"
            " (webdataset_source(['s3://...'])); images held in the index itself (a datasets table's) travel with it"
        )


def push_sharded(directory: str | os.PathLike, url: str, *, max_workers: int = 8) -> PushResult:
    """Upload the sharded index at ``directory``: the prefix ``url`` checked and claimed first (a different manifest
    there, or another push's claim, is refused before any object is written, as for one index); then each shard's
    index to the URL its manifest entry names relative to ``url`` (``../shards/index-KEY``: the same bucket), each
    checked file by file and sealed by its own ``meta.json``; then the layouts beside the manifest; ``manifest.json``
    last. A shard refused releases the claim. Pre-tokenized shards (files, not indexes) are refused: push uploads
    indexes only."""
    from detsampler.index.sharded import MANIFEST, TOKENIZED_KIND, ShardedIndex, shard_location
    from detsampler.storage import RemotePath

    root = Path(check_local_path(directory, "push"))
    _check_destination(url)
    index = ShardedIndex.open(root)
    entries = index.meta["shards"]
    foreign = [e["path"] for e in entries if e["kind"] != TOKENIZED_KIND]
    if foreign:
        raise TokenIndexError(
            f"sharded index {str(root)!r} has {len(foreign)} pre-tokenized shards (first {foreign[0]!r}): push uploads "
            "indexes only"
        )
    shard_urls = tuple(str(shard_location(RemotePath(url), e["path"])) for e in entries)
    store = store_for(url)
    assert isinstance(store, ObjectStore)  # _check_destination refused a local one
    records = _records(root, url, [Path(MANIFEST)], MANIFEST)
    _check_seals(store, url, records)  # NOTE: before any shard is written, as a single index's push checks first
    claim = _claim_record(MANIFEST, records[Path(MANIFEST)])
    _claim(store, url, claim)
    try:
        done = [
            push_index(shard_location(root, e["path"]), shard, max_workers=max_workers)
            for e, shard in zip(entries, shard_urls)
        ]
    except Exception:
        _release(store, url, MANIFEST, claim)  # no manifest was written: a push of the repaired index may claim it
        raise
    done.append(_upload(root, url, MANIFEST, max_workers))
    return PushResult(
        url,
        sum(d.objects for d in done),
        sum(d.num_bytes for d in done),
        sum(d.unchanged for d in done),
        all(d.exclusive for d in done),
        shard_urls,
        done[-1].objects,
    )


def push(directory: str | os.PathLike, url: str, *, max_workers: int = 8) -> PushResult:
    """:func:`push_sharded` for a directory holding a sharded index's manifest, else :func:`push_index`."""
    from detsampler.index.sharded import MANIFEST

    if (_directory(directory) / MANIFEST).is_file():
        return push_sharded(directory, url, max_workers=max_workers)
    return push_index(directory, url, max_workers=max_workers)
