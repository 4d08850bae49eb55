"""A new document order each epoch (``LayoutConfig(epoch_order=True)``, concat and document layouts).

Epoch ``e`` visits the documents in its own keyed order: position ``i`` of the order holds document
``permute(i, D, document_order_key(seed, e), version=1)``. Epoch 0's key is the key of the layout without the option,
so epoch 0 reads exactly what that layout reads; epoch ``e >= 1`` is keyed by ``(seed, e)``. Within an epoch the layout
is the plain layout of that order (concat: the documents in that order, each with its EOS, cut at ``seq_len``;
document: the pieces of each document in that order). Hence, per epoch:

- every token position of every document is read exactly once (concat: all but the epoch's final partial sample,
  ``num_tokens - N * seq_len`` positions at the end of that epoch's stream), and the set of documents is the corpus;
- the number of samples ``N`` is the same in every epoch (concat: ``(T - 1) // L`` of ``T`` positions; document:
  ``sum ceil(m_d / L)``: neither depends on the order), so the plan's epochs keep their length;
- the sample boundaries move: two epochs' samples are equal exactly when their orders agree on the documents the
  samples cover (tests/test_epoch_order.py).

Sample ids carry their epoch: id ``e * N + c`` (int64) is sample ``c`` of epoch ``e``; a plan built with
``epoch_ids=True`` yields them (``EpochStream``), and every reader of sample ids (the dataset, ``locate``, ``where``,
``show``, ``verify``) passes them through unchanged. Without the option nothing here is used: layouts, sample ids and
fingerprints are those of before.

:class:`EpochOrderedLayout` holds at most :data:`KEEP_EPOCHS` epoch views (each the plain layout of one epoch's order,
opened by a callable: computed in RAM, or a persisted epoch directory), least recently used out first, so its memory
does not grow with the number of epochs; a subclass may prepare the next epoch when one is opened (the persisted
layouts build it in the background: :mod:`detsampler.index.layouts`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np

from detsampler.keys import stable_hash64
from detsampler.spans import Spans, merge_spans

__all__ = ["KEEP_EPOCHS", "EpochOrderedLayout", "document_order_key", "split_epoch_ids"]

KEEP_EPOCHS = 3  # epoch views held: a step that straddles an epoch boundary reads two, and the next one is prepared


def document_order_key(seed: int, epoch: int = 0) -> int:
    """The key of epoch ``epoch``'s document order (mapping version 1's permutation of ``range(D)``): epoch 0's is
    the order of a layout without ``epoch_order`` (``stable_hash64("document-order", seed)``), epoch ``e >= 1``'s
    ``stable_hash64("document-order", seed, "epoch", e)``."""
    if epoch == 0:
        return stable_hash64("document-order", seed)
    return stable_hash64("document-order", seed, "epoch", int(epoch))


def split_epoch_ids(sample_ids: Any, num_samples: int) -> tuple[np.ndarray, np.ndarray]:
    """``(epochs, samples)`` of epoch-qualified sample ids ``e * num_samples + c`` (int64, any non-negative id)."""
    raw = np.asarray(sample_ids)
    if raw.size == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    if raw.dtype.kind not in "iu":
        raise ValueError(f"Got sample ids of dtype {raw.dtype}, sample ids must be integers")
    raw = raw.reshape(-1)
    bad = raw < 0
    if bad.any() or (raw.dtype.kind == "u" and int(raw.max()) > np.iinfo(np.int64).max):
        value = int(raw[bad][0]) if bad.any() else int(raw.max())
        raise ValueError(
            f"Got sample id {value}, allowed sample ids of a layout with epoch_order are epoch * {num_samples} +"
            f" sample, in [0, 2**63)"
        )
    ids = raw.astype(np.int64, copy=False)
    return ids // num_samples, ids % num_samples


class EpochOrderedLayout:
    """The layout ``config`` (with ``epoch_order=True``) of every epoch: ``open_epoch(e)`` gives epoch ``e``'s view,
    the plain layout of its document order. Sample ids carry their epoch (module doc); ``num_samples`` is per epoch.

    Memory: at most ``keep`` views are held (least recently used out first), whatever the number of epochs.
    """

    def __init__(self, config: Any, open_epoch: Callable[[int], Any], keep: int = KEEP_EPOCHS) -> None:
        self.config = config
        self._open_epoch = open_epoch
        self._keep = max(1, int(keep))
        self._views: OrderedDict[int, Any] = OrderedDict()
        self._lock = threading.Lock()
        first = self._open_epoch(0)
        self._views[0] = first
        self.num_samples = int(first.num_samples)
        self.num_documents = int(first.num_documents)
        self.num_tokens = int(first.num_tokens)
        self.lengths = first.lengths
        self.labels_cross_documents = bool(first.labels_cross_documents)
        self.sample_len = int(first.sample_len)
        self.tokens_per_epoch = int(first.tokens_per_epoch)
        self._described = {**first.describe(), "epoch_order": True}

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_lock"] = None
        state["_views"] = OrderedDict((e, v) for e, v in self._views.items() if e == 0)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def epoch_view(self, epoch: int, ahead: bool = True) -> Any:
        """The plain layout of epoch ``epoch``'s document order (opened once, kept while among the ``keep`` most
        recently used). ``ahead``: also prepare epoch ``epoch + 1`` (:meth:`_prepare`, which does it once)."""
        epoch = int(epoch)
        if epoch < 0:
            raise ValueError(f"Got epoch {epoch}, epochs are >= 0")
        with self._lock:
            view = self._views.get(epoch)
            if view is not None:
                self._views.move_to_end(epoch)
        if view is not None:
            if ahead:
                self._prepare(epoch + 1)
            return view
        view = self._open_epoch(epoch)
        if int(view.num_samples) != self.num_samples:  # the order cannot change it (module doc): a damaged view
            raise ValueError(f"epoch {epoch} of the layout has {view.num_samples} samples, epoch 0 {self.num_samples}")
        with self._lock:
            self._views[epoch] = view
            self._views.move_to_end(epoch)
            while len(self._views) > self._keep:
                self._views.popitem(last=False)
        if ahead:
            self._prepare(epoch + 1)
        return view

    def _prepare(self, epoch: int) -> None:
        """Make epoch ``epoch`` ready before it is read, once (here: nothing; a persisted layout builds it). Called at
        every read of the epoch before, so it must be cheap when already done."""

    @property
    def order(self) -> np.ndarray:
        """Epoch 0's document order (O(D): for tests and tools)."""
        return self.epoch_view(0, ahead=False).order

    def locate(self, sample_ids: np.ndarray) -> Spans:
        """The spans of epoch-qualified sample ids ``e * num_samples + c`` (each epoch through its own view)."""
        epochs, within = split_epoch_ids(sample_ids, self.num_samples)
        first = int(epochs.min()) if epochs.size else 0
        if not epochs.size or first == int(epochs.max()):  # the usual case: one epoch
            return self.epoch_view(first).locate(within)
        parts = []
        for e in np.unique(epochs).tolist():
            idx = np.flatnonzero(epochs == e)
            parts.append((idx, self.epoch_view(e).locate(within[idx])))
        return merge_spans(parts, len(within))

    def describe(self) -> dict:
        """Epoch 0's counts (every epoch has the same) and the config, ``epoch_order`` included."""
        return dict(self._described)

    def __repr__(self) -> str:
        return f"EpochOrderedLayout({self.config!r}, num_samples={self.num_samples})"
