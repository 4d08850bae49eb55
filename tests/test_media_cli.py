"""The ``detsampler`` commands over a media index (issue 33), each checked by value against the library: ``show``
lists a sample's images (source, byte range, size, tokens), ``where`` inverts the media layout (by id and by the
content hash of a multimodal row), ``verify --tokens`` reads every file and every image's bytes against their CRC-32s
and says only what it checked, ``stats`` reports LLM-token and vision fill, redactions print their audit trail, and the
instance filter never flags a sample for its images' runs of image tokens."""

from __future__ import annotations

import hashlib
import json
import re
import zlib

import numpy as np
import pytest
import torch
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from detsampler.cli import main
from detsampler.content import canonical_json
from detsampler.filter import RepetitionFilter
from detsampler.loader.dataset import instance_filter_counts
from detsampler.loader.redact import redact_labels
from detsampler.loader.vlm import VLMDataset
from detsampler.media import MediaLayoutConfig, Qwen2VLCounts
from detsampler.media.build import build_media_index
from detsampler.media.sources import webdataset_source
from detsampler.plan import Plan
from detsampler.redaction import Redaction
from detsampler.where import redaction_audit, where
from tests.media_corpus import documents, to_shards, vlm_tokenizer

COUNTS = Qwen2VLCounts(min_pixels=4 * 28 * 28, max_pixels=48 * 28 * 28)
LAYOUT = MediaLayoutConfig(seq_len=256, max_patches=512, window_docs=8)
OPTIONS = ["--seq-len", "256", "--max-patches", "512", "--window-docs", "8", "--global-batch-size", "4",
           "--micro-batch-size", "2", "--world-size", "2"]  # fmt: skip
IMAGE_LINE = re.compile(
    r"^ {6}image (\d+) \(doc (\d+), item (\d+)\): (\S+) \[(\d+), (\d+)\) (JPEG|PNG|WEBP) (\d+)x(\d+)"
    r"(?: \(EXIF orientation (\d)\))?: (\d+) tokens, (\d+) patches$"
)


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    root = tmp_path_factory.mktemp("media-cli")
    docs = documents(24, seed=5, max_images=2)
    shards = to_shards(docs, root / "wds", per_shard=8)
    tok = vlm_tokenizer(root / "tok")
    index = build_media_index(webdataset_source(shards, cache_dir=root), tok, COUNTS, cache_dir=root / "cache")
    layout = index.layout(LAYOUT)
    plan = Plan(layout.num_samples, seed=0, global_batch_size=4, micro_batch_size=2, world_size=2)
    return {"root": root, "docs": docs, "index": index, "layout": layout, "plan": plan, "tok": tok}


def run(capsys, argv: list[str]) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    out = capsys.readouterr()
    return code, out.out, out.err


def args(media, *more: str) -> list[str]:
    return [*more, "--data", str(media["index"].path), *OPTIONS]


def test_show_lists_each_samples_images_by_value(media, capsys):
    index, layout, plan, docs = media["index"], media["layout"], media["plan"], media["docs"]
    flat = [im["bytes"] for doc in docs for im in doc["images"]]
    listed = 0
    for step in range(3):
        code, out, _ = run(capsys, args(media, "show", "--step", str(step)))
        assert code == 0 and f"layout bestfit seq_len=256 max_patches=512, {layout.num_samples} samples" in out
        got = [IMAGE_LINE.match(line) for line in out.splitlines() if line.startswith("      image ")]
        want = [im for a in range(plan.num_micro_steps(step)) for r in range(2)
                for sample in index.sample_images(layout, plan.micro_batch(step, a, r)) for im in sample]  # fmt: skip
        assert len(got) == len(want) and all(got)
        for m, im in zip(got, want):
            (image, doc, item, source, a, b, fmt, w, h, orientation, tokens, patches) = m.groups()
            assert (int(image), int(doc), int(item), source, [int(a), int(b)], fmt, int(w), int(h)) == (
                im["image"], im["document"], im["item"], im["source"], im["bytes"], im["format"], im["width"],
                im["height"])  # fmt: skip
            assert (int(orientation or 1), int(tokens), int(patches)) == (im["orientation"], im["tokens"],
                                                                          im["patches"])  # fmt: skip
            with open(source, "rb") as f:  # the printed byte range of the shard is the image the build read
                f.seek(int(a))
                assert f.read(int(b) - int(a)) == flat[int(image)]
            listed += 1
    assert listed > 0
    code, _, err = run(capsys, args(media, "show", "--step", "0", "--kind", "concat"))
    assert code == 2 and "--kind concat: a media index is packed on two axes" in err
    code, _, err = run(capsys, args(media, "show", "--step", "0", "--overlong", "truncate"))
    assert code == 2 and "--overlong truncate: a media index cuts a document only between images" in err


