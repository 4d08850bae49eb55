"""Content hashes: which document of an index's dataset a sha256 names (``where --sha256``, ``sha256 = [...]``
redactions). Numpy only; a dataset is anything with ``column_names`` and ``dataset[column]``.

A document's content is what the index tokenized from its row:

- a text column (a plain index): its text; the hash is the sha256 of the UTF-8 text (``sha256sum`` of the text saved
  with no trailing newline), as since issue 24;
- a chat row (an index built with a loss policy: a ``messages`` column, or ``prompt`` / ``completion`` columns): the
  row's rendered columns, ``{column: value}``; the hash is the sha256 of :func:`canonical_json` of that mapping. Other
  columns of the row (an id, a source) are not content and are left out;
- a multimodal document (a media index's): :func:`media_content`, ``{"text": text}`` or ``{"messages": conversation}``
  and ``"images"``, the sha256 (hex) of each image's bytes in document order; the hash is the sha256 of its
  :func:`canonical_json`, whatever the columns or tar members held them (the media build records it per document).

Documents are also named by a value of any id column the dataset has (a ``conversation_id``, a ticket number: how a
takedown request arrives): :func:`documents_by_id`, beside it.

Invariant: :func:`documents_by_content` is the one function that resolves hashes to document ids, and
:func:`documents_by_id` the one that resolves id values; every caller (the CLI, the trainer, the API) goes through
them.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = [
    "canonical_json",
    "content_columns",
    "content_hash",
    "documents_by_content",
    "documents_by_content_hash",
    "documents_by_hashes",
    "documents_by_id",
    "media_content",
]

_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def _without_nulls(value: Any) -> Any:
    """``value`` with every mapping's null-valued keys left out, at any depth (lists kept in order)."""
    if isinstance(value, Mapping):
        return {str(k): _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [_without_nulls(v) for v in value]
    return value


def canonical_json(row: Mapping[str, Any]) -> bytes:
    """The canonical form of a chat row: ``json.dumps(row, sort_keys=True, ensure_ascii=False, separators=(",", ":"),
    allow_nan=False)`` encoded as UTF-8, with every key whose value is null left out, at any depth.

    NOTE: nulls are left out because a ``datasets`` table cannot tell an absent key from a null one: loaded from
    Python lists or parquet, every message gets the union of the keys of all messages, null where one lacks it, while
    the JSON loader keeps each message as written; without nulls both give the file's row. A ValueError (non-finite
    floats, values JSON cannot hold) is the caller's to name."""
    text = json.dumps(_without_nulls(row), sort_keys=True, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return text.encode("utf-8")


def content_hash(content: str | Mapping[str, Any]) -> str:
    """A document's content hash, 64 lower-case hex digits: the sha256 of a text's UTF-8 bytes, or of a row's
    :func:`canonical_json`."""
    if isinstance(content, str):
        return hashlib.sha256(content.encode("utf-8")).hexdigest()
    if isinstance(content, Mapping):
        return hashlib.sha256(canonical_json(content)).hexdigest()
    raise TypeError(f"a content hash covers a text (str) or a row (a mapping of columns), got {type(content).__name__}")


def media_content(text: str | None, images: Sequence[bytes], messages: Any = None) -> dict:
    """A multimodal document's content (see the module doc): its ``text`` (or, for chat data, ``messages``, the
    conversation as its row holds it) and the sha256 of each image's bytes, in document order."""
    digests = [hashlib.sha256(bytes(data)).hexdigest() for data in images]
    return {"images": digests, **({"text": text} if messages is None else {"messages": messages})}


def content_columns(text_column: str, chat: Any = None) -> str | tuple[str, ...]:
    """What a document's content hash covers in the index's dataset: ``text_column`` itself (a str: its texts) for a
    plain index, the tuple of a chat index's rendered columns (``chat``: its ``ChatConfig``; a tuple: rows of them)."""
    return text_column if chat is None else tuple(chat.columns)


def _describe(columns: str | tuple[str, ...]) -> str:
    if isinstance(columns, str):
        return f"sha256 of the UTF-8 text of its column {columns!r}"
    return f"sha256 of the canonical JSON of its columns {list(columns)}"


def _hashes(dataset: Any, columns: str | tuple[str, ...]) -> list[str]:
    """Every document's content hash (see the module doc); a ValueError names a missing column or the first value a
    hash cannot cover."""
    names = [columns] if isinstance(columns, str) else list(columns)
    missing = [c for c in names if c not in (getattr(dataset, "column_names", None) or [])]
    if missing:
        raise ValueError(
            f"the dataset has no column {missing[0]!r} (its columns: {list(getattr(dataset, 'column_names', []))}):"
            f" a content hash here is the {_describe(columns)}"
        )
    if isinstance(columns, str):
        texts = list(dataset[columns])
        for doc, text in enumerate(texts):
            if not isinstance(text, str):
                got = "None" if text is None else type(text).__name__
                raise ValueError(
                    f"document {doc}: column {columns!r} holds {got}, not a text (str): a content hash covers a text"
                    " column's text, or a chat index's rows (an index built with a loss policy)"
                )
        return [content_hash(t) for t in texts]
    out = []
    for doc, values in enumerate(zip(*(dataset[c] for c in names))):
        try:
            out.append(hashlib.sha256(canonical_json(dict(zip(names, values)))).hexdigest())
        except (TypeError, ValueError) as e:
            raise ValueError(f"document {doc}: its row cannot be written as JSON for a content hash ({e})") from None
    return out


def _check_hashes(hashes: Sequence[str]) -> list[str]:
    if isinstance(hashes, (str, bytes)) or not all(isinstance(h, str) and _SHA256.match(h.lower()) for h in hashes):
        raise ValueError(f"content hashes must be sha256 digests, 64 hexadecimal digits each, got {hashes!r}")
    return sorted({h.lower() for h in hashes})


def _matching(found: Sequence[str], hashes: Sequence[str], what: str) -> list[int]:
    wanted = _check_hashes(hashes)
    values = np.asarray(found, dtype=object)
    hit = np.isin(values, np.asarray(wanted, dtype=object))
    missing = sorted(set(wanted) - set(values[hit].tolist()))
    if missing:
        raise ValueError(f"content hashes {missing} name no document of the index's dataset ({what})")
    return np.flatnonzero(hit).tolist()


def documents_by_content(dataset: Any, hashes: Sequence[str], columns: str | tuple[str, ...]) -> list[int]:
    """The document ids (rows of ``dataset``, the index's) whose content hash is one of ``hashes`` (hex digits in
    either case), sorted; ``columns`` is :func:`content_columns`'s. Equal contents on several rows are each named; a
    hash on none is an error that names it and what the hash covers. Cost: one sha256 over every document's content (a
    full read of the corpus's text, about 0.5 GB/s on one core), once, when the hashes are resolved."""
    _check_hashes(hashes)
    return _matching(_hashes(dataset, columns), hashes, _describe(columns))


def documents_by_hashes(found: Sequence[str], hashes: Sequence[str], what: str) -> list[int]:
    """The positions of ``found`` (every document's content hash, hex, as recorded) that are one of ``hashes``,
    sorted; a hash on none is an error naming it and ``what`` the hashes cover."""
    _check_hashes(hashes)
    return _matching(found, hashes, what)


def documents_by_content_hash(contents: Sequence[str | Mapping[str, Any]], hashes: Sequence[str]) -> list[int]:
    """The positions in ``contents`` (each document's text, or its row of rendered columns) whose
    :func:`content_hash` is one of ``hashes``, sorted; see :func:`documents_by_content`, which reads them from a
    dataset."""
    _check_hashes(hashes)
    return _matching([content_hash(c) for c in contents], hashes, "sha256 of its text, or of its row's canonical JSON")


def _check_ids(ids: Sequence[str | int]) -> list[str]:
    """``ids`` (strings or integers, at least one) in their string form, the form an id column's values are compared
    in (so ``"7004"`` typed at a command line names the integer 7004)."""
    ok = not isinstance(ids, (str, bytes, Mapping)) and isinstance(ids, (Sequence, np.ndarray)) and len(ids) > 0
    if not ok or not all(isinstance(i, (str, int, np.integer)) and not isinstance(i, (bool, np.bool_)) for i in ids):
        raise ValueError(f"ids must be a list of strings or integers (the values of an id column), got {ids!r}")
    return [str(int(i)) if not isinstance(i, str) else i for i in ids]


def _id_values(dataset: Any, column: str) -> np.ndarray:
    """The string form of every row's ``column`` value (None where the row holds none); a ValueError names a missing
    column or the first value that is not an id (a string or an integer)."""
    names = list(getattr(dataset, "column_names", None) or [])
    if column not in names:
        raise ValueError(f"the dataset has no column {column!r} (its columns: {names}): give the column of the ids")
    values = list(dataset[column])
    out = np.empty(len(values), dtype=object)
    for row, value in enumerate(values):
        if value is None:
            continue
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (str, int, np.integer)):
            raise ValueError(
                f"row {row}: column {column!r} holds {type(value).__name__} ({value!r}), not an id: an id column holds"
                " strings or integers"
            )
        out[row] = value if isinstance(value, str) else str(int(value))
    return out


def documents_by_id(dataset: Any, column: str, ids: Sequence[str | int]) -> list[int]:
    """The document ids (rows of ``dataset``, the index's) whose ``column`` value is one of ``ids``, sorted. Values are
    compared in their string form (an integer column's 7004 is named by ``7004`` or ``"7004"``); a row whose value is
    null is named by no id; an id on several rows names each of them; an id on none is an error that names it. Cost: one
    read of the column."""
    wanted = _check_ids(ids)
    values = _id_values(dataset, column)
    hit = np.isin(values, np.asarray(wanted, dtype=object))
    missing = sorted(set(wanted) - set(values[hit].tolist()))
    if missing:
        raise ValueError(f"ids {missing} name no document of the index's dataset (its column {column!r})")
    return np.flatnonzero(hit).tolist()
