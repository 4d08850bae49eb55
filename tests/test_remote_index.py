"""Indexes read from object storage (issue 22, items 3-5), against moto's real S3 server on loopback: batches from
``s3://`` equal the local ones byte for byte for every layout; opening reads the small files only; a tampered object is
refused by its chunk checksum; a server that stops is retried then refused naming the object; a push killed midway
leaves nothing that opens. Issue 31: a stalled server at open is retried and each retry logged; a block corrupted in
transit is fetched again and used (recovered), one stored wrong fails twice and is refused as such; a zero-byte
object is named with its size."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from typing import Any

import numpy as np
import pytest
import torch

from detsampler.index import TokenIndex
from detsampler.index.checksums import ChecksumError
from detsampler.index.format import TokenIndexError
from detsampler.index.locations import open_location
from detsampler.index.push import push, push_index
from detsampler.index.synthetic import synthetic_index
from detsampler.layout import LayoutConfig
from detsampler.loader import PackedDataset
from detsampler.record import index_location
from detsampler.storage import StorageError, store_for
from tests.index_copies import copy_with_layouts
from tests.more_servers import fault_proxy
from tests.s3_server import create_bucket, moto_server

CONFIGS = [
    LayoutConfig(kind="concat", seq_len=64, seed=1),
    LayoutConfig(kind="document", seq_len=64, seed=2),
    LayoutConfig(kind="bestfit", seq_len=128, seed=3, window_docs=5),
]


@pytest.fixture(scope="module")
def pushed(small_index, s3_bucket, tmp_path_factory):
    """``(local, url)``: a copy of the small index with the three layouts persisted, pushed to the session bucket."""
    local = copy_with_layouts(small_index, tmp_path_factory.mktemp("pushed"), CONFIGS)
    url = f"{s3_bucket}/runs/{local.path.name}"
    push_index(local.path, url)
    return local, url


def test_an_index_opens_from_a_url_and_reads_the_same_documents(pushed):
    local, url = pushed
    remote = TokenIndex.open(url)
    assert str(remote.path) == url and remote.fingerprint == local.fingerprint and not remote.tokens.memory_mapped
    for doc in (0, 7, local.num_documents - 1):
        np.testing.assert_array_equal(remote.document_tokens(doc), local.document_tokens(doc))
    np.testing.assert_array_equal(np.asarray(remote.lengths), np.asarray(local.lengths))
    assert open_location({"kind": "index", "path": url}).fingerprint == local.fingerprint
    assert index_location(remote) == {"kind": "index", "path": url}  # a checkpoint's record keeps the URL


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.kind)
def test_batches_from_s3_equal_the_local_ones_byte_for_byte(pushed, config):
    local, url = pushed
    remote = TokenIndex.open(url)
    want_ds, got_ds = PackedDataset(local, local.layout(config)), PackedDataset(remote, remote.layout(config))
    assert str(got_ds.layout.path).startswith("s3://")  # the pushed layout, not one computed in RAM
    ids = np.random.default_rng(0).permutation(len(want_ds))[:48]
    for chunk in np.array_split(ids, 4):
        want, got = want_ds.get_batch(chunk), got_ds.get_batch(chunk)
        assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)
    if config.kind == "concat":
        want, got = (PackedDataset(i, i.layout(config), output="tokens").get_batch(ids) for i in (local, remote))
        assert torch.equal(want["tokens"], got["tokens"]) and got["tokens"].dtype == want["tokens"].dtype


def test_dataloader_workers_reopen_a_remote_index(pushed):
    local, url = pushed
    remote = TokenIndex.open(url)
    config = CONFIGS[0]
    ds = PackedDataset(remote, remote.layout(config))
    loader = torch.utils.data.DataLoader(ds, batch_size=8, num_workers=2, multiprocessing_context="fork")
    want = PackedDataset(local, local.layout(config))
    for i, batch in enumerate(loader):
        ref = want.get_batch(np.arange(i * 8, min((i + 1) * 8, len(want))))
        assert all(torch.equal(batch[k], ref[k]) for k in ref)
        if i == 3:
            break


def test_a_tampered_object_is_refused_by_its_chunk_checksum(pushed, s3_bucket):
    local, url = pushed
    tampered = f"{s3_bucket}/tampered/{local.path.name}"
    push_index(local.path, tampered)
    raw = bytearray((local.path / "tokens.npy").read_bytes())
    raw[200_000] ^= 1  # one bit in chunk 3
    store_for(tampered).put(f"{tampered}/tokens.npy", bytes(raw))
    with pytest.raises(ChecksumError) as info:
        np.asarray(TokenIndex.open(tampered).tokens)  # (the header's block is the whole object here: met on open)
    assert re.fullmatch(
        rf"{tampered}: tokens\.npy chunk 3 \(bytes 196608\.\.262143\) fails its checksum on both of two reads \(crc32"
        r" [0-9a-f]{8}, recorded [0-9a-f]{8}\): the stored object itself is wrong \(edited or replaced after it was"
        r" written\), not a transfer error",
        str(info.value),
    ), str(info.value)
    with pytest.raises(ChecksumError, match="fails its checksum on both of two reads"):
        TokenIndex.open(tampered, verify_tokens=True)


def test_a_block_corrupted_in_transit_is_fetched_again_and_used(pushed, s3_endpoint, monkeypatch, caplog):
    # before: one flipped byte in an answer (the stored object intact) was refused as "the object was edited or
    # replaced after it was written", though a second read was correct
    local, url = pushed
    with fault_proxy(s3_endpoint) as proxy, caplog.at_level(logging.WARNING, logger="detsampler.storage"):
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        proxy.flip("tokens.npy")  # the first answer for tokens.npy: its first block, fetched on open
        remote = TokenIndex.open(url)
        np.testing.assert_array_equal(np.asarray(remote.tokens), np.asarray(local.tokens))
    assert [fault for _, path, fault in proxy.seen if path.endswith("/tokens.npy")] == ["flip", ""]
    source = remote.tokens._array.source
    assert source.refetched == 1
    assert [r.getMessage() for r in caplog.records if r.name == "detsampler.storage"] == [
        f"storage: {url}/tokens.npy: block 0 (bytes 0..{source.size - 1}) failed its checksum as fetched and passed"
        " when fetched again: corrupted in transit, recovered"
    ]


def test_a_stalled_server_at_open_is_retried_and_each_retry_logged(pushed, s3_endpoint, monkeypatch, caplog):
    # before: a stalled server was retried in silence (120 s by default): a job that looks hung
    local, url = pushed
    monkeypatch.setenv("DETSAMPLER_STORAGE_REQUEST_TIMEOUT_S", "0.5")
    with fault_proxy(s3_endpoint) as proxy, caplog.at_level(logging.WARNING, logger="detsampler.storage"):
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        proxy.stall("meta.json")
        remote = TokenIndex.open(url)
        np.testing.assert_array_equal(remote.document_tokens(3), local.document_tokens(3))
    assert [fault for _, path, fault in proxy.seen if path.endswith("/meta.json")][:2] == ["stall", ""]
    (line,) = [r.getMessage() for r in caplog.records if r.name == "detsampler.storage"]
    assert re.fullmatch(
        rf"storage: {url}/meta\.json: [A-Za-z ]+ failed \(GenericError: no answer within the request timeout of 0\.5"
        r" s: .*\); retry 1 of at most 5 in 0\.1 s, 1[01]\d\.\d s left of the 120 s allowed",
        line,
    ), line


def test_a_zero_byte_object_of_a_pushed_index_is_named_with_its_size(pushed, s3_bucket, caplog):
    # before: "GET failed after up to 5 retries within 120 s (... 416 Range Not Satisfiable ...)", in 0.0 s
    local, _ = pushed
    emptied = f"{s3_bucket}/emptied/{local.path.name}"
    push_index(local.path, emptied)
    store_for(emptied).put(f"{emptied}/tokens.npy", b"")
    size = (local.path / "tokens.npy").stat().st_size
    with caplog.at_level(logging.WARNING, logger="detsampler.storage"), pytest.raises(TokenIndexError) as info:
        TokenIndex.open(emptied)
    assert str(info.value) == (
        f"'{emptied}': tokens.npy is 0 bytes, its record says {size} bytes: the object was truncated, edited or"
        " removed; push the index again"
    )
    assert not [r for r in caplog.records if r.name == "detsampler.storage"]  # nothing retried


def test_a_deleted_object_is_refused_naming_it(pushed, s3_bucket):
    local, url = pushed
    gone = f"{s3_bucket}/gone/{local.path.name}"
    push_index(local.path, gone)
    store_for(gone).delete(f"{gone}/offsets.npy")
    with pytest.raises(TokenIndexError, match=r"offsets\.npy is missing"):
        TokenIndex.open(gone)
    with pytest.raises(TokenIndexError, match="no index at 's3://detsampler-test/nothing-here'"):
        TokenIndex.open(f"{s3_bucket}/nothing-here")


def test_opening_a_remote_index_reads_its_small_files_only(s3_bucket, tmp_path, monkeypatch):
    from detsampler.storage import ObjectStore

    index = synthetic_index(tmp_path, 2_000_000, mean_length=300)  # lengths.npy: 8 MB
    url = f"{s3_bucket}/big/{index.path.name}"
    push_index(index.path, url)
    requests = []
    for name in ("size", "read_ranges", "read_head", "list"):  # count the real store's requests
        real = getattr(ObjectStore, name)
        monkeypatch.setattr(
            ObjectStore, name, lambda self, *a, _r=real, _n=name, **kw: requests.append(_n) or _r(self, *a, **kw)
        )
    remote = TokenIndex.open(url)
    assert requests == ["read_head"] * 3  # meta.json; lengths.npy's first block with its size; its checksums
    source = remote.lengths._array.source
    assert source.size > 7_000_000 and source.fetched_bytes <= 1 << 20  # the header's block, not the array
    assert int(remote.lengths[1_999_999]) == int(index.lengths[1_999_999])
    assert source.fetched_bytes <= 2 << 20


def test_a_server_that_stops_mid_run_is_retried_then_refused_naming_the_object(tmp_path, monkeypatch):
    monkeypatch.setenv("DETSAMPLER_STORAGE_MAX_RETRIES", "2")
    monkeypatch.setenv("DETSAMPLER_STORAGE_RETRY_TIMEOUT_S", "2")
    index = synthetic_index(tmp_path, 1_000_000, mean_length=300)  # lengths.npy: 4 blocks
    with moto_server() as (endpoint, server):
        url = f"{create_bucket(endpoint, 'stops-mid-run')}/{index.path.name}"
        push_index(index.path, url)
        remote = TokenIndex.open(url)
        assert int(remote.lengths[0]) == int(index.lengths[0])
        server.stop()
        with pytest.raises(StorageError, match=rf"{url}/lengths\.npy: ranged GET of 1 ranges failed after 2 retries"):
            remote.lengths[999_999]


def test_a_push_to_a_prefix_holding_another_index_is_refused_before_writing(pushed, small_index, s3_bucket):
    local, url = pushed
    other = synthetic_index(local.path.parent / "other", 1000)
    before = store_for(url).list(url)
    with pytest.raises(TokenIndexError, match="already holds a different sealed record"):
        push_index(other.path, url)
    assert store_for(url).list(url) == before


_PUSH = """
import sys
from detsampler.index.push import push, push_index
push_index(sys.argv[1], sys.argv[2], max_workers=1)
"""


def test_a_push_killed_midway_leaves_nothing_that_opens(s3_bucket, s3_endpoint, tmp_path):
    # lengths.npy: 24 MB, uploaded in parts after its small checksum file: the kill lands during its upload
    index = synthetic_index(tmp_path, 6_000_000, mean_length=300)
    url = f"{s3_bucket}/killed/{index.path.name}"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), *sys.path])}
    proc = subprocess.Popen([sys.executable, "-c", _PUSH, str(index.path), url], env=env)
    store = store_for(url)
    deadline = time.monotonic() + 60
    while not store.list(url) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert store.list(url), "the push wrote nothing before it was killed"
    assert not store.exists(f"{url}/meta.json")
    with pytest.raises(TokenIndexError, match="no meta.json"):
        TokenIndex.open(url)
    other = synthetic_index(tmp_path / "other", 1000)  # its claim says the prefix is being pushed for another index
    with pytest.raises(TokenIndexError, match=f"push to {url} refused: another push holds this prefix"):
        push_index(other.path, url)
    push_index(index.path, url)  # pushing again completes it
    assert TokenIndex.open(url).num_documents == 6_000_000


def test_the_cli_pushes_an_index_and_reads_it_back_from_the_bucket(
    capsys, small_index, small_tokenizer, s3_bucket, tmp_path
):
    from detsampler.cli import main

    dest = tmp_path / small_index.path.name
    shutil.copytree(small_index.path, dest, ignore=shutil.ignore_patterns("layouts", "*.lock"))
    plan = [
        "--kind",
        "document",
        "--seq-len",
        "64",
        "--global-batch-size",
        "8",
        "--micro-batch-size",
        "2",
        "--world-size",
        "2",
        "--step",
        "5",
        "--tokenizer",
        str(small_tokenizer.path),
    ]
    TokenIndex.open(dest).layout(LayoutConfig(kind="document", seq_len=64))
    url = f"{s3_bucket}/cli/{dest.name}"
    assert main(["push", str(dest), url]) == 0
    out = capsys.readouterr().out
    assert out.startswith("pushed 13 objects (") and out.rstrip().endswith(f"to {url}, meta.json last")  # 7 + 6
    assert main(["show", "--data", url, *plan]) == 0
    remote = capsys.readouterr().out
    local_args = ["--max-documents", "16", "--cache-dir", str(small_index.path.parent)]
    assert main(["show", *local_args, *plan]) == 0
    local = re.sub(r"(doc \d+) \([^)]*\)", r"\1", capsys.readouterr().out)  # no dataset remotely: no file names
    assert remote == local and "doc 13  tokens [36352, 36416) of 47037" in remote


def test_a_pushed_index_without_stored_tokens_is_refused_as_data(s3_bucket, tmp_path):
    from detsampler.index.prepare import IndexConfig, prepare_index

    index = synthetic_index(tmp_path, 1000)
    url = f"{s3_bucket}/lengths-only/{index.path.name}"
    push_index(index.path, url)
    with pytest.raises(ValueError, match="is an index that stores no tokens"):
        prepare_index(IndexConfig(data=url), progress=False)


def test_a_push_of_no_index_or_to_a_local_path_is_refused(s3_bucket, small_index, tmp_path):
    with pytest.raises(TokenIndexError, match="holds no index \\(no meta.json\\)"):
        push_index(tmp_path, f"{s3_bucket}/empty")
    with pytest.raises(ValueError, match="push uploads to an object store URL"):
        push_index(small_index.path, str(tmp_path / "copy"))


def test_a_sharded_index_pushed_to_a_bucket_reads_the_local_batches(
    small_corpus, small_tokenizer, s3_bucket, tmp_path, capsys
):
    import json

    from detsampler.cli import main
    from detsampler.index.protocol import Index
    from detsampler.index.sharded import ShardedIndex

    data = tmp_path / "data"
    data.mkdir()
    for j in range(3):
        (data / f"part-{j}.jsonl").write_text(
            "".join(json.dumps({"text": t}) + "\n" for t in small_corpus["text"][j::3])
        )
    cache = tmp_path / "cache"
    args = ["build", "--data", str(data), "--tokenizer", str(small_tokenizer.path), "--cache-dir", str(cache)]
    assert main([*args, "--sharded", "--quiet"]) == 0
    (root,) = cache.glob("sharded-*")
    local = ShardedIndex.open(root)
    config = LayoutConfig(kind="bestfit", seq_len=128, window_docs=4)
    local.layout(config)
    capsys.readouterr()
    url = f"{s3_bucket}/sharded/{root.name}"
    assert main(["push", str(root), url]) == 0
    assert f"to {url}, manifest.json last: " in capsys.readouterr().out  # after its shards (to ../shards/)
    remote = ShardedIndex.open(url)
    assert isinstance(remote, Index) and isinstance(local, Index)
    with pytest.raises(ValueError, match="takes no dataset: its shards hold the tokens"):  # was an AttributeError
        PackedDataset(remote, remote.layout(config), dataset=small_corpus)
    assert str(remote.shards[0].path).startswith(f"{s3_bucket}/sharded/shards/index-")  # ../shards, in the bucket
    got, want = PackedDataset(remote, remote.layout(config)), PackedDataset(local, local.layout(config))
    assert str(got.layout.path).startswith(f"{url}/layouts/bestfit-")  # the pushed layout, not one computed in RAM
    ids = np.arange(len(want))
    a, b = got.get_batch(ids), want.get_batch(ids)
    assert all(torch.equal(a[k], b[k]) for k in b)


def test_a_push_of_a_sharded_index_of_pre_tokenized_files_is_refused(s3_bucket, tmp_path):
    from detsampler.index.shards import finalize, source_entries

    (tmp_path / "data").mkdir()
    tokens = np.array([11, 12, 2, 13, 2], dtype=np.uint16)  # two documents ending in EOS 2
    tokens.tofile(tmp_path / "data" / "train.bin")
    entries = source_entries(tmp_path / "root", "nanogpt", [tmp_path / "data" / "train.bin"], eos_id=2, vocab_size=512)
    finalize(tmp_path / "root", [], None, entries)
    with pytest.raises(TokenIndexError, match="has 1 pre-tokenized shards .* push uploads indexes only"):
        push(tmp_path / "root", f"{s3_bucket}/pretokenized")
    assert not store_for(s3_bucket).list(f"{s3_bucket}/pretokenized")


def test_the_full_check_of_a_remote_index_runs_once_per_cache(pushed, tmp_path, monkeypatch):
    monkeypatch.setenv("DETSAMPLER_CACHE", str(tmp_path / "cache"))
    local, url = pushed
    assert TokenIndex.open(url).verify_once() is True  # every block fetched and checked, each object's sha256
    assert TokenIndex.open(url).verify_once() is False  # the marker in the local cache says it passed
    assert len(list((tmp_path / "cache" / "verified").glob("*-*"))) >= 1


@pytest.mark.parametrize("kind", ["megatron", "olmo", "datatrove", "nanogpt"])
def test_a_pre_tokenized_source_in_a_bucket_reads_as_the_local_one(kind, s3_bucket, tmp_path, monkeypatch):
    from detsampler.index.sources import open_source
    from tests.test_sharded_sources import EOS, _files

    monkeypatch.setenv("DETSAMPLER_CACHE", str(tmp_path / "cache"))
    (path,) = _files(kind, tmp_path / "data", num_files=1)
    url = f"{s3_bucket}/sources/{kind}"
    for f in (tmp_path / "data").iterdir():
        store_for(url).put(f"{url}/{f.name}", f)
    where = f"{url}/{path.name}"
    local, remote = open_source(kind, path, eos_id=EOS), open_source(kind, where, eos_id=EOS)
    assert remote.fingerprint == local.fingerprint and str(remote.path) == where  # identity: by content
    config = LayoutConfig(kind="document", seq_len=16)
    got, want = PackedDataset(remote, remote.layout(config)), PackedDataset(local, local.layout(config))
    ids = np.arange(len(want))
    a, b = got.get_batch(ids), want.get_batch(ids)
    assert all(torch.equal(a[k], b[k]) for k in b)
    assert index_location(remote)["path"] == where
    again = open_location(index_location(remote))
    assert again.fingerprint == local.fingerprint


def test_the_trainer_config_reads_a_pushed_index_and_a_megatron_source_from_the_bucket(
    pushed, small_tokenizer, s3_bucket, tmp_path
):
    import warnings

    pytest.importorskip("megatron.core")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
    from train.config import load_config
    from train.data import build_pipeline

    local, url = pushed
    prefix = str(tmp_path / "corpus_text_document")  # megatron-core's own writer, then uploaded
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
    for d in range(8):
        builder.add_item(torch.tensor([*local.document_tokens(d).tolist(), local.eos_id]))
        builder.end_document()
    builder.finalize(prefix + ".idx")
    for suffix in (".bin", ".idx"):
        store_for(s3_bucket).put(
            f"{s3_bucket}/megatron/corpus_text_document{suffix}", tmp_path / f"corpus_text_document{suffix}"
        )

    def batches(source: str) -> tuple[list[torch.Tensor], Any]:
        cfg = tmp_path / "c.toml"
        cfg.write_text(
            f'[data]\nseq_len = 64\nglobal_batch_size = 4\nmicro_batch_size = 4\ncache_dir = "{tmp_path}"\n'
            f'{source}\ntokenizer = "{small_tokenizer.path}"\n'
        )
        pipe = build_pipeline(load_config(cfg).data, world_size=1)
        loader = pipe.loader(pipe.sampler(0, 0, 1), pin_memory=False, persistent_workers=False)
        return [b["input_ids"] for _, b in zip(range(3), loader)], pipe

    for remote, on_disk in (
        (f'source = "{url}"', "max_documents = 16"),  # the default corpus's first 16 files: the pushed index
        (
            f'source = {{kind = "megatron", path = "{s3_bucket}/megatron/corpus_text_document"}}',
            f'source = {{kind = "megatron", path = "{prefix}"}}',
        ),
    ):
        (got, pipe), (want, _) = batches(remote), batches(on_disk)
        assert str(pipe.index.path).startswith("s3://") and all(torch.equal(a, b) for a, b in zip(got, want))
    # prefetch over a pre-tokenized source in the bucket (issue 37: it was accepted and did nothing): read ahead
    got, pipe = batches(f'source = "megatron:{s3_bucket}/megatron/corpus_text_document"\nprefetch = true')
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert pipe.prefetch_summary().startswith("data: prefetch read 1 micro batch(es) as planned, 0 on demand; fetched")
    assert pipe.reads_line() == (
        f"data: from {s3_bucket}/megatron/corpus_text_document, prefetch on in the training process: budget"
        " 67,108,864 bytes, cache 134,217,728 bytes, 8 threads, blocks of 65,536 bytes"
    )
    pipe.close()


def _data_lines(source: str, tmp_path, tokenizer, extra: str = "") -> str:
    return (
        f'[data]\nseq_len = 64\nglobal_batch_size = 4\nmicro_batch_size = 2\ncache_dir = "{tmp_path}"\n{source}\n'
        f'tokenizer = "{tokenizer.path}"\n{extra}'
    )


def test_the_trainer_prefetches_from_the_bucket_in_a_forkserver_worker_and_trains_on_the_local_batches(
    pushed, small_tokenizer, s3_bucket, tmp_path
):
    from detsampler.hashing import sample_hash
    from train.config import load_config
    from train.data import build_pipeline, step_token_hashes
    from train.launch import run_training, train_command
    from train.metrics import read_metrics

    local, url = pushed
    steps = 3
    config = tmp_path / "remote.toml"
    prefetch = "prefetch = {budget_bytes = 262_144, cache_bytes = 524_288, threads = 4}\nnum_workers = 1\n"
    config.write_text(
        _data_lines(f'source = "{url}"', tmp_path, small_tokenizer, prefetch)
        + f"[schedule]\nsteps = {steps}\nwarmup_steps = 1\n[checkpoint]\nsave_final = false\n[runtime]\nthreads = 1\n"
    )
    run = run_training(
        train_command(1, ["--config", str(config), "--run-dir", str(tmp_path / "run")], torchrun=False), timeout=300
    )
    assert run.returncode == 0, run.output[-4000:]
    assert (
        f"data: from {url}, prefetch on in each of 1 DataLoader workers, started by forkserver: budget 262,144 bytes,"
        " cache 524,288 bytes, 4 threads, blocks of 65,536 bytes\n" in run.output
    )
    assert "prefetch: rank 0 worker 0 of 1 starts at step 0 micro step 0 (cache 524288 bytes, none held;" in run.output
    assert (
        "prefetch: rank 0 worker 0 of 1 read its first micro batch (step 0, micro step 0) after fetching" in run.output
    )
    got = {s: (r["sample_hash"], r["tokens_hash"]) for s, r in read_metrics(tmp_path / "run").steps.items()}

    on_disk = tmp_path / "local.toml"  # the same data from the local index, in this process, as the trainer hashes it
    on_disk.write_text(_data_lines("max_documents = 16", tmp_path, small_tokenizer))
    pipe = build_pipeline(load_config(on_disk).data, world_size=1)
    assert pipe.index.fingerprint == local.fingerprint and not pipe.in_object_store
    sampler = pipe.sampler(0, 0, steps)
    loader = pipe.loader(sampler, pin_memory=False, persistent_workers=False)
    want = {
        step: (
            sample_hash(pipe.plan.global_batch(step)),
            sample_hash(step_token_hashes(mbs).view(np.int64).reshape(-1)),
        )
        for step, mbs in sampler.steps(loader)
    }
    assert got == want and sorted(got) == list(range(steps))


def test_the_trainer_starts_workers_over_a_bucket_by_forkserver_and_refuses_fork(pushed, small_tokenizer, tmp_path):
    from train.config import load_config
    from train.data import build_pipeline

    _, url = pushed
    cfg = tmp_path / "c.toml"

    def pipeline(extra: str):
        cfg.write_text(_data_lines(f'source = "{url}"', tmp_path, small_tokenizer, extra))
        return build_pipeline(load_config(cfg).data, world_size=1)

    assert pipeline("num_workers = 1\n").worker_start_method == "forkserver"
    assert pipeline('num_workers = 1\nworker_start_method = "spawn"\n').worker_start_method == "spawn"
    with pytest.raises(ValueError) as info:
        pipeline('num_workers = 2\nworker_start_method = "fork"\n')
    assert str(info.value) == (
        f"DataConfig.worker_start_method = 'fork' with num_workers = 2 over an index in an object store ({url}): the"
        " store's client does not survive a fork once this process used it; use forkserver or spawn, or leave"
        " worker_start_method empty (forkserver)"
    )
    assert pipeline('worker_start_method = "fork"\n').reads_line() == (
        f"data: from {url}, blocks read on demand by the training process (prefetch off)"
    )  # no workers: nothing is forked


def test_every_kind_of_index_on_disk_or_in_a_bucket_is_an_index(pushed, tmp_path):
    from detsampler.index.protocol import Index
    from detsampler.index.sources import open_source

    local, url = pushed
    (tmp_path / "train.bin").write_bytes(np.array([11, 12, 2, 13, 2], dtype=np.uint16).tobytes())
    source = open_source("nanogpt", tmp_path / "train.bin", eos_id=2, vocab_size=512)
    lengths_only = synthetic_index(tmp_path / "lengths", 100)
    for index in (local, TokenIndex.open(url), source, lengths_only):  # ShardedIndex: in the sharded test above
        assert isinstance(index, Index), type(index).__name__


def test_build_with_a_bucket_as_cache_dir_builds_once_and_reads_from_the_bucket(
    capsys, small_tokenizer, s3_bucket, tmp_path, monkeypatch
):
    from detsampler.cli import main

    monkeypatch.setenv("DETSAMPLER_CACHE", str(tmp_path / "staging"))  # the local stage of a remote cache
    cache = f"{s3_bucket}/cache"
    args = ["--max-documents", "16", "--tokenizer", str(small_tokenizer.path), "--cache-dir", cache]
    layout = ["--layout", "--kind", "document", "--seq-len", "64"]
    assert main(["build", *args, *layout, "--json"]) == 0
    captured = capsys.readouterr()
    assert f"layout   {cache}/index-" in captured.err  # the URL, not a local path; stdout holds only the JSON
    built = json.loads(captured.out)
    assert built["layout"]["path"].startswith(f"{built['path']}/layouts/")
    url = built["path"]
    assert url.startswith(f"{cache}/index-") and store_for(url).exists(f"{url}/meta.json")
    assert store_for(url).list(f"{url}/layouts")  # the layout was built on the staged copy and pushed
    shutil.rmtree(tmp_path / "staging" / url.rsplit("/", 1)[-1])  # a fresh node: nothing staged locally
    assert main(["build", *args, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["fingerprint"] == built["fingerprint"]  # opened, not built again
    assert not (tmp_path / "staging" / url.rsplit("/", 1)[-1]).exists()
    plan = [
        "--kind",
        "document",
        "--seq-len",
        "64",
        "--global-batch-size",
        "8",
        "--micro-batch-size",
        "4",
        "--step",
        "2",
    ]
    assert main(["show", *args, *plan]) == 0
    remote = capsys.readouterr().out
    assert main(["show", "--max-documents", "16", "--tokenizer", str(small_tokenizer.path), *plan]) == 0
    assert remote == capsys.readouterr().out


class _DictCache:
    """A real (unbounded, for the test) block cache: the BlockCache protocol over a dict, counting its hits."""

    def __init__(self) -> None:
        self.blocks: dict = {}
        self.hits = 0

    def get(self, key):
        data = self.blocks.get(key)
        self.hits += data is not None
        return data

    def put(self, key, data):
        self.blocks[key] = data


def test_a_block_cache_serves_repeated_reads_and_a_tampered_cached_block_is_refused(pushed):
    from detsampler.storage import BlockCache

    local, url = pushed
    cache = _DictCache()
    assert isinstance(cache, BlockCache)
    remote = TokenIndex.open(url, block_cache=cache)
    np.testing.assert_array_equal(remote.document_tokens(3), local.document_tokens(3))
    assert (f"{url}/tokens.npy", 0) in cache.blocks and remote.tokens._array.source._recent == {}
    again = TokenIndex.open(url, block_cache=cache)  # another reader of the same cache: hits, no fetch
    np.testing.assert_array_equal(again.document_tokens(3), local.document_tokens(3))
    assert again.tokens._array.source.fetched_bytes == 0 and cache.hits >= 2
    key = (f"{url}/tokens.npy", 0)
    cache.blocks[key] = cache.blocks[key][:1000] + bytes([cache.blocks[key][1000] ^ 1]) + cache.blocks[key][1001:]
    with pytest.raises(ChecksumError, match="fails its checksum"):
        TokenIndex.open(url, block_cache=cache).document_tokens(0)  # a block this reader did not put: checked


def test_a_sharded_build_into_a_bucket_is_refused_naming_push(capsys, small_tokenizer, tmp_path, monkeypatch):
    from detsampler.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.txt").write_text("one document\n")
    with pytest.raises(SystemExit):
        main(
            [
                "build",
                "--data",
                "data",
                "--tokenizer",
                str(small_tokenizer.path),
                "--sharded",
                "--cache-dir",
                "s3://bucket/cache",
            ]
        )
    assert "a sharded build writes to a local or shared directory" in capsys.readouterr().err
    assert not (tmp_path / "s3:").exists()  # before: a local directory named "s3:" was built into


def test_a_cache_dir_url_of_no_object_store_is_refused(tmp_path, monkeypatch):
    from detsampler.index.prepare import IndexConfig

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="cache_dir 'hf://x/cache' is a URL of no supported object store"):
        IndexConfig(cache_dir="hf://x/cache")
    assert IndexConfig(cache_dir="s3://bucket/cache").cache_path == IndexConfig().cache_path  # staged locally
