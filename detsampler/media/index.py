"""The media index reader: a token index whose documents interleave text and images, and its per-image records.

Directory ``media-<key>/`` (written by :mod:`detsampler.media.build`)::

    lengths.npy      int64[D]        positions of document d before its EOS, image tokens expanded
    offsets.npy      int64[D + 1]    where document d's tokens start in tokens.npy
    tokens.npy       uint16|uint32   the tokens, each image placeholder repeated to the image's token count
    images.npy       int64[N * K]    one row of K = len(IMAGE_COLUMNS) values per image, documents in order
    doc_images.npy   int64[D + 1]    document d's images are rows doc_images[d] : doc_images[d + 1]
    doc_rows.npy     int64[D]        document d's position in the source (documents left out do not count)
    image_bytes.npy  uint8           the bytes of images that lived inside a dataset's tables (source 0)
    doc_sha256.npy   uint8[D * 32]   each document's content hash (:func:`detsampler.content.media_content`: its text
                                     or conversation and its images' sha256s): what ``where --sha256`` and redactions
                                     resolve
    loss_mask.npy    uint8           chat data: 1 where the token aligned with it is a trained target under the policy
                                     (:mod:`detsampler.text.chat`), 0 on every image token
    meta.json        identity (source, tokenizer, count function, build config), the sources table, counts, the
                     documents left out and why, per file its size, sha256 and chunk CRC-32s; sealed

Every array is read through its chunk checksums (:class:`~detsampler.index.checksums.VerifiedArray`), and every image's
bytes against the CRC-32 recorded at build, so a file edited since is an error naming it, never a wrong pixel. The
index is an :class:`~detsampler.index.protocol.Index`: ``PackedDataset`` reads its tokens like any other's.
"""

from __future__ import annotations

import json
import logging
import os
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from detsampler.index.checksums import VerifiedArray, open_checked
from detsampler.index.format import TokenIndexError, seal_ok, token_dtype
from detsampler.media.counts import ImageTokenCounts, counts_from_identity
from detsampler.media.headers import IMAGE_FORMATS, MediaError
from detsampler.media.layout import MediaLayout, MediaLayoutConfig
from detsampler.media.packing import MediaRuns
from detsampler.storage import RemotePath, as_path
from detsampler.text.chat import ChatConfig
from detsampler.text.policy import SpecialTokens

__all__ = ["FORMAT_CODES", "IMAGE_COLUMNS", "MEDIA_FORMAT_VERSION", "MEDIA_INDEX_KIND", "MediaIndex"]

MEDIA_INDEX_KIND = "detsampler-media-index"
# 1: expanded tokens, one int64 row per image (IMAGE_COLUMNS), embedded bytes beside them
# 2: each document's content hash (doc_sha256.npy); chat data (a "chat" record) stores its loss mask: a reader of
#    format 1 would train on every token of it, so it refuses the format
MEDIA_FORMAT_VERSION = 2
IMAGE_COLUMNS = ("doc", "item", "start", "tokens", "patches", "grid_t", "grid_h", "grid_w", "source", "offset",
                 "size", "crc32", "format", "orientation", "width", "height")  # fmt: skip
FORMAT_CODES = {name: i + 1 for i, name in enumerate(IMAGE_FORMATS)}
_K = len(IMAGE_COLUMNS)
log = logging.getLogger("detsampler.media")


