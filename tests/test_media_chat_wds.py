"""Chat data with images from webdataset shards (issue 33's leftover): sample ``KEY`` holds ``KEY.json`` (the
``messages`` list, or ``{"messages": [...]}``) and its images ``KEY.jpg`` or ``KEY.0.jpg``, ``KEY.1.png``, ... in the
order of their numbers. The same conversations built from a ``datasets`` table (checked by value against transformers'
``Qwen2VLProcessor.apply_chat_template`` in tests/test_media_chat.py) and from shards, local or in a bucket (moto's S3
on loopback), give byte-identical ``tokens.npy`` and ``loss_mask.npy``, the same image records and equal batches,
pixels included; a sample without its json, with bad JSON, a json of another shape, images numbered twice or a count
of image parts other than its images is refused in one line naming shard and key."""

from __future__ import annotations

import json
import uuid

import numpy as np
import pytest
import torch
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from detsampler.loader.vlm import VLMDataset
from detsampler.media import MediaLayoutConfig, Qwen2VLCounts
from detsampler.media.build import build_media_index
from detsampler.media.sources import dataset_source, webdataset_source
from detsampler.storage import join, store_for
from detsampler.text.chat import ChatConfig
from tests.media_corpus import chat_corpus_documents, chat_to_dataset, vlm_chat_tokenizer
from train.vlm_corpus import image_bytes, write_chat_shards

COUNTS = Qwen2VLCounts(min_pixels=4 * 28 * 28, max_pixels=32 * 28 * 28)
LAYOUT = MediaLayoutConfig(seq_len=320, max_patches=512, window_docs=8)
# the image records that do not depend on where the bytes are (source and offset do)
SAME = ("doc", "item", "start", "tokens", "patches", "grid_h", "grid_w", "size", "crc32", "format", "width", "height")


def many_images(n: int) -> dict:
    """A conversation of ``n`` images of distinct sizes in one user turn: webdataset's ``TarWriter`` writes their
    members in the order of their names (``10.png`` before ``2.jpg``), so only their numbers give the parts' order."""
    images = [{"format": ("JPEG", "PNG")[i % 2], "bytes": image_bytes(("JPEG", "PNG")[i % 2], 56 + 28 * i, 60, None, i)}
              for i in range(n)]  # fmt: skip
    parts = [{"type": "image", "text": None}] * n + [{"type": "text", "text": "which came first?"}]
    messages = [{"role": "user", "content": parts}, {"role": "assistant", "content": [{"type": "text", "text": "0"}]}]
    return {"messages": messages, "images": images}


@pytest.fixture(scope="module")
def chat(tmp_path_factory):
    root = tmp_path_factory.mktemp("vlm-chat-wds")
    tok = vlm_chat_tokenizer(root / "tok")
    docs = chat_corpus_documents(16, seed=4, max_images=2, largest=120) + [many_images(12)]
    reference = build_media_index(dataset_source(chat_to_dataset(docs), messages_column="messages"), tok, COUNTS,
                                  cache_dir=root / "dataset", chat=ChatConfig())  # fmt: skip
    return root, tok, docs, reference


def image_processor():
    return Qwen2VLImageProcessorPil(**COUNTS.processor_kwargs())


def assert_same_index(got, want) -> None:
    for name in ("tokens.npy", "loss_mask.npy", "lengths.npy", "offsets.npy", "doc_sha256.npy"):
        assert (got.path / name).read_bytes() == (want.path / name).read_bytes(), name
    rows, want_rows = got.image_rows(np.arange(got.num_images)), want.image_rows(np.arange(want.num_images))
    for column in SAME:
        assert np.array_equal(rows[column], want_rows[column]), column
    assert got.num_images == want.num_images > 12 and got.meta["chat"] == want.meta["chat"]
    layout = want.layout(LAYOUT)
    ids = np.arange(layout.num_samples)
    batch = VLMDataset(got, got.layout(LAYOUT), image_processor(), rope="qwen2_vl").get_batch(ids)
    expected = VLMDataset(want, layout, image_processor(), rope="qwen2_vl").get_batch(ids)
    assert sorted(batch) == sorted(expected) and batch["loss_mask"].any()
    for key, value in expected.items():
        assert torch.equal(batch[key], value) if torch.is_tensor(value) else batch[key] == value, key


@pytest.mark.parametrize("wrapped", [False, True], ids=["list", "object"])
def test_chat_shards_make_the_datasets_tables_index_byte_for_byte(wrapped, chat):
    root, tok, docs, reference = chat
    shards = write_chat_shards(docs, root / f"wds-{wrapped}", per_shard=6, wrapped=wrapped)
    source = webdataset_source(shards, messages_extension="json", cache_dir=root)
    assert source.messages_column == "messages" and source.identity["messages"] == "json"
    index = build_media_index(source, tok, COUNTS, cache_dir=root / f"cache-{wrapped}", chat=ChatConfig())
    assert index.meta["source"]["kind"] == "webdataset" and index.meta["sources"][1:] == [str(p) for p in shards]
    assert_same_index(index, reference)


