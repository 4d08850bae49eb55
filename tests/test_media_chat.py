"""Chat data with images (issue 33): a ``messages`` column whose contents hold ``{"type": "image"}`` parts beside
``{"type": "text", "text": ...}`` parts, built into a media index under each loss policy and read as a VLM batch, is
checked by value against transformers' own ``Qwen2VLProcessor.apply_chat_template`` (a processor made from explicit
parts, nothing downloaded): every conversation's token ids (each image's placeholder expanded by the processor), the
policy's mask, the labels of every sample (-100 on image tokens and per the policy, none crossing a conversation
boundary) and the pixels."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image, ImageOps
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from detsampler.index.format import TokenIndexError
from detsampler.loader.vlm import VLMDataset
from detsampler.media import MediaLayoutConfig, Qwen2VLCounts
from detsampler.media.build import MediaBuildConfig, build_media_index
from detsampler.media.index import MediaIndex
from detsampler.media.sources import dataset_source
from detsampler.text.chat import ChatConfig
from tests.chat_data import crossing_labels, expected_sample
from tests.media_corpus import (
    VLM_CHAT_TEMPLATE,
    chat_corpus_documents,
    chat_to_dataset,
    documents,
    qwen2_vl_processor,
    to_dataset,
    vlm_chat_tokenizer,
)

COUNTS = Qwen2VLCounts(min_pixels=4 * 28 * 28, max_pixels=32 * 28 * 28)
LAYOUT = MediaLayoutConfig(seq_len=320, max_patches=512, window_docs=8)
POLICIES = ("assistant", "last_turn", "all")


@pytest.fixture(scope="module")
def chat_media(tmp_path_factory):
    root = tmp_path_factory.mktemp("vlm-chat")
    tok = vlm_chat_tokenizer(root / "tok")
    docs = chat_corpus_documents(16, seed=4, max_images=2, largest=120)
    return root, tok, docs, chat_to_dataset(docs)


def image_processor():
    return Qwen2VLImageProcessorPil(**COUNTS.processor_kwargs())


def decoded(im: dict) -> Image.Image:
    return ImageOps.exif_transpose(Image.open(io.BytesIO(im["bytes"]))).convert("RGB")


def processor_rendered(tok, doc: dict, policy: str, eos_id: int, eos_trained: bool) -> dict:
    """The processor's ``apply_chat_template`` of one conversation, its images given as decoded, EXIF-transposed PIL
    images in their parts: ids and the policy's mask (-100 targets: image tokens and what the policy leaves out), the
    EOS the index appends, and each image's pixel rows."""
    images = iter(decoded(im) for im in doc["images"])
    messages = [
        {"role": m["role"], "content": [{"type": "image", "image": next(images)} if p["type"] == "image" else
                                        {"type": "text", "text": p["text"]} for p in m["content"]]}
        for m in doc["messages"]
    ]  # fmt: skip
    out = qwen2_vl_processor(tok, image_processor()).apply_chat_template(
        messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True, return_tensors="np"
    )
    ids, mask = np.asarray(out["input_ids"][0], np.int64), np.asarray(out["assistant_masks"][0], bool)
    if policy == "all":
        mask[:] = True
    if policy == "last_turn":
        start = int(np.flatnonzero(mask)[-1])
        while start > 0 and mask[start - 1]:
            start -= 1
        mask[:start] = False
    mask &= np.asarray(out["mm_token_type_ids"][0]) == 0  # no image token is a target
    pixels, grids = out.get("pixel_values"), out.get("image_grid_thw")
    per_image = [] if grids is None else np.split(pixels, np.cumsum(np.prod(grids, axis=1))[:-1])
    return {"ids": np.append(ids, eos_id), "mask": np.append(mask, eos_trained), "pixels": per_image}


@pytest.mark.parametrize("policy", POLICIES)
def test_chat_with_images_equals_the_processors_apply_chat_template(policy, chat_media):
    root, tok, docs, dataset = chat_media
    chat = ChatConfig(policy=policy)
    source = dataset_source(dataset, messages_column="messages")
    index = build_media_index(source, tok, COUNTS, cache_dir=root / "cache", chat=chat)
    assert index.chat.policy == policy and index.meta["chat"]["template_sha256"]
    rendered = [processor_rendered(tok, doc, policy, index.eos_id, chat.eos_trained) for doc in docs]
    for d, want in enumerate(rendered):  # the stored conversation: the processor's ids, the policy's mask
        assert np.array_equal(index.document_tokens(d), want["ids"][:-1]), d
        a = int(index.offsets[d])
        assert np.array_equal(np.asarray(index.loss_mask[a : a + int(index.lengths[d])]), want["mask"][:-1]), d
    layout = index.layout(LAYOUT)
    dataset_ = VLMDataset(index, layout, image_processor(), rope="qwen2_vl")
    ids = np.arange(layout.num_samples)
    batch = dataset_.get_batch(ids)
    spans = layout.locate(ids)
    rows = index.image_rows(layout.sample_images(ids)[1])
    pairs = list(zip(rows["doc"].tolist(), rows["item"].tolist()))
    for i in ids:
        want = expected_sample([(r["ids"], r["mask"]) for r in rendered], spans, int(i), LAYOUT.seq_len, False,
                               index.pad_id)  # fmt: skip
        for name in ("input_ids", "labels", "loss_mask"):
            assert np.array_equal(batch[name][i].numpy(), want[name]), (name, i)
    assert crossing_labels(spans, layout.sample_len, batch["loss_mask"].numpy()) == 0
    assert not (batch["labels"] == index.image_token_id).any() and batch["loss_mask"].any()
    assert torch.equal(batch["loss_mask"], batch["labels"] != -100)
    want_pixels = np.concatenate([rendered[d]["pixels"][k] for d, k in pairs])
    assert torch.equal(batch["pixel_values"], torch.from_numpy(want_pixels))
    assert len(pairs) == index.num_images > 0


