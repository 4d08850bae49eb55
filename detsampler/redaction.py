"""Redaction that moves nothing else: a blocklist of documents whose tokens leave the loss from a training step on.

A :class:`Redaction` names documents (ids of the index) and the training step ``from_step`` from which they are
redacted. ``Plan(..., redactions=[...])`` holds the blocklist over time (entries sorted by ``from_step``, one entry per
step, each document in one entry at most). A redaction changes no sample id, no position, no input token: every step
reads exactly the samples it read before. What it changes is the labels: at training step ``t``, every label at a
position whose input token belongs to a document redacted at ``t`` (``from_step <= t``) is ``-100``
(:func:`redaction_mask`; the torch form is :func:`detsampler.loader.redact.redact_labels`). docs/design.md §5 argues
masking over padding.

Invariant (tests/test_redaction.py): with and without the redactions, every step's ``input_ids``, ``position_ids``
and ``document_ids`` are equal, and the labels differ exactly at the positions :func:`detsampler.where.where` gives for
the redacted documents at steps ``>= from_step`` (where the label was not already ``-100``).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from detsampler.checks import check_int, is_int

__all__ = [
    "Blocklist",
    "Redaction",
    "content_hash",
    "documents_by_content_hash",
    "documents_by_path",
    "normalize_redactions",
    "redacted_at",
    "redaction_mask",
]


@dataclass(frozen=True)
class Redaction:
    """Documents ``documents`` (ids in the index, ints >= 0) redacted from training step ``from_step`` on.

    ``documents`` is kept sorted without duplicates (a tuple of ``int``); an empty list is refused."""

    documents: tuple[int, ...]
    from_step: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "from_step", check_int(self.from_step, "Redaction.from_step", minimum=0))
        docs = self.documents
        if isinstance(docs, (str, bytes)) or not isinstance(docs, (Sequence, np.ndarray)):
            raise ValueError(f"Redaction.documents must be a list of document ids, got {docs!r}")
        out = []
        for d in list(docs):
            if not is_int(d) or d < 0:
                raise ValueError(f"Redaction.documents must hold document ids (integers >= 0), got {d!r}")
            out.append(int(d))
        if not out:
            raise ValueError(f"Redaction(from_step={self.from_step}) names no document")
        dupes = sorted({d for d in out if out.count(d) > 1})
        if dupes:
            raise ValueError(f"Redaction(from_step={self.from_step}) names documents {dupes} more than once")
        object.__setattr__(self, "documents", tuple(sorted(out)))

    def to_list(self) -> list:
        """The fingerprint form ``[from_step, [documents...]]``."""
        return [self.from_step, list(self.documents)]

    @classmethod
    def from_any(cls, value: Any) -> Redaction:
        """A Redaction from itself, its :meth:`to_list` form or a dict ``{"documents": [...], "from_step": s}``."""
        if isinstance(value, Redaction):
            return value
        if isinstance(value, dict):
            unknown = sorted(set(value) - {"documents", "from_step"})
            if unknown or not {"documents", "from_step"} <= set(value):
                raise ValueError(f"a redaction is {{documents = [...], from_step = s}}, got keys {sorted(value)}")
            return cls(value["documents"], value["from_step"])
        if isinstance(value, (list, tuple)) and len(value) == 2:
            return cls(value[1], value[0])
        raise ValueError(f"a redaction is Redaction(documents, from_step) or [from_step, [documents]], got {value!r}")


def normalize_redactions(redactions: Any) -> tuple[Redaction, ...]:
    """The redactions sorted by ``from_step``; refused: two entries at one step, a document in two entries."""
    if redactions is None:
        return ()
    if isinstance(redactions, (str, bytes, dict)) or not isinstance(redactions, Sequence):
        raise ValueError(f"redactions must be a list of Redaction, got {redactions!r}")
    out = sorted((Redaction.from_any(r) for r in redactions), key=lambda r: r.from_step)
    for a, b in zip(out, out[1:]):
        if a.from_step == b.from_step:
            raise ValueError(f"two redactions from step {a.from_step}: give each step once (merge their documents)")
    seen: dict[int, int] = {}
    for r in out:
        for d in r.documents:
            if d in seen:
                raise ValueError(
                    f"document {d} is redacted from step {seen[d]} and again from step {r.from_step}: name it once"
                )
            seen[d] = r.from_step
    return tuple(out)


TABLE_LIMIT = 1 << 24  # the largest redacted id a lookup table serves (16 MiB of bools); beyond, np.isin


class Blocklist:
    """The redactions prepared for the training loop: per change step, the sorted int64 ids then in force, built once,
    so that :meth:`at` costs a binary search over the entries, whatever the number of documents. :meth:`mask` marks a
    batch's redacted positions through a bool lookup table of the ids in force (one table, for the last change step
    asked: its memory is the largest redacted id + 2 bytes, at most ``TABLE_LIMIT``; beyond it ``np.isin``)."""

    def __init__(self, redactions: Any) -> None:
        self.redactions = normalize_redactions(list(redactions or ()))
        self._steps = np.array([r.from_step for r in self.redactions], dtype=np.int64)
        self._ids = [np.zeros(0, dtype=np.int64)]
        for r in self.redactions:
            self._ids.append(np.union1d(self._ids[-1], np.array(r.documents, dtype=np.int64)))
        self._table: tuple[int, np.ndarray | None] = (-1, None)

    def _entry(self, step: int) -> int:
        step = check_int(step, "step", minimum=0)
        return int(np.searchsorted(self._steps, step, side="right"))

    def at(self, step: int) -> np.ndarray:
        """The sorted int64 ids of the documents redacted at training step ``step``."""
        return self._ids[self._entry(step)]

    def mask(self, document_ids: np.ndarray, step: int) -> np.ndarray:
        """Bool, shaped like ``document_ids``: True where the id is redacted at ``step`` (padding, -1, never); exactly
        ``np.isin(document_ids, self.at(step))`` for any integer ids, about 3x faster through the table."""
        k = self._entry(step)
        ids, blocked = np.asarray(document_ids), self._ids[k]
        if not blocked.size:
            return np.zeros(ids.shape, dtype=bool)
        if blocked[-1] >= TABLE_LIMIT:
            return np.isin(ids, blocked)
        if self._table[0] != k:
            table = np.zeros(int(blocked[-1]) + 2, dtype=bool)  # the last entry stays False: -1 and larger ids
            table[blocked] = True
            self._table = (k, table)
        table = self._table[1]
        return table[np.clip(ids, -1, len(table) - 1)]  # -1 (padding) and any larger id land on the last, False


def redacted_at(redactions: Sequence[Redaction] | Blocklist, step: int) -> np.ndarray:
    """The sorted int64 ids of the documents redacted at training step ``step`` (those with ``from_step <= step``)."""
    return (redactions if isinstance(redactions, Blocklist) else Blocklist(redactions)).at(step)


def redaction_mask(document_ids: Any, step: int, redactions: Sequence[Redaction] | Blocklist) -> np.ndarray:
    """Where the labels of a batch read at training step ``step`` are redacted: a bool array shaped like
    ``document_ids`` (the batch's field), True at every position whose input token is a redacted document's."""
    return (redactions if isinstance(redactions, Blocklist) else Blocklist(redactions)).mask(document_ids, step)


def documents_by_path(column: Sequence[str], paths: Sequence[str]) -> list[int]:
    """The document ids (rows of the index's dataset, which are its document ids) whose ``path`` value is one of
    ``paths``, sorted: ``column`` is the dataset's ``path`` column. A path on several rows names each of them; a path on
    none is an error that names it (a typo must not redact nothing silently)."""
    if isinstance(paths, (str, bytes)) or not all(isinstance(p, str) for p in paths):
        raise ValueError(f"paths must be a list of strings, got {paths!r}")
    values = np.asarray(list(column), dtype=object)
    wanted = np.asarray(list(paths), dtype=object)
    hit = np.isin(values, wanted)
    missing = sorted(set(paths) - set(values[hit].tolist()))
    if missing:
        raise ValueError(f"paths {missing} name no document of the index's dataset (its path column)")
    return np.flatnonzero(hit).tolist()


_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def content_hash(text: str) -> str:
    """A document's content hash: the sha256 of its UTF-8 text, 64 lower-case hex digits (``sha256sum`` of the text
    saved as a file with no trailing newline gives the same)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def documents_by_content_hash(texts: Sequence[str], hashes: Sequence[str]) -> list[int]:
    """The document ids (rows of the index's dataset) whose text has one of ``hashes`` (:func:`content_hash`; hex
    digits in either case), sorted: ``texts`` is the dataset's text column. Equal texts on several rows are each named;
    a hash on none is an error that names it. Cost: one sha256 over every document's text (a full read of the corpus's
    text, about 0.5 GB/s on one core), once when the blocklist is resolved."""
    if isinstance(hashes, (str, bytes)) or not all(isinstance(h, str) and _SHA256.match(h.lower()) for h in hashes):
        raise ValueError(f"content hashes must be sha256 digests, 64 hexadecimal digits each, got {hashes!r}")
    wanted = sorted({h.lower() for h in hashes})
    found = np.isin(np.asarray([content_hash(t) for t in texts], dtype=object), np.asarray(wanted, dtype=object))
    ids = np.flatnonzero(found)
    missing = sorted(set(wanted) - {content_hash(texts[int(i)]) for i in ids})
    if missing:
        raise ValueError(f"content hashes {missing} name no document of the index's dataset (sha256 of its text)")
    return ids.tolist()
