"""Opening the pre-tokenized formats of other training stacks as :class:`~detsampler.index.sources.base.TokenSource`.

Each reader follows its format's published writer (cited per function) and memory-maps the token file as it is:

- ``megatron``: Megatron-LM ``MMIDIDX`` ``PREFIX.bin`` / ``PREFIX.idx`` (``megatron/core/datasets/indexed_dataset.py``:
  ``IndexedDatasetBuilder`` / ``_IndexWriter``); documents are the ``.idx`` document indices over its sequences;
- ``olmo``: OLMo-core / Dolma token ``.npy`` files (raw arrays, no header; ``olmo_core/data/utils.py``:
  ``iter_document_indices``, ``write_document_indices``): documents from the ``.csv.gz`` metadata beside the file where
  present, else split after each EOS;
- ``datatrove``: datatrove ``DocumentTokenizer`` output ``NAME.ds`` + ``NAME.ds.index`` (uint64 document ends; the token
  size from ``NAME.ds.metadata``; ``datatrove/pipeline/tokens/tokenizer.py``: ``TokenizedFile``);
- ``nanogpt``: a flat ``train.bin`` (uint16, each document followed by EOS 50256: nanoGPT's
  ``data/openwebtext/prepare.py``).
"""

from __future__ import annotations

import gzip
import io
import os
import struct
from pathlib import Path

import numpy as np

from detsampler.index.format import TokenIndexError
from detsampler.index.sources.base import TokenSource, scan_source, token_memmap
from detsampler.index.sources.objects import SourceFiles
from detsampler.storage import as_path

__all__ = ["open_datatrove", "open_megatron", "open_nanogpt", "open_olmo"]

_MMIDIDX = b"MMIDIDX\x00\x00"
_MEGATRON_DTYPES = {
    1: np.uint8,
    2: np.int8,
    3: np.int16,
    4: np.int32,
    5: np.int64,
    6: np.float64,
    7: np.float32,
    8: np.uint16,
}
NANOGPT_EOS = 50256  # GPT-2's <|endoftext|>, which nanoGPT's prepare.py appends to every document


def _starts_from_ends(ends: np.ndarray) -> np.ndarray:
    starts = np.zeros(ends.size + 1, dtype=np.int64)
    starts[1:] = ends
    return starts


def _check_starts(starts: np.ndarray, num_tokens: int, kind: str, path: Path) -> None:
    if starts.size and (int(starts[-1]) != num_tokens or (starts.size > 1 and int(np.diff(starts).min()) < 0)):
        raise TokenIndexError(
            f"{kind} source {str(path)!r}: its document boundaries do not tile its {num_tokens} tokens "
            f"(last end {int(starts[-1])}); the index file does not belong to the token file"
        )


