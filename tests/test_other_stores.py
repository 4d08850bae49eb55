"""Indexes in Azure Blob storage (``az://``, against Microsoft's azurite emulator on loopback) and behind HTTP
(``http(s)://``, a range-serving HTTP server on loopback) read the local batches byte for byte, and a tampered object is
refused by its chunk checksum, as over S3 (tests/test_remote_index.py): the storage layer is one code path for every
object store ``obstore`` reaches."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from detsampler.index import TokenIndex
from detsampler.index.checksums import ChecksumError
from detsampler.index.format import TokenIndexError
from detsampler.index.push import push_index
from detsampler.layout import LayoutConfig
from detsampler.loader import PackedDataset
from detsampler.storage import store_for
from tests.index_copies import copy_with_layouts
from tests.more_servers import AZURITE_BIN, azurite, create_container, range_http_server

CONFIGS = [LayoutConfig(kind="concat", seq_len=64, seed=1), LayoutConfig(kind="bestfit", seq_len=128, seed=3)]


@pytest.fixture(scope="module")
def local(small_index, tmp_path_factory) -> TokenIndex:
    """A copy of the small index with the layouts of CONFIGS persisted beside it."""
    return copy_with_layouts(small_index, tmp_path_factory.mktemp("stores"), CONFIGS)


@pytest.fixture(scope="module")
def container():
    if not AZURITE_BIN.exists():
        pytest.skip(f"azurite is not installed at {AZURITE_BIN}: `make venv` installs it where npm is on the machine")
    with azurite() as endpoint:
        yield create_container(endpoint, "detsampler")


def assert_same_batches(local: TokenIndex, remote: TokenIndex) -> None:
    for config in CONFIGS:
        want_ds, got_ds = PackedDataset(local, local.layout(config)), PackedDataset(remote, remote.layout(config))
        assert str(got_ds.layout.path).startswith(str(remote.path))  # the pushed layout, not one computed in RAM
        ids = np.random.default_rng(0).permutation(len(want_ds))[:32]
        for chunk in np.array_split(ids, 2):
            want, got = want_ds.get_batch(chunk), got_ds.get_batch(chunk)
            assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)


def test_an_index_pushed_to_azure_blob_storage_reads_the_local_batches(local, container):
    url = f"{container}/runs/{local.path.name}"
    push_index(local.path, url)
    remote = TokenIndex.open(url)
    assert str(remote.path) == url and remote.fingerprint == local.fingerprint and not remote.tokens.memory_mapped
    assert_same_batches(local, remote)


def test_two_pushes_racing_to_one_azure_prefix_one_wins_the_other_is_refused(container, tmp_path):
    """Azure's create-only write (``If-None-Match: *``, answered 409) holds the prefix for one push (issue 31)."""
    from detsampler.index.synthetic import synthetic_index
    from tests.test_remote_audits import _race

    rivals = [synthetic_index(tmp_path / name, 300_000 + k, mean_length=300) for k, name in enumerate("ab")]
    url = f"{container}/race/index"
    won, lost = _race([index.path for index in rivals], url)
    assert len(won) == 1 and len(lost) == 1 and f"push to {url} refused: another push holds" in str(lost[0])
    winner = next(index for index in rivals if index.path == won[0])
    assert TokenIndex.open(url, verify_tokens=True).fingerprint == winner.fingerprint
    assert push_index(winner.path, url).exclusive


def test_a_tampered_azure_blob_is_refused_by_its_chunk_checksum(local, container):
    url = f"{container}/tampered/{local.path.name}"
    push_index(local.path, url)
    raw = bytearray((local.path / "tokens.npy").read_bytes())
    raw[200_000] ^= 1  # one bit in chunk 3
    store_for(url).put(f"{url}/tokens.npy", bytes(raw))
    with pytest.raises(ChecksumError, match=r"tokens\.npy chunk 3 \(bytes 196608\.\.262143\) fails its checksum"):
        np.asarray(TokenIndex.open(url).tokens)


def test_an_index_served_over_http_reads_the_local_batches_and_a_missing_one_is_named(local):
    with range_http_server(local.path.parent) as server:
        url = f"{server}/{local.path.name}"
        remote = TokenIndex.open(url)
        assert str(remote.path) == url and remote.fingerprint == local.fingerprint
        assert_same_batches(local, remote)
        with pytest.raises(TokenIndexError, match=f"no index at '{server}/nothing-here' \\(no meta.json"):
            TokenIndex.open(f"{server}/nothing-here")


def test_a_push_to_a_read_only_http_server_is_refused_at_once_not_retried(local, caplog):
    """Issue 31 (re-run): a push to an HTTP server that serves reads only (501 Not Implemented for PUT) retried its
    claim 5 times (3.1 s, 5 warnings), as if the status could pass; 501 and 505 say the server never does it."""
    import logging

    from detsampler.index.push import push_index
    from detsampler.storage import StorageError

    refused = r"PUT failed, a failure that is not retried \(.*501 Not Implemented"
    with (
        range_http_server(local.path.parent) as server,
        caplog.at_level(logging.WARNING, "detsampler.storage"),
        pytest.raises(StorageError, match=refused),
    ):
        push_index(local.path, f"{server}/pushed")
    assert [r.getMessage() for r in caplog.records if "retry" in r.getMessage()] == []


def test_a_write_into_an_azure_container_that_does_not_exist_names_the_container(local, container):
    """Issue 31 (re-review): a write into a missing S3 bucket names the bucket (tests/test_storage.py), tested on moto
    only. On azurite (404 ContainerNotFound) the container was named too, but called a bucket. A plain PUT, a tagged
    one, a create-only one and a push each name the container as one."""
    import re

    from detsampler.storage import ObjectNotFoundError, StorageError

    base = "az://no-such-container-31/a"
    store = store_for(base)
    said = f"{base}/x: {{}} failed: the container 'no-such-container-31' does not exist (create it first)"
    for what, write in (
        ("PUT", lambda: store.put(f"{base}/x", b"1")),
        ("PUT", lambda: store.put_tagged(f"{base}/x", b"1")),
        ("create-only PUT", lambda: store.create(f"{base}/x", b"1")),
    ):
        with pytest.raises(StorageError, match=re.escape(said.format(what))) as caught:
            write()
        assert not isinstance(caught.value, ObjectNotFoundError)
    with pytest.raises(StorageError, match=re.escape("the container 'no-such-container-31' does not exist")):
        push_index(local.path, base)


def test_a_changed_azure_endpoint_is_another_server_not_the_old_one(container, monkeypatch):
    """Issue 37 (the range-reading store): a store's client was kept per bucket and ``AWS_ENDPOINT_URL`` only, so after
    ``AZURITE_BLOB_STORAGE_URL`` named another server (a proxy in front of azurite) every read still went to the first
    one. The client is now keyed by the whole environment of its scheme: the next read goes through the proxy."""
    from detsampler.storage.store import ObjectStore
    from tests.more_servers import fault_proxy

    store, url = ObjectStore(), f"{container}/endpoint-37/x"
    store.put(url, b"abcdef")
    assert store.read_ranges(url, [(1, 4)], coalesce_bytes=0) == [b"bcd"]  # a client for azurite itself
    with fault_proxy(os.environ["AZURITE_BLOB_STORAGE_URL"]) as proxy:
        monkeypatch.setenv("AZURITE_BLOB_STORAGE_URL", proxy.endpoint)
        assert store.read_ranges(url, [(2, 5)], coalesce_bytes=0) == [b"cde"]
        assert proxy.fetched("endpoint-37/x") == (1, 3)
