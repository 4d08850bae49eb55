"""Layouts: how the documents of a corpus are cut into samples of ``seq_len`` tokens.

A layout sees only per-document token counts (documents in dataset order). Each document is followed by one EOS token,
so document ``d`` owns ``lengths[d] + 1`` token positions: ``[0, lengths[d])`` are its tokens and position
``lengths[d]`` its EOS. A sample is a list of spans ``(doc_id, start, stop)`` over those positions (:class:`Spans`).
Documents are visited in a seeded order (``document_order``), fixed for the whole run; the plan shuffles samples per
epoch on top of it. With ``LayoutConfig(epoch_order=True)`` (concat and document) each epoch has its own order instead
(:mod:`detsampler.epoch_order`: sample ids then carry their epoch).

- ``concat``: the documents in that order, each with its EOS, form one token stream; sample ``c`` is the stream's tokens
  ``[c*L, c*L + L + 1)``: L inputs and the shifted label. The inputs of samples ``0 .. num_samples-1`` tile the stream's
  first ``num_samples * L`` tokens exactly; only the final partial sample's tokens are left out.
- ``document``: each sample is one piece of one document: a document of ``m = length + 1`` positions gives ``ceil(m /
L)``
  consecutive pieces of ``L`` positions (the last one shorter); the rest of a sample is padding.
- ``bestfit``: within windows of ``window_docs`` consecutive documents, documents are cut into pieces of ``L`` positions
  (only documents longer than ``L`` are cut) and the pieces are packed into bins of ``L`` by best-fit decreasing
  (:mod:`detsampler.packing`). A sample is a bin; every window is packed when the layout is made, never again. A
  document longer than ``L`` positions follows ``LayoutConfig.overlong``: cut into pieces (``split``, the default),
  cut to its first ``L`` positions (``truncate``) or left out (``drop``); every kept document once per epoch.

Each layout holds a few arrays: computed in RAM from the lengths (:func:`make_layout`), or given, e.g. memory maps of a
persisted layout (:mod:`detsampler.index.layouts`, which stores the document order too); it then holds nothing of size
D, and reads the order from the given array, or computes it pointwise (:func:`documents_at`) when none is given.
For ``document`` and ``bestfit`` every position of every document lies in exactly one sample per epoch
(tests/test_layout.py; with ``overlong="truncate"`` or ``"drop"``, every position kept: tests/test_overlong.py).
"""

from __future__ import annotations

import numbers
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal, Protocol

import numpy as np

from detsampler.epoch_order import EpochOrderedLayout, document_order_key
from detsampler.packing import Packed, pack_best_fit, pack_windows
from detsampler.permutation import permute
from detsampler.ranges import concat_ranges
from detsampler.spans import Spans

__all__ = [
    "LAYOUTS",
    "LAYOUT_KINDS",
    "OVERLONG_POLICIES",
    "BestFitLayout",
    "BinPacking",
    "ConcatLayout",
    "DocumentLayout",
    "EpochOrderedLayout",
    "Layout",
    "LayoutConfig",
    "LayoutKind",
    "Spans",
    "config_record",
    "document_order",
    "documents_at",
    "fit_overlong",
    "make_layout",
    "overlong_counts",
    "pack_best_fit",
]

LayoutKind = Literal["concat", "document", "bestfit"]  # the keys of LAYOUTS (below), for type checkers
Overlong = Literal["split", "truncate", "drop"]
OVERLONG_POLICIES: tuple[str, ...] = ("split", "truncate", "drop")
_OVERLONG_KEYS = {"truncate": "examples_truncated", "drop": "examples_dropped"}  # in describe()


