"""detsampler: deterministic, resumable LLM data loading as a pure function of (seed, epoch, step, rank, worker).

The core (permutation, layout, plan, locate) is numpy-only; the torch adapters (``DeterministicBatchSampler``,
``PackedDataset``) are imported lazily so that ``import detsampler`` does not import torch.
"""

from __future__ import annotations

import importlib
from typing import Any

from detsampler.layout import BestFitLayout, ConcatLayout, DocumentLayout, Layout, LayoutConfig, Spans, make_layout
from detsampler.locate import Located, locate
from detsampler.mixture import Mixture, MixtureConfig, MixtureLookup
from detsampler.permutation import Permutation, permute, unpermute
from detsampler.plan import EpochStream, Plan
from detsampler.resume import DataFingerprint, check_resume
from detsampler.version import MAPPING_VERSION, __version__

# Above the core: imported on first use, so that ``import detsampler`` imports neither torch, datasets nor
# sentencepiece.
_LAZY = {
    "DeterministicBatchSampler": "detsampler.loader",
    "MixtureDataset": "detsampler.loader",
    "PackedDataset": "detsampler.loader",
    "TokenIndex": "detsampler.index",
    "build_index": "detsampler.index",
    "Tokenizer": "detsampler.text",
}

__all__ = [
    "MAPPING_VERSION",
    "BestFitLayout",
    "ConcatLayout",
    "DataFingerprint",
    "DocumentLayout",
    "EpochStream",
    "Layout",
    "LayoutConfig",
    "Located",
    "Mixture",
    "MixtureConfig",
    "MixtureLookup",
    "Permutation",
    "Plan",
    "Spans",
    "__version__",
    "check_resume",
    "locate",
    "make_layout",
    "permute",
    "unpermute",
]  # the lazy names (below) are left out so that `from detsampler import *` stays torch-free


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'detsampler' has no attribute {name!r}")
