"""Images in a bucket (issue 33), on moto's real S3 server on loopback: a media index built from webdataset shards in
the bucket reads each image by a ranged request, checks its CRC-32 on every read and makes the batches of the index
built from the same shards on disk, byte for byte; an index pushed with its media opens from the bucket and reads the
same; the prefetcher fetches exactly the blocks of the images each future micro batch reads, before it is read."""

from __future__ import annotations

import uuid

import datasets
import numpy as np
import pytest
import torch
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from detsampler.gather import token_ranges
from detsampler.index.format import TokenIndexError
from detsampler.index.push import push_index
from detsampler.loader import DeterministicBatchSampler, PrefetchConfig, collate_micro_batch
from detsampler.loader.vlm import VLMDataset
from detsampler.media import MediaLayoutConfig, Qwen2VLCounts
from detsampler.media.build import build_media_index
from detsampler.media.headers import MediaError
from detsampler.media.index import MediaIndex
from detsampler.media.sources import dataset_source, webdataset_source
from detsampler.plan import Plan
from detsampler.storage import join, store_for
from tests.media_corpus import documents, to_dataset, to_directory, to_shards, vlm_tokenizer

COUNTS = Qwen2VLCounts(min_pixels=4 * 28 * 28, max_pixels=48 * 28 * 28)
LAYOUT = MediaLayoutConfig(seq_len=256, max_patches=512, window_docs=8)
FIELDS = ("input_ids", "labels", "position_ids", "document_ids", "pixel_values", "image_grid_thw", "mm_token_type_ids")
# small blocks: a shard is several blocks, a micro batch's images a few of them
TIGHT = PrefetchConfig(budget_bytes=256 << 10, cache_bytes=512 << 10, threads=2, block_bytes=64 << 10)


@pytest.fixture(scope="module")
def media(tmp_path_factory, s3_bucket):
    root = tmp_path_factory.mktemp("media-bucket")
    docs = documents(32, seed=9, max_images=3, largest=160)
    shards = to_shards(docs, root / "wds", per_shard=8)
    prefix = join(s3_bucket, f"wds-{uuid.uuid4().hex[:8]}")
    urls = [join(prefix, p.name) for p in shards]
    for path, url in zip(shards, urls):
        store_for(url).put(url, path)
    tok = vlm_tokenizer(root / "tok")
    local = build_media_index(webdataset_source(shards, cache_dir=root), tok, COUNTS, cache_dir=root / "local")
    remote = build_media_index(webdataset_source(urls), tok, COUNTS, cache_dir=root / "remote")
    return {"root": root, "docs": docs, "tok": tok, "local": local, "remote": remote, "urls": urls, "bucket": s3_bucket}


def dataset(index, **kwargs) -> VLMDataset:
    return VLMDataset(index, index.layout(LAYOUT), Qwen2VLImageProcessorPil(**COUNTS.processor_kwargs()), **kwargs)


def assert_same(got: dict, want: dict) -> None:
    for key in FIELDS:
        assert torch.equal(got[key], want[key]), key


def test_images_in_a_bucket_make_the_local_batches_byte_for_byte(media):
    local, remote = media["local"], media["remote"]
    assert remote.meta["sources"][1:] == media["urls"]
    assert remote.meta["source_sizes"][1:] == [store_for(u).size(u) for u in media["urls"]]
    assert np.array_equal(local.image_rows(np.arange(local.num_images))["crc32"],
                          remote.image_rows(np.arange(remote.num_images))["crc32"])  # fmt: skip
    ids = np.arange(local.layout(LAYOUT).num_samples)
    assert_same(dataset(remote).get_batch(ids), dataset(local).get_batch(ids))
    assert remote.verify_files()["images"] == remote.num_images


def test_an_image_changed_in_its_bucket_object_is_refused_on_read(media):
    remote = media["remote"]
    rows = remote.image_rows([6])
    url = remote.meta["sources"][int(rows["source"][0])]
    store = store_for(url)
    original = store.read_head(url, -1)[0]
    at = int(rows["offset"][0]) + 7
    try:
        store.put(url, original[:at] + bytes([original[at] ^ 1]) + original[at + 1 :])  # same size, one bit
        with pytest.raises(MediaError, match=rf"image 6 \(document \d+, item \d\) at {url} \[\d+, \d+\): its bytes'"
                                             r" CRC-32 is 0x[0-9a-f]{8}, the build recorded"):  # fmt: skip
            remote.read_images([6])
        sample = next(s for s in range(remote.layout(LAYOUT).num_samples)
                      if 6 in remote.layout(LAYOUT).sample_images([s])[1].tolist())  # fmt: skip
        with pytest.raises(MediaError, match="image 6 "):
            dataset(remote).get_batch([sample])
    finally:
        store.put(url, original)
    a, n = int(rows["offset"][0]), int(rows["size"][0])
    assert remote.read_images([6])[0] == original[a : a + n]  # the object restored: read and checked again