@dataclass(frozen=True, kw_only=True)
class LayoutConfig:
    """How to cut documents into samples. ``seq_len`` is the number of input tokens of a sample."""

    kind: LayoutKind = "concat"
    seq_len: int = 512
    seed: int = 0
    window_docs: int = 1024  # bestfit only: documents packed together
    # bestfit only: a document of more than seq_len positions (length + 1, its EOS counted) is cut into pieces of
    # seq_len ("split", as before this option existed), cut to its first seq_len positions ("truncate": the rest, its
    # EOS included, is never served) or left out ("drop"); counted in describe() (examples_truncated/dropped and
    # dropped_tokens)
    overlong: Overlong = "split"
    # concat and document only: each epoch visits the documents in its own keyed order (keyed by seed and epoch; epoch
    # 0's is the order without the option), so sample boundaries move from epoch to epoch; sample ids then carry their
    # epoch (detsampler.epoch_order). False: one order for the whole run, as before this option existed
    epoch_order: bool = False

    def __post_init__(self) -> None:
        if self.kind not in LAYOUTS:
            raise ValueError(f"layout kind must be one of {tuple(LAYOUTS)}, got {self.kind!r}")
        if isinstance(self.seq_len, bool) or not isinstance(self.seq_len, int) or self.seq_len < 1:
            raise ValueError(f"seq_len must be an integer >= 1, got {self.seq_len!r}")
        if self.kind != "concat" and self.seq_len < 2:
            # NOTE: a document/bestfit sample holds seq_len positions and its labels are the next ones within it: with
            # one position there is no label, and training on it gives a NaN loss.
            raise ValueError(
                f"seq_len must be >= 2 for the {self.kind} layout (a sample of 1 token has no label), got 1"
            )
        if isinstance(self.seed, bool) or not isinstance(self.seed, numbers.Integral):
            raise ValueError(f"seed must be an integer, got {self.seed!r}")
        if isinstance(self.window_docs, bool) or not isinstance(self.window_docs, int) or self.window_docs < 1:
            raise ValueError(f"window_docs must be an integer >= 1, got {self.window_docs!r}")
        if self.overlong not in OVERLONG_POLICIES:
            raise ValueError(f"overlong must be one of {OVERLONG_POLICIES}, got {self.overlong!r}")
        if self.overlong != "split" and self.kind != "bestfit":
            raise ValueError(
                f"overlong={self.overlong!r} applies to the bestfit layout only (the {self.kind} layout packs no whole"
                " examples); use kind='bestfit' or overlong='split'"
            )
        if not isinstance(self.epoch_order, (bool, np.bool_)):
            raise ValueError(f"epoch_order must be True or False, got {self.epoch_order!r}")
        object.__setattr__(self, "epoch_order", bool(self.epoch_order))
        if self.epoch_order and self.kind == "bestfit":
            raise ValueError(
                "epoch_order applies to the concat and document layouts: a bestfit layout packs its windows once, when"
                " it is made (a packing per epoch is not implemented); use kind='concat' or 'document', or"
                " epoch_order=False"
            )


def config_record(config: LayoutConfig) -> dict:
    """The config as recorded in identities (describe(), persisted layouts' keys and records, resume checks): its
    fields, ``overlong`` left out when it is the default "split" and ``epoch_order`` when False, so that every layout
    made before these options existed keeps its identity."""
    record = asdict(config)
    if record["overlong"] == "split":
        del record["overlong"]
    if not record["epoch_order"]:
        del record["epoch_order"]
    return record


def fit_overlong(docs: np.ndarray, extents: np.ndarray, config: LayoutConfig) -> tuple[np.ndarray, np.ndarray]:
    """The documents a best-fit window packs and their extents under ``config.overlong``: all of them ("split"), the
    extents capped at ``seq_len`` ("truncate"), or only those of at most ``seq_len`` positions ("drop")."""
    if config.overlong == "truncate":
        return docs, np.minimum(extents, config.seq_len)
    if config.overlong == "drop":
        keep = extents <= config.seq_len
        return docs[keep], extents[keep]
    return docs, extents


def overlong_counts(lengths: Any, config: LayoutConfig, chunk: int = 1 << 20) -> tuple[int, int]:
    """``(examples, tokens)``: the documents longer than ``seq_len`` positions and the positions ``config.overlong``
    leaves out of every epoch (0 for "split"); read ``chunk`` lengths at a time."""
    if config.overlong == "split":
        return 0, 0
    examples, lost = 0, 0
    for a in range(0, len(lengths), chunk):
        ext = np.asarray(lengths[a : a + chunk], dtype=np.int64) + 1
        over = ext[ext > config.seq_len]
        examples += len(over)
        lost += int(over.sum()) - (config.seq_len * len(over) if config.overlong == "truncate" else 0)
    return examples, lost


