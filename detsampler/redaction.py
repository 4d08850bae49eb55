"""Redaction that moves nothing else: a blocklist of documents whose tokens leave the loss from a training step on.

A :class:`Redaction` names documents (ids of the index) and the training step ``from_step`` from which they are
redacted. ``Plan(..., redactions=[...])`` holds the blocklist over time (entries sorted by ``from_step``, one entry per
step, each document in one entry at most). Over a mixture, each entry names the ``source`` its documents belong to (the
source's own document ids): then the rules hold per source (one entry per step and source, each (source, document) pair
in one entry at most), and a batch's mask needs the source of each row (``sources=``, from the row's sample id:
``Mixture.split_ids``). A redaction changes no sample id, no position, no input token: every step
reads exactly the samples it read before. What it changes is the labels: at training step ``t``, every label at a
position whose input token belongs to a document redacted at ``t`` (``from_step <= t``) is ``-100``
(:func:`redaction_mask`; the torch form is :func:`detsampler.loader.redact.redact_labels`). docs/design.md §5 argues
masking over padding.

Invariant (tests/test_redaction.py): with and without the redactions, every step's ``input_ids``, ``position_ids``
and ``document_ids`` are equal, and the labels differ exactly at the positions :func:`detsampler.where.where` gives for
the redacted documents at steps ``>= from_step`` (where the label was not already ``-100``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from detsampler.checks import check_int, is_int
from detsampler.content import content_hash, documents_by_content_hash  # re-exported: issue 24's names

__all__ = [
    "Blocklist",
    "Redaction",
    "check_redacted_documents",
    "check_redaction_sources",
    "content_hash",
    "documents_by_content_hash",
    "documents_by_path",
    "normalize_redactions",
    "redacted_at",
    "redaction_mask",
    "row_sources",
]


@dataclass(frozen=True)
class Redaction:
    """Documents ``documents`` (ids in the index, ints >= 0) redacted from training step ``from_step`` on; ``source``:
    for a plan over a mixture, the source (its index, an int >= 0) whose document ids ``documents`` are, else None.

    ``documents`` is kept sorted without duplicates (a tuple of ``int``); an empty list is refused. The fingerprint form
    (:meth:`to_list`) is ``[from_step, [documents]]`` without a source (the form of every run before sources existed)
    and ``[from_step, [documents], source]`` with one."""

    documents: tuple[int, ...]
    from_step: int
    source: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "from_step", check_int(self.from_step, "Redaction.from_step", minimum=0))
        if self.source is not None:
            object.__setattr__(self, "source", check_int(self.source, "Redaction.source (a mixture source)", minimum=0))
        docs = self.documents
        if isinstance(docs, (str, bytes)) or not isinstance(docs, (Sequence, np.ndarray)):
            raise ValueError(f"Redaction.documents must be a list of document ids, got {docs!r}")
        out = []
        for d in list(docs):
            if not is_int(d) or d < 0:
                raise ValueError(f"Redaction.documents must hold document ids (integers >= 0), got {d!r}")
            out.append(int(d))
        if not out:
            raise ValueError(f"{self._name()} names no document")
        dupes = sorted({d for d in out if out.count(d) > 1})
        if dupes:
            raise ValueError(f"{self._name()} names documents {dupes} more than once")
        object.__setattr__(self, "documents", tuple(sorted(out)))

    def _name(self) -> str:
        return (
            f"Redaction(from_step={self.from_step}" + ("" if self.source is None else f", source={self.source}") + ")"
        )

    def to_list(self) -> list:
        """The fingerprint form ``[from_step, [documents...]]``, or ``[from_step, [documents...], source]``."""
        out: list = [self.from_step, list(self.documents)]
        return out if self.source is None else [*out, self.source]

    @classmethod
    def from_any(cls, value: Any) -> Redaction:
        """A Redaction from itself, its :meth:`to_list` form or a dict ``{"documents": [...], "from_step": s}`` (and
        ``"source": k``)."""
        if isinstance(value, Redaction):
            return value
        if isinstance(value, dict):
            unknown = sorted(set(value) - {"documents", "from_step", "source"})
            if unknown or not {"documents", "from_step"} <= set(value):
                raise ValueError(
                    f"a redaction is {{documents = [...], from_step = s}} (and source = k), got keys {sorted(value)}"
                )
            return cls(value["documents"], value["from_step"], value.get("source"))
        if isinstance(value, (list, tuple)) and len(value) in (2, 3):
            return cls(value[1], value[0], value[2] if len(value) == 3 else None)
        raise ValueError(
            "a redaction is Redaction(documents, from_step[, source]) or [from_step, [documents][, source]], got"
            f" {value!r}"
        )


def normalize_redactions(redactions: Any) -> tuple[Redaction, ...]:
    """The redactions sorted by ``from_step`` (then source); refused: two entries at one step (of one source), a
    document (of one source) in two entries, entries with a source mixed with entries without."""
    if redactions is None:
        return ()
    if isinstance(redactions, (str, bytes, dict)) or not isinstance(redactions, Sequence):
        raise ValueError(f"redactions must be a list of Redaction, got {redactions!r}")
    out = sorted((Redaction.from_any(r) for r in redactions), key=lambda r: (r.from_step, _source_key(r.source)))
    if len({r.source is None for r in out}) > 1:
        raise ValueError(
            "some redactions name a source and others none: over a mixture every entry names its source, over one"
            " index none does"
        )
    of = lambda r: "" if r.source is None else f" of source {r.source}"
    for a, b in zip(out, out[1:]):
        if (a.from_step, a.source) == (b.from_step, b.source):
            raise ValueError(
                f"two redactions{of(a)} from step {a.from_step}: give each step once (merge their documents)"
            )
    seen: dict[tuple[int | None, int], int] = {}
    for r in out:
        for d in r.documents:
            if (r.source, d) in seen:
                raise ValueError(
                    f"document {d}{of(r)} is redacted from step {seen[r.source, d]} and again from step {r.from_step}:"
                    " name it once"
                )
            seen[r.source, d] = r.from_step
    return tuple(out)


def _source_key(source: int | None) -> int:
    return -1 if source is None else source


def check_redaction_sources(redactions: tuple[Redaction, ...], stream: Any) -> tuple[Redaction, ...]:
    """``redactions`` checked against the plan's stream: over a mixture (a stream with ``num_sources``) every entry
    names a source in ``[0, num_sources)``, over one index none does."""
    num_sources = getattr(stream, "num_sources", None)
    for r in redactions:
        if num_sources is None and r.source is not None:
            raise ValueError(
                f"{r._name()} names a mixture source, but the plan reads one index: its redactions name no source"
            )
        if num_sources is not None and (r.source is None or r.source >= num_sources):
            raise ValueError(
                f"{r._name()}: a plan over a mixture of {num_sources} sources redacts documents of one source: give"
                f" Redaction(documents, from_step, source=k), k in [0, {num_sources}) (document ids are per source)"
            )
    return redactions


def check_redacted_documents(redactions: Any, num_documents: Sequence[int]) -> None:
    """Refuse a redaction of a document its index (its mixture source's) does not hold: ``num_documents`` is the
    document count of the index, or of each source in order. (A redacted id past the corpus masks nothing: it is a
    typo or another corpus's id, never a redaction that happened.)"""
    for r in redactions or ():
        k = r.source or 0
        n = int(num_documents[k])
        if r.documents[-1] >= n:  # sorted
            of = "" if r.source is None else f" of source {r.source}"
            raise ValueError(
                f"{r._name()}: Got document {r.documents[-1]}{of}, allowed documents are in [0, {n}): the index holds"
                f" {n} documents"
            )


TABLE_LIMIT = 1 << 24  # the largest redacted id a lookup table serves (16 MiB of bools); beyond, np.isin


class _Entries:
    """The entries of one index (or of one mixture source): per change step, the sorted int64 ids then in force, and
    a bool lookup table of the ids in force at the last change step asked."""

    def __init__(self, redactions: Sequence[Redaction]) -> None:
        self._steps = np.array([r.from_step for r in redactions], dtype=np.int64)
        self._ids = [np.zeros(0, dtype=np.int64)]
        for r in redactions:
            self._ids.append(np.union1d(self._ids[-1], np.array(r.documents, dtype=np.int64)))
        self._table: tuple[int, np.ndarray | None] = (-1, None)

    def at(self, step: int) -> np.ndarray:
        return self._ids[int(np.searchsorted(self._steps, step, side="right"))]

    def mask(self, ids: np.ndarray, step: int) -> np.ndarray:
        k = int(np.searchsorted(self._steps, step, side="right"))
        blocked = self._ids[k]
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


class Blocklist:
    """The redactions prepared for the training loop: per change step (and per mixture source), the sorted int64 ids
    then in force, built once, so that :meth:`at` costs a binary search over the entries, whatever the number of
    documents. :meth:`mask` marks a batch's redacted positions through a bool lookup table of the ids in force (one
    table per source, for the last change step asked: its memory is the largest redacted id + 2 bytes, at most
    ``TABLE_LIMIT``; beyond it ``np.isin``).

    Over a mixture (entries with a ``source``), :meth:`mask` takes the source of each row: a row's positions are
    masked by its source's entries only, so document 4 of one source never masks document 4 of another."""

    def __init__(self, redactions: Any) -> None:
        self.redactions = normalize_redactions(list(redactions or ()))
        self.by_source = bool(self.redactions) and self.redactions[0].source is not None
        keys = sorted({r.source for r in self.redactions}, key=_source_key)
        self._parts = {k: _Entries([r for r in self.redactions if r.source == k]) for k in keys}
        self._combined_at: tuple[Any, Any] = (None, None)

    def _check(self, step: int, source: int | None, what: str) -> int:
        step = check_int(step, "step", minimum=0)
        if not self.redactions:  # nothing to mask: any source (or none) is fine
            return step
        if self.by_source and source is None:
            raise ValueError(
                f"these redactions name mixture sources: {what} needs the source (of each row: the sample ids'"
                " Mixture.split_ids)"
            )
        if not self.by_source and source is not None:
            raise ValueError(f"these redactions name no mixture source: {what} takes none")
        return step

    def rows(self, step: int, sources: Any, shape: tuple[int, ...]) -> np.ndarray | None:
        """The checked source of each row of a batch of shape ``shape`` (flat int64, :func:`row_sources`), or None
        when the redactions name no source (then ``sources`` must be None)."""
        self._check(step, None if sources is None else 0, "mask(document_ids, step, sources)")
        return row_sources(sources, shape) if self.by_source else None

    def at(self, step: int, source: int | None = None) -> np.ndarray:
        """The sorted int64 ids of the documents (of mixture source ``source``) redacted at training step ``step``."""
        step = self._check(step, source, "at(step, source)")
        part = self._parts.get(source if source is None else int(source))
        return part.at(step) if part is not None else np.zeros(0, dtype=np.int64)

    def in_force(self, step: int) -> list[tuple[int | None, np.ndarray]]:
        """``(source, ids)`` of every source (None: the one index) with documents redacted at ``step``."""
        step = check_int(step, "step", minimum=0)
        return [(k, ids) for k, ids in ((k, part.at(step)) for k, part in self._parts.items()) if ids.size]

    def mask(self, document_ids: np.ndarray, step: int, sources: Any = None) -> np.ndarray:
        """Bool, shaped like ``document_ids``: True where the id is redacted at ``step`` (padding, -1, never); exactly
        ``np.isin(document_ids, self.at(step))`` for any integer ids, about 3x faster through the table. Over a
        mixture, ``sources`` gives the source of each row (int array whose shape begins ``document_ids``' shape,
        ``[B]`` for a ``[B, seq_len]`` batch): exactly ``np.isin`` of each row with its source's ids in force."""
        ids = np.asarray(document_ids)
        rows = self.rows(step, sources, ids.shape)
        if rows is None:
            part = self._parts.get(None)
            return part.mask(ids, step) if part is not None else np.zeros(ids.shape, dtype=bool)
        flat_ids = ids.reshape(rows.size, -1)
        combined = self._combined(step)
        if combined is not None:  # one lookup: each row's ids offset into its source's table
            table, starts, lasts = combined
            k = np.minimum(rows, len(starts) - 1)[:, None]  # a source without entries reads the last, empty table
            # NOTE: -1 (padding) lands on the entry before the row's table: the previous table's last (False), or, for
            # table 0, the very last entry (False)
            return table[np.clip(flat_ids, -1, lasts[k]) + starts[k]].reshape(ids.shape)
        out = np.zeros(ids.shape, dtype=bool)
        flat_out = out.reshape(rows.size, -1)
        for k, _ in self.in_force(step):  # a loop over the sources, vectorized over each one's rows
            which = np.flatnonzero(rows == k)
            if which.size:
                flat_out[which] = self._parts[k].mask(flat_ids[which], step)
        return out

    def _combined(self, step: int) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """The sources' lookup tables at ``step`` end to end (each ``largest id in force + 2`` long, its last entry
        False; then one ``[False]`` table for any other source), with each table's start and last index; None when
        they would exceed ``TABLE_LIMIT`` entries (then :meth:`mask` loops over the sources)."""
        in_force = {k: ids for k, ids in self.in_force(step)}
        key = tuple(len(ids) for ids in in_force.values()), tuple(in_force)
        if self._combined_at[0] == key:
            return self._combined_at[1]
        sizes = [int(in_force[k][-1]) + 2 if k in in_force else 1 for k in range(max(self._parts) + 1)] + [1]
        if sum(sizes) > TABLE_LIMIT:
            return None
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        table = np.zeros(sum(sizes), dtype=bool)
        for k, ids in in_force.items():
            table[starts[k] + ids] = True
        combined = (table, starts, np.asarray(sizes, dtype=np.int64) - 1)
        self._combined_at = (key, combined)
        return combined


def row_sources(sources: Any, shape: tuple[int, ...]) -> np.ndarray:
    """``sources`` checked against a batch of shape ``shape`` (its shape must begin ``shape``: one source per row,
    integers >= 0) and flattened to int64."""
    src = np.asarray(sources)
    if src.dtype.kind not in "iu" or tuple(shape[: src.ndim]) != src.shape or (src.size and src.min() < 0):
        raise ValueError(
            f"sources must give the mixture source (an integer >= 0) of each row of the batch {tuple(shape)}, got an"
            f" array of shape {src.shape} and dtype {src.dtype}"
        )
    return src.astype(np.int64, copy=False).reshape(-1)


def redacted_at(redactions: Sequence[Redaction] | Blocklist, step: int, source: int | None = None) -> np.ndarray:
    """The sorted int64 ids of the documents (of mixture source ``source``) redacted at training step ``step`` (those
    with ``from_step <= step``)."""
    return (redactions if isinstance(redactions, Blocklist) else Blocklist(redactions)).at(step, source)


def redaction_mask(
    document_ids: Any, step: int, redactions: Sequence[Redaction] | Blocklist, sources: Any = None
) -> np.ndarray:
    """Where the labels of a batch read at training step ``step`` are redacted: a bool array shaped like
    ``document_ids`` (the batch's field), True at every position whose input token is a redacted document's. Over a
    mixture, ``sources`` is the source of each row (:meth:`Blocklist.mask`)."""
    return (redactions if isinstance(redactions, Blocklist) else Blocklist(redactions)).mask(
        document_ids, step, sources
    )


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
