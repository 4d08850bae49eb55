"""Where interleaved image-text documents come from: a Hugging Face ``datasets.Dataset`` (an ``Image`` feature, image
bytes read from parquet, or paths of files in a directory) or webdataset tar shards.

Every source yields, in a fixed order, :class:`Document`\\ s: a name (for errors and audits), the text, and its images
as :class:`ImageRef`\\ s holding the bytes and where they live: a byte range of a file (a tar shard, a file in a
directory), or nothing, when the bytes live inside the dataset's own tables (then the build copies them into the
index). A source's ``identity`` names its content (the dataset's fingerprint, the shards' content hashes) and joins the
index's cache key. No image is decoded here: the build reads each one's header only.
"""

from __future__ import annotations

import io
import json
import os
import posixpath
import tarfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from detsampler.storage import is_remote, store_for

__all__ = [
    "IMAGE_EXTENSIONS",
    "IMAGE_ORDER_VERSION",
    "Document",
    "ImageRef",
    "MediaSource",
    "dataset_source",
    "webdataset_source",
]

IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp")
_BATCH_ROWS = 256
# The rule ordering a webdataset sample's images (:func:`_numbered_images`), in every webdataset source's identity so
# an index built under another rule is never taken from the cache: 1 is KEY.<ext> alone or KEY.<number>.<ext> by
# number (before it, a text sample's images were in member order: KEY.10.png before KEY.2.jpg). Tick it when it changes.
IMAGE_ORDER_VERSION = 1


@dataclass(frozen=True)
class ImageRef:
    """One image of a document: ``name`` (source and item, for errors), its ``data``, and where the bytes live:
    ``path`` and ``offset`` of a byte range of a file, or ``path`` None (inside the dataset: copied into the index)."""

    name: str
    data: bytes = field(repr=False)
    path: str | None = None
    offset: int = 0


@dataclass(frozen=True)
class Document:
    """``name`` (e.g. ``shard-00001.tar:000042`` or ``row 17``), ``text`` (image placeholders in it, or none: see
    ``MediaBuildConfig.placeholders``) and ``images`` in document order; for chat data ``messages`` (the conversation,
    its ``{"type": "image"}`` parts in the order of ``images``) and ``text`` empty."""

    name: str
    text: str
    images: list[ImageRef]
    messages: list | None = None


@dataclass(frozen=True)
class MediaSource:
    """A source of documents: ``kind``, ``identity`` (JSON-able; names the content, joins the cache key),
    ``describe`` (what the index records of it) and ``documents`` (a function yielding them in order);
    ``messages_column``: the column of conversations (chat data), or None (text)."""

    kind: str
    identity: dict
    describe: dict
    documents: Any = field(repr=False)
    messages_column: str | None = None

    def __iter__(self) -> Iterator[Document]:
        return iter(self.documents())


