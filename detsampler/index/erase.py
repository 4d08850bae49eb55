"""Erasure that moves nothing: the stored tokens of some documents overwritten in place with the index's pad id, their
loss mask zeroed, every length (hence every layout, sample and step) kept, locally or in a bucket
(``detsampler erase INDEX --doc D``).

What an erasure writes, in this order: a journal (``erasure.pending.json``: the documents and the CRC-32 each touched
64 KiB chunk will have), the touched bytes (a local file patched in place and fsynced; an object rewritten whole,
streamed, visible once uploaded), the touched chunks' checksum files, then ``meta.json`` (conditional on its ETag in a
bucket: a concurrent push or erasure is never overwritten) with each rewritten file's sha256, the format version 5
(:data:`~detsampler.index.format.ERASED_FORMAT_VERSION`, so that a reader that does not know erasures refuses the index)
and an erasure record appended to ``erasures``; the journal last. A crash in between leaves an index that refuses to
open (the journal, or a checksum that fails), never one that serves a wrong byte; running the erasure again finishes it
from the journal (the touched chunks must then have exactly the journal's checksums).

The erasure record (``{"id", "documents", "num_tokens", "neutral_id", "files": {name: sha256 after}}``, and for a chat
index ``trained_runs``: each document's trained positions as ``[start, stop)`` runs, no token value, so that an audit
can still count the labels each earlier read trained; ``id``: the sha256 of the rest, 16 hex digits) extends the
index's identity (``TokenIndex.data_identity``: ``KEY+erasure:<id>``), so a data fingerprint saved before it differs,
and :func:`detsampler.resume.check_resume` accepts exactly that extension.

Invariants: after :func:`erase_documents`, every stored token of an erased document equals the index's ``pad_id`` and
its loss mask is 0 (:func:`erasure_proof` reads them back through the chunk checksums); every other byte of every file
is unchanged; ``lengths.npy`` and ``offsets.npy`` are not touched.
"""

from __future__ import annotations

import hashlib
import io
import json
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from detsampler.atomic import removable_lock
from detsampler.index.checksums import open_checked, sums_name
from detsampler.index.files import npy_bytes
from detsampler.index.format import (
    CHAT_FORMAT_VERSION,
    CHUNK_BYTES,
    ERASED_FORMAT_VERSION,
    ERASURE_JOURNAL,
    INDEX_FORMAT_VERSION,
    TokenIndexError,
    base_format_version,
    seal_meta,
    token_dtype,
)
from detsampler.storage import RemotePath, as_path, store_for
from detsampler.storage.rewrite import e_tag_of, patch_object, put_if_unchanged

__all__ = ["erase_documents", "erasure_proof"]


def _read_json(path: Path | RemotePath) -> dict | None:
    try:
        return json.loads(path.read_bytes())
    except FileNotFoundError:
        return None


def _data_offset(url: str) -> int:
    """Where the array's data starts in a ``.npy`` file or object (after its header)."""
    head, _ = store_for(url).read_head(url, 4096)
    f = io.BytesIO(head)
    version = np.lib.format.read_magic(f)
    (np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0)(f)
    return f.tell()


def _checked_meta(path: Path | RemotePath) -> dict:
    from detsampler.index.reader import _read_meta  # the one check of a meta.json (kind, version, seal)

    return _read_meta(path, erasing=True)


def _check_erasable(path: Path | RemotePath, meta: dict) -> None:
    if base_format_version(meta) not in (INDEX_FORMAT_VERSION, CHAT_FORMAT_VERSION) or not meta.get("store_tokens"):
        raise TokenIndexError(
            f"index {str(path)!r} stores no tokens (format {meta.get('format_version')}, store_tokens"
            f" {meta.get('store_tokens')}): there are no stored bytes to erase here; erase the documents from the"
            " corpus it tokenizes on the fly"
        )


