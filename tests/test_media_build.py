"""The media index (issue 33): built from a ``datasets`` table with the ``Image`` feature, a parquet file, a directory
of image files and webdataset tar shards, the same documents give the same tokens and records; each image's record
comes from its header (size after EXIF orientation, CRC-32, byte range); bad media refused naming source and item, or
skipped under the recorded policy; nothing half-written."""

from __future__ import annotations

import io
import tarfile
import zlib

import datasets
import numpy as np
import pytest
from PIL import Image, ImageOps

from detsampler.index.format import TokenIndexError
from detsampler.media import MediaLayoutConfig, Qwen2VLCounts
from detsampler.media.build import MediaBuildConfig, build_media_index
from detsampler.media.headers import MediaError
from detsampler.media.index import MediaIndex
from detsampler.media.sources import dataset_source, webdataset_source
from tests.media_corpus import documents, to_dataset, to_directory, to_shards, vlm_tokenizer
from tests.media_images import bomb_png, image_bytes

COUNTS = Qwen2VLCounts(min_pixels=4 * 28 * 28, max_pixels=64 * 28 * 28)


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return vlm_tokenizer(tmp_path_factory.mktemp("tok"))


@pytest.fixture(scope="module")
def docs():
    return documents(14, seed=3)


def expected_tokens(doc: dict, tok) -> np.ndarray:
    """The document's tokens with each placeholder repeated to the token count of its decoded, EXIF-transposed image
    (computed from the pixels, not from the header)."""
    ids = np.array(tok.encode(doc["text"]), np.int64)
    image_id = tok.encode("<|image_pad|>")[0]
    sizes = [ImageOps.exif_transpose(Image.open(io.BytesIO(im["bytes"]))).size for im in doc["images"]]
    reps = np.ones(len(ids), np.int64)
    reps[ids == image_id] = COUNTS.count([w for w, _ in sizes], [h for _, h in sizes]).tokens
    return np.repeat(ids, reps)


def all_sources(docs, tmp_path, cache):
    ds = to_dataset(docs)
    ds.to_parquet(str(tmp_path / "docs.parquet"))
    parquet = datasets.Dataset.from_parquet(str(tmp_path / "docs.parquet"), cache_dir=str(tmp_path / "hf"))
    listed = to_directory(docs, tmp_path / "dir")
    files = datasets.Dataset.from_json(str(listed), cache_dir=str(tmp_path / "hf"))
    shards = to_shards(docs, tmp_path / "wds", per_shard=4)
    return {
        "dataset": dataset_source(ds),
        "parquet": dataset_source(parquet),
        "directory": dataset_source(files, image_root=tmp_path / "dir"),
        "webdataset": webdataset_source(shards, cache_dir=cache),
    }


def test_every_source_gives_the_same_tokens_and_records(docs, tok, tmp_path):
    cache = tmp_path / "cache"
    indexes = {
        k: build_media_index(s, tok, COUNTS, cache_dir=cache) for k, s in all_sources(docs, tmp_path, cache).items()
    }
    assert len({ix.fingerprint for ix in indexes.values()}) == 4  # four sources, four identities
    for kind, index in indexes.items():
        assert index.num_documents == len(docs) and index.num_images == sum(len(d["images"]) for d in docs)
        for d, doc in enumerate(docs):
            assert np.array_equal(index.document_tokens(d), expected_tokens(doc, tok)), (kind, d)
        rows = index.image_rows(np.arange(index.num_images))
        flat = [im for doc in docs for im in doc["images"]]
        for i, im in enumerate(flat):
            decoded = ImageOps.exif_transpose(Image.open(io.BytesIO(im["bytes"])))
            assert (rows["width"][i], rows["height"][i]) == decoded.size
            assert rows["orientation"][i] == (im["orientation"] or 1)
            assert rows["crc32"][i] == zlib.crc32(im["bytes"]) and rows["size"][i] == len(im["bytes"])
            assert index.read_image(i) == im["bytes"]
            run = index.document_tokens(int(rows["doc"][i]))[rows["start"][i] : rows["start"][i] + rows["tokens"][i]]
            assert (run == index.image_token_id).all()
    shard_rows = indexes["webdataset"].image_rows(np.arange(3))
    with tarfile.open(indexes["webdataset"].meta["sources"][int(shard_rows["source"][0])]) as tar:
        starts = sorted(m.offset_data for m in tar.getmembers() if not m.name.endswith(".txt"))
    assert set(shard_rows["offset"].tolist()) <= set(starts)  # byte ranges of the shard, never copied
    assert indexes["webdataset"].meta["num_image_bytes"] == 0
    assert indexes["directory"].meta["num_image_bytes"] == 0
    assert indexes["dataset"].meta["num_image_bytes"] == sum(len(im["bytes"]) for im in flat)


def test_an_index_is_built_once_and_its_key_follows_the_count_function(docs, tok, tmp_path):
    source = dataset_source(to_dataset(docs[:4]))
    first = build_media_index(source, tok, COUNTS, cache_dir=tmp_path)
    again = build_media_index(source, tok, COUNTS, cache_dir=tmp_path)
    assert again.path == first.path and again.meta["build"] == first.meta["build"]
    other = build_media_index(source, tok, Qwen2VLCounts(min_pixels=4 * 28 * 28, max_pixels=32 * 28 * 28),
                              cache_dir=tmp_path)  # fmt: skip
    assert other.fingerprint != first.fingerprint
    config = MediaLayoutConfig(seq_len=512, max_patches=1024, window_docs=4)
    assert first.layout(config).describe() != other.layout(config).describe()