def _read_range(path: str, offset: int, size: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(size)


def _dataset_images(value: Any, row: int, column: str, root: Path | None) -> list[ImageRef]:
    """A row's images: a list of ``{"bytes", "path"}`` dicts (the ``Image`` feature, undecoded) or of paths."""
    if value is None:
        return []
    if not isinstance(value, (list, tuple)):
        value = [value]
    out = []
    for k, item in enumerate(value):
        name = f"row {row} {column}[{k}]"
        if isinstance(item, dict) and item.get("bytes") is not None:
            out.append(ImageRef(f"{name} ({item.get('path') or 'bytes'})", bytes(item["bytes"])))
            continue
        path = item.get("path") if isinstance(item, dict) else item
        if not isinstance(path, (str, os.PathLike)) or not str(path):
            raise ValueError(f"{name}: neither image bytes nor a path, got {type(item).__name__}")
        full = Path(path) if root is None or Path(path).is_absolute() else root / path
        try:
            data = full.read_bytes()
        except OSError as exc:
            raise ValueError(f"{name}: cannot read the image file {str(full)!r} ({exc.strerror})") from None
        out.append(ImageRef(f"{name} ({full})", data, str(full.resolve()), 0))
    return out


def _check_column(dataset: Any, column: str) -> None:
    if column not in dataset.column_names:
        raise ValueError(f"dataset has no column {column!r} (its columns: {', '.join(dataset.column_names)})")


def dataset_source(
    dataset: Any,
    text_column: str = "text",
    images_column: str = "images",
    image_root: str | os.PathLike | None = None,
    messages_column: str | None = None,
) -> MediaSource:
    """The rows of a ``datasets.Dataset``: ``text_column`` holds the text, ``images_column`` a list of images per row
    (an ``Image`` feature or a list of them: read as stored, never decoded; or paths of files, relative to
    ``image_root``). Parquet files with image bytes load as such a dataset (``datasets.Dataset.from_parquet``).
    Chat data: ``messages_column`` holds each row's conversation (contents of ``{"type": "image"}`` and
    ``{"type": "text", "text"}`` parts, the images of ``images_column`` in the order of their parts) and
    ``text_column`` is not read; build it with ``chat=ChatConfig(...)``.

    Its identity is the dataset's fingerprint: image files named by path are not in it (their CRC-32s, recorded at
    build, are checked at every read instead)."""
    from detsampler.index.format import dataset_fingerprint
    from detsampler.text.corpus import check_text_column

    if messages_column is None:
        check_text_column(dataset, text_column)
    else:
        _check_column(dataset, messages_column)
    _check_column(dataset, images_column)
    root = None if image_root is None else Path(image_root).resolve()
    identity = {
        "kind": "dataset",
        "fingerprint": dataset_fingerprint(dataset),
        "num_rows": len(dataset),
        "text_column": text_column,
        "images_column": images_column,
        **({} if messages_column is None else {"text_column": None, "messages_column": messages_column}),
    }
    column = text_column if messages_column is None else messages_column

    def documents() -> Iterator[Document]:
        table = dataset.with_format("arrow")
        for a in range(0, len(dataset), _BATCH_ROWS):
            batch = table[a : a + _BATCH_ROWS]
            values = batch.column(column).to_pylist()
            images = batch.column(images_column).to_pylist()
            for i, (value, listed) in enumerate(zip(values, images)):
                row = a + i
                refs = _dataset_images(listed, row, images_column, root)
                if messages_column is not None:
                    yield Document(f"row {row}", "", refs, value)
                    continue
                if not isinstance(value, str):
                    raise ValueError(f"row {row} {text_column}: not a string, got {type(value).__name__}")
                yield Document(f"row {row}", value, refs)

    describe = {**identity, "image_root": None if root is None else str(root)}
    return MediaSource("dataset", identity, describe, documents, messages_column)


def _wds_key(member: str) -> tuple[str, str]:
    """webdataset's split of a member name: the key is everything before the first dot of the base name."""
    directory, _, base = member.rpartition("/")
    stem, _, ext = base.partition(".")
    return (f"{directory}/{stem}" if directory else stem), ext


def _open_shard(path: str) -> tuple[str, list, Any]:
    """A shard's name, its samples (consecutive members sharing a key: ``(key, [(extension, member), ...])``) and a
    reader of its byte ranges. A shard in an object store (``path`` a URL) is read whole, once, in one request."""
    try:
        data = None
        if is_remote(path):
            data = store_for(path).read_head(path, -1)[0]
        opened = tarfile.open(path, "r:") if data is None else tarfile.open(fileobj=io.BytesIO(data), mode="r:")
        with opened as tar:
            members = [m for m in tar.getmembers() if m.isfile()]
    except (tarfile.TarError, OSError) as exc:
        raise ValueError(f"webdataset shard {path!r}: not a readable tar file ({exc})") from None
    read = (lambda a, n: _read_range(path, a, n)) if data is None else (lambda a, n: data[a : a + n])
    groups: list[tuple[str, list[tuple[str, tarfile.TarInfo]]]] = []
    for m in members:
        key, ext = _wds_key(m.name)
        if not groups or groups[-1][0] != key:
            groups.append((key, []))
        groups[-1][1].append((ext, m))
    return posixpath.basename(path), groups, read


def _is_image(ext: str) -> bool:
    return ext.rpartition(".")[2].lower() in IMAGE_EXTENSIONS


def _one_member(name: str, key: str, parts: list, extension: str, rule: str) -> tarfile.TarInfo:
    """The sample's one member ``key.extension``; refused, naming shard and key, when it has none or several."""
    found = [m for ext, m in parts if ext == extension]
    if len(found) != 1:
        raise ValueError(
            f"{name}:{key}: {'no member' if not found else f'{len(found)} members'} {key}.{extension}; {rule}"
            f" (its members: {', '.join(m.name for _, m in parts)})"
        )
    return found[0]


def _numbered_images(name: str, key: str, parts: list, chat: bool) -> list[tarfile.TarInfo]:
    """A sample's image members in the order of its image parts (chat) or placeholders (text): ``KEY.<ext>`` alone,
    or ``KEY.<number>.<ext>`` by number (``KEY.2.jpg`` before ``KEY.10.png``, whatever the member order: webdataset's
    ``TarWriter`` writes a sample's members sorted by name). The rule's version is :data:`IMAGE_ORDER_VERSION`; an
    image numbered twice, an unnumbered one beside others or a named one (``KEY.left.jpg``) is refused naming shard and
    key."""
    sample, whose, places = (
        ("chat sample", "the conversation's", "image parts") if chat else ("sample", "the text's", "image placeholders")
    )
    plain, numbered = [], {}
    for ext, m in parts:
        if not _is_image(ext):
            continue
        number = ext.rpartition(".")[0]
        if not number:
            plain.append(m)
        elif not (number.isascii() and number.isdigit()):
            raise ValueError(
                f"{name}:{key}: image {m.name} is not KEY.<ext> or KEY.<number>.<ext>; the number gives its place among"
                f" {whose} {places}"
            )
        elif int(number) in numbered:
            raise ValueError(
                f"{name}:{key}: images {numbered[int(number)].name} and {m.name} are both number {int(number)}; each"
                f" image of a {sample} needs its own number (KEY.0.jpg, KEY.1.png, ...)"
            )
        else:
            numbered[int(number)] = m
    if plain and (numbered or len(plain) > 1):
        others = [m.name for m in [*plain[:-1], *numbered.values()]]
        raise ValueError(
            f"{name}:{key}: image {plain[-1].name} has no number beside {'numbered images' if numbered else 'another'}"
            f" ({', '.join(others)}); a {sample}'s images are one KEY.<ext>, or KEY.0.<ext>, KEY.1.<ext>, ... in"
            f" the order of its {places}"
        )
    return plain or [numbered[n] for n in sorted(numbered)]


def _conversation(where: str, data: bytes, extension: str) -> list:
    """The messages of a chat sample's ``KEY.<extension>`` member: a JSON list, or an object whose ``messages`` is
    one."""
    allowed = f'a chat sample\'s KEY.{extension} holds its messages list or {{"messages": [...]}}'
    try:
        value = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise ValueError(f"{where}: not UTF-8; {allowed}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: not JSON ({exc}); {allowed}") from None
    if isinstance(value, dict) and "messages" in value:
        if isinstance(value["messages"], list):
            return value["messages"]
        got = f'{{"messages": {type(value["messages"]).__name__} {json.dumps(value["messages"])[:60]}}}'
    elif isinstance(value, dict):
        got = f"an object without 'messages' (its keys: {', '.join(map(repr, list(value)[:8]))})"
    elif isinstance(value, list):
        return value
    else:
        got = f"{type(value).__name__} {json.dumps(value)[:60]}"
    raise ValueError(f'{where}: holds {got}, not a messages list or {{"messages": [...]}}')


def _shard_documents(
    path: str, text_extension: str | None, messages_extension: str | None = None
) -> Iterator[Document]:
    """The samples of one tar shard in member order: the text of ``<key>.<text_extension>``, or (``messages_extension``
    set) the conversation of ``<key>.<messages_extension>`` (:func:`_conversation`); for both, the images in the order
    of their numbers (:func:`_numbered_images`), never member order. Images are recorded as byte ranges of the shard
    (of the object, for a URL)."""
    name, groups, read = _open_shard(path)
    for key, parts in groups:
        if messages_extension is None:
            member = _one_member(name, key, parts, str(text_extension), "a sample has one text")
        else:
            member = _one_member(name, key, parts, messages_extension, "a chat sample holds its conversation there")
        images = _numbered_images(name, key, parts, chat=messages_extension is not None)
        data = read(member.offset_data, member.size)
        refs = [ImageRef(f"{name}:{m.name}", read(m.offset_data, m.size), path, m.offset_data) for m in images]
        if messages_extension is not None:
            yield Document(f"{name}:{key}", "", refs, _conversation(f"{name}:{member.name}", data, messages_extension))
            continue
        try:
            decoded = data.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"{name}:{member.name}: the text is not UTF-8") from None
        yield Document(f"{name}:{key}", decoded, refs)