def _documents(meta: dict, documents: Any, path: Any) -> list[int]:
    n = int(meta["num_documents"])
    if isinstance(documents, (str, bytes)) or not hasattr(documents, "__iter__"):
        raise ValueError(f"documents must be a list of document ids, got {documents!r}")
    docs = []
    for d in documents:
        if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or not 0 <= int(d) < n:
            raise ValueError(f"index {str(path)!r}: Got document {d!r}, allowed documents are in [0, {n})")
        docs.append(int(d))
    if not docs:
        raise ValueError("erase_documents names no document")
    return sorted(set(docs))


def _element_ranges(path: Path | RemotePath, meta: dict, docs: list[int]) -> np.ndarray:
    """``[start, stop)`` in elements of each document's stored tokens (its EOS, when stored, kept)."""
    n = int(meta["num_documents"])
    lengths = open_checked(path, meta["files"], "lengths.npy", np.dtype(np.int64), (n,))
    offsets = open_checked(path, meta["files"], "offsets.npy", np.dtype(np.int64), (n + 1,))
    idx = np.asarray(docs, dtype=np.int64)
    starts = np.asarray(offsets[idx], dtype=np.int64)
    return np.stack([starts, starts + np.asarray(lengths[idx], dtype=np.int64)], axis=1)


def _load_sums(path: Path | RemotePath, name: str, record: dict, pending: bool) -> np.ndarray:
    """The chunk sums of data file ``name``: checked against the meta's record, or (finishing an erasure) read as they
    are, which may already be the new ones, with their shape checked."""
    sums_path = path / sums_name(name)
    raw = sums_path.read_bytes()
    if not pending and hashlib.sha256(raw).hexdigest() != record["sums"]["sha256"]:
        raise TokenIndexError(f"{sums_path}: differs from the one meta.json records: the index was edited")
    sums = np.load(io.BytesIO(raw), allow_pickle=False)
    if sums.dtype != np.uint32 or sums.shape != (-(-int(record["size"]) // CHUNK_BYTES),):
        raise TokenIndexError(f"{sums_path}: holds {sums.shape} {sums.dtype}, not one uint32 per chunk")
    return np.array(sums)


def _touched_chunks(byte_ranges: np.ndarray) -> list[int]:
    return sorted(
        {c for a, b in byte_ranges.tolist() if b > a for c in range(a // CHUNK_BYTES, (b - 1) // CHUNK_BYTES + 1)}
    )


def _patches(
    url: str, size: int, byte_ranges: np.ndarray, neutral: bytes, sums: np.ndarray, journal: dict | None
) -> tuple[dict[int, bytes], list[int], list[int]]:
    """The touched chunks patched: ``{chunk offset: bytes}``, their indexes and their new CRC-32s. Each touched chunk
    is checked first against ``sums`` (its bytes outside the erased ranges are then known intact), or, finishing an
    interrupted erasure, after patching against the journal's CRC-32s."""
    chunks = _touched_chunks(byte_ranges)
    spans = [(c * CHUNK_BYTES, min((c + 1) * CHUNK_BYTES, size)) for c in chunks]
    raw = store_for(url).read_ranges(url, spans) if spans else []
    out, crcs = {}, []
    for c, (lo, hi), data in zip(chunks, spans, raw):
        if journal is None and zlib.crc32(data) != int(sums[c]):
            raise TokenIndexError(f"{url}: chunk {c} (bytes [{lo}, {hi})) fails its checksum: the file was edited")
        block = bytearray(data)
        for a, b in byte_ranges.tolist():
            x, y = max(a, lo), min(b, hi)
            if x < y:  # the neutral element repeated, aligned on the range's first element
                block[x - lo : y - lo] = (neutral * ((y - a) // len(neutral) + 1))[x - a : y - a]
        out[lo] = bytes(block)
        crcs.append(zlib.crc32(block))
    if journal is not None and (chunks != journal["chunks"] or crcs != journal["crc32"]):
        raise TokenIndexError(
            f"{url}: the chunks the interrupted erasure touched do not give the checksums its journal recorded"
        )
    return out, chunks, crcs


def _trained_runs(path: Path | RemotePath, meta: dict, docs: list[int], elements: np.ndarray) -> dict | None:
    """A chat index's erased documents' trained positions, ``{doc: [[a, b), ...]}`` (runs of their loss mask, read
    before it is zeroed; no token value): what an audit needs to count, after the erasure, the labels each earlier read
    trained. None for plain text, whose labels do not depend on a stored mask."""
    if base_format_version(meta) != CHAT_FORMAT_VERSION:
        return None
    n = int(meta["num_tokens"])
    mask = open_checked(path, meta["files"], "loss_mask.npy", np.dtype(np.uint8), (n,))
    out = {}
    for doc, (a, b) in zip(docs, elements.tolist()):
        bits = np.concatenate([[0], np.asarray(mask[a:b]) != 0, [0]]).astype(np.int8)
        edges = np.flatnonzero(np.diff(bits))
        out[str(doc)] = edges.reshape(-1, 2).tolist()
    return out


def _sha256(url: str, size: int, block_bytes: int = 8 << 20) -> str:
    """The sha256 of the whole file or object (streamed)."""
    h, store = hashlib.sha256(), store_for(url)
    for start in range(0, size, block_bytes):
        h.update(store.read_ranges(url, [(start, min(start + block_bytes, size))])[0])
    return h.hexdigest()


def _files(meta: dict) -> dict[str, tuple[np.dtype, int]]:
    """The files an erasure rewrites and the neutral value of each: the tokens (the pad id), the loss mask (0)."""
    out = {"tokens.npy": (token_dtype(int(meta["tokenizer"]["vocab_size"])), int(meta["tokenizer"]["pad_id"]))}
    if base_format_version(meta) == CHAT_FORMAT_VERSION:
        out["loss_mask.npy"] = (np.dtype(np.uint8), 0)
    return out


def _put(url: str, data: bytes) -> None:
    store_for(url).put(url, data)


def _remove(path: Path | RemotePath) -> None:
    if isinstance(path, Path):
        path.unlink(missing_ok=True)
    else:
        store_for(str(path)).delete(str(path))


def _lock(path: Path | RemotePath) -> Any:
    """The builder's lock beside a local index (a bucket's writers are serialized by meta.json's conditional PUT)."""
    import contextlib

    if isinstance(path, Path):
        return removable_lock(path.parent / f"{path.name}.lock")
    return contextlib.nullcontext()


def erase_documents(path: str | Any, documents: Any) -> dict:
    """Erase the stored tokens of ``documents`` (ids) of the index at ``path`` (a directory or a bucket URL) in place
    (module doc). Returns ``{"documents": the ids newly erased, "already": those erased before, "record": the erasure
    record or None, "chunks": {file: chunks rewritten}, "identity": the index's identity now}``. Documents erased
    before are skipped; an interrupted erasure is finished first (its documents must be among those asked)."""
    path = as_path(path)
    with _lock(path):
        meta = _checked_meta(path)
        _check_erasable(path, meta)
        docs = _documents(meta, documents, path)
        journal = _read_json(path / ERASURE_JOURNAL)
        before = {d for record in meta.get("erasures") or [] for d in record["documents"]}
        if journal is not None and not set(journal["documents"]) <= set(docs) | before:
            raise ValueError(
                f"index {str(path)!r}: an interrupted erasure of documents {journal['documents']} must be finished"
                " first: erase them (with the others, or alone)"
            )
        new = journal["documents"] if journal is not None else [d for d in docs if d not in before]
        result = {"documents": new, "already": sorted(set(docs) & before), "record": None, "chunks": {}}
        if not new:
            return {**result, "identity": _identity(meta)}
        record = _erase(path, meta, new, journal)
        result.update(record=record, chunks=record.pop("chunks"))
        return {**result, "identity": _identity(_checked_meta(path))}


def _identity(meta: dict) -> str:
    return str(meta["cache_key"]) + "".join(f"+erasure:{r['id']}" for r in meta.get("erasures") or [])


def _erase(path: Path | RemotePath, meta: dict, docs: list[int], journal: dict | None) -> dict:
    """Journal, patch, checksums, meta.json, journal removed (module doc); returns the erasure record (and the chunks
    rewritten per file, under ``chunks``)."""
    meta_url = str(path / "meta.json")
    e_tag = e_tag_of(meta_url)
    elements = _element_ranges(path, meta, docs)
    trained = _trained_runs(path, meta, docs, elements) if journal is None else journal.get("trained_runs")
    planned = {}
    for name, (dtype, value) in _files(meta).items():
        url, record = str(path / name), meta["files"][name]
        byte_ranges = _data_offset(url) + elements * dtype.itemsize
        sums = _load_sums(path, name, record, pending=journal is not None)
        neutral = np.array([value], dtype=dtype).tobytes()
        patches, chunks, crcs = _patches(
            url, int(record["size"]), byte_ranges, neutral, sums, None if journal is None else journal["files"][name]
        )
        planned[name] = (url, record, sums, patches, chunks, crcs)
    if journal is None:
        files = {name: {"chunks": p[4], "crc32": p[5]} for name, p in planned.items()}
        kept = {"documents": docs, "files": files, "trained_runs": trained}
        _put(str(path / ERASURE_JOURNAL), json.dumps(kept).encode())
    new_meta = json.loads(json.dumps(meta))
    after = {}
    for name, (url, record, sums, patches, chunks, crcs) in planned.items():
        patch_object(url, int(record["size"]), patches)
        sums[chunks] = np.asarray(crcs, dtype=np.uint32)
        sums_bytes = npy_bytes(sums)
        _put(str(path / sums_name(name)), sums_bytes)
        entry = new_meta["files"][name]
        entry["sha256"] = after[name] = _sha256(url, int(record["size"]))
        entry["sums"]["sha256"] = hashlib.sha256(sums_bytes).hexdigest()
        entry["sums"]["size"] = len(sums_bytes)
    erasure = {
        "documents": docs,
        "num_tokens": int((elements[:, 1] - elements[:, 0]).sum()),
        "neutral_id": int(meta["tokenizer"]["pad_id"]),
        "files": after,
    }
    if trained is not None:
        erasure["trained_runs"] = trained
    erasure["id"] = hashlib.sha256(json.dumps(erasure, sort_keys=True).encode()).hexdigest()[:16]
    new_meta["erasures"] = [*(meta.get("erasures") or []), erasure]
    if new_meta["format_version"] != ERASED_FORMAT_VERSION:
        new_meta["erased_from_format"], new_meta["format_version"] = new_meta["format_version"], ERASED_FORMAT_VERSION
    sealed = seal_meta({k: v for k, v in new_meta.items() if k != "meta_sha256"})
    put_if_unchanged(meta_url, json.dumps(sealed, indent=2, sort_keys=True).encode(), e_tag)
    _remove(path / ERASURE_JOURNAL)
    return {**erasure, "chunks": {name: p[4] for name, p in planned.items()}}


def erasure_proof(index: Any) -> list[dict]:
    """Per erased document of ``index`` (a TokenIndex), read back through the chunk checksums: ``document``,
    ``num_tokens`` stored, ``neutral`` (how many of them are the recorded neutral id: all, when the bytes are gone) and
    ``mask_zero`` (for a chat index, whether its loss mask is all 0; None otherwise)."""
    out = []
    for record in getattr(index, "erasures", []):
        for doc in record["documents"]:
            start, stop = int(index.offsets[doc]), int(index.offsets[doc]) + int(index.lengths[doc])
            tokens = np.asarray(index.tokens[start:stop])
            mask = None if index.loss_mask is None else not np.asarray(index.loss_mask[start:stop]).any()
            out.append(
                {
                    "document": int(doc),
                    "erasure": record["id"],
                    "num_tokens": stop - start,
                    "neutral": int(np.count_nonzero(tokens == record["neutral_id"])),
                    "neutral_id": int(record["neutral_id"]),
                    "mask_zero": mask,
                }
            )
    return out
