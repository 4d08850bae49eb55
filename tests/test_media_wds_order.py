"""The order of a text sample's images in webdataset shards (issue 33's leftover): ``KEY.<ext>`` for one image, or
``KEY.0.<ext>``, ``KEY.1.<ext>``, ... by number, the chat shards' rule, never member order (webdataset's ``TarWriter``
writes a sample's members sorted by name, ``KEY.10.png`` before ``KEY.2.jpg``). The same documents, one of 12 images,
from a ``datasets`` table and from shards give byte-identical ``tokens.npy``, the same image records and equal batches,
pixels included; images numbered twice, unnumbered beside numbered, or named are refused naming shard and key; an index
cached under the member-order rule is not reused (the rule's version joins the source's identity)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from detsampler.loader.vlm import VLMDataset
from detsampler.media import MediaLayoutConfig, Qwen2VLCounts
from detsampler.media.build import build_media_index
from detsampler.media.sources import IMAGE_ORDER_VERSION, Document, dataset_source, webdataset_source
from tests.media_corpus import EXTENSIONS, documents, to_dataset, to_shards, vlm_tokenizer
from train.vlm_corpus import IMAGE, image_bytes

COUNTS = Qwen2VLCounts(min_pixels=4 * 28 * 28, max_pixels=32 * 28 * 28)
LAYOUT = MediaLayoutConfig(seq_len=512, max_patches=512, window_docs=8)
# the image records that do not depend on where the bytes are (source and offset do)
SAME = ("doc", "item", "start", "tokens", "patches", "grid_h", "grid_w", "size", "crc32", "format", "width", "height")


def many_images(n: int) -> dict:
    """A text of ``n`` images of distinct widths (56, 84, 112, ... pixels): their member order in a shard is not their
    order in the text from the 11th on."""
    images = [{"format": ("JPEG", "PNG")[i % 2], "orientation": None,
               "bytes": image_bytes(("JPEG", "PNG")[i % 2], 56 + 28 * i, 60, None, i)} for i in range(n)]  # fmt: skip
    return {"text": " ".join(f"image {i} {IMAGE}" for i in range(n)) + " which came first", "images": images}


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    root = tmp_path_factory.mktemp("vlm-wds-order")
    tok = vlm_tokenizer(root / "tok")
    docs = documents(6, seed=7, max_images=2) + [many_images(12), many_images(1)] + documents(3, seed=8, max_images=3)
    reference = build_media_index(dataset_source(to_dataset(docs)), tok, COUNTS, cache_dir=root / "dataset")
    return root, tok, docs, reference


def write_unnumbered(docs: list[dict], path) -> list:
    """One shard whose samples of one image hold it as ``KEY.<ext>`` (no number); others ``KEY.<i>.<ext>``."""
    import webdataset as wds

    path.parent.mkdir(parents=True, exist_ok=True)
    with wds.TarWriter(str(path)) as sink:
        for d, doc in enumerate(docs):
            sample = {"__key__": f"{d:06d}", "txt": doc["text"]}
            for i, im in enumerate(doc["images"]):
                number = "" if len(doc["images"]) == 1 else f"{i}."
                sample[f"{number}{EXTENSIONS[im['format']]}"] = im["bytes"]
            sink.write(sample)
    return [path]


def assert_same_index(got, want) -> None:
    for name in ("tokens.npy", "lengths.npy", "offsets.npy", "doc_sha256.npy"):
        assert (got.path / name).read_bytes() == (want.path / name).read_bytes(), name
    rows, want_rows = got.image_rows(np.arange(got.num_images)), want.image_rows(np.arange(want.num_images))
    for column in SAME:
        assert np.array_equal(rows[column], want_rows[column]), column
    assert got.num_images == want.num_images > 12
    layout = want.layout(LAYOUT)
    ids = np.arange(layout.num_samples)
    processor = Qwen2VLImageProcessorPil(**COUNTS.processor_kwargs())
    batch = VLMDataset(got, got.layout(LAYOUT), processor, rope="qwen2_vl").get_batch(ids)
    expected = VLMDataset(want, layout, processor, rope="qwen2_vl").get_batch(ids)
    assert sorted(batch) == sorted(expected)
    for key, value in expected.items():
        assert torch.equal(batch[key], value) if torch.is_tensor(value) else batch[key] == value, key


@pytest.mark.parametrize("writer", ["write_shards", "unnumbered single"])
def test_text_shards_make_the_datasets_tables_index_byte_for_byte(writer, text):
    root, tok, docs, reference = text
    if writer == "write_shards":
        shards = to_shards(docs, root / "wds", per_shard=4)
    else:
        shards = write_unnumbered(docs, root / "wds-single" / "shard.tar")
    source = webdataset_source(shards, cache_dir=root)
    assert source.identity["image_order"] == IMAGE_ORDER_VERSION
    index = build_media_index(source, tok, COUNTS, cache_dir=root / f"cache-{writer}")
    twelve = index.image_rows(np.flatnonzero(index.image_rows(np.arange(index.num_images))["doc"] == 6))
    assert twelve["width"].tolist() == [56 + 28 * i for i in range(12)]
    assert_same_index(index, reference)


def test_an_index_cached_under_member_order_is_not_reused(text):
    root, tok, docs, reference = text
    shards = to_shards(docs, root / "wds-stale", per_shard=4)
    source = webdataset_source(shards, cache_dir=root)
    old_identity = {k: v for k, v in source.identity.items() if k != "image_order"}  # the identity before the rule

    def member_order():  # what the build read before: a text sample's images in member order
        for doc in source.documents():
            yield Document(doc.name, doc.text, sorted(doc.images, key=lambda im: im.offset))

    stale = build_media_index(dataclasses.replace(source, identity=old_identity, documents=member_order), tok, COUNTS,
                              cache_dir=root / "stale")  # fmt: skip
    assert (stale.path / "tokens.npy").read_bytes() != (reference.path / "tokens.npy").read_bytes()
    index = build_media_index(source, tok, COUNTS, cache_dir=root / "stale")
    assert index.path != stale.path and index.fingerprint != stale.fingerprint
    assert_same_index(index, reference)


def write_samples(path, samples: list[dict]) -> list:
    import webdataset as wds

    path.parent.mkdir(parents=True, exist_ok=True)
    with wds.TarWriter(str(path)) as sink:
        for sample in samples:
            sink.write(sample)
    return [path]


BAD = {
    "numbered twice": (
        {"0.jpg": "a", "1.png": "b", "1.webp": "b"},
        r"^shard\.tar:000001: images 000001\.1\.png and 000001\.1\.webp are both number 1; each image of a sample",
    ),
    "unnumbered beside numbered": (
        {"0.jpg": "a", "1.png": "b", "jpg": "a"},
        r"^shard\.tar:000001: image 000001\.jpg has no number beside numbered images \(000001\.0\.jpg,"
        r" 000001\.1\.png\); a sample's images are one KEY\.<ext>, .* in the order of its image placeholders$",
    ),
    "two unnumbered": (
        {"jpg": "a", "png": "b"},
        r"^shard\.tar:000001: image 000001\.png has no number beside another \(000001\.jpg\)",
    ),
    "a named image": (
        {"0.jpg": "a", "1.png": "b", "left.jpg": "a"},
        r"^shard\.tar:000001: image 000001\.left\.jpg is not KEY\.<ext> or KEY\.<number>\.<ext>; the number gives its"
        r" place among the text's image placeholders$",
    ),
}


@pytest.mark.parametrize("kind", sorted(BAD))
def test_a_text_sample_of_ambiguous_image_order_is_refused_naming_shard_and_key(kind, text, tmp_path):
    root, tok, docs, _ = text
    members, message = BAD[kind]
    two = {"a": image_bytes("JPEG", 40, 30, None, 1), "b": image_bytes("PNG", 30, 40, None, 2)}
    good = {"txt": f"one {IMAGE} two {IMAGE}", "0.jpg": two["a"], "1.png": two["b"]}
    bad = {"txt": f"one {IMAGE} two {IMAGE}", **{ext: two[v] for ext, v in members.items()}}
    samples = [{"__key__": "000000", **good}, {"__key__": "000001", **bad}, {"__key__": "000002", **good}]
    shards = write_samples(tmp_path / "wds" / "shard.tar", samples)
    with pytest.raises(ValueError, match=message) as info:
        build_media_index(webdataset_source(shards, cache_dir=tmp_path), tok, COUNTS, cache_dir=tmp_path / "cache")
    assert "\n" not in str(info.value)
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == []
