"""Reading a batch of samples' spans into the packed dataset's four fields in one vectorized pass (numpy only).

Given :class:`~detsampler.layout.Spans` for B samples and, per span, where its document's tokens start in a flat token
array and how many tokens the document has, :func:`pack_fields` lays the spans' positions out in ``[B, sample_len]``
rows: position ``lengths[d]`` of document ``d`` reads ``eos_id`` (the EOS is virtual, never stored), or with
``eos_stored`` the stored token there (the document's own last token: a real EOS, or a pre-tokenized corpus's
separator); cells after a sample's last span are padding (``pad_id``, document -1). tests/gather_reference.py holds the
straightforward form it must equal, tests/pack_reference.py the per-span path it replaced (equal byte for byte, masks
included: tests/test_pack_pass.py).

The pass (:mod:`detsampler.cells` for the first two steps): the spans' cells computed over arrays of spans; the
batch's stored tokens joined into the whole grid in the stored dtype (one memory-view slice per span); then each field
written from that grid once: the input ids and the labels by one widening copy each (with a loss mask, a multiply-add
for the labels), the position ids by one broadcast copy (restarting: one ``np.repeat``), the document ids by one
``np.repeat`` over the pieces (a slice per span when there are at most four), padding by a slice per padded row.
Nothing is done per token in Python.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from detsampler.cells import Cells, fits, joined, lay_out, restarted, token_ranges, widened
from detsampler.spans import Spans

__all__ = [
    "FIELDS",
    "IGNORE_INDEX",
    "Cells",
    "lay_out",
    "pack_fields",
    "pack_tokens",
    "token_ranges",
]  # Cells, lay_out and
# token_ranges: from detsampler.cells, where they live

FIELDS = ("input_ids", "labels", "position_ids", "document_ids")
IGNORE_INDEX = -100  # the label of a position that has no next token to predict
_FEW_PIECES = 4  # up to this many spans, a slice write per piece beats a whole-grid np.repeat


def _token_grid(cells: Cells, flat, eos_id: int, pad_id: int) -> tuple[np.ndarray, bool]:
    """``[B, sample_len]`` tokens (the stored dtype, or int64 where ``eos_id`` does not fit it) and whether the padding
    cells already hold ``pad_id``."""
    dtype = flat.dtype if isinstance(flat, np.ndarray) else np.dtype(getattr(flat, "dtype", np.int64))
    if not fits(eos_id, dtype):
        flat, dtype = widened(flat, cells), np.dtype(np.int64)
        cells = restarted(cells)
    padded = fits(pad_id, dtype)
    grid = joined(flat, cells, eos_id, pad_id if padded else 0)
    return grid.reshape(cells.num_samples, cells.sample_len), padded


@lru_cache(maxsize=16)
def _ramp(n: int) -> np.ndarray:
    """``arange(n)`` (int64, read-only), made once per length."""
    out = np.arange(n, dtype=np.int64)
    out.setflags(write=False)
    return out


def _pieces(cells: Cells, doc_ids: np.ndarray | None) -> tuple[np.ndarray, np.ndarray | None]:
    """The pieces that tile the flattened grid, in order: ``(length, document)`` (-1 on padding; None without
    ``doc_ids``)."""
    if not cells.padded:
        return cells.length, None if doc_ids is None else doc_ids.astype(np.int64, copy=False)
    n = cells.length.size
    length = np.empty(2 * n + 1, dtype=np.int64)
    length[0], length[1::2], length[2::2] = cells.lead, cells.length, cells.gap
    if doc_ids is None:
        return length, None
    doc = np.full(2 * n + 1, -1, dtype=np.int64)
    doc[1::2] = doc_ids
    return length, doc


def _write_documents(cells: Cells, doc_ids: np.ndarray, document_ids: np.ndarray) -> bool:
    """Each span's document into ``document_ids`` (``[B, L]``, the first ``L`` columns of each ``sample_len`` row):
    a slice per span when there are few (then True: the padding is left to :func:`_write_padding`), else one
    ``np.repeat`` over the pieces, -1 on padding (False)."""
    B, width, sample_len = cells.num_samples, document_ids.shape[1], cells.sample_len
    if cells.length.size <= _FEW_PIECES:  # the spans alone (each within a row): padding by _write_padding
        for g, m, d in zip(cells.begin.tolist(), cells.length.tolist(), doc_ids.tolist()):
            row, col = divmod(g, sample_len)
            document_ids[row, col : min(col + m, width)] = d
        return True
    length, doc = _pieces(cells, doc_ids)
    if sample_len == width:  # the grid is the field's own shape: written through a flat view
        document_ids.reshape(-1)[:] = np.repeat(doc, length)
    else:
        document_ids[:] = np.repeat(doc, length).reshape(B, sample_len)[:, :width]
    return False


def _check_out(out: np.ndarray, shape: tuple[int, ...], what: str) -> None:
    if out.shape != shape or not out.flags.c_contiguous:
        raise ValueError(f"{what} must be a C-contiguous array of shape {shape}, got shape {out.shape}")


def pack_fields(
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
    mask_labels: bool = False,
) -> np.ndarray:
    """Write the four :data:`FIELDS` of the samples of ``spans`` into ``out`` (int64 C-contiguous ``[4, B,
    seq_len]``); the values are exactly those tests/gather_reference.py's ``gather_spans`` lays out, turned into fields
    as the packed dataset defines them: ``concat`` (``labels_cross_documents``, ``sample_len == seq_len + 1``) shifts
    one window into inputs and labels; otherwise (``sample_len == seq_len``) each span's last position and padding get
    :data:`IGNORE_INDEX`. ``read(starts, stops)`` returns the flat token array, having checked whatever it guards for
    those element ranges (the only ones read).

    With ``mask_read`` (a reader of the same form for an array aligned with the tokens: a loss mask), its values are
    laid out cell for cell as the tokens (a virtual EOS reads ``mask_eos``, padding 0), into ``mask_out`` when given
    (C-contiguous ``[B, sample_len]``, any integer dtype). With ``mask_examples`` (each document is an example: chat
    data), a document's first position reads 0 there: no label that the mask keeps predicts an example's first token,
    so none crosses from one example into the next, whatever the layout (``concat`` included). With ``mask_labels``
    the labels are masked in the same pass: a label is :data:`IGNORE_INDEX` wherever the mask at the position it
    predicts is 0 (any other value trains), so that the loss mask is ``labels != IGNORE_INDEX``.

    Cost: :func:`lay_out` (a dozen calls over arrays of spans), one ``bytes.join`` of a memory-view slice per span and
    one per virtual EOS or run of padding (and as many for the mask), one widening copy per field from the joined grid
    (with ``mask_labels``, a multiply-add for the labels instead), the pieces' documents and positions by one
    ``np.repeat`` each (a slice per span when there are at most four), padding by a slice per padded row: nothing per
    token in Python.
    """
    num_samples, L = len(spans), seq_len
    if sample_len != L + int(bool(labels_cross_documents)):
        raise ValueError(
            f"sample_len={sample_len} with seq_len={L}: a concat sample holds seq_len + 1 positions, any other seq_len"
        )
    _check_out(out, (len(FIELDS), num_samples, L), "out")
    cells = lay_out(spans, sample_len, doc_starts, doc_lengths, eos_stored)
    flat = read(cells.src, cells.src + cells.reads)
    mask = _mask_cells(cells, spans, mask_read, mask_out, mask_eos, mask_examples, mask_labels)
    tokens, padded = _token_grid(cells, flat, eos_id, pad_id)
    _write_inputs(out[0], tokens, L)
    _write_labels(cells, out[1], tokens, mask if mask_labels else None)
    sliced = _write_documents(cells, spans.doc_ids, out[3])
    _write_positions(cells, out[2], restart_position_ids)
    _write_padding(cells, out, labels_cross_documents, restart_position_ids, None if padded else pad_id, sliced)
    return out


def _write_inputs(input_ids: np.ndarray, tokens: np.ndarray, seq_len: int) -> None:
    """The input ids: each row's first ``seq_len`` tokens, widened to int64."""
    input_ids[:] = tokens[:, :seq_len]