def media_hash(doc: dict) -> str:
    """A multimodal row's content hash, computed here from the row: its text and each image's sha256."""
    content = {"text": doc["text"], "images": [hashlib.sha256(im["bytes"]).hexdigest() for im in doc["images"]]}
    return hashlib.sha256(canonical_json(content)).hexdigest()


def test_where_inverts_the_media_layout_by_id_and_by_content_hash(media, capsys):
    index, layout, plan, docs = media["index"], media["layout"], media["plan"], media["docs"]
    stop = 2 * layout.num_samples // 4 + 1
    for doc in (0, 7, 23):
        code, out, _ = run(capsys, args(media, "where", "--doc", str(doc), "--steps", f"0:{stop}", "--json"))
        found = json.loads(out)
        assert code == 0 and found["reads"] == [r._asdict() for r in where(plan, layout, doc, range(stop))]
        a, b = int(index.doc_images[doc]), int(index.doc_images[doc + 1])
        assert [im["image"] for im in found["images"]] == list(range(a, b))
        assert [im["tokens"] for im in found["images"]] == index.image_rows(range(a, b))["tokens"].tolist()
        code, out, _ = run(capsys, args(media, "where", "--sha256", media_hash(docs[doc]), "--steps", f"0:{stop}",
                                        "--json"))  # fmt: skip
        assert code == 0 and json.loads(out)["doc"] == doc
    code, _, err = run(capsys, args(media, "where", "--sha256", "0" * 64, "--steps", "0:2"))
    assert code == 2 and "name no document" in err and "images' sha256s" in err


def test_verify_tokens_reads_every_image_and_says_only_what_it_checked(media, capsys, tmp_path):
    index = media["index"]
    rows = index.image_rows(np.arange(index.num_images))
    code, out, _ = run(capsys, args(media, "verify", "--steps", "0:4", "--tokens"))
    shards = len({int(s) for s in rows["source"]})
    assert code == 0 and out.splitlines()[0] == (
        f"index files: every chunk checksum and sha256 verified ({index.num_tokens} tokens); images: every one's"
        f" bytes checked against its CRC-32 ({index.num_images:,} images, {int(rows['size'].sum()):,} bytes, in"
        f" {shards} files)"
    )
    assert out.splitlines()[-1] == "OK: no duplicates, no gaps"
    code, out, _ = run(capsys, args(media, "verify", "--steps", "0:4"))
    assert code == 0 and "images:" not in out and "index files" not in out  # no audit ran: none is claimed
    shards = to_shards(documents(6, seed=1, max_images=0), tmp_path / "w")
    text_only = build_media_index(
        webdataset_source(shards, cache_dir=tmp_path), media["tok"], COUNTS, cache_dir=tmp_path
    )
    code, out, _ = run(capsys, ["verify", "--data", str(text_only.path), "--steps", "0:1", "--tokens",
                                "--global-batch-size", "1", "--micro-batch-size", "1"])  # fmt: skip
    assert code == 0 and out.splitlines()[0].endswith("; images: none in the index (nothing to check)")


def test_verify_tokens_names_an_image_edited_in_its_shard(media, capsys, tmp_path):
    import shutil

    index = media["index"]
    copy = tmp_path / "copy"
    shutil.copytree(media["root"] / "wds", copy)
    rows = index.image_rows([5])
    source = index.meta["sources"][int(rows["source"][0])]
    at = int(rows["offset"][0]) + int(rows["size"][0]) // 2
    original = open(source, "rb").read()
    try:
        with open(source, "r+b") as f:
            f.seek(at)
            f.write(bytes([original[at] ^ 0x20]))
        code, out, err = run(capsys, args(media, "verify", "--steps", "0:4", "--tokens"))
        crc = zlib.crc32(original[int(rows["offset"][0]) : int(rows["offset"][0]) + int(rows["size"][0])])
        assert code == 2 and "index files" not in out
        assert f"image 5 (document {int(rows['doc'][0])}, item {int(rows['item'][0])}) at {source}" in err
        assert f"the build recorded {crc:#010x}" in err
    finally:
        open(source, "wb").write(original)


def test_stats_reports_llm_token_and_vision_fill(media, capsys):
    index, layout = media["index"], media["layout"]
    described = layout.describe()
    code, out, _ = run(capsys, args(media, "stats", "--json"))
    found = json.loads(out)
    row = found["layouts"]["bestfit"]
    assert code == 0 and (row["llm_fill"], row["vision_fill"]) == (described["llm_fill"], described["vision_fill"])
    assert row["samples_per_epoch"] == layout.num_samples and row["max_patches"] == 512
    assert found["images"]["count"] == index.num_images
    assert found["images"]["tokens"] == int(index.image_rows(np.arange(index.num_images))["tokens"].sum())
    code, out, _ = run(capsys, args(media, "stats"))
    assert (
        code == 0 and f"{100 * described['llm_fill']:.2f}%" in out and f"{100 * described['vision_fill']:.2f}%" in out
    )
    code, _, err = run(capsys, args(media, "stats", "--kinds", "concat,document"))
    assert code == 2 and "--kinds concat,document: a media index is packed on two axes" in err


