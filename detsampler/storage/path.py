"""A remote object's name with the few ``pathlib`` reads an index reader uses (``/``, ``name``, ``parent``, ``suffix``,
``with_name``, ``is_file``, ``read_bytes``, ``read_text``, ``open('rb')``, ``stat().st_size``), served by the store.

Invariant: :func:`as_path` returns a :class:`pathlib.Path` for a local location (so local code paths, memory maps
included, are exactly today's) and a :class:`RemotePath` for a URL; ``str()`` of either gives back what parses to the
same location. A :class:`RemotePath` never has an ``os.fspath`` (``open()`` of it is a ``TypeError``, never a local file
of a similar name).
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from types import SimpleNamespace

from detsampler.storage.store import store_for
from detsampler.storage.urls import join, parse_location

__all__ = ["RemotePath", "as_path"]


class RemotePath:
    """The object (or prefix) at a remote URL; reads go through :func:`~detsampler.storage.store.store_for`."""

    def __init__(self, url: str) -> None:
        loc = parse_location(url)
        if not loc.remote:
            raise ValueError(f"RemotePath takes a remote URL, got {url!r}")
        self.url = str(loc)

    def __truediv__(self, name: str) -> RemotePath:
        return RemotePath(join(self.url, str(name)))

    def __str__(self) -> str:
        return self.url

    def __repr__(self) -> str:
        return f"RemotePath({self.url!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RemotePath) and other.url == self.url

    def __hash__(self) -> int:
        return hash(self.url)

    @property
    def name(self) -> str:
        return self.url.rsplit("/", 1)[-1] if parse_location(self.url).key else ""

    @property
    def suffix(self) -> str:
        name = self.name
        return name[name.rfind(".") :] if "." in name.lstrip(".") else ""

    def with_name(self, name: str) -> RemotePath:
        return self.parent / name

    def open(self, mode: str = "rb") -> io.BytesIO:
        """The whole object, read once, as a binary file (for small files: ``gzip.open`` of it, headers)."""
        if mode != "rb":
            raise ValueError(f"{self.url}: an object opens for reading only ('rb'), got mode {mode!r}")
        return io.BytesIO(self.read_bytes())

    @property
    def parent(self) -> RemotePath:
        loc = parse_location(self.url)
        return RemotePath(f"{loc.scheme}://{loc.bucket}/{loc.key.rpartition('/')[0]}")

    def is_file(self) -> bool:
        return store_for(self.url).exists(self.url)

    def exists(self) -> bool:
        return self.is_file() or self.is_dir()

    def is_dir(self) -> bool:
        return bool(store_for(self.url).list(self.url))

    def stat(self) -> SimpleNamespace:
        return SimpleNamespace(st_size=store_for(self.url).size(self.url))

    def read_bytes(self) -> bytes:
        return store_for(self.url).read_head(self.url, -1)[0]  # one GET

    def read_text(self, encoding: str = "utf-8") -> str:
        return self.read_bytes().decode(encoding)


def as_path(path: str | os.PathLike | RemotePath) -> Path | RemotePath:
    """A :class:`pathlib.Path` for a local location, a :class:`RemotePath` for a remote URL."""
    if isinstance(path, (Path, RemotePath)):
        return path
    loc = parse_location(path)
    return RemotePath(str(loc)) if loc.remote else Path(loc.key)
