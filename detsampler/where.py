"""Document -> the steps that read it: the inverse of :func:`detsampler.locate.locate`, without a scan.

``where(plan, layout, doc, steps)`` returns every read of document ``doc`` by training steps ``steps``: one
:class:`Read` per (step, micro step, rank, row, span), in that order. It composes the inverses of the mapping's layers:

1. **Layout inverse** (:func:`document_samples`): the document's place in the seeded order is
   ``unpermute(doc, D, key, version=1)`` (the order is mapping version 1's keyed permutation, so its inverse is
   pointwise and O(1); a stored ``order.npy`` is read once at that place to check it). Then ``concat``: the document
   spans stream positions ``[b, e)`` (``ends``) and sample ``c`` holds ``[cL, cL + L + 1)``, so the samples
   ``max(0, floor((b - 1) / L)) .. min(floor((e - 1) / L), N - 1)``; ``document``: samples ``ends[i - 1] .. ends[i] -
   1``, piece ``p`` of each; ``bestfit``: the items of the document's window (``window_docs`` documents, so the bins
   ``window_bins[w] .. window_bins[w + 1]``) that name it, and the bin of each (a search in ``bin_items``). Each with
   the token span in the document and its offset in the sample's row (the tokens of the spans before it).
2. **Stream inverse**: sample ``c`` of epoch ``e`` is read at position ``e N + unpermute(c, N, key(e))``; only the
   epochs that the steps' positions ``[consumed(first), consumed(stop))`` meet are visited. Through a mixture, the
   source's sample ``c`` at source epoch ``e`` is its position ``p = e N_k + unpermute(c, N_k, key_k(e))``, and
   :meth:`~detsampler.mixture.Mixture.global_positions` climbs the routing tree back to the global position.
3. **Plan inverse**: position ``g`` lies in the batch-size schedule segment with the last ``first_consumed <= g``: data
   step ``d = first_step + (g - first_consumed) // B``, offset ``o`` in the step, its slot ``k = o`` (a balanced plan:
   the slot whose order names ``o``, through the inverse of that step's order), micro step ``k // (W M)``, rank ``(k
   mod W M) // M``, row ``k mod M``. A data step inside a skip range is never trained on: those reads are left out. Any
   other data step ``d`` is training step ``d`` minus the skipped data steps before it.

A layout with ``epoch_order`` (a new document order each epoch) is inverted epoch by epoch: step 1 in each epoch met,
with that epoch's order (its key, and its view's ``ends``), and the sample ids carry the epoch (``e N + c``). Opening an
epoch's view costs O(1) when its directory is there (the current and next epochs of a run), else its build, O(D).

Cost: O(epochs met x pieces of the document) permutation inversions (plus, for bestfit, one read of the window's
items), whatever the number of steps. Invariant (tests/test_where.py): the result equals, list for list, an exhaustive
scan of :func:`~detsampler.locate.locate` over every step, rank and micro step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from detsampler.epoch_order import document_order_key
from detsampler.keys import subkeys
from detsampler.layout import Layout
from detsampler.locate import _source_layouts, check_compatible
from detsampler.mixture import Mixture
from detsampler.permutation import unpermute
from detsampler.plan import Plan

__all__ = ["DocumentSamples", "Read", "document_samples", "redaction_audit", "where"]


class Read(NamedTuple):
    """One read of a document: at ``step``, ``micro_step``, ``rank``, row ``row`` of the micro batch holds the
    document's token positions ``[start, stop)`` (position ``length`` is its EOS) from token ``offset``
    of the row on."""

    step: int
    micro_step: int
    rank: int
    row: int
    start: int
    stop: int
    offset: int
    position: int  # global position in the stream
    sample_id: int  # the sample (for a mixture: the sample within the source)
    epoch: int  # the epoch (for a mixture: within the source)


@dataclass(frozen=True)
class DocumentSamples:
    """The samples of a layout that hold a document: sample ``sample_ids[i]`` holds its positions ``[starts[i],
    stops[i])`` from token ``offsets[i]`` of the sample on (int64 arrays, in sample order)."""

    sample_ids: np.ndarray
    starts: np.ndarray
    stops: np.ndarray
    offsets: np.ndarray


def _int(arr: Any, i: int) -> int:
    return int(np.asarray(arr[np.array([i])])[0])


def _ints(arr: Any, lo: int, hi: int) -> np.ndarray:
    return np.asarray(arr[np.arange(lo, hi, dtype=np.int64)], dtype=np.int64) if hi > lo else np.zeros(0, np.int64)


def _order_position(layout: Any, doc: int) -> int:
    """The document's place in the layout's seeded order: the inverse of ``documents_at``, pointwise."""
    n = int(layout.num_documents)
    key = document_order_key(layout.config.seed, getattr(layout, "epoch", 0))
    pos = int(unpermute(doc, n, key, version=1))
    order = getattr(layout, "_order", None)
    if order is not None and _int(order, pos) != doc:
        raise ValueError(f"the layout's stored order does not hold document {doc} at position {pos}: is it damaged?")
    return pos


def document_samples(layout: Layout, doc: int, epoch: int = 0) -> DocumentSamples:
    """The samples of ``layout`` that hold document ``doc``, with its span and offset in each (module doc, step 1);
    for a layout with ``epoch_order``, in epoch ``epoch`` (sample ids within the epoch, in ``[0, num_samples)``).

    A concat document that lies only in the corpus' dropped tail (after the last whole sample) is in none."""
    if hasattr(layout, "epoch_view"):
        layout = layout.epoch_view(epoch, ahead=False)
    inner: Any = getattr(layout, "inner", layout)  # a PersistedLayout: its arrays
    if isinstance(doc, bool) or not isinstance(doc, (int, np.integer)) or not 0 <= doc < inner.num_documents:
        raise ValueError(f"Got document {doc!r}, allowed documents are in [0, {inner.num_documents})")
    doc = int(doc)
    if hasattr(inner, "document_samples"):  # a layout that inverts itself (the media layout: pieces cut between images)
        return DocumentSamples(*inner.document_samples(doc))
    kind, seq_len = inner.config.kind, int(inner.config.seq_len)
    extent = _int(inner.lengths, doc) + 1
    if kind in ("concat", "document"):
        pos = _order_position(inner, doc)
        first = _int(inner.ends, pos - 1) if pos else 0
        last = _int(inner.ends, pos)
        if kind == "document":
            ids = np.arange(first, last, dtype=np.int64)
            starts = (ids - first) * seq_len
            return DocumentSamples(ids, starts, np.minimum(starts + seq_len, extent), np.zeros_like(ids))
        lo, hi = max(0, (first - 1) // seq_len), min((last - 1) // seq_len, inner.num_samples - 1)
        ids = np.arange(lo, hi + 1, dtype=np.int64)
        begin = ids * seq_len
        starts = np.maximum(begin - first, 0)
        stops = np.minimum(begin + seq_len + 1 - first, last - first)
        return DocumentSamples(ids, starts, stops, np.maximum(first - begin, 0))
    packing = inner.packing
    window = _order_position(inner, doc) // int(inner.config.window_docs)
    b0, b1 = _int(packing.window_bins, window), _int(packing.window_bins, window + 1)
    item_bounds = _ints(packing.bin_items, b0, b1 + 1)
    i0, i1 = int(item_bounds[0]), int(item_bounds[-1])
    docs = _ints(packing.item_docs, i0, i1)
    pieces = _ints(packing.item_pieces, i0, i1)
    item_stops = np.minimum(pieces * seq_len + seq_len, _ints_at(inner.lengths, docs) + 1)
    sizes = item_stops - pieces * seq_len
    items = np.flatnonzero(docs == doc)
    bins = np.searchsorted(item_bounds, items + i0, side="right") - 1
    before = np.concatenate([[0], np.cumsum(sizes)])  # tokens of the window's items before each
    offsets = before[items] - before[item_bounds[bins] - i0]
    starts = pieces[items] * seq_len
    return DocumentSamples(bins + b0, starts, item_stops[items], offsets)


def _ints_at(arr: Any, idx: np.ndarray) -> np.ndarray:
    return np.asarray(arr[idx], dtype=np.int64) if idx.size else np.zeros(0, np.int64)


def _steps(plan: Plan, steps: range | tuple[int, int]) -> tuple[int, int]:
    if isinstance(steps, range):
        if steps.step != 1:
            raise ValueError(f"steps must be a range of consecutive steps, got {steps!r}")
        first, stop = steps.start, steps.stop
    else:
        first, stop = steps
    if not 0 <= first <= stop:
        raise ValueError(f"steps must be a range [first, stop) with 0 <= first <= stop, got {steps!r}")
    return int(first), int(stop)


def _reads(plan: Plan, positions: np.ndarray, first: int, stop: int) -> tuple[np.ndarray, ...]:
    """(keep, step, micro step, rank, row) of each global position; ``keep`` is False where the position's data step is
    skipped or its training step is outside ``[first, stop)`` (module doc, step 3)."""
    rows = plan._schedule
    seg_consumed = np.array([r[2] for r in rows], dtype=np.int64)
    seg = np.searchsorted(seg_consumed, positions, side="right") - 1
    first_step = np.array([r[0] for r in rows], dtype=np.int64)[seg]
    size = np.array([r[1] for r in rows], dtype=np.int64)[seg]
    into = positions - seg_consumed[seg]
    data = first_step + into // size
    offset = into % size
    per_micro = plan.world_size * plan.micro_batch_size
    skips = plan._skips
    step, keep = data.copy(), np.ones(len(data), dtype=bool)
    if skips:
        a = np.array([s[0] for s in skips], dtype=np.int64)
        b = np.array([s[1] for s in skips], dtype=np.int64)
        done = np.concatenate([[0], np.cumsum(b - a + 1)])  # skipped data steps in the ranges before range i
        i = np.searchsorted(a, data, side="right")  # ranges starting at or before d
        inside = (i > 0) & (data <= b[np.maximum(i - 1, 0)])
        keep &= ~inside
        step = data - done[i]
    keep &= (step >= first) & (step < stop)
    slot = _slots(plan, keep, step, offset)
    micro = plan.micro_batch_size
    return keep, step, slot // per_micro, (slot % per_micro) // micro, slot % micro


def _slots(plan: Plan, keep: np.ndarray, step: np.ndarray, offset: np.ndarray) -> np.ndarray:
    """The slot of each kept offset in its step: the offset itself, or through the inverse of a balanced plan's slot
    order (one order per step met)."""
    if plan.balance is None:
        return offset
    slot = offset.copy()
    for s in np.unique(step[keep]).tolist():
        sel = keep & (step == s)
        slot[sel] = np.argsort(plan.slot_order(s))[offset[sel]]
    return slot


def where(
    plan: Plan,
    layout: Layout | Sequence[Layout] | Mixture,
    doc: int,
    steps: range | tuple[int, int],
    source: int | None = None,
) -> list[Read]:
    """Every read of document ``doc`` by the training steps ``steps`` (a ``range`` or ``(first, stop)``), sorted by
    (step, micro step, rank, row, start).

    Args:
        plan: the plan (its stream may be a mixture).
        layout: the layout the plan's samples index; for a mixture, the sources' layouts (a list) or the mixture.
        doc: a document id (for a mixture: of source ``source``).
        steps: the training steps to search.
        source: for a mixture plan, the source the document belongs to; else None.

    Returns:
        The :class:`Read` records; reads by data steps in a skip range are left out (no training step reads them).
        Equal to the scan of :func:`~detsampler.locate.locate` over every step, micro step and rank of ``steps``
        (tests/test_where.py), at O(epochs met x pieces of the document) cost.
    """
    check_compatible(plan, layout)
    first, stop = _steps(plan, steps)
    lo, hi = plan.consumed(first), plan.consumed(stop)
    mixture = plan.stream if isinstance(plan.stream, Mixture) else None
    if mixture is None:
        if source is not None:
            raise ValueError("source= is for a plan over a mixture; this plan reads one layout")
        n = int(plan.stream.num_samples)
        p_lo, p_hi = lo, hi
        key_of = plan.stream.epoch_key  # type: ignore[attr-defined]
        version = plan.mapping_version
    else:
        if source is None or not 0 <= int(source) < mixture.num_sources:
            raise ValueError(f"the plan reads a mixture: name the document's source, in [0, {mixture.num_sources})")
        k = int(source)
        layout = _source_layouts(mixture, layout)[k]
        n = int(mixture.sizes[k])
        p_lo, p_hi = int(mixture.served(lo)[k]), int(mixture.served(hi)[k])
        base = mixture.source_key(k)
        key_of = lambda e: subkeys(base, e)
        version = mixture.version
    if p_hi <= p_lo:
        document_samples(layout, doc)  # type: ignore[arg-type]  # NOTE: a bad document id is refused all the same
        return []
    epochs = np.arange(p_lo // n, (p_hi - 1) // n + 1, dtype=np.int64)
    pieces, epoch = _pieces(layout, doc, epochs)
    if not len(pieces.sample_ids):
        return []
    within = unpermute(pieces.sample_ids, n, key_of(epoch), version)
    at = epoch * n + within
    inside = (at >= p_lo) & (at < p_hi)
    epoch, at = epoch[inside], at[inside]
    starts, stops, offsets = pieces.starts[inside], pieces.stops[inside], pieces.offsets[inside]
    ids = pieces.sample_ids[inside] + (epoch * n if hasattr(layout, "epoch_view") else 0)  # ids carry the epoch
    positions = at if mixture is None else mixture.global_positions(k, at)
    keep, step, micro, rank, row = _reads(plan, positions, first, stop)
    out = [
        Read(
            int(step[i]),
            int(micro[i]),
            int(rank[i]),
            int(row[i]),
            int(starts[i]),
            int(stops[i]),
            int(offsets[i]),
            int(positions[i]),
            int(ids[i]),
            int(epoch[i]),
        )
        for i in np.flatnonzero(keep).tolist()
    ]
    out.sort()
    return out


def _pieces(layout: Any, doc: int, epochs: np.ndarray) -> tuple[DocumentSamples, np.ndarray]:
    """The document's samples in each of ``epochs`` (one layout inverse for a layout without ``epoch_order``, repeated
    per epoch; else one per epoch, with that epoch's order), and the epoch of each."""
    if not hasattr(layout, "epoch_view"):
        one = document_samples(layout, doc)
        which = np.tile(np.arange(len(one.sample_ids)), len(epochs))
        picked = [getattr(one, f)[which] for f in ("sample_ids", "starts", "stops", "offsets")]
        return DocumentSamples(*picked), np.repeat(epochs, len(one.sample_ids))
    per = [document_samples(layout, doc, int(e)) for e in epochs.tolist()]
    fields = [np.concatenate([getattr(p, f) for p in per]) for f in ("sample_ids", "starts", "stops", "offsets")]
    return DocumentSamples(*fields), np.repeat(epochs, [len(p.sample_ids) for p in per])


def redaction_audit(plan: Plan, layout: Layout | Sequence[Layout] | Mixture, stop: int | None = None) -> list[dict]:
    """The audit trail of ``plan.redactions``: per redacted document (in order of ``from_step``, then source, then
    id), what the steps before its redaction trained on, from :func:`where`.

    Each entry: ``document``, ``from_step``, ``steps`` (the sorted distinct training steps in ``[0, min(from_step,
    stop))`` that read it), ``reads`` (the number of (step, micro step, rank, row) spans) and ``tokens`` (the input
    positions of those spans: the positions whose labels the redaction masks from ``from_step`` on); over a mixture
    (``layout``: the sources' layouts or the mixture) also ``source``, the document's source. ``stop``: the first step
    not trained (a checkpoint's step); None: up to ``from_step``.
    """
    mixture = plan.stream if isinstance(plan.stream, Mixture) else None
    layouts = _source_layouts(mixture, layout) if mixture is not None else [layout]
    out = []
    for redaction in plan.redactions or ():
        last = redaction.from_step if stop is None else min(redaction.from_step, int(stop))
        source = redaction.source
        seq_len = int(getattr(layouts[source or 0], "inner", layouts[source or 0]).config.seq_len)
        for doc in redaction.documents:
            reads = where(plan, layout, doc, (0, last), source=source)
            tokens = sum(min(r.stop - r.start, seq_len - r.offset) for r in reads)
            row = {} if source is None else {"source": source}
            row.update(
                {
                    "document": doc,
                    "from_step": redaction.from_step,
                    "steps": sorted({r.step for r in reads}),
                    "reads": len(reads),
                    "tokens": int(tokens),
                }
            )
            out.append(row)
    return out
