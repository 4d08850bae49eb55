"""The torch adapter over a token index and a layout: ``PackedDataset[sample_id]`` is a packed training sample.

Per sample (all int64 tensors of length ``seq_len``):

- ``input_ids``: tokens; ``pad_id`` on padding.
- ``labels``: the next token. ``concat``: the stream's next token everywhere (a sample reads ``seq_len + 1`` positions;
  over a chat index, -100 at each example's EOS: no label crosses from one example into the next).
  ``document`` / ``bestfit``: the next token within the same piece of a document, ``-100`` at each piece's last position
  and on padding (no label ever crosses a document boundary).
- ``position_ids``: with ``restart_position_ids`` (the default for ``document`` and ``bestfit``), the position within
the
  contiguous piece of a document the sample holds, so they restart at 0 at each document start (and at a sample start);
  otherwise ``0 .. seq_len-1``.
- ``document_ids``: the document each position comes from, ``-1`` on padding.

With ``output="tokens"`` (``concat`` only) a sample is instead ``tokens``: its ``seq_len + 1`` token ids in the index's
stored dtype (``uint16`` for a vocabulary of up to 65,536 pieces), so that ``tokens[:, :-1]`` are the inputs and
``tokens[:, 1:]`` the labels of the four-field output, exactly; positions restart nowhere and every position is one
document's (``concat`` has no padding). A quarter of the int64 input ids' bytes, an eighth with the labels, one
slice copy per span and nothing else: widen on the device (``batch["tokens"].to(device).long()``).

``__getitems__`` reads a whole micro batch at once (:func:`detsampler.gather.pack_fields`, a slice copy per span) from
the index's memory map, or, when the index stores no tokens, by tokenizing the batch's distinct documents from the
dataset's text (with the index's BOS/EOS policy) and checking each length against the index (a difference is an error,
never a silently shifted sample). The index is any :class:`~detsampler.index.protocol.Index` (a ``TokenIndex``, a
``ShardedIndex`` or a pre-tokenized source of :mod:`detsampler.index.sources`, on disk or in an object store: anything
with ``lengths``, ``offsets``, ``tokens``, ``eos_id``, ``pad_id``, ``eos_stored``).

On the fly, each document is tokenized whole when a sample needs it and kept in a per-worker cache (bounded by
``cache_tokens``, least recently used out first), so a document split across samples is tokenized once while it stays
in the cache. With the ``document`` or ``bestfit`` layout and documents shorter than ``seq_len`` every document is in
exactly one sample: each is tokenized once an epoch, as a streaming loader does. Documents longer than a sample under
``concat`` are tokenized again for each sample that touches them once evicted (a 2048-token piece of a 200k-token
document costs its whole tokenization): that mode trades disk for CPU, which DataLoader workers supply.
"""

from __future__ import annotations

import contextlib
import os
import sys
import weakref
from collections.abc import Iterator, Sequence
from collections.abc import Sequence as SequenceABC
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, get_worker_info
from torch.utils.data._utils.collate import default_collate

from detsampler.filter import RepetitionFilter
from detsampler.gather import FIELDS, IGNORE_INDEX, pack_fields, pack_tokens
from detsampler.index.format import TokenIndexError, token_dtype
from detsampler.index.protocol import Index
from detsampler.index.tokenize import check_texts
from detsampler.layout import Layout, LayoutConfig, make_layout
from detsampler.loader.erased import erased_positions, mask_erased
from detsampler.loader.prefetch import PrefetchConfig, Prefetcher, PrefetchStats, make_prefetcher, target_of
from detsampler.loader.token_cache import TokenCache
from detsampler.plan import Plan
from detsampler.text.chat import render_examples
from detsampler.text.protocol import TokenizerLike

__all__ = ["FIELDS", "OUTPUTS", "MicroBatch", "PackedDataset", "collate_micro_batch", "instance_filter_counts"]

OUTPUTS = ("fields", "tokens")  # what a sample is: the four int64 FIELDS, or its token ids alone (concat)


class MicroBatch(SequenceABC):
    """What ``__getitems__`` returns: a sequence of per-sample dicts (views into ``batch``, made only when asked for)
    for the default collate, and ``batch``, the dict of ``[B, seq_len]`` tensors that :func:`collate_micro_batch`
    returns without any per-sample work."""

    def __init__(self, batch: dict[str, torch.Tensor]) -> None:
        self.batch = batch
        self._len = len(next(iter(batch.values())))

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, i: int | slice) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self._len))]
        return {k: v[i] for k, v in self.batch.items()}