def _wds_fields(text_extension: str, messages_extension: str | None) -> dict:
    """What a webdataset source's identity holds of its members: the text's extension, or the conversation's, and the
    version of the rule ordering a sample's images (:data:`IMAGE_ORDER_VERSION`)."""
    if messages_extension is None:
        return {"text": text_extension, "image_order": IMAGE_ORDER_VERSION}
    if (
        not isinstance(messages_extension, str)
        or not messages_extension
        or messages_extension.startswith(".")
        or _is_image(messages_extension)
    ):
        raise ValueError(
            f"messages_extension must be the extension of a chat sample's conversation member, such as 'json' (no dot,"
            f" not an image's), got {messages_extension!r}"
        )
    return {"text": None, "messages": messages_extension, "image_order": IMAGE_ORDER_VERSION}


def _remote_shards(urls: list[str], fields: dict) -> MediaSource:
    """The webdataset shards at ``urls`` in an object store (one prefix). Identity: each shard's name, size and ETag
    (the store's content stamp: it changes whenever the object is written); a shard without an ETag is refused."""
    roots = {posixpath.dirname(u) for u in urls}
    if len(roots) != 1:
        raise ValueError(f"webdataset shards must be under one prefix, got {len(roots)}: {sorted(roots)}")
    stamps = []
    for url in urls:
        size, etag, _ = store_for(url).version(url)
        if etag in ("", "None"):
            raise ValueError(f"webdataset shard {url!r}: the store gives it no ETag, so nothing names its content")
        stamps.append([posixpath.basename(url), size, etag])
    identity = {"kind": "webdataset", "objects": stamps, **fields}

    def documents() -> Iterator[Document]:
        for url in urls:
            yield from _shard_documents(url, fields["text"], fields.get("messages"))

    describe = {**identity, "root": roots.pop(), "num_bytes": sum(s[1] for s in stamps)}
    return MediaSource("webdataset", identity, describe, documents, _messages_column(fields.get("messages")))


