"""Persisted layouts: each layout of an index is built once, written beside the index, and opened by every process as
memory maps.

A layout directory ``<index>/layouts/<kind>-L<seq_len>-seed<seed>[-w<window_docs>][-<overlong>]-<key>/`` holds
(``-<overlong>`` only for a bestfit layout whose ``overlong`` is not the default ``split``)::

    ends.npy          int64|int32[D]   concat: stream end of the i-th document of the order (int64); document:
                                       samples up to it (int32 when they fit)
    ends.fence.npy    as ends[D/k]     every k-th entry of ends, k = 64 KiB / itemsize (read whole on open: a search
                                       then reads one 64 KiB block)
    order.npy         int32|int64[D]   concat, document: the seeded document order (``document_order``): the i-th
                                       document (int32 when D < 2^31)
    window_bins.npy   int64[W+1]       bestfit: bins of window w are window_bins[w]:window_bins[w+1]
    bin_items.npy     int64|int32[B+1] bestfit: items of bin (sample) b are bin_items[b]:bin_items[b+1]
    item_docs.npy     int64|int32[I]   bestfit: the item's document
    item_pieces.npy   uint32[I]        bestfit: the item's piece: positions [p*L, min((p+1)*L, length+1)) of the
                                       document
    *.sums.npy        uint32           CRC-32 of each 64 KiB chunk of the file above (detsampler.index.checksums)
    layout.json       config, versions, index fingerprint, counts, file sizes/sha256/dtype, sealed (written last)

Each array's dtype is in its ``files`` record: int32 wherever a bound known before the build (from the number of
documents and tokens) keeps every value below 2^31, else int64.

``<key>`` hashes the layout config, :data:`LAYOUT_FORMAT_VERSION`, ``MAPPING_VERSION`` and (bestfit)
``PACKING_VERSION``, so a change of any of them names a new directory.

A layout with ``epoch_order`` (a new document order each epoch, :mod:`detsampler.epoch_order`) reads epoch 0 from the
directory above (its order is the one without the option: the same directory, shared) and epoch ``e >= 1`` from
``<kind>-L<seq_len>-seed<seed>-epoch<e>-<key>/`` (``e`` joins the key), which holds ``ends.npy`` of that epoch's order
(its fence and checksums) and ``layout.json``; the order itself is computed pointwise (the keyed permutation), not
stored. Bounded: when a process opens epoch ``e`` it starts building epoch ``e + 1`` in a background thread (under the
directory's lock, like any build: other processes wait for it or find it done) and removes the directories of epochs
below ``e - 1`` (:data:`KEEP_EPOCH_DIRS`); an epoch asked for again later (``where``/``show`` of an old step) is built
again. A read-only index (an object store) computes the epochs it has no directory for in RAM.

Invariants: a directory exists under its final name only once complete (written to a temporary directory, fsynced,
``layout.json`` last, renamed into place); one process builds it, under a file lock, never a collective; opening reads
``layout.json`` and the checksum files only (O(D / 16384)), and every chunk of an array is checked the first time the
process reads it. A layout directory found damaged on open, or a chunk that fails its checksum while locating, is
rebuilt (under the lock) and the read retried: a tampered layout is recomputed, never served. Nothing of size D is held
in RAM.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import shutil
import sys
import threading
import time
import uuid
from collections import deque
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from multiprocessing import get_all_start_methods, get_context
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from filelock import FileLock

from detsampler.atomic import fsync_dir, fsync_file
from detsampler.epoch_order import EpochOrderedLayout
from detsampler.index.checksums import ChecksumError, open_checked_all, write_checksums, write_fence
from detsampler.index.files import HEADER_BYTES, npy_header
from detsampler.index.format import TokenIndexError, seal_meta, seal_ok
from detsampler.keys import stable_hash64
from detsampler.layout import (
    LAYOUTS,
    BestFitLayout,
    BinPacking,
    ConcatLayout,
    DocumentLayout,
    Layout,
    LayoutConfig,
    config_record,
    documents_at,
    fit_overlong,
    overlong_counts,
)
from detsampler.packing import LOCKSTEP_DOCS, PACKING_VERSION, Packed, pack_windows
from detsampler.storage import RemotePath
from detsampler.version import MAPPING_VERSION

if TYPE_CHECKING:
    from detsampler.index.protocol import Index

__all__ = [
    "KEEP_EPOCH_DIRS",
    "LAYOUT_FORMAT_VERSION",
    "PersistedEpochLayout",
    "PersistedLayout",
    "build_layout",
    "epoch_dirs",
    "layout_dir",
    "open_layout",
]

# 3: concat and document store the document order (order.npy); 2: int32 arrays where their values fit (the dtype
# recorded per file); 1: every count and id int64
LAYOUT_FORMAT_VERSION = 3
LAYOUT_KIND = "detsampler-layout"
CHUNK_DOCS = 1 << 20  # documents per vectorized build step (concat, document)
KEEP_EPOCH_DIRS = 1  # epoch directories kept below the newest epoch a process opened (and that one, and the next)
log = logging.getLogger("detsampler")


def _base_name(config: LayoutConfig) -> str:
    window = config.window_docs if config.kind == "bestfit" else 0
    return f"{config.kind}-L{config.seq_len}-seed{config.seed}" + (f"-w{window}" if window else "")


def layout_dir(index: Index, config: LayoutConfig, epoch: int = 0) -> Path | RemotePath:
    """Where the layout ``config`` of ``index`` lives (whether built or not); ``epoch >= 1``: where epoch ``epoch`` of
    an ``epoch_order`` layout lives (epoch 0 is the layout's own directory, ``epoch_order`` or not)."""
    packing = PACKING_VERSION if config.kind == "bestfit" else 0
    window = config.window_docs if config.kind == "bestfit" else 0
    # NOTE: overlong joins the key only when not the default, so that layouts built before it existed keep their names;
    # epoch_order never does (epoch 0 is the layout without it), an epoch >= 1 does
    overlong = () if config.overlong == "split" else (config.overlong,)
    epochs = ("epoch", int(epoch)) if epoch else ()
    key = stable_hash64(
        "layout",
        LAYOUT_FORMAT_VERSION,
        MAPPING_VERSION,
        packing,
        config.kind,
        config.seq_len,
        config.seed,
        window,
        *overlong,
        *epochs,
    )
    name = _base_name(config) + "".join(f"-{o}" for o in overlong) + (f"-epoch{int(epoch)}" if epoch else "")
    return index.path / "layouts" / (name + f"-{key:016x}")


def epoch_dirs(index: Index, config: LayoutConfig) -> dict[int, Path]:
    """The epoch directories (``epoch >= 1``) of the ``epoch_order`` layout ``config`` found beside ``index``, by
    epoch (complete or not; any key: a directory of another mapping or format version is found too)."""
    root = index.path / "layouts"
    pattern = re.compile(re.escape(_base_name(config)) + r"-epoch(\d+)-[0-9a-f]{16}$")
    found = {}
    for path in root.glob(_base_name(config) + "-epoch*") if isinstance(root, Path) and root.is_dir() else ():
        m = pattern.match(path.name)
        if m and path.is_dir():
            found[int(m.group(1))] = path
    return dict(sorted(found.items()))


# -- writing -------------------------------------------------------------------------------------------------------


class _NpyStream:
    """A 1-D ``.npy`` file written in pieces whose length is known only at the end (its header is written last)."""

    def __init__(self, path: Path, dtype: np.dtype) -> None:
        self.path, self.dtype, self.count = path, np.dtype(dtype), 0
        self._f = open(path, "wb")
        self._f.write(b"\0" * HEADER_BYTES)

    def write(self, values: np.ndarray) -> None:
        if self.dtype.itemsize < 8 and len(values) and int(np.max(values)) > np.iinfo(self.dtype).max:
            raise ValueError(f"{self.path.name}: a value exceeds {self.dtype.name}, the bound the index's counts gave")
        self._f.write(np.ascontiguousarray(values, dtype=self.dtype).tobytes())
        self.count += len(values)

    def close(self) -> None:
        self._f.seek(0)
        self._f.write(npy_header(self.dtype, self.count))
        self._f.flush()
        os.fsync(self._f.fileno())
        self._f.close()


def _narrowest(bound: int) -> np.dtype:
    """int32 when every value is at most ``bound`` (< 2^31), else int64."""
    return np.dtype(np.int32 if bound <= np.iinfo(np.int32).max else np.int64)


def _dtypes(index: Any, config: LayoutConfig, epoch: int = 0) -> dict[str, np.dtype]:
    """The dtype of each array of the layout, from bounds known before the build: a document has ``length + 1``
    positions, so at most ``(tokens + D) // L + D`` samples, pieces or items, and ids below ``D``. An epoch >= 1
    stores no order (computed pointwise)."""
    n = int(index.num_documents)
    pieces = (int(index.num_tokens) + n) // config.seq_len + n
    order = {"order.npy": _narrowest(n - 1)} if not epoch else {}
    if config.kind == "concat":
        return {"ends.npy": np.dtype(np.int64), **order}
    if config.kind == "document":
        return {"ends.npy": _narrowest(pieces), **order}
    return {
        "window_bins.npy": np.dtype(np.int64),
        "bin_items.npy": _narrowest(pieces),
        "item_docs.npy": _narrowest(n),
        "item_pieces.npy": np.dtype(np.uint32),
    }


def _bar(total: int, desc: str, progress: bool) -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=total, unit="doc", desc=desc, disable=not progress, file=sys.stderr, leave=False)