def collate_micro_batch(samples: Sequence[Any]) -> Any:
    """A DataLoader ``collate_fn`` that passes a :class:`MicroBatch` through as its batched dict
    (else default_collate)."""
    if isinstance(samples, MicroBatch):
        return samples.batch
    return default_collate(samples)


class PackedDataset(Dataset):
    """Map-style dataset of the samples of ``layout`` over ``index``: ``len(ds) == layout.num_samples``.

    When ``index.tokens`` is None (built with ``store_tokens=False``), ``dataset`` and ``tokenizer`` (the ones the index
    was built from, which is checked) supply the text and the tokenization. ``output`` is ``"fields"`` (the four int64
    fields) or ``"tokens"`` (``concat`` only: the ``seq_len + 1`` token ids in the index's stored dtype).

    Over a chat index (``index.chat``, see :mod:`detsampler.text.chat`) a batch also holds ``loss_mask`` (bool
    ``[B, seq_len]``): True exactly where the label at that position is a trained token; with ``output="fields"``
    ``labels`` are -100 wherever it is False (so ``loss_mask == (labels != -100)``), with ``output="tokens"`` it is the
    mask of ``tokens[:, 1:]``. Read from ``loss_mask.npy`` beside the tokens, or rendered with them on the fly;
    likewise over a pre-tokenized source opened with its mask (``open_source(..., loss_mask=PATH)``: OLMo-core label
    masks, datatrove ``.loss`` files). Each example of a chat index is one document, and no trained label crosses from
    one into the next in any layout: the label at an example's last position (its EOS) is -100, ``concat`` included,
    as TRL's padding-free collator makes it (an example's first token is no target: nothing of its example precedes
    it). A pre-tokenized source's mask is laid out as its peer reads it (their ``concat`` windows cross documents).

    With ``prefetch=PrefetchConfig(...)`` and the ``plan`` the batch sampler reads, an index in an object store is read
    ahead: each process (each DataLoader worker) fetches the blocks of the micro batches it reads next into a bounded
    cache that evicts by next use (:mod:`detsampler.loader.prefetch`); the batches are the same, byte for byte.
    :meth:`prefetch_stats` says what this process fetched; a local index is read from its memory map as always.
    """

    def __init__(
        self,
        index: Index,
        layout: Layout,
        *,
        restart_position_ids: bool | None = None,
        dataset: Any = None,
        tokenizer: TokenizerLike | None = None,
        text_column: str = "text",
        cache_tokens: int = 1 << 22,
        output: str = "fields",
        instance_filter: RepetitionFilter | None = None,
        instance_mask: bool = False,
        prefetch: PrefetchConfig | None = None,
        plan: Plan | None = None,
    ) -> None:
        _check_output(output, layout)
        _check_prefetch(prefetch, plan, layout)
        if instance_filter is not None and not isinstance(instance_filter, RepetitionFilter):
            raise TypeError(f"instance_filter must be a RepetitionFilter or None, got {type(instance_filter).__name__}")
        if not isinstance(instance_mask, (bool, np.bool_)):
            raise ValueError(f"instance_mask must be True or False, got {instance_mask!r}")
        if instance_mask and instance_filter is None:
            raise ValueError("instance_mask=True needs an instance_filter")
        if restart_position_ids is not None and not isinstance(restart_position_ids, (bool, np.bool_)):
            raise ValueError(
                f"Got restart_position_ids {restart_position_ids!r} ({type(restart_position_ids).__name__}),"
                " restart_position_ids must be True, False or None (the layout's default)"
            )
        if not _layout_matches(layout, index):
            raise ValueError(
                f"the layout was made over other document lengths ({layout.num_documents} documents) than the index "
                f"{str(index.path)!r} ({index.num_documents} documents): make it with index.layout(config)"
            )
        self.index = index
        self.layout = layout
        self.kind = layout.config.kind
        self.seq_len = layout.config.seq_len
        self.restart_position_ids = (
            not layout.labels_cross_documents if restart_position_ids is None else bool(restart_position_ids)
        )
        self.dataset = dataset
        self.tokenizer = tokenizer
        self.text_column = text_column
        self.cache_tokens = int(cache_tokens)
        self.output = output
        self.instance_filter = instance_filter
        self.instance_mask = bool(instance_mask) or (instance_filter is not None and output == "tokens")
        self.token_dtype = np.dtype(index.tokens.dtype) if index.tokens is not None else token_dtype(index.vocab_size)
        self._cache = TokenCache(self.cache_tokens)
        self._eos_stored = bool(getattr(index, "eos_stored", False))
        self._texts = None
        self._chat = getattr(index, "chat", None)
        # NOTE: an index's erasures are read with its meta.json when it is opened: fixed for this dataset's life
        self._erased = np.asarray(getattr(index, "erased_documents", ()), dtype=np.int64)
        self.prefetch, self.plan = prefetch, plan
        self._prefetcher: tuple[int, Prefetcher | None] | None = None  # (pid, its prefetcher): made in each process
        if dataset is not None:
            columns = [text_column] if self._chat is None else list(self._chat.columns)
            index.check_dataset(dataset, text_column if self._chat is None else None)
            self._texts = dataset.with_format(None).select_columns(columns)
        if tokenizer is not None:
            index.check_tokenizer(tokenizer)
        if index.tokens is None and (dataset is None or tokenizer is None):
            raise ValueError(
                f"index {str(index.path)!r} stores no tokens (store_tokens=False): pass dataset= and tokenizer= (the"
                " ones it was built from) to tokenize samples on the fly"
            )

    def __reduce__(self):
        # NOTE: a persisted layout pickles as (index path, config) and a worker reopens its memory maps: O(1) whatever
        # the corpus. An in-RAM layout (make_layout, small corpora) is recomputed from its config in the worker.
        layout = self.layout if hasattr(self.layout, "index_fingerprint") else self.layout.config
        kwargs = dict(
            restart_position_ids=self.restart_position_ids,
            dataset=self.dataset,
            tokenizer=self.tokenizer,
            text_column=self.text_column,
            cache_tokens=self.cache_tokens,
            output=self.output,
            instance_filter=self.instance_filter,
            instance_mask=self.instance_mask and self.output == "fields",
            prefetch=self.prefetch,
            plan=self.plan,
        )
        return (_rebuild, (self.index, layout, kwargs))

    def __len__(self) -> int:
        return self.layout.num_samples

    def __getitem__(self, sample_id: int) -> dict[str, torch.Tensor]:
        return {k: v[0] for k, v in self.get_batch([sample_id]).items()}

    def __getitems__(self, sample_ids: Sequence[int]) -> MicroBatch:
        return MicroBatch(self.get_batch(sample_ids))

    # -- the batch read

    def _token_source(self, doc_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, Any, Any]:
        """Per span: where its document's tokens start in the flat array, its length; ``read(starts, stops)``, the
        flat array once the element ranges ``[starts[j], stops[j])`` are checked (stored tokens: their chunks' CRC-32;
        on the fly: the array just tokenized); and for a chat index the same reader of the loss mask (else None)."""
        lengths = np.asarray(self.index.lengths[doc_ids], dtype=np.int64)
        if self.index.tokens is not None:
            read, read_mask = self._stored_readers()
            return np.asarray(self.index.offsets[doc_ids], dtype=np.int64), lengths, read, read_mask
        unique, inverse = np.unique(doc_ids, return_inverse=True)
        parts = self._cache.get_many(unique.tolist())
        missing = [i for i, part in enumerate(parts) if part is None]
        if missing:
            for i, part in zip(missing, self._tokenize(unique[missing])):
                parts[i] = part
            self._cache.put_many(unique[missing].tolist(), [parts[i] for i in missing])
        sizes = np.fromiter((p.shape[-1] for p in parts), dtype=np.int64, count=len(parts))
        starts = np.zeros(len(unique) + 1, dtype=np.int64)
        np.cumsum(sizes, out=starts[1:])
        shape = (0,) if self._chat is None else (2, 0)
        flat = np.concatenate(parts, axis=-1) if parts else np.zeros(shape, dtype=np.int64)
        if self._chat is None:
            return starts[inverse.reshape(-1)], lengths, lambda a, b: flat, None
        return starts[inverse.reshape(-1)], lengths, lambda a, b: flat[0], lambda a, b: flat[1]

    def _stored_readers(self) -> tuple[Any, Any]:
        """``read(starts, stops)`` of the stored tokens (their chunks checked) and of the loss mask (a chat index's, or
        a pre-tokenized source's; None without one)."""
        tokens = self.index.tokens
        read = getattr(tokens, "checked_ranges", None) or (lambda starts, stops: tokens)
        mask = getattr(self.index, "loss_mask", None)
        read_mask = None if mask is None else getattr(mask, "checked_ranges", None) or (lambda a, b: mask)
        return read, read_mask

    def _tokenize(self, docs: np.ndarray) -> list[np.ndarray]:
        """The stored tokens of documents ``docs`` (the index's BOS/EOS policy applied), each
        checked against the index; for a chat index, each a ``[2, n]`` array: the tokens and their loss mask."""
        rows = self._texts[docs.tolist()]
        policy = self.index.special_tokens
        bos, eos = self.tokenizer.bos_id, self.tokenizer.eos_id
        mask = None
        if self._chat is None:
            texts = rows[self.text_column]
            for i, text in enumerate(texts):  # per document, not per token: name the bad one
                if not isinstance(text, str):
                    check_texts([text], int(docs[i]), self.text_column)
            got, flat = policy.apply(self.tokenizer.encode_batch(texts), bos, eos)
        else:
            ids, masks = render_examples(self.tokenizer, rows, int(docs[0]), self._chat, self._chat.chat_template)
            got, flat = policy.apply(ids, bos, eos)
            _, mask = policy.apply(masks, 0, int(self._chat.eos_trained))
        want = np.asarray(self.index.lengths[docs], dtype=np.int64)
        if not np.array_equal(got, want):
            k = int(np.flatnonzero(got != want)[0])
            raise TokenIndexError(
                f"document {int(docs[k])} tokenizes to {int(got[k])} tokens on the fly but the index"
                f" {str(self.index.path)!r} recorded {int(want[k])}: the dataset or tokenizer differs from the build's;"
                " build the index again"
            )
        ends = np.cumsum(got + int(policy.eos_stored))
        if mask is None:
            return np.split(flat, ends[:-1])
        return np.split(np.stack([flat, mask]), ends[:-1], axis=1)

    # -- prefetch
    def _lookahead(self) -> Prefetcher | None:
        """This process's prefetcher (made on its first batch: a DataLoader worker makes its own), or None."""
        if self.prefetch is None:
            return None
        if self._prefetcher is None or self._prefetcher[0] != os.getpid() or getattr(self._prefetcher[1], "closed", 0):
            media = getattr(self.index, "media_objects", None)  # a media index's images in a bucket
            target = target_of(self.index, self.layout, own=media(self.layout) if media is not None else None)
            made = make_prefetcher([target], self.plan, self.prefetch, where=str(self.index.path))
            if made is not None:  # NOTE: its threads hold the prefetcher, not this dataset: collecting it stops them
                weakref.finalize(self, _close_prefetcher, weakref.ref(made))
            self._prefetcher = (os.getpid(), made)  # None: nothing in an object store, nothing to prefetch
        return self._prefetcher[1]

    def prefetch_stats(self) -> PrefetchStats | None:
        """What this process's prefetcher did, or did until :meth:`close` (None without prefetch, before the first
        batch, or for an index that is not in an object store)."""
        made = self._prefetcher[1] if self._prefetcher and self._prefetcher[0] == os.getpid() else None
        return None if made is None else made.summary()

    def close(self) -> None:
        """Stop this process's prefetcher (its threads, after the fetches under way); a later batch makes a new one."""
        if self._prefetcher and self._prefetcher[0] == os.getpid() and self._prefetcher[1] is not None:
            self._prefetcher[1].close()

    def get_batch(self, sample_ids: Sequence[int] | np.ndarray) -> dict[str, torch.Tensor]:
        """The samples ``sample_ids`` as a dict of ``[len(sample_ids), seq_len]`` int64 tensors, or with
        ``output="tokens"`` ``{"tokens": [len(sample_ids), seq_len + 1]}`` in the stored dtype (see the module doc)."""
        with self.reading(sample_ids) as (batch, _):
            return batch

    @contextlib.contextmanager
    def reading(self, sample_ids: Sequence[int] | np.ndarray) -> Iterator[tuple[dict[str, torch.Tensor], dict]]:
        """:meth:`get_batch`'s batch and the objects the prefetcher holds this micro batch's blocks of, by URL (a
        media index's image sources; empty without prefetch or when it was not planned), held until the block exits:
        what else the micro batch reads (its images) is read through them inside it."""
        raw = np.asarray(sample_ids)
        if raw.size and raw.dtype.kind not in "iu":
            raise TypeError(f"sample ids must be integers, got {raw.dtype} values such as {raw.reshape(-1)[0]!r}")
        ids = raw.astype(np.int64, copy=False).reshape(-1)
        lookahead = self._lookahead()
        planned = None if lookahead is None else lookahead.take(sample_ids)
        try:
            batch = self._read_batch(ids, None if planned is None else (planned.reads[0], lookahead.readers(0)))
            yield batch, {} if planned is None else lookahead.held(0)
        finally:
            if planned is not None:
                lookahead.done(planned)

    def _read_batch(self, ids: np.ndarray, ahead: tuple | None = None) -> dict[str, torch.Tensor]:
        """The batch of ``ids``; ``ahead``: what a prefetcher planned for them (their spans, document starts and
        lengths) and its readers of the tokens and the loss mask (None: this dataset's own)."""
        if ahead is None:
            spans = self.layout.locate(ids)
            doc_starts, doc_lengths, read, read_mask = self._token_source(spans.doc_ids)
        else:  # the spans planned ahead, the tokens through the prefetcher's cache
            (spans, doc_starts, doc_lengths), (read, read_mask) = ahead[0], ahead[1]
            if self.index.tokens is None:  # tokenized on the fly: where each document starts in what was tokenized
                doc_starts, doc_lengths, read, read_mask = self._token_source(spans.doc_ids)
            else:  # an array not in an object store is read from its memory map
                own = self._stored_readers()
                read, read_mask = read or own[0], read_mask or own[1]
        masking = {"mask_read": read_mask, "mask_examples": self._chat is not None}  # chat: no label crosses examples
        if read_mask is not None:  # laid out in the same pass as the tokens
            masking["mask_eos"] = int(self._chat.eos_trained if self._chat is not None else self.index.loss_mask_eos)
        source = (spans, doc_starts, doc_lengths, read)
        if self.output == "tokens":
            return self._tokens_batch(source, masking)
        return self._fields_batch(source, masking)

    def _tokens_batch(self, source: tuple, masking: dict) -> dict[str, torch.Tensor]:
        """``output="tokens"``: the token ids in the stored dtype (and a chat index's ``loss_mask``)."""
        spans, doc_starts, doc_lengths, read = source
        num_samples, sample_len = len(spans), self.layout.sample_len
        tokens = _new_block((num_samples, sample_len), self.token_dtype)
        mask_grid = None if masking["mask_read"] is None else np.empty((num_samples, sample_len), dtype=np.uint8)
        pack_tokens(
            spans,
            sample_len,
            doc_starts,
            doc_lengths,
            read,
            eos_id=self.index.eos_id,
            eos_stored=self._eos_stored,
            out=tokens.numpy(),
            mask_out=mask_grid,
            **masking,
        )
        out = {"tokens": tokens}
        if mask_grid is not None:
            out["loss_mask"] = torch.from_numpy(mask_grid[:, 1:] != 0)
        if self.instance_filter is not None:
            valid = self._not_erased(spans, sample_len - 1)
            out["instance_mask"] = torch.from_numpy(~self.instance_filter.flags(tokens.numpy()[:, :-1], valid))
        return self._without_erased(out, spans)

    def _fields_batch(self, source: tuple, masking: dict) -> dict[str, torch.Tensor]:
        """The four int64 fields in one block (a chat index's labels masked in the same pass, and its ``loss_mask``);
        the instance filter's flagged samples' labels -100."""
        spans, doc_starts, doc_lengths, read = source
        block = _new_block((len(FIELDS), len(spans), self.seq_len), np.dtype(np.int64))
        fields = block.numpy()
        masked = masking["mask_read"] is not None
        pack_fields(
            spans,
            self.seq_len,
            self.layout.sample_len,
            doc_starts,
            doc_lengths,
            read,
            eos_id=self.index.eos_id,
            pad_id=self.index.pad_id,
            eos_stored=self._eos_stored,
            labels_cross_documents=self.layout.labels_cross_documents,
            restart_position_ids=self.restart_position_ids,
            out=fields,
            mask_labels=masked,
            **masking,
        )
        batch = dict(zip(FIELDS, block.unbind(0)))
        labels = fields[FIELDS.index("labels")]
        if self.instance_filter is not None:
            # padding is each sample's tail (after its last span): the positions before it are its spans' tokens
            lengths = None if self.layout.labels_cross_documents else spans.num_tokens
            inputs = fields[FIELDS.index("input_ids")]
            valid = _not_images(self.index, inputs, self._not_erased(spans, self.seq_len))
            flagged = self.instance_filter.flags(inputs, valid=valid, lengths=lengths)
            if flagged.any():
                labels[flagged] = IGNORE_INDEX
            if self.instance_mask:
                batch["instance_mask"] = torch.from_numpy(~flagged)
        if masked:
            batch["loss_mask"] = torch.from_numpy(labels != IGNORE_INDEX)
        return self._without_erased(batch, spans)

    def _not_erased(self, spans: Any, width: int) -> np.ndarray | None:
        """Where the instance filter may compare tokens, padding aside: every position of the ``width`` first of each
        sample but the erased documents' (their pad ids equal nothing, as padding's do: an erasure never steers the
        verdict); None, at no cost, when no span of the batch is an erased document's."""
        grid = erased_positions(spans, self._erased, width)
        return None if grid is None else ~grid

    def _without_erased(self, batch: dict[str, torch.Tensor], spans: Any) -> dict[str, torch.Tensor]:
        """The labels of the index's erased documents masked (:mod:`detsampler.loader.erased`)."""
        if not len(self._erased):
            return batch
        return mask_erased(batch, spans, self._erased, self.layout.labels_cross_documents, self.layout.sample_len)


