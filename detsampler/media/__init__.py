"""Media beside tokens: interleaved image-text documents.

The core (numpy only): :mod:`~detsampler.media.counts` (an image's LLM tokens and vision patches from its size and the
processor's config), :mod:`~detsampler.media.packing` and :mod:`~detsampler.media.layout` (packing on two axes).
Reading image headers (Pillow), the sources (datasets tables, webdataset shards on disk or in a bucket), chat data with
image parts (:mod:`~detsampler.media.chat`), building and reading the index and its images' reads for the prefetcher
(:mod:`~detsampler.media.reads`) are imported on first use, so that importing this package imports numpy only.
"""

from __future__ import annotations

from detsampler.media.counts import COUNTS_VERSION, FixedGridCounts, ImageCounts, Qwen2VLCounts, UserCounts
from detsampler.media.layout import MediaLayout, MediaLayoutConfig, make_media_layout
from detsampler.media.packing import MEDIA_PACKING_VERSION, MediaRuns

__all__ = [
    "COUNTS_VERSION",
    "MEDIA_PACKING_VERSION",
    "FixedGridCounts",
    "ImageCounts",
    "MediaLayout",
    "MediaLayoutConfig",
    "MediaRuns",
    "Qwen2VLCounts",
    "UserCounts",
    "make_media_layout",
]