def open_megatron(
    prefix: str | os.PathLike,
    *,
    eos: str = "real",
    eos_id: int | None = None,
    pad_id: int | None = None,
    vocab_size: int | None = None,
) -> TokenSource:
    """``PREFIX.bin`` / ``PREFIX.idx``: header ``MMIDIDX\\0\\0``, version 1 (<Q), dtype code (<B), sequence count (<Q),
    document count (<Q), then int32 sequence lengths, int64 sequence byte pointers, int64 document indices (sequence
    numbers, starting at 0). Document ``d`` is sequences ``[doc_idx[d], doc_idx[d + 1])``, contiguous in ``.bin``."""
    prefix = as_path(str(prefix).removesuffix(".bin").removesuffix(".idx"))
    idx, bin_ = prefix.with_name(prefix.name + ".idx"), prefix.with_name(prefix.name + ".bin")
    files = SourceFiles("megatron", [bin_, idx])
    if not files.exists(idx):
        raise TokenIndexError(f"megatron source: no {str(idx)!r}; pass the path prefix of PREFIX.bin / PREFIX.idx")
    raw = files.read_bytes(idx) if files.remote else None  # an object: one GET of the .idx, per open
    with io.BytesIO(raw) if raw is not None else open(idx, "rb") as f:
        head = f.read(34)
    if len(head) < 34 or head[:9] != _MMIDIDX or struct.unpack("<Q", head[9:17])[0] != 1:
        raise TokenIndexError(f"megatron source: {str(idx)!r} is not a version 1 MMIDIDX index")
    code, n_seq, n_doc = head[17], *struct.unpack("<QQ", head[18:34])
    if code not in _MEGATRON_DTYPES:
        raise TokenIndexError(f"megatron source: {str(idx)!r} has an unknown dtype code {code}")
    dtype = np.dtype(_MEGATRON_DTYPES[code])
    if dtype.kind not in "iu":
        raise TokenIndexError(f"megatron source: {str(idx)!r} stores {dtype.name} tokens; token ids are integers")

    def field(dtype: type, offset: int, count: int) -> np.ndarray:
        if not count:
            return np.zeros(0, dtype)
        if raw is not None:
            return np.frombuffer(raw, dtype=dtype, count=count, offset=offset)
        return np.memmap(idx, dtype=dtype, mode="r", offset=offset, shape=(count,))

    seq_lengths, pointers = field(np.int32, 34, n_seq), field(np.int64, 34 + 4 * n_seq, n_seq)
    doc_idx = np.array(field(np.int64, 34 + 12 * n_seq, n_doc))
    tokens = token_memmap(bin_, dtype, "megatron", files)
    if n_doc == 0 or doc_idx[0] != 0 or doc_idx[-1] != n_seq:
        raise TokenIndexError(
            f"megatron source: {str(idx)!r} has document indices that do not cover its {n_seq} sequences"
        )
    seq_starts = np.append(np.asarray(pointers, dtype=np.int64) // dtype.itemsize, tokens.size)
    if n_seq and not np.array_equal(np.diff(seq_starts), np.asarray(seq_lengths, dtype=np.int64)):
        raise TokenIndexError(f"megatron source: the sequences of {str(idx)!r} are not contiguous in {str(bin_)!r}")
    starts = seq_starts[doc_idx]
    _check_starts(starts, tokens.size, "megatron", prefix)
    end_eos = eos_id if eos == "real" and eos_id is not None else None
    identity, scan = scan_source(files, dtype, tokens.size, whole=[idx], starts=lambda: starts, end_eos=end_eos)
    return TokenSource(
        "megatron",
        prefix,
        tokens,
        starts,
        identity=identity,
        scan=scan,
        end_eos=True,
        eos=eos,
        eos_id=eos_id,
        pad_id=pad_id,
        vocab_size=vocab_size,
        reopen=(open_megatron, (str(prefix),), {}),
    )


def _csv_pairs(lines: list[bytes]) -> np.ndarray:
    """The first two integer columns of ``start,end[,...]`` lines as an int64 ``[n, 2]`` array (blank lines skipped)."""
    block = b"".join(lines)
    if block.count(b",") == len(lines) and not any(not line.strip() for line in lines):  # exactly two columns: in C
        fields = block.replace(b"\n", b",").split(b",")[:-1]
    else:
        fields = [x for line in lines if line.strip() for x in line.split(b",", 2)[:2]]
    return np.array(fields, dtype="S20").astype(np.int64).reshape(-1, 2)


def _olmo_metadata(path: Path, num_tokens: int, files: SourceFiles) -> np.ndarray | None:
    """Document starts from the ``.csv.gz`` beside ``path`` (lines ``start,end[,...]``), or None when there is none."""
    meta = path.with_name(path.name.removesuffix(".npy") + ".csv.gz")
    if not files.exists(meta):
        return None
    parts = []
    with gzip.open(io.BytesIO(files.read_bytes(meta)) if files.remote else meta, "rb") as f:
        while lines := f.readlines(1 << 20):  # about 1 MB of lines at a time: memory stays flat
            parts.append(_csv_pairs(lines))
    pairs = np.concatenate(parts) if parts else np.zeros((0, 2), np.int64)
    if pairs.size and (pairs[0, 0] != 0 or not np.array_equal(pairs[1:, 0], pairs[:-1, 1])):
        raise TokenIndexError(f"olmo source: the documents of {str(meta)!r} are not contiguous from token 0")
    starts = _starts_from_ends(pairs[:, 1])
    if starts[-1] != num_tokens:  # trailing tokens outside any document: not this format
        raise TokenIndexError(
            f"olmo source: {str(meta)!r} covers {int(starts[-1])} of the {num_tokens} tokens of {str(path)!r}"
        )
    return starts


def open_olmo(
    path: str | os.PathLike,
    *,
    eos_id: int | None = None,
    dtype: str = "uint32",
    eos: str = "real",
    pad_id: int | None = None,
    vocab_size: int | None = None,
    loss_mask: str | os.PathLike | None = None,
) -> TokenSource:
    """A raw ``.npy`` token array of ``dtype`` (OLMo-core writes no header). Documents: the ``.csv.gz`` metadata
    beside it, else split after each ``eos_id`` (as ``iter_document_indices`` does from the array). ``loss_mask``: its
    label mask (OLMo-core's ``label_mask_paths``: a raw bool array, one byte per token)."""
    p = as_path(path)
    dt = np.dtype(dtype)
    meta = p.with_name(p.name.removesuffix(".npy") + ".csv.gz")
    files = SourceFiles("olmo", [p, meta])
    tokens = token_memmap(p, dt, "olmo", files)
    if not files.exists(meta) and eos_id is None:
        raise ValueError(
            f"olmo source {str(p)!r}: no {meta.name} beside it, so documents are split at EOS: pass eos_id= "
            "(or a tokenizer)"
        )
    if files.exists(meta):  # documents are the metadata's rows, also where one holds no EOS (OLMo-core allows it)
        identity, scan = scan_source(
            files, dt, tokens.size, whole=[meta], starts=lambda: _olmo_metadata(p, tokens.size, files)
        )
    else:
        identity, scan = scan_source(files, dt, tokens.size, split_eos=int(eos_id))
    return TokenSource(
        "olmo",
        p,
        tokens,
        scan.starts,
        identity=identity,
        scan=scan,
        eos=eos,
        eos_id=eos_id,
        pad_id=pad_id,
        vocab_size=vocab_size,
        reopen=(open_olmo, (str(p),), dict(dtype=dt.name)),
        loss_mask=loss_mask,
    )


def open_datatrove(
    path: str | os.PathLike,
    *,
    eos: str = "real",
    eos_id: int | None = None,
    pad_id: int | None = None,
    vocab_size: int | None = None,
    token_size: int | None = None,
    loss_mask: str | os.PathLike | None = None,
) -> TokenSource:
    """``NAME.ds`` (tokens, ``token_size`` bytes each: from ``NAME.ds.metadata``'s first line ``tokenizer|size``,
    else 2) and ``NAME.ds.index`` (uint64 little-endian document ends, in tokens). ``loss_mask``: its loss values
    (``NAME.ds.loss``, written by ``DocumentTokenizer(save_loss_metadata=True)``: one bool byte per token)."""
    p = as_path(path)
    index, meta = p.with_name(p.name + ".index"), p.with_name(p.name + ".metadata")
    files = SourceFiles("datatrove", [p, index, meta])
    if not files.exists(index):
        raise TokenIndexError(f"datatrove source: no {str(index)!r} (write it with DocumentTokenizer(save_index=True))")
    if token_size is None:
        token_size = 2
        if files.exists(meta):
            text = files.read_bytes(meta).decode()
            first = text.splitlines()[0] if text else ""
            token_size = int(first.rsplit("|", 1)[1]) if "|" in first else 2
    dt = np.dtype({2: np.uint16, 4: np.uint32}.get(token_size, np.uint16))
    tokens = token_memmap(p, dt, "datatrove", files)
    ends = np.frombuffer(files.read_bytes(index), dtype="<u8").astype(np.int64)
    starts = _starts_from_ends(ends)
    _check_starts(starts, tokens.size, "datatrove", p)
    end_eos = eos_id if eos == "real" and eos_id is not None else None
    identity, scan = scan_source(files, dt, tokens.size, whole=[index], starts=lambda: starts, end_eos=end_eos)
    return TokenSource(
        "datatrove",
        p,
        tokens,
        starts,
        identity=identity,
        scan=scan,
        end_eos=True,
        eos=eos,
        eos_id=eos_id,
        pad_id=pad_id,
        vocab_size=vocab_size,
        reopen=(open_datatrove, (str(p),), dict(token_size=token_size)),
        loss_mask=loss_mask,
    )


def open_nanogpt(
    path: str | os.PathLike,
    *,
    eos_id: int = NANOGPT_EOS,
    dtype: str = "uint16",
    eos: str = "real",
    pad_id: int | None = None,
    vocab_size: int | None = None,
) -> TokenSource:
    """A flat ``train.bin`` of ``dtype`` tokens, documents split after each ``eos_id`` (GPT-2's 50256 by default)."""
    p = as_path(path)
    dt = np.dtype(dtype)
    files = SourceFiles("nanogpt", [p])
    tokens = token_memmap(p, dt, "nanogpt", files)
    identity, scan = scan_source(files, dt, tokens.size, split_eos=int(eos_id))
    return TokenSource(
        "nanogpt",
        p,
        tokens,
        scan.starts,
        identity=identity,
        scan=scan,
        eos=eos,
        eos_id=eos_id,
        pad_id=pad_id,
        vocab_size=vocab_size,
        reopen=(open_nanogpt, (str(p),), dict(dtype=dt.name)),
    )
