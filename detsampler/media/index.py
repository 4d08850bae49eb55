"""The media index reader: a token index whose documents interleave text and images, and its per-image records.

Directory ``media-<key>/`` (written by :mod:`detsampler.media.build`)::

    lengths.npy      int64[D]        positions of document d before its EOS, image tokens expanded
    offsets.npy      int64[D + 1]    where document d's tokens start in tokens.npy
    tokens.npy       uint16|uint32   the tokens, each image placeholder repeated to the image's token count
    images.npy       int64[N * K]    one row of K = len(IMAGE_COLUMNS) values per image, documents in order
    doc_images.npy   int64[D + 1]    document d's images are rows doc_images[d] : doc_images[d + 1]
    doc_rows.npy     int64[D]        document d's position in the source (documents left out do not count)
    image_bytes.npy  uint8           the bytes of images that lived inside a dataset's tables (source 0)
    loss_mask.npy    uint8           chat data (format 2): 1 where the token aligned with it is a trained target under
                                     the policy (:mod:`detsampler.text.chat`), 0 on every image token
    meta.json        identity (source, tokenizer, count function, build config), the sources table, counts, the
                     documents left out and why, per file its size, sha256 and chunk CRC-32s; sealed

Every array is read through its chunk checksums (:class:`~detsampler.index.checksums.VerifiedArray`), and every image's
bytes against the CRC-32 recorded at build, so a file edited since is an error naming it, never a wrong pixel. The
index is an :class:`~detsampler.index.protocol.Index`: ``PackedDataset`` reads its tokens like any other's.
"""

from __future__ import annotations

import json
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
from detsampler.text.chat import ChatConfig
from detsampler.text.policy import SpecialTokens

__all__ = [
    "FORMAT_CODES",
    "IMAGE_COLUMNS",
    "MEDIA_CHAT_FORMAT_VERSION",
    "MEDIA_FORMAT_VERSION",
    "MEDIA_INDEX_KIND",
    "MediaIndex",
]

MEDIA_INDEX_KIND = "detsampler-media-index"
MEDIA_FORMAT_VERSION = 1  # 1: expanded tokens, one int64 row per image (IMAGE_COLUMNS), embedded bytes beside them
# 2: chat data, format 1 and its loss mask: a reader of format 1 alone would train on every token, so it refuses it
MEDIA_CHAT_FORMAT_VERSION = 2
IMAGE_COLUMNS = ("doc", "item", "start", "tokens", "patches", "grid_t", "grid_h", "grid_w", "source", "offset",
                 "size", "crc32", "format", "orientation", "width", "height")  # fmt: skip
FORMAT_CODES = {name: i + 1 for i, name in enumerate(IMAGE_FORMATS)}
_K = len(IMAGE_COLUMNS)


