"""The BOS/EOS policy of an index: which special tokens each document gets, and whether its EOS is stored.

Invariant: with a policy, document ``d`` reads exactly ``[bos] * add_bos + tokenizer(text) + [eos]``
(``tokenizer(text)`` with no special token of its own). ``lengths[d]`` (what layouts cut) counts the tokens before the
EOS position, BOS included; the EOS is at position ``lengths[d]``: *virtual* (never stored, ``eos_id`` supplied on read;
the default) or *real* (stored as the document's last token, so a stored document holds ``lengths[d] + 1`` tokens).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any

import numpy as np

__all__ = ["EOS_MODES", "SpecialTokens"]

EOS_MODES = ("virtual", "real")


@dataclass(frozen=True, kw_only=True)
class SpecialTokens:
    """``add_bos``: store the tokenizer's BOS before each document. ``add_eos``: ``"virtual"`` (the EOS is read as
    ``eos_id`` after each document, nothing stored) or ``"real"`` (the EOS is stored after each document)."""

    add_bos: bool = False
    add_eos: str = "virtual"

    def __post_init__(self) -> None:
        if not isinstance(self.add_bos, bool):
            raise ValueError(f"add_bos must be a bool, got {self.add_bos!r}")
        if self.add_eos not in EOS_MODES:
            raise ValueError(f"add_eos must be one of {', '.join(EOS_MODES)}, got {self.add_eos!r}")

    @property
    def eos_stored(self) -> bool:
        return self.add_eos == "real"

    def check(self, tokenizer: Any) -> None:
        """Raise a ValueError when ``add_bos`` is asked of a tokenizer without a BOS token."""
        if self.add_bos and getattr(tokenizer, "bos_id", None) is None:
            raise ValueError(f"add_bos=True but the tokenizer {getattr(tokenizer, 'path', '?')!r} has no BOS token")

    def to_meta(self) -> dict:
        return {"add_bos": self.add_bos, "add_eos": self.add_eos}

    @classmethod
    def from_meta(cls, meta: dict | None) -> SpecialTokens:
        """The policy an index's meta records (an index without one has the default policy)."""
        meta = meta or {}
        return cls(add_bos=bool(meta.get("add_bos", False)), add_eos=str(meta.get("add_eos", "virtual")))

    def apply(
        self, ids: Sequence[Sequence[int]], bos_id: int | None, eos_id: int, dtype: np.dtype | type = np.int64
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(lengths, stored)`` of documents encoded as ``ids`` (no specials): ``lengths`` (int64) per the module
        doc, and the stored tokens of all documents concatenated (``dtype``). Vectorized: one pass per array, none
        per token."""
        counts = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
        content = np.fromiter(chain.from_iterable(ids), dtype=dtype, count=int(counts.sum()))
        b, r = int(self.add_bos), int(self.eos_stored)
        lengths = counts + b
        if not b and not r:
            return lengths, content
        stored = lengths + r
        starts = np.zeros(len(ids) + 1, dtype=np.int64)
        np.cumsum(stored, out=starts[1:])
        out = np.empty(int(starts[-1]), dtype=dtype)
        content_starts = np.zeros(len(ids), dtype=np.int64)
        np.cumsum(counts[:-1], out=content_starts[1:])
        out[np.arange(content.size, dtype=np.int64) + np.repeat(starts[:-1] + b - content_starts, counts)] = content
        if b:
            out[starts[:-1]] = bos_id
        if r:
            out[starts[1:] - 1] = eos_id
        return lengths, out
