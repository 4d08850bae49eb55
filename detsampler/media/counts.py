"""How many LLM tokens and vision patches an image costs: a small, versioned, pure function of (width, height) and the
processor's config (numpy only).

An image's cost is fixed by its size *after EXIF orientation* and the image processor's settings, so it is known at
build time from the file header alone, and the layout can pack exactly. Each family below computes it from the same
config values as its transformers processor (the one place that knows how pixels become patches); the loader checks,
sample by sample, that the processor's actual output has the planned count (:mod:`detsampler.loader.vlm`).

- :class:`Qwen2VLCounts` (Qwen2-VL, Qwen2.5-VL): dynamic resolution. The image is resized to ``smart_resize``'s
  ``(h, w)`` (multiples of ``patch_size * merge_size``, pixels within ``[min_pixels, max_pixels]``); it is
  ``(h / patch_size) * (w / patch_size)`` vision patches and ``patches / merge_size**2`` LLM tokens.
- :class:`FixedGridCounts` (LLaVA-style): every image is resized (and cropped) to one size: a fixed count.
- :class:`UserCounts`: a function the user supplies, named and versioned by the user.

Invariant: ``identity()`` is a JSON-able dict of the family, its version (:data:`COUNTS_VERSION` per family, ticked
whenever a family's arithmetic changes) and every config value the count reads; it joins the index's cache key and the
layout's ``describe()``, hence the data fingerprint, so a resume under another processor config is refused.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from detsampler.checks import check_int

__all__ = [
    "COUNTS_VERSION",
    "FAMILIES",
    "FixedGridCounts",
    "ImageCounts",
    "ImageTokenCounts",
    "Qwen2VLCounts",
    "UserCounts",
    "counts_from_identity",
]

# per family: 1 for each, as first released (tick a family's entry when its arithmetic changes)
COUNTS_VERSION: dict[str, int] = {"qwen2_vl": 1, "fixed_grid": 1, "user": 1}
MAX_SIDE = 1 << 20  # pixels per side beyond any real image: keeps every product below 2**53 (exact in float64)


@dataclass(frozen=True)
class ImageCounts:
    """Per image: ``tokens`` (LLM tokens its placeholder expands to) and ``patches`` (rows of the vision encoder's
    input), int64 arrays of one length; ``grid`` (int64 ``[n, 3]``: the processor's ``(t, h, w)`` patch grid) where the
    family has one, else None."""

    tokens: np.ndarray
    patches: np.ndarray
    grid: np.ndarray | None = None


class ImageTokenCounts(Protocol):
    """What the index build, the layout and the loader read of a count function."""

    family: str

    def count(self, widths: Any, heights: Any, names: Any = None) -> ImageCounts:
        """The cost of images of ``widths`` x ``heights`` pixels (after EXIF orientation); an image the processor
        would refuse is a ValueError naming ``names[i]`` (default ``image i``)."""

    def identity(self) -> dict:
        """Family, version and every config value read (JSON-able)."""


def _sizes(widths: Any, heights: Any, names: Any) -> tuple[np.ndarray, np.ndarray]:
    """``widths`` and ``heights`` as int64 arrays of one length, each in ``[1, MAX_SIDE]``, else a ValueError naming
    the image."""
    w = np.atleast_1d(np.asarray(widths))
    h = np.atleast_1d(np.asarray(heights))
    if w.shape != h.shape or w.ndim != 1:
        raise ValueError(f"widths and heights must be 1-D of one length, got shapes {w.shape} and {h.shape}")
    if w.size and (w.dtype.kind not in "iu" or h.dtype.kind not in "iu"):
        raise ValueError(f"widths and heights must be integers, got dtypes {w.dtype} and {h.dtype}")
    w, h = w.astype(np.int64), h.astype(np.int64)
    bad = np.flatnonzero((w < 1) | (h < 1) | (w > MAX_SIDE) | (h > MAX_SIDE))
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"{_name(names, i)}: size {w[i]}x{h[i]} pixels; each side must be in [1, {MAX_SIDE}]")
    return w, h


def _name(names: Any, i: int) -> str:
    return f"image {i}" if names is None else str(names[i])


@dataclass(frozen=True, kw_only=True)
class Qwen2VLCounts:
    """Qwen2-VL / Qwen2.5-VL dynamic resolution, from the image processor's config values (transformers'
    ``Qwen2VLImageProcessor``: ``size={"shortest_edge": min_pixels, "longest_edge": max_pixels}``, ``patch_size``,
    ``merge_size``, ``temporal_patch_size``; the defaults are that class's).

    ``smart_resize(h, w)`` with ``factor = patch_size * merge_size``, element by element as transformers computes it in
    float64: ``round`` half to even, then ``floor``/``ceil`` scaling into ``[min_pixels, max_pixels]``; an aspect ratio
    above 200 is refused, as the processor refuses it."""

    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280
    patch_size: int = 14
    merge_size: int = 2
    temporal_patch_size: int = 2
    family: str = field(default="qwen2_vl", init=False)

    def __post_init__(self) -> None:
        for name in ("min_pixels", "max_pixels", "patch_size", "merge_size", "temporal_patch_size"):
            check_int(getattr(self, name), f"Qwen2VLCounts.{name}", minimum=1)
        if self.min_pixels > self.max_pixels:
            raise ValueError(
                f"Qwen2VLCounts: min_pixels {self.min_pixels} is above max_pixels {self.max_pixels}; min <= max"
            )

    @classmethod
    def from_processor_config(cls, config: Mapping[str, Any]) -> Qwen2VLCounts:
        """From a ``preprocessor_config.json``'s values (``min_pixels``/``max_pixels`` or ``size``'s
        ``shortest_edge``/``longest_edge``; ``patch_size``, ``merge_size``, ``temporal_patch_size``)."""
        size = config.get("size") or {}
        values = {
            "min_pixels": config.get("min_pixels", size.get("shortest_edge")),
            "max_pixels": config.get("max_pixels", size.get("longest_edge")),
            "patch_size": config.get("patch_size"),
            "merge_size": config.get("merge_size"),
            "temporal_patch_size": config.get("temporal_patch_size"),
        }
        return cls(**{k: v for k, v in values.items() if v is not None})

    def processor_kwargs(self) -> dict:
        """The keyword arguments that make transformers' processor with exactly these values."""
        return {
            "size": {"shortest_edge": self.min_pixels, "longest_edge": self.max_pixels},
            "patch_size": self.patch_size,
            "merge_size": self.merge_size,
            "temporal_patch_size": self.temporal_patch_size,
        }

    def resized(self, widths: Any, heights: Any, names: Any = None) -> tuple[np.ndarray, np.ndarray]:
        """``smart_resize``'s ``(resized_heights, resized_widths)``, vectorized (see the class doc)."""
        w, h = _sizes(widths, heights, names)
        ratio = np.maximum(h, w) / np.minimum(h, w)
        bad = np.flatnonzero(ratio > 200)
        if bad.size:
            i = int(bad[0])
            raise ValueError(
                f"{_name(names, i)}: size {w[i]}x{h[i]} pixels, aspect ratio {ratio[i]:.1f}; the Qwen2-VL processor"
                " allows at most 200"
            )
        factor = self.patch_size * self.merge_size
        h_bar = np.round(h / factor).astype(np.int64) * factor
        w_bar = np.round(w / factor).astype(np.int64) * factor
        big = h_bar * w_bar > self.max_pixels
        small = ~big & (h_bar * w_bar < self.min_pixels)
        if big.any():
            beta = np.sqrt((h[big] * w[big]) / self.max_pixels)
            h_bar[big] = np.maximum(factor, np.floor(h[big] / beta / factor).astype(np.int64) * factor)
            w_bar[big] = np.maximum(factor, np.floor(w[big] / beta / factor).astype(np.int64) * factor)
        if small.any():
            beta = np.sqrt(self.min_pixels / (h[small] * w[small]))
            h_bar[small] = np.ceil(h[small] * beta / factor).astype(np.int64) * factor
            w_bar[small] = np.ceil(w[small] * beta / factor).astype(np.int64) * factor
        return h_bar, w_bar

    def count(self, widths: Any, heights: Any, names: Any = None) -> ImageCounts:
        h_bar, w_bar = self.resized(widths, heights, names)
        grid = np.stack([np.ones_like(h_bar), h_bar // self.patch_size, w_bar // self.patch_size], axis=1)
        patches = grid[:, 1] * grid[:, 2]
        return ImageCounts(patches // (self.merge_size**2), patches, grid)

    def identity(self) -> dict:
        return {
            "family": self.family,
            "version": COUNTS_VERSION[self.family],
            "min_pixels": self.min_pixels,
            "max_pixels": self.max_pixels,
            "patch_size": self.patch_size,
            "merge_size": self.merge_size,
            "temporal_patch_size": self.temporal_patch_size,
        }


@dataclass(frozen=True, kw_only=True)
class FixedGridCounts:
    """LLaVA-style: every image is resized (and center-cropped) to ``height`` x ``width`` and cut into patches of
    ``patch_size``; ``num_additional_image_tokens`` (LLaVA's CLS: 1) join the encoder's output, and the
    ``"default"`` feature-select strategy drops the CLS from what the LLM sees (transformers' ``LlavaProcessor``).
    So ``patches = (height // patch_size) * (width // patch_size) + num_additional_image_tokens`` and ``tokens =
    patches - (strategy == "default")``, whatever the image's size."""

    height: int = 336
    width: int = 336
    patch_size: int = 14
    num_additional_image_tokens: int = 0
    vision_feature_select_strategy: str = "full"
    family: str = field(default="fixed_grid", init=False)

    def __post_init__(self) -> None:
        for name in ("height", "width", "patch_size"):
            check_int(getattr(self, name), f"FixedGridCounts.{name}", minimum=1)
        check_int(self.num_additional_image_tokens, "FixedGridCounts.num_additional_image_tokens", minimum=0)
        if self.vision_feature_select_strategy not in ("default", "full"):
            raise ValueError(
                "FixedGridCounts.vision_feature_select_strategy must be 'default' or 'full', got"
                f" {self.vision_feature_select_strategy!r}"
            )
        if self.tokens_per_image < 1:
            raise ValueError(f"FixedGridCounts: {self} gives {self.tokens_per_image} tokens per image; at least 1")

    @property
    def tokens_per_image(self) -> int:
        return self.patches_per_image - int(self.vision_feature_select_strategy == "default")

    @property
    def patches_per_image(self) -> int:
        grid = (self.height // self.patch_size) * (self.width // self.patch_size)
        return grid + self.num_additional_image_tokens

    def count(self, widths: Any, heights: Any, names: Any = None) -> ImageCounts:
        w, _ = _sizes(widths, heights, names)
        n = len(w)
        return ImageCounts(np.full(n, self.tokens_per_image, np.int64), np.full(n, self.patches_per_image, np.int64))

    def identity(self) -> dict:
        return {
            "family": self.family,
            "version": COUNTS_VERSION[self.family],
            "height": self.height,
            "width": self.width,
            "patch_size": self.patch_size,
            "num_additional_image_tokens": self.num_additional_image_tokens,
            "vision_feature_select_strategy": self.vision_feature_select_strategy,
        }


@dataclass(frozen=True, kw_only=True)
class UserCounts:
    """A count function the user supplies: ``function(widths, heights) -> (tokens, patches)`` (int64 arrays of the
    images' length, each >= 1 token and >= 0 patches), named ``name`` and versioned ``version``: tick the version
    whenever the function changes, since the function itself cannot be fingerprinted. ``params``: JSON-able values
    that join its identity (e.g. the processor config it mirrors)."""

    name: str
    version: int
    function: Callable[[np.ndarray, np.ndarray], tuple[Any, Any]] = field(repr=False, compare=False)
    params: Mapping[str, Any] = field(default_factory=dict)
    family: str = field(default="user", init=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"UserCounts.name must be a non-empty string, got {self.name!r}")
        check_int(self.version, "UserCounts.version", minimum=0)
        if not callable(self.function):
            raise ValueError(f"UserCounts.function must be callable, got {type(self.function).__name__}")
        if not isinstance(self.params, Mapping):
            raise ValueError(f"UserCounts.params must be a mapping, got {type(self.params).__name__}")

    def count(self, widths: Any, heights: Any, names: Any = None) -> ImageCounts:
        w, h = _sizes(widths, heights, names)
        tokens, patches = (np.atleast_1d(np.asarray(x)) for x in self.function(w, h))
        for what, arr, least in (("tokens", tokens, 1), ("patches", patches, 0)):
            if arr.shape != w.shape or arr.dtype.kind not in "iu":
                raise ValueError(
                    f"UserCounts {self.name!r}: the function returned {what} of shape {arr.shape} and dtype"
                    f" {arr.dtype}; integers of shape {w.shape} expected"
                )
            low = np.flatnonzero(arr < least)
            if low.size:
                i = int(low[0])
                raise ValueError(
                    f"UserCounts {self.name!r}: {_name(names, i)} ({w[i]}x{h[i]}) gets {int(arr[i])} {what}; at least"
                    f" {least}"
                )
        return ImageCounts(tokens.astype(np.int64), patches.astype(np.int64))

    def identity(self) -> dict:
        return {
            "family": self.family,
            "version": COUNTS_VERSION[self.family],
            "name": self.name,
            "user_version": self.version,
            "params": dict(self.params),
        }


FAMILIES = ("qwen2_vl", "fixed_grid", "user")


def counts_from_identity(identity: Mapping[str, Any]) -> ImageTokenCounts:
    """The count function an ``identity()`` records (``qwen2_vl``, ``fixed_grid``); a ``user`` one cannot be rebuilt
    from its record (pass the :class:`UserCounts` again), and a record of another version is refused."""
    family = identity.get("family") if isinstance(identity, Mapping) else None
    if family not in FAMILIES:
        raise ValueError(f"a count function's identity names family {family!r}; allowed families are {FAMILIES}")
    if identity.get("version") != COUNTS_VERSION[family]:
        raise ValueError(
            f"the {family} count function of version {identity.get('version')!r} is recorded; this detsampler computes"
            f" version {COUNTS_VERSION[family]}: rebuild the index"
        )
    if family == "user":
        raise ValueError(
            f"the index counts image tokens with the user function {identity.get('name')!r} (version"
            f" {identity.get('user_version')}): pass that UserCounts again"
        )
    values = {k: v for k, v in identity.items() if k not in ("family", "version")}
    return Qwen2VLCounts(**values) if family == "qwen2_vl" else FixedGridCounts(**values)