class _BlockPool:
    """The main process's batch blocks, reused: a block is handed out again only once nothing references its memory
    (every tensor made from it, every view, every numpy array of those, gone: the storage that ``torch.from_numpy``
    makes holds a reference to the array until its last tensor is freed). A fresh 4 MiB block costs its page faults
    on every batch (~1,000 at 64 x 2,048 int64); a reused one costs none. At most ``per_shape`` blocks per shape and
    ``shapes`` shapes are kept (the last shapes asked)."""

    def __init__(self, per_shape: int = 4, shapes: int = 4) -> None:
        self.per_shape, self.shapes = per_shape, shapes
        self._blocks: dict[tuple, list[np.ndarray]] = {}
        self._blocks[()] = [np.empty(0)]  # NOTE: held by the list alone, as a free block is
        self._free_refs = self._refs(())  # calibrated on this interpreter: the count of a block nothing else holds
        del self._blocks[()]

    def _refs(self, key: tuple) -> int:
        for block in self._blocks[key]:
            return sys.getrefcount(block)
        return 0

    def take(self, shape: tuple[int, ...], dtype: np.dtype) -> torch.Tensor:
        key = (shape, np.dtype(dtype).str)
        blocks = self._blocks.pop(key, [])
        self._blocks[key] = blocks  # the last key asked is the newest
        for block in blocks:
            if sys.getrefcount(block) <= self._free_refs:
                return torch.from_numpy(block)
        block = np.empty(shape, dtype=dtype)
        if len(blocks) < self.per_shape:
            blocks.append(block)
        while len(self._blocks) > self.shapes:
            del self._blocks[next(iter(self._blocks))]
        return torch.from_numpy(block)