def _write_labels(cells: Cells, labels: np.ndarray, tokens: np.ndarray, mask: np.ndarray | None) -> None:
    """The labels: the next position's token (``concat``: the window shifted by one; otherwise within the flat grid,
    then IGNORE_INDEX at each span's last cell), and IGNORE_INDEX where ``mask`` (the laid-out mask, optional) is 0 at
    the position predicted. Padding is written by :func:`_write_padding`."""
    num_samples, sample_len = tokens.shape
    keep = None if mask is None else mask != 0
    if sample_len == labels.shape[1] + 1:
        _next_tokens(labels, tokens[:, 1:], None if keep is None else keep.reshape(num_samples, sample_len)[:, 1:])
        return
    flat_labels = labels.reshape(-1)
    if not flat_labels.size:  # an empty micro batch (torchft's share while a group heals)
        return
    _next_tokens(flat_labels[:-1], tokens.reshape(-1)[1:], None if keep is None else keep[1:])
    flat_labels[-1] = IGNORE_INDEX
    ends = cells.begin + cells.length - 1
    flat_labels[ends[cells.length > 0]] = IGNORE_INDEX  # each span's last cell


def _write_positions(cells: Cells, position_ids: np.ndarray, restart: bool) -> None:
    """Position ids: ``0 .. L-1`` in every row, or (``restart``) the position within each span's piece of its
    document (padding is fixed by :func:`_write_padding`)."""
    if not restart:
        position_ids[:] = _ramp(position_ids.shape[1])
        return
    B, width, sample_len = cells.num_samples, position_ids.shape[1], cells.sample_len
    if cells.length.size <= _FEW_PIECES:
        ramp = _ramp(width)
        for g, m in zip(cells.begin.tolist(), cells.length.tolist()):
            row, col = divmod(g, sample_len)
            stop = min(col + m, width)
            if col < stop:
                position_ids[row, col:stop] = ramp[: stop - col]
        return
    length, _ = _pieces(cells, None)
    begin = np.empty(length.size, dtype=np.int64)
    begin[0] = 0
    np.add.accumulate(length[:-1], out=begin[1:])
    if sample_len == width:  # the grid is the field's own shape: written through a flat view, no temporary
        np.subtract(_ramp(B * sample_len), np.repeat(begin, length), out=position_ids.reshape(-1))
    else:
        within = _ramp(B * sample_len) - np.repeat(begin, length)
        position_ids[:] = within.reshape(B, sample_len)[:, :width]