def _read_meta(path: Path | RemotePath) -> dict:
    try:
        meta = json.loads((path / "meta.json").read_text())
    except FileNotFoundError:
        raise TokenIndexError(f"no media index at {str(path)!r} (no meta.json: never built, or interrupted)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise TokenIndexError(f"media index {str(path)!r}: meta.json is not valid JSON ({exc})") from None
    if not isinstance(meta, dict) or meta.get("kind") != MEDIA_INDEX_KIND:
        raise TokenIndexError(f"{str(path)!r} is not a detsampler media index (kind is not {MEDIA_INDEX_KIND!r})")
    if meta.get("format_version") != MEDIA_FORMAT_VERSION:
        raise TokenIndexError(
            f"media index {str(path)!r} has format version {meta.get('format_version')!r}; this detsampler reads"
            f" {MEDIA_FORMAT_VERSION}: rebuild it"
        )
    if "chat" in meta and not isinstance(meta["chat"], dict):
        raise TokenIndexError(f"media index {str(path)!r}: meta.json's chat record is not a mapping")
    if not seal_ok(meta):
        raise TokenIndexError(f"media index {str(path)!r}: meta.json fails its checksum (meta_sha256): edited")
    if path.name.startswith("media-") and path.name != f"media-{meta.get('cache_key')}":
        raise TokenIndexError(f"media index {str(path)!r}: meta.json names cache key {meta.get('cache_key')!r}")
    return meta


class MediaIndex:
    """An opened media index (see the module doc). Pickles as its path: workers reopen the memory maps."""

    store_tokens = True
    text_column = "text"

    def __init__(
        self, path: Path | RemotePath, meta: dict, arrays: dict[str, VerifiedArray], counts: ImageTokenCounts
    ) -> None:
        self.path, self.meta, self.counts = path, meta, counts
        self.lengths, self.offsets, self.tokens = arrays["lengths.npy"], arrays["offsets.npy"], arrays["tokens.npy"]
        self.images, self.doc_images = arrays["images.npy"], arrays["doc_images.npy"]
        self.doc_rows, self.image_bytes = arrays["doc_rows.npy"], arrays["image_bytes.npy"]
        self.doc_sha256 = arrays["doc_sha256.npy"]
        self._arrays = arrays
        self.loss_mask = arrays.get("loss_mask.npy")  # chat data's, else None
        self._runs: MediaRuns | None = None

    @classmethod
    def open(cls, path: str | os.PathLike, tokenizer: Any = None, counts: ImageTokenCounts | None = None) -> MediaIndex:
        """Open the media index at ``path``, checking its kind, format, seal, every file's size, shape and checksum
        file; with ``tokenizer``, that it is the build's; ``counts``: the count function, needed only for a ``user``
        one (it must have the recorded identity)."""
        path = as_path(path)
        meta = _read_meta(path)
        n_docs, n_tok, n_img = (int(meta[k]) for k in ("num_documents", "num_tokens", "num_images"))
        shapes = {
            "lengths.npy": (np.int64, (n_docs,)),
            "offsets.npy": (np.int64, (n_docs + 1,)),
            "tokens.npy": (token_dtype(int(meta["tokenizer"]["vocab_size"])), (n_tok,)),
            "images.npy": (np.int64, (n_img * _K,)),
            "doc_images.npy": (np.int64, (n_docs + 1,)),
            "doc_rows.npy": (np.int64, (n_docs,)),
            "image_bytes.npy": (np.uint8, (int(meta["num_image_bytes"]),)),
            "doc_sha256.npy": (np.uint8, (n_docs * 32,)),
            **({"loss_mask.npy": (np.uint8, (n_tok,))} if "chat" in meta else {}),
        }
        arrays = {name: open_checked(path, meta["files"], name, np.dtype(dt), shape) for name, (dt, shape) in
                  shapes.items()}  # fmt: skip
        if counts is None:
            counts = counts_from_identity(meta["counts"])
        elif counts.identity() != meta["counts"]:
            raise TokenIndexError(
                f"media index {str(path)!r} counts image tokens with {meta['counts']}, not {counts.identity()}"
            )
        index = cls(path, meta, arrays, counts)
        if tokenizer is not None:
            index.check_tokenizer(tokenizer)
        return index

    def __reduce__(self):
        return (_reopen, (str(self.path), self.counts))

    def __repr__(self) -> str:
        return f"MediaIndex({str(self.path)!r}, num_documents={self.num_documents}, num_images={self.num_images})"

    @property
    def num_documents(self) -> int:
        return int(self.meta["num_documents"])

    @property
    def num_tokens(self) -> int:
        return int(self.meta["num_tokens"])

    @property
    def num_images(self) -> int:
        return int(self.meta["num_images"])

    @property
    def vocab_size(self) -> int:
        return int(self.meta["tokenizer"]["vocab_size"])

    @property
    def eos_id(self) -> int:
        return int(self.meta["tokenizer"]["eos_id"])

    @property
    def pad_id(self) -> int:
        return int(self.meta["tokenizer"]["pad_id"])

    @property
    def image_token_id(self) -> int:
        return int(self.meta["image_token_id"])

    @property
    def chat(self) -> ChatConfig | None:
        """The chat configuration conversations were rendered under (its template text included), or None (text)."""
        record = self.meta.get("chat")
        return None if record is None else ChatConfig.from_meta(record)

    @property
    def special_tokens(self) -> SpecialTokens:
        return SpecialTokens.from_meta(self.meta.get("special_tokens"))

    @property
    def eos_stored(self) -> bool:
        return self.special_tokens.eos_stored

    @property
    def fingerprint(self) -> str:
        """The cache key: a hash of the source's content, the tokenizer, the count function and the build config."""
        return str(self.meta["cache_key"])

    def check_tokenizer(self, tokenizer: Any) -> None:
        if getattr(tokenizer, "sha256", None) != self.meta["tokenizer"]["sha256"]:
            raise TokenIndexError(
                f"media index {str(self.path)!r} was built with the tokenizer {self.meta['tokenizer']['path']!r}"
                f" (sha256 {self.meta['tokenizer']['sha256'][:12]}...), not {getattr(tokenizer, 'path', tokenizer)!r}"
            )

    def check_dataset(self, dataset: Any, text_column: str | None = None) -> None:
        raise TokenIndexError(
            f"media index {str(self.path)!r} takes no dataset: it holds the tokens and where every image's bytes are"
        )

    def document_tokens(self, doc: int) -> np.ndarray:
        a = int(self.offsets[doc])
        return np.asarray(self.tokens[a : a + int(self.lengths[doc])], dtype=np.int64)

    def image_rows(self, image_ids: Any) -> dict[str, np.ndarray]:
        """The records of images ``image_ids``: one int64 array per column of :data:`IMAGE_COLUMNS`."""
        ids = np.asarray(image_ids, np.int64).reshape(-1)
        if ids.size and (ids.min() < 0 or ids.max() >= self.num_images):
            bad = int(ids[(ids < 0) | (ids >= self.num_images)][0])
            raise ValueError(f"Got image id {bad}, allowed image ids are in [0, {self.num_images})")
        rows = np.asarray(self.images[(ids[:, None] * _K + np.arange(_K)).reshape(-1)], np.int64).reshape(-1, _K)
        return {name: rows[:, k] for k, name in enumerate(IMAGE_COLUMNS)}

    def runs(self) -> MediaRuns:
        """Every document's image runs (O(images), read once per process)."""
        if self._runs is None:
            rows = self.image_rows(np.arange(self.num_images))
            offsets = np.asarray(self.doc_images[0 : self.num_documents + 1], np.int64)
            self._runs = MediaRuns(offsets, rows["start"], rows["tokens"], rows["patches"])
        return self._runs

    def layout(self, config: MediaLayoutConfig) -> MediaLayout:
        """The two-axis layout of ``config`` over this index (computed in RAM)."""
        lengths = np.asarray(self.lengths[0 : self.num_documents], np.int64)
        layout = MediaLayout(config, lengths, self.runs(), self.meta["counts"])
        layout.index_fingerprint = self.fingerprint
        return layout

    def image_records(self, image_ids: Any) -> list[dict]:
        """Per image of ``image_ids``: its id, document, item, source file and byte range (or the index's own bytes),
        format, size after EXIF orientation, orientation, LLM tokens and vision patches."""
        ids = np.asarray(image_ids, np.int64).reshape(-1)
        rows = self.image_rows(ids)
        names = {code: name for name, code in FORMAT_CODES.items()}
        return [
            {
                "image": int(ids[k]), "document": int(rows["doc"][k]), "item": int(rows["item"][k]),
                "source": self._source_name(int(rows["source"][k])),
                "bytes": [int(rows["offset"][k]), int(rows["offset"][k] + rows["size"][k])],
                "format": names[int(rows["format"][k])], "width": int(rows["width"][k]),
                "height": int(rows["height"][k]), "orientation": int(rows["orientation"][k]),
                "tokens": int(rows["tokens"][k]), "patches": int(rows["patches"][k]),
            }
            for k in range(len(ids))
        ]  # fmt: skip

    def sample_images(self, layout: MediaLayout, sample_ids: Any) -> list[list[dict]]:
        """What each sample of ``sample_ids`` holds of images, in order (:meth:`image_records`): the audit of a
        sample, what ``show`` prints of it."""
        offsets, images = layout.sample_images(sample_ids)
        records = self.image_records(images)
        return [records[a:b] for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist())]

    def document_images(self, doc: int) -> list[dict]:
        """The images of document ``doc``, in order (:meth:`image_records`)."""
        if isinstance(doc, bool) or not isinstance(doc, (int, np.integer)) or not 0 <= doc < self.num_documents:
            raise ValueError(f"Got document {doc!r}, allowed documents are in [0, {self.num_documents})")
        return self.image_records(np.arange(int(self.doc_images[doc]), int(self.doc_images[doc + 1])))

    def content_hashes(self) -> list[str]:
        """Every document's content hash (hex; :func:`detsampler.content.media_content`), as the build recorded it."""
        digests = np.asarray(self.doc_sha256[0 : 32 * self.num_documents], np.uint8).reshape(-1, 32)
        return [row.tobytes().hex() for row in digests]

    def documents_by_content(self, hashes: Any) -> list[int]:
        """The documents whose content hash is one of ``hashes`` (sorted; a hash naming none is a ValueError): what a
        redaction by content hash (``Redaction(index.documents_by_content([...]), from_step)``) and ``where --sha256``
        resolve, from the recorded hashes, without the source."""
        from detsampler.content import documents_by_hashes

        what = "sha256 of the canonical JSON of its text (or messages) and its images' sha256s"
        return documents_by_hashes(self.content_hashes(), hashes, what)

    def _source_name(self, source: int) -> str:
        return self.meta["sources"][source] or str(self.path / "image_bytes.npy")

    def image_name(self, image: int) -> str:
        """Where image ``image`` lives, for messages: its source file and byte range, or the index's own bytes."""
        row = self.image_rows([image])
        a = int(row["offset"][0])
        return f"image {image} (document {int(row['doc'][0])}, item {int(row['item'][0])}) at" \
               f" {self._source_name(int(row['source'][0]))} [{a}, {a + int(row['size'][0])})"  # fmt: skip

    def read_images(
        self, images: Any, rows: dict[str, np.ndarray] | None = None, held: dict[str, Any] | None = None
    ) -> list[bytes]:
        """The bytes of ``images``, each checked against the CRC-32 recorded at build (a :class:`MediaError` naming
        the first that fails or cannot be read); ``rows``: their records already read (:meth:`image_rows`). One
        ranged read per source file (a shard or file on disk, or an object in a bucket), the embedded ones from
        ``image_bytes.npy``; ``held``: objects a prefetcher fetched this batch's blocks of, by URL, read from first
        (an image that fails its CRC-32 there is read once more from the store: bytes corrupted in transit recover)."""
        ids = np.asarray(images, np.int64).reshape(-1)
        rows = self.image_rows(ids) if rows is None else rows
        held = held or {}
        out: list[bytes] = [b""] * len(ids)
        for source in np.unique(rows["source"]).tolist():
            ks = np.flatnonzero(rows["source"] == source)
            ranges = [(int(rows["offset"][k]), int(rows["offset"][k] + rows["size"][k])) for k in ks]
            blocked = held.get(self.meta["sources"][source]) if source else None
            got = [blocked.read(a, b) for a, b in ranges] if blocked is not None else None
            if got is not None and any(zlib.crc32(d) != int(rows["crc32"][k]) for k, d in zip(ks, got)):
                log.warning("media: %s: an image failed its CRC-32 as prefetched: read again from the store",
                            self.meta["sources"][source])  # fmt: skip
                got = None
            if got is None:
                got = self._read_ranges(int(source), ranges, int(ids[ks[0]]))
            for k, data in zip(ks.tolist(), got):
                out[k] = data
        for k, data in enumerate(out):
            crc = zlib.crc32(data)
            if crc != int(rows["crc32"][k]):
                raise MediaError(
                    f"{self.image_name(int(ids[k]))}: its bytes' CRC-32 is {crc:#010x}, the build recorded"
                    f" {int(rows['crc32'][k]):#010x}: the file changed since the index was built; rebuild it"
                )
        return out

    def _read_ranges(self, source: int, ranges: list[tuple[int, int]], first: int) -> list[bytes]:
        """The byte ranges of source ``source`` (0: the index's own bytes); ``first``: an image read, for messages."""
        if source == 0:
            return [np.asarray(self.image_bytes[a:b]).tobytes() for a, b in ranges]
        from detsampler.storage import store_for

        path = self.meta["sources"][source]
        try:
            return store_for(path).read_ranges(path, ranges)
        except OSError as exc:
            raise MediaError(f"{self.image_name(first)}: cannot read it ({exc.strerror or exc})") from None

    def media_objects(self, layout: MediaLayout) -> list[Any]:
        """The objects in a store this index's images are read from, for a prefetcher over ``layout``
        (:mod:`detsampler.media.reads`)."""
        from detsampler.media.reads import media_objects

        return media_objects(self, layout)

    def read_image(self, image: int) -> bytes:
        """The bytes of image ``image``, checked against the CRC-32 recorded at build (:meth:`read_images`)."""
        return self.read_images([image])[0]

    def verify_files(self, chunk: int = 4096) -> dict[str, int]:
        """A full audit: every chunk checksum and the sha256 of every file of the index, then every image's bytes read
        where the build found them and checked against its CRC-32 (``chunk`` images at a time). Returns what was
        checked, counted as the checks return: ``tokens``, ``images``, ``image_bytes``, ``image_files`` (source files
        the images were read from) and ``embedded`` (images read from the index's own bytes); the first failure is
        raised, naming it."""
        for name, record in self.meta["files"].items():
            array = self._arrays[name]
            array.verify_all()
            if array.sha256() != record["sha256"]:
                raise TokenIndexError(
                    f"media index {str(self.path)!r}: {name}'s sha256 differs from the recorded one: the file was"
                    " edited; rebuild the index"
                )
        images = size = embedded = 0
        files: set[int] = set()
        for a in range(0, self.num_images, chunk):
            ids = np.arange(a, min(a + chunk, self.num_images))
            rows = self.image_rows(ids)
            size += sum(map(len, self.read_images(ids, rows)))
            images += len(ids)
            files.update(int(x) for x in rows["source"] if x)
            embedded += int((rows["source"] == 0).sum())
        return {"tokens": self.num_tokens, "images": images, "image_bytes": size, "image_files": len(files),
                "embedded": embedded}  # fmt: skip

    def summary(self) -> dict:
        return {
            "path": str(self.path),
            "num_documents": self.num_documents,
            "num_tokens": self.num_tokens,
            "num_images": self.num_images,
            "skipped_documents": len(self.meta["skipped"]),
            "counts": self.meta["counts"],
            "source": self.meta["source"],
            "fingerprint": self.fingerprint,
            **({} if self.chat is None else {"chat": {k: v for k, v in self.meta["chat"].items() if k != "template"}}),
        }


def _reopen(path: str, counts: ImageTokenCounts) -> MediaIndex:
    return MediaIndex.open(path, counts=counts)
