"""Example boundaries of a packed micro batch, for attention that stops at them (numpy only).

A packed dataset's micro batch holds ``[B, seq_len]`` fields (:data:`detsampler.gather.FIELDS`): ``position_ids``
restart at 0 at every span (an example, or a piece of one, in the ``document`` and ``bestfit`` layouts) and count
``0 .. seq_len - 1`` over a ``concat`` sample; padding has document id -1 and position 0. From them:

- :func:`sequence_boundaries`: flash-attention's varlen ``cu_seqlens`` (int32, the cumulative lengths of the segments
  of the flattened ``[B * seq_len]`` batch, starting at 0 and ending at ``B * seq_len``) and ``max_seqlen``. A segment
  is a run of positions counting up by one within a row; a row's padding is one segment of its own (it attends only to
  itself, and its labels are -100), so the segments tile the batch and the padded batch can be handed to a varlen
  kernel as it is.
- :func:`flatten`: the padding-free form (``transformers.DataCollatorWithFlattening``'s): every row's non-padding
  positions laid end to end in one row ``[1, total]``, ``labels`` in the convention of a model that shifts them itself
  (``labels[t]`` is the target of position ``t - 1``; the separator, -100, at each segment's first position), the
  segments' ``cu_seq_lens`` and ``max_length``, and ``seq_idx`` (the segment of each position).

Labels: the packed dataset's ``labels`` are already shifted (``labels[t]`` is the token after position ``t``; -100 at
each span's last position, on padding, and, when the batch carries a ``loss_mask`` (``[B, seq_len]`` bool, True where a
position's label counts), wherever it is False). Both functions only move them: a target that is -100 stays -100, and no
target crosses a segment boundary, since the last position of a span has none.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from detsampler.gather import IGNORE_INDEX

__all__ = ["flatten", "segment_starts", "sequence_boundaries"]


def segment_starts(position_ids: np.ndarray, document_ids: np.ndarray | None = None) -> np.ndarray:
    """``[B, L]`` bool: True where a segment starts: each row's first position, and wherever the position does not
    continue the previous one by one. With ``document_ids``, a padding position (id -1) after another one continues
    its segment (a row's padding is one segment)."""
    pos = np.asarray(position_ids)
    if pos.ndim != 2:
        raise ValueError(f"position_ids must be [batch, seq_len], got shape {pos.shape}")
    starts = np.ones(pos.shape, dtype=bool)
    starts[:, 1:] = pos[:, 1:] != pos[:, :-1] + 1
    if document_ids is not None:
        pad = np.asarray(document_ids) < 0
        starts[:, 1:] &= ~(pad[:, 1:] & pad[:, :-1])
    return starts


def _cumulative(starts: np.ndarray) -> tuple[np.ndarray, int]:
    """``(cu_seqlens, max_seqlen)`` of the segments that begin where the flat bool ``starts`` is True."""
    cu = np.append(np.flatnonzero(starts), starts.size).astype(np.int32)
    return cu, int(np.diff(cu).max(initial=0))


def sequence_boundaries(position_ids: np.ndarray, document_ids: np.ndarray | None = None) -> tuple[np.ndarray, int]:
    """``(cu_seqlens, max_seqlen)`` of a padded ``[B, L]`` micro batch flattened to ``[B * L]`` (see the module doc):
    ``cu_seqlens`` int32, ``cu_seqlens[0] == 0``, ``cu_seqlens[-1] == B * L``, strictly increasing."""
    pos = np.asarray(position_ids)
    if pos.size >= 2**31:
        raise ValueError(f"a micro batch of {pos.size} positions: cu_seqlens are int32, at most 2**31 - 1")
    return _cumulative(segment_starts(pos, document_ids).reshape(-1))


def flatten(fields: Mapping[str, np.ndarray], *, separator_id: int = IGNORE_INDEX) -> dict[str, np.ndarray | int]:
    """The padding-free form of a ``[B, L]`` micro batch of the packed dataset's fields (``input_ids``, ``labels``,
    ``position_ids``, ``document_ids``; ``loss_mask`` honoured when present): the keys and dtypes
    ``transformers.DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_seq_idx=True)`` returns for the
    same examples: ``input_ids``, ``labels``, ``position_ids`` (int64 ``[1, total]``), ``seq_idx`` (int32
    ``[1, total]``), ``cu_seq_lens_q``/``_k`` (int32 ``[segments + 1]``) and ``max_length_q``/``_k`` (int).
    ``total`` is the number of non-padding positions; ``labels[0, t]`` is the target of position ``t - 1`` and
    ``separator_id`` at each segment's first position. A segment's last target has no place in the row: for a span it
    is -100 anyway; a ``concat`` row (one segment) loses the target of its last position, as in transformers."""
    missing = [k for k in ("input_ids", "labels", "position_ids", "document_ids") if k not in fields]
    if missing:
        raise ValueError(f"flatten needs the packed dataset's fields (output='fields'); missing {missing}")
    pos, docs = np.asarray(fields["position_ids"]), np.asarray(fields["document_ids"])
    targets = np.asarray(fields["labels"])
    if "loss_mask" in fields:
        targets = np.where(np.asarray(fields["loss_mask"], dtype=bool), targets, IGNORE_INDEX)
    keep = docs >= 0
    starts = segment_starts(pos, docs)[keep]
    flat_targets = targets[keep]
    labels = np.empty(flat_targets.size + 1, dtype=np.int64)
    labels[0], labels[1:] = separator_id, flat_targets
    labels = labels[:-1]  # shifted right by one: the target of position t - 1 sits at t
    labels[starts] = separator_id
    cu, longest = _cumulative(starts)
    seq_idx = (np.cumsum(starts) - 1).astype(np.int32)
    return {
        "input_ids": np.asarray(fields["input_ids"], dtype=np.int64)[keep][None],
        "labels": labels[None],
        "position_ids": pos.astype(np.int64, copy=False)[keep][None],
        "seq_idx": seq_idx[None],
        "cu_seq_lens_q": cu,
        "cu_seq_lens_k": cu,
        "max_length_q": longest,
        "max_length_k": longest,
    }