def test_chat_shards_in_a_bucket_make_the_same_index_and_batches(chat, s3_bucket):
    root, tok, docs, reference = chat
    shards = write_chat_shards(docs, root / "wds-bucket", per_shard=6)
    prefix = join(s3_bucket, f"chat-wds-{uuid.uuid4().hex[:8]}")
    urls = [join(prefix, p.name) for p in shards]
    for path, url in zip(shards, urls):
        store_for(url).put(url, path)
    index = build_media_index(webdataset_source(urls, messages_extension="json"), tok, COUNTS,
                              cache_dir=root / "bucket", chat=ChatConfig())  # fmt: skip
    assert index.meta["sources"][1:] == urls
    assert_same_index(index, reference)


def write_samples(path, samples: list[dict]) -> list:
    import webdataset as wds

    path.parent.mkdir(parents=True, exist_ok=True)
    with wds.TarWriter(str(path)) as sink:
        for sample in samples:
            sink.write(sample)
    return [path]


def _good(docs) -> dict:
    doc = next(d for d in docs if len(d["images"]) == 2)
    return {"json": json.dumps(doc["messages"]), "0.jpg": doc["images"][0]["bytes"], "1.png": doc["images"][1]["bytes"]}


BAD = {
    "no json": (
        lambda s: {k: v for k, v in s.items() if k != "json"},
        r"^shard\.tar:000001: no member 000001\.json; a chat sample holds its conversation there \(its"
        r" members: 000001\.0\.jpg, 000001\.1\.png\)$",
    ),
    "bad json": (
        lambda s: {**s, "json": '[{"role": "user", '},
        r"^shard\.tar:000001\.json: not JSON \(Expecting property name .*\); a chat sample's KEY\.json holds",
    ),
    "not utf-8": (
        lambda s: {**s, "json": b"\xff\xfe["},
        r"^shard\.tar:000001\.json: not UTF-8; a chat sample's KEY\.json holds",
    ),
    "a number": (
        lambda s: {**s, "json": "42"},
        r"^shard\.tar:000001\.json: holds int 42, not a messages list or \{\"messages\": \[\.\.\.\]\}$",
    ),
    "no messages key": (
        lambda s: {**s, "json": '{"conversation": []}'},
        r"^shard\.tar:000001\.json: holds an object without 'messages' \(its keys: 'conversation'\),",
    ),
    "messages a string": (
        lambda s: {**s, "json": '{"messages": "hi"}'},
        r'^shard\.tar:000001\.json: holds \{"messages": str "hi"\}, not a messages list or \{"messages"',
    ),
    "an image too many": (
        lambda s: {**s, "2.webp": s["1.png"]},
        r"^shard\.tar:000001: its conversation holds 2 image parts .* and it has 3 images",
    ),
    "numbered twice": (
        lambda s: {**s, "1.webp": s["1.png"]},
        r"^shard\.tar:000001: images 000001\.1\.png and 000001\.1\.webp are both number 1;",
    ),
    "unnumbered beside numbered": (
        lambda s: {**s, "jpg": s["0.jpg"]},
        r"^shard\.tar:000001: image 000001\.jpg has no number beside numbered images",
    ),
    "a named image": (
        lambda s: {**s, "left.jpg": s["0.jpg"]},
        r"^shard\.tar:000001: image 000001\.left\.jpg is not KEY\.<ext> or KEY\.<number>\.<ext>;",
    ),
}


@pytest.mark.parametrize("kind", sorted(BAD))
def test_a_bad_chat_sample_is_refused_in_one_line_naming_shard_and_key(kind, chat, tmp_path):
    root, tok, docs, _ = chat
    edit, message = BAD[kind]
    good = _good(docs)
    samples = [{"__key__": "000000", **good}, {"__key__": "000001", **edit(good)}, {"__key__": "000002", **good}]
    shards = write_samples(tmp_path / "wds" / "shard.tar", samples)
    with pytest.raises(ValueError, match=message) as info:
        build_media_index(webdataset_source(shards, messages_extension="json", cache_dir=tmp_path), tok, COUNTS,
                          cache_dir=tmp_path / "cache", chat=ChatConfig())  # fmt: skip
    assert "\n" not in str(info.value)
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == []


def test_chat_settings_that_do_not_fit_chat_shards_are_refused(chat, tmp_path):
    root, tok, docs, _ = chat
    shards = write_samples(tmp_path / "wds" / "shard.tar", [{"__key__": "000000", **_good(docs)}])
    source = webdataset_source(shards, messages_extension="json", cache_dir=tmp_path)
    with pytest.raises(ValueError, match=r"reads the messages column 'messages': pass chat=ChatConfig"):
        build_media_index(source, tok, COUNTS, cache_dir=tmp_path / "cache")
    with pytest.raises(ValueError, match=r"webdataset_source\(\.\.\., messages_extension='json'\) reads"):
        build_media_index(webdataset_source(shards, cache_dir=tmp_path), tok, COUNTS, cache_dir=tmp_path / "cache",
                          chat=ChatConfig())  # fmt: skip
    for bad in (".json", "", "jpg", 1):
        with pytest.raises(
            ValueError, match=r"messages_extension must be the extension of a chat sample's conversation"
        ):
            webdataset_source(shards, messages_extension=bad)