BAD = {
    "zero-size": (b"", "the image is empty"),
    "corrupt": (image_bytes("JPEG", 30, 30)[:200] + b"\xff\xd9", "a corrupt image"),
    "truncated": (image_bytes("JPEG", 40, 30)[:-10], "a truncated JPEG"),
    "bomb": (bomb_png(20_000, 20_000), "a decompression bomb"),
    "aspect": (image_bytes("PNG", 402, 2), "aspect ratio 201.0"),
}


def _with_bad_image(docs, data):
    bad = [dict(d) for d in docs[:5]]
    bad[2] = {"text": "a <|vision_start|><|image_pad|><|vision_end|> b", "images": [{"format": "PNG", "bytes": data,
              "orientation": None}]}  # fmt: skip
    return bad


@pytest.mark.parametrize("kind", sorted(BAD))
def test_bad_media_is_refused_naming_source_and_item_and_nothing_is_left(kind, docs, tok, tmp_path):
    data, message = BAD[kind]
    bad = _with_bad_image(docs, data)
    shards = to_shards(bad, tmp_path / "wds", per_shard=4)
    cache = tmp_path / "cache"
    wds_source = webdataset_source(shards, cache_dir=tmp_path / "fp")
    for source, where in [
        (dataset_source(to_dataset(bad)), "row 2 images[0]"),
        (wds_source, "shard-00000.tar:000002.0.png"),
    ]:
        with pytest.raises(MediaError, match=message) as info:
            build_media_index(source, tok, COUNTS, cache_dir=cache)
        assert str(info.value).startswith(where) and "\n" not in str(info.value)
        assert sorted(p.name for p in cache.iterdir()) == []  # no index, no temporary directory, no lock
    skipped = build_media_index(webdataset_source(shards, cache_dir=tmp_path / "fp"), tok, COUNTS, cache_dir=cache,
                                config=MediaBuildConfig(bad_media="skip"))  # fmt: skip
    assert skipped.num_documents == 4 and skipped.doc_rows[0:4].tolist() == [0, 1, 3, 4]
    assert [s["document"] for s in skipped.meta["skipped"]] == ["shard-00000.tar:000002"]
    assert message.strip() in skipped.meta["skipped"][0]["reason"]


def test_placeholders_must_match_the_images(docs, tok, tmp_path):
    wrong = [{"text": "no placeholder here", "images": docs[0]["images"][:1] or [{"bytes": image_bytes("PNG", 9, 9)}]}]
    rows = {"text": [wrong[0]["text"]], "images": [[{"bytes": wrong[0]["images"][0]["bytes"], "path": None}]]}
    features = datasets.Features({"text": datasets.Value("string"), "images": datasets.List(datasets.Image())})
    source = dataset_source(datasets.Dataset.from_dict(rows, features=features))
    with pytest.raises(ValueError, match=r"^row 0: its text holds 0 image placeholders '<\|image_pad\|>' and it has 1"):
        build_media_index(source, tok, COUNTS, cache_dir=tmp_path)
    prepended = build_media_index(
        source, tok, COUNTS, cache_dir=tmp_path, config=MediaBuildConfig(placeholders="prepend")
    )
    assert prepended.document_tokens(0)[0] == prepended.image_token_id
    with pytest.raises(ValueError, match=r"image_token '<image>' encodes as \d+ tokens .* it must be one token"):
        build_media_index(source, tok, COUNTS, cache_dir=tmp_path, config=MediaBuildConfig(image_token="<image>"))
    with pytest.raises(ValueError, match=r"placeholders must be 'in_text' or 'prepend', got 'end'"):
        MediaBuildConfig(placeholders="end")


def test_a_file_changed_after_the_build_is_refused_at_read(docs, tok, tmp_path):
    listed = to_directory(docs[:3], tmp_path / "dir")
    files = datasets.Dataset.from_json(str(listed), cache_dir=str(tmp_path / "hf"))
    index = build_media_index(dataset_source(files, image_root=tmp_path / "dir"), tok, COUNTS, cache_dir=tmp_path / "c")
    path = index.meta["sources"][int(index.image_rows([0])["source"][0])]
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0xFF
    open(path, "wb").write(bytes(data))
    with pytest.raises(MediaError, match=r"image 0 \(document \d+, item 0\) at .*: its bytes' CRC-32 is .* the file"
                       r" changed since the index was built"):  # fmt: skip
        index.read_image(0)


def test_a_media_index_is_not_a_token_index_and_its_seal_holds(docs, tok, tmp_path):
    from detsampler.index import TokenIndex

    index = build_media_index(dataset_source(to_dataset(docs[:3])), tok, COUNTS, cache_dir=tmp_path)
    with pytest.raises(TokenIndexError, match="is not a detsampler token index"):
        TokenIndex.open(index.path)  # a text-only reader never trains on image tokens without their pixels
    meta = (index.path / "meta.json").read_text()
    (index.path / "meta.json").write_text(meta.replace('"image_token_id": ', '"image_token_id": 1'))
    with pytest.raises(TokenIndexError, match="fails its checksum"):
        MediaIndex.open(index.path)