def test_an_index_pushed_with_its_media_opens_from_the_bucket_and_reads_the_same(media, tmp_path):
    docs, tok, bucket = media["docs"], media["tok"], media["bucket"]
    embedded = build_media_index(dataset_source(to_dataset(docs)), tok, COUNTS, cache_dir=tmp_path)  # bytes inside
    for index in (embedded, media["remote"]):
        url = join(bucket, f"pushed-{uuid.uuid4().hex[:8]}", index.path.name)
        push_index(index.path, url)
        opened = MediaIndex.open(url)
        assert opened.fingerprint == index.fingerprint and opened.num_images == index.num_images
        ids = np.arange(index.layout(LAYOUT).num_samples)
        assert_same(dataset(opened).get_batch(ids), dataset(media["local"]).get_batch(ids))
    listed = datasets.Dataset.from_json(str(to_directory(docs[:4], tmp_path / "dir")), cache_dir=str(tmp_path / "hf"))
    files = build_media_index(dataset_source(listed, image_root=tmp_path / "dir"), tok, COUNTS, cache_dir=tmp_path)
    n = sum(len(d["images"]) for d in docs[:4])
    with pytest.raises(TokenIndexError, match=rf"reads images from {n} local file\(s\) .* put the shards in the"):
        push_index(files.path, join(bucket, "refused", files.path.name))


@pytest.fixture(scope="module")
def pushed(media):
    """The index of the shards in the bucket, pushed there too: its tokens and its images read from the bucket."""
    url = join(media["bucket"], f"pushed-{uuid.uuid4().hex[:8]}", media["remote"].path.name)
    push_index(media["remote"].path, url)
    return MediaIndex.open(url)


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("stored", ["shards", "index and shards"])
def test_prefetch_fetches_exactly_the_images_of_the_next_micro_batches(media, pushed, stored, num_workers):
    local, remote = media["local"], media["remote"] if stored == "shards" else pushed
    layout = remote.layout(LAYOUT)
    plan = Plan(layout.num_samples, seed=3, global_batch_size=4, micro_batch_size=2, world_size=1)
    got = dataset(remote, prefetch=TIGHT, plan=plan)
    want = dataset(local)
    sampler = DeterministicBatchSampler(plan, 0, start_step=1, stop_step=9)
    loader = torch.utils.data.DataLoader(got, batch_sampler=sampler, num_workers=num_workers,
                                         collate_fn=collate_micro_batch,
                                         multiprocessing_context="forkserver" if num_workers else None)  # fmt: skip
    where = [(s, a) for s in range(1, 9) for a in range(2)]
    for (step, micro_step), batch in zip(where, loader, strict=True):
        assert_same(batch, want.get_batch(plan.micro_batch(step, micro_step, 0)))
    if num_workers:
        return
    stats = got.prefetch_stats()
    prefetcher = got.packed._prefetcher[1]  # the tokens (from the bucket), then the shards, by 64 KiB blocks
    objects = prefetcher.own[0]
    assert len(prefetcher.objects) - len(objects) == (stored != "shards") and len(objects) == len(media["urls"])
    assert stats.served == 16 and stats.unplanned == 0 and stats.cache["misses"] == 0  # every block there before
    need: dict[str, set[int]] = {}
    for step, micro_step in where:  # the blocks the images of the micro batches read lie in
        rows = remote.image_rows(layout.sample_images(plan.micro_batch(step, micro_step, 0))[1])
        for source, a, n in zip(rows["source"], rows["offset"], rows["size"]):
            url = remote.meta["sources"][int(source)]
            need.setdefault(url, set()).update(range(int(a) // TIGHT.block_bytes, (int(a + n) - 1) // TIGHT.block_bytes
                                                     + 1))  # fmt: skip
    fetched = {o.url: set(np.flatnonzero(o.source._from_cache_ok).tolist()) for o in objects}
    assert {u: b for u, b in fetched.items() if b} == need  # no block no image of theirs lies in
    used = 0
    for s, a in where:  # each micro batch's images' bytes, and its tokens' when they are read from the bucket too
        ids = plan.micro_batch(s, a, 0)
        used += int(remote.image_rows(layout.sample_images(ids)[1])["size"].sum())
        if stored != "shards":
            spans = layout.locate(ids)
            starts = np.asarray(remote.offsets[spans.doc_ids], np.int64)
            lengths = np.asarray(remote.lengths[spans.doc_ids], np.int64)
            used += int(token_ranges(spans, starts, lengths, False)[1].sum()) * remote.tokens.dtype.itemsize
    assert stats.used_bytes == used
    got.close()
