"""Text and tokenizers: the tokenizers an index is built with and the corpora it is built from. Above the core; below
the index.

- :mod:`~detsampler.text.protocol`: :class:`TokenizerLike` (what the index needs of a tokenizer) and the files'
identity;
- :mod:`~detsampler.text.tokenizer`: :class:`Tokenizer` (sentencepiece), and training a small BPE model locally;
- :mod:`~detsampler.text.hf`: :class:`HFTokenizer` (``tokenizer.json``), :class:`TransformersTokenizer` (a local
  ``AutoTokenizer`` directory, optional) and training a small byte-level BPE ``tokenizer.json`` locally;
- :mod:`~detsampler.text.load`: :func:`load_tokenizer` (any of them, from a path);
- :mod:`~detsampler.text.policy`: :class:`SpecialTokens`, the BOS/EOS policy of an index;
- :mod:`~detsampler.text.corpus`: loading local corpora as ``datasets.Dataset``, the default corpus and tokenizer.
"""

from __future__ import annotations

from detsampler.text.load import load_tokenizer
from detsampler.text.policy import SpecialTokens
from detsampler.text.protocol import TokenizerLike
from detsampler.text.tokenizer import Tokenizer

__all__ = ["SpecialTokens", "Tokenizer", "TokenizerLike", "load_tokenizer"]