class Layout(Protocol):
    """What the plan, the dataset, mixtures and the tools read of a layout; nothing else of it is used.

    ``labels_cross_documents``: True when a sample is a window of one token stream whose label at the last input is the
    next document's first token (concat: ``sample_len = seq_len + 1``, position ids count 0..L-1); False when labels
    stay within a span (document, bestfit: the last position of each span gets no label, position ids restart per span).
    """

    config: LayoutConfig
    num_samples: int
    num_documents: int
    num_tokens: int  # token positions of the corpus, one EOS per document counted
    lengths: np.ndarray  # tokens of each document (EOS not counted), the array the layout was made over
    labels_cross_documents: bool

    @property
    def tokens_per_epoch(self) -> int:
        """Input tokens one epoch of samples serves (padding not counted)."""

    @property
    def sample_len(self) -> int:
        """Token positions a full sample holds: ``seq_len + 1`` for concat (inputs and label), else ``seq_len``."""

    def locate(self, sample_ids: np.ndarray) -> Spans:
        """The spans of samples ``sample_ids`` (each in ``[0, num_samples)``; with ``epoch_order``, ids that carry their
        epoch, ``epoch * num_samples + sample``)."""

    def describe(self) -> dict:
        """Counts and configuration, for summaries and fingerprints."""


MAX_TOKENS = 2**62  # token positions (documents with their EOS, in all) are int64, with room to spare


