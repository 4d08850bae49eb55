"""The image token counts (issue 33): the versioned count functions equal, by value, what transformers' own
``smart_resize``, image processor and LLaVA processor compute, for many sizes; their identity names every config
value."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil, smart_resize

from detsampler.media.counts import (
    COUNTS_VERSION,
    FixedGridCounts,
    Qwen2VLCounts,
    UserCounts,
    counts_from_identity,
)
from tests.media_images import random_sizes

CONFIGS = [
    Qwen2VLCounts(),  # transformers' class defaults
    Qwen2VLCounts(min_pixels=3136, max_pixels=12_845_056),  # the Qwen2-VL / Qwen2.5-VL checkpoints' values
    Qwen2VLCounts(min_pixels=4 * 28 * 28, max_pixels=256 * 28 * 28),  # a small budget: most images scaled down
    Qwen2VLCounts(min_pixels=64 * 32 * 32, max_pixels=512 * 32 * 32, patch_size=16, merge_size=2),
    Qwen2VLCounts(min_pixels=14 * 14, max_pixels=64 * 14 * 14, patch_size=14, merge_size=1),
]
EDGES = [(1, 1), (1, 200), (200, 1), (28, 28), (42, 42), (14, 70), (70, 14), (27, 29), (56, 56), (3584, 3584),
         (4000, 20), (20, 4000), (1, 2), (13, 13), (1000, 5), (9999, 9999)]  # fmt: skip


@pytest.mark.parametrize("counts", CONFIGS, ids=lambda c: f"{c.min_pixels}-{c.max_pixels}-p{c.patch_size}")
def test_qwen2_vl_resize_equals_transformers_smart_resize_for_many_sizes(counts):
    w, h = random_sizes(3000, seed=counts.max_pixels % 97, largest=6000)
    w = np.concatenate([w, [e[0] for e in EDGES]])
    h = np.concatenate([h, [e[1] for e in EDGES]])
    factor = counts.patch_size * counts.merge_size
    expected = np.array(
        [smart_resize(int(y), int(x), factor, counts.min_pixels, counts.max_pixels) for x, y in zip(w, h)]
    )
    got = np.stack(counts.resized(w, h), axis=1)
    assert np.array_equal(got, expected)
    result = counts.count(w, h)
    grid = expected // counts.patch_size
    assert np.array_equal(result.patches, grid[:, 0] * grid[:, 1])
    assert np.array_equal(result.tokens, grid[:, 0] * grid[:, 1] // counts.merge_size**2)
    assert np.array_equal(result.grid, np.column_stack([np.ones(len(w), np.int64), grid]))
    processor = Qwen2VLImageProcessorPil(**counts.processor_kwargs())
    assert [processor.get_number_of_image_patches(int(y), int(x)) for x, y in zip(w[:300], h[:300])] == list(
        result.patches[:300]
    )


def test_qwen2_vl_counts_equal_the_processor_output_on_real_images():
    counts = Qwen2VLCounts(min_pixels=4 * 28 * 28, max_pixels=96 * 28 * 28)
    processor = Qwen2VLImageProcessorPil(**counts.processor_kwargs())
    sizes = [(1, 1), (13, 200), (300, 200), (57, 900), (28, 28), (42, 41), (640, 480), (255, 256), (1000, 9)]
    images = [Image.new("RGB", size, (i * 20, 100, 200)) for i, size in enumerate(sizes)]
    out = processor(images=images, return_tensors="np")
    planned = counts.count([s[0] for s in sizes], [s[1] for s in sizes])
    assert np.array_equal(out["image_grid_thw"], planned.grid)
    assert out["pixel_values"].shape == (int(planned.patches.sum()), 3 * 2 * 14 * 14)


def test_qwen2_vl_refuses_what_the_processor_refuses_naming_the_image():
    counts = Qwen2VLCounts()
    with pytest.raises(ValueError, match=r"^shard-0.tar:doc-9.png: size 201x1 pixels, aspect ratio 201.0; .* at most"):
        counts.count([10, 201], [10, 1], names=["a", "shard-0.tar:doc-9.png"])
    with pytest.raises(ValueError, match=r"absolute aspect ratio must be smaller than 200"):
        smart_resize(1, 201)  # transformers refuses the same image
    with pytest.raises(ValueError, match=r"image 1: size 0x5 pixels; each side must be in"):
        counts.count([3, 0], [3, 5])
    with pytest.raises(ValueError, match=r"min_pixels 100 is above max_pixels 99"):
        Qwen2VLCounts(min_pixels=100, max_pixels=99)
    with pytest.raises(ValueError, match=r"Qwen2VLCounts.patch_size must be an integer, got 14.0 \(float\)"):
        Qwen2VLCounts(patch_size=14.0)


def test_qwen2_vl_config_from_a_preprocessor_config():
    config = {"min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14, "merge_size": 2, "temporal_patch_size": 2}
    assert Qwen2VLCounts.from_processor_config(config) == CONFIGS[1]
    sized = {"size": {"shortest_edge": 3136, "longest_edge": 12845056}, "patch_size": 14}
    assert Qwen2VLCounts.from_processor_config(sized) == CONFIGS[1]


def test_fixed_grid_equals_llava_processor_arithmetic():
    llava = FixedGridCounts(height=336, width=336, patch_size=14, num_additional_image_tokens=1,
                            vision_feature_select_strategy="default")  # fmt: skip
    result = llava.count([5, 4000, 336], [7, 3, 336])
    assert result.tokens.tolist() == [576] * 3  # llava-1.5: 24 x 24 patches, the CLS dropped
    assert result.patches.tolist() == [577] * 3
    assert FixedGridCounts(height=224, width=224, patch_size=16).count([1], [1]).tokens.tolist() == [196]


def test_user_counts_are_checked_and_versioned():
    user = UserCounts(
        name="tiles", version=3, function=lambda w, h: (-(-w // 64) * -(-h // 64), w * 0), params={"t": 64}
    )
    assert user.count([64, 65], [64, 200]).tokens.tolist() == [1, 8]
    assert user.identity() == {
        "family": "user", "version": COUNTS_VERSION["user"], "name": "tiles", "user_version": 3, "params": {"t": 64}
    }  # fmt: skip
    bad = UserCounts(name="zero", version=1, function=lambda w, h: (w * 0, w * 0))
    with pytest.raises(ValueError, match=r"UserCounts 'zero': image 0 \(5x5\) gets 0 tokens; at least 1"):
        bad.count([5], [5])
    shapes = UserCounts(name="shape", version=1, function=lambda w, h: (np.ones(3, np.int64), w))
    with pytest.raises(ValueError, match=r"returned tokens of shape \(3,\)"):
        shapes.count([5], [5])
    with pytest.raises(ValueError, match="pass that UserCounts again"):
        counts_from_identity(user.identity())


def test_identity_names_every_config_value_and_round_trips():
    for counts in [*CONFIGS, FixedGridCounts()]:
        identity = counts.identity()
        assert identity["version"] == COUNTS_VERSION[identity["family"]]
        assert counts_from_identity(identity) == counts
    identities = {str(sorted(c.identity().items())) for c in CONFIGS}
    assert len(identities) == len(CONFIGS)
    with pytest.raises(ValueError, match="version 99 is recorded; this detsampler computes version 1"):
        counts_from_identity({**CONFIGS[0].identity(), "version": 99})
