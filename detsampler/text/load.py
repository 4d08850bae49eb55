"""Loading any supported tokenizer from a path: a sentencepiece ``.model`` file, a Hugging Face ``tokenizer.json``, or a
local ``transformers`` tokenizer directory.

Invariant: the kind is decided by the path alone (a directory, a ``.json`` file, anything else a sentencepiece model),
so the same path always loads the same kind of tokenizer.
"""

from __future__ import annotations

import os
from pathlib import Path

from detsampler.text.protocol import TokenizerLike

__all__ = ["TOKENIZER_KINDS", "load_tokenizer", "tokenizer_kind"]

TOKENIZER_KINDS = ("sentencepiece", "hf", "transformers")


def tokenizer_kind(path: str | os.PathLike) -> str:
    """``transformers`` for a directory, ``hf`` for a ``.json`` file, else ``sentencepiece``."""
    p = Path(path)
    if p.is_dir():
        return "transformers"
    return "hf" if p.suffix == ".json" else "sentencepiece"


def load_tokenizer(
    path: str | os.PathLike, *, eos_token: str | None = None, bos_token: str | None = None, pad_token: str | None = None
) -> TokenizerLike:
    """The tokenizer at ``path`` (see the module doc for the kinds). The token names apply to a ``tokenizer.json`` only
    (a sentencepiece model and a transformers directory name their own special tokens)."""
    kind = tokenizer_kind(path)
    if kind == "hf":
        from detsampler.text.hf import HFTokenizer

        return HFTokenizer.load(path, eos_token=eos_token, bos_token=bos_token, pad_token=pad_token)
    if kind == "transformers":
        from detsampler.text.hf import TransformersTokenizer

        return TransformersTokenizer.load(path)
    from detsampler.text.tokenizer import Tokenizer

    return Tokenizer.load(path)
