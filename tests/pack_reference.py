"""The packed dataset's per-span read path (a slice copy per span, a slice write per piece, the loss mask copied
span by span beside the tokens), kept as the reference the vectorized pass of :mod:`detsampler.gather` must equal
byte for byte (tests/test_pack_pass.py), fields and masks alike, and as benchmark 3's "per span" stage rows. It is
the code :mod:`detsampler.gather` held before issue 35, unchanged but for its names."""

from __future__ import annotations

import numpy as np

from detsampler.cells import check_spans as _check_spans
from detsampler.gather import IGNORE_INDEX, token_ranges
from detsampler.layout import Spans
from detsampler.ranges import concat_ranges

__all__ = ["pack_fields_per_span", "pack_tokens_per_span"]

_UNCACHED_CELLS = 1 << 17  # from this many cells (1 MiB of int64) a whole-grid pass costs more than a slice per piece
_FEW_SPANS = 64  # at least this many cells per span on average: a slice copy per span beats building addresses


def _with_padding(spans: Spans, span_len: np.ndarray, per_sample: np.ndarray, sample_len: int):
    """The spans with a padding piece (document -1) after each sample's last span, so that their lengths tile the
    flattened ``[B, sample_len]`` grid; and which pieces are real spans. Without padding, the spans themselves."""
    pad = sample_len - per_sample
    if not pad.any():
        return span_len, spans.doc_ids.astype(np.int64, copy=False), None
    at = spans.offsets[1:]
    real = np.insert(np.ones(span_len.size, dtype=bool), at, False)
    return np.insert(span_len, at, pad), np.insert(spans.doc_ids.astype(np.int64, copy=False), at, -1), real


def _grid(out: np.ndarray, num_samples: int, sample_len: int, labels_cross_documents: bool) -> np.ndarray:
    """Where the ``[B, sample_len]`` grid of cells is laid out: the input ids when a sample is one window; for a
    window shifted into inputs and labels (``sample_len == seq_len + 1``), the memory of the labels and position ids
    (not written yet), so that no temporary is allocated; else a new array."""
    seq_len = out.shape[2]
    if sample_len == seq_len:
        return out[0]
    if labels_cross_documents and sample_len == seq_len + 1 and out.flags.c_contiguous:
        return out[1:3].reshape(-1)[: num_samples * sample_len].reshape(num_samples, sample_len)
    return np.empty((num_samples, sample_len), dtype=np.int64)


def _fill_suffixes(grid: np.ndarray, first: np.ndarray, value: int) -> None:
    """``grid[i, first[i]:] = value`` for each row ``i`` with ``first[i] < width`` (a slice per such row)."""
    width = grid.shape[1]
    for i in np.flatnonzero(first < width).tolist():
        grid[i, max(int(first[i]), 0) :] = value


def _fill_tokens(
    grid: np.ndarray, grid_begin: np.ndarray, reads: np.ndarray, src: np.ndarray, read, mask: tuple | None = None
) -> None:
    """Write the stored tokens of each span into ``grid`` (flat): span ``j``'s first ``reads[j]`` cells get
    ``flat[src[j] : src[j] + reads[j]]`` where ``flat = read(src, src + reads)`` (an array, or anything that takes an
    integer index array). With ``mask = (mask_grid, mask_read)``, the same cells of ``mask_grid`` get the same ranges
    of ``mask_read``'s array, in the same pass."""
    flat = _plain(read(src, src + reads))
    mask_grid, mask_flat = (None, None) if mask is None else (mask[0], _plain(mask[1](src, src + reads)))
    if isinstance(flat, np.ndarray) and reads.size * _FEW_SPANS <= grid.size:  # else one call (e.g. a sharded array)
        if mask_grid is None:
            for g, a, m in zip(grid_begin.tolist(), src.tolist(), reads.tolist()):
                if m:
                    grid[g : g + m] = flat[a : a + m]
        else:
            for g, a, m in zip(grid_begin.tolist(), src.tolist(), reads.tolist()):
                if m:
                    to, of = slice(g, g + m), slice(a, a + m)
                    grid[to] = flat[of]
                    mask_grid[to] = mask_flat[of]
    elif reads.size:
        keep = reads > 0
        cells, at = concat_ranges(grid_begin[keep], reads[keep])[0], concat_ranges(src[keep], reads[keep])[0]
        grid[cells] = flat[at]
        if mask_grid is not None:
            mask_grid[cells] = mask_flat[at]


def _plain(flat):
    """A memory map as a plain view: slicing a memmap subclass costs a Python call per slice."""
    return flat.view(np.ndarray) if isinstance(flat, np.memmap) else flat


