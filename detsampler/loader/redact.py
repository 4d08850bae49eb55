"""The torch form of :func:`detsampler.redaction.redaction_mask`: mask a micro batch's redacted labels in place, in a
training loop (:func:`redact_labels`, :func:`redact_step`) or in the loader itself (:class:`RedactedDataset`, which
every integration reads through when its plan redacts)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from detsampler.mixture import Mixture
from detsampler.plan import Plan
from detsampler.redaction import Blocklist, Redaction

__all__ = ["RedactedDataset", "device_mask", "redact_labels", "redact_step", "step_sources", "trained_labels"]


def redact_labels(
    batch: dict[str, Any], step: int, redactions: Sequence[Redaction] | Blocklist | None, sources: Any = None
) -> int:
    """Set ``batch["labels"]`` to ``-100`` wherever ``batch["document_ids"]`` names a document redacted at training
    step ``step``; return the number of labels that changed (not already ``-100``). Vectorized: on CPU through numpy
    views and :meth:`Blocklist.mask` (a lookup table), on another device ``torch.isin`` there; nothing else in the batch
    changes, so every step reads what it read without the redactions.

    ``batch`` is a :class:`~detsampler.loader.dataset.PackedDataset` micro batch (``output="fields"``: the
    ``tokens`` output has no ``document_ids``), or a :class:`~detsampler.loader.mixture_dataset.MixtureDataset` one:
    then the redactions name sources and ``sources`` is the source of each row (``[B]`` ints: :func:`step_sources`, or
    ``mixture.split_ids(sample_ids)[0]``), since a row's ``document_ids`` are its source's. In a loop, pass
    ``Blocklist(plan.redactions)``, built once: a list of redactions is prepared again at every call."""
    blocklist = redactions if isinstance(redactions, Blocklist) else Blocklist(redactions or ())
    in_force = blocklist.in_force(step)
    if not in_force:
        return 0
    if "document_ids" not in batch or "labels" not in batch:
        raise ValueError("redact_labels needs a batch with labels and document_ids (PackedDataset output='fields')")
    doc_ids, labels = batch["document_ids"], batch["labels"]
    loss_mask = batch.get("loss_mask")  # chat data: kept equal to labels != -100
    if doc_ids.device.type == "cpu" and labels.device.type == "cpu" and not labels.requires_grad:
        # NOTE: numpy views of the tensors (masked in place): on CPU, torch.isin is ~8x slower than the table
        mask = blocklist.mask(doc_ids.numpy(), step, sources)
        if loss_mask is not None:
            loss_mask.masked_fill_(torch.from_numpy(mask), False)
        values = labels.numpy()
        mask &= values != -100
        np.putmask(values, mask, -100)
        return int(np.count_nonzero(mask))
    mask = device_mask(blocklist, doc_ids, step, sources)
    if loss_mask is not None:
        loss_mask.masked_fill_(mask, False)
    mask &= labels != -100
    changed = int(mask.sum())
    labels.masked_fill_(mask, -100)
    return changed


def device_mask(blocklist: Blocklist, doc_ids: torch.Tensor, step: int, sources: Any = None) -> torch.Tensor:
    """:meth:`Blocklist.mask` computed with ``torch.isin`` on ``doc_ids``' device (one call per source in force)."""
    rows = blocklist.rows(step, sources, tuple(doc_ids.shape))
    in_force = blocklist.in_force(step)
    if rows is None:
        blocked = in_force[0][1] if in_force else np.zeros(0, dtype=np.int64)
        return torch.isin(doc_ids, torch.as_tensor(blocked, device=doc_ids.device, dtype=doc_ids.dtype))
    row_shape = np.shape(sources) + (1,) * (doc_ids.dim() - np.ndim(sources))
    rows = rows.reshape(row_shape)
    mask = torch.zeros(doc_ids.shape, dtype=torch.bool, device=doc_ids.device)
    for k, blocked in in_force:
        hit = torch.isin(doc_ids, torch.as_tensor(blocked, device=doc_ids.device, dtype=doc_ids.dtype))
        mask |= hit & torch.as_tensor(rows == k, device=doc_ids.device)
    return mask