_POOL = _BlockPool()


def _not_images(index: Index, input_ids: np.ndarray, valid: np.ndarray | None = None) -> np.ndarray | None:
    """Where the instance filter compares tokens: ``valid`` (None: everywhere) less a media index's image tokens. An
    image is a run of one placeholder token as long as its token count (64 and more): never a repetition of text, so
    its positions equal nothing, as padding's do (:mod:`detsampler.filter`)."""
    image_id = getattr(index, "image_token_id", None)
    if image_id is None:
        return valid
    text = input_ids != image_id
    return text if valid is None else valid & text


def _new_block(shape: tuple[int, ...], dtype: np.dtype) -> torch.Tensor:
    """An uninitialized tensor of numpy ``dtype`` for a batch: one storage, so a DataLoader worker hands the batch over
    in one block; in a worker it is allocated in shared memory at once (as torch's own collate does), so handing it
    over copies nothing; in the main process a block of the pool that nothing references any more (no page faults)."""
    if get_worker_info() is None:
        return _POOL.take(shape, dtype)
    proto = torch.from_numpy(np.empty(0, dtype=dtype))
    storage = proto._typed_storage()._new_shared(int(np.prod(shape)), device=proto.device)
    return proto.new(storage).view(shape)


def _close_prefetcher(ref: weakref.ref) -> None:
    made = ref()
    if made is not None:
        made.close()