def _read_meta(path: Path) -> dict:
    try:
        meta = json.loads((path / "meta.json").read_text())
    except FileNotFoundError:
        raise TokenIndexError(f"no media index at {str(path)!r} (no meta.json: never built, or interrupted)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise TokenIndexError(f"media index {str(path)!r}: meta.json is not valid JSON ({exc})") from None
    if not isinstance(meta, dict) or meta.get("kind") != MEDIA_INDEX_KIND:
        raise TokenIndexError(f"{str(path)!r} is not a detsampler media index (kind is not {MEDIA_INDEX_KIND!r})")
    if meta.get("format_version") not in (MEDIA_FORMAT_VERSION, MEDIA_CHAT_FORMAT_VERSION):
        raise TokenIndexError(
            f"media index {str(path)!r} has format version {meta.get('format_version')!r}; this detsampler reads"
            f" {MEDIA_FORMAT_VERSION} and {MEDIA_CHAT_FORMAT_VERSION}: rebuild it"
        )
    if (meta["format_version"] == MEDIA_CHAT_FORMAT_VERSION) != isinstance(meta.get("chat"), dict):
        raise TokenIndexError(
            f"media index {str(path)!r}: format {meta['format_version']} but meta.json"
            f" {'has no' if meta['format_version'] == MEDIA_CHAT_FORMAT_VERSION else 'has a'} chat record"
        )
    if not seal_ok(meta):
        raise TokenIndexError(f"media index {str(path)!r}: meta.json fails its checksum (meta_sha256): edited")
    if path.name.startswith("media-") and path.name != f"media-{meta.get('cache_key')}":
        raise TokenIndexError(f"media index {str(path)!r}: meta.json names cache key {meta.get('cache_key')!r}")
    return meta


class MediaIndex:
    """An opened media index (see the module doc). Pickles as its path: workers reopen the memory maps."""

    store_tokens = True
    text_column = "text"

    def __init__(self, path: Path, meta: dict, arrays: dict[str, VerifiedArray], counts: ImageTokenCounts) -> None:
        self.path, self.meta, self.counts = path, meta, counts
        self.lengths, self.offsets, self.tokens = arrays["lengths.npy"], arrays["offsets.npy"], arrays["tokens.npy"]
        self.images, self.doc_images = arrays["images.npy"], arrays["doc_images.npy"]
        self.doc_rows, self.image_bytes = arrays["doc_rows.npy"], arrays["image_bytes.npy"]
        self.loss_mask = arrays.get("loss_mask.npy")  # chat data's, else None
        self._runs: MediaRuns | None = None

    @classmethod
    def open(cls, path: str | os.PathLike, tokenizer: Any = None, counts: ImageTokenCounts | None = None) -> MediaIndex:
        """Open the media index at ``path``, checking its kind, format, seal, every file's size, shape and checksum
        file; with ``tokenizer``, that it is the build's; ``counts``: the count function, needed only for a ``user``
        one (it must have the recorded identity)."""
        path = Path(path)
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

    def sample_images(self, layout: MediaLayout, sample_ids: Any) -> list[list[dict]]:
        """What each sample of ``sample_ids`` holds of images, in order: per image its id, document, item, source file
        and byte range (or the index's own bytes), format, size after EXIF orientation, orientation, LLM tokens and
        vision patches (the audit of a sample: what ``show`` prints of it)."""
        offsets, images = layout.sample_images(sample_ids)
        rows = self.image_rows(images)
        names = {code: name for name, code in FORMAT_CODES.items()}
        out = []
        for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist()):
            out.append([
                {
                    "image": int(images[k]), "document": int(rows["doc"][k]), "item": int(rows["item"][k]),
                    "source": self.meta["sources"][int(rows["source"][k])] or str(self.path / "image_bytes.npy"),
                    "bytes": [int(rows["offset"][k]), int(rows["offset"][k] + rows["size"][k])],
                    "format": names[int(rows["format"][k])], "width": int(rows["width"][k]),
                    "height": int(rows["height"][k]), "orientation": int(rows["orientation"][k]),
                    "tokens": int(rows["tokens"][k]), "patches": int(rows["patches"][k]),
                }
                for k in range(a, b)
            ])  # fmt: skip
        return out

    def image_name(self, image: int) -> str:
        """Where image ``image`` lives, for messages: its source file and byte range, or the index's own bytes."""
        row = self.image_rows([image])
        source = self.meta["sources"][int(row["source"][0])] or str(self.path / "image_bytes.npy")
        a = int(row["offset"][0])
        return f"image {image} (document {int(row['doc'][0])}, item {int(row['item'][0])}) at {source} [{a}, " \
               f"{a + int(row['size'][0])})"  # fmt: skip

    def read_image(self, image: int, rows: dict[str, np.ndarray] | None = None, k: int = 0) -> bytes:
        """The bytes of image ``image``, checked against the CRC-32 recorded at build; ``rows``: its record already
        read (row ``k`` of :meth:`image_rows`' answer), else it is read here."""
        row = self.image_rows([image]) if rows is None else {name: rows[name][k : k + 1] for name in IMAGE_COLUMNS}
        source, offset, size = (int(row[k][0]) for k in ("source", "offset", "size"))
        if source == 0:
            data = np.asarray(self.image_bytes[offset : offset + size]).tobytes()
        else:
            path = self.meta["sources"][source]
            try:
                with open(path, "rb") as f:
                    f.seek(offset)
                    data = f.read(size)
            except OSError as exc:
                raise MediaError(f"{self.image_name(image)}: cannot read it ({exc.strerror})") from None
        crc = zlib.crc32(data)
        if crc != int(row["crc32"][0]):
            raise MediaError(
                f"{self.image_name(image)}: its bytes' CRC-32 is {crc:#010x}, the build recorded"
                f" {int(row['crc32'][0]):#010x}: the file changed since the index was built; rebuild it"
            )
        return data

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