def step_sources(plan: Plan, step: int, rank: int) -> np.ndarray | None:
    """The mixture source of every row ``rank`` reads at ``step``: int64 ``[num_micro_steps, micro_batch_size]``
    (row ``a`` is micro step ``a``'s), from the plan's sample ids (one stream call for the step); None for a plan over
    one index."""
    if not isinstance(plan.stream, Mixture):
        return None
    ids, _ = plan.micro_batches_from(step, 0, rank, plan.num_micro_steps(step))
    return plan.stream.split_ids(ids)[0]


def redact_step(micro_batches: Sequence[dict[str, Any]], step: int, blocklist: Blocklist, plan: Plan, rank: int) -> int:
    """:func:`redact_labels` on each of ``rank``'s micro batches of ``step`` (in place), with each row's source from
    the plan when it reads a mixture; the micro batches are the step's last ones (all of them, or those left after a
    mid-step resume). Returns the number of labels masked."""
    if not blocklist.in_force(step):
        return 0
    sources = step_sources(plan, step, rank)
    if sources is not None and len(micro_batches) > len(sources):
        raise ValueError(f"step {step} has {len(sources)} micro steps, got {len(micro_batches)} micro batches")
    first = 0 if sources is None else len(sources) - len(micro_batches)
    return sum(
        redact_labels(mb, step, blocklist, None if sources is None else sources[first + a])
        for a, mb in enumerate(micro_batches)
    )


class RedactedDataset(torch.utils.data.Dataset):
    """``dataset`` read with ``plan``'s redactions applied, in the loader: each micro batch's labels are masked
    (:func:`redact_labels`; ``loss_mask`` too) at the training step it is read for, before any collator or trainer sees
    it, so a trainer's count of targets (Hugging Face's ``num_items_in_batch``, torchtitan's ``global_valid_tokens``)
    never counts a redacted one.

    The step comes with the sample ids: a :class:`~detsampler.loader.sampler.DeterministicBatchSampler` yields
    :class:`~detsampler.loader.sampler.PlannedIds`, which carry it into DataLoader workers; over a mixture each row's
    source comes from its sample id (``Mixture.split_ids``). A read without a step (``dataset[i]``, plain lists of
    ids) is refused, never served unmasked. ``dataset``: a PackedDataset or MixtureDataset (``output="fields"``: token
    ids alone carry no document ids), or any map-style dataset whose batched reads hold ``labels`` and
    ``document_ids``."""

    def __init__(self, dataset: Any, plan: Plan) -> None:
        datasets = getattr(dataset, "datasets", [dataset])
        if any(getattr(ds, "output", "fields") != "fields" for ds in datasets):
            raise ValueError(
                "the plan redacts documents, and redaction masks labels by their document_ids: read output='fields'"
                " (output='tokens' holds token ids alone)"
            )
        self.dataset, self.plan = dataset, plan
        self.blocklist = Blocklist(plan.redactions or ())
        self._mixture = plan.stream if isinstance(plan.stream, Mixture) else None

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        raise TypeError(
            "a RedactedDataset masks labels by the training step, which a single index does not carry: read it with"
            " batch_sampler=DeterministicBatchSampler(plan, rank)"
        )

    def __getitems__(self, ids: Sequence[int]) -> Any:
        step = getattr(ids, "step", None)
        if step is None:
            raise ValueError(
                f"a RedactedDataset read sample ids without their training step ({type(ids).__name__}): read it with"
                " batch_sampler=DeterministicBatchSampler(plan, rank), whose micro batches carry their step"
            )
        return self.read(ids, step)

    def read(self, ids: Sequence[int], step: int) -> Any:
        """The samples ``ids`` read for training step ``step``, with the redactions in force there applied."""
        if hasattr(self.dataset, "__getitems__"):
            read = self.dataset.__getitems__(ids)
        else:
            read = [self.dataset[i] for i in ids]
        sources = None if self._mixture is None else self._mixture.split_ids(np.asarray(ids, dtype=np.int64))[0]
        batch = getattr(read, "batch", None)
        for row, fields in enumerate([batch] if isinstance(batch, dict) else read):  # else per-sample dicts
            if not isinstance(fields, dict) or "labels" not in fields or "document_ids" not in fields:
                got = sorted(fields) if isinstance(fields, dict) else type(fields).__name__
                raise ValueError(
                    f"the plan redacts documents, which masks labels by their document_ids: the dataset's samples hold"
                    f" {got}, not labels and document_ids"
                )
            row_sources = sources if isinstance(batch, dict) or sources is None else sources[row]
            redact_labels(fields, step, self.blocklist, row_sources)
        return read


