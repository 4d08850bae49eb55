"""Issue 37, prefetch everywhere a plan reads a bucket: a mixture (one prefetcher over every source's reads, the budget
and cap shared), a pre-tokenized source (its token file by ranged reads, checked by size and ETag: the formats record
no checksums) and a sharded index, with the guarantees of a single index: the batches are the local ones byte for byte,
the cap is never exceeded, and an object changed under a running reader is refused, never served.

Against moto's S3 server on loopback (the session's), with DataLoader workers started by forkserver."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
import torch

from detsampler.index import TokenIndex
from detsampler.index.push import push_index
from detsampler.index.sources import open_source
from detsampler.layout import LayoutConfig
from detsampler.loader import DeterministicBatchSampler, PackedDataset, PrefetchConfig, collate_micro_batch
from detsampler.loader.mixture_dataset import MixtureDataset
from detsampler.mixture import MixtureConfig
from detsampler.plan import Plan
from detsampler.storage import StorageError, store_for
from tests.index_copies import copy_with_layouts
from tests.test_bucket_opens import _source_files, _upload
from tests.test_sharded_sources import EOS

KIB = 1024
CONFIG = LayoutConfig(kind="concat", seq_len=64, seed=1)
# the cache holds 6 blocks of 64 KiB of the mixture's 13: blocks are evicted and fetched again
TIGHT = PrefetchConfig(budget_bytes=256 * KIB, cache_bytes=384 * KIB, threads=2)


@pytest.fixture(scope="module")
def sources(small_index, s3_bucket, tmp_path_factory):
    """``(local, remote)``: three sources each way: the small index (pushed with its concat layout), an OLMo ``.npy``
    (uint32, with its ``.csv.gz``) and a Megatron ``.bin/.idx`` (uint16), uploaded."""
    root = tmp_path_factory.mktemp("everywhere")
    index = copy_with_layouts(small_index, root / "index", [CONFIG])
    url = f"{s3_bucket}/everywhere"
    push_index(index.path, f"{url}/{index.path.name}")
    local, remote = [index], [TokenIndex.open(f"{url}/{index.path.name}")]
    for k, kind in enumerate(("olmo", "megatron")):
        path = _source_files(kind, root / kind, num_docs=6000, seed=k)
        _upload(root / kind, f"{url}/{kind}")
        local.append(open_source(kind, path, eos_id=EOS))
        remote.append(open_source(kind, f"{url}/{kind}/{path.name}", eos_id=EOS))
    return local, remote


def _mixture(indexes, **ahead) -> tuple[MixtureDataset, Plan]:
    layouts = [index.layout(CONFIG) for index in indexes]
    mixture = MixtureConfig(weights=[2, 1, 1], seed=3).build(layouts)
    plan = Plan(source=mixture, seed=5, global_batch_size=16, micro_batch_size=4, world_size=2)
    datasets = [PackedDataset(index, layout) for index, layout in zip(indexes, layouts)]
    return MixtureDataset(datasets, mixture, **({"plan": plan, **ahead} if ahead else {})), plan


def _loader(dataset, plan, num_workers: int, rank: int = 1, start: int = 2, stop: int = 14):
    sampler = DeterministicBatchSampler(plan, rank, start_step=start, stop_step=stop)
    context = "forkserver" if num_workers else None  # the parent read the bucket: a forked worker is refused
    return torch.utils.data.DataLoader(
        dataset, batch_sampler=sampler, num_workers=num_workers, collate_fn=collate_micro_batch,
        multiprocessing_context=context,
    )  # fmt: skip


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_mixture_prefetched_from_a_bucket_reads_the_local_batches_through_one_prefetcher(sources, num_workers):
    # before: MixtureDataset had no prefetch option, and the trainer refused prefetch with a mixture
    local, remote = sources
    want, plan = _mixture(local)
    got, _ = _mixture(remote, prefetch=TIGHT)
    count = 0
    positions = [(s, a) for s in range(2, 14) for a in range(2)]
    for (step, micro_step), batch in zip(positions, _loader(got, plan, num_workers)):
        ref = want.__getitems__(plan.micro_batch(step, micro_step, 1)).batch
        assert batch.keys() == ref.keys() and all(torch.equal(batch[k], ref[k]) for k in ref)
        count += 1
    assert count == 24
    if num_workers == 0:  # this process read them: one prefetcher for the three sources, one budget, one cap
        stats = got.prefetch_stats()
        assert stats.served == 24 and stats.unplanned == 0 and stats.sources == 3
        assert stats.cache["peak_bytes"] <= TIGHT.cache_bytes and stats.cache["hits"] > 0
        assert stats.cache["evicted"] > 0  # the cap binds
        assert 0 < stats.used_bytes < stats.fetched_bytes
        assert stats.amplification == stats.fetched_bytes / stats.used_bytes > 1  # read amplification, reported
        got.close()


@pytest.mark.parametrize("kind", ["olmo", "megatron"])
def test_a_pre_tokenized_source_in_a_bucket_is_prefetched_and_says_how_its_blocks_are_checked(sources, kind, caplog):
    # before: prefetch= over a pre-tokenized source was accepted and did nothing (prefetch_stats() None, no line)
    local, remote = sources
    k = 1 if kind == "olmo" else 2
    layout = remote[k].layout(CONFIG)
    plan = Plan(layout.num_samples, seed=9, global_batch_size=8, micro_batch_size=4)
    got = PackedDataset(remote[k], layout, prefetch=TIGHT, plan=plan)
    with caplog.at_level(logging.INFO, logger="detsampler.prefetch"):
        for _ in _loader(got, plan, 0, rank=0, start=0, stop=10):
            pass
    stats = got.prefetch_stats()
    assert stats is not None and stats.served == 20 and stats.unplanned == 0 and stats.fetched_bytes > 0
    got.close()
    lines = [r.getMessage() for r in caplog.records if r.name == "detsampler.prefetch"]
    etag = store_for(str(remote[k].tokens.source.url)).version(remote[k].tokens.source.url)[1]
    assert any(
        f"{remote[k].tokens.source.url}: the {kind} format records no checksums: its blocks are checked by size and"
        f" ETag ({etag})" in line
        for line in lines
    ), lines


def test_the_batches_of_a_prefetched_source_are_the_local_ones(sources):
    local, remote = sources
    for k in (1, 2):
        layout = remote[k].layout(CONFIG)
        plan = Plan(layout.num_samples, seed=9, global_batch_size=8, micro_batch_size=4)
        got = PackedDataset(remote[k], layout, prefetch=TIGHT, plan=plan)
        want = PackedDataset(local[k], local[k].layout(CONFIG))
        positions = [(s, a) for s in range(10) for a in range(2)]
        for (step, micro_step), batch in zip(positions, _loader(got, plan, 0, rank=0, start=0, stop=10)):
            ref = want.get_batch(plan.micro_batch(step, micro_step, 0))
            assert all(torch.equal(batch[name], ref[name]) for name in ref)
        got.close()


@pytest.mark.parametrize("ahead", [False, True], ids=["on demand", "prefetch"])
def test_a_source_object_rewritten_under_a_running_reader_is_refused_not_served(s3_bucket, tmp_path, ahead):
    # before: the new bytes were served as the old object's (its blocks are not checksummed), a silent wrong answer
    path = _source_files("nanogpt", tmp_path / "data", num_docs=6000)
    url = f"{s3_bucket}/rewritten/{'ahead' if ahead else 'demand'}"
    _upload(tmp_path / "data", url)
    source = open_source("nanogpt", f"{url}/{path.name}", eos_id=EOS)
    layout = source.layout(CONFIG)
    plan = Plan(layout.num_samples, seed=0, global_batch_size=4, micro_batch_size=4)
    extra = {"prefetch": PrefetchConfig(budget_bytes=64 * KIB, cache_bytes=64 * KIB, threads=1), "plan": plan}
    dataset = PackedDataset(source, layout, **(extra if ahead else {}))
    was = store_for(url).version(f"{url}/{path.name}")[1]
    tokens = np.fromfile(path, dtype=np.uint16)
    tokens[::7] = 11  # the same size, other tokens
    tokens.tofile(path)
    store_for(url).put(f"{url}/{path.name}", path)
    now = store_for(url).version(f"{url}/{path.name}")[1]
    batches = iter(DeterministicBatchSampler(plan, 0))
    with pytest.raises(StorageError) as caught:
        for _ in range(200):
            dataset.get_batch(next(batches))
    assert str(caught.value) == (
        f"{url}/{path.name}: the object changed since it was opened (its ETag was {was}, the store no longer holds"
        " that version): open the source again"
    ), str(caught.value)
    assert now != was
    dataset.close()


def test_a_sharded_index_in_a_bucket_is_prefetched(small_corpus, small_tokenizer, s3_bucket, tmp_path, capsys):
    from detsampler.cli import main
    from detsampler.index.sharded import ShardedIndex

    data = tmp_path / "data"
    data.mkdir()
    for j in range(3):
        (data / f"part-{j}.jsonl").write_text(
            "".join(json.dumps({"text": t}) + "\n" for t in small_corpus["text"][j::3])
        )
    args = ["build", "--data", str(data), "--tokenizer", str(small_tokenizer.path), "--cache-dir", str(tmp_path / "c")]
    assert main([*args, "--sharded", "--quiet"]) == 0
    (root,) = (tmp_path / "c").glob("sharded-*")
    local = ShardedIndex.open(root)
    local.layout(CONFIG)
    url = f"{s3_bucket}/sharded-ahead/{root.name}"
    assert main(["push", str(root), url]) == 0
    capsys.readouterr()
    remote = ShardedIndex.open(url)
    layout = remote.layout(CONFIG)
    plan = Plan(layout.num_samples, seed=2, global_batch_size=8, micro_batch_size=4)
    got = PackedDataset(remote, layout, prefetch=TIGHT, plan=plan)
    want = PackedDataset(local, local.layout(CONFIG))
    positions = [(s, a) for s in range(12) for a in range(2)]
    for (step, micro_step), batch in zip(positions, _loader(got, plan, 0, rank=0, start=0, stop=12)):
        ref = want.get_batch(plan.micro_batch(step, micro_step, 0))
        assert all(torch.equal(batch[name], ref[name]) for name in ref)
    stats = got.prefetch_stats()
    assert stats.served == 24 and stats.unplanned == 0 and stats.sources == 1 and stats.objects == 3
    assert stats.cache["peak_bytes"] <= TIGHT.cache_bytes
    got.close()


def test_a_packed_dataset_given_a_mixtures_plan_is_refused_naming_the_mixture(sources):
    # before: "the plan draws from N samples, the layout has M": about sample counts, not the mixture
    local, _ = sources
    _, plan = _mixture(local)
    with pytest.raises(
        ValueError, match=r"the plan draws from a mixture of 3 sources: prefetch it with MixtureDataset"
    ):
        PackedDataset(local[0], local[0].layout(CONFIG), prefetch=TIGHT, plan=plan)


def test_the_trainer_prefetches_a_mixture_from_the_bucket_and_names_every_source(sources, small_tokenizer, tmp_path):
    # before: refused ("a mixture draws from several (mixture_sources): remove prefetch"); its log line named only the
    # first source
    from train.config import load_config
    from train.data import build_pipeline

    _, remote = sources
    urls = [str(remote[0].path), f"olmo:{remote[1].path}"]

    def run(extra: str) -> tuple[list[dict], object]:
        cfg = tmp_path / "c.toml"
        cfg.write_text(
            f'[data]\nseq_len = 64\nglobal_batch_size = 4\nmicro_batch_size = 2\ncache_dir = "{tmp_path}"\n'
            f"mixture_sources = {json.dumps(urls)}\nmixture_weights = [1, 1]\n"
            f'tokenizer = "{small_tokenizer.path}"\n{extra}'
        )
        pipe = build_pipeline(load_config(cfg).data, world_size=1)
        loader = pipe.loader(pipe.sampler(0, 0, 6), pin_memory=False, persistent_workers=False)
        return list(loader), pipe

    (want, _), (got, pipe) = run(""), run("prefetch = true\n")
    assert len(got) == len(want) == 12
    assert all(torch.equal(a[k], b[k]) for a, b in zip(got, want) for k in b)
    assert pipe.reads_line() == (
        f"data: from {remote[0].path}, {remote[1].path}, prefetch on in the training process: one prefetcher over 2"
        " sources, budget 67,108,864 bytes, cache 134,217,728 bytes, 8 threads, blocks of 65,536 bytes"
    )
    assert pipe.prefetch_summary().startswith("data: prefetch read 12 micro batch(es) as planned, 0 on demand")
    pipe.close()


def test_a_finer_unit_for_a_pre_tokenized_file_reads_the_same_batches_and_fetches_fewer_bytes(sources):
    # a pre-tokenized file has no checksum chunk binding its blocks: its unit may be any multiple of 4 KiB
    local, remote = sources
    layout = remote[1].layout(CONFIG)
    plan = Plan(layout.num_samples, seed=9, global_batch_size=8, micro_batch_size=4)
    want = PackedDataset(local[1], local[1].layout(CONFIG))
    fetched = {}
    for unit in (64 * KIB, 8 * KIB):
        ahead = PrefetchConfig(budget_bytes=64 * KIB, cache_bytes=64 * KIB, threads=2, source_block_bytes=unit)
        got = PackedDataset(remote[1], layout, prefetch=ahead, plan=plan)
        for ids in DeterministicBatchSampler(plan, 0, stop_step=10):
            batch = got.get_batch(ids)
            assert all(torch.equal(batch[k], v) for k, v in want.get_batch(ids).items())
        stats = got.prefetch_stats()
        fetched[unit] = (stats.fetched_bytes, stats.used_bytes, stats.requests)
        got.close()
    (coarse, used, _), (fine, used_fine, _) = fetched[64 * KIB], fetched[8 * KIB]
    assert used == used_fine and fine < coarse  # the same bytes used, fewer fetched
    with pytest.raises(ValueError, match="source_block_bytes must be a multiple of 4096"):
        PrefetchConfig(source_block_bytes=1000)
