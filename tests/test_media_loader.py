"""The batch a VLM takes (issue 33), made in DataLoader workers by transformers' real Qwen2-VL image processor: planned
== actual token counts for every sample of an epoch, pixels equal to the processor's on the decoded EXIF-transposed
images, labels -100 on image tokens, Qwen2-VL's rope positions equal to the model's own ``get_rope_index`` per piece,
and seeded augmentation bit-identical across workers, world sizes and resumes."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image, ImageOps
from torch.utils.data import DataLoader
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from detsampler import Plan
from detsampler.loader import DeterministicBatchSampler
from detsampler.loader.dataset import collate_micro_batch
from detsampler.loader.vlm import FlipJitter, VLMDataset
from detsampler.media import MediaLayoutConfig, Qwen2VLCounts
from detsampler.media.build import build_media_index
from detsampler.media.sources import dataset_source
from tests.media_corpus import documents, to_dataset, vlm_tokenizer

COUNTS = Qwen2VLCounts(min_pixels=4 * 28 * 28, max_pixels=48 * 28 * 28)
LAYOUT = MediaLayoutConfig(seq_len=256, max_patches=640, window_docs=16)


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    root = tmp_path_factory.mktemp("vlm")
    tok = vlm_tokenizer(root / "tok")
    docs = documents(40, seed=7, max_images=3, largest=120)
    index = build_media_index(dataset_source(to_dataset(docs)), tok, COUNTS, cache_dir=root / "cache")
    return index, index.layout(LAYOUT), docs


def processor():
    return Qwen2VLImageProcessorPil(**COUNTS.processor_kwargs())


def epoch_batches(dataset, plan, rank=0, num_workers=0, start_step=0, stop_step=None):
    sampler = DeterministicBatchSampler(plan, rank=rank, start_step=start_step, stop_step=stop_step)
    loader = DataLoader(dataset, batch_sampler=sampler, num_workers=num_workers, collate_fn=collate_micro_batch)
    return [(step, mbs) for step, mbs in sampler.steps(loader)]


def test_planned_equals_actual_for_every_sample_of_an_epoch_in_workers(media):
    index, layout, docs = media
    plan = Plan(layout.num_samples, seed=1, global_batch_size=2, micro_batch_size=2, world_size=1)
    steps = layout.num_samples // 2
    dataset = VLMDataset(index, layout, processor(), plan=plan)
    direct = processor()
    seen = 0
    for step, (batch,) in epoch_batches(dataset, plan, num_workers=2, stop_step=steps):
        ids = plan.micro_batch(step, 0, 0)
        offsets, images = layout.sample_images(ids)
        rows = index.image_rows(images)
        if len(images):  # the processor on the decoded, EXIF-transposed images gives the very same pixels
            decoded = [ImageOps.exif_transpose(Image.open(io.BytesIO(index.read_image(int(i))))).convert("RGB")
                       for i in images]  # fmt: skip
            want = direct(images=decoded, return_tensors="np")
            assert torch.equal(batch["pixel_values"], torch.from_numpy(want["pixel_values"]))
            assert torch.equal(batch["image_grid_thw"], torch.from_numpy(want["image_grid_thw"]))
        is_image = batch["input_ids"] == index.image_token_id
        assert is_image.sum(1).tolist() == [int(rows["tokens"][a:b].sum()) for a, b in zip(offsets, offsets[1:])]
        assert batch["pixel_values"].shape[0] == int(rows["patches"].sum())
        assert (batch["labels"][:, :-1][is_image[:, 1:]] == -100).all()  # no target is an image token
        assert not (batch["labels"] == index.image_token_id).any()
        assert batch["images_per_sample"].tolist() == np.diff(offsets).tolist()
        seen += len(ids)
    assert seen == 2 * steps == layout.num_samples - layout.num_samples % 2 and steps >= 4


def test_qwen2_vl_rope_equals_the_models_get_rope_index_per_piece(media):
    from transformers import Qwen2VLConfig, Qwen2VLModel

    index, layout, _ = media
    config = Qwen2VLConfig(
        text_config={"vocab_size": 400, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                     "num_attention_heads": 2, "num_key_value_heads": 1,
                     "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]}},
        vision_config={"depth": 1, "embed_dim": 16, "hidden_size": 32, "num_heads": 2, "spatial_merge_size": 2},
        image_token_id=index.image_token_id,
    )  # fmt: skip
    model = Qwen2VLModel(config)
    dataset = VLMDataset(index, layout, processor(), rope="qwen2_vl")
    ids = np.arange(min(6, layout.num_samples))
    batch = dataset.get_batch(ids)
    pos = batch["position_ids"]
    assert pos.shape == (4, len(ids), LAYOUT.seq_len)
    grids = iter(batch["image_grid_thw"])
    checked = 0
    for b in range(len(ids)):
        spans = layout.locate(ids[b : b + 1])
        col = 0
        for length in (spans.stops - spans.starts).tolist():
            piece = slice(col, col + length)
            col += length
            types = batch["mm_token_type_ids"][b : b + 1, piece]
            runs = int(((types[0, 1:] == 1) & (types[0, :-1] == 0)).sum() + (types[0, 0] == 1))
            mine = torch.stack([next(grids) for _ in range(runs)]) if runs else None
            want, _ = model.get_rope_index(batch["input_ids"][b : b + 1, piece], mm_token_type_ids=types,
                                           image_grid_thw=mine)  # fmt: skip
            assert torch.equal(pos[1:, b : b + 1, piece], want), (b, piece)
            assert torch.equal(pos[0, b, piece], torch.arange(length))
            checked += runs
    assert checked == len(batch["image_grid_thw"]) > 0


def test_a_tiny_qwen2_vl_trains_on_the_batch(media):
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    index, layout, _ = media
    torch.manual_seed(0)
    config = Qwen2VLConfig(
        text_config={"vocab_size": 400, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                     "num_attention_heads": 2, "num_key_value_heads": 1,
                     "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]}},
        vision_config={"depth": 1, "embed_dim": 16, "hidden_size": 32, "num_heads": 2, "spatial_merge_size": 2},
        image_token_id=index.image_token_id,
    )  # fmt: skip
    model = Qwen2VLForConditionalGeneration(config)
    batch = VLMDataset(index, layout, processor(), rope="qwen2_vl").get_batch([0, 1])
    out = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], pixel_values=batch["pixel_values"],
                image_grid_thw=batch["image_grid_thw"])  # fmt: skip
    loss = torch.nn.functional.cross_entropy(out.logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=-100)
    loss.backward()
    assert torch.isfinite(loss) and model.model.visual.patch_embed.proj.weight.grad.abs().sum() > 0


def test_augmentation_is_the_same_across_workers_world_sizes_and_resumes(media):
    index, layout, _ = media
    plans = {w: Plan(layout.num_samples, seed=3, global_batch_size=4, micro_batch_size=2 // w, world_size=w)
             for w in (1, 2)}  # fmt: skip
    stop = 2 * (layout.num_samples // 4) + 1  # into the third epoch
    make = lambda plan: VLMDataset(index, layout, processor(), plan=plan, seed=11, augment=FlipJitter())
    one = {s: torch.cat([b["pixel_values"] for b in mbs]) for s, mbs in epoch_batches(make(plans[1]), plans[1],
                                                                                        stop_step=stop)}  # fmt: skip
    two = [dict(epoch_batches(make(plans[2]), plans[2], rank=r, num_workers=2, start_step=stop - 3, stop_step=stop))
           for r in (0, 1)]  # fmt: skip
    for step in range(stop - 3, stop):  # 2 ranks with 2 workers each, resumed 3 steps before the end: same pixels
        per_micro = [torch.cat([two[r][step][m]["pixel_values"] for r in (0, 1)]) for m in range(2)]
        assert torch.equal(torch.cat(per_micro), one[step])
    ds = make(plans[1])
    sample = next(s for s in range(layout.num_samples) if len(layout.sample_images([s])[1]))
    first, again, other = (ds.get_batch([sample], epochs=[e])["pixel_values"] for e in (0, 0, 1))
    assert torch.equal(first, again) and not torch.equal(first, other)  # keyed by the epoch too


def test_a_processor_that_differs_from_the_index_and_a_resizing_augment_are_refused(media):
    index, layout, _ = media
    other = Qwen2VLImageProcessorPil(
        **Qwen2VLCounts(min_pixels=4 * 28 * 28, max_pixels=96 * 28 * 28).processor_kwargs()
    )
    with pytest.raises(ValueError, match=r"max_pixels: 75264 \(the index counted with 37632\)"):
        VLMDataset(index, layout, other)
    plan = Plan(layout.num_samples, seed=0, global_batch_size=2, micro_batch_size=2, world_size=1)
    shrink = lambda image, rng: image.resize((max(1, image.width // 3), max(1, image.height // 3)))
    dataset = VLMDataset(index, layout, processor(), plan=plan, augment=shrink)
    with_images = next(s for s in range(layout.num_samples) if len(layout.sample_images([s])[1]))
    with pytest.raises(ValueError, match=r"^image \d+ \(document \d+, item \d+\) at .*: the processor made grid"):
        dataset.get_batch([with_images], epochs=[0])
    with pytest.raises(ValueError, match="pass plan="):
        VLMDataset(index, layout, processor(), augment=FlipJitter())