def _check_prefetch(prefetch: PrefetchConfig | None, plan: Plan | None, layout: Layout) -> None:
    if prefetch is None:
        return
    if not isinstance(prefetch, PrefetchConfig):
        raise TypeError(f"prefetch must be a PrefetchConfig or None, got {type(prefetch).__name__}")
    if not isinstance(plan, Plan):
        raise ValueError(
            f"prefetch reads ahead the micro batches of the plan: pass plan= (the Plan the batch sampler reads), got"
            f" {type(plan).__name__}"
        )
    if getattr(plan.stream, "num_sources", 1) > 1:
        raise ValueError(
            f"the plan draws from a mixture of {plan.stream.num_sources} sources: prefetch it with MixtureDataset("
            "datasets, mixture, prefetch=..., plan=plan) (one prefetcher over every source's reads), or give this"
            " dataset the plan over its own layout"
        )
    if plan.stream.num_samples != layout.num_samples:
        raise ValueError(
            f"the plan draws from {plan.stream.num_samples} samples, the layout has {layout.num_samples}: prefetch"
            " needs the plan over this dataset's layout"
        )
    prefetch.node()  # NOTE: a node cache's path that cannot hold it is refused here, not in each worker's first batch


def _check_output(output: str, layout: Layout) -> None:
    if output not in OUTPUTS:
        raise ValueError(f"output must be 'fields' or 'tokens', got {output!r}")
    if output == "tokens" and not layout.labels_cross_documents:
        raise ValueError(
            f"output='tokens' needs a concat layout (its labels are tokens[:, 1:], across documents); this layout is"
            f" {layout.config.kind}, whose labels stop at each document: use output='fields' (labels and document_ids"
            " mark the boundaries)"
        )


