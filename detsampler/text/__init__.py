"""Text and tokenizers: the tokenizer (sentencepiece) and the corpora an index is built from (local files, the default
corpus of the interpreter's own standard library sources). Above the core; below the index.

- :mod:`~detsampler.text.tokenizer`: :class:`Tokenizer`, and training a small BPE model locally;
- :mod:`~detsampler.text.corpus`: loading local corpora as ``datasets.Dataset``, the default corpus and tokenizer.
"""

from __future__ import annotations

from detsampler.text.tokenizer import Tokenizer

__all__ = ["Tokenizer"]
