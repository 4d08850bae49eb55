"""Tokenizing a dataset for an index build: batches of documents, in dataset order, by one or ``num_proc`` processes,
through any :class:`~detsampler.text.protocol.TokenizerLike`, with the BOS/EOS policy applied.

Invariants: batches come back in dataset order whatever ``num_proc`` is, so the index does not depend on it; at most
``4 * num_proc`` batches are in flight (memory stays bounded); a worker exits when its parent dies. With a
:class:`~detsampler.text.chat.ChatConfig`, each row is rendered (chat template or prompt + completion) and each batch
also yields the loss mask of its stored tokens (uint8, aligned with them; BOS 0, the EOS per the config).
"""

from __future__ import annotations

import os
import sys
import time
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import get_all_start_methods, get_context
from typing import Any

import numpy as np

from detsampler.text.chat import ChatConfig, render_examples
from detsampler.text.policy import SpecialTokens
from detsampler.text.protocol import TokenizerLike

__all__ = ["BATCH_DOCS", "Encoding", "check_texts", "encode_documents", "tokenize"]

BATCH_DOCS = 64  # documents per tokenization task (a tokenizer's ``batch_docs`` attribute overrides it)


def check_texts(texts: Sequence[Any], first_doc: int, text_column: str) -> None:
    """Raise a ValueError naming the first document whose ``text_column`` is not a string."""
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            got = "None" if text is None else f"a {type(text).__name__}"
            raise ValueError(
                f"document {first_doc + i}: column {text_column!r} holds {got}, not a string; drop or fill such rows "
                f"first, e.g. dataset.filter(lambda row: isinstance(row[{text_column!r}], str))"
            )


_WORKER_TOKENIZER: TokenizerLike | None = None


def _init_worker(tokenizer: TokenizerLike) -> None:
    global _WORKER_TOKENIZER
    _WORKER_TOKENIZER = tokenizer
    parent = os.getppid()

    def exit_with_parent() -> None:  # a killed build must not leave its tokenizer processes behind
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    import threading

    threading.Thread(target=exit_with_parent, daemon=True).start()


def encode_documents(
    tokenizer: TokenizerLike,
    texts: Sequence[Any],
    first_doc: int,
    text_column: str,
    dtype: np.dtype,
    policy: SpecialTokens = SpecialTokens(),
) -> tuple[np.ndarray, np.ndarray]:
    """Tokenize ``texts`` (documents ``first_doc, ...``) under ``policy``: their lengths (int64, the positions before
    each
    EOS, see :mod:`detsampler.text.policy`) and their stored tokens concatenated (``dtype``)."""
    check_texts(texts, first_doc, text_column)
    return policy.apply(tokenizer.encode_batch(texts), tokenizer.bos_id, tokenizer.eos_id, dtype)


