"""Issue 37, opens that fetch what they need, once: a pre-tokenized source in a bucket is identified without
downloading its token files on every open (a recorded identity bound to the objects' ETags and sizes), each small file
is fetched once per open, a cold open reads its token file once, and the requests of an open (the files of a source,
the sources of a mixture, the arrays of an index, the shards of a sharded index) are issued concurrently.

Against moto's S3 server (and the range server for a store without a strong ETag) behind ``tests.more_servers``'s
proxy, which records every answer (its Range and its bytes) and how many requests it held at once."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest

from detsampler.index import TokenIndex
from detsampler.index.format import ChecksumError
from detsampler.index.push import push_index
from detsampler.index.sources import open_source
from detsampler.layout import LayoutConfig
from detsampler.loader import PackedDataset, PrefetchConfig
from detsampler.plan import Plan
from detsampler.storage import store_for
from tests.more_servers import fault_proxy, range_http_server
from tests.test_sharded_sources import EOS, NAMES, _documents, _write

KINDS = ["megatron", "olmo", "datatrove", "nanogpt"]


def _source_files(kind: str, folder: Path, num_docs: int = 400, seed: int = 0) -> Path:
    """One ``kind`` file of ``num_docs`` documents in ``folder``; returns the path its opener takes."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / NAMES[kind].format(0)
    _write(kind, path, _documents(num_docs, seed, EOS, high=500))
    return path


def _token_name(kind: str, path: Path) -> str:
    return f"{path.name}.bin" if kind == "megatron" else path.name


def _upload(folder: Path, url: str) -> None:
    for f in sorted(folder.iterdir()):
        store_for(url).put(f"{url}/{f.name}", f)


def _gets(proxy, since: int, name: str) -> list[int]:
    """The bytes of each GET answered since answer ``since`` for the object ``name`` (the path's last part)."""
    return [n for m, p, _, n in proxy.answered[since:] if m == "GET" and p.split("?")[0].endswith(f"/{name}")]


@pytest.fixture
def proxied(s3_endpoint, monkeypatch, tmp_path):
    """moto's server behind the recording proxy, the client pointed at it, a fresh local cache."""
    monkeypatch.setenv("DETSAMPLER_CACHE", str(tmp_path / "cache"))
    with fault_proxy(s3_endpoint) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        yield proxy


@pytest.mark.parametrize("kind", KINDS)
def test_a_source_reopened_from_a_bucket_fetches_no_token_bytes_and_each_small_file_once(
    kind, s3_bucket, proxied, tmp_path
):
    # before: every open fetched the whole token file again for its identity (its sampled ranges merged into one GET),
    # a cold open read it twice and the .csv.gz twice, and the Megatron .idx was fetched twice on every open
    path = _source_files(kind, tmp_path / "data")
    url = f"{s3_bucket}/opens/{kind}"
    _upload(tmp_path / "data", url)
    token_name = _token_name(kind, path)
    size = (tmp_path / "data" / token_name).stat().st_size
    small = sorted(f.name for f in (tmp_path / "data").iterdir() if f.name != token_name)
    local = open_source(kind, path, eos_id=EOS)

    start = len(proxied.answered)
    cold = open_source(kind, f"{url}/{path.name}", eos_id=EOS)
    assert cold.fingerprint == local.fingerprint
    assert sum(_gets(proxied, start, token_name)) == size  # the token file read once: its scan and its identity
    assert all(len(_gets(proxied, start, name)) <= 1 for name in small)

    start = len(proxied.answered)
    warm = open_source(kind, f"{url}/{path.name}", eos_id=EOS)
    assert warm.fingerprint == local.fingerprint and np.array_equal(warm.offsets, local.offsets)
    assert _gets(proxied, start, token_name) == []  # its identity recorded, its scan cached: no token byte fetched
    want = {"megatron": [f"{path.name}.idx"], "datatrove": [f"{path.name}.index"]}.get(kind, [])
    assert [name for name in small if _gets(proxied, start, name)] == want  # the index file read once, nothing else
    assert all(len(_gets(proxied, start, name)) == 1 for name in want)
    heads = [p for m, p, _, _ in proxied.answered[start:] if m == "HEAD"]
    assert len(heads) == len(set(heads))  # each object asked about once


