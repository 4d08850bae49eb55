"""What the commands read: the prepared index (or one per mixture source), their layouts, and the plan over them.

Invariant: every source of a mixture is prepared with the same index options and the same tokenizer (``--tokenizer``, or
else the default one trained on the standard library), and cut by the same layout options.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from detsampler.cli.options import index_config, layout_for, plan_from_args
from detsampler.layout import Layout
from detsampler.mixture import MixtureConfig
from detsampler.plan import Plan

if TYPE_CHECKING:
    from detsampler.index.prepare import Prepared

__all__ = [
    "FilesAudit",
    "mixture_plan",
    "prepare",
    "prepare_sources",
    "quiet_progress",
    "show_progress",
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


@dataclass(frozen=True)
class FilesAudit:
    """What :func:`verify_files` read in full, counted as each check returned: the only thing :meth:`line` reads, so no
    line can name a check that did not run. ``tokens``: stored tokens whose every chunk and file sha256 were checked,
    in ``with_tokens`` indexes (or shards); ``without_tokens``: indexes that store no tokens (their lengths and offsets
    checked); ``unchecked``: pre-tokenized files (they record no checksum); ``media``: media indexes whose images were
    read, ``images`` of ``image_bytes`` bytes in all, each checked against its CRC-32, from ``image_files`` source files
    and ``embedded`` from the index's own ``image_bytes.npy``."""

    tokens: int = 0
    with_tokens: int = 0
    without_tokens: int = 0
    unchecked: int = 0
    media: int = 0
    images: int = 0
    image_bytes: int = 0
    image_files: int = 0
    embedded: int = 0

    def line(self) -> str:
        """One line saying what was verified and what was not."""
        if not self.with_tokens and not self.without_tokens:
            return f"index files: nothing verified: {self.unchecked} pre-tokenized file(s) record no checksum"
        if not self.with_tokens:
            line = (
                "index files: lengths and offsets verified (every chunk checksum and sha256); the index stores no"
                " tokens (--no-store-tokens): the text is tokenized on the fly, no token was checked"
            )
        else:
            line = f"index files: every chunk checksum and sha256 verified ({self.tokens} tokens)"
            if self.without_tokens:
                line += f"; {self.without_tokens} shard(s) store no tokens: their lengths and offsets verified"
        if self.unchecked:
            line += f"; {self.unchecked} pre-tokenized file(s) record no checksum: not verified"
        return line + self._images()

    def _images(self) -> str:
        """What the media audit read (nothing without a media index: no image was checked, none is claimed)."""
        if not self.media:
            return ""
        if not self.images:
            return "; images: none in the index (nothing to check)"
        where = [f"{self.image_files} file{'s' if self.image_files != 1 else ''}"] if self.image_files else []
        where += [f"{self.embedded} from the index's image_bytes.npy"] if self.embedded else []
        return (
            f"; images: every one's bytes checked against its CRC-32 ({self.images:,} images,"
            f" {self.image_bytes:,} bytes, in {' and '.join(where)})"
        )


def verify_files(index: Any) -> FilesAudit:
    """Every chunk checksum and file sha256 of ``index`` (of each tokenized shard of a sharded index; a pre-tokenized
    file records no checksum), on disk or in an object store: a full read. Returns what was checked."""
    from detsampler.cli.options import is_media
    from detsampler.index import TokenIndex

    tokens = with_tokens = without_tokens = unchecked = 0
    media = {"media": 0, "images": 0, "image_bytes": 0, "image_files": 0, "embedded": 0}
    for part in getattr(index, "shards", [index]):
        if is_media(part):  # every file, then every image's bytes: raises on the first that fails
            checked = part.verify_files()
            tokens, with_tokens = tokens + checked.pop("tokens"), with_tokens + 1
            media["media"] += 1
            for key, value in checked.items():
                media[key] += value
            continue
        if not isinstance(part, TokenIndex):
            unchecked += 1
            continue
        checked = TokenIndex.open(part.path, verify_tokens=True)  # raises on the first chunk or sha256 that fails
        if checked.tokens is None:
            without_tokens += 1
        else:
            tokens, with_tokens = tokens + checked.num_tokens, with_tokens + 1
    return FilesAudit(tokens, with_tokens, without_tokens, unchecked, **media)


def prepare(args: argparse.Namespace) -> Prepared:
    """The prepared index of the index options (built once, cached)."""
    from detsampler.index.prepare import prepare_index

    return prepare_index(index_config(args), progress=show_progress())


def prepare_sources(args: argparse.Namespace, config: MixtureConfig) -> list[Prepared]:
    """One prepared index per mixture source, all with the same tokenizer."""
    from detsampler.index.prepare import prepare_sources as prepare_all

    return prepare_all(index_config(args), config.sources, progress=show_progress())


def mixture_plan(
    args: argparse.Namespace, config: MixtureConfig, kind: str | None = None
) -> tuple[list[Prepared], list[Layout], Plan]:
    """(prepared sources, their layouts, the plan over their mixture)."""
    prepared = prepare_sources(args, config)
    layouts = [layout_for(p.index, args, kind) for p in prepared]
    documents = [p.index.num_documents for p in prepared]
    return prepared, layouts, plan_from_args(args, source=config.build(layouts), documents=documents)