def test_redactions_by_id_and_content_hash_over_a_media_index(media, capsys):
    index, layout, plan, docs = media["index"], media["layout"], media["plan"], media["docs"]
    doc = 7
    assert index.documents_by_content([media_hash(docs[doc])]) == [doc]
    redacted = Plan(layout.num_samples, seed=0, global_batch_size=4, micro_batch_size=2, world_size=2,
                    redactions=[Redaction([doc], from_step=3)])  # fmt: skip
    (row,) = redaction_audit(redacted, layout, None)
    code, out, _ = run(capsys, args(media, "verify", "--steps", "0:6", "--redact", f"3:{doc}"))
    steps = ", ".join(map(str, row["steps"])) if row["steps"] else None
    assert code == 0 and f"redacted doc {doc}: " in out and f"({row['tokens']:,} tokens read, " in out
    assert f", {row['reads']} reads)" in out
    assert steps is None or all(str(s) in out for s in row["steps"])
    step = next(s for s in range(3, 3 + 2 * layout.num_samples) if where(plan, layout, doc, range(s, s + 1)))
    read = where(plan, layout, doc, range(step, step + 1))[0]
    dataset = VLMDataset(index, layout, Qwen2VLImageProcessorPil(**COUNTS.processor_kwargs()))
    batch = dataset.get_batch(plan.micro_batch(step, read.micro_step, read.rank))
    before = batch["labels"].clone()
    masked = redact_labels(batch, step=step, redactions=redacted.redactions)
    mine = batch["document_ids"] == doc
    assert masked == int((before[mine] != -100).sum()) > 0 and torch.equal(batch["labels"][~mine], before[~mine])


def test_the_instance_filter_never_flags_a_sample_for_its_image_tokens(media, capsys, tmp_path):
    big = Qwen2VLCounts(min_pixels=40 * 28 * 28, max_pixels=64 * 28 * 28)  # each image is a run of 40 to 64 tokens
    docs = documents(16, seed=2, max_images=2)
    docs[3]["text"] = " ".join(["cat"] * 40) + " " + docs[3]["text"]  # a real repetition: flagged
    shards = to_shards(docs, tmp_path / "wds", per_shard=8)
    index = build_media_index(webdataset_source(shards, cache_dir=tmp_path), media["tok"], big, cache_dir=tmp_path)
    layout = index.layout(MediaLayoutConfig(seq_len=512, max_patches=2048, window_docs=8))
    plan = Plan(layout.num_samples, seed=0, global_batch_size=1, micro_batch_size=1, world_size=1)
    counts = instance_filter_counts(index, layout, plan, range(layout.num_samples), RepetitionFilter())
    assert counts["flagged_samples"] == 1 and counts["samples"] == layout.num_samples
    runs = sum(int(t) >= 32 for t in index.image_rows(np.arange(index.num_images))["tokens"])
    assert runs > 0  # without the fix, every sample holding one of these images was flagged
    sample = next(s for s in range(layout.num_samples) if 3 in layout.locate([s]).doc_ids.tolist())
    dataset = VLMDataset(index, layout, Qwen2VLImageProcessorPil(**big.processor_kwargs()),
                         instance_filter=RepetitionFilter())  # fmt: skip
    batch = dataset.get_batch(np.arange(layout.num_samples))
    trained = (batch["labels"] != -100).any(dim=1)
    assert trained.tolist() == [s != sample for s in range(layout.num_samples)]
    code, out, _ = run(capsys, ["stats", "--data", str(index.path), "--seq-len", "512", "--max-patches", "2048",
                                "--window-docs", "8", "--global-batch-size", "1", "--micro-batch-size", "1",
                                "--filter-steps", f"0:{layout.num_samples}"])  # fmt: skip
    assert code == 0 and f"1 of {layout.num_samples} samples flagged" in out


def test_build_over_a_media_index_prints_its_summary_and_audit(media, capsys):
    index = media["index"]
    code, out, _ = run(capsys, ["build", "--data", str(index.path), "--verify-tokens"])
    lines = out.splitlines()
    assert code == 0 and lines[0].startswith("index files: every chunk checksum and sha256 verified")
    assert f"images       {index.num_images}" in out and f"fingerprint  {index.fingerprint}" in out
    code, _, err = run(capsys, ["build", "--data", str(index.path), "--layout"])
    assert code == 2 and "--layout: a media index's two-axis layout is packed in RAM" in err
