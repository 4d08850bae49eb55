"""Tokenizing a dataset for an index build: batches of documents, in dataset order, by one or ``num_proc`` processes,
through any :class:`~detsampler.text.protocol.TokenizerLike`, with the BOS/EOS policy applied.

Invariants: batches come back in dataset order whatever ``num_proc`` is, so the index does not depend on it; at most
``4 * num_proc`` batches are in flight (memory stays bounded); a worker exits when its parent dies.
"""

from __future__ import annotations

import os
import sys
import time
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from multiprocessing import get_all_start_methods, get_context
from typing import Any

import numpy as np

from detsampler.text.policy import SpecialTokens
from detsampler.text.protocol import TokenizerLike

__all__ = ["BATCH_DOCS", "check_texts", "encode_documents", "tokenize"]

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


def _encode_task(args: tuple[list[Any], int, str, str, SpecialTokens]) -> tuple[np.ndarray, np.ndarray]:
    texts, first_doc, text_column, dtype, policy = args
    assert _WORKER_TOKENIZER is not None
    return encode_documents(_WORKER_TOKENIZER, texts, first_doc, text_column, np.dtype(dtype), policy)


def _text_batches(dataset: Any, text_column: str, batch_docs: int) -> Iterator[tuple[list[Any], int]]:
    column = dataset.with_format(None).select_columns([text_column])
    first = 0
    for batch in column.iter(batch_size=batch_docs):
        texts = batch[text_column]
        yield texts, first
        first += len(texts)


def _encode_ahead(
    tokenizer: TokenizerLike,
    batches: Iterator[tuple[list[Any], int]],
    text_column: str,
    dtype: np.dtype,
    policy: SpecialTokens,
    bar: Any,
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """One process: the next batch is encoded in a thread (the Rust and C++ encoders release the GIL) while this one's
    ids become arrays, so the encoder's cores stay busy; results in order, at most two batches in flight."""
    with ThreadPoolExecutor(1) as ahead:
        pending: deque = deque()
        for texts, first in batches:
            check_texts(texts, first, text_column)
            pending.append((len(texts), ahead.submit(tokenizer.encode_batch, texts)))
            while len(pending) >= 2:
                n, fut = pending.popleft()
                yield policy.apply(fut.result(), tokenizer.bos_id, tokenizer.eos_id, dtype)
                bar.update(n)
        while pending:
            n, fut = pending.popleft()
            yield policy.apply(fut.result(), tokenizer.bos_id, tokenizer.eos_id, dtype)
            bar.update(n)


def tokenize(
    dataset: Any,
    tokenizer: TokenizerLike,
    text_column: str,
    num_proc: int,
    dtype: np.dtype,
    progress: bool,
    policy: SpecialTokens = SpecialTokens(),
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(lengths, stored tokens) of consecutive batches of documents, in dataset order, tokenized by ``num_proc``
    processes
    under ``policy``. A Hugging Face tokenizer with ``num_proc=1`` encodes each batch on its own Rust thread pool."""
    from tqdm.auto import tqdm

    bar = tqdm(total=len(dataset), unit="doc", desc="tokenizing", disable=not progress, file=sys.stderr, leave=False)
    try:
        batches = _text_batches(dataset, text_column, int(getattr(tokenizer, "batch_docs", BATCH_DOCS)))
        if num_proc == 1:
            yield from _encode_ahead(tokenizer, batches, text_column, dtype, policy, bar)
            return
        # fork where available: workers start at once and inherit the tokenizer; it also pickles (as its model)
        # elsewhere
        ctx = get_context("fork") if "fork" in get_all_start_methods() else None
        with ProcessPoolExecutor(num_proc, mp_context=ctx, initializer=_init_worker, initargs=(tokenizer,)) as pool:
            pending: deque = deque()
            for texts, first in batches:  # at most 4 * num_proc batches in flight: memory stays bounded
                pending.append((len(texts), pool.submit(_encode_task, (texts, first, text_column, dtype.str, policy))))
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