def _span_sizes(spans: Spans, sample_len: int, doc_lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each span's number of positions, its first cell when the spans are laid end to end, and each sample's number of
    positions, checked against ``sample_len`` and the documents."""
    span_len = (spans.stops - spans.starts).astype(np.int64, copy=False)
    cum = np.zeros(span_len.size + 1, dtype=np.int64)
    np.cumsum(span_len, out=cum[1:])
    per_sample = cum[spans.offsets[1:]] - cum[spans.offsets[:-1]]
    _check_spans(spans, per_sample, sample_len, doc_lengths)
    return span_len, cum[:-1], per_sample


def _write_tokens(
    tokens: np.ndarray,
    grid_begin: np.ndarray,
    spans: Spans,
    span_len: np.ndarray,
    doc_starts: np.ndarray,
    doc_lengths: np.ndarray,
    read,
    eos_id: int,
    eos_stored: bool,
    mask: tuple | None = None,
) -> None:
    """Span ``j``'s positions into ``tokens`` (flat) from cell ``grid_begin[j]``: its stored tokens, and at position
    ``lengths[d]`` of its document ``eos_id`` (a virtual EOS) or, with ``eos_stored``, the stored token there. With
    ``mask = (mask_grid, mask_read, mask_eos, mask_examples)``, the values of the array aligned with the tokens into
    the same cells of ``mask_grid`` (flat, zeroed by the caller), ``mask_eos`` at a virtual EOS, and with
    ``mask_examples`` 0 at each document's first position."""
    src, reads = token_ranges(spans, doc_starts, doc_lengths, eos_stored)
    _fill_tokens(tokens, grid_begin, reads, src, read, None if mask is None else mask[:2])
    if not eos_stored:
        eos_cells = (grid_begin + span_len - 1)[spans.stops == doc_lengths + 1]
        tokens[eos_cells] = eos_id
        if mask is not None:
            mask[0][eos_cells] = mask[2]
    if mask is not None and mask[3]:
        # NOTE: a document's first token has nothing of its own document before it: as a target it could only be
        # predicted from another example (concat's label at the previous example's EOS), so it is never trained
        mask[0][grid_begin[(spans.starts == 0) & (span_len > 0)]] = 0


def pack_fields_per_span(
    spans: Spans,
    seq_len: int,
    sample_len: int,
    doc_starts: np.ndarray,
    doc_lengths: np.ndarray,
    read,
    *,
    eos_id: int,
    pad_id: int,
    eos_stored: bool,
    labels_cross_documents: bool,
    restart_position_ids: bool,
    out: np.ndarray,
    mask_out: np.ndarray | None = None,
    mask_read=None,
    mask_eos: int = 0,
    mask_examples: bool = False,
) -> np.ndarray:
    """Write the four :data:`FIELDS` of the samples of ``spans`` into ``out`` (int64 ``[4, B, seq_len]``); the values
    are exactly those tests/gather_reference.py's ``gather_spans`` lays out, turned into fields as the packed dataset
    defines them: ``concat`` (``labels_cross_documents``, ``sample_len == seq_len + 1``) shifts one window into inputs
    and labels; otherwise each span's last position and padding get :data:`IGNORE_INDEX`. ``read(starts, stops)``
    returns the flat token array, having checked whatever it guards for those element ranges (the only ones read).
    With ``mask_out`` (C-contiguous ``[B, sample_len]``), the positions' values of the array ``mask_read`` returns (a
    loss mask aligned with the tokens) are laid out there in the same pass, cell for cell as the tokens (a virtual EOS
    reads ``mask_eos``, padding 0). With ``mask_examples`` (each document is an example: chat data), a document's first
    position reads 0 there: no label that the mask keeps predicts an example's first token, so none crosses from one
    example into the next, whatever the layout (``concat`` included).

    Cost: per span, one slice copy of its stored tokens (or, with spans of fewer than 64 cells on average, one
    fancy-index gather); per piece, a slice write of its document and restarting positions where that beats a
    whole-grid repeat; a slice per padded sample, and a few whole-grid passes; nothing per token in Python.
    """
    num_samples, L = len(spans), seq_len
    doc_starts = np.asarray(doc_starts, dtype=np.int64)
    doc_lengths = np.asarray(doc_lengths, dtype=np.int64)
    span_len, span_begin, per_sample = _span_sizes(spans, sample_len, doc_lengths)
    piece_len, piece_doc, real = _with_padding(spans, span_len, per_sample, sample_len)
    if real is None:  # no padding: the pieces are the spans, which tile the flat grid
        piece_begin = grid_begin = span_begin
    else:
        piece_begin = np.cumsum(piece_len) - piece_len  # pieces tile the flat grid
        grid_begin = piece_begin[real]
    input_ids, labels, position_ids, document_ids = out
    grid = _grid(out, num_samples, sample_len, labels_cross_documents)
    tokens = grid.reshape(-1)
    mask = _mask_args(mask_out, mask_read, mask_eos, mask_examples)
    _write_tokens(tokens, grid_begin, spans, span_len, doc_starts, doc_lengths, read, eos_id, eos_stored, mask)
    _fill_suffixes(grid, per_sample, pad_id)
    if labels_cross_documents:
        last = grid[:, L].copy()  # the grid may lie in the labels' memory: read it all before writing them
        input_ids[:] = grid[:, :L]
        labels[:, :-1], labels[:, -1] = input_ids[:, 1:], last
        _fill_suffixes(labels, per_sample - 1, IGNORE_INDEX)
    else:
        flat = labels.reshape(-1)
        flat[:-1] = tokens[1:]
        flat[(grid_begin + span_len - 1)[span_len > 0]] = IGNORE_INDEX  # each span's last cell
        _fill_suffixes(labels, per_sample, IGNORE_INDEX)
        labels[:, -1] = IGNORE_INDEX
    restart = position_ids if restart_position_ids else None
    if piece_len.size * _FEW_SPANS <= grid.size and (restart is not None or grid.size >= _UNCACHED_CELLS):
        _fill_pieces(document_ids, restart, piece_begin, piece_len, piece_doc, sample_len)
    else:
        document_ids[:] = np.repeat(piece_doc, piece_len).reshape(num_samples, sample_len)[:, :L]
        if restart is not None:
            pos = np.arange(num_samples * sample_len, dtype=np.int64) - np.repeat(piece_begin, piece_len)
            position_ids[:] = pos.reshape(num_samples, sample_len)[:, :L]
            _fill_suffixes(position_ids, per_sample, 0)
    if restart is None:
        position_ids[:] = np.arange(L, dtype=np.int64)
    return out


def _mask_args(mask_out: np.ndarray | None, mask_read, mask_eos: int, mask_examples: bool) -> tuple | None:
    """``(flat mask grid zeroed, reader, EOS value, examples)`` for :func:`_write_tokens`, or None without
    ``mask_out``."""
    if mask_out is None:
        return None
    if not mask_out.flags.c_contiguous or mask_read is None:
        raise ValueError("mask_out must be C-contiguous, and comes with mask_read")
    mask_out.fill(0)
    return mask_out.reshape(-1), mask_read, mask_eos, bool(mask_examples)


def _fill_pieces(
    document_ids: np.ndarray,
    position_ids: np.ndarray | None,
    begin: np.ndarray,
    length: np.ndarray,
    doc: np.ndarray,
    sample_len: int,
) -> None:
    """Write each piece's document (and, given ``position_ids``, its restarting positions; 0 on padding) into the
    cells it covers: piece ``j`` covers ``[begin[j], begin[j] + length[j])`` of the flattened ``[B, sample_len]`` grid,
    within one row, whose first ``document_ids.shape[1]`` columns are kept. A slice per piece, no whole-grid
    temporary."""
    width = document_ids.shape[1]
    ramp = np.arange(width, dtype=np.int64)
    for g, m, d in zip(begin.tolist(), length.tolist(), doc.tolist()):
        row, col = divmod(g, sample_len)
        stop = min(col + m, width)
        if col >= stop:
            continue
        document_ids[row, col:stop] = d
        if position_ids is not None:
            position_ids[row, col:stop] = ramp[: stop - col] if d >= 0 else 0


def pack_tokens_per_span(
    spans: Spans,
    sample_len: int,
    doc_starts: np.ndarray,
    doc_lengths: np.ndarray,
    read,
    *,
    eos_id: int,
    eos_stored: bool,
    out: np.ndarray,
    mask_out: np.ndarray | None = None,
    mask_read=None,
    mask_eos: int = 0,
    mask_examples: bool = False,
) -> np.ndarray:
    """Write the token ids of the samples of ``spans`` into ``out`` (``[B, sample_len]``, an integer dtype that holds
    every id): the positions :func:`pack_fields` lays out before it derives the fields (for ``concat`` its inputs are
    ``out[:, :-1]`` and its labels ``out[:, 1:]``). Every sample must fill its ``sample_len`` positions (a ``concat``
    sample always does): there is no padding to mark without the other fields.

    Cost: per span, one slice copy of its stored tokens (or one fancy-index gather, see :func:`pack_fields`); no
    whole-grid pass. ``mask_out`` / ``mask_read`` / ``mask_eos`` / ``mask_examples``: as for :func:`pack_fields`.
    """
    doc_starts = np.asarray(doc_starts, dtype=np.int64)
    doc_lengths = np.asarray(doc_lengths, dtype=np.int64)
    span_len, span_begin, per_sample = _span_sizes(spans, sample_len, doc_lengths)
    short = per_sample < sample_len
    if short.any():
        raise ValueError(
            f"sample {int(np.argmax(short))} of the batch holds {int(per_sample[short][0])} positions, fewer than"
            f" sample_len={sample_len}: token ids alone cannot mark its padding (read the four fields instead)"
        )
    if not out.flags.c_contiguous:
        raise ValueError("out must be C-contiguous: its rows are written through one flat view")
    # no padding: the spans tile the flat grid
    mask = _mask_args(mask_out, mask_read, mask_eos, mask_examples)
    _write_tokens(out.reshape(-1), span_begin, spans, span_len, doc_starts, doc_lengths, read, eos_id, eos_stored, mask)
    return out