def _write_padding(
    cells: Cells, out: np.ndarray, labels_cross_documents: bool, restart: bool, pad_id: int | None, documents: bool
) -> None:
    """Padding (each padded row's tail), a slice write per row: IGNORE_INDEX in the labels (``concat``: from the
    position before on, which predicts padding) and 0 in restarting position ids (one write for both; without restart
    the positions keep ``0 .. L-1``); ``pad_id`` in the input ids unless None (the joined grid holds it already), and
    -1 in the document ids when ``documents`` (the ``np.repeat`` of the pieces wrote it already otherwise)."""
    if not cells.padded:
        return
    first, width = cells.per_sample, out.shape[2]
    shift = int(bool(labels_cross_documents))
    tail = np.array([IGNORE_INDEX, 0], dtype=np.int64)[:, None]
    for i in np.flatnonzero(first - shift < width).tolist():
        f = int(first[i])
        if restart and not shift:
            out[1:3, i, f:] = tail
        else:
            out[1, i, max(f - shift, 0) :] = IGNORE_INDEX
            if restart:
                out[2, i, f:] = 0
        if pad_id is not None:
            out[0, i, f:] = pad_id
        if documents:
            out[3, i, f:] = -1


def _next_tokens(labels: np.ndarray, tokens: np.ndarray, keep: np.ndarray | None) -> None:
    """``labels[:] = tokens`` (the next positions' tokens), and :data:`IGNORE_INDEX` where ``keep`` (bool, optional)
    is False: ``(tokens + 100) * keep - 100`` in int64, three passes and no masked write (a boolean-mask assignment
    costs twice as much on a mask of trained and untrained runs)."""
    if keep is None:
        labels[:] = tokens
        return
    np.add(tokens, -IGNORE_INDEX, out=labels, dtype=np.int64)
    np.multiply(labels, keep, out=labels)
    labels += IGNORE_INDEX


def _mask_cells(
    cells: Cells, spans: Spans, mask_read, mask_out: np.ndarray | None, mask_eos: int, examples: bool, labels: bool
) -> np.ndarray | None:
    """The mask values of the cells (flat ``[B * sample_len]``, writable; a virtual EOS reads ``mask_eos``, padding 0;
    with ``examples`` a document's first position 0), read once right after the tokens and laid out in ``mask_out``
    when given; None without ``mask_read``."""
    if mask_read is None:
        if mask_out is not None or labels:
            raise ValueError("mask_out and mask_labels come with mask_read")
        return None
    if mask_out is None and not labels:
        raise ValueError("mask_read comes with mask_out or mask_labels")
    if mask_out is not None:
        _check_out(mask_out, (cells.num_samples, cells.sample_len), "mask_out")
    mask = joined(mask_read(cells.src, cells.src + cells.reads), cells, int(mask_eos), 0, writable=True)
    if examples:
        # NOTE: a document's first token has nothing of its own document before it: as a target it could only be
        # predicted from another example (concat's label at the previous example's EOS), so it is never trained
        mask[cells.begin[(spans.starts == 0) & (cells.length > 0)]] = 0
    if mask_out is not None:
        mask_out.reshape(-1)[:] = mask
    return mask


def pack_tokens(
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

    Cost: :func:`lay_out`, one ``bytes.join`` of the spans' stored tokens and one copy into ``out``; no other
    whole-grid pass. ``mask_out`` / ``mask_read`` / ``mask_eos`` / ``mask_examples``: as for :func:`pack_fields`.
    """
    cells = lay_out(spans, sample_len, doc_starts, doc_lengths, eos_stored)
    short = cells.per_sample < sample_len
    if short.any():
        raise ValueError(
            f"sample {int(np.argmax(short))} of the batch holds {int(cells.per_sample[short][0])} positions, fewer than"
            f" sample_len={sample_len}: token ids alone cannot mark its padding (read the four fields instead)"
        )
    if not out.flags.c_contiguous:
        raise ValueError("out must be C-contiguous: its rows are written through one flat view")
    flat = read(cells.src, cells.src + cells.reads)
    _mask_cells(cells, spans, mask_read, mask_out, mask_eos, mask_examples, False)
    tokens, _ = _token_grid(cells, flat, eos_id, 0)
    out.reshape(-1)[:] = tokens.reshape(-1)
    return out
