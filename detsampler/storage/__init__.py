"""The storage layer: where an index's arrays, records and manifests are read from and written to.

A location is a local path (read through memory maps, as always) or a URL of an object store (``s3://``, ``gs://``,
``az://``/``abfs://``, ``https://``), read by ranged requests in blocks that the index's chunk checksums check as they
arrive. Modules: :mod:`~detsampler.storage.urls` (parsing), :mod:`~detsampler.storage.store` (the stores, retries),
:mod:`~detsampler.storage.path` (a remote object's ``pathlib``-like name), :mod:`~detsampler.storage.blocks` (reads by
blocks, the block cache interface), :mod:`~detsampler.storage.arrays` (a remote ``.npy`` array). This package imports
numpy and (lazily, for remote locations) ``obstore``; nothing above it.
"""

from detsampler.storage.arrays import RemoteArray, open_npy
from detsampler.storage.blocks import DEFAULT_BLOCK_BYTES, BlockCache, BlockedObject, BlockKey
from detsampler.storage.path import RemotePath, as_path
from detsampler.storage.store import (
    CreateOnlyUnsupportedError,
    LocalStore,
    ObjectNotFoundError,
    ObjectStore,
    RangeReader,
    RetryPolicy,
    StorageError,
    Store,
    store_for,
)
from detsampler.storage.urls import Location, is_remote, join, parse_location

__all__ = [
    "DEFAULT_BLOCK_BYTES",
    "BlockCache",
    "BlockKey",
    "BlockedObject",
    "CreateOnlyUnsupportedError",
    "LocalStore",
    "Location",
    "ObjectNotFoundError",
    "ObjectStore",
    "RangeReader",
    "RemoteArray",
    "RemotePath",
    "RetryPolicy",
    "StorageError",
    "Store",
    "as_path",
    "is_remote",
    "join",
    "open_npy",
    "parse_location",
    "store_for",
]