def _layout_matches(layout: Layout, index: Index) -> bool:
    """Whether ``layout`` was made over ``index``'s documents: a persisted layout records the index's fingerprint; an
    in-RAM one is compared length by length (O(D), small corpora)."""
    if layout.num_documents != index.num_documents:
        return False
    fingerprint = getattr(layout, "index_fingerprint", None)
    if fingerprint is not None:
        return fingerprint == index.fingerprint
    return np.array_equal(layout.lengths, index.lengths)


def _rebuild(index: Index, layout: Any, kwargs: dict) -> PackedDataset:
    if isinstance(layout, LayoutConfig):
        layout = make_layout(layout, index.lengths)
    return PackedDataset(index, layout, **kwargs)


def instance_filter_counts(
    index: Index, layout: Layout, plan: Any, steps: range, instance_filter: RepetitionFilter
) -> dict[str, int]:
    """What ``instance_filter`` masks over ``steps`` (a range of global steps) of ``plan``, exactly: a full read of the
    tokens of every sample those steps read (each read counted, as trained). ``samples`` / ``flagged_samples``: the
    samples read and those flagged; ``loss_tokens`` / ``flagged_loss_tokens``: their labels != -100 before the mask, and
    those of the flagged samples (what the mask takes out of the loss)."""
    dataset = PackedDataset(index, layout)
    out = {"first_step": steps.start, "stop_step": steps.stop, "samples": 0, "flagged_samples": 0}
    out.update(loss_tokens=0, flagged_loss_tokens=0)
    for step in steps:
        batch = dataset.get_batch(plan.global_batch(step))
        docs = batch["document_ids"].numpy()
        valid = None if layout.labels_cross_documents else docs >= 0
        if len(dataset._erased):  # the erased documents' pad ids equal nothing, as in the read path
            kept = ~np.isin(docs, dataset._erased)
            valid = kept if valid is None else valid & kept
        inputs = batch["input_ids"].numpy()
        flagged = instance_filter.flags(inputs, _not_images(index, inputs, valid))
        loss = (batch["labels"].numpy() != -100).sum(axis=1)
        out["samples"] += len(flagged)
        out["flagged_samples"] += int(flagged.sum())
        out["loss_tokens"] += int(loss.sum())
        out["flagged_loss_tokens"] += int(loss[flagged].sum())
    return out
