"""Where an object lives: a URL (``s3://``, ``gs://``, ``az://``/``abfs://``, ``https://``) or a local path.

Invariant: :func:`parse_location` is total on strings and paths: a plain path (or ``file://``) is local, a URL of a
supported scheme is remote (its bucket and key split at the first ``/`` after the scheme), and any other ``scheme://``
is refused by name. ``str(parse_location(x))`` gives back a URL that parses to the same location.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["REMOTE_SCHEMES", "Location", "is_remote", "join", "parse_location"]

# the schemes an object store serves (obstore's names; ``abfs``/``abfss`` and ``gcs`` are aliases its builders accept)
REMOTE_SCHEMES = ("s3", "gs", "gcs", "az", "abfs", "abfss", "https", "http")


@dataclass(frozen=True)
class Location:
    """A parsed location: ``scheme`` is ``"file"`` for a local path (``key`` then holds the whole path, ``bucket`` is
    empty), else the URL's scheme, its ``bucket`` (for ``https``: the host) and its ``key`` (no leading ``/``)."""

    scheme: str
    bucket: str
    key: str

    @property
    def remote(self) -> bool:
        return self.scheme != "file"

    def __str__(self) -> str:
        return self.key if not self.remote else f"{self.scheme}://{self.bucket}/{self.key}".rstrip("/")


def parse_location(path: str | os.PathLike) -> Location:
    """The location ``path`` names (see the module invariant)."""
    text = os.fspath(path)
    if not isinstance(text, str):
        raise TypeError(f"a location is a str or a path, got {type(path).__name__}")
    scheme, sep, rest = text.partition("://")
    if not sep or "/" in scheme:
        return Location("file", "", text)
    scheme = scheme.lower()
    if scheme == "file":
        return Location("file", "", rest)
    if scheme not in REMOTE_SCHEMES:
        raise ValueError(
            f"Got location {text!r} with scheme {scheme!r}, allowed schemes are {['file', *REMOTE_SCHEMES]}"
        )
    bucket, _, key = rest.partition("/")
    if not bucket:
        raise ValueError(f"Got location {text!r}: it names no bucket (expected {scheme}://BUCKET/KEY)")
    return Location(scheme, bucket, key.strip("/"))


def is_remote(path: str | os.PathLike) -> bool:
    """Whether ``path`` names an object in a remote store (a URL of :data:`REMOTE_SCHEMES`)."""
    return parse_location(path).remote


def join(url: str, *names: str) -> str:
    """``url`` with ``names`` appended, ``/``-separated (a URL or a local path)."""
    out = str(url).rstrip("/")
    for name in names:
        out = f"{out}/{str(name).strip('/')}"
    return out
