"""Opening an index again from where a :class:`~detsampler.record.DataRecord` says it lives.

Invariant: ``open_location(index_location(x))`` reads the same tokens as ``x`` (its ``fingerprint`` is equal), for a
built index, a sharded index and a pre-tokenized source; a location whose index changed since is refused by the
caller's fingerprint check, never read as if it had not.
"""

from __future__ import annotations

from typing import Any

from detsampler.index.sharded import open_index
from detsampler.index.sources import open_source

__all__ = ["open_location"]


def open_location(location: dict[str, Any]) -> Any:
    """The index, sharded index or pre-tokenized source at ``location`` (:func:`detsampler.record.index_location`)."""
    if not isinstance(location, dict) or not {"kind", "path"} <= set(location):
        raise ValueError(f"an index location is {{'kind': ..., 'path': ...}}, got {location!r}")
    if location["kind"] == "index":
        return open_index(location["path"])
    return open_source(location["kind"], location["path"], **location.get("options", {}))
