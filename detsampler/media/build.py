"""Building a media index: each document's tokens with every image placeholder expanded to the image's exact token
count, and per image a sidecar record read from its header alone (no decode).

Per document: the text is tokenized; its image placeholders (``MediaBuildConfig.image_token``, one token of the
tokenizer) must be exactly as many as its images (``placeholders="in_text"``), or the images go before the text
(``"prepend"``, for captioning pairs); each placeholder is repeated ``tokens`` times, the count the processor family
gives the image's size after EXIF orientation (:mod:`detsampler.media.counts`). Per image the record holds its document,
its token run, its patches and grid, where its bytes are (a file or shard and a byte range, or the index's own
``image_bytes.npy`` for bytes that lived inside a dataset's tables), their CRC-32, format, EXIF orientation and size.

An image that is empty, corrupt, truncated, of another format, animated, a decompression bomb, or one the processor
refuses (aspect ratio) is refused with one line naming the source and item (``bad_media="refuse"``), or its document
is left out and listed with the reason in ``meta.json`` (``"skip"``). Like every index, it is written into a temporary
directory and renamed into place once complete (``meta.json``, sealed, last), under a lock: nothing half-written opens.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from detsampler.atomic import atomic_write, fsync_dir, removable_lock
from detsampler.checks import check_int
from detsampler.content import canonical_json, media_content
from detsampler.index.checksums import write_checksums
from detsampler.index.files import HEADER_BYTES, npy_header, save_npy
from detsampler.index.format import default_cache_dir, seal_meta, token_dtype
from detsampler.media.chat import check_conversation
from detsampler.media.counts import ImageTokenCounts
from detsampler.media.headers import DEFAULT_MAX_PIXELS, MediaError, read_header
from detsampler.media.index import (
    FORMAT_CODES,
    IMAGE_COLUMNS,
    MEDIA_FORMAT_VERSION,
    MEDIA_INDEX_KIND,
    MediaIndex,
)
from detsampler.media.sources import Document, MediaSource
from detsampler.storage import store_for
from detsampler.text.chat import ChatConfig, render_conversations, resolve_template
from detsampler.text.policy import SpecialTokens
from detsampler.text.protocol import TokenizerLike, check_tokenizer_like
from detsampler.version import __version__

__all__ = ["MediaBuildConfig", "build_media_index", "media_cache_key"]

_BATCH_DOCS = 256


@dataclass(frozen=True, kw_only=True)
class MediaBuildConfig:
    """``image_token``: the placeholder text (one token of the tokenizer) that stands for an image and is expanded to
    its token count; ``placeholders``: ``"in_text"`` (the text holds one per image, in order) or ``"prepend"`` (the
    text holds none: the images go first); ``bad_media``: ``"refuse"`` (the build stops, naming the image) or
    ``"skip"`` (the document is left out, listed in ``meta.json``); ``max_pixels``: the decompression-bomb limit."""

    image_token: str = "<|image_pad|>"
    placeholders: str = "in_text"
    bad_media: str = "refuse"
    max_pixels: int = DEFAULT_MAX_PIXELS

    def __post_init__(self) -> None:
        if not isinstance(self.image_token, str) or not self.image_token:
            raise ValueError(f"MediaBuildConfig.image_token must be a non-empty string, got {self.image_token!r}")
        if self.placeholders not in ("in_text", "prepend"):
            raise ValueError(f"MediaBuildConfig.placeholders must be 'in_text' or 'prepend', got {self.placeholders!r}")
        if self.bad_media not in ("refuse", "skip"):
            raise ValueError(f"MediaBuildConfig.bad_media must be 'refuse' or 'skip', got {self.bad_media!r}")
        check_int(self.max_pixels, "MediaBuildConfig.max_pixels", minimum=1)


def media_cache_key(
    source: MediaSource,
    tokenizer: TokenizerLike,
    counts: ImageTokenCounts,
    config: MediaBuildConfig,
    special_tokens: SpecialTokens,
    chat: ChatConfig | None = None,
    template: str | None = None,
) -> str:
    """The cache name's hash: the source's content identity, the tokenizer's sha256, the count function's identity,
    the build config, the BOS/EOS policy, the format version and, for chat data, the policy and the sha256 of the
    template text (:meth:`~detsampler.text.chat.ChatConfig.identity`)."""
    fields = {
        "format_version": MEDIA_FORMAT_VERSION,
        "source": source.identity,
        "tokenizer": tokenizer.sha256,
        "counts": counts.identity(),
        "config": asdict(config),
        "special_tokens": special_tokens.to_meta(),
        **({} if chat is None else {"chat": chat.identity(template)}),
    }
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:20]


def _check_chat(source: MediaSource, chat: ChatConfig | None, config: MediaBuildConfig) -> None:
    """Refuse chat settings that do not fit the source: conversations without ``chat``, ``chat`` over text, another
    column, prompt/completion columns, or placeholders the template does not place."""
    column = source.messages_column
    if chat is None:
        if column is not None:
            raise ValueError(
                f"the media source reads the messages column {column!r}: pass chat=ChatConfig(policy=...) (the loss"
                " policy and the chat template it is rendered with)"
            )
        return
    if not isinstance(chat, ChatConfig):
        raise TypeError(f"chat must be a ChatConfig or None, got {type(chat).__name__}")
    if chat.is_prompt_completion:
        raise ValueError(
            f"chat={chat!r}: prompt/completion columns are for text, not for media; use a messages column whose"
            " contents hold {'type': 'image'} parts"
        )
    if column is None:
        raise ValueError(
            "chat= renders conversations, but this is a media source of text (dataset_source(..., messages_column=...)"
            " or webdataset_source(..., messages_extension='json') reads conversations)"
        )
    if chat.column != column:
        raise ValueError(
            f"chat=ChatConfig(column={chat.column!r}) names another column than the source's messages column {column!r}"
        )
    if config.placeholders != "in_text":
        raise ValueError(
            f"placeholders={config.placeholders!r} with chat data: a chat template places each image where its"
            " {'type': 'image'} part is; use placeholders='in_text'"
        )


def _image_token_id(tokenizer: TokenizerLike, token: str) -> int:
    ids = tokenizer.encode_batch([token])[0]
    if len(ids) != 1:
        raise ValueError(
            f"image_token {token!r} encodes as {len(ids)} tokens {list(ids)} with the tokenizer {tokenizer.path!r}; it"
            " must be one token (add it to the tokenizer as a special token)"
        )
    return int(ids[0])


class _Stream:
    """An ``.npy`` file written in pieces: a blank header first, the real one last; fsynced."""

    def __init__(self, path: Path, dtype: Any) -> None:
        self.file, self.dtype, self.size = open(path, "wb"), np.dtype(dtype), 0
        self.file.write(b"\0" * HEADER_BYTES)

    def write(self, values: np.ndarray) -> None:
        self.file.write(np.ascontiguousarray(values, dtype=self.dtype).tobytes())
        self.size += int(np.asarray(values).size)

    def close(self, complete: bool) -> None:
        if complete:
            self.file.seek(0)
            self.file.write(npy_header(self.dtype, self.size))
            self.file.flush()
            os.fsync(self.file.fileno())
        self.file.close()


class _Builder:
    """The state of one build: the streams, the sources table, the counters, the documents left out."""

    def __init__(self, tmp: Path, tokenizer: TokenizerLike, counts: ImageTokenCounts, config: MediaBuildConfig,
                 policy: SpecialTokens, chat: tuple[ChatConfig, str] | None = None) -> None:  # fmt: skip
        self.tokenizer, self.counts, self.config, self.policy = tokenizer, counts, config, policy
        self.chat = chat  # (config, template text) for chat data
        self.image_id = _image_token_id(tokenizer, config.image_token)
        self.tokens = _Stream(tmp / "tokens.npy", token_dtype(tokenizer.vocab_size))
        self.image_bytes = _Stream(tmp / "image_bytes.npy", np.uint8)
        self.mask = None if chat is None else _Stream(tmp / "loss_mask.npy", np.uint8)
        self.num_trained = 0  # stored tokens whose mask is 1
        self.rows: list[np.ndarray] = []
        self.lengths: list[int] = []
        self.doc_rows: list[int] = []
        self.doc_images: list[int] = []
        self.digests: list[bytes] = []  # each document's content hash (32 bytes)
        self.sources: dict[str, int] = {"": 0}  # source 0: the index's own image_bytes.npy
        self.source_sizes: list[int] = [0]  # each source file's (or object's) size: what a reader of it by blocks needs
        self.skipped: list[dict] = []
        self.position = 0  # documents seen in the source

    def close(self, complete: bool) -> None:
        for stream in (self.tokens, self.image_bytes, self.mask):
            if stream is not None:
                stream.close(complete)

    def add(self, batch: list[Document]) -> None:
        kept, headers = [], []
        for doc in batch:
            try:
                found = [read_header(ref.data, ref.name, self.config.max_pixels) for ref in doc.images]
                sizes = (np.array([h.width for h in found], np.int64), np.array([h.height for h in found], np.int64))
                planned = self.counts.count(*sizes, names=[ref.name for ref in doc.images])
            except (MediaError, ValueError) as exc:
                if self.config.bad_media == "refuse":
                    raise MediaError(str(exc)) from None
                self.skipped.append({"document": doc.name, "reason": str(exc)})
                continue
            finally:
                self.position += 1
            kept.append((self.position - 1, doc))
            headers.append((found, planned))
        ids, masks = self._render([doc for _, doc in kept])
        for (row, doc), (found, planned), text_ids, mask in zip(kept, headers, ids, masks):
            self._write_document(row, doc, found, planned, np.asarray(text_ids, np.int64), mask)

    def _render(self, docs: list[Document]) -> tuple[list, list]:
        """Each document's ids, one placeholder per image, and (chat data) its mask under the policy, else None."""
        if not docs:
            return [], []
        if self.chat is None:
            return self.tokenizer.encode_batch([doc.text for doc in docs]), [None] * len(docs)
        chat, template = self.chat
        for doc in docs:
            parts = check_conversation(doc.messages, doc.name, chat.column)
            if parts != len(doc.images):
                raise ValueError(
                    f"{doc.name}: its conversation holds {parts} image parts {{'type': 'image'}} and it has"
                    f" {len(doc.images)} images; each image needs one part, in order"
                )
        return render_conversations(self.tokenizer, [doc.messages for doc in docs], chat, template)

    def _placeholders(self, doc: Document, text_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The document's ids with one placeholder per image, and where the placeholders are."""
        n = len(doc.images)
        if self.config.placeholders == "prepend":
            if np.any(text_ids == self.image_id):
                raise ValueError(f"{doc.name}: its text holds {self.config.image_token!r}, but placeholders='prepend'")
            text_ids = np.concatenate([np.full(n, self.image_id, np.int64), text_ids])
        at = np.flatnonzero(text_ids == self.image_id)
        if len(at) != n:
            what = "text" if self.chat is None else "rendered conversation"
            raise ValueError(
                f"{doc.name}: its {what} holds {len(at)} image placeholders {self.config.image_token!r} and it has {n}"
                " images; each image needs one, in order (or placeholders='prepend' for texts without them)"
            )
        return text_ids, at

    def _write_document(
        self, row: int, doc: Document, found: list, planned: Any, text_ids: np.ndarray, mask: np.ndarray | None
    ) -> None:
        ids, at = self._placeholders(doc, text_ids)
        reps = np.ones(len(ids), np.int64)
        reps[at] = planned.tokens
        expanded = np.repeat(ids, reps)
        bos = int(self.policy.add_bos)
        starts = at + np.concatenate([[0], np.cumsum(planned.tokens - 1)[:-1]]).astype(np.int64) + bos
        parts = ([[self.tokenizer.bos_id]] if bos else []) + [expanded]
        parts += [[self.tokenizer.eos_id]] if self.policy.eos_stored else []
        self.tokens.write(np.concatenate(parts).astype(np.int64))
        if self.mask is not None:
            self._write_mask(np.asarray(mask, np.uint8), reps, expanded)
        doc_id = len(self.lengths)
        self.lengths.append(len(expanded) + bos)
        self.doc_rows.append(row)
        self.doc_images.append(len(found))
        content = media_content(doc.text, [ref.data for ref in doc.images], doc.messages)
        self.digests.append(hashlib.sha256(canonical_json(content)).digest())
        grid = planned.grid if planned.grid is not None else np.zeros((len(found), 3), np.int64)
        for k, (ref, header) in enumerate(zip(doc.images, found)):
            if ref.path is None:
                source, offset = 0, self.image_bytes.size
                self.image_bytes.write(np.frombuffer(ref.data, np.uint8))
            else:
                if ref.path not in self.sources:
                    self.sources[ref.path] = len(self.sources)
                    self.source_sizes.append(store_for(ref.path).size(ref.path))
                source, offset = self.sources[ref.path], ref.offset
            values = {
                "doc": doc_id, "item": k, "start": starts[k], "tokens": planned.tokens[k],
                "patches": planned.patches[k], "grid_t": grid[k, 0], "grid_h": grid[k, 1], "grid_w": grid[k, 2],
                "source": source, "offset": offset, "size": header.size, "crc32": header.crc32,
                "format": FORMAT_CODES[header.format], "orientation": header.orientation, "width": header.width,
                "height": header.height,
            }  # fmt: skip
            self.rows.append(np.array([values[c] for c in IMAGE_COLUMNS], np.int64))

    def _write_mask(self, mask: np.ndarray, reps: np.ndarray, expanded: np.ndarray) -> None:
        """The stored tokens' loss mask: the rendered mask with each placeholder's value repeated over its image, then
        0 on every image token (never a target), 0 for a BOS, the policy's value for a stored EOS."""
        values = np.repeat(mask, reps)
        values[expanded == self.image_id] = 0
        parts = ([[0]] if self.policy.add_bos else []) + [values]
        parts += [[int(self.chat[0].eos_trained)]] if self.policy.eos_stored else []
        flat = np.concatenate(parts).astype(np.uint8)
        self.mask.write(flat)
        self.num_trained += int(flat.sum())


def _write(tmp: Path, source: MediaSource, builder: _Builder, key: str) -> None:
    """Every file of the index into ``tmp``, ``meta.json`` (sealed) last."""
    start = time.perf_counter()
    complete = False
    try:
        batch: list[Document] = []
        for doc in source:
            batch.append(doc)
            if len(batch) == _BATCH_DOCS:
                builder.add(batch)
                batch = []
        builder.add(batch)
        complete = True
    finally:
        builder.close(complete)
    if not builder.lengths:
        raise ValueError(f"no document: the source held {builder.position}, every one was skipped (bad media)")
    lengths = np.array(builder.lengths, np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths + int(builder.policy.eos_stored))]).astype(np.int64)
    images = np.stack(builder.rows) if builder.rows else np.zeros((0, len(IMAGE_COLUMNS)), np.int64)
    doc_images = np.concatenate([[0], np.cumsum(builder.doc_images)]).astype(np.int64)
    arrays = {"lengths.npy": lengths, "offsets.npy": offsets, "images.npy": images.reshape(-1),
              "doc_images.npy": doc_images, "doc_rows.npy": np.array(builder.doc_rows, np.int64),
              "doc_sha256.npy": np.frombuffer(b"".join(builder.digests), np.uint8)}  # fmt: skip
    for name, arr in arrays.items():
        save_npy(tmp / name, arr)
    names = [*arrays, "tokens.npy", "image_bytes.npy"] + ([] if builder.chat is None else ["loss_mask.npy"])
    chat = None if builder.chat is None else {**builder.chat[0].to_meta(builder.chat[1]),
                                              "num_trained_tokens": builder.num_trained}  # fmt: skip
    meta = {
        "kind": MEDIA_INDEX_KIND,
        "format_version": MEDIA_FORMAT_VERSION,
        "detsampler_version": __version__,
        "cache_key": key,
        "source": source.describe,
        "sources": sorted(builder.sources, key=builder.sources.__getitem__),
        "source_sizes": builder.source_sizes,
        "tokenizer": builder.tokenizer.describe(),
        "special_tokens": builder.policy.to_meta(),
        "counts": builder.counts.identity(),
        "config": asdict(builder.config),
        "image_token_id": builder.image_id,
        "token_dtype": token_dtype(builder.tokenizer.vocab_size).name,
        "num_documents": len(lengths),
        "num_tokens": int(offsets[-1]),
        "num_images": len(images),
        "num_image_bytes": builder.image_bytes.size,
        "skipped": builder.skipped,
        "files": {name: write_checksums(tmp, name) for name in names},
        "build": {"seconds": round(time.perf_counter() - start, 3), "documents_read": builder.position},
        **({} if chat is None else {"chat": chat}),
    }
    atomic_write(tmp / "meta.json", json.dumps(seal_meta(meta), indent=2, sort_keys=True) + "\n")