@dataclass(frozen=True)
class Encoding:
    """How a batch of rows becomes stored tokens: the text column (or a chat config and its resolved template), the
    BOS/EOS policy and the token dtype's name. Pickles (tokenizer processes get it with each task)."""

    text_column: str
    dtype: str
    policy: SpecialTokens = field(default_factory=SpecialTokens)
    chat: ChatConfig | None = None
    template: str | None = None

    @property
    def columns(self) -> list[str]:
        return [self.text_column] if self.chat is None else list(self.chat.columns)

    def raw(self, tokenizer: TokenizerLike, rows: dict, first_doc: int) -> tuple[list, list | None]:
        """Each row's ids (no BOS/EOS policy applied) and, for chat rows, its loss mask."""
        if self.chat is None:
            texts = rows[self.text_column]
            check_texts(texts, first_doc, self.text_column)
            return tokenizer.encode_batch(texts), None
        return render_examples(tokenizer, rows, first_doc, self.chat, self.template)

    def finish(
        self, tokenizer: TokenizerLike, raw: tuple[list, list | None]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """``(lengths, stored tokens, stored mask or None)`` of the rows ``raw`` came from, the policy applied."""
        ids, masks = raw
        lengths, flat = self.policy.apply(ids, tokenizer.bos_id, tokenizer.eos_id, np.dtype(self.dtype))
        if masks is None:
            return lengths, flat, None
        assert self.chat is not None
        _, mask = self.policy.apply(masks, 0, int(self.chat.eos_trained), np.uint8)
        return lengths, flat, mask

    def encode(self, tokenizer: TokenizerLike, rows: dict, first_doc: int):
        return self.finish(tokenizer, self.raw(tokenizer, rows, first_doc))


def _encode_task(args: tuple[dict, int, Encoding]) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    rows, first_doc, encoding = args
    assert _WORKER_TOKENIZER is not None
    return encoding.encode(_WORKER_TOKENIZER, rows, first_doc)


def _row_batches(dataset: Any, columns: list[str], batch_docs: int) -> Iterator[tuple[dict, int]]:
    table = dataset.with_format(None).select_columns(columns)
    first = 0
    for batch in table.iter(batch_size=batch_docs):
        yield batch, first
        first += len(batch[columns[0]])


def _encode_ahead(
    tokenizer: TokenizerLike, batches: Iterator[tuple[dict, int]], encoding: Encoding, bar: Any
) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray | None]]:
    """One process: the next batch is encoded in a thread (the Rust and C++ encoders release the GIL) while this one's
    ids become arrays, so the encoder's cores stay busy; results in order, at most two batches in flight."""
    with ThreadPoolExecutor(1) as ahead:
        pending: deque = deque()
        for rows, first in batches:
            if encoding.chat is None:  # refuse a bad row before any later batch is submitted
                check_texts(rows[encoding.text_column], first, encoding.text_column)
            pending.append((len(rows[encoding.columns[0]]), ahead.submit(encoding.raw, tokenizer, rows, first)))
            while len(pending) >= 2:
                n, fut = pending.popleft()
                yield encoding.finish(tokenizer, fut.result())
                bar.update(n)
        while pending:
            n, fut = pending.popleft()
            yield encoding.finish(tokenizer, fut.result())
            bar.update(n)


def tokenize(
    dataset: Any,
    tokenizer: TokenizerLike,
    text_column: str,
    num_proc: int,
    dtype: np.dtype,
    progress: bool,
    policy: SpecialTokens = SpecialTokens(),
    chat: ChatConfig | None = None,
    template: str | None = None,
) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray | None]]:
    """(lengths, stored tokens, stored loss mask or None) of consecutive batches of documents, in dataset order,
    tokenized by ``num_proc`` processes under ``policy`` (with ``chat``: rendered under it and ``template``). A Hugging
    Face tokenizer with ``num_proc=1`` encodes each batch on its own Rust thread pool."""
    from tqdm.auto import tqdm

    encoding = Encoding(text_column, np.dtype(dtype).str, policy, chat, template)
    bar = tqdm(total=len(dataset), unit="doc", desc="tokenizing", disable=not progress, file=sys.stderr, leave=False)
    try:
        batches = _row_batches(dataset, encoding.columns, int(getattr(tokenizer, "batch_docs", BATCH_DOCS)))
        if num_proc == 1:
            yield from _encode_ahead(tokenizer, batches, encoding, bar)
            return
        # fork where available: workers start at once and inherit the tokenizer; it also pickles (as its model)
        # elsewhere
        ctx = get_context("fork") if "fork" in get_all_start_methods() else None
        with ProcessPoolExecutor(num_proc, mp_context=ctx, initializer=_init_worker, initargs=(tokenizer,)) as pool:
            pending: deque = deque()
            for rows, first in batches:  # at most 4 * num_proc batches in flight: memory stays bounded
                pending.append((len(rows[encoding.columns[0]]), pool.submit(_encode_task, (rows, first, encoding))))
                while len(pending) >= 4 * num_proc:
                    n, fut = pending.popleft()
                    yield fut.result()
                    bar.update(n)
            while pending:
                n, fut = pending.popleft()
                yield fut.result()
                bar.update(n)
    finally:
        bar.close()