def _check_lengths(lengths: np.ndarray) -> np.ndarray:
    arr = np.asarray(lengths)
    if arr.ndim != 1:
        raise ValueError(f"document lengths must be a 1-D array, got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError("the dataset is empty: a layout needs at least one document")
    if arr.dtype.kind not in "iu":
        raise ValueError(f"document lengths must be integers, got dtype {arr.dtype}")
    if arr.min() < 0:
        raise ValueError(f"document lengths must be >= 0, got {int(arr.min())} for document {int(np.argmin(arr))}")
    if arr.max() > MAX_TOKENS:  # compared in the array's own dtype: a uint64 above 2**63 never wraps to negative here
        raise ValueError(f"document lengths must be <= 2**62, got {int(arr.max())} for document {int(np.argmax(arr))}")
    arr = arr.astype(np.int64, copy=False)
    # exact in int64 whatever the values (each half of a length below 2**31, fewer than 2**32 documents)
    high, low = arr >> 31, arr & ((1 << 31) - 1)
    total = (int(high.sum()) << 31) + int(low.sum()) + len(arr)
    if total > MAX_TOKENS:
        raise ValueError(
            f"the documents hold {total} tokens with EOS in all; at most 2**62 = {MAX_TOKENS}, so that token positions"
            " fit in int64"
        )
    return arr


def _check_sample_ids(sample_ids: np.ndarray, num_samples: int) -> np.ndarray:
    raw = np.asarray(sample_ids)
    if raw.size == 0:
        return np.zeros(0, dtype=np.int64)
    if raw.dtype.kind not in "iu":
        raise ValueError(f"Got sample ids of dtype {raw.dtype}, sample ids must be integers")
    raw = raw.reshape(-1)
    # NOTE: as uint64 a negative id is above every valid one: one reduction checks both ends
    if raw.dtype == np.int64 and int(np.maximum.reduce(raw.view(np.uint64))) < num_samples:
        return raw
    bad = (raw < 0) | (raw >= num_samples)  # in the ids' own dtype: a uint64 never wraps to a valid id
    if bad.any():
        raise ValueError(f"Got sample id {int(raw[bad][0])}, allowed sample ids are in [0, {num_samples})")
    return raw.astype(np.int64, copy=False)


def document_order(num_documents: int, seed: int, epoch: int = 0) -> np.ndarray:
    """The seeded order in which a layout visits documents: ``order[i]`` is the i-th document (a permutation).
    ``epoch``: that epoch's order under ``epoch_order`` (:func:`~detsampler.epoch_order.document_order_key`; 0: the one
    order without it).

    Drawn from mapping version 1's permutation in every mapping version: version 2 changed the sample orders (plan
    epochs, mixture sources), not the layouts' cutting, so a layout, its cached bin counts and the tokens of its samples
    are the same whatever version a plan reads it with (tests/test_pinned.py pins them once).
    """
    return documents_at(np.arange(num_documents, dtype=np.int64), num_documents, seed, epoch)


def documents_at(positions: np.ndarray, num_documents: int, seed: int, epoch: int = 0) -> np.ndarray:
    """``document_order(num_documents, seed, epoch)[positions]``, computed pointwise: O(len(positions)),
    whatever the corpus."""
    key = document_order_key(seed, epoch)
    return permute(np.asarray(positions, dtype=np.int64), num_documents, key, version=1)


def _take(arr: Any, idx: np.ndarray) -> np.ndarray:
    """``arr[idx]`` as int64 (``arr`` an array, a memory map or a checked array)."""
    return np.asarray(arr[idx], dtype=np.int64)


def _before(ends: Any, pos: np.ndarray) -> np.ndarray:
    """``ends[pos - 1]``, 0 where ``pos == 0``."""
    out = np.zeros(len(pos), dtype=np.int64)
    nz = pos > 0
    out[nz] = _take(ends, pos[nz] - 1)
    return out


def _bounds(ends: Any, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(_before(ends, pos), ends[pos])`` in one read of ``ends``."""
    both = _take(ends, np.concatenate([np.maximum(pos - 1, 0), pos]))
    begin = both[: len(pos)]
    begin[pos == 0] = 0
    return begin, both[len(pos) :]


class _Ordered:
    """What the layouts share: the config, the lengths, and the seeded document order: in RAM (built from lengths),
    given (e.g. a persisted layout's checked memory map: nothing of size D is held), or else computed pointwise.
    ``epoch``: whose order (under ``epoch_order``; 0 otherwise)."""

    config: LayoutConfig
    lengths: Any
    num_documents: int
    epoch: int
    _order: Any

    def _init_lengths(
        self, config: LayoutConfig, lengths: Any, in_ram: bool, order: Any = None, epoch: int = 0
    ) -> None:
        self.config = config
        self.epoch = int(epoch)
        self.lengths = _check_lengths(lengths) if in_ram else lengths
        self.num_documents = len(self.lengths)
        if order is not None and len(order) != self.num_documents:
            raise ValueError(f"a document order of {len(order)} documents, the lengths have {self.num_documents}")
        self._order = document_order(self.num_documents, config.seed, self.epoch) if in_ram else order

    @property
    def order(self) -> np.ndarray:
        """The whole document order (O(D): for tests and tools; the layout reads it only at the positions it needs)."""
        if self._order is not None:
            return np.asarray(self._order, dtype=np.int64)
        return document_order(self.num_documents, self.config.seed, self.epoch)

    def _docs(self, positions: np.ndarray) -> np.ndarray:
        """``order[positions]`` (int64): read from the order held or given, else computed pointwise."""
        if self._order is not None:
            return _take(self._order, positions)
        return documents_at(positions, self.num_documents, self.config.seed, self.epoch)

    def _extents(self, docs: np.ndarray) -> np.ndarray:
        return _take(self.lengths, docs) + 1


class ConcatLayout(_Ordered):
    """Documents (each with its EOS) concatenated in the seeded order; sample ``c`` is stream tokens ``[cL, cL + L +
    1)``.

    ``ends[i]`` is the stream position just after the i-th document of the order (given: persisted, with the order
    when it was stored; else computed).
    """

    labels_cross_documents = True

    def __init__(self, config: LayoutConfig, lengths: Any, ends: Any = None, order: Any = None, epoch: int = 0) -> None:
        self._init_lengths(config, lengths, in_ram=ends is None, order=order, epoch=epoch)
        self.ends = np.cumsum(self.lengths[self._order] + 1) if ends is None else ends
        self.num_tokens = int(self.ends[-1])
        self.num_samples = (self.num_tokens - 1) // config.seq_len
        if self.num_samples < 1:
            raise ValueError(
                f"no complete sample: the corpus has {self.num_tokens} tokens with EOS, a concat sample of "
                f"seq_len={config.seq_len} needs {config.seq_len + 1}"
            )

    @property
    def sample_len(self) -> int:
        return self.config.seq_len + 1

    @property
    def tokens_per_epoch(self) -> int:
        return self.num_samples * self.config.seq_len

    def locate(self, sample_ids: np.ndarray) -> Spans:
        ids = _check_sample_ids(sample_ids, self.num_samples)
        L, n = self.config.seq_len, len(ids)
        begin = ids * L  # a sample reads stream positions [begin, begin + L]: its documents are those found there
        found = np.asarray(self.ends.searchsorted(np.concatenate([begin, begin + L]), side="right"), dtype=np.int64)
        first = found[:n]
        counts = found[n:] - first + 1
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.add.accumulate(counts, out=offsets[1:])
        pos = np.arange(offsets[-1], dtype=np.int64) + np.repeat(first - offsets[:-1], counts)
        doc_begin, doc_end = _bounds(self.ends, pos)
        rel = np.repeat(begin, counts) - doc_begin  # the sample's start, relative to each of its documents
        return Spans(offsets, self._docs(pos), np.maximum(rel, 0), np.minimum(rel + (L + 1), doc_end - doc_begin))

    def describe(self) -> dict:
        used = self.num_samples * self.config.seq_len
        return {
            **config_record(self.config),
            "num_documents": self.num_documents,
            "num_tokens": self.num_tokens,
            "num_samples": self.num_samples,
            "padding_fraction": 0.0,
            "dropped_tokens": self.num_tokens - used,
        }


class DocumentLayout(_Ordered):
    """Each sample is one piece of at most ``seq_len`` positions of one document, starting at a document boundary.

    ``ends[i]`` is the number of samples of the first ``i + 1`` documents of the order (given: persisted, with
    ``num_tokens`` and the order when it was stored; else computed).
    """

    labels_cross_documents = False

    def __init__(
        self,
        config: LayoutConfig,
        lengths: Any,
        ends: Any = None,
        num_tokens: int | None = None,
        order: Any = None,
        epoch: int = 0,
    ) -> None:
        self._init_lengths(config, lengths, in_ram=ends is None, order=order, epoch=epoch)
        if ends is None:
            extent = self.lengths[self._order] + 1
            ends, num_tokens = np.cumsum(-(-extent // config.seq_len)), int(extent.sum())
        self.ends = ends
        self.num_samples = int(self.ends[-1])
        self.num_tokens = int(num_tokens)

    @property
    def sample_len(self) -> int:
        return self.config.seq_len

    @property
    def tokens_per_epoch(self) -> int:
        return self.num_tokens

    def locate(self, sample_ids: np.ndarray) -> Spans:
        ids = _check_sample_ids(sample_ids, self.num_samples)
        pos = np.asarray(self.ends.searchsorted(ids, side="right"), dtype=np.int64)
        docs = self._docs(pos)
        starts = (ids - _before(self.ends, pos)) * self.config.seq_len
        stops = np.minimum(starts + self.config.seq_len, self._extents(docs))
        return Spans(np.arange(len(ids) + 1, dtype=np.int64), docs, starts, stops)

    def describe(self) -> dict:
        return {
            **config_record(self.config),
            "num_documents": self.num_documents,
            "num_tokens": self.num_tokens,
            "num_samples": self.num_samples,
            "padding_fraction": 1.0 - self.num_tokens / (self.num_samples * self.config.seq_len),
            "dropped_tokens": 0,
        }


@dataclass(frozen=True)
class BinPacking:
    """A best-fit layout's bins, cumulative: window ``w`` holds bins ``window_bins[w]:window_bins[w+1]``, bin ``b``
    holds items ``bin_items[b]:bin_items[b+1]``, item ``j`` is piece ``item_pieces[j]`` of document ``item_docs[j]``."""

    window_bins: Any
    bin_items: Any
    item_docs: Any
    item_pieces: Any


def cumulative(packed: Packed) -> BinPacking:
    """The cumulative form of a whole layout's :class:`~detsampler.packing.Packed`."""
    window_bins = np.zeros(len(packed.bins_per_window) + 1, dtype=np.int64)
    np.cumsum(packed.bins_per_window, out=window_bins[1:])
    bin_items = np.zeros(len(packed.items_per_bin) + 1, dtype=np.int64)
    np.cumsum(packed.items_per_bin, out=bin_items[1:])
    return BinPacking(window_bins, bin_items, packed.item_docs, packed.item_pieces)


class BestFitLayout(_Ordered):
    """Best-fit-decreasing bins of ``seq_len`` positions within windows of ``window_docs`` consecutive documents.

    Every window is packed once, when the layout is made (``packing`` given: persisted, with ``num_tokens``); locating a
    sample reads its bin's items: O(items), never a repacking.
    """

    labels_cross_documents = False

    def __init__(
        self,
        config: LayoutConfig,
        lengths: Any,
        packing: BinPacking | None = None,
        num_tokens: int | None = None,
        overlong: tuple[int, int] | None = None,
    ) -> None:
        self._init_lengths(config, lengths, in_ram=packing is None)
        self.num_windows = -(-self.num_documents // config.window_docs)
        if packing is None:
            w = config.window_docs
            fitted = [fit_overlong(d, self.lengths[d] + 1, config) for d in self._order_windows(w)]
            packing = cumulative(pack_windows([d for d, _ in fitted], [e for _, e in fitted], config.seq_len))
            num_tokens = int(self.lengths.sum()) + self.num_documents
            overlong = overlong_counts(self.lengths, config)
            if len(packing.bin_items) == 1:
                raise ValueError(
                    f"no sample: every document is longer than seq_len={config.seq_len} positions and"
                    " overlong='drop' leaves them all out"
                )
        if len(packing.window_bins) != self.num_windows + 1:
            raise ValueError(f"a packing of {len(packing.window_bins) - 1} windows, the layout has {self.num_windows}")
        self.packing = packing
        self.num_tokens = int(num_tokens)
        self.num_samples = len(packing.bin_items) - 1
        # NOTE: (documents longer than seq_len positions, positions they lose) under config.overlong; (0, 0) for split
        self.overlong_examples, self.dropped_tokens = overlong if overlong is not None else (0, 0)

    def _order_windows(self, w: int) -> list[np.ndarray]:
        return [self._order[i * w : (i + 1) * w] for i in range(self.num_windows)]

    @property
    def sample_len(self) -> int:
        return self.config.seq_len

    @property
    def bins_per_window(self) -> np.ndarray:
        """Bins of each window (int64, one per window)."""
        return np.diff(np.asarray(self.packing.window_bins, dtype=np.int64))

    @property
    def tokens_per_epoch(self) -> int:
        return self.num_tokens - self.dropped_tokens

    def window_documents(self, window: int) -> np.ndarray:
        """The document ids of window ``window``, in the seeded order."""
        w = self.config.window_docs
        return self._docs(np.arange(window * w, min((window + 1) * w, self.num_documents), dtype=np.int64))

    def locate(self, sample_ids: np.ndarray) -> Spans:
        ids = _check_sample_ids(sample_ids, self.num_samples)
        first = _take(self.packing.bin_items, ids)
        items, offsets = concat_ranges(first, _take(self.packing.bin_items, ids + 1) - first)
        docs = _take(self.packing.item_docs, items)
        starts = _take(self.packing.item_pieces, items) * self.config.seq_len
        stops = np.minimum(starts + self.config.seq_len, self._extents(docs))
        return Spans(offsets, docs, starts, stops)

    def describe(self) -> dict:
        return {
            **config_record(self.config),
            "num_documents": self.num_documents,
            "num_tokens": self.num_tokens,
            "num_samples": self.num_samples,
            "num_windows": self.num_windows,
            "padding_fraction": 1.0 - self.tokens_per_epoch / (self.num_samples * self.config.seq_len),
            "dropped_tokens": self.dropped_tokens,
        } | ({_OVERLONG_KEYS[self.config.overlong]: self.overlong_examples} if self.config.overlong != "split" else {})


LAYOUTS: dict[str, type] = {"concat": ConcatLayout, "document": DocumentLayout, "bestfit": BestFitLayout}
LAYOUT_KINDS: tuple[str, ...] = tuple(LAYOUTS)


class _EpochInRam:
    """Epoch ``e``'s view of an ``epoch_order`` layout computed in RAM (O(D) per epoch opened); picklable."""

    def __init__(self, config: LayoutConfig, lengths: np.ndarray) -> None:
        self.config, self.lengths = replace(config, epoch_order=False), _check_lengths(lengths)

    def __call__(self, epoch: int) -> Layout:
        return LAYOUTS[self.config.kind](self.config, self.lengths, epoch=epoch)


def make_layout(config: LayoutConfig, lengths: np.ndarray) -> Layout:
    """The layout ``config.kind`` over documents of ``lengths`` tokens (EOS not counted), computed in RAM (O(D); with
    ``epoch_order``, O(D) for each epoch opened, a few held at a time).

    For an index, ``index.layout(config)`` opens the persisted layout instead (memory maps, built once).
    """
    if config.epoch_order:
        return EpochOrderedLayout(config, _EpochInRam(config, lengths))
    return LAYOUTS[config.kind](config, lengths)
