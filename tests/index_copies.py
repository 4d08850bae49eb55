"""A private copy of a session index with chosen layouts persisted beside it, for tests that push or serve an index
(a test must not add layouts to, or upload from, the shared session index)."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

from detsampler.index import TokenIndex
from detsampler.layout import LayoutConfig


def copy_with_layouts(index: TokenIndex, folder: Path, configs: Sequence[LayoutConfig]) -> TokenIndex:
    """``index`` copied into ``folder`` (under its own name, without its layouts and locks), opened, with the layout
    of each of ``configs`` built and persisted there."""
    dest = Path(folder) / index.path.name
    shutil.copytree(index.path, dest, ignore=shutil.ignore_patterns("layouts", "*.lock"))
    copy = TokenIndex.open(dest)
    for config in configs:
        copy.layout(config)
    return copy
