"""The layout of an interleaved image-text corpus: documents packed exactly on two axes (numpy only).

A document's positions are its tokens with every image's placeholder expanded to the image's exact token count (known
at build from its header: :mod:`detsampler.media.counts`), then its EOS. :class:`MediaLayout` visits the documents in
the seeded order of every layout (:func:`detsampler.layout.document_order`), groups them in windows of ``window_docs``
and packs each window on two axes (:mod:`detsampler.media.packing`): at most ``seq_len`` positions and
``max_patches`` vision patches per sample, no image ever split. A sample is a bin; its spans are ``(doc, start,
stop)`` as for every layout, so the plan, ``locate``, the gather and the audits read it unchanged, and
:meth:`MediaLayout.sample_images` says which images each sample holds.

Invariant: every kept document's positions lie in exactly one sample per epoch, each image whole in one sample
(tests/test_media_packing.py); ``describe()`` holds the count function's identity and the packing's settings and
version, so a resume under another processor config or cap is refused.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any

import numpy as np

from detsampler.layout import LayoutConfig, _check_lengths, _check_sample_ids, config_record, document_order
from detsampler.media.packing import MEDIA_PACKING_VERSION, OVERLONG_MEDIA, MediaRuns, cut_pieces, pack_pieces
from detsampler.ranges import concat_ranges
from detsampler.spans import Spans

__all__ = ["MediaLayout", "MediaLayoutConfig", "MediaRuns", "make_media_layout"]


@dataclass(frozen=True, kw_only=True)
class MediaLayoutConfig:
    """How to pack an interleaved image-text corpus: ``seq_len`` LLM positions (text and image tokens) and at most
    ``max_patches`` vision patches per sample; documents in windows of ``window_docs`` in the order keyed by ``seed``;
    a document over either bound is cut between images (``overlong="split"``) or left out (``"drop"``)."""

    seq_len: int = 8192
    max_patches: int = 16384
    seed: int = 0
    window_docs: int = 1024
    overlong: str = "split"

    def __post_init__(self) -> None:
        for name, least in (("seq_len", 2), ("max_patches", 1), ("window_docs", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
                raise ValueError(f"MediaLayoutConfig.{name} must be an integer >= {least}, got {value!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, numbers.Integral):
            raise ValueError(f"MediaLayoutConfig.seed must be an integer, got {self.seed!r}")
        if self.overlong not in OVERLONG_MEDIA:
            raise ValueError(f"MediaLayoutConfig.overlong must be one of {OVERLONG_MEDIA}, got {self.overlong!r}")

    @property
    def layout_config(self) -> LayoutConfig:
        """The :class:`~detsampler.layout.LayoutConfig` the plan and the tools read (a best-fit layout's fields)."""
        return LayoutConfig(kind="bestfit", seq_len=self.seq_len, seed=self.seed, window_docs=self.window_docs)

    def record(self) -> dict:
        """The packing's part of the layout's identity."""
        return {"max_patches": self.max_patches, "overlong": self.overlong, "packing_version": MEDIA_PACKING_VERSION}


class MediaLayout:
    """Samples of an interleaved corpus packed on two axes (see the module doc), computed in RAM when made.

    ``lengths``: positions of each document before its EOS, image tokens expanded; ``runs``: its images
    (:class:`~detsampler.media.packing.MediaRuns`); ``counts``: the count function's ``identity()``."""

    labels_cross_documents = False
    # NOTE: the index's fingerprint when made by MediaIndex.layout; present (None otherwise) so that PackedDataset
    # pickles this layout itself to its workers, never a best-fit layout remade from the LayoutConfig it exposes
    index_fingerprint: str | None = None

    def __init__(self, config: MediaLayoutConfig, lengths: Any, runs: MediaRuns, counts: dict) -> None:
        if not isinstance(config, MediaLayoutConfig):
            raise TypeError(f"config must be a MediaLayoutConfig, got {type(config).__name__}")
        self.media_config, self.config = config, config.layout_config
        self.lengths = _check_lengths(lengths)
        runs.check(self.lengths)
        self.runs, self.counts = runs, dict(counts)
        self.num_documents = len(self.lengths)
        self.num_tokens = int(self.lengths.sum()) + self.num_documents
        self._order = document_order(self.num_documents, config.seed)
        self.num_windows = -(-self.num_documents // config.window_docs)
        self._pack()
        self._positions = np.cumsum(self.lengths + 1) - (self.lengths + 1)  # where each document starts, globally
        doc_of_image = np.repeat(np.arange(self.num_documents), np.diff(runs.doc_offsets))
        self._image_keys = self._positions[doc_of_image] + np.asarray(runs.starts, np.int64)

    def _pack(self) -> None:
        cfg = self.media_config
        pieces = cut_pieces(
            self._order, self.lengths[self._order] + 1, self.runs, cfg.seq_len, cfg.max_patches, cfg.overlong
        )
        self.dropped_documents = np.sort(pieces.dropped)
        position = np.empty(self.num_documents, np.int64)
        position[self._order] = np.arange(self.num_documents)
        window = position[pieces.docs] // cfg.window_docs
        packed = pack_pieces(
            window, pieces.stops - pieces.starts, pieces.patches, self.num_windows, cfg.seq_len, cfg.max_patches
        )
        if not len(packed.items_per_bin):
            raise ValueError(
                f"no sample: every document is over seq_len={cfg.seq_len} or max_patches={cfg.max_patches} and"
                " overlong='drop' leaves them all out"
            )
        self.bins_per_window = packed.bins_per_window
        self.window_bins = np.concatenate([[0], np.cumsum(packed.bins_per_window)]).astype(np.int64)
        self.bin_items = np.concatenate([[0], np.cumsum(packed.items_per_bin)]).astype(np.int64)
        self._position = position
        take = packed.item_pieces
        self.item_docs, self.item_starts = pieces.docs[take], pieces.starts[take]
        self.item_stops, self.item_patches = pieces.stops[take], pieces.patches[take]
        self.num_samples = len(self.bin_items) - 1

    @property
    def sample_len(self) -> int:
        return self.config.seq_len

    @property
    def tokens_per_epoch(self) -> int:
        """Positions one epoch serves (padding not counted; dropped documents not counted)."""
        return int((self.item_stops - self.item_starts).sum())

    @property
    def patches_per_epoch(self) -> int:
        return int(self.item_patches.sum())

    def locate(self, sample_ids: Any) -> Spans:
        ids = _check_sample_ids(sample_ids, self.num_samples)
        first = self.bin_items[ids]
        items, offsets = concat_ranges(first, self.bin_items[ids + 1] - first)
        return Spans(offsets, self.item_docs[items], self.item_starts[items], self.item_stops[items])

    def document_samples(self, doc: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``(sample_ids, starts, stops, offsets)``: the samples holding document ``doc`` (in sample order), its
        positions ``[starts[i], stops[i])`` in each and where they begin in the sample's row; read from its window's
        bins only (what :func:`detsampler.where.document_samples` answers for this layout)."""
        if isinstance(doc, bool) or not isinstance(doc, (int, np.integer)) or not 0 <= doc < self.num_documents:
            raise ValueError(f"Got document {doc!r}, allowed documents are in [0, {self.num_documents})")
        window = int(self._position[int(doc)]) // self.media_config.window_docs
        b0, b1 = int(self.window_bins[window]), int(self.window_bins[window + 1])
        i0, i1 = int(self.bin_items[b0]), int(self.bin_items[b1])
        sizes = self.item_stops[i0:i1] - self.item_starts[i0:i1]
        items = np.flatnonzero(self.item_docs[i0:i1] == doc)
        bins = np.searchsorted(self.bin_items, items + i0, side="right") - 1
        before = np.concatenate([[0], np.cumsum(sizes)])
        offsets = before[items] - before[self.bin_items[bins] - i0]
        return bins, self.item_starts[i0 + items], self.item_stops[i0 + items], offsets

    def sample_images(self, sample_ids: Any) -> tuple[np.ndarray, np.ndarray]:
        """``(offsets, images)``: sample ``i`` (of ``sample_ids``) holds images ``images[offsets[i]:offsets[i+1]]``
        (indices into the runs: the index's media records), in the order its spans hold them."""
        spans = self.locate(sample_ids)
        base = self._positions[spans.doc_ids]
        lo = np.searchsorted(self._image_keys, base + spans.starts, side="left")
        hi = np.searchsorted(self._image_keys, base + spans.stops, side="left")
        images, span_offsets = concat_ranges(lo, hi - lo)
        return span_offsets[spans.offsets], images

    def describe(self) -> dict:
        served = self.tokens_per_epoch
        dropped = self.dropped_documents
        return {
            **config_record(self.config),
            "media": {**self.media_config.record(), "counts": self.counts},
            "num_documents": self.num_documents,
            "num_tokens": self.num_tokens,
            "num_samples": self.num_samples,
            "num_windows": self.num_windows,
            "num_images": int(self.runs.doc_offsets[-1]),
            "padding_fraction": 1.0 - served / (self.num_samples * self.config.seq_len),
            "llm_fill": served / (self.num_samples * self.config.seq_len),
            "vision_fill": self.patches_per_epoch / (self.num_samples * self.media_config.max_patches),
            "dropped_documents": len(dropped),
            "dropped_tokens": int((self.lengths[dropped] + 1).sum()),
        }


def make_media_layout(config: MediaLayoutConfig, lengths: Any, runs: MediaRuns, counts: dict) -> MediaLayout:
    """The :class:`MediaLayout` of ``config`` over documents of ``lengths`` positions (EOS not counted) whose images
    are ``runs``, counted by the function of identity ``counts``."""
    return MediaLayout(config, lengths, runs, counts)
