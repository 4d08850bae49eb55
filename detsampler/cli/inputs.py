"""What the commands read: the prepared index (or one per mixture source), their layouts, and the plan over them.

Invariant: every source of a mixture is prepared with the same index options and the same tokenizer (``--tokenizer``, or
else the default one trained on the standard library), and cut by the same layout options.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from detsampler.cli.options import index_config, layout_config, plan_from_args
from detsampler.layout import Layout
from detsampler.mixture import MixtureConfig
from detsampler.plan import Plan

if TYPE_CHECKING:
    from detsampler.index.prepare import Prepared

__all__ = [
    "mixture_plan",
    "prepare",
    "prepare_sources",
    "quiet_progress",
    "show_progress",
    "verified_line",
    "verify_files",
]

_QUIET = False


def quiet_progress(quiet: bool) -> None:
    """Progress bars (ours, and Hugging Face's "Generating train split") only on a terminal and without ``--quiet``:
    a log file gets none of their carriage-return lines."""
    global _QUIET
    _QUIET = quiet or not sys.stderr.isatty()
    if _QUIET:
        import os

        os.environ["HF_DATASETS_DISABLE_PROGRESS_BARS"] = "1"  # read when datasets is imported
        if "datasets" in sys.modules:
            sys.modules["datasets"].disable_progress_bars()


def show_progress() -> bool:
    """Whether to draw progress bars (see :func:`quiet_progress`)."""
    return not _QUIET and sys.stderr.isatty()


def verify_files(index: Any) -> None:
    """Every chunk checksum and file sha256 of ``index`` (of each tokenized shard of a sharded index; a pre-tokenized
    file records no checksum): a full read."""
    from detsampler.index import TokenIndex

    for part in getattr(index, "shards", [index]):
        if isinstance(part, TokenIndex):
            TokenIndex.open(part.path, verify_tokens=True)


def verified_line(index: Any) -> str:
    """What :func:`verify_files` checked of ``index``, as one line (pre-tokenized files are named as not checked, and an
    index that stores no tokens as having none to check)."""
    from detsampler.index import TokenIndex

    parts = getattr(index, "shards", [index])
    checked = [part for part in parts if isinstance(part, TokenIndex)]
    stored = [part for part in checked if part.tokens is not None]
    if checked and not stored:
        line = (
            "index files: lengths and offsets verified (every chunk checksum and sha256); the index stores no tokens"
            " (--no-store-tokens): the text is tokenized on the fly, no token was checked"
        )
    else:
        line = f"index files: every chunk checksum and sha256 verified ({sum(p.num_tokens for p in stored)} tokens)"
        if len(stored) < len(checked):
            line += f"; {len(checked) - len(stored)} shard(s) store no tokens: their lengths and offsets verified"
    if len(checked) < len(parts):
        line += f"; {len(parts) - len(checked)} pre-tokenized file(s) record no checksum: not verified"
    return line


def prepare(args: argparse.Namespace, verify_tokens: bool = False) -> Prepared:
    """The prepared index of the index options (built once, cached); with ``verify_tokens``, its
    token sha256 checked."""
    from detsampler.index.prepare import prepare_index

    prepared = prepare_index(index_config(args), progress=show_progress())
    # a pre-tokenized source has no recorded token checksum
    if (verify_tokens and prepared.dataset is not None) or (verify_tokens and hasattr(prepared.index, "shards")):
        verify_files(prepared.index)
    return prepared


def prepare_sources(args: argparse.Namespace, config: MixtureConfig) -> list[Prepared]:
    """One prepared index per mixture source, all with the same tokenizer."""
    from detsampler.index.prepare import prepare_sources as prepare_all

    return prepare_all(index_config(args), config.sources, progress=show_progress())


def mixture_plan(
    args: argparse.Namespace, config: MixtureConfig, kind: str | None = None
) -> tuple[list[Prepared], list[Layout], Plan]:
    """(prepared sources, their layouts, the plan over their mixture)."""
    prepared = prepare_sources(args, config)
    layouts = [p.index.layout(layout_config(args, kind)) for p in prepared]
    return prepared, layouts, plan_from_args(args, source=config.build(layouts))