def test_a_recorded_identity_is_bound_to_the_objects_etag_and_a_damaged_record_is_replaced(
    s3_bucket, proxied, tmp_path, caplog
):
    path = _source_files("olmo", tmp_path / "data")
    url = f"{s3_bucket}/opens/bound"
    _upload(tmp_path / "data", url)
    first = open_source("olmo", f"{url}/{path.name}", eos_id=EOS)
    tokens = np.fromfile(path, dtype=np.uint32)
    tokens[3] = 499  # one token edited: the same size, another ETag
    tokens.tofile(path)
    store_for(url).put(f"{url}/{path.name}", path)
    edited = open_source("olmo", f"{url}/{path.name}", eos_id=EOS)
    assert edited.fingerprint == open_source("olmo", path, eos_id=EOS).fingerprint != first.fingerprint

    records = sorted((tmp_path / "cache" / "sources").glob("identity-*.json"))
    assert len(records) == 2
    for record in records:  # a damaged record: read again from the objects, said, and replaced
        text = record.read_text()
        record.write_text(text.replace(json.loads(text)["identity"][:8], "0" * 8))
    start = len(proxied.answered)
    with caplog.at_level(logging.WARNING, logger="detsampler"):
        again = open_source("olmo", f"{url}/{path.name}", eos_id=EOS)
    assert again.fingerprint == edited.fingerprint
    lines = [r.getMessage() for r in caplog.records if "identity" in r.getMessage()]
    assert len(lines) == 1 and "is damaged (its seal does not match its content)" in lines[0], lines
    assert sum(_gets(proxied, start, path.name)) == path.stat().st_size  # the identity read once more, in the scan
    start = len(proxied.answered)
    open_source("olmo", f"{url}/{path.name}", eos_id=EOS)
    assert _gets(proxied, start, path.name) == []  # replaced


def test_a_server_without_a_strong_etag_reads_the_token_file_once_per_open(tmp_path, monkeypatch, caplog):
    # a plain HTTP server sends no strong ETag: nothing can be recorded, so each open scans; before, it read the file
    # twice (the identity's sampled ranges merged into one whole GET, then the scan)
    monkeypatch.setenv("DETSAMPLER_CACHE", str(tmp_path / "cache"))
    path = _source_files("nanogpt", tmp_path / "data")
    with range_http_server(tmp_path / "data") as server, fault_proxy(server) as proxy:
        url = f"{proxy.endpoint}/{path.name}"
        local = open_source("nanogpt", path)
        for _ in range(2):
            start = len(proxy.answered)
            with caplog.at_level(logging.WARNING, logger="detsampler"):
                assert open_source("nanogpt", url).fingerprint == local.fingerprint
            assert sum(_gets(proxy, start, path.name)) == path.stat().st_size
        assert not (tmp_path / "cache" / "sources").exists() or not list(
            (tmp_path / "cache" / "sources").glob("identity-*")
        )
        assert sum("sends no strong ETag" in r.getMessage() for r in caplog.records) == 2


def test_the_files_of_a_source_and_the_sources_of_a_mixture_are_asked_for_concurrently(
    s3_endpoint, s3_bucket, tmp_path, monkeypatch, small_tokenizer
):
    # before: every request of an open waited for the one before it (a fresh process's first batch: 7.1 s from the
    # bucket at +50 ms per request, 2.4 s locally)
    from detsampler.index.prepare import IndexConfig, prepare_sources

    monkeypatch.setenv("DETSAMPLER_CACHE", str(tmp_path / "cache"))
    specs = []
    for k in range(3):
        path = _source_files("olmo", tmp_path / f"data{k}", seed=k)
        url = f"{s3_bucket}/opens/mix{k}"
        _upload(tmp_path / f"data{k}", url)
        specs.append(f"olmo:{url}/{path.name}")
    base = IndexConfig(tokenizer=str(small_tokenizer.path), cache_dir=str(tmp_path / "cache"))
    want = [p.index.fingerprint for p in prepare_sources(base, specs, progress=False)]
    with fault_proxy(s3_endpoint, hold_s=0.2) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        got = prepare_sources(base, specs, progress=False)
    assert [p.index.fingerprint for p in got] == want
    assert proxy.peak_in_flight >= 6  # the two files of each of the three sources at once
    assert len(proxy.answered) == 6  # warm: a HEAD of each file, nothing else


def test_an_index_in_a_bucket_opens_its_arrays_concurrently(small_index, s3_endpoint, s3_bucket, tmp_path, monkeypatch):
    url = f"{s3_bucket}/opens/index"
    push_index(small_index.path, url)
    with fault_proxy(s3_endpoint, hold_s=0.2) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        remote = TokenIndex.open(url)
    assert remote.fingerprint == small_index.fingerprint
    assert len(proxy.answered) == 7  # meta.json, then each array's first block and its checksums
    assert proxy.peak_in_flight >= 3  # ... the three arrays at once (two round trips in all, not six)