def build_media_index(
    source: MediaSource,
    tokenizer: TokenizerLike,
    counts: ImageTokenCounts,
    config: MediaBuildConfig | None = None,
    cache_dir: str | os.PathLike | None = None,
    special_tokens: SpecialTokens | None = None,
    chat: ChatConfig | None = None,
) -> MediaIndex:
    """Open the cached media index of ``source`` under ``tokenizer`` and ``counts``, building it first if it does not
    exist (one process builds, under a file lock; the others wait and open).

    Args:
        source: where the documents are (:func:`~detsampler.media.sources.dataset_source`,
            :func:`~detsampler.media.sources.webdataset_source`).
        tokenizer: the text's tokenizer; ``config.image_token`` must be one of its tokens.
        counts: the processor family's count function (:mod:`detsampler.media.counts`).
        config: placeholders, the bad-media policy, the pixel limit (:class:`MediaBuildConfig`).
        cache_dir: where index directories live (default: the library's cache).
        special_tokens: the BOS/EOS policy (default: no BOS, a virtual EOS).
        chat: for a source of conversations (``dataset_source(..., messages_column=...)``,
            ``webdataset_source(..., messages_extension="json")``): the loss policy and the
            chat template (:class:`~detsampler.text.chat.ChatConfig`; default: the tokenizer's); the mask is stored
            beside the tokens (``loss_mask.npy``, 0 on every image token) and the policy and the template's sha256 join
            the cache key.
    """
    config = MediaBuildConfig() if config is None else config
    if not isinstance(source, MediaSource):
        raise TypeError(
            f"source must be a MediaSource (dataset_source, webdataset_source), got {type(source).__name__}"
        )
    check_tokenizer_like(tokenizer)
    policy = SpecialTokens() if special_tokens is None else special_tokens
    policy.check(tokenizer)
    _check_chat(source, chat, config)
    template = None if chat is None else resolve_template(chat, tokenizer)
    key = media_cache_key(source, tokenizer, counts, config, policy, chat, template)
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"media-{key}"
    if (final / "meta.json").is_file():
        return MediaIndex.open(final, tokenizer=tokenizer, counts=counts)
    with removable_lock(root / f"media-{key}.lock"):
        if not final.exists():
            for stale in root.glob(f".tmp-media-{key}-*"):
                shutil.rmtree(stale, ignore_errors=True)
            tmp = root / f".tmp-media-{key}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            tmp.mkdir()
            try:
                rendering = None if chat is None else (chat, template)
                _write(tmp, source, _Builder(tmp, tokenizer, counts, config, policy, rendering), key)
                os.rename(tmp, final)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            fsync_dir(root)
    return MediaIndex.open(final, tokenizer=tokenizer, counts=counts)