def _messages_column(messages_extension: str | None) -> str | None:
    return None if messages_extension is None else "messages"


def webdataset_source(
    shards: Sequence[str | os.PathLike],
    text_extension: str = "txt",
    cache_dir: str | os.PathLike | None = None,
    messages_extension: str | None = None,
) -> MediaSource:
    """The samples of webdataset tar ``shards`` (in the given order: local files, or objects in a bucket, ``s3://``,
    ``gs://``, ...): each sample's members share a key (``000042.txt``, ``000042.jpg`` or ``000042.0.png``,
    ``000042.1.webp``, ...); its images are byte ranges of the shard, never copied, read by ranged requests when the
    shard is an object, in the order of their numbers (the placeholders' order; never member order), the rule whose
    version :data:`IMAGE_ORDER_VERSION` joins the identity. Identity: local shards' content fingerprint (hashed once,
    then cached by file stat); objects' names, sizes and ETags.

    Chat data: ``messages_extension`` (e.g. ``"json"``) names the member holding each sample's conversation, a JSON
    list of messages or an object ``{"messages": [...]}`` (other keys ignored), whose contents hold ``{"type":
    "image"}`` parts; the sample's images are ``KEY.<ext>`` (one image) or ``KEY.0.<ext>``, ``KEY.1.<ext>``, ... in
    the order of their numbers, the order of the parts; ``text_extension`` is not read. The source's messages column
    is ``"messages"`` (``ChatConfig``'s default column); build it with ``chat=ChatConfig(...)``."""
    from detsampler.index.format import default_cache_dir
    from detsampler.text.fingerprint import content_fingerprint

    if not shards:
        raise ValueError("webdataset_source needs at least one shard")
    fields = _wds_fields(text_extension, messages_extension)
    remote = [is_remote(str(s)) for s in shards]
    if any(remote):
        if not all(remote):
            raise ValueError("webdataset shards must be all local files or all objects in a store, not a mix")
        return _remote_shards([str(s) for s in shards], fields)
    paths = [Path(s).resolve() for s in shards]
    if not paths:
        raise ValueError("webdataset_source needs at least one shard")
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise ValueError(f"webdataset shard {missing[0]!r} does not exist")
    roots = {p.parent for p in paths}
    if len(roots) != 1:
        raise ValueError(f"webdataset shards must be in one directory, got {len(roots)}: {sorted(map(str, roots))}")
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    fp = content_fingerprint(paths[0].parent, paths, "webdataset", cache)
    identity = {"kind": "webdataset", "content": fp.digest, "shards": [p.name for p in paths], **fields}

    def documents() -> Iterator[Document]:
        for p in paths:  # resolved: the path each image record names
            yield from _shard_documents(str(p), text_extension, messages_extension)

    describe = {**identity, "root": str(paths[0].parent), "num_bytes": fp.num_bytes}
    return MediaSource("webdataset", identity, describe, documents, _messages_column(messages_extension))