_WORKER_LENGTHS: np.ndarray | None = None


def _readable_lengths(index: Any) -> Any:
    """The index's lengths for a build that reads them all: a single index's checked once and then read as the memory
    map itself (no copy); a sharded index's through its shards."""
    lengths = index.lengths
    if hasattr(lengths, "verify_all"):
        lengths.verify_all()
        return np.asarray(lengths)
    return lengths


def _init_worker(index: Index) -> None:
    # NOTE: ``index`` reaches a spawned worker pickled (as where it opens again); a forked one shares the parent's.
    # The layouts never open an index by path themselves: they import no concrete index class (the package is a tree).
    global _WORKER_LENGTHS
    _WORKER_LENGTHS = _readable_lengths(index)


def _extents(
    lengths: np.ndarray, config: LayoutConfig, a: int, b: int, epoch: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """The documents at positions ``[a, b)`` of (epoch ``epoch``'s) seeded order and their extents (``length + 1``)."""
    docs = documents_at(np.arange(a, b), len(lengths), config.seed, epoch)
    return docs, lengths[docs].astype(np.int64) + 1


def _pack_block(lengths: np.ndarray, config: LayoutConfig, w0: int, w1: int, epoch: int = 0) -> Packed:
    """The packing of windows ``[w0, w1)``."""
    n, w = len(lengths), config.window_docs
    docs = documents_at(np.arange(w0 * w, min(w1 * w, n)), n, config.seed)
    extents = lengths[docs].astype(np.int64) + 1
    cuts = np.arange(w, len(docs), w)
    fitted = [fit_overlong(d, e, config) for d, e in zip(np.split(docs, cuts), np.split(extents, cuts))]
    return pack_windows([d for d, _ in fitted], [e for _, e in fitted], config.seq_len)


def _task(args: tuple[str, LayoutConfig, int, int, int]) -> Any:
    assert _WORKER_LENGTHS is not None
    what, config, a, b, epoch = args
    return (_extents if what == "extents" else _pack_block)(_WORKER_LENGTHS, config, a, b, epoch)


def _ordered(
    what: str,
    lengths: np.ndarray,
    index: Index,
    config: LayoutConfig,
    ranges: list[tuple[int, int]],
    num_proc: int,
    epoch: int = 0,
):
    """``_extents`` or ``_pack_block`` of each range, in order, by ``num_proc`` processes (at most 4 per process in
    flight, so memory stays bounded)."""
    if num_proc == 1:
        for a, b in ranges:
            yield (_extents if what == "extents" else _pack_block)(lengths, config, a, b, epoch)
        return
    ctx = get_context("fork") if "fork" in get_all_start_methods() else None
    with ProcessPoolExecutor(num_proc, mp_context=ctx, initializer=_init_worker, initargs=(index,)) as pool:
        pending: deque = deque()
        for a, b in ranges:
            pending.append(pool.submit(_task, (what, config, a, b, epoch)))
            while len(pending) >= 4 * num_proc:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def _write_ends(
    tmp: Path,
    lengths: np.ndarray,
    index: Index,
    config: LayoutConfig,
    dtypes: dict,
    num_proc: int,
    progress: bool,
    epoch: int = 0,
) -> dict:
    """``ends.npy`` and (epoch 0) ``order.npy`` of a concat or document layout, CHUNK_DOCS documents at a time
    (O(chunk) memory per process)."""
    n = len(lengths)
    out = _NpyStream(tmp / "ends.npy", dtypes["ends.npy"])
    order = _NpyStream(tmp / "order.npy", dtypes["order.npy"]) if "order.npy" in dtypes else None
    carry, tokens = 0, 0
    ranges = [(a, min(a + CHUNK_DOCS, n)) for a in range(0, n, CHUNK_DOCS)]
    desc = f"{config.kind} layout" + (f" epoch {epoch}" if epoch else "")
    with _bar(n, desc, progress) as bar:
        for docs, extent in _ordered("extents", lengths, index, config, ranges, num_proc, epoch):
            tokens += int(extent.sum())
            ends = np.cumsum(extent if config.kind == "concat" else -(-extent // config.seq_len)) + carry
            out.write(ends)
            if order is not None:
                order.write(docs)
            carry = int(ends[-1])
            bar.update(len(extent))
    out.close()
    if order is not None:
        order.close()
    return {"num_tokens": tokens, "num_samples": (carry - 1) // config.seq_len if config.kind == "concat" else carry}


def _write_bestfit(
    tmp: Path, lengths: np.ndarray, index: Index, config: LayoutConfig, dtypes: dict, num_proc: int, progress: bool
) -> dict:
    """The four arrays of a best-fit layout, every window packed (by ``num_proc`` processes), streamed to disk."""
    files = {name.removesuffix(".npy"): _NpyStream(tmp / name, dt) for name, dt in dtypes.items()}
    files["window_bins"].write(np.zeros(1, np.int64))
    files["bin_items"].write(np.zeros(1, np.int64))
    bins, items = 0, 0
    with _bar(len(lengths), "bestfit layout", progress) as bar:
        num_windows = -(-len(lengths) // config.window_docs)
        per_block = max(1, LOCKSTEP_DOCS // config.window_docs)  # a packing task: windows packed in lockstep
        blocks = [(w, min(w + per_block, num_windows)) for w in range(0, num_windows, per_block)]
        for packed in _ordered("pack", lengths, index, config, blocks, num_proc):
            files["window_bins"].write(np.cumsum(packed.bins_per_window) + bins)
            files["bin_items"].write(np.cumsum(packed.items_per_bin) + items)
            files["item_docs"].write(packed.item_docs)
            files["item_pieces"].write(packed.item_pieces)
            bins += int(packed.bins_per_window.sum())
            items += len(packed.item_docs)
            bar.update(min(len(packed.bins_per_window) * config.window_docs, bar.total - bar.n))
    for f in files.values():
        f.close()
    return {"num_samples": bins, "num_items": items}


def _write_layout(tmp: Path, index: Index, config: LayoutConfig, num_proc: int, progress: bool, epoch: int = 0) -> None:
    start = time.perf_counter()
    lengths = _readable_lengths(index)
    dtypes = _dtypes(index, config, epoch)
    if config.kind == "bestfit":
        counts = _write_bestfit(tmp, lengths, index, config, dtypes, num_proc, progress)
        counts["num_tokens"] = index.num_tokens + index.num_documents
        if config.overlong != "split":
            counts["overlong_examples"], counts["dropped_tokens"] = overlong_counts(lengths, config)
    else:
        counts = _write_ends(tmp, lengths, index, config, dtypes, num_proc, progress, epoch)
    files = {name: {**write_checksums(tmp, name), "dtype": dt.name} for name, dt in dtypes.items()}
    if "ends.npy" in files:  # searched, not indexed: a fence lets a search read one block
        files["ends.npy"]["fence"] = write_fence(tmp, "ends.npy")
    if counts["num_samples"] < 1:
        raise ValueError(
            f"the {config.kind} layout of seq_len={config.seq_len} has no complete sample: the corpus has "
            f"{index.num_tokens + index.num_documents} tokens with EOS"
        )
    record = {
        "kind": LAYOUT_KIND,
        "format_version": LAYOUT_FORMAT_VERSION,
        "mapping_version": MAPPING_VERSION,
        "packing_version": PACKING_VERSION,
        "config": config_record(config),
        "index_fingerprint": index.fingerprint,
        "num_documents": index.num_documents,
        **({"epoch": int(epoch)} if epoch else {}),
        **counts,
        "files": files,
        "build": {"seconds": round(time.perf_counter() - start, 3), "num_proc": num_proc},
    }
    path = tmp / "layout.json"
    path.write_text(json.dumps(seal_meta(record), indent=2, sort_keys=True) + "\n")
    fsync_file(path)
    fsync_dir(tmp)


def build_layout(
    index: Index,
    config: LayoutConfig,
    num_proc: int = 1,
    progress: bool = False,
    replace_damaged: bool = False,
    epoch: int = 0,
) -> Path:
    """Build the layout directory of ``config`` beside ``index`` unless it exists (one process under a file lock; the
    others wait and find it complete). ``replace_damaged``: remove the existing directory first (it failed a check).
    ``epoch >= 1``: epoch ``epoch``'s directory of an ``epoch_order`` layout (``config`` without the option)."""
    if epoch and config.kind == "bestfit":
        raise ValueError("a bestfit layout has one packing for every epoch: it has no epoch directories")
    config = replace(config, epoch_order=False)  # epoch 0 of an epoch_order layout is the layout without it
    final = layout_dir(index, config, epoch)
    final.parent.mkdir(exist_ok=True)
    with FileLock(str(final.parent / f"{final.name}.lock")):
        if replace_damaged and final.exists():
            shutil.rmtree(final, ignore_errors=True)  # processes that map its files keep reading them until they reopen
        if (final / "layout.json").is_file():
            return final
        if final.exists():  # not sealed (removed by hand, an incomplete copy): never opened, rebuilt
            log.warning("detsampler: layout %s has no layout.json (an incomplete copy?); rebuilding it", final)
            shutil.rmtree(final)
        for stale in final.parent.glob(f".tmp-{final.name}-*"):  # left by killed builders; we hold the lock
            shutil.rmtree(stale, ignore_errors=True)
        tmp = final.parent / f".tmp-{final.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        try:
            _write_layout(tmp, index, config, num_proc, progress, epoch)
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        fsync_dir(final.parent)
    return final


# -- opening -------------------------------------------------------------------------------------------------------


def _read_record(
    path: Path | RemotePath, index: Index, config: LayoutConfig, epoch: int = 0, text: str | None = None
) -> dict:
    try:
        record = json.loads((path / "layout.json").read_text() if text is None else text)
    except (OSError, ValueError) as exc:
        raise TokenIndexError(f"layout {str(path)!r}: layout.json is unreadable ({exc})") from None
    expect = {
        "kind": LAYOUT_KIND,
        "format_version": LAYOUT_FORMAT_VERSION,
        "mapping_version": MAPPING_VERSION,
        "config": config_record(config),
        "index_fingerprint": index.fingerprint,
        "num_documents": index.num_documents,
    }
    if config.kind == "bestfit":
        expect["packing_version"] = PACKING_VERSION
    if epoch:
        expect["epoch"] = int(epoch)
    seen = record
    if isinstance(record, dict) and isinstance(record.get("config"), dict):  # compared by what shapes the samples
        seen = {**record, "config": _shaping(record["config"])}
        expect["config"] = _shaping(expect["config"])
    wrong = [k for k, v in expect.items() if not isinstance(seen, dict) or seen.get(k) != v]
    if wrong or not seal_ok(record):
        raise TokenIndexError(
            f"layout {str(path)!r}: layout.json " + (f"differs in {wrong}" if wrong else "fails its seal")
        )
    return record


def _shaping(config: dict) -> dict:
    """A recorded config less what does not shape the samples, as :func:`layout_dir`'s key leaves it out: the window
    outside bestfit, and ``epoch_order`` (epoch 0 of such a layout is the plain layout). Layouts of configs that differ
    only there share one directory and open each other's record."""
    return {
        k: v
        for k, v in config.items()
        if k != "epoch_order" and (k != "window_docs" or config.get("kind") == "bestfit")
    }


def _open_dir(
    path: Path | RemotePath, index: Index, config: LayoutConfig, epoch: int = 0, text: str | None = None
) -> Layout:
    """The layout at ``path`` over ``index`` (epoch ``epoch``'s, of an ``epoch_order`` layout): memory maps behind
    chunk checksums; O(1) work but the checksum files (``text``: its ``layout.json``, read already)."""
    r = _read_record(path, index, config, epoch, text)
    files, n = r["files"], index.num_documents
    dtypes = _dtypes(index, config, epoch)
    for name, dt in dtypes.items():
        if not isinstance(files.get(name), dict) or files[name].get("dtype") != dt.name:
            raise TokenIndexError(f"layout {str(path)!r}: {name} is not recorded as {dt.name}")
    if config.kind != "bestfit":
        wanted = {"ends.npy": (dtypes["ends.npy"], (n,))}
        if not epoch:
            wanted["order.npy"] = (dtypes["order.npy"], (n,))
        arrays = open_checked_all(path, files, wanted)  # in a bucket: together, a few round trips in all
        ends, order = arrays["ends.npy"], arrays.get("order.npy")
        if config.kind == "concat":
            if int(ends[-1]) != r["num_tokens"]:
                raise TokenIndexError(f"layout {str(path)!r}: ends.npy does not end at {r['num_tokens']} tokens")
            return ConcatLayout(config, index.lengths, ends, order, epoch=epoch)
        if int(ends[-1]) != r["num_samples"]:
            raise TokenIndexError(f"layout {str(path)!r}: ends.npy does not end at {r['num_samples']} samples")
        return DocumentLayout(config, index.lengths, ends, r["num_tokens"], order, epoch=epoch)
    b, m, w = int(r["num_samples"]), int(r["num_items"]), -(-n // config.window_docs)
    shapes = {"window_bins.npy": (w + 1,), "bin_items.npy": (b + 1,), "item_docs.npy": (m,), "item_pieces.npy": (m,)}
    arrays = open_checked_all(path, files, {name: (dtypes[name], shape) for name, shape in shapes.items()})
    packing = BinPacking(*(arrays[name] for name in shapes))
    if int(packing.window_bins[-1]) != b or int(packing.bin_items[-1]) != m:
        raise TokenIndexError(f"layout {str(path)!r}: its bin counts do not add up to {b} bins of {m} items")
    overlong = (int(r.get("overlong_examples", 0)), int(r.get("dropped_tokens", 0)))
    return BestFitLayout(config, index.lengths, packing, r["num_tokens"], overlong)


def _handed_over_layout(index: Index, inner: Layout, epoch: int) -> PersistedLayout:
    """A layout in an object store as the process that opened it hands it over (a DataLoader worker's): no request."""
    layout = PersistedLayout.__new__(PersistedLayout)
    layout.index, layout.epoch, layout.inner = index, int(epoch), inner
    layout.path = layout_dir(index, inner.config, layout.epoch)
    layout.index_fingerprint = index.fingerprint
    layout._num_proc, layout._progress = 1, False
    return layout


class PersistedLayout:
    """A layout opened from its directory beside the index (see the module doc). It behaves as the layout it wraps, and
    pickles as ``(index, config, epoch)``: a DataLoader worker reopens the memory maps, nothing of size D is copied.
    ``epoch >= 1``: epoch ``epoch``'s view of an ``epoch_order`` layout (``config`` without the option)."""

    def __init__(
        self, index: Index, config: LayoutConfig, num_proc: int = 1, progress: bool = False, epoch: int = 0
    ) -> None:
        self.index = index
        self.epoch = int(epoch)
        self.path = layout_dir(index, config, self.epoch)
        self.index_fingerprint = index.fingerprint
        self._num_proc, self._progress = num_proc, progress
        self.inner = self._open(config)

    def _build(self, config: LayoutConfig, replace_damaged: bool = False) -> None:
        build_layout(self.index, config, self._num_proc, self._progress, replace_damaged, self.epoch)

    def _open(self, config: LayoutConfig) -> Layout:
        if isinstance(self.path, RemotePath):  # an object store is read-only here: `detsampler push` writes layouts
            try:  # one GET, no existence check first
                text = (self.path / "layout.json").read_text()
            except FileNotFoundError:
                raise PermissionError(
                    errno.EROFS, "an object store is read-only: push the layout with the index"
                ) from None
            return _open_dir(self.path, self.index, config, self.epoch, text)
        if (self.path / "layout.json").is_file():
            try:
                return _open_dir(self.path, self.index, config, self.epoch)
            except (TokenIndexError, FileNotFoundError) as exc:  # damaged, or removed while opening (an old epoch)
                log.warning("detsampler: %s; rebuilding it", exc)
                self._build(config, replace_damaged=True)
                return _open_dir(self.path, self.index, config, self.epoch)
        self._build(config)
        return _open_dir(self.path, self.index, config, self.epoch)

    def locate(self, sample_ids: np.ndarray) -> Any:
        try:
            return self.inner.locate(sample_ids)
        except ChecksumError as exc:
            if exc.path is None or exc.path.parent != self.path or isinstance(self.path, RemotePath):
                raise  # the index's own files (or a remote layout, read-only): rebuilding the layout cannot help
            log.warning("detsampler: %s; rebuilding the layout %s", exc, self.path.name)
            self._build(self.config, replace_damaged=True)
            self.inner = _open_dir(self.path, self.index, self.config, self.epoch)
            return self.inner.locate(sample_ids)

    def __getattr__(self, name: str) -> Any:
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def __reduce__(self):
        if isinstance(self.path, RemotePath):  # handed over: the layout opened and checked, its arrays as they pickle
            return (_handed_over_layout, (self.index, self.inner, self.epoch))
        return (PersistedLayout, (self.index, self.config, 1, False, self.epoch))

    def __repr__(self) -> str:
        epoch = f", epoch={self.epoch}" if self.epoch else ""
        return f"PersistedLayout({str(self.path)!r}, num_samples={self.num_samples}{epoch})"


class PersistedEpochLayout(EpochOrderedLayout):
    """An ``epoch_order`` layout over ``index``: epoch 0 is the persisted layout without the option, epoch ``e >= 1``
    its own directory (module doc). Opening epoch ``e`` starts the build of ``e + 1`` in a background thread and
    removes the directories of epochs below ``e - KEEP_EPOCH_DIRS``; an epoch that cannot be written (a read-only
    index) is computed in RAM. Pickles as ``(index, config)``."""

    def __init__(self, index: Index, config: LayoutConfig, num_proc: int = 1, progress: bool = False) -> None:
        self.index = index
        self.path = layout_dir(index, config)
        self.index_fingerprint = index.fingerprint
        self._base = replace(config, epoch_order=False)
        self._num_proc, self._progress = num_proc, progress
        self._ahead: dict[int, threading.Thread | None] = {}  # epochs prepared (None: found built)
        self._newest = 0
        super().__init__(config, self._open_view)

    def _open_view(self, epoch: int) -> Layout:
        try:
            view = PersistedLayout(self.index, self._base, self._num_proc, self._progress, epoch)
        except PermissionError as exc:
            if not epoch:
                raise
            log.warning(
                "detsampler: cannot write epoch %d of the layout (%s): computing it in RAM", epoch, exc.strerror
            )
            return LAYOUTS[self._base.kind](self._base, self.index.lengths, epoch=epoch)
        if epoch > self._newest:
            self._newest = epoch
            self._prune(epoch - KEEP_EPOCH_DIRS)
        return view

    def _prune(self, below: int) -> None:
        """Remove the epoch directories of epochs ``1 .. below - 1`` (each under its build lock)."""
        if isinstance(self.path, RemotePath):
            return
        for epoch, path in epoch_dirs(self.index, self._base).items():
            if epoch < below:
                with FileLock(str(path.parent / f"{path.name}.lock")):
                    shutil.rmtree(path, ignore_errors=True)

    def _prepare(self, epoch: int) -> None:
        """Build epoch ``epoch``'s directory in a background thread (once per process), unless it is there."""
        if epoch in self._ahead:
            return
        path = layout_dir(self.index, self._base, epoch)
        if isinstance(path, RemotePath) or (path / "layout.json").is_file():
            self._ahead[epoch] = None
            return
        thread = threading.Thread(target=self._build_ahead, args=(epoch,), name=f"layout-epoch-{epoch}", daemon=True)
        self._ahead[epoch] = thread
        thread.start()

    def _build_ahead(self, epoch: int) -> None:
        try:
            build_layout(self.index, self._base, 1, False, False, epoch)
        except Exception as exc:  # NOTE: the epoch is built again when it is opened; a failure ahead is only logged
            log.warning("detsampler: building epoch %d of the layout ahead failed: %s", epoch, exc)

    def wait_ahead(self) -> None:
        """Wait for the background builds started so far (tests, and a clean exit)."""
        for thread in list(self._ahead.values()):
            if thread is not None:
                thread.join()

    def __reduce__(self):
        return (PersistedEpochLayout, (self.index, self.config))

    def __repr__(self) -> str:
        return f"PersistedEpochLayout({str(self.path)!r}, num_samples={self.num_samples}, epoch_order=True)"


def open_layout(index: Index, config: LayoutConfig, num_proc: int = 1, progress: bool = False) -> Layout:
    """The layout ``config`` of ``index``, persisted beside it (built first if needed, by one process under a lock;
    with ``epoch_order``, :class:`PersistedEpochLayout`).

    When the index directory is read-only and the layout was never built, it is computed in RAM (with a warning).
    """
    try:
        if config.epoch_order:
            return PersistedEpochLayout(index, config, num_proc, progress)
        return PersistedLayout(index, config, num_proc, progress)
    except PermissionError as exc:
        from detsampler.layout import make_layout

        log.warning("detsampler: cannot write the layout beside %s (%s): computing it in RAM", index.path, exc.strerror)
        return make_layout(config, index.lengths)