def test_prefetch_over_a_local_index_says_it_fetches_nothing(small_index, caplog):
    # an option that does nothing is said, never silently accepted
    layout = small_index.layout(LayoutConfig(kind="concat", seq_len=64))
    plan = Plan(layout.num_samples, global_batch_size=4, micro_batch_size=4)
    dataset = PackedDataset(small_index, layout, prefetch=PrefetchConfig(), plan=plan)
    with caplog.at_level(logging.INFO, logger="detsampler.prefetch"):
        dataset.get_batch(plan.micro_batch(0, 0, 0))
        dataset.get_batch(plan.micro_batch(1, 0, 0))
    lines = [r.getMessage() for r in caplog.records if r.name == "detsampler.prefetch"]
    assert lines == [
        f"prefetch: {small_index.path} is local (memory-mapped): nothing is fetched, prefetch does nothing here"
    ]
    assert dataset.prefetch_stats() is None


def test_prefetch_over_a_lengths_only_index_in_a_bucket_says_it_fetches_nothing(
    small_corpus, small_tokenizer, s3_bucket, tmp_path, caplog
):
    # issue 31's re-review: an index in a bucket that stores no tokens (tokenized on the fly from the dataset) read
    # the right batches and prefetched nothing without a word (prefetch_stats() None)
    import torch

    from detsampler.index.build import build_index
    from tests.index_copies import copy_with_layouts

    config = LayoutConfig(kind="concat", seq_len=64)
    lean = build_index(small_corpus, small_tokenizer, cache_dir=tmp_path / "built", store_tokens=False, progress=False)
    local = copy_with_layouts(lean, tmp_path / "copy", [config])
    url = f"{s3_bucket}/lengths-only-prefetch/{local.path.name}"
    push_index(local.path, url)
    remote = TokenIndex.open(url)
    assert remote.tokens is None
    layout = remote.layout(config)
    plan = Plan(layout.num_samples, global_batch_size=4, micro_batch_size=4)
    fly = {"dataset": small_corpus, "tokenizer": small_tokenizer}
    dataset = PackedDataset(remote, layout, prefetch=PrefetchConfig(), plan=plan, **fly)
    want = PackedDataset(local, local.layout(config), **fly)
    with caplog.at_level(logging.INFO, logger="detsampler.prefetch"):
        for step in range(2):
            ids = plan.micro_batch(step, 0, 0)
            got, expected = dataset.get_batch(ids), want.get_batch(ids)
            assert all(torch.equal(got[k], expected[k]) for k in expected)
    lines = [r.getMessage() for r in caplog.records if r.name == "detsampler.prefetch"]
    assert lines == [
        f"prefetch: {url} stores no tokens (they are tokenized on the fly from the dataset): nothing is fetched,"
        " prefetch does nothing here"
    ]
    assert dataset.prefetch_stats() is None


# -- a fresh process's first batch (issue 37): what its DataLoader worker fetches again, and the serial round trips


def _remote_dataset(local, url: str, config: LayoutConfig):
    """``local`` (an index with ``config``'s layout persisted) pushed to ``url`` and opened from there: the dataset
    with prefetch and its plan, as a training process builds them."""
    from detsampler.index.sharded import ShardedIndex

    opener = ShardedIndex.open if isinstance(local, ShardedIndex) else TokenIndex.open
    remote = opener(url)
    layout = remote.layout(config)
    plan = Plan(layout.num_samples, global_batch_size=4, micro_batch_size=4)
    return PackedDataset(remote, layout, prefetch=PrefetchConfig(), plan=plan), plan


def _worker_copy(dataset):
    """What a forkserver or spawned DataLoader worker gets: the dataset pickled and unpickled."""
    import pickle

    return pickle.loads(pickle.dumps(dataset))


