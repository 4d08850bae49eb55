"""Pre-tokenized corpora opened as indexes, without copying their tokens: Megatron ``.bin/.idx``, OLMo-core/Dolma
``.npy``, datatrove ``.ds``, nanoGPT ``train.bin``.

A source spec is ``KIND:PATH`` (``megatron:data/corpus_text_document``); :func:`open_source` opens one, taking the EOS,
pad id and vocabulary size from a tokenizer when one is given. The opened :class:`TokenSource` goes wherever a
:class:`~detsampler.index.reader.TokenIndex` does: ``source.layout(config)``, ``PackedDataset(source, layout)``, a
mixture.
"""

from __future__ import annotations

import os
from typing import Any

from detsampler.checks import check_local_path
from detsampler.index.sources.base import EOS_SOURCE_MODES, TokenSource
from detsampler.index.sources.formats import open_datatrove, open_megatron, open_nanogpt, open_olmo
from detsampler.storage import is_remote

__all__ = [
    "EOS_SOURCE_MODES",
    "SOURCE_KINDS",
    "TokenSource",
    "is_source_spec",
    "no_tokenizer",
    "open_source",
    "parse_source_spec",
]

_OPENERS = {"megatron": open_megatron, "olmo": open_olmo, "datatrove": open_datatrove, "nanogpt": open_nanogpt}
SOURCE_KINDS = tuple(_OPENERS)


def parse_source_spec(spec: str) -> tuple[str, str]:
    """``(kind, path)`` of ``KIND:PATH``; a ValueError naming the kinds when ``KIND`` is not one."""
    kind, sep, path = str(spec).partition(":")
    if not sep or kind not in _OPENERS or not path:
        raise ValueError(
            f"expected a pre-tokenized source KIND:PATH with KIND one of {', '.join(SOURCE_KINDS)}, got {spec!r}"
        )
    return kind, path


def is_source_spec(data: str | None) -> bool:
    """Whether ``data`` names a pre-tokenized source (``KIND:PATH``) rather than a text corpus."""
    return isinstance(data, str) and data.partition(":")[0] in _OPENERS and ":" in data


def no_tokenizer(kind: str, path: str | os.PathLike) -> ValueError:
    """The error of a pre-tokenized source given without a tokenizer where ids are printed or written (the CLI, the
    trainer): its EOS and pad ids would be unknown."""
    return ValueError(
        f"the pre-tokenized {kind} files of {str(path)!r} record no tokenizer, so their EOS and pad ids would be "
        "unknown: pass --tokenizer (the one they were tokenized with)"
    )


def _in_object_store(path: str | os.PathLike) -> bool:
    try:
        return is_remote(path)
    except (ValueError, TypeError):
        return False


def open_source(
    kind: str, path: str | os.PathLike, *, tokenizer: Any = None, eos: str = "real", **options: Any
) -> TokenSource:
    """Open the ``kind`` corpus at ``path``. With ``tokenizer``, its EOS id, pad id and vocabulary size (unless given in
    ``options``). ``eos``: ``"real"`` (the stored tokens as they are; each document's last token at its EOS position) or
    ``"virtual"`` (an EOS read after each document)."""
    if kind not in _OPENERS:
        raise ValueError(f"source kind must be one of {', '.join(SOURCE_KINDS)}, got {kind!r}")
    if eos not in EOS_SOURCE_MODES:
        raise ValueError(f"eos must be one of {', '.join(EOS_SOURCE_MODES)}, got {eos!r}")
    if not _in_object_store(path):  # file:// is the local path; a URL of another scheme (hf://, ...) is refused by name
        path = check_local_path(path, f"{kind} source")
    if tokenizer is not None:
        for name in ("eos_id", "pad_id", "vocab_size"):
            options.setdefault(name, getattr(tokenizer, name))
    return _OPENERS[kind](path, eos=eos, **options)