def test_the_policy_and_template_are_the_index_identity(chat_media):
    root, tok, docs, dataset = chat_media
    source = dataset_source(dataset, messages_column="messages")
    keys = {
        build_media_index(source, tok, COUNTS, cache_dir=root / "cache", chat=ChatConfig(policy=p)).fingerprint
        for p in POLICIES
    }
    other = VLM_CHAT_TEMPLATE.replace("<|im_end|>{% endgeneration %}", "{% endgeneration %}<|im_end|>")
    keys.add(build_media_index(source, tok, COUNTS, cache_dir=root / "cache",
                               chat=ChatConfig(chat_template=other)).fingerprint)  # fmt: skip
    assert len(keys) == 4
    index = MediaIndex.open(build_media_index(source, tok, COUNTS, cache_dir=root / "cache", chat=ChatConfig()).path)
    assert index.meta["format_version"] == 2 and index.loss_mask is not None
    plain = build_media_index(dataset_source(to_dataset(documents(3))), tok, COUNTS, cache_dir=root / "plain")
    assert plain.meta["format_version"] == 2 and plain.chat is None and plain.loss_mask is None


def test_bad_chat_rows_and_mismatched_settings_are_refused(chat_media, tmp_path):
    root, tok, docs, dataset = chat_media
    chat = ChatConfig()

    def build(docs_, **kwargs):
        source = dataset_source(chat_to_dataset(docs_), messages_column="messages")
        return build_media_index(source, tok, COUNTS, cache_dir=tmp_path, chat=kwargs.pop("chat", chat), **kwargs)

    extra = [dict(d, images=d["images"] + d["images"][:1]) if d["images"] else d for d in docs[:4]]
    with pytest.raises(ValueError, match=r"row \d: its conversation holds \d+ image parts .* and it has \d+ images"):
        build(extra)
    odd = [dict(docs[0], messages=[{"role": "user", "content": [{"type": "video", "text": None}]}], images=[])]
    with pytest.raises(ValueError, match=r"row 0 messages\[0\]: a content part of type 'video'; allowed types are"):
        build(odd)
    with pytest.raises(ValueError, match=r"placeholders='prepend' .* a chat template places each image"):
        build(docs[:2], config=MediaBuildConfig(placeholders="prepend"))
    with pytest.raises(ValueError, match=r"reads the messages column 'messages': pass chat=ChatConfig"):
        build(docs[:2], chat=None)
    with pytest.raises(ValueError, match=r"chat=ChatConfig\(column='conversation'\) .* the source's messages column"):
        build(docs[:2], chat=ChatConfig(column="conversation"))
    with pytest.raises(ValueError, match=r"a media source of text \(dataset_source\(\.\.\., messages_column=\.\.\.\)"):
        build_media_index(dataset_source(to_dataset(documents(2))), tok, COUNTS, cache_dir=tmp_path, chat=chat)
    with pytest.raises(ValueError, match=r"prompt/completion columns .* not for media"):
        build(docs[:2], chat=ChatConfig(column="messages", completion_column="answer", policy="completion"))
    with pytest.raises(ValueError, match=r"dataset has no column 'conversation'"):
        dataset_source(dataset, messages_column="conversation")
    assert not list(tmp_path.glob("media-*")) and not list(tmp_path.glob(".tmp-*"))


def test_an_edited_loss_mask_is_refused_when_read(chat_media, tmp_path):
    root, tok, docs, dataset = chat_media
    index = build_media_index(dataset_source(dataset, messages_column="messages"), tok, COUNTS, cache_dir=tmp_path,
                              chat=ChatConfig())  # fmt: skip
    path = index.path / "loss_mask.npy"
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))
    reopened = MediaIndex.open(index.path)
    layout = reopened.layout(LAYOUT)
    with pytest.raises(TokenIndexError, match=r"loss_mask\.npy"):
        VLMDataset(reopened, layout, image_processor()).get_batch(np.arange(layout.num_samples))