def _same_batch(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(a[k].numpy().tobytes() == b[k].numpy().tobytes() for k in a)


@pytest.fixture
def remote_small(small_index, s3_bucket, tmp_path, monkeypatch):
    """``small_index`` with its concat layout of 64, pushed to the bucket: (local index, its URL, the config)."""
    from tests.index_copies import copy_with_layouts

    monkeypatch.setenv("DETSAMPLER_CACHE", str(tmp_path / "cache"))
    config = LayoutConfig(kind="concat", seq_len=64)
    local = copy_with_layouts(small_index, tmp_path / "copy", [config])
    url = f"{s3_bucket}/first-batch/{tmp_path.name}/{local.path.name}"
    push_index(local.path, url)
    return local, url, config


def test_a_worker_of_an_index_in_a_bucket_fetches_nothing_again_and_the_open_asks_each_object_once_together(
    remote_small, s3_endpoint, monkeypatch
):
    # before: the worker reopened the index and its layout from their URLs, the 14 requests of the main process's
    # open again (meta.json; each array's first block, then its checksums; a HEAD and a GET of layout.json, the
    # layout's arrays, then their checksums, then the fence): 8 round trips in series in each process, 16 before the
    # worker's first token block (now 4, in the main process alone); a changed object is still refused (the test
    # below)
    local, url, config = remote_small
    want = PackedDataset(local, local.layout(config))
    with fault_proxy(s3_endpoint, hold_s=0.2) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        dataset, plan = _remote_dataset(local, url, config)
        opened = [(m, p.split("?")[0].rsplit("/", 1)[-1]) for m, p, _ in proxy.seen]
        worker = _worker_copy(dataset)
        handed = len(proxy.seen)
        batch = worker.get_batch(plan.micro_batch(0, 0, 0))
        read = [(m, p.split("?")[0].rsplit("/", 1)[-1]) for m, p, _ in proxy.seen[handed:]]
    assert handed == len(opened)  # the worker's open: no request at all
    assert sorted(opened) == sorted(
        [("GET", "meta.json"), ("GET", "layout.json")]
        + [("GET", f) for a in ("lengths", "offsets", "tokens", "ends", "order") for f in (f"{a}.npy", f"{a}.sums.npy")]
        + [("GET", "ends.fence.npy")]
    )  # 13 requests, each object once, no HEAD
    assert read == []  # nothing at all: each array's block 0 (here the whole of each file) was handed over
    assert _same_batch(batch, want.get_batch(plan.micro_batch(0, 0, 0)))
    assert proxy.peak_in_flight >= 6  # each array's first block and its checksums at once (before: 3)


def test_a_handed_over_index_still_refuses_an_object_changed_after_the_open(
    small_tokenizer, s3_bucket, tmp_path, monkeypatch
):
    # the worker reads with the checksums the main process opened with: a token file replaced in between is refused
    # when a block of it is fetched (block 0, handed over from the main process, holds the bytes the index was opened
    # with, checked again as the worker takes it)
    from detsampler.index.build import build_index
    from detsampler.text.corpus import default_corpus
    from tests.index_copies import copy_with_layouts

    monkeypatch.setenv("DETSAMPLER_CACHE", str(tmp_path / "cache"))
    built = build_index(default_corpus(max_documents=48), small_tokenizer, cache_dir=tmp_path / "built", progress=False)
    config = LayoutConfig(kind="concat", seq_len=64)
    local = copy_with_layouts(built, tmp_path / "copy", [config])
    assert (local.path / "tokens.npy").stat().st_size > 1 << 20  # more than block 0
    url = f"{s3_bucket}/first-batch-changed/{tmp_path.name}/{local.path.name}"
    push_index(local.path, url)
    remote = TokenIndex.open(url)
    dataset = PackedDataset(remote, remote.layout(config))
    every = list(range(remote.layout(config).num_samples))  # they read every block
    tokens = np.load(local.path / "tokens.npy")
    changed = tmp_path / "tokens.npy"
    np.save(changed, (tokens.astype(np.int64) + 1).astype(tokens.dtype))  # same size, other bytes
    store_for(url).put(f"{url}/tokens.npy", changed)
    worker = _worker_copy(dataset)
    assert _same_batch(worker.get_batch([0]), PackedDataset(local, local.layout(config)).get_batch([0]))
    with pytest.raises(ChecksumError, match=r"tokens\.npy chunk \d+ \(bytes .*\) fails its checksum on both of two"):
        worker.get_batch(every)


def test_a_worker_of_a_sharded_index_in_a_bucket_fetches_nothing_again(
    small_corpus, small_tokenizer, s3_bucket, s3_endpoint, tmp_path, monkeypatch
):
    # before: the worker reopened the manifest, every shard and the layout: the main process's 37 requests again
    from detsampler.index.push import push
    from tests.test_sharded_push import _sharded

    monkeypatch.setenv("DETSAMPLER_CACHE", str(tmp_path / "cache"))
    local = _sharded(tmp_path, "s", list(small_corpus["text"]), small_tokenizer)
    config = LayoutConfig(kind="concat", seq_len=64)
    local.layout(config)
    url = f"{s3_bucket}/first-batch-sharded/{tmp_path.name}/{local.path.name}"
    push(local.path, url)
    want = PackedDataset(local, local.layout(config))
    with fault_proxy(s3_endpoint) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        dataset, plan = _remote_dataset(local, url, config)
        opened = len(proxy.seen)
        worker = _worker_copy(dataset)
        handed = len(proxy.seen)
        batch = worker.get_batch(plan.micro_batch(0, 0, 0))
        read = proxy.seen[handed:]
    assert handed == opened
    assert read == []  # each array's block 0 (here the whole of each file) was handed over
    assert _same_batch(batch, want.get_batch(plan.micro_batch(0, 0, 0)))