def trained_labels(dataset: Any, reads: Sequence[Any], doc: int, chunk: int = 256) -> int | None:
    """How many labels the reads ``reads`` of document ``doc`` trained: at each read's positions (``where``'s
    :class:`~detsampler.where.Read`: the span ``[offset, offset + stop - start)`` of row ``sample_id``, cut at
    ``seq_len``), the labels ``dataset`` gives that are not -100 (a chat index's untrained turns, the layout's document
    ends, the instance filter's flagged samples excluded). What a takedown report needs: the tokens the model was
    trained to predict, not the tokens it read. ``dataset``: the PackedDataset the reads index (the run's, its instance
    filter included); read ``chunk`` samples at a time (bounded memory). A document erased since (its labels masked
    now) is counted from its erasure record (:func:`_trained_when_stored`); None when that cannot be known."""
    if doc in getattr(dataset.index, "erased_documents", ()):
        return _trained_when_stored(dataset, reads, doc)
    total = 0
    for first in range(0, len(reads), chunk):
        part = reads[first : first + chunk]
        batch = dataset.get_batch([r.sample_id for r in part])
        labels, docs = batch["labels"].numpy(), batch["document_ids"].numpy()
        offsets = np.array([r.offset for r in part], dtype=np.int64)[:, None]
        ends = offsets + np.array([r.stop - r.start for r in part], dtype=np.int64)[:, None]
        columns = np.arange(labels.shape[1])
        inside = (columns >= offsets) & (columns < ends)
        total += int(np.count_nonzero(inside & (docs == doc) & (labels != -100)))
    return total


def _trained_when_stored(dataset: Any, reads: Sequence[Any], doc: int) -> int | None:
    """The labels the reads of erased document ``doc`` trained before its erasure, from what the loader's labels are
    (``tests/test_erase.py`` checks it equal to the count over the batches read before): an input position ``t`` of a
    read trains the target ``t + 1`` when it lies in the read's span and is a trained target (plain text: every token
    and the EOS; chat data: the recorded ``trained_runs``, and the EOS under policies ``all``/``completion``), and, at
    the span's end, only under ``concat`` over plain text (the label crosses into the next document). None under an
    instance filter: whether a read's sample was flagged before the erasure depended on the document's tokens, which
    are gone (the filter leaves the erased positions out now, so the verdict after it may differ)."""
    index, layout = dataset.index, dataset.layout
    if dataset.instance_filter is not None:
        return None
    length, seq_len, chat = int(index.lengths[doc]), int(layout.config.seq_len), getattr(index, "chat", None)
    target = np.ones(length + 1, dtype=bool)  # target position p of the document; p == length is its EOS
    if chat is not None:
        record = next(r for r in index.erasures if doc in r["documents"])
        runs = (record.get("trained_runs") or {}).get(str(doc))
        if runs is None:
            return None
        target[:] = False
        for a, b in runs:
            target[a:b] = True
        target[length] = chat.eos_trained
    crosses = bool(layout.labels_cross_documents) and chat is None
    total = 0
    for r in reads:
        last = r.start + min(r.stop - r.start, seq_len - r.offset)  # the target of the read's last input position
        total += int(target[r.start + 1 : min(last, r.stop - 1) + 1].sum())
        total += int(crosses and last == r.stop)
    return total
