"""The audits on multimodal documents (issue 33): ``where`` inverts the media layout exactly (equal to a scan of
``locate``), a redacted document's labels are masked in a VLM batch and nothing else moves, and a sample's images are
listed with their source, byte range, size and tokens."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from detsampler import Plan
from detsampler.loader.redact import redact_labels
from detsampler.loader.vlm import VLMDataset
from detsampler.media import MediaLayoutConfig, Qwen2VLCounts, make_media_layout
from detsampler.media.build import build_media_index
from detsampler.media.sources import webdataset_source
from detsampler.redaction import Redaction
from detsampler.where import where
from tests.media_corpus import documents, to_shards, vlm_tokenizer
from tests.test_media_packing import COUNTS as IDENTITY
from tests.test_media_packing import corpus, segments
from tests.test_where import scan

COUNTS = Qwen2VLCounts(min_pixels=4 * 28 * 28, max_pixels=48 * 28 * 28)


@given(
    docs=st.lists(st.lists(segments, max_size=5), min_size=1, max_size=24),
    window=st.integers(1, 8),
    world=st.integers(1, 2),
    seed=st.integers(0, 2**32),
)
def test_where_equals_a_scan_of_locate_over_the_media_layout(docs, window, world, seed):
    lengths, runs = corpus(docs)
    layout = make_media_layout(MediaLayoutConfig(seq_len=16, max_patches=50, window_docs=window), lengths, runs,
                               IDENTITY)  # fmt: skip
    plan = Plan(layout.num_samples, seed=seed, global_batch_size=2 * world, micro_batch_size=1, world_size=world)
    stop = 2 * layout.num_samples // (2 * world) + 2  # past an epoch
    for doc in range(len(docs)):
        assert where(plan, layout, doc, range(0, stop)) == scan(plan, layout, doc, 0, stop)
    with pytest.raises(ValueError, match=rf"Got document {len(docs)}, allowed documents are in \[0, {len(docs)}\)"):
        where(plan, layout, len(docs), range(0, 1))


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    root = tmp_path_factory.mktemp("audit")
    shards = to_shards(documents(24, seed=5, max_images=2), root / "wds", per_shard=8)
    index = build_media_index(webdataset_source(shards, cache_dir=root), vlm_tokenizer(root / "tok"), COUNTS,
                              cache_dir=root / "cache")  # fmt: skip
    return index, index.layout(MediaLayoutConfig(seq_len=256, max_patches=512, window_docs=8))


def test_a_redacted_document_is_masked_in_the_vlm_batch_and_nothing_else_moves(media):
    index, layout = media
    dataset = VLMDataset(index, layout, Qwen2VLImageProcessorPil(**COUNTS.processor_kwargs()), rope="qwen2_vl")
    sample = next(s for s in range(layout.num_samples) if len(layout.sample_images([s])[1]))
    before = dataset.get_batch([sample])
    doc = int(index.image_rows(layout.sample_images([sample])[1][:1])["doc"][0])
    after = dataset.get_batch([sample])
    changed = redact_labels(after, step=5, redactions=[Redaction([doc], from_step=5)])
    mine = after["document_ids"] == doc
    assert changed == int(((before["labels"] != -100) & mine).sum()) > 0
    assert (after["labels"][mine] == -100).all() and torch_equal(after["labels"][~mine], before["labels"][~mine])
    for key in ("input_ids", "pixel_values", "image_grid_thw", "position_ids"):
        assert torch_equal(after[key], before[key])
    assert redact_labels(after, step=4, redactions=[Redaction([doc], from_step=5)]) == 0


def torch_equal(a, b) -> bool:
    import torch

    return bool(torch.equal(a, b))


def test_a_samples_images_are_listed_with_source_bytes_size_and_tokens(media):
    index, layout = media
    sample = next(s for s in range(layout.num_samples) if len(layout.sample_images([s])[1]))
    (listed,) = index.sample_images(layout, [sample])
    spans = layout.locate([sample])
    assert [im["document"] for im in listed] == sorted(
        (im["document"] for im in listed), key=lambda d: spans.doc_ids.tolist().index(d)
    )
    for im in listed:
        assert im["source"].endswith(".tar") and im["format"] in ("JPEG", "PNG", "WEBP")
        with open(im["source"], "rb") as f:
            f.seek(im["bytes"][0])
            assert f.read(im["bytes"][1] - im["bytes"][0]) == index.read_image(im["image"])
        assert (im["tokens"], im["patches"]) == tuple(
            int(x[0]) for x in (lambda c: (c.tokens, c.patches))(COUNTS.count([im["width"]], [im["height"]]))
        )
    assert np.array_equal([im["image"] for im in listed], layout.sample_images([sample])[1])
